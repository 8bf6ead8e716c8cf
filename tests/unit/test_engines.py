"""engines.py, the vocabulary the readers, the spec and the packs share:
CUDA's variable's range, the engine kinds of every known strategy name, the
checks that assert, and Megatron-Core's own names. Each expected value is
the upstream source's, written out here."""

import ast
from pathlib import Path

from ray_megatron_env import engines


def test_it_imports_nothing_of_the_package_but_names():
    tree = ast.parse(Path(engines.__file__).read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                 for alias in node.names}
    assert imported <= {"__future__", "typing", "names"}


def test_cudas_range_and_default():
    # CUDA Programming Guide, environment variables: CUDA_DEVICE_MAX_CONNECTIONS,
    # 1 to 32, default 8.
    assert list(engines.CUDA_RANGE) == list(range(1, 33))
    assert engines.CUDA_DEFAULT == 8


# docs/rules.md#the-table, "strategy / engine name": every known name and its kind.
STRATEGIES = {
    "megatron": "megatron", "mlite": "megatron",
    "fsdp": "fsdp", "fsdp2": "fsdp", "fsdp_turbo": "fsdp", "veomni": "fsdp",
    "torchtitan": "fsdp", "automodel": "fsdp",
    "vllm": "inference", "sglang": "inference", "trtllm": "inference", "dynamo": "inference",
    "hf": "inference",
}


def test_every_known_strategy_has_its_kind():
    assert engines.KNOWN_STRATEGIES == STRATEGIES
    assert engines.ENGINE_KINDS == ("megatron", "fsdp", "inference")
    assert engines.TRTLLM in engines.KNOWN_STRATEGIES


def test_the_checks_an_engine_lists_and_those_that_always_run_are_apart():
    assert set(engines.CHECKS) == {"megatron-lm", "megatron-bridge"}
    assert set(engines.ALWAYS_RUN) == {"megatron-core"}
    assert engines.ASSERTS == {**engines.CHECKS, **engines.ALWAYS_RUN}
    assert len(engines.ASSERTS) == len(engines.CHECKS) + len(engines.ALWAYS_RUN)


def test_megatron_cores_names_are_its_own():
    # megatron/core/transformer/transformer_config.py (TransformerConfig) and
    # model_parallel_config.py (ModelParallelConfig), their field names and Literals.
    assert engines.DISPATCHER_TYPE_KEY == "moe_token_dispatcher_type"
    assert engines.DISPATCHER_TYPES == ("allgather", "alltoall", "flex")
    assert engines.FLEX_BACKEND_KEY == "moe_flex_dispatcher_backend"
    assert engines.FLEX_BACKENDS == ("deepep", "hybridep")
    assert set(engines.FLEX_BACKENDS) < set(engines.MEGATRON_FLEX_BACKENDS)
    assert engines.ENABLE_DEEPEP_KEY == "moe_enable_deepep"
    assert engines.DISPATCHER_KEYS == ("moe_token_dispatcher_type", "moe_flex_dispatcher_backend",
                                       "moe_enable_deepep")
    assert engines.PIPELINE_BACKEND_KEY == "pipeline_model_parallel_comm_backend"
    assert engines.PIPELINE_BACKENDS == ("nccl", "ucc")
    assert engines.MOE_OVERLAP_KEY == "overlap_moe_expert_parallel_comm"
