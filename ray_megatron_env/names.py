"""Every name this package shares with the world, defined once: its own
environment variables, Ray's that it reads or writes, the module paths Ray
is given, the runtime-env field, the packs with their variables and the
kinds of node fact they read.

Imports nothing, so any module loads it for free: the plugin module in a
node's agent, and the setup hook in every worker, before the core.
"""

# --- this package's environment variables ---------------------------------------------

# The record of a worker's decision (docs/record.md), written by either path.
DECISION_VARIABLE = "RAY_MEGATRON_ENV_DECISION"
# The field for one worker, in its env_vars: a per-role env replaces the
# job's here (Ray merges env_vars key by key), so the setup hook sees the
# field of the worker's own runtime env.
FIELD_VARIABLE = "RAY_MEGATRON_ENV_FIELD"
# Beside each pack variable an env from this package sets: a runtime env
# gave it (setup_hook.mark_given).
GIVEN_PREFIX = "RAY_MEGATRON_ENV_GIVEN_"
# Setup hooks the job had besides ours, run after ours, in order
# ('module.function', comma-separated).
NEXT_SETUP_HOOK_VARIABLE = "RAY_MEGATRON_ENV_NEXT_SETUP_HOOK"
# The driver hook that runs after this package's ('module.function').
NEXT_DRIVER_HOOK_VARIABLE = "RAY_MEGATRON_ENV_NEXT_HOOK"
# Set in every worker for the drivers it starts: their environment is this
# worker's, never a copy of a driver host's, so the driver hook lists none.
NESTED_VARIABLE = "RAY_MEGATRON_ENV_NESTED_DRIVER"
# The driver hook runs Ray's uv hook in its place (uv_hook.py).
UV_HOOK_VARIABLE = "RAY_MEGATRON_ENV_UV_HOOK"
# The driver hook's switch for take-over (build_runtime_env(take_over=True)).
TAKE_OVER_VARIABLE = "RAY_MEGATRON_ENV_TAKE_OVER"
# The driver's list of variables whose copied value stays the job's explicit
# one (docs/field.md#the-drivers-environment-in-env_vars); "*" for all.
EXPLICIT_VARIABLE = "RAY_MEGATRON_ENV_EXPLICIT"
# How a submitted env wants its merge with the driver's ray.init env.
MERGE_VARIABLE = "RAY_MEGATRON_ENV_MERGE"
# The probe: a fake GPU list, a fake node, the source, the device root.
FAKE_GPUS_VARIABLE = "RAY_MEGATRON_ENV_FAKE_GPUS"
FAKE_NODE_VARIABLE = "RAY_MEGATRON_ENV_FAKE_NODE"
PROBE_METHOD_VARIABLE = "RAY_MEGATRON_ENV_PROBE"  # auto (default) | nvml | nvidia-smi
DEVICE_ROOT_VARIABLE = "RAY_MEGATRON_ENV_DEVICE_ROOT"
OWN_PREFIX = "RAY_MEGATRON_ENV_"

# --- what Ray is given -----------------------------------------------------------------

FIELD = "megatron_env"  # the runtime_env field
PLUGIN_CLASS_PATH = "ray_megatron_env.plugin.MegatronEnvPlugin"
SETUP_HOOK_PATH = "ray_megatron_env.setup_hook.setup_hook"
DRIVER_HOOK_PATH = "ray_megatron_env.hook.runtime_env_hook"

# --- Ray's environment variables and fields (the same names from 2.41 to 2.60) ----------

PLUGINS_VARIABLE = "RAY_RUNTIME_ENV_PLUGINS"  # read by each node's agent
DRIVER_HOOK_VARIABLE = "RAY_RUNTIME_ENV_HOOK"  # ray_constants.RAY_RUNTIME_ENV_HOOK
# ray_constants.WORKER_PROCESS_SETUP_HOOK_ENV_VAR: Ray's own carrier of a
# setup hook to a worker; set directly, it runs the hook in workers of an
# actor-level env too.
RAY_SETUP_HOOK_VARIABLE = "__RAY_WORKER_PROCESS_SETUP_HOOK_ENV_VAR"
SETUP_HOOK_FIELD = "worker_process_setup_hook"  # honoured in the job's env only
# What Ray writes into its setup-hook variable for a callable hook
# (setup_hook.RUNTIME_ENV_FUNC_IDENTIFIER): a key into one job's exports.
EXPORTED_FUNCTION = "ray_runtime_env_func::"
UV_SWITCH_VARIABLE = "RAY_ENABLE_UV_RUN_RUNTIME_ENV"  # ray_constants, from 2.47
# Ray's switch that lets ray.init's env win a conflict with a submitted
# job's (read as a literal in ray/_private/worker.py), and the variable in
# which the job supervisor hands a submitted job's env to its driver
# (ray._private.runtime_env.constants).
OVERRIDE_VARIABLE = "RAY_OVERRIDE_JOB_RUNTIME_ENV"
JOB_CONFIG_VARIABLE = "RAY_JOB_CONFIG_JSON_ENV_VAR"

# --- the packs, their variables and the node facts they read -------------------------

CUDA_CONNECTIONS = "cuda-connections"
NCCL_FABRIC = "nccl-fabric"
NCCL_HOST_MEM = "nccl-host-mem"
TORCH_ARCH = "torch-arch"
TE_FP8_SCALES = "te-fp8-scales"
FLA_BACKEND = "fla-backend"
NET_IFACES = "net-ifaces"
PACK_NAMES = (CUDA_CONNECTIONS, NCCL_FABRIC, NCCL_HOST_MEM, TORCH_ARCH, TE_FP8_SCALES, FLA_BACKEND,
              NET_IFACES)
ALWAYS_ON = (CUDA_CONNECTIONS,)
OPTIONAL_PACKS = tuple(name for name in PACK_NAMES if name not in ALWAYS_ON)

CONNECTIONS_VARIABLE = "CUDA_DEVICE_MAX_CONNECTIONS"
CUMEM_VARIABLE = "NCCL_CUMEM_ENABLE"
MNNVL_VARIABLE = "NCCL_MNNVL_ENABLE"
NVLS_VARIABLE = "NCCL_NVLS_ENABLE"
CUMEM_HOST_VARIABLE = "NCCL_CUMEM_HOST_ENABLE"
P2P_DISABLE_VARIABLE = "NCCL_P2P_DISABLE"
P2P_LEVEL_VARIABLE = "NCCL_P2P_LEVEL"
SHM_DISABLE_VARIABLE = "NCCL_SHM_DISABLE"
ARCH_LIST_VARIABLE = "TORCH_CUDA_ARCH_LIST"
FP8_SCALES_VARIABLE = "NVTE_FP8_BLOCK_SCALING_FP32_SCALES"
TILELANG_VARIABLE = "FLA_TILELANG"
GLOO_IFNAME_VARIABLE = "GLOO_SOCKET_IFNAME"
NCCL_IFNAME_VARIABLE = "NCCL_SOCKET_IFNAME"
TP_IFNAME_VARIABLE = "TP_SOCKET_IFNAME"
HCCL_IFNAME_VARIABLE = "HCCL_SOCKET_IFNAME"
IB_HCA_VARIABLE = "NCCL_IB_HCA"
GID_INDEX_VARIABLE = "NCCL_IB_GID_INDEX"
SOCKET_IFNAME_VARIABLES = (GLOO_IFNAME_VARIABLE, NCCL_IFNAME_VARIABLE, TP_IFNAME_VARIABLE,
                           HCCL_IFNAME_VARIABLE)

# Each pack's variables, in the order it decides them.
PACK_VARIABLES_OF = {
    CUDA_CONNECTIONS: (CONNECTIONS_VARIABLE,),
    NCCL_FABRIC: (MNNVL_VARIABLE, NVLS_VARIABLE, CUMEM_VARIABLE),
    NCCL_HOST_MEM: (CUMEM_HOST_VARIABLE, P2P_DISABLE_VARIABLE, P2P_LEVEL_VARIABLE,
                    SHM_DISABLE_VARIABLE),
    TORCH_ARCH: (ARCH_LIST_VARIABLE,),
    TE_FP8_SCALES: (FP8_SCALES_VARIABLE,),
    FLA_BACKEND: (TILELANG_VARIABLE,),
    NET_IFACES: (*SOCKET_IFNAME_VARIABLES, IB_HCA_VARIABLE, GID_INDEX_VARIABLE),
}
# Variables their libraries read as text (flags compared as strings,
# interface and device names), never as NCCL integer parameters.
TEXT_VARIABLES = frozenset({FP8_SCALES_VARIABLE, TILELANG_VARIABLE, P2P_LEVEL_VARIABLE,
                            *SOCKET_IFNAME_VARIABLES, IB_HCA_VARIABLE})
# Every variable a pack reads from a worker's or a node's environment; with
# the field and its process variables, all that a decision reads besides the
# node's facts.
PACK_VARIABLES = tuple(dict.fromkeys(v for name in PACK_NAMES for v in PACK_VARIABLES_OF[name]))

# The kinds of node fact: the GPUs, read for every job, and those only some
# packs read.
GPUS, FABRIC, P2P, NET = "gpus", "fabric", "p2p", "net"
FACT_KINDS = (FABRIC, P2P, NET)
PACK_FACT_KINDS = {CUDA_CONNECTIONS: (), NCCL_FABRIC: (FABRIC,), NCCL_HOST_MEM: (P2P,),
                   TORCH_ARCH: (), TE_FP8_SCALES: (), FLA_BACKEND: (), NET_IFACES: (NET,)}
