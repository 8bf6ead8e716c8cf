"""The ``fla-backend`` pack, opt-in: ``FLA_TILELANG`` per node.

flash-linear-attention (fla) runs the gated chunk backward of its linear
attention kernels (Qwen3.5's GatedDeltaNet among them) on Triton or on
TileLang. ``FLA_TILELANG`` set to anything but ``"0"`` forces TileLang
where it is installed, ``"0"`` forces Triton, and unset leaves fla's own
choice, which from 0.5.2 (PR #975) is per device: TileLang only on Hopper
with Triton 3.4 or later, where fla's Triton path gives wrong results and
raises instead (``fla/ops/common/chunk_o.py``); up to 0.5.1 TileLang was on
wherever installed. On Blackwell the TileLang packed backward aborts. SkyRL
writes ``"1"`` for every Megatron job, whatever the GPUs; its scripts tell
users to export ``0`` on Blackwell, one value for the whole cluster. The
node knows its GPUs, so it says which backend its trainer processes run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Optional

from ..node import NodeFacts
from .pack import (
    Demand, KEEP, LEAVE, NONE, Outcome, Pack, PackRow, PackVerdict, PREFERRED, REMOVE, REQUIRED,
    SET, Seen, seen, unless_a_trainer_on_gpus,
)
from ..names import FLA_BACKEND, PACK_VARIABLES_OF, TILELANG_VARIABLE

if TYPE_CHECKING:  # pragma: no cover
    from ..spec import Spec

OFF, ON = "0", "1"  # fla: os.environ value != "0" is on
HOPPER_MAJOR = 9
BLACKWELL_MAJOR = 10

_DEFAULT = ("fla 0.5.2 fla/ops/common/backends/tilelang/__init__.py TileLangBackend.is_enabled: "
            "an FLA_TILELANG value is used as it is (val != \"0\"), else IS_NVIDIA_HOPPER and "
            "TRITON_ABOVE_3_4_0; 0.6.0 the same default (fla/ops/common/backends/tilelang/"
            "__init__.py CommonTileLangBackend.default_enable; fla/backends.py is_enabled: "
            "FLA_TILELANG other than \"0\" turns on every TileLang backend); 0.5.1 "
            "fla/ops/backends/__init__.py: on unless \"0\" wherever tilelang is installed; "
            "IS_NVIDIA_HOPPER is the process's device 0 (fla/utils, 'NVIDIA H' or major 9)")
_HOPPER = ("fla 0.5.2 and 0.6.0 fla/ops/common/chunk_o.py chunk_bwd_dqkwg: raises RuntimeError "
           "('Triton >= 3.4.0 and < 3.7.1 on Hopper GPUs produces incorrect results for gated "
           "chunk_bwd_dqkwg (see #640)') on the Triton path; 0.5.1 for any Triton >= 3.4.0")
_BLACKWELL = ("NovaSky-AI/SkyRL PR #2170 (FLA_TILELANG=1 on B200: 'misaligned address' in "
              "fla/ops/gated_delta_rule/wy_fast.py prepare_wy_repr_bwd_kernel, first backward of "
              "any Qwen3.5 Megatron run); SkyRL examples/train/megatron/run_megatron_qwen3.5.sh "
              "('export FLA_TILELANG=0 ... leave unset on hopper')")
_SKYRL = ("SkyRL skyrl/train/utils/utils.py prepare_runtime_environment: "
          "env_vars[\"FLA_TILELANG\"] = os.environ.get(\"FLA_TILELANG\", \"1\") for every "
          "Megatron job")

ROWS = (
    PackRow("tilelang-on-blackwell",
            f"every GPU of the node of compute capability major >= {BLACKWELL_MAJOR}, a trainer "
            "process, and a value that turns TileLang on (anything but 0): SkyRL's own 1, "
            "inherited from the node or copied from the driver",
            SET, ((TILELANG_VARIABLE, OFF),), REQUIRED,
            "the TileLang packed backward aborts on Blackwell; 0 takes fla's Triton kernels, "
            "fla's own choice there from 0.5.2 and the only one up to 0.5.1. A job's own value "
            "is kept with a warning (not satisfied)",
            f"{_BLACKWELL}; {_DEFAULT}; {_SKYRL}"),
    PackRow("tilelang-off-on-hopper",
            f"a Hopper GPU (major {HOPPER_MAJOR}) and none of major >= {BLACKWELL_MAJOR}, a "
            "trainer process, and the value 0 (inherited, copied from the driver, or a "
            "framework's own)",
            SET, ((TILELANG_VARIABLE, ON),), REQUIRED,
            "0 forces fla's Triton backward, which gives wrong results on Hopper with Triton "
            "3.4 to 3.7.0 and raises RuntimeError there; 1 is fla's own choice on Hopper (a "
            "runtime env cannot unset an inherited value). A job's own 0 is kept with a "
            "warning (not satisfied)",
            f"{_HOPPER}; {_DEFAULT}"),
    PackRow("hopper-and-blackwell",
            "Hopper and Blackwell GPUs on one node, a trainer process, and any value",
            REMOVE, ((TILELANG_VARIABLE, ""),), REQUIRED,
            "no one value serves both: 1 aborts on the Blackwell GPUs, 0 raises on the Hopper "
            "ones; unset, fla 0.5.2 and later pick per process from its own GPU. A "
            "framework's value or a driver's copy is removed; the node's own cannot be "
            "(warned); a job's own is kept with a warning (not satisfied)",
            f"{_DEFAULT}; {_HOPPER}; {_BLACKWELL}"),
    PackRow("framework-tilelang-before-hopper",
            f"every GPU below major {HOPPER_MAJOR} (Ampere and older), a trainer process, and "
            "the framework's own 1 (SkyRL's)",
            REMOVE, ((TILELANG_VARIABLE, ON),), PREFERRED,
            "fla 0.5.2 and later keep Triton there; SkyRL's 1 forces TileLang on GPUs fla does "
            "not pick it for. Removed, so fla decides; anyone else's value is left",
            f"{_DEFAULT}; {_SKYRL}"),
    PackRow("leave",
            "no NVIDIA GPU, the GPUs could not be read, an inference process, unset (fla's own "
            "choice), or a value the node's GPUs run",
            LEAVE, ((TILELANG_VARIABLE, ""),), NONE,
            "nothing for the node to say",
            _DEFAULT),
)
_BY_ID = {row.id: row for row in ROWS}


def _outcome(rule_id: str, value: Optional[str], reason: str, action: Optional[str] = None,
             **kw: Any) -> Outcome:
    row = _BY_ID[rule_id]
    return Outcome(TILELANG_VARIABLE, action or row.action, value, row.strength, row.id, reason,
                   **kw)


def evaluate(spec: Spec, facts: NodeFacts, env_vars: Mapping[str, Any],
             node_environ: Mapping[str, str]) -> PackVerdict:
    """The pack's rows on one node: one outcome."""
    gpus = facts.gpus
    found = seen(TILELANG_VARIABLE, spec, env_vars, node_environ)
    value, replaces, whose = found.value, found.replaces, found.whose
    early = unless_a_trainer_on_gpus(FLA_BACKEND, TILELANG_VARIABLE, spec, facts,
                                     lambda why: _outcome("leave", value, why))
    if early is not None:
        return early
    where = gpus.describe()
    majors = {major for major, _ in gpus.capabilities}
    hopper, blackwell = HOPPER_MAJOR in majors, any(m >= BLACKWELL_MAJOR for m in majors)
    shown = "unset" if value is None else f"{TILELANG_VARIABLE}={value}"
    if hopper and blackwell:
        return _mixed(where, found)
    if blackwell and value is not None and value != OFF:
        return PackVerdict((_outcome(
            "tilelang-on-blackwell", OFF,
            f"{where}: {whose} {shown} turns on fla's TileLang backward, whose packed backward "
            "aborts on Blackwell [tilelang-on-blackwell]",
            replaces=replaces, fill=replaces is not None),))
    if hopper and value == OFF:
        return PackVerdict((_outcome(
            "tilelang-off-on-hopper", ON,
            f"{where}: {whose} {shown} forces fla's Triton backward, which raises on Hopper "
            "with Triton 3.4 to 3.7.0 [tilelang-off-on-hopper]",
            replaces=replaces, fill=replaces is not None),))
    if not hopper and not blackwell and replaces is not None:
        return PackVerdict((_outcome(
            "framework-tilelang-before-hopper", None,
            f"{where}: {whose} {shown} forces TileLang where fla 0.5.2 and later keep Triton "
            "[framework-tilelang-before-hopper]", replaces=replaces),))
    # A framework's value the GPUs run stays as it is (SkyRL's 1 on Hopper).
    return PackVerdict((_outcome("leave", value, f"{where}: {shown} runs on these GPUs [leave]"),))


def _mixed(where: str, found: Seen) -> PackVerdict:
    value, explicit, replaces = found.value, found.explicit, found.replaces
    said = "unset" if value is None else f"{found.whose} {TILELANG_VARIABLE}={value}"
    reason = (f"{where}: {said}; no one value serves both generations, and unset fla picks "
              "per process [hopper-and-blackwell]")
    if value is None:
        return PackVerdict((_outcome("hopper-and-blackwell", None, reason, action=LEAVE),))
    if explicit is not None and replaces is None:
        # The job's own value stays, as any explicit one; the demand says it breaks.
        demand = Demand("hopper-and-blackwell", REQUIRED, frozenset(), True,
                        f"the {FLA_BACKEND} pack (asks it unset) [hopper-and-blackwell; "
                        f"{reason}]", TILELANG_VARIABLE)
        return PackVerdict((_outcome("hopper-and-blackwell", explicit, reason, action=KEEP,
                                     demands=(demand,)),))
    return PackVerdict((_outcome("hopper-and-blackwell", None, reason, replaces=replaces),))


PACK = Pack(
    name=FLA_BACKEND,
    summary=("fla's TileLang or Triton kernels for linear attention (Qwen3.5's GatedDeltaNet), "
             "which SkyRL forces to TileLang for every Megatron job: TileLang aborts on "
             "Blackwell, and fla's Triton path raises on Hopper with Triton 3.4 to 3.7.0. The "
             "pack writes 0 on Blackwell nodes and 1 over a 0 on Hopper nodes, and leaves "
             "fla's own per-device default where nothing is set. Leave it out where no job "
             "trains a model with fla layers."),
    variables=PACK_VARIABLES_OF[FLA_BACKEND],
    node_facts=("the compute capability of each NVIDIA GPU on the node (the GPU probe)",),
    config_facts=("the job's own FLA_TILELANG (its env_vars), else the node's; a framework's "
                  "own value (framework_env in the compact form: SkyRL's 1 for Megatron jobs)",
                  "whether the process runs a trainer engine (not an inference engine)"),
    rows=ROWS,
    evaluate=evaluate,
    defaults=((TILELANG_VARIABLE, "fla's own choice, from 0.5.2 TileLang only on Hopper "
                                  "with Triton >= 3.4 (up to 0.5.1 wherever installed)"),),
)
