"""The rule table: what each engine asks of CUDA_DEVICE_MAX_CONNECTIONS.

This is data, not logic. ``policy.py`` walks it; ``docs/rules.md`` shows it
(a test keeps the two in step). Every row cites the upstream file and the
condition it comes from, so a reviewer can check each claim at its source.

Each row also has a strength. *Required*: the job fails without it, because
an assert in a code path the job runs checks the value (Megatron-LM's
``validate_args``, which only frameworks that call it run; Megatron-Core's
own group set-up, which every framework runs). *Preferred*: the value only
changes speed or overlap.

Most rows are alternatives: an engine takes the first that matches. A row
marked ``beside`` is an assert that holds on top of that row (Megatron-Core's
UCC check runs whatever else the engine does), so every matching one applies
too, and two required rows of one engine can conflict.
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
# AMD (ROCm), Huawei Ascend and Moore Threads (MUSA) accelerators: their
# runtimes do not read the variable (HIP's queue knob is GPU_MAX_HW_QUEUES,
# MUSA's is MUSA_DEVICE_MAX_CONNECTIONS; CANN has none), but Megatron's
# Python asserts read it there as on CUDA. docs/rules.md has the sources.
NON_CUDA = "non-CUDA accelerator"
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
# Checks that run wherever a Megatron engine runs, in every framework:
# Megatron-Core asserts them itself, in-process, when it builds its groups.
# They are never listed in an engine's ``checks``; a row they assert is
# required for every Megatron engine.
MEGATRON_CORE_CHECK = "megatron-core"
ALWAYS_RUN: Dict[str, str] = {
    MEGATRON_CORE_CHECK: "Megatron-Core's initialize_model_parallel asserts it (in every "
                         "framework)",
}
ASSERTS: Dict[str, str] = {**CHECKS, **ALWAYS_RUN}

# The flex token dispatcher's backends that run their own communication
# streams (Megatron-Core moe_flex_dispatcher_backend; ncclep is not read).
FLEX_BACKENDS = ("deepep", "hybridep")
# Megatron-Core's pipeline-parallel communication backends
# (model_parallel_config.py pipeline_model_parallel_comm_backend).
PIPELINE_BACKENDS = ("nccl", "ucc")


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


_VALIDATE_ARGS = "Megatron-LM megatron/training/arguments.py, validate_args"
_CORE = "(Megatron-Core 0.13 and later; see docs/rules.md for older releases)"

_BRIDGE_LAUNCHER = ("Megatron-Bridge scripts/performance/utils/overrides.py, "
                    "_apply_flat_cli_environment_compatibility (run only when a legacy "
                    "argparse TP, CP or A2A-overlap override is given)")
_NON_CUDA_SOURCES = (
    "MindSpeed-MM tests/st shell scripts export 1 with the note that it only gets past "
    "Megatron's check and has no effect on the NPU; verl PR #7040 set 1 only for its "
    "mindspeed strategy on Ascend (and PR #7374 removed it again, 2026-08-14); slime "
    "docker/npu_patch/slime.patch exports 1; FlagScale issue #1289 / PR #1288 (the same assert on MUSA; MUSA and "
    "CANN do not read the variable); MUSA launch scripts of Megatron training export 1 for "
    "it; ROCm clr rocclr/utils/flags.hpp: HIP's own queue setting is GPU_MAX_HW_QUEUES "
    "(default 4) and no CUDA_DEVICE_MAX_CONNECTIONS is read")

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
    Rule("non-cuda-megatron-model-parallel", MEGATRON, NON_CUDA, True, False, False, False,
         MUST_BE_1,
         "Megatron-LM's TP/CP check reads the CUDA variable's name from Python on these "
         "accelerators too (they report a major version below 10); their runtimes ignore "
         "the value itself",
         "lets Megatron-LM's TP/CP assert pass wherever the stack runs it (the accelerator "
         "ignores the value)",
         f"{_VALIDATE_ARGS}: asserts '1' for TP or CP > 1 below major 10, from Python; "
         + _NON_CUDA_SOURCES,
         (MEGATRON_LM_CHECK,)),
    Rule("non-cuda", ANY, NON_CUDA, None, None, None, None, NOTHING,
         "the accelerator's runtime does not read the variable and nothing asserts a value "
         "for this engine there, so there is nothing to set", "",
         _NON_CUDA_SOURCES),
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
         f"{_VALIDATE_ARGS}: the check applies only below compute capability major 10 {_CORE}",
         dispatcher=False),
    Rule("megatron-model-parallel", MEGATRON, PRE_BLACKWELL, True, False, False, False,
         MUST_BE_1,
         "Megatron tensor/context parallelism before Blackwell keeps its collectives ahead "
         "of the compute they overlap only with one hardware queue",
         "keeps tensor/context-parallel collectives ahead of compute",
         f"{_VALIDATE_ARGS}: asserts the value is '1' when tensor_model_parallel_size > 1 or "
         "context_parallel_size > 1 below compute capability major 10, without FSDP or MoE "
         f"A2A overlap {_CORE}, whatever the token dispatcher; Megatron-Core "
         "megatron/core/tensor_parallel/layers.py and TransformerEngine only warn; "
         f"{_BRIDGE_LAUNCHER} keeps 1 there even with DeepEP or HybridEP",
         (MEGATRON_LM_CHECK,)),
    Rule("megatron-flex-dispatcher", MEGATRON, ANY, None, False, False, False, NOT_1_PREFER_32,
         "the DeepEP and HybridEP token dispatchers run their all-to-all on communication "
         "streams of their own, which 1 serialises behind compute",
         "lets the DeepEP/HybridEP dispatch and combine overlap compute (32, as "
         "Megatron-Bridge sets)",
         "Megatron-Bridge's recipes with the flex dispatcher on DeepEP or HybridEP set 32 "
         "in cfg.env_vars on H100 at TP=1 (perf_recipes/qwen/h100/qwen3_moe.py "
         "qwen3_30b_a3b_pretrain_16gpu_h100_*, recipes/moonlight/h100/moonlight_16b.py) and on "
         "B200/GB200 (tests/golden/bridge_recipes.yaml); "
         f"{_BRIDGE_LAUNCHER} keys on moe_flex_dispatcher_backend alone (32 for deepep or "
         "hybridep, Megatron-Core's TransformerConfig default being deepep, else 8), then 32 "
         "on Blackwell and 1 for TP or CP > 1 without A2A overlap on other GPUs (the row "
         "above)",
         dispatcher=True),
    Rule("megatron-no-model-parallel", MEGATRON, ANY, False, False, False, False, NOTHING,
         "Megatron without tensor or context parallelism has no collective to order", "",
         f"{_VALIDATE_ARGS}: the check requires TP > 1 or CP > 1 {_CORE}",
         dispatcher=False),
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
    Rule("megatron-core-ucc-pipeline", MEGATRON, ANY, None, None, None, None, NOT_1,
         "pipeline communication on the UCC backend overlaps only with more than one "
         "hardware queue, and Megatron-Core refuses 1 when it builds the pipeline groups",
         "keeps UCC pipeline transfers overlapping compute",
         "Megatron-Core megatron/core/parallel_state.py, initialize_model_parallel: under "
         "`if pipeline_model_parallel_comm_backend == 'ucc'` and `if "
         "'CUDA_DEVICE_MAX_CONNECTIONS' in os.environ`, asserts the value != '1' ('UCC-backend "
         "requires CUDA_DEVICE_MAX_CONNECTIONS > 1'; newer releases raise RuntimeError), so "
         "unset passes; Megatron-Bridge training/initialize.py passes the model config's "
         "pipeline_model_parallel_comm_backend to it",
         (MEGATRON_CORE_CHECK,), ucc_pipeline=True, beside=True),
)
FIRST_MATCH_RULES = tuple(rule for rule in RULES if not rule.beside)
BESIDE_RULES = tuple(rule for rule in RULES if rule.beside)


def _either(value: Optional[bool], yes: str, no: str) -> str:
    return "any" if value is None else (yes if value else no)


def _strength_words(rule: Rule) -> str:
    if not rule.requirement.is_constraint:
        return "-"
    if set(rule.required_by) & set(ALWAYS_RUN):
        return "required (" + " and ".join(f"`{c}`" for c in rule.required_by) + ": always runs)"
    if rule.required_by:
        return ("required where " + " or ".join(f"`{c}`" for c in rule.required_by) +
                " checks run; else preferred")
    return "preferred"


def markdown_tables() -> str:
    """The rule and engine tables as ``docs/rules.md`` shows them; a test
    keeps the page in step with this module."""
    lines = [
        "| # | rule | applies | engine | GPUs (oldest on the node) | TP or CP > 1 | "
        "Megatron-FSDP | torch FSDP2 | MoE A2A overlap | DeepEP/HybridEP dispatcher | "
        "UCC pipeline | asks | strength | why | source |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for number, rule in enumerate(RULES, 1):
        lines.append(
            f"| {number} | `{rule.id}` | {'beside' if rule.beside else 'first match'} | "
            f"{rule.engine} | {rule.gpus} | "
            f"{_either(rule.model_parallel, 'yes', 'no')} | "
            f"{_either(rule.megatron_fsdp, 'yes', 'no')} | "
            f"{_either(rule.torch_fsdp2, 'yes', 'no')} | "
            f"{_either(rule.moe_overlap, 'yes', 'no')} | {_either(rule.dispatcher, 'yes', 'no')} | "
            f"{_either(rule.ucc_pipeline, 'yes', 'no')} | {rule.requirement.label} | "
            f"{_strength_words(rule)} | {rule.why} | {rule.source} |")
    lines += ["", "| strategy / engine name | kind |", "|---|---|"]
    lines += [f"| `{name}` | {kind} |" for name, kind in sorted(KNOWN_STRATEGIES.items())]
    lines += ["", "| check (`checks` in the compact form) | what it is |", "|---|---|"]
    lines += [f"| `{name}` | {words} |" for name, words in CHECKS.items()]
    lines += [f"| `{name}` (never listed: always runs) | {words} |"
              for name, words in ALWAYS_RUN.items()]
    return "\n".join(lines)
