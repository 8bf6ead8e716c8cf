"""The rule table: what each engine asks of CUDA_DEVICE_MAX_CONNECTIONS.

This is data, not logic. ``policy.py`` walks it; ``docs/rules.md`` shows it
(a test keeps the two in step). Every row cites the upstream file and the
condition it comes from, so a reviewer can check each claim at its source.

Each row also has a strength. *Required*: the job fails without it, because
an assert in a code path the job runs checks the value (Megatron-LM's
``validate_args``, which only frameworks that call it run). *Preferred*: the
value only changes speed or overlap.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, FrozenSet, Iterable, Optional, Tuple

VARIABLE = "CUDA_DEVICE_MAX_CONNECTIONS"
CUDA_DEFAULT = 8
CUDA_RANGE = range(1, 33)  # NVIDIA's documented range; CUDA clamps outside it

# Engine kinds: how an engine uses CUDA streams, which is all the policy needs.
MEGATRON = "megatron"
FSDP = "fsdp"
INFERENCE = "inference"
ENGINE_KINDS = (MEGATRON, FSDP, INFERENCE)

# Strategy (or rollout engine) name -> kind. A name not listed here must be
# declared with its kind (see docs/field.md), never guessed.
KNOWN_STRATEGIES: Dict[str, str] = {
    "megatron": MEGATRON,
    # Megatron-Lite: TransformerEngine tensor-parallel layers and its own
    # context parallelism (Megatron-LM experimental/lite).
    "mlite": MEGATRON,
    "fsdp": FSDP,
    "fsdp2": FSDP,
    "fsdp_turbo": FSDP,
    "veomni": FSDP,
    "torchtitan": FSDP,
    "automodel": FSDP,
    "vllm": INFERENCE,
    "sglang": INFERENCE,
    "trtllm": INFERENCE,
    "dynamo": INFERENCE,  # NVIDIA Dynamo serving vLLM workers (NeMo-RL's backend)
    "hf": INFERENCE,
}

# GPU classes of a node, by its oldest GPU. A node with NVIDIA devices whose
# capability could not be read is classed PRE_BLACKWELL: setting 1 where
# Megatron needs it is correct there and harmless on Blackwell, while leaving
# it out would make a validating framework assert.
NO_GPU = "no GPU"
PRE_BLACKWELL = "major < 10"
BLACKWELL_OR_NEWER = "major >= 10"
ANY = "any"

# Strengths.
REQUIRED = "required"
PREFERRED = "preferred"
NONE = "none"

# The checks that assert on the value, by the name an engine lists them under
# (``Engine.checks``): a framework that runs one makes the rows it asserts
# required for its engines. Megatron-LM's runs where the framework calls
# ``validate_args`` (slime does, in its job driver; verl, NeMo-RL and AReaL
# build Megatron-Core models without it); Megatron-Bridge's where the
# framework validates a Bridge ``ConfigContainer`` (NeMo-RL, in its workers).
MEGATRON_LM_CHECK = "megatron-lm"
MEGATRON_BRIDGE_CHECK = "megatron-bridge"
CHECKS: Dict[str, str] = {
    MEGATRON_LM_CHECK: "Megatron-LM's argument check (validate_args) asserts it",
    MEGATRON_BRIDGE_CHECK: "Megatron-Bridge's config check (ConfigContainer.validate) asserts it",
}


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
    """One row: when it applies, what it asks, how strongly, why, and who says so.

    ``None`` in a condition means "either". The first matching row wins. A
    row is *required* for an engine whose framework runs one of the checks
    in ``required_by``, and *preferred* otherwise.
    """

    id: str
    engine: str
    gpus: str
    model_parallel: Optional[bool]  # tensor or context parallel size > 1
    megatron_fsdp: Optional[bool]  # Megatron-FSDP (formerly custom FSDP)
    torch_fsdp2: Optional[bool]  # torch FSDP2 under Megatron
    moe_overlap: Optional[bool]  # MoE expert-parallel A2A overlap
    requirement: Requirement
    why: str
    preferred_because: str
    source: str
    required_by: Tuple[str, ...] = ()

    def strength_for(self, checks: Iterable[str]) -> str:
        if not self.requirement.is_constraint:
            return NONE
        return REQUIRED if set(checks) & set(self.required_by) else PREFERRED

    def because(self, strength: str, checks: Iterable[str] = ()) -> str:
        """'required: Megatron-LM's argument check asserts it', and so on."""
        if strength == REQUIRED:
            asserting = [c for c in self.required_by if c in set(checks)]
            return "required: " + "; ".join(CHECKS[c] for c in asserting)
        if strength == PREFERRED:
            return f"preferred: {self.preferred_because}"
        return "nothing to set"


_VALIDATE_ARGS = "Megatron-LM megatron/training/arguments.py, validate_args"
_CORE = "(Megatron-Core 0.13 and later; see docs/rules.md for older releases)"

RULES = (
    Rule("no-gpu", ANY, NO_GPU, None, None, None, None, NOTHING,
         "there is no GPU on the node, so there is nothing to set", "",
         "CUDA C Programming Guide, environment variables: the driver reads the variable "
         "when a CUDA context is created"),
    Rule("megatron-fsdp", MEGATRON, ANY, None, True, None, None, NOT_1,
         "Megatron-FSDP overlaps its all-gathers and reduce-scatters with compute, which 1 "
         "serialises",
         "keeps Megatron-FSDP's all-gather and reduce-scatter overlapping compute",
         f"{_VALIDATE_ARGS}: asserts the value is not '1' when use_megatron_fsdp (formerly "
         "use_custom_fsdp) is set; Megatron-Bridge src/megatron/bridge/training/config.py: "
         "asserts the same for Megatron-FSDP",
         (MEGATRON_LM_CHECK, MEGATRON_BRIDGE_CHECK)),
    Rule("megatron-torch-fsdp2", MEGATRON, ANY, None, False, True, None, NOT_1,
         "torch FSDP2 under Megatron overlaps its all-gathers and reduce-scatters with "
         "compute, which 1 serialises",
         "keeps FSDP2's all-gather and reduce-scatter overlapping compute",
         f"{_VALIDATE_ARGS}: asserts the value is not '1' when use_torch_fsdp2 is set",
         (MEGATRON_LM_CHECK,)),
    Rule("megatron-moe-overlap", MEGATRON, ANY, None, False, False, True, NOT_1_PREFER_32,
         "MoE expert-parallel all-to-all overlap runs its communication on a second stream, "
         "which 1 serialises behind compute",
         "lets the expert-parallel all-to-all overlap compute (32, as Megatron-LM's launch "
         "guide and Megatron-Bridge use)",
         "Megatron-LM megatron/core/transformer/moe/README.md (overlap_moe_expert_parallel_comm "
         "needs the value above 1) and skills/mcore-run-on-slurm/SKILL.md (32); "
         f"{_VALIDATE_ARGS} only warns with TP/CP > 1; Megatron-Bridge "
         "scripts/performance/utils/overrides.py (not 1 with A2A overlap)"),
    Rule("megatron-blackwell", MEGATRON, BLACKWELL_OR_NEWER, None, False, False, False, NOTHING,
         "Blackwell and newer GPUs keep collectives ahead of compute without it", "",
         f"{_VALIDATE_ARGS}: the check applies only below compute capability major 10 {_CORE}"),
    Rule("megatron-model-parallel", MEGATRON, PRE_BLACKWELL, True, False, False, False,
         MUST_BE_1,
         "Megatron tensor/context parallelism before Blackwell keeps its collectives ahead "
         "of the compute they overlap only with one hardware queue",
         "keeps tensor/context-parallel collectives ahead of compute",
         f"{_VALIDATE_ARGS}: asserts the value is '1' when tensor_model_parallel_size > 1 or "
         "context_parallel_size > 1 below compute capability major 10, without FSDP or MoE "
         f"A2A overlap {_CORE}; Megatron-Core megatron/core/tensor_parallel/layers.py and "
         "TransformerEngine only warn",
         (MEGATRON_LM_CHECK,)),
    Rule("megatron-no-model-parallel", MEGATRON, ANY, False, False, False, False, NOTHING,
         "Megatron without tensor or context parallelism has no collective to order", "",
         f"{_VALIDATE_ARGS}: the check requires TP > 1 or CP > 1 {_CORE}"),
    Rule("fsdp-style", FSDP, ANY, None, None, None, None, NOT_1,
         "FSDP-style engines overlap all-gather and reduce-scatter with compute on separate "
         "streams, which 1 serialises",
         "keeps FSDP prefetch and reduce-scatter overlapping compute",
         "CUDA C Programming Guide (1 gives every stream one hardware queue; default 8, "
         "range 1..32); Megatron-LM docs megatron_fsdp.md; no framework asserts it"),
    Rule("inference", INFERENCE, ANY, None, None, None, None, NOT_1,
         "inference engines run several streams, which 1 serialises",
         "keeps the inference engine's streams concurrent",
         "no assert anywhere: SGLang python/sglang/srt/entrypoints/engine.py sets its own "
         "value in its own process at start-up (8; verl's patch 4); vLLM reads no such "
         "setting"),
)


def _either(value: Optional[bool], yes: str, no: str) -> str:
    return "any" if value is None else (yes if value else no)


def _strength_words(rule: Rule) -> str:
    if not rule.requirement.is_constraint:
        return "-"
    if rule.required_by:
        return ("required where " + " or ".join(f"`{c}`" for c in rule.required_by) +
                " checks run; else preferred")
    return "preferred"


def markdown_tables() -> str:
    """The rule and engine tables as ``docs/rules.md`` shows them; a test
    keeps the page in step with this module."""
    lines = [
        "| # | rule | engine | GPUs (oldest on the node) | TP or CP > 1 | Megatron-FSDP | "
        "torch FSDP2 | MoE A2A overlap | asks | strength | why | source |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for number, rule in enumerate(RULES, 1):
        lines.append(
            f"| {number} | `{rule.id}` | {rule.engine} | {rule.gpus} | "
            f"{_either(rule.model_parallel, 'yes', 'no')} | "
            f"{_either(rule.megatron_fsdp, 'yes', 'no')} | {_either(rule.torch_fsdp2, 'yes', 'no')} | "
            f"{_either(rule.moe_overlap, 'yes', 'no')} | {rule.requirement.label} | "
            f"{_strength_words(rule)} | {rule.why} | {rule.source} |")
    lines += ["", "| strategy / engine name | kind |", "|---|---|"]
    lines += [f"| `{name}` | {kind} |" for name, kind in sorted(KNOWN_STRATEGIES.items())]
    lines += ["", "| check (`checks` in the compact form) | what it is |", "|---|---|"]
    lines += [f"| `{name}` | {words} |" for name, words in CHECKS.items()]
    return "\n".join(lines)
