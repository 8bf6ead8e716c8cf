"""megatron_core.py: Megatron-Core's MoE dispatcher, pipeline backend and MoE
overlap settings as frameworks pass them. Expected values follow
Megatron-Core's transformer_config.py (moe_token_dispatcher_type 'flex' runs
the flex dispatcher, whose moe_flex_dispatcher_backend defaults to deepep;
the deprecated moe_enable_deepep means deepep) and model_parallel_config.py
(pipeline_model_parallel_comm_backend: nccl by default, or ucc)."""

import pytest

from ray_megatron_env.errors import FieldTypeError, FieldValueError
from ray_megatron_env.megatron_core import (
    read_config_keys, read_dispatcher, read_pipeline_backend,
)

KEYS = ("m.moe_token_dispatcher_type", "m.moe_flex_dispatcher_backend", "m.moe_enable_deepep")


@pytest.mark.parametrize("kind,backend,deepep,expected", [
    (None, None, None, None),            # nothing set: the default dispatcher
    ("alltoall", "deepep", None, None),  # a backend without flex is not used
    ("flex", None, None, "deepep"),      # flex's default backend
    ("flex", "hybridep", None, "hybridep"),
    ("flex", "hybridep", True, "deepep"),  # the deprecated switch means deepep
    ("allgather", None, True, None),
])
def test_the_dispatcher_is_read_as_megatron_core_reads_it(kind, backend, deepep, expected):
    assert read_dispatcher(kind, backend, deepep, KEYS) == expected


def test_an_unknown_dispatcher_type_names_its_key():
    with pytest.raises(FieldValueError, match="m.moe_token_dispatcher_type is 'flexible'"):
        read_dispatcher("flexible", None, None, KEYS)


def test_the_pipeline_backend():
    assert read_pipeline_backend(None, "k") is None
    assert read_pipeline_backend("ucc", "k") == "ucc"
    with pytest.raises(FieldValueError, match="k is 'gloo'"):
        read_pipeline_backend("gloo", "k")


def test_config_keys_give_only_the_settings_present():
    assert read_config_keys({}, "x") == {}
    assert read_config_keys({"overlap_moe_expert_parallel_comm": True,
                             "pipeline_model_parallel_comm_backend": "ucc",
                             "hidden_size": 4096}, "x") == {
        "moe_overlap": True, "pipeline_backend": "ucc"}
    with pytest.raises(FieldTypeError, match="x.overlap_moe_expert_parallel_comm"):
        read_config_keys({"overlap_moe_expert_parallel_comm": "yes"}, "x")
