"""Reading ROLL's pipeline configs: the engines per role, one exact process
rule per role on CLUSTER_NAME, and the value each role's workers get.

The configs are ROLL's own examples (tests/fixtures/roll/SOURCES.md),
composed as ROLL's entry points compose them. Expected values come from the
rule table by hand (docs/rules.md): Megatron with TP or CP > 1 asks "1"
below compute capability 10 and nothing from 10 on; ROLL runs no
validate_args (mcore_adapter builds Megatron-Core models), so that "1" is
preferred; TP = CP = 1 asks nothing; vLLM, SGLang, HF and FSDP2 ask "not 1"
(preferred), which leaves the variable unset. On a mixed node the oldest
GPU decides.
"""


import pytest

from ray_megatron_env import build_runtime_env
from ray_megatron_env.errors import FieldTypeError, FieldValueError
from ray_megatron_env.frameworks import parse_field
from ray_megatron_env.frameworks.loading import load_spec
from ray_megatron_env.node import parse_gpu_list
from ray_megatron_env.spec import ProcessRule

from deciding import decided, shown
from paths import FIXTURES

FIXTURES = FIXTURES / "roll"
GPUS = ("8.0", "9.0", "10.0", "9.0,10.0")
ONE = dict(zip(GPUS, ("1 (preferred)", "1 (preferred)", "unset", "1 (preferred)")))
UNSET = dict.fromkeys(GPUS, "unset")

# (fixture, {CLUSTER_NAME ROLL gives the workers: {gpus: value}}), written
# from each config's strategy_args by hand.
GOLDEN = [
    # actor_train megatron TP=2 EP=4; actor_infer sglang; reference TP=1; llm_judge hf_infer
    ("qwen3-30BA3B-rlvr_megatron/rlvr_config_sglang.yaml",
     {"actor_train": ONE, "actor_infer": UNSET, "reference": UNSET,
      "reward-llm_judge": UNSET}),
    # actor_train TP=1 CP=4 EP=4 (CP asks 1); actor_infer vllm TP=2
    ("qwen3-30BA3B-rlvr_megatron/rlvr_config.yaml",
     {"actor_train": ONE, "actor_infer": UNSET, "reference": UNSET,
      "reward-llm_judge": UNSET}),
    # actor_train TP=4 EP=8; reference TP=1 EP=8
    ("qwen3-235BA22B-rlvr_megatron/rlvr_config.yaml",
     {"actor_train": ONE, "actor_infer": UNSET, "reference": UNSET}),
    # TP=1 everywhere
    ("qwen2.5-7B-rlvr_megatron/rlvr_config.yaml",
     {"actor_train": UNSET, "actor_infer": UNSET, "reference": UNSET,
      "reward-llm_judge": UNSET}),
    # the LLM-judge server: reward_model named reward_llm, vllm
    ("qwen2.5-7B-rlvr_megatron/rlvr_config_8gpus_llm_as_judge_server.yaml",
     {"actor_train": UNSET, "reward_llm": UNSET}),
    # actor_train fsdp2
    ("qwen3-8B-rlvr_fsdp2/rlvr_config.yaml", {"actor_train": UNSET, "actor_infer": UNSET}),
    # agentic, composed with ../config/traj_envs@_here_: megatron TP=1, vllm (its
    # hf reference never starts: KL is off, OMITTED below)
    ("qwen2.5-7B-agentic_megatron/agentic_val_webshop.yaml",
     {"actor_train": UNSET, "actor_infer": UNSET}),
    ("qwen2.5-0.5B-agentic/agentic_val_sokoban.yaml",
     {"actor_train": UNSET, "actor_infer": UNSET}),
    # agentic deepeyes: actor_train megatron TP=2 CP=2, vllm, the reward vllm
    # TP=4 named deepeyes_reward
    ("agentic_deepeyes/deepeyes.yaml",
     {"actor_train": ONE, "actor_infer": UNSET, "deepeyes_reward": UNSET}),
    # distill pipeline: student and teacher megatron TP=2 CP=2
    ("qwen2.5-7B-distill_megatron/distill_megatron.yaml", {"student": ONE, "teacher": ONE}),
    # pure OPD: student_train CP=2, student_infer vllm, one teacher TP=2 CP=2
    ("qwen3-8B-onpolicy-distill-megatron/onpolicy_distill_config.yaml",
     {"student_train": ONE, "student_infer": UNSET, "teacher": ONE}),
    # pure OPD with two teachers: student TP=1, teachers TP=2
    ("qwen3-8B-onpolicy-distill-megatron/multi_teacher_onpolicy_distill_config.yaml",
     {"student_train": UNSET, "student_infer": UNSET, "teacher-teacher_14B": ONE,
      "teacher-teacher_32B": ONE}),
    # DPO: actor_train and reference megatron TP=1
    ("dpo_examples/qwen2.5-3B_dpo_megatron.yaml", {"actor_train": UNSET, "reference": UNSET}),
]

# What ROLL's Cluster puts in every worker's own env_vars (cluster.py:127-133).
def worker(cluster):
    return {"WORLD_SIZE": "4", "RANK": "1", "LOCAL_RANK": "0", "CLUSTER_NAME": cluster,
            "WORKER_NAME": f"{cluster}-1-G1"}


def on_node(config, gpus, worker_env):
    spec = parse_field(build_runtime_env(str(config))["megatron_env"])
    return decided(spec, parse_gpu_list(gpus), worker_env=worker_env)


@pytest.mark.parametrize("fixture,clusters", GOLDEN, ids=[g[0] for g in GOLDEN])
@pytest.mark.parametrize("gpus", GPUS)
def test_golden_values_per_cluster(fixture, clusters, gpus):
    for cluster, values in clusters.items():
        assert shown(on_node(FIXTURES / fixture, gpus, worker(cluster))) == values[gpus], cluster
    # The driver and ROLL's CPU actors (schedulers, env managers) carry no
    # CLUSTER_NAME: no engine, so nothing is set.
    assert shown(on_node(FIXTURES / fixture, gpus, {})) == "unset"


def test_actor_train_tp2_gets_1_and_its_vllm_workers_nothing():
    fixture = FIXTURES / "qwen3-30BA3B-rlvr_megatron/rlvr_config_sglang.yaml"
    hopper = on_node(fixture, "9.0", worker("actor_train"))
    assert hopper.value == "1" and set(hopper.engines) == {"actor_train"}
    assert on_node(fixture, "10.0", worker("actor_train")).value is None
    assert on_node(fixture, "9.0", worker("actor_infer")).value is None


def test_rule_based_rewards_are_cpu_workers_with_no_engine():
    spec, roles = load_spec(FIXTURES / "qwen2.5-7B-rlvr_megatron/rlvr_config.yaml")
    assert dict(spec.engines)["rewards.llm_judge"].describe() == "vllm"
    assert "rewards.math_rule" not in dict(spec.engines)
    assert spec.framework == "roll" and spec.replaces is None


def test_a_user_value_in_system_envs_stays_the_users():
    config = {"actor_train": {"strategy_args": {"strategy_name": "megatron_train",
                                                "strategy_config": {"tensor_model_parallel_size": 2}},
                              "system_envs": {"CUDA_DEVICE_MAX_CONNECTIONS": "8"}}}
    spec = parse_field(build_runtime_env(config)["megatron_env"])
    env = {**worker("actor_train"), "CUDA_DEVICE_MAX_CONNECTIONS": "8"}
    decision = decided(spec, parse_gpu_list("9.0"), worker_env=env)
    assert decision.value == "8" and decision.source == "explicit"


def test_defaults_where_keys_are_absent():
    # strategy_name defaults to fsdp2_train; strategy_config null is {}; sizes 1.
    spec, _ = load_spec({"actor_train": {"strategy_args": {}},
                         "actor_infer": {"strategy_args": {"strategy_name": "megatron_infer",
                                                           "strategy_config": None}}})
    assert {r: e.describe() for r, e in spec.engines} == {
        "actor_train": "fsdp2", "actor_infer": "megatron TP=1 CP=1"}


def test_cluster_names_are_matched_exactly():
    config = {"actor_train": {"strategy_args": {"strategy_name": "megatron_train",
                                                "strategy_config": {"context_parallel_size": 2}}},
              "rewards": {"math": {"strategy_args": {"strategy_name": "megatron_infer",
                                                     "strategy_config": {
                                                         "tensor_model_parallel_size": 2}}},
                          "math_rule": {"worker_cls": "x.MathRuleRewardWorker"}}}
    spec = parse_field(build_runtime_env(config)["megatron_env"])
    assert ProcessRule(("rewards.math",), "CLUSTER_NAME", "reward-math", True) in spec.processes
    gpus = parse_gpu_list("9.0")
    assert decided(spec, gpus, worker_env=worker("reward-math")).value == "1"
    assert decided(spec, gpus, worker_env=worker("reward-math_rule")).value is None


@pytest.mark.parametrize("config,key", [
    ({"actor_train": {"strategy_args": {"strategy_name": "megatron_trian"}}},
     "actor_train.strategy_args.strategy_name"),
    ({"actor_train": {"strategy_args": {"strategy_name": "megatron_train",
                                        "strategy_config": {"tensor_model_parallel_size": 0}}}},
     "actor_train.strategy_args.strategy_config.tensor_model_parallel_size"),
    ({"actor_train": {"strategy_args": {"strategy_nme": "vllm"}}}, "strategy_nme"),
    ({"actor_train": {"strategy_args": {}},
      "reward_model": {"strategy_args": {}, "device_mapping": "list(range(0,8))"}},
     "reward_model.name"),
    ({"actor_train": {"strategy_args": {}, "system_envs": {"CUDA_DEVICE_MAX_CONNECTIONS": "0"}}},
     "actor_train.system_envs.CUDA_DEVICE_MAX_CONNECTIONS"),
    ({"actor_train": {"strategy_args": {"strategy_name": "deepspeed_train"}}}, "DeepSpeed"),
    ({"actor_train": {"strategy_args": {}},
      "reward_model": {"name": "actor_train", "strategy_args": {"strategy_name": "vllm"},
                       "device_mapping": "[0]"}},
     "actor_train and reward_model would both be ROLL cluster 'actor_train'"),
])
def test_a_broken_config_is_refused_naming_the_key(config, key):
    with pytest.raises(FieldValueError, match=key.replace(".", r"\.")):
        load_spec(config)


@pytest.mark.filterwarnings("ignore:In 'agentic_val_webshop'")  # Hydra: no _self_
def test_composition_matches_hydra_when_it_is_installed():
    """Hydra's compose (what ROLL's entry points call) gives the same config,
    key for key and in the same order."""
    pytest.importorskip("hydra")
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from ray_megatron_env.frameworks import roll

    folder = FIXTURES / "qwen2.5-7B-agentic_megatron"
    path = folder / "agentic_val_webshop.yaml"
    with initialize_config_dir(config_dir=str(folder), version_base=None):
        cfg = compose(config_name="agentic_val_webshop")
    ours = roll.compose(str(path), OmegaConf.load(path))
    assert OmegaConf.to_container(ours) == OmegaConf.to_container(cfg)
    assert list(ours) == list(cfg)
    assert load_spec(cfg)[0].engines == load_spec(path)[0].engines


def test_a_missing_defaults_file_is_named(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("defaults:\n  - ../config/nothing@_here_\nactor_train:\n"
                    "  strategy_args: {strategy_name: megatron_train}\n")
    with pytest.raises(FieldValueError, match="nothing@_here_"):
        load_spec(str(path))


# --- Which clusters ROLL starts, and under which name ---------------------------------
#
# Written from ROLL's sources: PPOConfig.__post_init__ turns the reference on
# for enable_reference, use_kl_loss, or init_kl_coef > 0 (default 0.2;
# base_config.py:654-656); RLVRPipeline and AgenticPipeline create it only
# then, the critic only for adv_estimator "gae" (the default), the agentic
# reward and the RLVR reward model only with a non-empty device_mapping
# (agentic_pipeline.py:89-125, rlvr_pipeline.py:211-256).

# fixture -> {omitted role: a word of why}
OMITTED = [
    # init_kl_coef 0.0, use_kl_loss false: no reference
    ("agentic_deepeyes/deepeyes.yaml", {"reference": "enable_reference"}),
    ("qwen2.5-0.5B-agentic/agentic_val_sokoban.yaml", {"reference": "enable_reference"}),
    ("qwen2.5-7B-agentic_megatron/agentic_val_webshop.yaml", {"reference": "enable_reference"}),
    # init_kl_coef left at 0.2 with LoRA: RLVRPipeline would not start the
    # reference, RLVRVLMPipeline on the same config would; it stays listed.
    ("qwen2.5-7B-rlvr_megatron/rlvr_config_lora.yaml", {}),
    # init_kl_coef 0.2 (the default) and no critic section
    ("qwen3-30BA3B-rlvr_megatron/rlvr_config_sglang.yaml", {}),
]


@pytest.mark.parametrize("fixture,omitted", OMITTED, ids=[o[0] for o in OMITTED])
def test_roles_roll_never_starts_are_omitted(fixture, omitted):
    spec, _ = load_spec(FIXTURES / fixture)
    assert set(dict(spec.omitted)) == set(omitted)
    for role, why in omitted.items():
        assert why in dict(spec.omitted)[role]
        assert role not in dict(spec.engines)
        rule = [r for r in spec.processes if role in r.roles]
        assert rule == []


def test_the_agentic_reward_keeps_its_own_name():
    # deepeyes.yaml: reward.name deepeyes_reward (agentic_config.py:294-295 sets
    # "reward" only when name is None), vLLM TP=4 on list(range(12,16)).
    fixture = FIXTURES / "agentic_deepeyes/deepeyes.yaml"
    spec = parse_field(build_runtime_env(str(fixture))["megatron_env"])
    assert ProcessRule(("reward",), "CLUSTER_NAME", "deepeyes_reward", True) in spec.processes
    h100 = parse_gpu_list("9.0")
    # vLLM asks "not 1": the node's own 1 is replaced by CUDA's default 8.
    reward = decided(spec, h100, inherited="1", worker_env=worker("deepeyes_reward"))
    assert reward.value == "8" and set(reward.engines) == {"reward"}
    # No worker carries CLUSTER_NAME=reward: such a process matches no rule.
    assert decided(spec, h100, inherited="1", worker_env=worker("reward")).engines == {}
    # actor_train megatron TP=2 CP=2: 1 below Blackwell.
    assert decided(spec, h100, worker_env=worker("actor_train")).value == "1"


def test_the_agentic_reward_is_named_reward_without_a_name():
    config = {"actor_infer": {"strategy_args": {"strategy_name": "vllm"}},
              "train_env_manager": {},
              "reward": {"strategy_args": {"strategy_name": "vllm"},
                         "device_mapping": "list(range(0,4))"}}
    assert ProcessRule(("reward",), "CLUSTER_NAME", "reward", True) in load_spec(config)[0].processes


VLLM = {"strategy_args": {"strategy_name": "vllm"}}
MEGATRON_TP2 = {"strategy_args": {"strategy_name": "megatron_train",
                                  "strategy_config": {"tensor_model_parallel_size": 2}}}
RLVR = {"actor_train": MEGATRON_TP2, "actor_infer": VLLM}
AGENTIC = {**RLVR, "custom_envs": {}, "train_env_manager": {}}


@pytest.mark.parametrize("config,role,why", [
    # the reference: KL off
    ({**RLVR, "init_kl_coef": 0, "reference": MEGATRON_TP2}, "reference", "enable_reference"),
    # the critic: only for gae
    ({**RLVR, "adv_estimator": "grpo", "critic": MEGATRON_TP2}, "critic", "'grpo'"),
    # pure OPD forces reinforce (base_config.py _apply_opd_config)
    ({"student_train": MEGATRON_TP2, "student_infer": VLLM, "teacher": MEGATRON_TP2,
      "critic": MEGATRON_TP2}, "critic", "'reinforce'"),
    # LoRA under the agentic pipeline: the actor is the reference
    ({**AGENTIC, "reference": MEGATRON_TP2,
      "actor_train": {**MEGATRON_TP2, "model_args": {"lora_target": "all-linear"}}},
     "reference", "LoRA"),
    # AgenticConfig.reward with an empty device_mapping
    ({**AGENTIC, "reward": {**VLLM, "device_mapping": "[]"}}, "reward", "empty"),
    # RLVRPipeline never starts PPOConfig.reward
    ({**RLVR, "reward": {**VLLM, "device_mapping": "[0]"}}, "reward", "RLVRPipeline"),
    # the RLVR reward model: only with devices
    ({**RLVR, "reward_model": {**VLLM, "name": "judge", "device_mapping": "list(range(3,3))"}},
     "reward_model", "empty"),
    ({**RLVR, "reward_model": {**VLLM, "name": "judge"}}, "reward_model", "empty"),
    # AgenticPipeline starts no rewards.<key> or reward_model cluster
    ({**AGENTIC, "rewards": {"math": VLLM}}, "rewards.math", "agentic"),
    ({**AGENTIC, "reward_model": {**VLLM, "name": "judge", "device_mapping": "[0]"}},
     "reward_model", "agentic"),
])
def test_a_role_roll_does_not_start_is_omitted_with_why(config, role, why):
    spec, _ = load_spec(config)
    assert role not in dict(spec.engines)
    assert why in dict(spec.omitted)[role]


@pytest.mark.parametrize("config,role", [
    ({**RLVR, "reference": MEGATRON_TP2}, "reference"),  # init_kl_coef 0.2 by default
    ({**RLVR, "init_kl_coef": 0, "use_kl_loss": True, "reference": MEGATRON_TP2}, "reference"),
    ({**RLVR, "init_kl_coef": 0.0, "enable_reference": True, "reference": MEGATRON_TP2},
     "reference"),
    ({**RLVR, "critic": MEGATRON_TP2}, "critic"),  # adv_estimator gae by default
    ({**AGENTIC, "reward": {**VLLM, "device_mapping": "list(range(0,2))+list(range(14,16))"}},
     "reward"),
    ({**RLVR, "reward_model": {**VLLM, "name": "judge", "device_mapping": "[6, 7]"}},
     "reward_model"),
    # DPO (no actor_infer) starts its reference whatever the KL keys say
    ({"actor_train": MEGATRON_TP2, "reference": MEGATRON_TP2, "init_kl_coef": 0}, "reference"),
])
def test_a_role_roll_starts_is_read(config, role):
    spec, _ = load_spec(config)
    assert role in dict(spec.engines) and role not in dict(spec.omitted)


def test_an_agentic_reward_without_device_mapping_is_refused():
    with pytest.raises(FieldValueError, match=r"reward\.device_mapping is missing"):
        load_spec({**AGENTIC, "reward": VLLM})


def test_a_cluster_name_in_system_envs_is_the_one_the_workers_carry():
    # Cluster: env_vars = {..., CLUSTER_NAME: name}, then .update(system_envs)
    # (cluster.py:135-142); the top-level system_envs reaches actor_train,
    # actor_infer, reference and critic (base_config.py:354-361), not rewards.
    config = {**RLVR, "actor_infer": {**VLLM, "system_envs": {"CLUSTER_NAME": "gen"}},
              "system_envs": {"CLUSTER_NAME": "all"}, "rewards": {"math": VLLM}}
    spec, _ = load_spec(config)
    prefixes = {rule.roles[0]: rule.prefix for rule in spec.processes}
    assert prefixes == {"actor_infer": "gen", "actor_train": "all", "rewards.math": "reward-math"}


# --- strategy_config.additional_configs (mcore_adapter) ------------------------------

def with_extra(extra, **strategy_config):
    return {"actor_train": {"strategy_args": {"strategy_name": "megatron_train",
                                              "strategy_config": {**strategy_config,
                                                                  "additional_configs": extra}}},
            "actor_infer": VLLM}


def test_moe_overlap_in_additional_configs_reaches_megatron_core():
    # McaModelConfig.update_with_args sets each additional_configs key on the
    # TransformerConfig (model_config.py:137-143); MoE A2A overlap asks "not 1,
    # 32 preferred" on every GPU class (docs/rules.md).
    fixture = FIXTURES / "qwen3-30BA3B-rlvr_megatron/rlvr_config_sglang.yaml"
    from omegaconf import OmegaConf

    config = OmegaConf.to_container(OmegaConf.load(fixture), resolve=True)
    config["actor_train"]["strategy_args"]["strategy_config"]["additional_configs"] = {
        "overlap_moe_expert_parallel_comm": True}
    spec = parse_field(build_runtime_env(config)["megatron_env"])
    for gpus, value in (("9.0", "32"), ("10.0", "32")):
        assert decided(spec, parse_gpu_list(gpus), worker_env=worker("actor_train")).value == value
    # without it, TP=2 asks 1 on H100 (GOLDEN above)
    plain = load_spec(fixture)[0]
    assert decided(plain, parse_gpu_list("9.0"), worker_env=worker("actor_train")).value == "1"


def test_sizes_in_additional_configs_count_only_where_strategy_config_has_none():
    # update_with_args: a DistributingParallelArguments field given (not None)
    # in strategy_config is set over additional_configs' value; one left None
    # takes it (model_config.py:145-158).
    engine = dict(load_spec(with_extra({"tensor_model_parallel_size": 4,
                                        "context_parallel_size": 2},
                                       tensor_model_parallel_size=2))[0].engines)["actor_train"]
    assert (engine.tensor_parallel, engine.context_parallel) == (2, 2)


def test_the_dispatcher_type_comes_from_strategy_config_only():
    # moe_token_dispatcher_type is a field with the default "allgather": it is
    # always set over additional_configs'. The flex backend keys are not fields.
    ignored = with_extra({"moe_token_dispatcher_type": "flex"})
    assert dict(load_spec(ignored)[0].engines)["actor_train"].dispatcher is None
    flex = with_extra({"moe_flex_dispatcher_backend": "hybridep"},
                      moe_token_dispatcher_type="flex")
    assert dict(load_spec(flex)[0].engines)["actor_train"].dispatcher == "hybridep"


def test_additional_configs_from_a_json_file(tmp_path):
    # TrainingArguments.__post_init__ loads a string as a JSON file's path.
    path = tmp_path / "extra.json"
    path.write_text('{"overlap_moe_expert_parallel_comm": true}')
    assert dict(load_spec(with_extra(str(path)))[0].engines)["actor_train"].moe_overlap is True
    with pytest.raises(FieldValueError, match="additional_configs names"):
        load_spec(with_extra(str(tmp_path / "missing.json")))
    with pytest.raises(FieldTypeError, match="overlap_moe_expert_parallel_comm"):
        load_spec(with_extra({"overlap_moe_expert_parallel_comm": "yes"}))
