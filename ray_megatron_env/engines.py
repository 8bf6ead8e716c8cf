"""The vocabulary every reader, the spec and the packs share: engine kinds,
strategy names, the checks that assert on a value, Megatron-Core's names and
keys, CUDA's variable with its range, and the packs' names.

Imports nothing of the package (the packs' names and CUDA's variable live in
``names``). A name spelt here is spelt nowhere else (a reader that meets
Megatron-Core's dispatcher keys imports them from here).
"""

from __future__ import annotations

from typing import Dict

# CUDA's per-process hardware work-queue count (the ``cuda-connections`` pack),
# and the packs' names, handed on from their one home.

CUDA_DEFAULT = 8
CUDA_RANGE = range(1, 33)  # NVIDIA's documented range; CUDA clamps outside it

# Engine kinds: how an engine uses CUDA streams, which is all the rules need.
MEGATRON = "megatron"
FSDP = "fsdp"
INFERENCE = "inference"
ENGINE_KINDS = (MEGATRON, FSDP, INFERENCE)

# Strategy (or rollout engine) name -> kind. A name not listed here must be
# declared with its kind (docs/field.md), never guessed.
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
TRTLLM = "trtllm"

# The checks that assert on CUDA_DEVICE_MAX_CONNECTIONS, by the name an engine
# lists them under (``Engine.checks``): a framework that runs one makes the
# rows it asserts required for its engines. Megatron-LM's runs where the
# framework calls ``validate_args`` (slime does, in its job driver; verl,
# NeMo-RL and AReaL build Megatron-Core models without it); Megatron-Bridge's
# where the framework validates a Bridge ``ConfigContainer`` (NeMo-RL).
MEGATRON_LM_CHECK = "megatron-lm"
MEGATRON_BRIDGE_CHECK = "megatron-bridge"
CHECKS: Dict[str, str] = {
    MEGATRON_LM_CHECK: "Megatron-LM's argument check (validate_args) asserts it",
    MEGATRON_BRIDGE_CHECK: "Megatron-Bridge's config check (ConfigContainer.validate) asserts it",
}
# Checks that run wherever a Megatron engine runs, in every framework:
# Megatron-Core asserts them itself when it builds its groups. Never listed
# in an engine's ``checks``; a row they assert is required for every
# Megatron engine.
MEGATRON_CORE_CHECK = "megatron-core"
ALWAYS_RUN: Dict[str, str] = {
    MEGATRON_CORE_CHECK: "Megatron-Core's initialize_model_parallel asserts it (in every "
                         "framework)",
}
ASSERTS: Dict[str, str] = {**CHECKS, **ALWAYS_RUN}

# Megatron-Core's token dispatchers (transformer_config.py
# moe_token_dispatcher_type) and the flex dispatcher's backends
# (moe_flex_dispatcher_backend). DeepEP and HybridEP run communication
# streams of their own; ncclep asks nothing.
DISPATCHER_TYPES = ("allgather", "alltoall", "flex")
FLEX_BACKENDS = ("deepep", "hybridep")
MEGATRON_FLEX_BACKENDS = (*FLEX_BACKENDS, "ncclep")
# Megatron-Core's pipeline-parallel communication backends
# (model_parallel_config.py pipeline_model_parallel_comm_backend).
PIPELINE_BACKENDS = ("nccl", "ucc")

# Megatron-Core's own key names (TransformerConfig / ModelParallelConfig),
# as verl's override_transformer_config, NeMo-RL's model_overrides and
# slime's arguments spell them.
DISPATCHER_TYPE_KEY = "moe_token_dispatcher_type"
FLEX_BACKEND_KEY = "moe_flex_dispatcher_backend"
ENABLE_DEEPEP_KEY = "moe_enable_deepep"  # deprecated: means the deepep backend
DISPATCHER_KEYS = (DISPATCHER_TYPE_KEY, FLEX_BACKEND_KEY, ENABLE_DEEPEP_KEY)
PIPELINE_BACKEND_KEY = "pipeline_model_parallel_comm_backend"
MOE_OVERLAP_KEY = "overlap_moe_expert_parallel_comm"
# Megatron-Core's parallel sizes the rules read, each with the Engine field
# it fills (TransformerConfig / ModelParallelConfig names, which NeMo-RL,
# ROLL, SkyRL, slime and miles pass through as they are).
SIZE_KEYS = (("tensor_parallel", "tensor_model_parallel_size"),
             ("context_parallel", "context_parallel_size"),
             ("expert_parallel", "expert_model_parallel_size"))

