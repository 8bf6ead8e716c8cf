"""frameworks/compact.py: reading the compact form by hand (docs/field.md):
any role names, the version, each engine's keys and values, the MoE
dispatcher and pipeline backend keys, ``driver_env`` and ``framework_env``.
Serialising a spec and its round trips: tests/unit/test_spec.py.
"""

import dataclasses

import pytest

from paths import FIXTURES
from ray_megatron_env import build_runtime_env
from ray_megatron_env.engines import FSDP, INFERENCE, MEGATRON
from ray_megatron_env.errors import FieldTypeError, FieldValueError
from ray_megatron_env.frameworks import parse_field
from ray_megatron_env.frameworks.compact import is_compact, read_driver_env
from ray_megatron_env.frameworks.loading import load_spec
from ray_megatron_env.spec import Engine, Spec

COMPACT = {
    "version": 1,
    "engines": {
        "policy": {"strategy": "megatron", "tensor_parallel": 4, "context_parallel": 2,
                   "moe_overlap": True},
        "value": {"strategy": "my_fsdp", "kind": "fsdp"},
        "generator": {"strategy": "sglang"},
    },
}
TILELANG = "FLA_TILELANG"
MEGATRON_TP2 = {"engines": {"actor": {"strategy": "megatron", "tensor_parallel": 2}}}
SKYRL_QWEN35 = str(FIXTURES / "skyrl" / "run_megatron_qwen3.5.txt")


# --- the form and its version ----------------------------------------------------------

@pytest.mark.parametrize("value,compact", [
    ({"engines": {}}, True), ({"version": 2}, True),
    ({"actor_rollout_ref": {}}, False), ({}, False),
])
def test_the_compact_form_is_a_mapping_with_engines_or_a_version(value, compact):
    assert is_compact(value) is compact


def test_compact_form_parses_with_any_role_names():
    engines = dict(parse_field(COMPACT).engines)
    assert engines["policy"] == Engine("megatron", MEGATRON, 4, 2, moe_overlap=True)
    assert engines["value"].kind == FSDP and engines["value"].declared
    assert engines["generator"].kind == INFERENCE


def test_version_is_optional_but_a_newer_one_is_refused_with_advice():
    assert parse_field({"engines": {}}) == Spec()
    assert parse_field({"version": 1, "engines": {}}) == Spec()
    with pytest.raises(FieldValueError, match="version 3 is not supported.*same ray-megatron-env"):
        parse_field({"version": 3, "engines": {}})
    with pytest.raises(FieldValueError, match="'omitted'.*version 1"):
        parse_field({"version": 1, "engines": {}, "omitted": {"critic": "not created"}})


@pytest.mark.parametrize("value,error,words", [
    ({"engines": {"a": {"strategy": "megatron", "env_vars": {"LD_PRELOAD": "x"}}}},
     FieldValueError, ["'env_vars'", "engines.a"]),
    ({"engines": {}, "LD_PRELOAD": "/tmp/x.so"}, FieldValueError, ["'LD_PRELOAD'"]),
    ({"engines": {"a": {"strategy": "mystery"}}}, FieldValueError, ["'mystery'", "kind"]),
    ({"engines": {"a": {"strategy": "mystery", "kind": "gpu"}}}, FieldValueError, ["'gpu'"]),
    ({"engines": {"a": {"strategy": "megatron", "kind": "fsdp"}}}, FieldValueError, ["declared"]),
    ({"engines": {"a": {}}}, FieldValueError, ["engines.a.strategy is missing"]),
    ({"engines": {"a": "megatron"}}, FieldTypeError, ["engines.a"]),
    ({"engines": ["megatron"]}, FieldTypeError, ["engines"]),
    ({"engines": {"$HOME": {"strategy": "fsdp"}}}, FieldValueError, ["not a valid name"]),
    ({"engines": {"a": {"strategy": "megatron", "tensor_parallel": "2"}}}, FieldTypeError,
     ["engines.a.tensor_parallel"]),
    ({"engines": {"a": {"strategy": "megatron", "megatron_fsdp": 1}}}, FieldTypeError,
     ["engines.a.megatron_fsdp", "true or false"]),
    ({"version": "1", "engines": {}}, FieldTypeError, ["version"]),
    ({"engines": {f"r{i}": {"strategy": "fsdp"} for i in range(65)}}, FieldValueError, ["at most 64"]),
])
def test_bad_compact_values(value, error, words):
    with pytest.raises(error) as info:
        parse_field(value)
    for word in words:
        assert word in str(info.value)


# --- the dispatcher and the pipeline backend -----------------------------------------

def test_compact_keys_round_trip_and_defaults_drop_out():
    engine = {"strategy": "megatron", "dispatcher": "hybridep", "pipeline_backend": "ucc"}
    spec = parse_field({"engines": {"actor": engine}})
    assert spec.to_field()["engines"]["actor"] == engine
    assert parse_field(spec.to_field()) == spec
    nccl = parse_field({"engines": {"actor": {"strategy": "megatron",
                                              "pipeline_backend": "nccl"}}})
    assert nccl.to_field()["engines"]["actor"] == {"strategy": "megatron"}
    # A non-Megatron engine has neither.
    assert Engine("fsdp", "fsdp", dispatcher="deepep").to_field() == {"strategy": "fsdp"}


@pytest.mark.parametrize("key, value, words", [
    ("dispatcher", "alltoall", "leave it out for the all-to-all"),
    ("dispatcher", 3, "must be a string"),
    ("pipeline_backend", "gloo", "nccl, ucc"),
])
def test_compact_keys_refuse_bad_values_naming_the_key(key, value, words):
    with pytest.raises(Exception, match=words) as caught:
        parse_field({"engines": {"actor": {"strategy": "megatron", key: value}}})
    assert f"engines.actor.{key}" in str(caught.value)


# --- driver_env and framework_env -----------------------------------------------------

def test_the_field_carries_framework_env_and_reads_it_back():
    field = build_runtime_env(SKYRL_QWEN35, packs=["fla-backend"])["megatron_env"]
    assert field["framework_env"] == {TILELANG: "1"}
    assert parse_field(field).framework_env == ((TILELANG, "1"),)
    assert parse_field(field) == dataclasses.replace(load_spec(SKYRL_QWEN35)[0],
                                                     packs=("fla-backend",))


@pytest.mark.parametrize("raw,message", [
    ({"FLA_TILELANG": 1}, "framework_env.FLA_TILELANG must be a string"),
    (["FLA_TILELANG"], "framework_env must be a mapping of variable -> the framework's own"),
    ({"NOT_A_PACK_VARIABLE": "1"}, "framework_env names 'NOT_A_PACK_VARIABLE', which no pack "
                                   "decides"),
])
def test_framework_env_is_checked(raw, message):
    with pytest.raises((FieldValueError, TypeError), match=message):
        parse_field({**MEGATRON_TP2, "framework_env": raw})


def test_driver_env_is_read_sorted_and_absent_is_empty():
    assert read_driver_env(None, ()) == ()
    assert read_driver_env({"B": "2", "A": "1"}, ()) == (("A", "1"), ("B", "2"))
    assert read_driver_env({"V": "x" * 4096}, ()) == (("V", "x" * 4096),)  # at most 4096


@pytest.mark.parametrize("value", ["$HOME", "x" * 4097, 1, None])
def test_a_driver_value_ray_would_expand_or_that_is_no_short_string_is_refused(value):
    # Ray expands $VAR in env_vars values when it starts a worker.
    with pytest.raises(FieldTypeError, match="driver_env.CUDA_DEVICE_MAX_CONNECTIONS"):
        read_driver_env({"CUDA_DEVICE_MAX_CONNECTIONS": value}, ())
