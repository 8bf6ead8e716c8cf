"""The rule table: what each engine needs from CUDA_DEVICE_MAX_CONNECTIONS.

This is data, not logic. ``policy.py`` walks it; ``docs/rules.md`` shows it
(a test keeps the two in step). Sources are cited per row so a reviewer can
check each claim against the engine that makes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, FrozenSet, Optional

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
    "fsdp": FSDP,
    "fsdp2": FSDP,
    "fsdp_turbo": FSDP,
    "veomni": FSDP,
    "torchtitan": FSDP,
    "automodel": FSDP,
    "vllm": INFERENCE,
    "sglang": INFERENCE,
    "trtllm": INFERENCE,
    "hf": INFERENCE,
}

# GPU classes of a node, by its oldest GPU. A node whose probe failed is
# classed PRE_BLACKWELL: setting 1 where Megatron needs it is correct there
# and harmless on Blackwell, while leaving it out would make Megatron assert.
NO_GPU = "no GPU"
PRE_BLACKWELL = "major < 10"
BLACKWELL_OR_NEWER = "major >= 10"
ANY = "any"


@dataclass(frozen=True)
class Requirement:
    """The set of values an engine accepts, and whether unset is accepted."""

    accepted: FrozenSet[int]
    unset_ok: bool

    @property
    def label(self) -> str:
        if self.unset_ok and self.accepted == _ALL:
            return "none"
        if self.accepted == _ALL - {1}:
            return "not 1"
        return " or ".join(str(v) for v in sorted(self.accepted))

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
        return Requirement(frozenset(accepted), unset_ok)

    def choose(self) -> int:
        """The value to write when one must be written: CUDA's default if it
        is allowed (so replacing a forbidden value changes as little as
        possible), else the smallest accepted value."""
        return CUDA_DEFAULT if CUDA_DEFAULT in self.accepted else min(self.accepted)


_ALL = frozenset(CUDA_RANGE)
NOTHING = Requirement(_ALL, unset_ok=True)
MUST_BE_1 = Requirement(frozenset({1}), unset_ok=False)
ONE_OR_32 = Requirement(frozenset({1, 32}), unset_ok=False)
NOT_1 = Requirement(_ALL - {1}, unset_ok=True)


@dataclass(frozen=True)
class Rule:
    """One row: when it applies, what it requires, why, and who says so.

    ``None`` in a condition means "either". The first matching row wins.
    """

    id: str
    engine: str
    gpus: str
    model_parallel: Optional[bool]  # tensor or context parallel size > 1
    fsdp: Optional[bool]  # Megatron-FSDP or torch FSDP2 under Megatron
    moe_overlap: Optional[bool]  # MoE expert-parallel communication overlap
    requirement: Requirement
    why: str
    source: str


RULES = (
    Rule("no-gpu", ANY, NO_GPU, None, None, None, NOTHING,
         "there is no NVIDIA GPU on the node, so there is nothing to set",
         "CUDA: the variable only affects CUDA contexts"),
    Rule("megatron-fsdp", MEGATRON, ANY, None, True, None, NOT_1,
         "Megatron-FSDP and torch FSDP2 under Megatron must not run with 1",
         "Megatron-LM megatron/training/arguments.py (asserts); docs megatron_fsdp.md"),
    Rule("megatron-blackwell", MEGATRON, BLACKWELL_OR_NEWER, None, False, None, NOTHING,
         "Blackwell and newer GPUs do not need 1 for Megatron",
         "Megatron-LM arguments.py (the check is for major < 10); Megatron-Bridge "
         "performance recipes use 32 there"),
    Rule("megatron-moe-overlap", MEGATRON, PRE_BLACKWELL, True, False, True, ONE_OR_32,
         "Megatron tensor/context parallelism with MoE expert-parallel overlap "
         "needs 1 or 32 before Blackwell",
         "Megatron-LM arguments.py (overlap_moe_expert_parallel_comm)"),
    Rule("megatron-model-parallel", MEGATRON, PRE_BLACKWELL, True, False, False, MUST_BE_1,
         "Megatron tensor/context parallelism needs 1 before Blackwell so that "
         "collectives are queued ahead of the compute they overlap",
         "Megatron-LM arguments.py (asserts); skills/mcore-run-on-slurm/SKILL.md; "
         "TransformerEngine comm-gemm-overlap README"),
    Rule("megatron-no-model-parallel", MEGATRON, ANY, False, False, None, NOTHING,
         "Megatron without tensor or context parallelism does not need it",
         "Megatron-LM arguments.py (the assert requires TP > 1 or CP > 1)"),
    Rule("fsdp-style", FSDP, ANY, None, None, None, NOT_1,
         "FSDP-style engines must not run with 1, which serialises prefetch and "
         "reduce-scatter behind compute",
         "Megatron-LM docs megatron_fsdp.md; TorchTitan/VeOmni overlap design; "
         "NVIDIA MPS guide (default 8, range 1..32)"),
    Rule("inference", INFERENCE, ANY, None, None, None, NOT_1,
         "inference engines must not run with 1, which serialises their streams",
         "SGLang sets 4 itself; vLLM overlaps scheduling and compute streams"),
)


def _either(value: Optional[bool], yes: str, no: str) -> str:
    return "any" if value is None else (yes if value else no)


def markdown_tables() -> str:
    """The rule and engine tables as ``docs/rules.md`` shows them; a test
    keeps the page in step with this module."""
    lines = [
        "| # | rule | engine | GPUs (oldest on the node) | TP or CP > 1 | Megatron-FSDP / "
        "torch FSDP2 | MoE EP overlap | requires | why | source |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for number, rule in enumerate(RULES, 1):
        lines.append(
            f"| {number} | `{rule.id}` | {rule.engine} | {rule.gpus} | "
            f"{_either(rule.model_parallel, 'yes', 'no')} | {_either(rule.fsdp, 'yes', 'no')} | "
            f"{_either(rule.moe_overlap, 'yes', 'no')} | {rule.requirement.label} | "
            f"{rule.why} | {rule.source} |")
    lines += ["", "| strategy / engine name | kind |", "|---|---|"]
    lines += [f"| `{name}` | {kind} |" for name, kind in sorted(KNOWN_STRATEGIES.items())]
    return "\n".join(lines)
