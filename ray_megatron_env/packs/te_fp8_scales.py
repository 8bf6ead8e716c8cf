"""The ``te-fp8-scales`` pack, opt-in: ``NVTE_FP8_BLOCK_SCALING_FP32_SCALES``
per node.

Transformer Engine reads it once, when ``transformer_engine.common.recipe``
is imported (``Float8BlockScaling.use_f32_scales = os.getenv(...,
"0") == "1"``): exactly ``"1"`` asks the FP8 block-scaling ("DeepSeek")
recipe for FP32 scaling factors, anything else for powers of 2. Hopper
takes either; from TE 2.9 (PR #2157, which brought the recipe to Blackwell)
both blockwise cast kernels refuse FP32 scales where ``sm_arch() >= 100``,
because the recipe is emulated with MXFP8 there. slime and miles put "1"
into every train actor, and miles decides it from the driver's GPU, so one
value reaches Hopper and Blackwell nodes alike. The node knows its GPUs, so
it says which value its trainer processes can run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Optional

from ..node import NodeFacts, format_capability
from .pack import (
    LEAVE, NONE, Outcome, Pack, PackRow, PackVerdict, REQUIRED, SET, seen, unless_a_trainer_on_gpus,
)
from ..names import FP8_SCALES_VARIABLE as SCALES_VARIABLE, PACK_VARIABLES_OF, TE_FP8_SCALES

if TYPE_CHECKING:  # pragma: no cover
    from ..spec import Spec

FP32 = "1"  # the only value TE reads as FP32 scales (== "1")
POWER_OF_2 = "0"
BLACKWELL_MAJOR = 10  # TE's sm_arch() >= 100

_RECIPE = ("Transformer Engine transformer_engine/common/recipe/__init__.py, "
           "Float8BlockScaling: use_f32_scales = os.getenv(\"NVTE_FP8_BLOCK_SCALING_FP32_SCALES\", "
           "\"0\") == \"1\", read once at import (2.8, 2.9 and main)")
_KERNELS = ("transformer_engine/common/transpose/quantize_transpose_square_blockwise.cu and "
            "quantize_transpose_vector_blockwise.cu: if (sm_arch() >= 100) NVTE_CHECK(pow_2_scale, "
            "\"On Blackwell and newer, the FP8 block scaling recipe is emulated with MXFP8, which "
            "requires using power of two scaling factors.\") (from 2.9, PR #2157; 2.8's "
            "check_fp8_block_scaling_support refuses the recipe outside Hopper); docs "
            "fp8_blockwise_scaling.rst: 'On Hopper, this constraint can be relaxed by setting "
            "... =1. On Blackwell, only powers of 2 are supported.'")
_WHO = ("slime slime/ray/actor_group.py and miles miles/ray/train/actor_factory.py: "
        "os.environ.get(..., \"1\") into every train actor (miles' default from the driver's GPU, "
        "miles/utils/environ.py: \"1\" where the driver sees none); slime docs "
        "low-precision.md: 'slime sets this to 1 by default for Ray actors'")

ROWS = (
    PackRow("fp32-scales-on-blackwell",
            f"a GPU of compute capability major >= {BLACKWELL_MAJOR} on the node (B200, B300, "
            "GB200, GB300, GB10, RTX 50), a trainer process (a role whose engine is not an "
            "inference engine), and the value is exactly 1: a framework's own (slime's, "
            "miles'), inherited from the node or copied from the driver",
            SET, ((SCALES_VARIABLE, POWER_OF_2),), REQUIRED,
            "FP8 block scaling with FP32 scales aborts in TE's blockwise cast kernels on "
            "Blackwell; 0 (powers of 2) runs on every GPU. A job's own 1 is kept with a "
            "warning (not satisfied)",
            f"{_RECIPE}; {_KERNELS}; {_WHO}"),
    PackRow("before-blackwell",
            f"every GPU of the node below compute capability major {BLACKWELL_MAJOR} (Hopper: "
            "TE takes FP32 scales there)",
            LEAVE, ((SCALES_VARIABLE, ""),), NONE,
            "1 is the frameworks' deliberate choice on Hopper, where TE relaxes the "
            "power-of-2 constraint; any value is left",
            f"{_KERNELS}; {_WHO}"),
    PackRow("leave",
            "no NVIDIA GPU, the GPUs could not be read, an inference process, or a value "
            "other than exactly 1 (TE reads it as powers of 2)",
            LEAVE, ((SCALES_VARIABLE, ""),), NONE,
            "nothing for the node to say, or a value every GPU runs",
            _RECIPE),
)
_BY_ID = {row.id: row for row in ROWS}


def _outcome(rule_id: str, value: Optional[str], reason: str, **kw: Any) -> Outcome:
    row = _BY_ID[rule_id]
    return Outcome(SCALES_VARIABLE, row.action, value, row.strength, row.id, reason, **kw)


def evaluate(spec: Spec, facts: NodeFacts, env_vars: Mapping[str, Any],
             node_environ: Mapping[str, str]) -> PackVerdict:
    """The pack's rows on one node: one outcome."""
    gpus = facts.gpus
    found = seen(SCALES_VARIABLE, spec, env_vars, node_environ)
    value = found.value
    early = unless_a_trainer_on_gpus(TE_FP8_SCALES, SCALES_VARIABLE, spec, facts,
                                     lambda why: _outcome("leave", value, why),
                                     ", which runs no TE recipe")
    if early is not None:
        return early
    where = gpus.describe()
    newest = max(gpus.capabilities)
    if newest[0] < BLACKWELL_MAJOR:
        return PackVerdict((_outcome("before-blackwell", value,
                                     f"{where}: TE takes FP32 or power-of-2 block scales on "
                                     "these GPUs [before-blackwell]"),))
    if value != FP32:
        return PackVerdict((_outcome("leave", value,
                                     f"{where}: {SCALES_VARIABLE} "
                                     f"{'unset' if value is None else repr(value)} gives power-of-2 "
                                     "scales, which Blackwell runs [leave]"),))
    replaces = found.replaces
    return PackVerdict((_outcome(
        "fp32-scales-on-blackwell", POWER_OF_2,
        f"{where}: {found.whose} {SCALES_VARIABLE}=1 asks TE for FP32 block scales, which its "
        f"blockwise cast kernels refuse on compute capability {format_capability(newest)} (the "
        "recipe is emulated with MXFP8 there) [fp32-scales-on-blackwell]",
        replaces=replaces, fill=replaces is not None),))


def scales_disagree(values: Mapping[str, Optional[str]]) -> Optional[str]:
    """A warning where the trainer workers of one job on these nodes (name ->
    their value; None: unset) would not all read the same scales: miles'
    weight exporter reads the variable to choose the rollout's quantization
    (quantizer_fp8.py), so trainers on different nodes may export differently."""
    fp32 = sorted(node for node, value in values.items() if value == FP32)
    other = sorted(node for node, value in values.items() if value != FP32)
    if not fp32 or not other:
        return None
    return (f"{SCALES_VARIABLE} differs between trainer nodes: FP32 scales (1) on "
            f"{', '.join(fp32)}, powers of 2 on {', '.join(other)}; TE trains either way, but "
            "miles' FP8 weight exporter reads it to choose the rollout's quantization format "
            "(miles/backends/megatron_utils/megatron_to_hf/processors/quantizer_fp8.py), so "
            "ranks on these nodes may export weights differently")


PACK = Pack(
    name=TE_FP8_SCALES,
    summary=("Transformer Engine's FP32 scales for FP8 block scaling, which slime and miles "
             "turn on for every train actor and which TE's kernels refuse on Blackwell. The "
             "pack writes 0 over a framework's, an image's or a driver's 1 on nodes with a "
             "GPU of compute capability 10.0 or newer, and leaves Hopper's 1. Leave it out "
             "where no job trains with FP8 block scaling."),
    variables=PACK_VARIABLES_OF[TE_FP8_SCALES],
    node_facts=("the compute capability of each NVIDIA GPU on the node (the GPU probe)",),
    config_facts=("the job's own NVTE_FP8_BLOCK_SCALING_FP32_SCALES (its env_vars), else the "
                  "node's; a framework's own value (framework_env in the compact form: slime's "
                  "and miles' 1)",
                  "whether the process runs a trainer engine (not an inference engine)"),
    rows=ROWS,
    evaluate=evaluate,
    defaults=((SCALES_VARIABLE, "0, powers of 2 (transformer_engine/common/recipe)"),),
)
