"""The ``cuda-connections`` pack, always on: CUDA_DEVICE_MAX_CONNECTIONS.

The rows say what each engine asks of the variable on each class of node,
with the strength, why and the upstream source of each (``docs/rules.md``
shows them; a test keeps the page in step). ``evaluate`` walks them for the
engines in scope, combines the requirements by strength, and says why in
one sentence; the precedence (``decision.py``) does the rest, as for every
pack.

Strength. *Required*: the job fails without it, because an assert in a code
path the job runs checks the value (Megatron-LM's ``validate_args``, which
only frameworks that call it run; Megatron-Core's own group set-up, which
every framework runs). *Preferred*: the value only changes speed or overlap.

Most rows are alternatives: an engine takes the first that matches. A row
marked ``beside`` is an assert that holds on top of that row (Megatron-Core's
UCC check runs whatever else the engine does), so every matching one applies
too, and two required rows of one engine can conflict.

Combining: every *required* requirement must hold; two that cannot both
hold are a hard conflict (the job fails somewhere whatever the value).
*Preferred* requirements are then met where they can be; when they disagree
with each other, the ones that accept 1 win (Megatron's collective ordering
over another engine's overlap), and each preference left unmet is named.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import (
    TYPE_CHECKING, Any, Dict, FrozenSet, Iterable, List, Mapping, Optional, Sequence, Tuple,
)

from ..engines import (
    ALWAYS_RUN, ASSERTS, CUDA_DEFAULT, CUDA_RANGE, FSDP, INFERENCE, MEGATRON,
    MEGATRON_BRIDGE_CHECK, MEGATRON_CORE_CHECK, MEGATRON_LM_CHECK,
)
from ..names import CONNECTIONS_VARIABLE, CUDA_CONNECTIONS
from ..errors import FieldValueError
from ..node import NodeFacts, NodeGpus
from ..values import parse_connections
from .pack import Demand, LEAVE, NONE, Outcome, Pack, PackRow, PackVerdict, PREFERRED, REQUIRED, SET



@dataclass(frozen=True)
class RoleDecision:
    """What one role's engine asked of CUDA_DEVICE_MAX_CONNECTIONS here."""

    engine: str  # the engine, described ("megatron TP=2 CP=1")
    rule: str  # the deciding row's id
    strength: str  # required | preferred | none
    because: str


@dataclass(frozen=True)
class ConnectionsDetail:
    """What this pack adds to its variable's record entry (``VariableDecision.detail``,
    JSON in the record): the requirement in words, whether the roles' rules
    conflict, and each role's part. The record reads it back through here."""

    requirement: str = "none"
    conflict: bool = False
    roles: Mapping[str, RoleDecision] = field(default_factory=dict)

    def to_dict(self) -> Dict[str, Any]:
        return {"requirement": self.requirement, "conflict": self.conflict,
                "roles": {role: dict(vars(part)) for role, part in self.roles.items()}}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ConnectionsDetail":
        return cls(data.get("requirement", "none"), bool(data.get("conflict", False)),
                   {role: RoleDecision(part.get("engine", ""), part.get("rule", ""),
                                       part.get("strength", NONE), part.get("because", ""))
                    for role, part in (data.get("roles") or {}).items()})


if TYPE_CHECKING:  # pragma: no cover
    from ..spec import Engine, Spec

# GPU classes of a node, by its oldest GPU. A node with NVIDIA devices whose
# capability could not be read is classed PRE_BLACKWELL: setting 1 where
# Megatron needs it is correct there and harmless on Blackwell, while leaving
# it out would make a validating framework assert.
NO_GPU = "no GPU"
PRE_BLACKWELL = "major < 10"
BLACKWELL_OR_NEWER = "major >= 10"
# AMD (ROCm), Huawei Ascend and Moore Threads (MUSA) accelerators: their
# runtimes do not read the variable (HIP's queue knob is GPU_MAX_HW_QUEUES,
# MUSA's is MUSA_DEVICE_MAX_CONNECTIONS; CANN has none), but Megatron's
# Python asserts read it there as on CUDA. docs/rules.md has the sources.
NON_CUDA = "non-CUDA accelerator"
ANY = "any"


@dataclass(frozen=True)
class Requirement:
    """The set of values an engine accepts, whether unset is accepted, and
    the value to write when the engine asks for one (``preferred_value``)."""

    accepted: FrozenSet[int]
    unset_ok: bool
    preferred_value: Optional[int] = None

    @property
    def label(self) -> str:
        if self.unset_ok and self.accepted == _ALL and self.preferred_value is None:
            return "none"
        if self.accepted == _ALL - {1}:
            text = "not 1"
        else:
            text = " or ".join(str(v) for v in sorted(self.accepted))
        if self.preferred_value is not None and len(self.accepted) > 1:
            text += f" ({self.preferred_value} preferred)"
        return text

    @property
    def is_constraint(self) -> bool:
        return self != NOTHING

    @property
    def values(self) -> FrozenSet[str]:
        """The accepted values as the variable's text."""
        return frozenset(str(v) for v in self.accepted)

    def allows(self, value: Optional[int]) -> bool:
        return self.unset_ok if value is None else value in self.accepted

    def meet(self, other: "Requirement") -> Optional["Requirement"]:
        """What satisfies both, or None when nothing does (a conflict)."""
        accepted = self.accepted & other.accepted
        unset_ok = self.unset_ok and other.unset_ok
        if not accepted and not unset_ok:
            return None
        preferred = next((v for v in (self.preferred_value, other.preferred_value)
                          if v is not None and v in accepted), None)
        return Requirement(frozenset(accepted), unset_ok, preferred)

    def choose(self) -> int:
        """The value to write when one must be written: the preferred value
        if any; else CUDA's default if it is allowed (so replacing a forbidden
        value changes as little as possible); else the smallest accepted."""
        if self.preferred_value is not None:
            return self.preferred_value
        return CUDA_DEFAULT if CUDA_DEFAULT in self.accepted else min(self.accepted)


_ALL = frozenset(CUDA_RANGE)
NOTHING = Requirement(_ALL, unset_ok=True)
MUST_BE_1 = Requirement(frozenset({1}), unset_ok=False)
NOT_1 = Requirement(_ALL - {1}, unset_ok=True)
NOT_1_PREFER_32 = Requirement(_ALL - {1}, unset_ok=True, preferred_value=32)


@dataclass(frozen=True)
class Rule:
    """One row: what it asks, when it applies, how strongly, why, and who
    says so.

    Conditions are keywords; ``None`` means "either", ``ANY`` any engine or
    GPU class. The first matching row wins (``beside`` rows apply on top).
    A row is *required* for an engine whose framework runs one of the checks
    in ``required_by``, and *preferred* otherwise.
    """

    id: str
    requirement: Requirement
    why: str
    source: str
    preferred_because: str = ""
    required_by: Tuple[str, ...] = ()
    engine: str = ANY
    gpus: str = ANY
    model_parallel: Optional[bool] = None  # tensor or context parallel size > 1
    megatron_fsdp: Optional[bool] = None  # Megatron-FSDP (formerly custom FSDP)
    torch_fsdp2: Optional[bool] = None  # torch FSDP2 under Megatron
    moe_overlap: Optional[bool] = None  # MoE expert-parallel A2A overlap
    dispatcher: Optional[bool] = None  # the DeepEP or HybridEP flex dispatcher
    ucc_pipeline: Optional[bool] = None  # pipeline communication on UCC
    beside: bool = False  # applies on top of the engine's first matching row

    def _running(self, checks: Iterable[str]) -> list:
        running = set(checks) | set(ALWAYS_RUN)
        return [c for c in self.required_by if c in running]

    def strength_for(self, checks: Iterable[str]) -> str:
        if not self.requirement.is_constraint:
            return NONE
        return REQUIRED if self._running(checks) else PREFERRED

    def because(self, strength: str, checks: Iterable[str] = ()) -> str:
        """'required: Megatron-LM's argument check asserts it', and so on."""
        if strength == REQUIRED:
            return "required: " + "; ".join(ASSERTS[c] for c in self._running(checks))
        if strength == PREFERRED:
            return f"preferred: {self.preferred_because}"
        return "nothing to set"

    def matches(self, engine: Engine, gpus: str) -> bool:
        return (
            self.engine in (ANY, engine.kind)
            and self.gpus in (ANY, gpus)
            and self.model_parallel in (None, engine.model_parallel)
            and self.megatron_fsdp in (None, engine.megatron_fsdp)
            and self.torch_fsdp2 in (None, engine.torch_fsdp2)
            and self.moe_overlap in (None, engine.moe_overlap)
            and self.dispatcher in (None, engine.flex_dispatcher)
            and self.ucc_pipeline in (None, engine.ucc_pipeline)
        )


_VALIDATE_ARGS = "Megatron-LM megatron/training/arguments.py, validate_args"
_CORE = "(Megatron-Core 0.13 and later; see docs/rules.md for older releases)"

_BRIDGE_LAUNCHER = ("Megatron-Bridge scripts/performance/utils/overrides.py, "
                    "_apply_flat_cli_environment_compatibility (run only when a legacy "
                    "argparse TP, CP or A2A-overlap override is given)")
_NON_CUDA_SOURCES = (
    "MindSpeed-MM tests/st shell scripts export 1 with the note that it only gets past "
    "Megatron's check and has no effect on the NPU; verl PR #7040 set 1 only for its "
    "mindspeed strategy on Ascend (and PR #7374 removed it again, 2026-08-14); slime "
    "docker/npu_patch/slime.patch exports 1; FlagScale issue #1289 / PR #1288 (the same "
    "assert on MUSA; MUSA and "
    "CANN do not read the variable); MUSA launch scripts of Megatron training export 1 for "
    "it; ROCm clr rocclr/utils/flags.hpp: HIP's own queue setting is GPU_MAX_HW_QUEUES "
    "(default 4) and no CUDA_DEVICE_MAX_CONNECTIONS is read")


RULES = (
    Rule("no-gpu", NOTHING,
         gpus=NO_GPU,
         why="there is no GPU on the node, so there is nothing to set",
         source="CUDA C Programming Guide, environment variables: the driver reads the variable "
             "when a CUDA context is created",),
    Rule("megatron-fsdp", NOT_1,
         engine=MEGATRON, megatron_fsdp=True,
         why="Megatron-FSDP overlaps its all-gathers and reduce-scatters with compute, which 1 "
             "serialises",
         preferred_because="keeps Megatron-FSDP's all-gather and reduce-scatter overlapping "
                           "compute",
         source=f"{_VALIDATE_ARGS}: asserts the value is not '1' when use_megatron_fsdp (formerly "
             "use_custom_fsdp) is set; Megatron-Bridge src/megatron/bridge/training/config.py: "
             "asserts the same for Megatron-FSDP",
         required_by=(MEGATRON_LM_CHECK, MEGATRON_BRIDGE_CHECK),),
    Rule("megatron-torch-fsdp2", NOT_1,
         engine=MEGATRON, megatron_fsdp=False, torch_fsdp2=True,
         why="torch FSDP2 under Megatron overlaps its all-gathers and reduce-scatters with "
             "compute, which 1 serialises",
         preferred_because="keeps FSDP2's all-gather and reduce-scatter overlapping compute",
         source=f"{_VALIDATE_ARGS}: asserts the value is not '1' when use_torch_fsdp2 is set",
         required_by=(MEGATRON_LM_CHECK,),),
    Rule("non-cuda-megatron-model-parallel", MUST_BE_1,
         engine=MEGATRON, gpus=NON_CUDA, model_parallel=True, megatron_fsdp=False,
         torch_fsdp2=False, moe_overlap=False,
         why="Megatron-LM's TP/CP check reads the CUDA variable's name from Python on these "
             "accelerators too (they report a major version below 10); their runtimes ignore "
             "the value itself",
         preferred_because="lets Megatron-LM's TP/CP assert pass wherever the stack runs it "
                           "(the accelerator ignores the value)",
         source=f"{_VALIDATE_ARGS}: asserts '1' for TP or CP > 1 below major 10, from Python; "
             + _NON_CUDA_SOURCES,
         required_by=(MEGATRON_LM_CHECK,),),
    Rule("non-cuda", NOTHING,
         gpus=NON_CUDA,
         why="the accelerator's runtime does not read the variable and nothing asserts a value "
             "for this engine there, so there is nothing to set",
         source=_NON_CUDA_SOURCES,),
    Rule("megatron-moe-overlap", NOT_1_PREFER_32,
         engine=MEGATRON, megatron_fsdp=False, torch_fsdp2=False, moe_overlap=True,
         why="MoE expert-parallel all-to-all overlap runs its communication on a second stream, "
             "which 1 serialises behind compute",
         preferred_because="lets the expert-parallel all-to-all overlap compute (32, as "
                           "Megatron-LM's launch guide and Megatron-Bridge use)",
         source="Megatron-LM megatron/core/transformer/moe/README.md "
             "(overlap_moe_expert_parallel_comm needs the value above 1) and "
             "skills/mcore-run-on-slurm/SKILL.md (32); "
             f"{_VALIDATE_ARGS} only warns with TP/CP > 1; Megatron-Bridge "
             "scripts/performance/utils/overrides.py (not 1 with A2A overlap)",),
    Rule("megatron-blackwell", NOTHING,
         engine=MEGATRON, gpus=BLACKWELL_OR_NEWER, megatron_fsdp=False, torch_fsdp2=False,
         moe_overlap=False, dispatcher=False,
         why="Blackwell and newer GPUs keep collectives ahead of compute without it",
         source=f"{_VALIDATE_ARGS}: the check applies only below compute capability major 10 "
             f"{_CORE}",),
    Rule("megatron-model-parallel", MUST_BE_1,
         engine=MEGATRON, gpus=PRE_BLACKWELL, model_parallel=True, megatron_fsdp=False,
         torch_fsdp2=False, moe_overlap=False,
         why="Megatron tensor/context parallelism before Blackwell keeps its collectives ahead "
             "of the compute they overlap only with one hardware queue",
         preferred_because="keeps tensor/context-parallel collectives ahead of compute",
         source=f"{_VALIDATE_ARGS}: asserts the value is '1' when "
             "tensor_model_parallel_size > 1 or context_parallel_size > 1 below compute "
             "capability major 10, without FSDP or MoE "
             f"A2A overlap {_CORE}, whatever the token dispatcher; Megatron-Core "
             "megatron/core/tensor_parallel/layers.py and TransformerEngine only warn; "
             f"{_BRIDGE_LAUNCHER} keeps 1 there even with DeepEP or HybridEP",
         required_by=(MEGATRON_LM_CHECK,),),
    Rule("megatron-flex-dispatcher", NOT_1_PREFER_32,
         engine=MEGATRON, megatron_fsdp=False, torch_fsdp2=False, moe_overlap=False,
         dispatcher=True,
         why="the DeepEP and HybridEP token dispatchers run their all-to-all on communication "
             "streams of their own, which 1 serialises behind compute",
         preferred_because="lets the DeepEP/HybridEP dispatch and combine overlap compute (32, as "
             "Megatron-Bridge sets)",
         source="Megatron-Bridge's recipes with the flex dispatcher on DeepEP or HybridEP set "
             "32 in cfg.env_vars on H100 at TP=1 (perf_recipes/qwen/h100/qwen3_moe.py "
             "qwen3_30b_a3b_pretrain_16gpu_h100_*, recipes/moonlight/h100/moonlight_16b.py) "
             "and on B200/GB200 (tests/golden/bridge_recipes.yaml); "
             f"{_BRIDGE_LAUNCHER} keys on moe_flex_dispatcher_backend alone (32 for deepep or "
             "hybridep, Megatron-Core's TransformerConfig default being deepep, else 8), then "
             "32 on Blackwell and 1 for TP or CP > 1 without A2A overlap on other GPUs (the "
             "row above)",),
    Rule("megatron-no-model-parallel", NOTHING,
         engine=MEGATRON, model_parallel=False, megatron_fsdp=False, torch_fsdp2=False,
         moe_overlap=False, dispatcher=False,
         why="Megatron without tensor or context parallelism has no collective to order",
         source=f"{_VALIDATE_ARGS}: the check requires TP > 1 or CP > 1 {_CORE}",),
    Rule("fsdp-style", NOT_1,
         engine=FSDP,
         why="FSDP-style engines overlap all-gather and reduce-scatter with compute on separate "
             "streams, which 1 serialises",
         preferred_because="keeps FSDP prefetch and reduce-scatter overlapping compute",
         source="CUDA C Programming Guide (1 gives every stream one hardware queue; default 8, "
             "range 1..32); Megatron-LM docs megatron_fsdp.md; no framework asserts it",),
    Rule("inference", NOT_1,
         engine=INFERENCE,
         why="inference engines run several streams, which 1 serialises",
         preferred_because="keeps the inference engine's streams concurrent",
         source="no assert anywhere: SGLang python/sglang/srt/entrypoints/engine.py sets its own "
             "value in its own process at start-up (8; verl's patch 4); vLLM reads no such "
             "setting",),
    Rule("megatron-core-ucc-pipeline", NOT_1,
         engine=MEGATRON, ucc_pipeline=True, beside=True,
         why="pipeline communication on the UCC backend overlaps only with more than one "
             "hardware queue, and Megatron-Core refuses 1 when it builds the pipeline groups",
         preferred_because="keeps UCC pipeline transfers overlapping compute",
         source="Megatron-Core megatron/core/parallel_state.py, initialize_model_parallel: under "
             "`if pipeline_model_parallel_comm_backend == 'ucc'` and `if "
             "'CUDA_DEVICE_MAX_CONNECTIONS' in os.environ`, asserts the value != '1' "
             "('UCC-backend requires CUDA_DEVICE_MAX_CONNECTIONS > 1'; an assert in every "
             "Megatron-Core branch, 0.19.2 included, so python -O skips it), so unset passes; Megatron-Bridge training/initialize.py passes the "
             "model config's pipeline_model_parallel_comm_backend to it",
         required_by=(MEGATRON_CORE_CHECK,),),
)


@dataclass(frozen=True)
class Finding:
    role: str
    engine: Engine
    rule: Rule

    @property
    def strength(self) -> str:
        return self.rule.strength_for(self.engine.checks)

    def because(self) -> str:
        return self.rule.because(self.strength, self.engine.checks)

    def words(self) -> str:
        return f"{self.role} ({self.engine.describe()}) [{self.rule.id}]"

    def asks(self) -> str:
        """'actor (asks 1) [megatron-model-parallel; required: ...]'."""
        return (f"{self.role} (asks {self.rule.requirement.label}) "
                f"[{self.rule.id}; {self.because()}]")


@dataclass(frozen=True)
class Verdict:
    requirement: Requirement  # what the value must meet: required and kept preferences
    required: Requirement  # the required part alone (NOTHING when nothing is required)
    findings: Tuple[Finding, ...]
    conflict: bool  # some requirement in scope cannot be met
    hard_conflict: bool  # two required requirements cannot both hold
    unmet: Tuple[Finding, ...]  # findings the chosen requirement does not satisfy
    reason: str  # a sentence without its final full stop; precedence adds to it


def gpu_class(gpus: NodeGpus) -> str:
    if gpus.capabilities is None:
        return PRE_BLACKWELL  # unknown: the conservative class (see the module docstring)
    if gpus.vendor is not None:
        # AMD, Ascend, Moore Threads: the runtime ignores the variable, but
        # Megatron-LM's Python check still reads it (they report a major
        # version below 10: PyTorch on ROCm gives Instinct GPUs 9.x).
        return NON_CUDA
    if not gpus.capabilities:
        return NO_GPU
    return BLACKWELL_OR_NEWER if gpus.oldest[0] >= 10 else PRE_BLACKWELL


def rule_for(engine: Engine, gpus: str, rules: Sequence[Rule] = RULES) -> Rule:
    """The first matching row (rows marked ``beside`` are not alternatives)."""
    for rule in rules:
        if not rule.beside and rule.matches(engine, gpus):
            return rule
    raise AssertionError(f"no rule covers {engine} on {gpus}")  # the table is total


def rules_for(engine: Engine, gpus: str, rules: Sequence[Rule] = RULES) -> Tuple[Rule, ...]:
    """Every row an engine takes: its first match, then each ``beside``
    row (an assert that holds whatever else the engine does) that matches."""
    return (rule_for(engine, gpus, rules),) + tuple(
        rule for rule in rules if rule.beside and rule.matches(engine, gpus))


_STRONGEST = (REQUIRED, PREFERRED, NONE)


def by_role(findings: Iterable[Finding]) -> Dict[str, Tuple[str, str, str]]:
    """role -> (rule ids joined by '+', the strongest strength, the strengths
    in words joined by '; '): one entry per role even where an engine takes
    more than one row."""
    grouped: Dict[str, list] = {}
    for finding in findings:
        grouped.setdefault(finding.role, []).append(finding)
    out = {}
    for role, found in grouped.items():
        strength = min((f.strength for f in found), key=_STRONGEST.index)
        # Rows that ask nothing add no words beside a row that asks something.
        said = [f for f in found if f.strength != NONE] or found[:1]
        out[role] = ("+".join(f.rule.id for f in found), strength,
                     "; ".join(f.because() for f in said))
    return out


def within_one_engine(findings: Sequence[Finding], finding: Finding) -> bool:
    """Whether ``finding`` conflicts with another row of its own engine (a
    table row and a ``beside`` assert), which no per-role env can fix."""
    return any(f.role == finding.role and f is not finding for f in findings)


ONE_ENGINE_FIX = ("no runtime env can meet both, since one engine's own settings ask for "
                  "them: change that engine's settings (its pipeline backend or its TP/CP)")
ROLE_FIX = "give each role its own env with build_runtime_env(role=...)"
# NeMo-RL builds every worker group's runtime env in its own code
# (nemo_rl/distributed/worker_groups.py), so there is no place for a user's
# per-role env without changing that code.
FRAMEWORK_ROLE_FIX = {
    "nemo-rl": "NeMo-RL builds each worker group's runtime env itself, so a per-role env "
               "needs a change there: that group's env from build_runtime_env(config, role=...)",
}


def role_fix(framework: Optional[str]) -> str:
    return FRAMEWORK_ROLE_FIX.get(framework or "", ROLE_FIX)


def _fix(findings: Sequence[Finding], unmet: Sequence[Finding],
         framework: Optional[str] = None) -> str:
    return (ONE_ENGINE_FIX if all(within_one_engine(findings, f) for f in unmet)
            else role_fix(framework))


def _phrase(requirement: Requirement, strength: str, plural: bool) -> str:
    verb = ("need" if plural else "needs")
    if requirement == NOTHING:
        return f"{verb} nothing"
    label = requirement.label
    if label.startswith("not 1"):
        return f"must not run with 1{label[5:]} ({strength})"
    return f"{verb} {label} ({strength})"


def _clauses(findings: Tuple[Finding, ...]) -> str:
    """'actor and ref (megatron TP=2 CP=1) need 1 (preferred) [rule]; ...':
    roles with the same engine and rule share one clause."""
    groups: dict = {}
    for f in findings:
        groups.setdefault((f.engine.describe(), f.rule, f.strength), []).append(f.role)
    parts = []
    for (engine, rule, strength), roles in groups.items():
        phrase = _phrase(rule.requirement, strength, len(roles) > 1)
        who = ", ".join(roles[:-1]) + " and " + roles[-1] if len(roles) > 1 else roles[0]
        parts.append(f"{who} ({engine}) {phrase} [{rule.id}]")
    return "; ".join(parts)


def _meet_all(findings: Iterable[Finding], start: Requirement = NOTHING) -> Optional[Requirement]:
    combined: Optional[Requirement] = start
    for finding in findings:
        combined = combined.meet(finding.rule.requirement)
        if combined is None:
            return None
    return combined


def _accepts_1_first(findings: Sequence[Finding]) -> Tuple[Tuple[Finding, ...], ...]:
    """The tie-break among preferences: those that accept 1, then the rest."""
    with_1 = tuple(f for f in findings if 1 in f.rule.requirement.accepted)
    return with_1, tuple(f for f in findings if f not in with_1)


def verdict_for(spec: Spec, gpus: NodeGpus, rules: Sequence[Rule] = RULES) -> Verdict:
    """What the engines of ``spec`` ask on a node with ``gpus``."""
    where = gpus.describe()
    if gpus.capabilities == () and gpus.vendor is None:
        # One statement for the node rather than one per engine.
        rule = rules[0]
        findings = tuple(Finding(role, engine, rule) for role, engine in spec.engines)
        return Verdict(NOTHING, NOTHING, findings, False, False, (),
                       f"no NVIDIA GPU on this node, so there is nothing to set [{rule.id}]")
    if not spec.engines:
        return Verdict(NOTHING, NOTHING, (), False, False, (),
                       "no engine is in scope, so nothing is required")
    cls = gpu_class(gpus)
    findings = tuple(Finding(role, engine, rule)
                     for role, engine in spec.engines for rule in rules_for(engine, cls, rules))
    clauses = f"{where}: {_clauses(findings)}"
    required = [f for f in findings if f.strength == REQUIRED]
    preferred = [f for f in findings if f.strength == PREFERRED]

    hard = _meet_all(required)
    if hard is None:
        # Nothing satisfies every required rule: the job fails here whatever
        # the value. Write what the tie-break picks, and say it plainly.
        keep = next((k for k in _accepts_1_first(required) if k and _meet_all(k) is not None),
                    (required[0],))
        chosen = _meet_all(keep)
        unmet = tuple(f for f in required if f not in keep)
        return Verdict(chosen, chosen, findings, True, True, unmet,
                       f"{clauses}; these required rules cannot all hold in one runtime env, so "
                       "a worker of " + " and ".join(f.words() for f in unmet) +
                       f" fails on this node ({_fix(findings, unmet, spec.framework)})")
    combined = _meet_all(preferred, hard)
    if combined is not None:
        return Verdict(combined, hard, findings, False, False, (), clauses)
    for keep in _accepts_1_first(preferred):
        combined = _meet_all(keep, hard) if keep else None
        if combined is not None:
            break
    else:
        keep, combined = (), hard
    unmet = tuple(f for f in preferred if f not in keep)
    return Verdict(combined, hard, findings, True, False, unmet,
                   f"{clauses}; these conflict in one runtime env, so {combined.label} is kept "
                   "and the preference of " + " and ".join(f.words() for f in unmet) +
                   f" is not met ({_fix(findings, unmet, spec.framework)})")


REPRESENTATIVE_GPUS = {PRE_BLACKWELL: ((9, 0),), BLACKWELL_OR_NEWER: ((10, 0),)}


def hard_conflict_everywhere(spec: Spec, rules: Sequence[Rule] = RULES) -> Optional[Verdict]:
    """The verdict of a pre-Blackwell node when required rules conflict on
    every GPU class (no node could run the job), else None."""
    verdicts = [verdict_for(spec, NodeGpus.known(caps, "given"), rules)
                for caps in REPRESENTATIVE_GPUS.values()]
    return verdicts[0] if all(v.hard_conflict for v in verdicts) else None


def explicit_value(env_vars: Optional[Mapping[str, Any]]) -> Optional[str]:
    """The runtime env's own value for the variable, checked, or None."""
    if not env_vars or CONNECTIONS_VARIABLE not in env_vars:
        return None
    parse_connections(env_vars[CONNECTIONS_VARIABLE], f"env_vars.{CONNECTIONS_VARIABLE}")
    return env_vars[CONNECTIONS_VARIABLE]


def _conflict_warnings(verdict: Verdict, framework: Optional[str] = None) -> List[str]:
    out = []
    for finding in verdict.unmet:
        rule = finding.rule
        if within_one_engine(verdict.findings, finding):  # a row and a beside assert
            out.append(f"{finding.role} ({finding.engine.describe()}) asks "
                       f"{rule.requirement.label} [{rule.id}; {finding.because()}] while "
                       f"another of its rows asks {verdict.requirement.label}; fix: "
                       f"{ONE_ENGINE_FIX}")
            continue
        out.append(
            f"{finding.role} ({finding.engine.describe()}) asks {rule.requirement.label} "
            f"[{rule.id}; {finding.because()}], which this shared runtime env "
            f"cannot give ({verdict.requirement.label} is what the other roles need); fix: "
            + (FRAMEWORK_ROLE_FIX[framework] if framework in FRAMEWORK_ROLE_FIX else
               f"give {finding.role} its own env with build_runtime_env(config, "
               f"role={finding.role!r})"))
    return out


def evaluate(spec: Spec, facts: NodeFacts, env_vars: Mapping[str, Any],
             node_environ: Mapping[str, str]) -> PackVerdict:
    """The rows of the engines in scope on this node, as one outcome for
    the variable, and the warnings that set nothing (conflicts, an unread
    GPU, a node value CUDA cannot read). Raises ``FieldValueError`` for a
    job value CUDA cannot read."""
    gpus = facts.gpus
    verdict = verdict_for(spec, gpus)
    warnings = _conflict_warnings(verdict, spec.framework)
    if not gpus.is_known:
        warnings.insert(0, f"the GPU probe ({gpus.method}) could not read the GPUs' compute "
                           f"capability, so the node was treated as pre-Blackwell: {gpus.error}")
    explicit = explicit_value(env_vars)
    # AReaL writes its own "1" into every worker: not the user's intent.
    replaces = explicit if explicit is not None and explicit == spec.replaces else None
    inherited = node_environ.get(CONNECTIONS_VARIABLE)
    if (explicit is None or replaces is not None) and inherited is not None:
        try:
            parse_connections(inherited, CONNECTIONS_VARIABLE)
        except FieldValueError:
            warnings.append(f"the node's {CONNECTIONS_VARIABLE}={inherited!r} is not an integer "
                            "from 1 to 32")
    need = verdict.requirement
    roles = by_role(verdict.findings)
    left_out = "".join(f"; {role}: {why}" for role, why in spec.omitted)
    strength = min((s for _, s, _ in roles.values()), key=_STRONGEST.index, default=NONE)
    # The rows that shaped the value: those of the strongest strength.
    deciding = dict.fromkeys(f.rule.id for f in verdict.findings if f.strength == strength)
    outcome = Outcome(
        CONNECTIONS_VARIABLE, SET if need.is_constraint else LEAVE,
        str(need.choose()) if need.is_constraint else None, strength,
        "+".join(deciding), f"{verdict.reason}{left_out}",
        accepts=need.values,
        fill=not need.unset_ok or need.preferred_value is not None,
        demands=tuple(Demand(f.rule.id, f.strength, f.rule.requirement.values,
                             f.rule.requirement.unset_ok, f.asks())
                      for f in verdict.findings if f.strength != NONE),
        replaces=replaces,
        detail=ConnectionsDetail(
            need.label, verdict.conflict,
            {f.role: RoleDecision(f.engine.describe(), *roles[f.role])
             for f in verdict.findings}).to_dict())
    return PackVerdict((outcome,), tuple(warnings))


def _row(rule: Rule) -> PackRow:
    constraint = rule.requirement.is_constraint
    when = f"{rule.engine} engine on {rule.gpus}"
    return PackRow(rule.id, when, SET if constraint else LEAVE,
                   ((CONNECTIONS_VARIABLE, rule.requirement.label),) if constraint
                   else ((CONNECTIONS_VARIABLE, ""),),
                   (f"required where {' or '.join(rule.required_by)} checks run, else preferred"
                    if rule.required_by else PREFERRED) if constraint else "none",
                   rule.why, rule.source)


PACK = Pack(
    name=CUDA_CONNECTIONS,
    summary=("How many hardware work queues CUDA gives each process. Megatron's tensor and "
             "context parallelism need 1 before Blackwell; FSDP-style and inference engines "
             "want more."),
    variables=(CONNECTIONS_VARIABLE,),
    node_facts=("the compute capability of every GPU (the oldest decides)",
                "the vendor of a node without NVIDIA GPUs"),
    config_facts=("each role's engine kind, tensor/context/expert parallel sizes, FSDP flags, "
                  "MoE overlap and the checks its framework runs (docs/field.md)",),
    rows=tuple(_row(rule) for rule in RULES),
    evaluate=evaluate,
    defaults=((CONNECTIONS_VARIABLE, f"CUDA's default, {CUDA_DEFAULT}"),),
)
