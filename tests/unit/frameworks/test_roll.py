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
from ray_megatron_env.errors import FieldValueError
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
    # agentic, composed with ../config/traj_envs@_here_: megatron TP=1, vllm, hf reference
    ("qwen2.5-7B-agentic_megatron/agentic_val_webshop.yaml",
     {"actor_train": UNSET, "actor_infer": UNSET, "reference": UNSET}),
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
    ({"actor_train": {"strategy_args": {}}, "reward_model": {"strategy_args": {}}},
     "reward_model.name"),
    ({"actor_train": {"strategy_args": {}, "system_envs": {"CUDA_DEVICE_MAX_CONNECTIONS": "0"}}},
     "actor_train.system_envs.CUDA_DEVICE_MAX_CONNECTIONS"),
    ({"actor_train": {"strategy_args": {"strategy_name": "deepspeed_train"}}}, "DeepSpeed"),
    ({"actor_train": {"strategy_args": {}},
      "reward_model": {"name": "actor_train", "strategy_args": {"strategy_name": "vllm"}}},
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
