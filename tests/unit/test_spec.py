"""spec.py: a job's spec in the compact form: serialised (``to_field``, defaults
left out), round trips, the field's limits, narrowed to roles, process rules.
Reading the compact form's keys: tests/unit/frameworks/test_compact.py."""

import json

import pytest

from ray_megatron_env.errors import FieldTypeError, FieldValueError
from ray_megatron_env.frameworks import MAX_FIELD_BYTES, parse_field

COMPACT = {
    "version": 1,
    "engines": {
        "policy": {"strategy": "megatron", "tensor_parallel": 4, "context_parallel": 2,
                   "moe_overlap": True},
        "value": {"strategy": "my_fsdp", "kind": "fsdp"},
        "generator": {"strategy": "sglang"},
    },
}


def test_compact_form_round_trips_exactly():
    spec = parse_field(COMPACT)
    assert parse_field(json.loads(json.dumps(spec.to_field()))) == spec
    assert spec.to_field()["engines"]["value"] == {"strategy": "my_fsdp", "kind": "fsdp"}


def test_defaults_are_left_out_and_non_megatron_settings_dropped():
    spec = parse_field({"engines": {"a": {"strategy": "megatron", "tensor_parallel": 1},
                                    "b": {"strategy": "fsdp", "tensor_parallel": 8}}})
    assert spec.to_field() == {"version": 2, "engines": {"a": {"strategy": "megatron"},
                                                         "b": {"strategy": "fsdp"}}}


@pytest.mark.parametrize("value,error,words", [
    ("megatron", FieldTypeError, ["the field must be a mapping"]),
    ([{"engines": {}}], FieldTypeError, ["mapping"]),
    ({"trainer": {"nnodes": 1}}, FieldValueError, ["neither", "trainer"]),
    ({"engines": {}, "x": {1, 2}}, FieldTypeError, ["JSON"]),
    ({"engines": {}, "x": float("nan")}, FieldValueError, ["JSON"]),
    ({"critic": {"strategy": "fsdp", "pad": "x" * MAX_FIELD_BYTES}}, FieldValueError, ["limit"]),
])
def test_bad_field_values(value, error, words):
    with pytest.raises(error) as info:
        parse_field(value)
    for word in words:
        assert word in str(info.value)


def test_deeply_nested_value_is_a_clear_error_not_a_crash():
    deep = {}
    node = deep
    for _ in range(100_000):
        node["x"] = {}
        node = node["x"]
    with pytest.raises(FieldValueError, match="nested more than 32 levels"):
        parse_field({"critic": {"strategy": "fsdp"}, "deep": deep})


def test_narrow_keeps_only_the_roles_asked_for():
    spec = parse_field(COMPACT)
    assert spec.narrow("value").roles() == ("value",)
    assert spec.narrow(["policy", "generator"]).roles() == ("generator", "policy")
    assert spec.narrow(None) is spec
    with pytest.raises(FieldValueError, match="unknown role 'critic'"):
        spec.narrow("critic")
    with pytest.raises(FieldValueError, match="at least one"):
        spec.narrow([])


def test_an_exact_process_rule_matches_the_whole_value_and_round_trips():
    field = {"engines": {"a": {"strategy": "megatron"}, "b": {"strategy": "vllm"}},
             "processes": [{"roles": ["a"], "variable": "CLUSTER_NAME", "prefix": "reward-math",
                            "exact": True},
                           {"roles": ["b"], "variable": "CLUSTER_NAME", "prefix": "reward-m"}],
             "others": []}
    spec = parse_field(field)
    assert parse_field(json.loads(json.dumps(spec.to_field()))) == spec
    assert spec.to_field()["processes"][0]["exact"] is True
    assert "exact" not in spec.to_field()["processes"][1]
    assert spec.for_process({"CLUSTER_NAME": "reward-math"})[0].roles() == ("a",)
    assert spec.for_process({"CLUSTER_NAME": "reward-math_rule"})[0].roles() == ("b",)
    field["processes"][0]["exact"] = "yes"
    with pytest.raises(FieldTypeError, match=r"processes\[0\]\.exact"):
        parse_field(field)
