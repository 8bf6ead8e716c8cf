"""Reading verl's layout: which engines count, and the errors for bad ones."""

import pytest

from configs import ACTOR, ACTOR_TP, FSDP_YAML, REF_ONLY, REWARD_MODEL_ONLY, plain
from ray_megatron_env.errors import FieldTypeError, FieldValueError
from ray_megatron_env.field import parse_field
from ray_megatron_env.rules import FSDP, INFERENCE, MEGATRON


def engines(config):
    return {role: e.describe() for role, e in parse_field(config).engines}


def test_megatron_example_reads_every_role():
    assert engines(plain()) == {
        "actor": "megatron TP=2 CP=1",
        "ref": "megatron TP=2 CP=1",  # through its oc.select interpolation
        "critic": "megatron TP=1 CP=1",
        "rollout": "vllm",
    }


def test_fsdp_example():
    assert engines(plain(base=FSDP_YAML)) == {
        "actor": "fsdp", "ref": "fsdp", "critic": "fsdp", "rollout": "vllm"}


def test_a_megatron_ref_policy_alone_is_seen():
    found = dict(parse_field(plain(*REF_ONLY)).engines)
    assert found["actor"].kind == FSDP and found["ref"].tensor_parallel == 2


def test_older_top_level_reward_model_is_read():
    found = dict(parse_field(plain(*REWARD_MODEL_ONLY)).engines)
    assert found["reward_model"].kind == MEGATRON and found["reward_model"].tensor_parallel == 4


def test_newer_reward_reward_model_wins_over_the_older_section():
    found = dict(parse_field(plain(*REWARD_MODEL_ONLY, "reward.reward_model.enable=true")).engines)
    assert found["reward_model"].strategy == "vllm"
    assert found["reward_model"].kind == INFERENCE


def test_a_newer_reward_model_with_a_training_strategy():
    found = dict(parse_field(plain("reward.reward_model.enable=true",
                                   "+reward.reward_model.strategy=megatron",
                                   "+reward.reward_model.megatron.context_parallel_size=2")).engines)
    assert found["reward_model"].context_parallel == 2


@pytest.mark.parametrize("override,role", [
    ("critic.enable=false", "critic"),
    ("reward.reward_model.enable=false", "reward_model"),
])
def test_an_explicitly_disabled_role_does_not_count(override, role):
    assert role not in engines(plain(override))


def test_enable_null_counts():
    assert "critic" in engines(plain("critic.enable=null"))


def test_rollout_name_left_mandatory_is_not_an_engine():
    assert "rollout" not in engines(plain("actor_rollout_ref.rollout.name=???"))


def test_keys_that_merely_end_in_strategy_do_not_count():
    config = plain(f"{ACTOR}.strategy=fsdp", "actor_rollout_ref.ref.strategy=fsdp",
                   "critic.strategy=fsdp", "trainer.v1.sampler.max_off_policy_strategy=megatron",
                   "+algorithm.rollout_correction.strategy=megatron")
    assert "megatron" not in str(engines(config))


def test_megatron_flags():
    found = dict(parse_field(plain(
        f"{ACTOR}.megatron.use_megatron_fsdp=true",
        f"+{ACTOR}.megatron.override_transformer_config.overlap_moe_expert_parallel_comm=true",
    )).engines)
    assert found["actor"].megatron_fsdp and found["actor"].moe_overlap


def test_a_declared_engine_kind_is_accepted():
    config = plain(f"{ACTOR}.strategy=my_trainer", "+megatron_env.engine_kinds.my_trainer=fsdp")
    assert dict(parse_field(config).engines)["actor"].kind == FSDP


@pytest.mark.parametrize("override,error,words", [
    (f"{ACTOR}.strategy=megatorn", FieldValueError,
     ["'megatorn'", f"{ACTOR}.strategy", "megatron", "fsdp", "engine_kinds"]),
    (f"{ACTOR_TP}=0", FieldValueError, [ACTOR_TP, "1 to"]),
    (f"{ACTOR_TP}=-2", FieldValueError, [ACTOR_TP]),
    (f"{ACTOR_TP}=2.5", FieldTypeError, [ACTOR_TP, "2.5"]),
    (f"{ACTOR_TP}='2'", FieldTypeError, [ACTOR_TP, "'2'"]),
    (f"{ACTOR_TP}=true", FieldTypeError, [ACTOR_TP]),
    (f"{ACTOR_TP}=null", FieldTypeError, [ACTOR_TP, "None"]),
    (f"{ACTOR_TP}=10000000", FieldValueError, [ACTOR_TP]),
    (f"{ACTOR}.megatron.use_megatron_fsdp='false'", FieldTypeError, ["use_megatron_fsdp", "true or false"]),
    ("critic.enable='false'", FieldTypeError, ["critic.enable"]),
    (f"{ACTOR}.strategy=[megatron]", FieldTypeError, [f"{ACTOR}.strategy", "a string"]),
    ("critic=[1,2]", FieldTypeError, ["critic must be a mapping"]),
    ("actor_rollout_ref=oops", FieldTypeError, ["actor_rollout_ref", "a mapping"]),
    (f"{ACTOR}.strategy='meg tron'", FieldValueError, ["not a valid name"]),
    ("+megatron_env.engine_kinds.my_trainer=gpu", FieldValueError, ["engine_kinds.my_trainer"]),
    ("+megatron_env.env_vars.LD_PRELOAD=x", FieldValueError, ["'env_vars'", "engine_kinds"]),
    (f"{ACTOR}.strategy=fsdp2x", FieldValueError, ["'fsdp2x'"]),
])
def test_bad_values_name_the_key(override, error, words):
    with pytest.raises(error) as info:
        parse_field(plain(override))
    message = str(info.value)
    assert message.startswith("megatron_env: ")
    for word in words:
        assert word in message


def test_a_declared_kind_cannot_relabel_a_known_engine():
    with pytest.raises(FieldValueError, match="known megatron engine"):
        parse_field(plain("+megatron_env.engine_kinds.megatron=fsdp"))


def test_unresolved_interpolations_are_refused_not_resolved():
    from omegaconf import OmegaConf

    from configs import verl
    raw = OmegaConf.to_container(verl(), resolve=False)
    with pytest.raises(FieldValueError, match="unresolved interpolation"):
        parse_field(raw)
