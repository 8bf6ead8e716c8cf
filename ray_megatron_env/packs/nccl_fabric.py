"""The ``nccl-fabric`` pack, opt-in: NCCL's multi-node NVLink (MNNVL), NVLink
SHARP (NVLS) and cuMem switches, decided from each node's own fabric.

NCCL's defaults detect all three at communicator init (MNNVL_ENABLE=2 and
NVLS_ENABLE=2: auto; CUMEM_ENABLE=-2: auto). Where the node is healthy
that is the right answer, so the pack leaves them alone. It sets a value
only where NCCL's detection sees a capability the node cannot deliver, and
then fails init instead of falling back: a fabric-attached GPU whose
container has no IMEX channel, whose fabric registration failed, or whose
IMEX domain is down (MNNVL off), and an NVSwitch GPU whose fabric never
finished registering (NVLS off). A job that switched cuMem off where MNNVL
would run keeps its value, with a warning.

Every fact read here comes from the node (``node.NodeFabric``) except the
config facts: the job's own NCCL_CUMEM_ENABLE, each TRT-LLM role's tensor
parallel size, and ``Spec.tp_spans_nodes`` (an override).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Optional, Tuple

from ..engines import TRTLLM
from ..names import (
    CUMEM_VARIABLE as CUMEM, MNNVL_VARIABLE as MNNVL, NCCL_FABRIC, NVLS_VARIABLE as NVLS,
    PACK_FACT_KINDS, PACK_VARIABLES_OF,
)
from ..node import IMEX_NOT_READY, WRITABLE, NodeFabric, NodeFacts
from .nccl_p2p import p2p_level_loc
from .nccl_params import (
    CONF_FILLS, CONF_SET, CONF_UNSEEN, NCCL_READ, cumem_off, nccl_param, worker_value,
)
from .pack import KEEP, LEAVE, NONE, Outcome, Pack, PackRow, PackVerdict, PREFERRED, REQUIRED, SET

if TYPE_CHECKING:  # pragma: no cover
    from ..spec import Spec

VARIABLES = PACK_VARIABLES_OF[NCCL_FABRIC]
NVLS_MIN_MAJOR = 9  # NVLS multicast exists from Hopper (NCCL nvls.cc: SM90 channel counts)

_MNNVL_CHECK = ("NCCL src/mnnvl.cc ncclMnnvlCheck: it tests every rank's fabric state "
                "(COMPLETED) and a non-zero cluster UUID, not the status, then allocates a "
                "FABRIC handle; from 2.27.3 a failed allocation returns ncclSystemError ('Check "
                "the IMEX channel configuration (/dev/nvidia-caps-imex-channels). Set "
                "NCCL_MNNVL_ENABLE=0'; 2.25 and 2.26 turned MNNVL off there instead); "
                "src/init.cc: MNNVL_ENABLE defaults to 2 and the check runs on any multi-node "
                "communicator")
_IMEX_CHECK = ("NCCL src/mnnvl.cc ncclMnnvlCheck (from 2.25.1): a FABRIC handle that cannot "
               "be exported and imported returns ncclSystemError ('Check the IMEX "
               "configuration (nvidia-imex-ctl -N). Set NCCL_MNNVL_ENABLE=0'); the node's "
               "IMEX state is read from nvidia-imex-ctl -N -j (domain status DOWN)")
_NVML_STATUS = ("NVML nvml.h nvmlGpuFabricInfo_v2_t: status is the registration's error "
                "status, to be checked once the state is COMPLETED")
_NVLS_BIND = ("NCCL src/transport/nvls.cc: NVLS_ENABLE defaults to 2 (use NVLS where CUDA "
              "reports multicast support, ncclNvlsInit); a failed cuMulticastBindMem fails "
              "the communicator before 2.27 (CUCHECKGOTO) and again from 2.29 ('Failed to "
              "bind NVLink SHARP (NVLS) Multicast memory ... Fabric Manager or NVSwitches ... "
              "Disable NVLS (NCCL_NVLS_ENABLE=0)'); only 2.27 and 2.28 fell back without NVLS "
              "unless NVLS_ENABLE=1; pytorch/ci-infra PR #541")
_CUMEM = ("NCCL src/mnnvl.cc: ncclMnnvlCheck returns at once, MNNVL off, unless "
          "ncclCuMemEnable(); src/misc/cudawrap.cc: ncclCuMemEnable() is param >= 0 ? param "
          ": (param == -2 && supported), CUMEM_ENABLE defaults to -2, so 0 and every other "
          "negative value (-1) turn cuMem off; src/misc/param.cc reads it with strtoll")
_TRTLLM_SOURCES = ("verl PR #5693 (its description: NCCL_CUMEM_ENABLE=0 on GB200 with MNNVL "
                   "makes TRT-LLM multi-node TP hang in the sampler's all-gather/all-reduce); "
                   "against it, verl verl/plugin/platform/platform_cuda.py rollout_env_vars "
                   "sets NCCL_CUMEM_ENABLE=0 for rollout servers (PR #6086, a weight-sync "
                   "hang) and PR #7564 keeps 0 as the default while respecting an external "
                   "value")
_HEALTH = ("NVML nvml.h (and nvidia-ml-py's pynvml) NVML_GPU_FABRIC_HEALTH_MASK_*: "
           "DEGRADED_BW bits 0-1, ROUTE_RECOVERY 2-3, ROUTE_UNHEALTHY 4-5, "
           "ACCESS_TIMEOUT_RECOVERY 6-7 (1 true, 2 false), INCORRECT_CONFIGURATION 8-11 (1 "
           "none, 2-8 a fault), PARTITION_ASSIGNED 12-13 (2 false), GFM_STATE 14-15 (2 "
           "disconnected), 0 not reported; NCCL src/init.cc only logs the mask")

ROWS = (
    PackRow("fabric-without-imex",
            "every GPU's fabric state is COMPLETED with a non-zero cluster UUID (a "
            "multi-node NVLink tray, GB200/GB300; the status is not tested, as NCCL does not "
            "test it), and no IMEX channel is writable",
            SET, ((MNNVL, "0"),), REQUIRED,
            "NCCL's default takes the MNNVL path on such GPUs and needs an IMEX channel to "
            "allocate FABRIC memory; without one, NCCL 2.27.3 and later fail "
            "ncclCommInitRank with ncclSystemError. NVLS is not touched: with MNNVL off, "
            "NVLS groups are per host and share POSIX file-descriptor handles, which need no "
            "IMEX",
            f"{_MNNVL_CHECK}; src/misc/cudawrap.cc (ncclCuMemHandleType starts as "
            "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR; only ncclMnnvlCheck switches it to "
            "FABRIC) and src/transport/nvls.cc (ncclNvlsGroupCreate/Connect export FABRIC "
            "handles only when that type is FABRIC, else pass a file descriptor through the "
            "proxy); nebius-solutions-library PR #1137 (GB300 without an IMEX ComputeDomain); "
            f"{NCCL_READ}",
            CONF_SET),
    PackRow("fabric-registration-failed",
            "every GPU's fabric state is COMPLETED with a non-zero cluster UUID, and some "
            "GPU's status is not SUCCESS",
            SET, ((MNNVL, "0"),), REQUIRED,
            "the GPU's registration with the NVLink fabric finished with an error; NCCL's "
            "check reads only the state and UUID, so it takes the MNNVL path on a fabric "
            "NVML reports as failed, where FABRIC memory cannot be shared",
            f"{_NVML_STATUS}; {_MNNVL_CHECK}; {NCCL_READ}",
            CONF_SET),
    PackRow("fabric-imex-not-ready",
            "fabric-attached (as above), a writable IMEX channel, and the node reports the "
            "IMEX domain not ready (imex_status not-ready: nvidia-imex-ctl -N -j says DOWN)",
            SET, ((MNNVL, "0"),), REQUIRED,
            "the channel lets CUDA allocate FABRIC memory, but exporting and importing it "
            "needs the IMEX daemon; NCCL 2.25.1 and later fail ncclCommInitRank when that "
            "fails",
            f"{_IMEX_CHECK}; {NCCL_READ}",
            CONF_SET),
    PackRow("nvswitch-fabric-not-ready",
            "the GPUs report a fabric state (NVSwitch, not NOT_SUPPORTED), compute capability "
            f"major >= {NVLS_MIN_MAJOR}, and some GPU's fabric is not COMPLETED with SUCCESS "
            "(Fabric Manager not running, not done, or failed)",
            SET, ((NVLS, "0"),), REQUIRED,
            "CUDA can still report multicast support, so NCCL's default tries NVLS, and "
            "binding multicast memory fails without a registered fabric; before NCCL 2.27 "
            "and from 2.29 that fails init (2.27 and 2.28 fell back)",
            f"{_NVLS_BIND}; {NCCL_READ}",
            CONF_SET),
    PackRow("cumem-off-under-trtllm-multinode-tp",
            "NCCL would take the MNNVL path (fabric-attached, registered, a writable IMEX "
            "channel, IMEX not reported down), the job turns cuMem off (NCCL_CUMEM_ENABLE "
            "0, -1 or any value ncclCuMemEnable() reads as off), and a TRT-LLM rollout "
            "role's tensor parallel group spans nodes (its TP size above the node's GPU "
            "count, or named in tp_spans_nodes)",
            KEEP, ((CUMEM, "0"),), PREFERRED,
            "cuMem off turns MNNVL off (NCCL's source); whether TRT-LLM's cross-node TP then "
            "hangs is contested: one verl PR reports the hang, while verl's own rollout "
            "code sets 0 on purpose against another hang. The job's value is kept and a "
            "warning names both",
            f"{_CUMEM}; {_TRTLLM_SOURCES}; {NCCL_READ}",
            CONF_UNSEEN),
    PackRow("cumem-off-disables-mnnvl",
            "NCCL would take the MNNVL path (as above) and the job turns cuMem off (any "
            "other engine, or TRT-LLM within a node)",
            KEEP, ((CUMEM, "0"),), PREFERRED,
            "MNNVL will be off on this node, so cross-tray traffic takes the network; the "
            "job's value is its own (ROLL, AReaL and slime set it) and is kept",
            f"{_CUMEM}; {NCCL_READ}",
            CONF_UNSEEN),
    PackRow("p2p-off-disables-mnnvl",
            "NCCL would take the MNNVL path (as above, cuMem on), the job (or the node) sets "
            "NCCL_P2P_DISABLE=1, or NCCL_P2P_LEVEL=LOC (or an old-style level that reads as 0) "
            "while NCCL_P2P_DISABLE is not 1, and NCCL_MNNVL_ENABLE is not 1",
            LEAVE, (), NONE,
            "a warning, nothing set: NCCL runs its MNNVL check only where the P2P level is "
            "not 0, and either value makes it 0, so MNNVL is off on this node and cross-tray "
            "traffic takes the network (NCCL_MNNVL_ENABLE=1 would force the check); the "
            "variables are the nccl-host-mem pack's, and the job's value stays",
            "NCCL src/init.cc (from 2.27.3: the MNNVL check runs if (nNodes > 1 && "
            "MNNVL_ENABLE != 0 && p2pLevel != 0) || MNNVL_ENABLE == 1); src/graph/paths.cc "
            "ncclGetLevel (NCCL_P2P_DISABLE read with strtol(str, NULL, 0); 1 gives PATH_LOC, "
            "which is 0; else NCCL_P2P_LEVEL: 'LOC' is PATH_LOC, and a value starting with a "
            f"digit is the old numbering, where 0 is PATH_LOC); {NCCL_READ}",
            CONF_UNSEEN),
    PackRow("fabric-health",
            "fabric-attached node whose NVML fabric health mask reports a problem (degraded "
            "bandwidth, route recovery or unhealthy route, access-timeout recovery, an "
            "incorrect configuration, no partition, Fabric Manager disconnected)",
            LEAVE, (), NONE,
            "a warning for the operator, nothing set: NCCL does not read the mask, and no "
            "source ties a mask value to an NCCL failure (NVIDIA/nccl#2186, a SIGSEGV at "
            "large clique sizes, reports mask 0xaa, which decodes as healthy)",
            f"{_HEALTH}; {NCCL_READ}",
            "none: the row reads no NCCL variable"),
    PackRow("leave-to-nccl",
            "anything else: a registered fabric with a writable IMEX channel and IMEX ready "
            "or unknown, PCIe or NVLink-bridge GPUs (fabric NOT_SUPPORTED), GPUs before "
            "Hopper, no GPU, fabric unreadable",
            LEAVE, ((MNNVL, ""), (NVLS, ""), (CUMEM, "")), NONE,
            "NCCL's own detection is right there; a forced NCCL_NVLS_ENABLE=1 would skip "
            "NCCL's multicast check, so no value is the safer choice. Where IMEX's state is "
            "unknown, NCCL's own export/import check decides",
            "NCCL src/init.cc (MNNVL_ENABLE=2), src/transport/nvls.cc ncclNvlsInit "
            "(NVLS_ENABLE=2 asks CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED; 1 skips it), "
            f"src/misc/cudawrap.cc (CUMEM_ENABLE=-2); {NCCL_READ}",
            CONF_FILLS + " (NCCL_NVLS_ENABLE=1 there skips NCCL's multicast check)"),
)
_BY_ID = {row.id: row for row in ROWS}

def _gpu_count(facts: NodeFacts) -> Optional[int]:
    caps = facts.gpus.capabilities
    return None if caps is None else len(caps)


def multinode_trtllm(spec: Spec, facts: NodeFacts) -> Tuple[Tuple[str, str], ...]:
    """(role, why) for each TRT-LLM role whose tensor parallel group spans
    nodes: its TP size is above this node's GPU count (TP=8 on a 4-GPU GB200
    tray), or the job says so (tp_spans_nodes, an override)."""
    count = _gpu_count(facts)
    spans = set(spec.tp_spans_nodes)
    out = []
    for role, engine in spec.engines:
        if engine.strategy != TRTLLM:
            continue
        if role in spans:
            out.append((role, "named in tp_spans_nodes"))
        elif count and engine.tensor_parallel > count:
            out.append((role, f"TP={engine.tensor_parallel} on a {count}-GPU node"))
    return tuple(out)


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
        if fabric.attached and MNNVL not in decided:
            cumem = worker_value(CUMEM, env_vars, node_environ)
            if cumem_off(cumem):
                outcome, warning = _cumem(spec, facts, where, str(cumem))
                decided[CUMEM] = outcome
                warnings.append(warning)
            else:
                warning = _p2p_off(env_vars, node_environ, where)
                if warning:
                    warnings.append(warning)
        problems = fabric.health_problems
        if fabric.attached and problems:
            warnings.append(f"{NCCL_FABRIC} [fabric-health]: {where}: NVML's fabric health "
                            f"mask reports {', '.join(problems)}; nothing is set (NCCL does "
                            "not read the mask), an operator should look at the fabric")
    outcomes = tuple(decided.get(v) or _outcome(v, "leave-to-nccl", None,
                                                 f"{where}: left to NCCL's own detection")
                     for v in VARIABLES)
    return PackVerdict(outcomes, tuple(warnings))


def _fabric_rows(fabric: NodeFabric, facts: NodeFacts, where: str) -> dict:
    out = {}
    if fabric.attached:
        if fabric.imex_channel != WRITABLE:
            out[MNNVL] = _outcome(MNNVL, "fabric-without-imex", "0",
                                  f"{where}: NCCL would take the MNNVL path and fail init "
                                  "without a writable IMEX channel [fabric-without-imex]")
        elif fabric.registration_failed:
            out[MNNVL] = _outcome(MNNVL, "fabric-registration-failed", "0",
                                  f"{where}: the fabric registration reports an error, and "
                                  "NCCL's MNNVL check does not read it "
                                  "[fabric-registration-failed]")
        elif fabric.imex_status == IMEX_NOT_READY:
            out[MNNVL] = _outcome(MNNVL, "fabric-imex-not-ready", "0",
                                  f"{where} ({fabric.imex_detail or 'imex_status not-ready'}): "
                                  "NCCL's FABRIC export/import check would fail init "
                                  "[fabric-imex-not-ready]")
    oldest = facts.gpus.oldest
    if fabric.switched and not fabric.ready and oldest is not None \
            and oldest[0] >= NVLS_MIN_MAJOR:
        out[NVLS] = _outcome(NVLS, "nvswitch-fabric-not-ready", "0",
                             f"{where}: NVLS multicast cannot bind before the fabric is "
                             "registered [nvswitch-fabric-not-ready]")
    return out


def _p2p_off(env_vars: Mapping[str, Any], node_environ: Mapping[str, str],
             where: str) -> Optional[str]:
    """The warning where the job's P2P level of 0 (NCCL_P2P_DISABLE=1, or
    NCCL_P2P_LEVEL=LOC) keeps NCCL from its MNNVL check."""
    variable = p2p_level_loc(env_vars, node_environ)
    if variable is None or nccl_param(worker_value(MNNVL, env_vars, node_environ), 2) == 1:
        return None
    value = worker_value(variable, env_vars, node_environ)
    return (f"{NCCL_FABRIC} [p2p-off-disables-mnnvl]: {where}: {variable}={value} also "
            "turns multi-node NVLink off (NCCL runs its MNNVL check only where the P2P level "
            "is not 0), so cross-tray traffic takes the network; nothing is set")


def _cumem(spec: Spec, facts: NodeFacts, where: str, value: str) -> Tuple[Outcome, str]:
    roles = multinode_trtllm(spec, facts)
    if roles:
        named = ", ".join(f"{role} ({why})" for role, why in roles)
        reason = (f"{where}: the job's NCCL_CUMEM_ENABLE={value} turns cuMem, and so MNNVL, "
                  f"off while TRT-LLM's tensor parallel group spans nodes: {named}; kept, "
                  "because the evidence is contested: verl PR #5693 reports a multi-node TP "
                  "hang with cuMem off, while verl's platform_cuda.py rollout_env_vars (PR "
                  "#6086, #7564) sets 0 for rollouts against a weight-sync hang "
                  "[cumem-off-under-trtllm-multinode-tp]")
        return (_outcome(CUMEM, "cumem-off-under-trtllm-multinode-tp", value, reason),
                f"{NCCL_FABRIC} [cumem-off-under-trtllm-multinode-tp]: {reason}")
    reason = (f"{where}: NCCL_CUMEM_ENABLE={value} is kept, so MNNVL will be off on this "
              "node [cumem-off-disables-mnnvl]")
    return (_outcome(CUMEM, "cumem-off-disables-mnnvl", value, reason),
            f"{NCCL_FABRIC} [cumem-off-disables-mnnvl]: {reason}")


PACK = Pack(
    name=NCCL_FABRIC,
    summary=("NCCL's multi-node NVLink, NVLink SHARP and cuMem switches. NCCL detects all "
             "three itself; the pack steps in only where that detection sees a capability "
             "the node cannot deliver and NCCL would fail or hang instead of falling back."),
    variables=VARIABLES,
    node_facts=("per GPU, NVML's fabric record (nvmlDeviceGetGpuFabricInfoV, or the Fabric "
                "block of nvidia-smi -q): state, status, cluster UUID, clique, health",
                "whether /dev/nvidia-caps-imex-channels/channel<N> exists and is writable",
                "on a fabric-attached node, the IMEX domain's status from nvidia-imex-ctl -N "
                "-j (UP: ready, DOWN: not-ready, otherwise unknown)",
                "the number of GPUs",
                "the oldest GPU's compute capability"),
    config_facts=("the job's own NCCL_CUMEM_ENABLE, NCCL_P2P_DISABLE, NCCL_P2P_LEVEL and "
                  "NCCL_MNNVL_ENABLE (its env_vars, else the node's; never NCCL's config files)",
                  "each TRT-LLM role's tensor parallel size (spans nodes when above the "
                  "node's GPU count)",
                  "roles whose tensor parallel group spans nodes whatever their size "
                  "(tp_spans_nodes in the compact form; build_runtime_env(tp_spans_nodes=...)"
                  "), an override"),
    rows=ROWS,
    evaluate=evaluate,
    fact_kinds=PACK_FACT_KINDS[NCCL_FABRIC],
    defaults=((MNNVL, "2, auto (src/init.cc)"), (NVLS, "2, auto (src/transport/nvls.cc)"),
              (CUMEM, "-2, auto-detect (src/misc/cudawrap.cc)")),
)
