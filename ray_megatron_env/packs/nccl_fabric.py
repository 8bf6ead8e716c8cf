"""The ``nccl-fabric`` pack, opt-in: NCCL's multi-node NVLink (MNNVL), NVLink
SHARP (NVLS) and cuMem switches, decided from each node's own fabric.

NCCL's defaults detect all three at communicator init (MNNVL_ENABLE=2 and
NVLS_ENABLE=2: auto; CUMEM_ENABLE=-2: auto). Where the node is healthy
that is the right answer, so the pack leaves them alone. It acts only where
NCCL's detection sees a capability the node cannot deliver, and then fails
init instead of falling back: a fabric-attached GPU whose container has no
IMEX channel, an NVSwitch GPU whose fabric never finished registering, and a
job that switched cuMem off under a TRT-LLM rollout that needs MNNVL.

Every fact read here comes from the node (``node.NodeFabric``) except the
config facts: the job's own NCCL_CUMEM_ENABLE and which roles' tensor
parallel groups span nodes (``Spec.tp_spans_nodes``).
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Tuple

from ..node import NodeFacts, NodeFabric
from ..spec import Spec
from . import (
    FABRIC, KEEP, LEAVE, NCCL_FABRIC, NONE, PREFERRED, REMOVE, REQUIRED, SET, Outcome, Pack,
    PackRow, PackVerdict,
)

MNNVL = "NCCL_MNNVL_ENABLE"
NVLS = "NCCL_NVLS_ENABLE"
CUMEM = "NCCL_CUMEM_ENABLE"
VARIABLES = (MNNVL, NVLS, CUMEM)
TRTLLM = "trtllm"
NVLS_MIN_MAJOR = 9  # NVLS multicast exists from Hopper (NCCL nvls.cc: SM90 channel counts)

_MNNVL_CHECK = ("NCCL src/mnnvl.cc ncclMnnvlCheck: with every rank's fabric state COMPLETED "
                "and a non-zero cluster UUID it allocates and exports a FABRIC handle, and a "
                "failure there returns ncclSystemError ('Check the IMEX channel configuration "
                "(/dev/nvidia-caps-imex-channels). Set NCCL_MNNVL_ENABLE=0'); src/init.cc: "
                "MNNVL_ENABLE defaults to 2 and the check runs on any multi-node communicator")
_NVLS_HANDLES = ("src/transport/nvls.cc: multicast objects are created and exported with "
                 "ncclCuMemHandleType, which ncclMnnvlCheck forces to FABRIC")
_NVLS_BIND = ("NCCL src/transport/nvls.cc: NVLS_ENABLE defaults to 2 (use NVLS where CUDA "
              "reports multicast support, ncclNvlsInit); a failed cuMulticastBindMem fails the "
              "communicator ('Failed to bind NVLink SHARP (NVLS) Multicast memory ... Fabric "
              "Manager or NVSwitches ... Disable NVLS (NCCL_NVLS_ENABLE=0)'); pytorch/ci-infra "
              "PR #541")
_CUMEM = ("NCCL src/mnnvl.cc: ncclMnnvlCheck returns at once, MNNVL off, unless "
          "ncclCuMemEnable(); src/misc/cudawrap.cc: CUMEM_ENABLE defaults to -2 (auto-detect)")

ROWS = (
    PackRow("fabric-without-imex",
            "every GPU's fabric is COMPLETED with status SUCCESS and a non-zero cluster UUID "
            "(a multi-node NVLink tray, GB200/GB300), and no IMEX channel is writable",
            SET, ((MNNVL, "0"), (NVLS, "0")), REQUIRED,
            "NCCL's default turns MNNVL on for such GPUs and needs an IMEX channel to share "
            "FABRIC memory handles; without one, NCCL 2.27.3 and later fail "
            "ncclCommInitRank with ncclSystemError (2.26 turned MNNVL off silently), and "
            "NVLS multicast uses the same FABRIC handles",
            f"{_MNNVL_CHECK}; {_NVLS_HANDLES}; nebius-solutions-library PR #1137 (GB300 "
            "without an IMEX ComputeDomain)"),
    PackRow("nvswitch-fabric-not-ready",
            "the GPUs report a fabric state (NVSwitch, not NOT_SUPPORTED), compute capability "
            f"major >= {NVLS_MIN_MAJOR}, and some GPU's fabric is not COMPLETED with SUCCESS "
            "(Fabric Manager not running or not done)",
            SET, ((NVLS, "0"),), REQUIRED,
            "CUDA can still report multicast support, so NCCL's default tries NVLS, and "
            "binding multicast memory fails without a registered fabric; since NCCL 2.29 "
            "that fails init instead of falling back",
            _NVLS_BIND),
    PackRow("cumem-off-under-trtllm-multinode-tp",
            "fabric-attached node with a writable IMEX channel, the job sets "
            "NCCL_CUMEM_ENABLE=0, and a TRT-LLM rollout role's tensor parallel group spans "
            "nodes",
            REMOVE, ((CUMEM, "0"),), REQUIRED,
            "cuMem off silently turns MNNVL off, and TRT-LLM's multi-node tensor parallelism "
            "over NVLink then hangs",
            f"{_CUMEM}; verl PR #5693 (GB200 TRT-LLM multi-node TP hang); verl PR #7564 "
            "(keeps a user's own value)"),
    PackRow("cumem-off-disables-mnnvl",
            "fabric-attached node with a writable IMEX channel and the job sets "
            "NCCL_CUMEM_ENABLE=0 (any other engine)",
            KEEP, ((CUMEM, "0"),), PREFERRED,
            "MNNVL will be off on this node, so cross-tray traffic takes the network; the "
            "job's value is its own (ROLL, AReaL and slime set it) and is kept",
            _CUMEM),
    PackRow("fabric-degraded",
            "fabric-attached node whose fabric health reports degraded bandwidth",
            LEAVE, (), NONE,
            "NCCL still works but NVLink bandwidth is reduced; an operator should look at "
            "the fabric",
            "NVML nvmlGpuFabricInfo_v2 healthMask (DEGRADED_BW); NVIDIA/nccl#2186"),
    PackRow("leave-to-nccl",
            "anything else: healthy fabric with an IMEX channel, PCIe or NVLink-bridge GPUs "
            "(fabric NOT_SUPPORTED), GPUs before Hopper, no GPU, fabric unreadable",
            LEAVE, ((MNNVL, ""), (NVLS, ""), (CUMEM, "")), NONE,
            "NCCL's own detection is right there; a forced NCCL_NVLS_ENABLE=1 would skip "
            "NCCL's multicast check, so no value is the safer choice",
            "NCCL src/init.cc (MNNVL_ENABLE=2), src/transport/nvls.cc ncclNvlsInit "
            "(NVLS_ENABLE=2 asks CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED; 1 skips it), "
            "src/misc/cudawrap.cc (CUMEM_ENABLE=-2)"),
)
_BY_ID = {row.id: row for row in ROWS}


def _is_zero(value: Optional[str]) -> bool:
    try:
        return value is not None and int(str(value).strip()) == 0
    except ValueError:
        return False


def _multinode_trtllm(spec: Spec) -> Tuple[str, ...]:
    spans = set(spec.tp_spans_nodes)
    return tuple(role for role, engine in spec.engines
                 if role in spans and engine.strategy == TRTLLM)


def _outcome(variable: str, rule_id: str, value: Optional[str], reason: str) -> Outcome:
    row = _BY_ID[rule_id]
    return Outcome(variable, row.action, value, row.strength, row.id, reason)


def evaluate(spec: Spec, facts: NodeFacts, env_vars: Mapping[str, Any],
             node_environ: Mapping[str, str]) -> PackVerdict:
    """The pack's rows on one node: one outcome per variable, and warnings."""
    fabric = facts.fabric
    decided = {}
    warnings = []
    if fabric is None or not fabric.is_known:
        error = "not probed" if fabric is None else fabric.error
        warnings.append(f"{NCCL_FABRIC}: the node's fabric could not be read ({error}); "
                        "NCCL's defaults are left alone")
        where = f"fabric unknown ({error})"
    else:
        where = fabric.describe()
        decided.update(_fabric_rows(fabric, facts, where))
        if fabric.attached and fabric.imex_channel == "writable":
            cumem = env_vars.get(CUMEM, node_environ.get(CUMEM))
            if _is_zero(cumem):
                decided[CUMEM] = _cumem(spec, where, cumem)
        if fabric.attached and fabric.degraded:
            warnings.append(f"{NCCL_FABRIC} [fabric-degraded]: {where}: the fabric reports "
                            "degraded NVLink bandwidth; NCCL runs, slower (NVIDIA/nccl#2186)")
    outcomes = tuple(decided.get(v) or _outcome(v, "leave-to-nccl", None,
                                                 f"{where}: left to NCCL's own detection")
                     for v in VARIABLES)
    if decided.get(CUMEM) and decided[CUMEM].action == KEEP:
        warnings.append(f"{NCCL_FABRIC} [cumem-off-disables-mnnvl]: {decided[CUMEM].reason}")
    return PackVerdict(outcomes, tuple(warnings))


def _fabric_rows(fabric: NodeFabric, facts: NodeFacts, where: str) -> dict:
    if fabric.attached and fabric.imex_channel != "writable":
        reason = (f"{where}: NCCL would turn MNNVL on and fail init without an IMEX channel "
                  "[fabric-without-imex]")
        return {MNNVL: _outcome(MNNVL, "fabric-without-imex", "0", reason),
                NVLS: _outcome(NVLS, "fabric-without-imex", "0", reason)}
    oldest = facts.gpus.oldest
    if fabric.switched and not fabric.ready and oldest is not None \
            and oldest[0] >= NVLS_MIN_MAJOR:
        reason = (f"{where}: NVLS multicast cannot bind before the fabric is registered "
                  "[nvswitch-fabric-not-ready]")
        return {NVLS: _outcome(NVLS, "nvswitch-fabric-not-ready", "0", reason)}
    return {}


def _cumem(spec: Spec, where: str, value: str) -> Outcome:
    roles = _multinode_trtllm(spec)
    if roles:
        return _outcome(CUMEM, "cumem-off-under-trtllm-multinode-tp", value,
                        f"{where}: NCCL_CUMEM_ENABLE={value} turns MNNVL off and "
                        f"{', '.join(roles)} (TRT-LLM, tensor parallel across nodes) hangs "
                        "without it; removed [cumem-off-under-trtllm-multinode-tp]")
    return _outcome(CUMEM, "cumem-off-disables-mnnvl", value,
                    f"{where}: NCCL_CUMEM_ENABLE={value} is kept, so MNNVL will be off on "
                    "this node [cumem-off-disables-mnnvl]")


PACK = Pack(
    name=NCCL_FABRIC,
    summary=("NCCL's multi-node NVLink, NVLink SHARP and cuMem switches. NCCL detects all "
             "three itself; the pack steps in only where that detection sees a capability "
             "the node cannot deliver and NCCL would fail or hang instead of falling back."),
    variables=VARIABLES,
    node_facts=("per GPU, NVML's fabric record (nvmlDeviceGetGpuFabricInfoV, or the Fabric "
                "block of nvidia-smi -q): state, status, cluster UUID, clique, health",
                "whether /dev/nvidia-caps-imex-channels/channel<N> exists and is writable",
                "the oldest GPU's compute capability"),
    config_facts=("the job's own NCCL_CUMEM_ENABLE (its env_vars, else the node's)",
                  "roles whose tensor parallel group spans nodes (tp_spans_nodes in the "
                  "compact form; build_runtime_env(tp_spans_nodes=...)) and their engine"),
    rows=ROWS,
    evaluate=evaluate,
    fact_kinds=(FABRIC,),
    defaults=((MNNVL, "2, auto (src/init.cc)"), (NVLS, "2, auto (src/transport/nvls.cc)"),
              (CUMEM, "-2, auto-detect (src/misc/cudawrap.cc)")),
)
