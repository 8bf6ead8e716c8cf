"""The registry: which reader a config is for, and the errors when none or
several are, or a key is misspelt."""

import argparse

import pytest

from ray_megatron_env.errors import FieldValueError
from ray_megatron_env.field import parse_field
from ray_megatron_env.frameworks import readers, to_mapping

READER_NAMES = ("verl", "verl-sft", "areal", "nemo-rl", "slime")


def test_every_framework_has_a_reader():
    assert sorted(r.name for r in readers()) == sorted(READER_NAMES)


def test_an_unknown_layout_lists_what_each_reader_looked_for():
    with pytest.raises(FieldValueError) as info:
        parse_field({"trainer": {"nnodes": 1}, "model": {"path": "x"}})
    message = str(info.value)
    for name in READER_NAMES:
        assert f"{name}: one of " in message
    for marker in ("actor_rollout_ref", "engine._target_", "actor.backend",
                   "policy.megatron_cfg", "rollout_num_gpus_per_engine"):
        assert marker in message
    assert "top-level keys: model, trainer" in message


def test_a_config_that_looks_like_two_frameworks_names_both_and_the_deciding_keys():
    with pytest.raises(FieldValueError) as info:
        parse_field({"actor_rollout_ref": {}, "policy": {"megatron_cfg": {"enabled": True}}})
    message = str(info.value)
    assert "more than one framework's layout" in message
    assert "verl (it has actor_rollout_ref)" in message
    assert "nemo-rl (it has policy.megatron_cfg)" in message


@pytest.mark.parametrize("config,hint", [
    ({"actor_rollout_reff": {"actor": {"strategy": "fsdp"}}},
     "'actor_rollout_reff' looks like verl's 'actor_rollout_ref'"),
    ({"polcy": {"megatron_cfg": {"enabled": True}}}, "'polcy' looks like nemo-rl's 'policy'"),
])
def test_a_misspelt_key_is_pointed_out(config, hint):
    with pytest.raises(FieldValueError, match="Misspelt") as info:
        parse_field(config)
    assert hint in str(info.value)


def test_a_namespace_keeps_only_what_readers_read():
    namespace = argparse.Namespace(actor_num_nodes=1, params_dtype=object(), unrelated="x")
    assert to_mapping(namespace) == {"actor_num_nodes": 1}


def test_a_list_that_is_no_frameworks_arguments_is_refused():
    with pytest.raises(FieldValueError, match="read only as a framework's command-line"):
        to_mapping(["--not-a-known-flag", "3"])
