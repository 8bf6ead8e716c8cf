"""The ``nccl-host-mem`` pack, opt-in: NCCL's cuMem host allocations on
nodes whose GPUs cannot all reach each other peer to peer.

Since NCCL 2.24, NCCL_CUMEM_HOST_ENABLE defaults to 1 where the CUDA driver
reports 12.6 or later (src/misc/cudawrap.cc, ncclCuMemHostEnable), and the
SHM transport then shares its host buffers through cuMem handles
(src/transport/shm.cc, taken only when ncclCuMemEnable() and
ncclCuMemHostEnable() both hold). With a CUDA driver before 13.0 that fails
between GPUs without peer access: ``Cuda failure 217 'peer access is not
supported between these two devices'`` in transport/shm.cc (NCCL's
documentation, docs/userguide/source/troubleshooting/runtime_and_mpi_issues.rst,
"Shared memory"; NCCL's source knows only 12.2 and 12.6). The node's own
facts (NVML's P2P status for every pair, and the kernel driver's version,
which CUDA forward compatibility does not raise as it raises the CUDA
driver version NVML and NCCL see) say where that happens, so the pack writes
NCCL_CUMEM_HOST_ENABLE=0 there and nowhere else.

A job's NCCL_CUMEM_ENABLE=0 does not change that: a framework can turn cuMem
back on inside the worker (NeMo-RL sets os.environ["NCCL_CUMEM_ENABLE"] = "1"
before init_process_group whenever generation is not colocated), and where
cuMem really stays off the 0 is inert, so the pack writes it there too.

It also owns NCCL_P2P_DISABLE, NCCL_P2P_LEVEL and NCCL_SHM_DISABLE, to keep
them as they are and warn where a job sends them (as SkyRL does from one
probe) to a node whose GPUs all have peer access: it works there, slower.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Optional

from ..names import (
    CUMEM_HOST_VARIABLE as HOST, CUMEM_VARIABLE as CUMEM, NCCL_HOST_MEM, PACK_FACT_KINDS,
    PACK_VARIABLES_OF, P2P_DISABLE_VARIABLE as P2P_DISABLE, P2P_LEVEL_VARIABLE as P2P_LEVEL,
    SHM_DISABLE_VARIABLE as SHM_DISABLE,
)
from ..node import NodeFacts, NodeP2P, format_driver, parse_kernel_driver
from .nccl_p2p import p2p_level_loc
from .nccl_params import (
    CONF_FILLS, CONF_SET, CONF_UNSEEN, NCCL_READ, cumem_off, nccl_param, worker_value,
)
from .pack import KEEP, LEAVE, NONE, Outcome, Pack, PackRow, PackVerdict, PREFERRED, REQUIRED, SET

if TYPE_CHECKING:  # pragma: no cover
    from ..spec import Spec

VARIABLES = PACK_VARIABLES_OF[NCCL_HOST_MEM]
FIXED_DRIVER = (13, 0)  # cuMem host memory works without P2P from here (NCCL's documentation)
# CUDA 13.0's minimum kernel driver (CUDA Toolkit 13.0 release notes, Table 3:
# CUDA 13.0 GA, Linux >= 580.65.06).
FIXED_KERNEL_DRIVER = (580, 65, 6)

_HOST_DEFAULT = ("src/misc/cudawrap.cc: CUMEM_HOST_ENABLE defaults to -1, and "
                 "ncclCuMemHostEnable() then turns it on where cudaDriverGetVersion >= 12060 "
                 "(12.6; off below 12.2)")
_SHM_PATH = ("src/transport/shm.cc: shmAllocateShareableBuffer/shmImportShareableBuffer take "
             "the cuMem path only if ncclCuMemEnable() && ncclCuMemHostEnable()")
_TROUBLE = ("NCCL's documentation, docs/userguide/source/troubleshooting/"
            "runtime_and_mpi_issues.rst ('cuMem host allocations may fail on systems without "
            "CUDA P2P connectivity if CUDA driver version prior to 13.0 is being used'; CUDA "
            "forward compatibility can keep NCCL from determining the driver version; 'use "
            "NCCL_CUMEM_HOST_ENABLE=0'), env.rst NCCL_CUMEM_HOST_ENABLE; CUDA Toolkit 13.0 "
            "release notes, Table 3 (CUDA 13.0 GA: kernel driver >= 580.65.06); NVML "
            "nvmlSystemGetCudaDriverVersion ('retrieved from the currently installed version "
            "of CUDA') against nvmlSystemGetDriverVersion (the system's driver)")
_REPORTS = ("NVIDIA/nccl#1838 (4xL4), NVIDIA-NeMo/RL#1683 (8xL4; NCCL_P2P_DISABLE=1 did not "
            "help), OpenRLHF#1064 (4xRTX 4090), ray-project/ray PR #64109 (Ray CI's T4 fleet)")
_CUMEM_OFF = ("src/misc/cudawrap.cc ncclCuMemEnable(): a value >= 0 is used as it is, and a "
              "negative one other than -2 (auto) is off")
_NEMO_RL = ("NVIDIA-NeMo/RL 7ea279ab nemo_rl/models/policy/workers/dtensor_policy_worker.py "
            "(os.environ['NCCL_CUMEM_ENABLE'] = '1' if not is_generation_colocated, before "
            "torch.distributed.init_process_group), models/megatron/setup.py and "
            "models/automodel/setup.py (the same)")

ROWS = (
    PackRow("no-p2p-old-driver",
            "two or more NVIDIA GPUs, some pair without peer access (NVML P2P read or write "
            "status not OK), a driver before CUDA 13.0 (the kernel driver below 580.65.06 "
            "where NVML reports it, whatever CUDA version forward compatibility shows; else "
            "NVML's CUDA driver version below 13.0, or not reported), and cuMem not switched "
            "off (NCCL_CUMEM_ENABLE not 0 or -1)",
            SET, ((HOST, "0"),), REQUIRED,
            "NCCL 2.24+ shares SHM buffers through cuMem host allocations by default and "
            "init fails with Cuda failure 217 ('peer access is not supported between these "
            "two devices') in transport/shm.cc; 0 takes NCCL's /dev/shm path, which needs no "
            "peer access (below driver 12.6 it is NCCL's own default anyway); a job's own "
            "NCCL_CUMEM_HOST_ENABLE=1 is kept with a warning",
            f"NCCL {_HOST_DEFAULT}; {_SHM_PATH}; {_TROUBLE}; {_REPORTS}; {NCCL_READ}",
            CONF_SET),
    PackRow("cumem-off",
            "as above, but the job (or the node) sets NCCL_CUMEM_ENABLE=0 or -1",
            SET, ((HOST, "0"),), PREFERRED,
            "the job's cuMem off is no guarantee: NeMo-RL sets NCCL_CUMEM_ENABLE=1 in its "
            "training workers' os.environ before init_process_group whenever generation is "
            "not colocated, whatever the job sent, and NCCL then fails as above; where cuMem "
            "does stay off, NCCL never takes the cuMem host path and the 0 is inert. A job's "
            "own NCCL_CUMEM_HOST_ENABLE=1 is kept with a warning",
            f"NCCL {_CUMEM_OFF}; {_SHM_PATH}; {_NEMO_RL}; {NCCL_READ}",
            CONF_SET),
    PackRow("p2p-transports-off-on-p2p-node",
            "two or more NVIDIA GPUs, every pair with peer access, and the job sets "
            "NCCL_P2P_DISABLE=1, NCCL_P2P_LEVEL=LOC (or an old-style level that reads as 0) "
            "while NCCL_P2P_DISABLE is not 1, or NCCL_SHM_DISABLE=1",
            KEEP, ((P2P_DISABLE, "1"), (P2P_LEVEL, "LOC"), (SHM_DISABLE, "1")), PREFERRED,
            "a value decided for another node (SkyRL's prepare_runtime_environment sends "
            "P2P_DISABLE and SHM_DISABLE to every node from one probe): it works here, but "
            "costs this node its direct GPU-to-GPU (P2P) or shared-memory transport, and a P2P "
            "level of 0 on a multi-node NVLink fabric also multi-node NVLink; kept as the "
            "job's own, with a warning",
            "NCCL docs/userguide/source/env.rst NCCL_P2P_DISABLE, NCCL_P2P_LEVEL, "
            "NCCL_SHM_DISABLE; src/graph/paths.cc ncclGetLevel (P2P_DISABLE == 1 gives "
            "PATH_LOC, 0; else P2P_LEVEL 'LOC', or a leading digit read with strtol through "
            "levelsOldToNew, whose [0] is PATH_LOC) and ncclTopoCheckP2p (P2P only where the "
            "path type <= that level; two GPUs' path is NVL or further), src/transport/shm.cc "
            f"(SHM_DISABLE == 1); src/init.cc (MNNVL check only where p2pLevel != 0); "
            f"{NCCL_READ}",
            CONF_UNSEEN),
    PackRow("leave-to-nccl",
            "anything else: one GPU, every pair with peer access, a kernel driver 580.65.06 "
            "or later (or, where it is unknown, a CUDA driver 13.0 or later), no NVIDIA GPU, "
            "peer access unreadable",
            LEAVE, ((HOST, ""), (P2P_DISABLE, ""), (P2P_LEVEL, ""), (SHM_DISABLE, "")), NONE,
            "NCCL's default works there (cuMem host memory with driver 13.0+, or between "
            "GPUs that have peer access)",
            f"NCCL {_HOST_DEFAULT}; {_TROUBLE}; {NCCL_READ}",
            CONF_FILLS),
)
_BY_ID = {row.id: row for row in ROWS}
# NCCL src/init.cc (2.27.3 and later): the MNNVL check runs only where the P2P
# level is not 0, and NCCL_P2P_DISABLE=1 makes it 0.
_MNNVL_TOO = (", and on a multi-node NVLink fabric (GB200/GB300) multi-node NVLink too (NCCL "
              "runs its MNNVL check only where the P2P level is not 0)")


def _outcome(variable: str, rule_id: str, value: Optional[str], reason: str) -> Outcome:
    row = _BY_ID[rule_id]
    return Outcome(variable, row.action, value, row.strength, row.id, reason)


def old_driver(p2p: NodeP2P) -> bool:
    """Whether the node's driver is before CUDA 13.0: the kernel driver's
    version where known (forward compatibility cannot raise it), else the
    CUDA driver version NVML reports (an unreported one counts as old)."""
    if p2p.kernel_driver is not None:
        return parse_kernel_driver(p2p.kernel_driver) < FIXED_KERNEL_DRIVER
    return p2p.cuda_driver is None or p2p.cuda_driver < FIXED_DRIVER


def _driver_words(p2p: NodeP2P) -> str:
    if p2p.kernel_driver is not None:
        shown = ("" if p2p.cuda_driver is None or p2p.cuda_driver < FIXED_DRIVER else
                 f" (CUDA {format_driver(p2p.cuda_driver)} reported: forward compatibility)")
        return f"kernel driver {p2p.kernel_driver} < 580.65.06, CUDA 13.0's minimum{shown}"
    return ("a CUDA driver NVML did not report" if p2p.cuda_driver is None
            else f"CUDA driver {format_driver(p2p.cuda_driver)} < 13.0")


def evaluate(spec: Spec, facts: NodeFacts, env_vars: Mapping[str, Any],
             node_environ: Mapping[str, str]) -> PackVerdict:
    """The pack's rows on one node: one outcome per variable, and warnings."""
    p2p: Optional[NodeP2P] = facts.p2p
    gpus = facts.gpus
    decided = {}
    warnings = []
    if gpus.is_known and not gpus.capabilities:
        where = gpus.describe()
    elif p2p is None or not p2p.is_known:
        error = "not probed" if p2p is None else p2p.error
        warnings.append(f"{NCCL_HOST_MEM}: the node's GPU peer access could not be read "
                        f"({error}); NCCL's defaults are left alone")
        where = f"peer access unknown ({error})"
    else:
        where = p2p.describe()
        if (p2p.count or 0) >= 2 and p2p.without and old_driver(p2p):
            cumem = worker_value(CUMEM, env_vars, node_environ)
            if cumem_off(cumem):
                decided[HOST] = _outcome(
                    HOST, "cumem-off", "0",
                    f"{where}: NCCL_CUMEM_ENABLE={cumem} keeps NCCL off the cuMem "
                    "host path only while nothing in the worker turns cuMem back on (NeMo-RL "
                    "sets it to 1 before init_process_group where generation is not "
                    "colocated); 0 is inert where it stays off [cumem-off]")
            else:
                decided[HOST] = _outcome(
                    HOST, "no-p2p-old-driver", "0",
                    f"{where}: NCCL's cuMem host allocations fail between GPUs without peer "
                    f"access on {_driver_words(p2p)} (Cuda failure 217 in transport/shm.cc) "
                    "[no-p2p-old-driver]")
        elif (p2p.count or 0) >= 2 and not p2p.without:
            level_off = p2p_level_loc(env_vars, node_environ)
            for variable in (P2P_DISABLE, P2P_LEVEL, SHM_DISABLE):
                value = worker_value(variable, env_vars, node_environ)
                if variable == SHM_DISABLE:
                    off = nccl_param(value, 0) == 1
                else:
                    off = level_off == variable
                if off:
                    decided[variable] = _outcome(
                        variable, "p2p-transports-off-on-p2p-node", str(value),
                        f"{where}: {variable}={value} is kept, but every GPU pair here has "
                        "peer access, so it costs this node its fast "
                        f"{'shared-memory' if variable == SHM_DISABLE else 'P2P'} transport"
                        f"{'' if variable == SHM_DISABLE else _MNNVL_TOO} "
                        "[p2p-transports-off-on-p2p-node]")
                    warnings.append(f"{NCCL_HOST_MEM} [p2p-transports-off-on-p2p-node]: "
                                    f"{decided[variable].reason}")
    outcomes = tuple(decided.get(v) or _outcome(v, "leave-to-nccl", None,
                                                 f"{where}: left to NCCL's default")
                     for v in VARIABLES)
    return PackVerdict(outcomes, tuple(warnings))


PACK = Pack(
    name=NCCL_HOST_MEM,
    summary=("NCCL's cuMem host allocations, which NCCL 2.24+ turns on by default and which "
             "fail NCCL init on nodes whose GPUs lack peer access (L4, L40S, T4, RTX "
             "4090/5090, PCIe servers with two root complexes) with a driver before CUDA "
             "13.0. The pack turns them off exactly there; everywhere else it leaves NCCL's "
             "default, which is right. Leave the pack out where every node's GPUs have "
             "peer access (NVLink/NVSwitch nodes) or every kernel driver is 580.65.06 or later."),
    variables=VARIABLES,
    node_facts=("the number of NVIDIA GPUs on the node and NVML's P2P read and write status "
                "(nvmlDeviceGetP2PStatus, NVML_P2P_CAPS_INDEX_READ and _WRITE: NCCL requires "
                "both) for every pair: no CUDA context",
                "the kernel driver's version (nvmlSystemGetDriverVersion), which decides where "
                "known; NVML's CUDA driver version (nvmlSystemGetCudaDriverVersion: the "
                "installed libcuda's, which CUDA forward compatibility raises) otherwise"),
    config_facts=("the job's own NCCL_CUMEM_ENABLE, NCCL_CUMEM_HOST_ENABLE, NCCL_P2P_DISABLE, "
                  "NCCL_P2P_LEVEL and NCCL_SHM_DISABLE (its env_vars, else the node's; never "
                  "NCCL's config files)",),
    rows=ROWS,
    evaluate=evaluate,
    fact_kinds=PACK_FACT_KINDS[NCCL_HOST_MEM],
    defaults=((HOST, "-1: on where the CUDA driver is 12.6 or later (src/misc/cudawrap.cc)"),
              (P2P_DISABLE, "unset: P2P used where the topology allows (src/graph/paths.cc)"),
              (P2P_LEVEL, "unset: P2P up to PXB paths (src/graph/paths.cc ncclTopoCheckP2p)"),
              (SHM_DISABLE, "0: SHM used between GPUs without P2P (src/transport/shm.cc)")),
)
