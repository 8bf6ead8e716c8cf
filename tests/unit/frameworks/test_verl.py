"""Reading verl's layout: which engines count, and the errors for bad ones."""


import pytest

from configs import ACTOR, ACTOR_TP, FSDP_YAML, REF_ONLY, REWARD_MODEL_ONLY, plain
from ray_megatron_env.demo import load_example
from ray_megatron_env.errors import FieldTypeError, FieldValueError
from ray_megatron_env.explanation import explain
from ray_megatron_env.frameworks import parse_field
from ray_megatron_env.engines import FSDP, INFERENCE, MEGATRON
from ray_megatron_env.spec import Engine
from paths import FIXTURES


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


# --- verl's own choice of workers (verl/trainer/ppo/utils.py, 0.9.1) ----------

FIXTURES = FIXTURES / "verl"
GRPO_FSDP_ACTOR = (f"{ACTOR}.strategy=fsdp", "algorithm.adv_estimator=grpo",
                   "critic.strategy=megatron", "critic.megatron.tensor_model_parallel_size=4")


def test_a_critic_grpo_does_not_create_is_left_out_and_says_why():
    spec = parse_field(plain(*GRPO_FSDP_ACTOR))
    assert "critic" not in dict(spec.engines)
    assert dict(spec.omitted)["critic"] == (
        "not created: algorithm.adv_estimator is grpo, which needs no critic")


def test_the_unused_megatron_critic_no_longer_forces_1():
    # Golden: actor and ref FSDP ("not 1", preferred), rollout vLLM ("not 1"):
    # on 9.0 nothing is set; before, the TP=4 critic made it 1 for everyone.
    decision = explain(plain(*GRPO_FSDP_ACTOR), "9.0")
    assert decision.value is None
    assert "critic: not created: algorithm.adv_estimator is grpo" in decision.reason


def test_asking_for_the_uncreated_critic_is_an_error_that_says_why():
    with pytest.raises(FieldValueError, match="'critic' is never started by verl.*grpo"):
        explain(plain(*GRPO_FSDP_ACTOR), "9.0", role="critic")


@pytest.mark.parametrize("override,created", [
    ("critic.enable=true", True),  # explicit enable wins over the estimator
    ("critic.enable=null", False),  # null: the estimator (grpo) decides
])
def test_critic_enable_decides_before_the_estimator(override, created):
    assert ("critic" in dict(parse_field(plain(*GRPO_FSDP_ACTOR, override)).engines)) == created


REF_TP4 = (f"{ACTOR}.strategy=fsdp", "critic.strategy=fsdp", "actor_rollout_ref.ref.strategy=megatron",
           "actor_rollout_ref.ref.megatron.tensor_model_parallel_size=4")


@pytest.mark.parametrize("overrides,value", [
    ((f"{ACTOR}.use_kl_loss=true",), "1"),  # KL loss: verl creates the ref, which needs 1
    (("+algorithm.use_kl_in_reward=true", f"{ACTOR}.use_kl_loss=false"), "1"),  # KL in reward
    ((f"{ACTOR}.use_kl_loss=false",), None),  # no KL term: no ref worker, FSDP only
    ((f"{ACTOR}.use_kl_loss=true", "+actor_rollout_ref.model.lora.rank=16"), None),  # LoRA
])
def test_a_tp4_ref_counts_only_when_verl_creates_it(overrides, value):
    decision = explain(plain(*REF_TP4, *overrides), "9.0")
    assert decision.value == value, decision.reason


def test_lora_says_the_actor_is_the_reference():
    spec = parse_field(plain(*REF_TP4, f"{ACTOR}.use_kl_loss=true",
                             "+actor_rollout_ref.model.lora.rank=16"))
    assert "LoRA" in dict(spec.omitted)["ref"]


def test_teachers_are_an_inference_role():
    spec = parse_field(plain("+distillation.enabled=true",
                             "+distillation.teacher_models.teacher_model.inference.name=sglang"))
    assert dict(spec.engines)["teacher"] == Engine("sglang", INFERENCE)


def test_enabled_distillation_without_a_teacher_engine_is_an_error():
    with pytest.raises(FieldValueError, match="no teacher under distillation.teacher_models"):
        parse_field(plain("+distillation.enabled=true", "+distillation.teacher_models={}"))


# --- SFT on Ray and Megatron-Lite ---------------------------------------------

@pytest.mark.parametrize("gpus,value", [("8.0", "1"), ("9.0", "1"), ("10.0", None),
                                        ("9.0,10.0", "1"), ("none", None)])
def test_sft_on_ray_megatron_tp2_cp2(gpus, value):
    decision = explain(FIXTURES / "sft_megatron_tp2_cp2.yaml", gpus)
    assert decision.value == value
    assert decision.engines == {"trainer": "megatron TP=2 CP=2"}


def test_sft_fsdp_replaces_an_inherited_1():
    decision = explain(FIXTURES / "sft_fsdp.yaml", "9.0", node_value="1")
    assert (decision.value, decision.engines) == ("8", {"trainer": "fsdp"})


def test_sft_megatron_without_sizes_names_the_keys_looked_for():
    with pytest.raises(FieldValueError, match="engine.tensor_model_parallel_size, "
                                              "engine.context_parallel_size"):
        parse_field({"engine": {"_target_": "verl.workers.config.McoreEngineConfig"}})


def test_an_sft_engine_of_unknown_kind_is_an_error():
    with pytest.raises(FieldValueError, match="engine.strategy is not set"):
        parse_field({"engine": {"_target_": "my.EngineConfig"}})


def test_megatron_lite_cp8_with_fsdp2_reads_cp_and_is_an_fsdp2_engine():
    # mlite with impl_cfg.optimizer fsdp2 shards with torch FSDP2: the
    # megatron-torch-fsdp2 row, "not 1"; nothing set on 9.0, an inherited 1 replaced.
    decision = explain(FIXTURES / "grpo_mlite_cp8.yaml", "9.0", role="actor", node_value="1")
    assert "CP=8" in decision.reason and "torch-FSDP2" in decision.reason
    assert decision.rules == {"actor": "megatron-torch-fsdp2"}
    assert decision.value == "8"


def test_megatron_lite_with_its_default_optimizer_needs_1_before_blackwell():
    config = load_example(FIXTURES / "grpo_mlite_cp8.yaml",
                          "actor_rollout_ref.actor.engine.impl_cfg.optimizer=dist_opt")
    assert explain(config, "9.0", role="actor").value == "1"
    assert explain(config, "10.0", role="actor").value is None


# --- per-process roles from one job-level env ---------------------------------

def test_processes_are_recognised_from_what_verl_puts_in_their_env_vars():
    spec = parse_field(plain("actor_rollout_ref.hybrid_engine=false"))
    cases = {
        "rollout_standalone_0": ("rollout",),  # replica.py init_standalone
        "rollout_colocate_1": ("rollout",),
        "a1b2c3": ("actor", "critic", "ref"),  # the trainer's random WG_PREFIX
    }
    for prefix, roles in cases.items():
        narrowed, _ = spec.for_process({"WG_PREFIX": prefix})
        assert narrowed.roles() == tuple(sorted(roles)), prefix
    server, how = spec.for_process({"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"})
    assert server.roles() == ("rollout",) and "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES" in how


def test_reward_and_teacher_worker_groups_are_not_taken_for_the_rollout():
    spec = parse_field(plain("reward.reward_model.enable=true", "+distillation.enabled=true",
                             "+distillation.teacher_models.t.inference.name=vllm"))
    assert spec.for_process({"WG_PREFIX": "rollout_reward_standalone_0"})[0].roles() == (
        "reward_model",)
    assert spec.for_process({"WG_PREFIX": "rollout_teacher_colocate_0_t"})[0].roles() == (
        "teacher",)


def test_a_ref_verl_never_creates_is_not_read_even_half_configured():
    decision = explain(FIXTURES / "grpo_mlite_actor_only.yaml", "9.0")
    assert decision.engines == {"actor": "mlite TP=1 CP=8 EP=8 torch-FSDP2"}
    assert "ref: not created: neither actor.use_kl_loss nor" in decision.reason


MOE_A2A = (f"+{ACTOR}.megatron.override_transformer_config.overlap_moe_expert_parallel_comm=true",
           f"+{ACTOR}.megatron.expert_model_parallel_size=8")


@pytest.mark.parametrize("gpus", ["8.0", "9.0", "10.0", "9.0,10.0"])
@pytest.mark.parametrize("node_value", [None, "1"])
def test_moe_a2a_overlap_never_gets_1(gpus, node_value):
    # Golden (Megatron-LM moe/README.md: the overlap needs more than 1; 32 as
    # Megatron-Bridge and Megatron-LM's launch guide use): the actor with
    # MoE A2A overlap asks "not 1, 32 preferred" on every architecture.
    decision = explain(plain(*MOE_A2A), gpus, role="actor", node_value=node_value)
    assert decision.value == "32"
    assert decision.engines == {"actor": "megatron TP=2 CP=1 EP=8 MoE-A2A-overlap"}


def test_a_megatron_fsdp_critic_beside_a_tp2_actor_is_warned_about_by_name():
    # verl builds Megatron-Core directly: both are preferences; 1 is kept and
    # the critic, whose Megatron-FSDP would rather not run with 1, is named.
    decision = explain(plain("critic.megatron.use_megatron_fsdp=true"), "9.0")
    assert decision.value == "1" and decision.satisfied and decision.conflict
    assert any(w.startswith("critic (megatron TP=1 CP=1 Megatron-FSDP) asks not 1")
               and "role='critic'" in w for w in decision.warnings)
