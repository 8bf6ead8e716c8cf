"""frameworks/__init__, the registry: which reader a config is for, and the
errors when none or several are, or a key is misspelt. Loading a file or a
DictConfig: tests/unit/frameworks/test_loading.py."""

import argparse

import pytest

from ray_megatron_env.errors import FieldValueError
from ray_megatron_env.frameworks import parse_field, readers, to_mapping

READER_NAMES = ("verl", "verl-sft", "areal", "nemo-rl", "skyrl", "skyrl-sft", "slime", "roll")


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


# --- The same message from a file, a DictConfig and a dict --------------------------

# A NeMo-RL sft.yaml (examples/configs/sft.yaml: top-level sft, policy, data,
# logger, cluster, checkpointing) with `policy:` misspelt, and the verl
# example docs/frameworks.md prints, both written as files.
NEMO_RL_POLCY = """\
sft:
  max_num_epochs: 1
polcy:
  model_name: meta-llama/Llama-3.2-1B
  dtensor_cfg:
    enabled: true
data:
  max_input_seq_length: 1024
logger:
  log_dir: logs
cluster:
  gpus_per_node: 8
  num_nodes: 1
checkpointing:
  enabled: false
"""
VERL_REFF = """\
actor_rollout_reff:
  actor:
    strategy: fsdp
"""


@pytest.mark.parametrize("text,keys,hint", [
    (NEMO_RL_POLCY, "Its top-level keys: checkpointing, cluster, data, logger, polcy, sft",
     "Misspelt? 'polcy' looks like nemo-rl's 'policy'"),
    (VERL_REFF, "Its top-level keys: actor_rollout_reff",
     "Misspelt? 'actor_rollout_reff' looks like verl's 'actor_rollout_ref'"),
])
def test_an_unknown_file_or_dictconfig_is_described_by_its_real_keys(tmp_path, text, keys,
                                                                      hint):
    from omegaconf import OmegaConf

    from ray_megatron_env.explanation import explain
    from ray_megatron_env.runtime_env import build_runtime_env

    path = tmp_path / "config.yaml"
    path.write_text(text)
    forms = (str(path), OmegaConf.create(text), OmegaConf.to_container(OmegaConf.create(text)))
    for form in forms:
        with pytest.raises(FieldValueError) as info:
            build_runtime_env(form)
        assert keys in str(info.value) and hint in str(info.value), form
    with pytest.raises(FieldValueError, match=hint.replace("?", r"\?")):
        explain(str(path), gpus="9.0")
