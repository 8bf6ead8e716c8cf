"""The driver helper: configs in, a small validated runtime env out."""

import copy
import json

import pytest
from omegaconf import OmegaConf

from configs import ACTOR, ACTOR_TP, FSDP_YAML, MEGATRON_YAML, job_env, plain, verl
from ray_megatron_env import build_runtime_env
from ray_megatron_env.errors import FieldTypeError, FieldValueError

EXPECTED = {"version": 2, "framework": "verl", "engines": {
    "actor": {"strategy": "megatron", "tensor_parallel": 2},
    "critic": {"strategy": "megatron"},
    "ref": {"strategy": "megatron", "tensor_parallel": 2},
    "rollout": {"strategy": "vllm"},
}, "processes": [
    # verl/workers/rollout/replica.py names; verl's server actors' env_vars
    {"roles": ["rollout"], "variable": "WG_PREFIX", "prefix": "rollout_standalone_"},
    {"roles": ["rollout"], "variable": "WG_PREFIX", "prefix": "rollout_colocate_"},
    {"roles": ["rollout"], "variable": "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES",
     "prefix": "1"},
], "others": ["actor", "ref", "critic"]}


@pytest.mark.parametrize("config", [verl(), plain(), str(MEGATRON_YAML), MEGATRON_YAML])
def test_every_config_form_gives_the_same_compact_field(config):
    assert build_runtime_env(config) == job_env(EXPECTED)


def test_the_field_carries_only_what_the_policy_reads():
    # ~28 KB of other settings, as in verl's full configs, add nothing.
    padded = verl(*(f"trainer.extra.k{i}={'x' * 100}" for i in range(280)))
    assert len(json.dumps(OmegaConf.to_container(padded))) > 28_000
    assert build_runtime_env(padded)["megatron_env"] == EXPECTED


def test_the_field_stays_under_2_kb_even_with_every_role_and_flag_set():
    settings = []
    for section in (ACTOR, "actor_rollout_ref.ref", "critic", "reward_model"):
        settings += [f"{section}.enable=true", f"{section}.strategy=megatron",
                     f"{section}.megatron.tensor_model_parallel_size=65536",
                     f"{section}.megatron.context_parallel_size=65536",
                     f"{section}.megatron.use_megatron_fsdp=true",
                     f"{section}.megatron.override_transformer_config."
                     "overlap_moe_expert_parallel_comm=true"]
    field = build_runtime_env(verl(*settings))["megatron_env"]
    assert len(field["engines"]) == 5
    assert len(json.dumps(field)) <= 2048


def test_base_is_merged_and_left_untouched():
    base = {"env_vars": {"NCCL_DEBUG": "WARN"}, "working_dir": ".", "megatron_env": {"old": 1}}
    before = copy.deepcopy(base)
    env = build_runtime_env(verl(), base=base)
    assert base == before
    assert env == job_env(EXPECTED, {"NCCL_DEBUG": "WARN"}, working_dir=".")
    env["env_vars"]["X"] = "1"
    assert "X" not in base["env_vars"]


def test_base_may_ship_this_package_as_a_module():
    # The README's line for nodes without the package: Ray uploads a module
    # object in py_modules from the driver; it cannot be copied, so it is kept.
    import ray_megatron_env

    base = {"py_modules": [ray_megatron_env, "other/dir"], "env_vars": {"A": "1"}}
    env = build_runtime_env(verl(), base=base)
    assert env["py_modules"][0] is ray_megatron_env and env["py_modules"][1] == "other/dir"
    env["py_modules"].append("x")
    assert base["py_modules"] == [ray_megatron_env, "other/dir"]


def test_base_may_be_a_dictconfig():
    base = OmegaConf.create({"env_vars": {"A": "${oc.select:missing,fallback}"}})
    assert build_runtime_env(verl(), base=base)["env_vars"]["A"] == "fallback"


@pytest.mark.parametrize("role,roles", [
    ("actor", ["actor"]), ("ref", ["ref"]), ("critic", ["critic"]), ("rollout", ["rollout"]),
    (("actor", "rollout", "ref"), ["actor", "ref", "rollout"]),
])
def test_role_narrows_to_those_engines(role, roles):
    assert sorted(build_runtime_env(verl(), role=role)["megatron_env"]["engines"]) == roles


def test_reward_model_role():
    env = build_runtime_env(verl("reward_model.enable=true", "reward_model.strategy=fsdp"),
                            role="reward_model")
    assert env["megatron_env"]["engines"] == {"reward_model": {"strategy": "fsdp"}}


def test_a_known_role_without_an_engine_and_an_unknown_role_are_errors():
    with pytest.raises(FieldValueError, match="role 'reward_model' has no engine"):
        build_runtime_env(verl(), role="reward_model")
    with pytest.raises(FieldValueError, match="unknown role 'actorr'.*actor, critic"):
        build_runtime_env(verl(), role="actorr")


def test_only_the_keys_read_are_resolved():
    # An interpolation elsewhere that cannot resolve here (a custom resolver
    # registered only in the trainer) must not fail the helper.
    config = verl("trainer.default_local_dir=${my_resolver:x}")
    assert build_runtime_env(config)["megatron_env"] == EXPECTED


def test_a_broken_interpolation_where_it_matters_names_the_key():
    with pytest.raises(FieldValueError, match=f"cannot resolve {ACTOR}.strategy"):
        build_runtime_env(verl(f"{ACTOR}.strategy=${{nowhere.at_all}}"))


def test_bad_explicit_value_in_base_is_caught_on_the_driver():
    with pytest.raises(FieldValueError, match="CUDA_DEVICE_MAX_CONNECTIONS.*1 to 32"):
        build_runtime_env(verl(), base={"env_vars": {"CUDA_DEVICE_MAX_CONNECTIONS": "0"}})


@pytest.mark.parametrize("config,error,words", [
    ("/nonexistent/config.yaml", FieldValueError, ["does not exist"]),
    (42, FieldTypeError, ["the field must be a mapping"]),
    (OmegaConf.create([1, 2]), FieldTypeError, ["the config must be a mapping"]),
    (verl(f"{ACTOR_TP}=0"), FieldValueError, [ACTOR_TP]),
])
def test_bad_configs(config, error, words):
    with pytest.raises(error) as info:
        build_runtime_env(config)
    for word in words:
        assert word in str(info.value)


def test_a_compact_form_written_in_yaml(tmp_path):
    path = tmp_path / "compact.yaml"
    path.write_text("engines:\n  trainer:\n    strategy: megatron\n    context_parallel: 2\n")
    assert build_runtime_env(path)["megatron_env"]["engines"] == {
        "trainer": {"strategy": "megatron", "context_parallel": 2}}


def test_fsdp_example():
    engines = build_runtime_env(FSDP_YAML)["megatron_env"]["engines"]
    assert {e["strategy"] for e in engines.values()} == {"fsdp", "vllm"}


MEGATRON_TP2 = {"version": 2, "engines": {"actor": {"strategy": "megatron",
                                                    "tensor_parallel": 2}}}


@pytest.mark.parametrize("field", ["image_uri", "container"])
def test_an_exclusive_ray_field_in_the_base_is_refused_on_the_driver(field):
    with pytest.raises(ValueError, match=f"base has '{field}'.*cannot be used together"):
        build_runtime_env(MEGATRON_TP2, base={field: "rayproject/ray:2.60.0"})
