"""Reading NeMo-RL's layout: the defaults: chain, which engines count, roles
and processes, and the errors for configs NeMo-RL itself would refuse.

Fixtures under tests/fixtures/nemo_rl/ mirror NeMo-RL's example configs
(NVIDIA-NeMo/RL @ 7ea279ab). Expected values are written by hand from the
rule table (docs/rules.md), not computed by the code under test.
"""


import pytest
from omegaconf import OmegaConf

from ray_megatron_env.errors import FieldTypeError, FieldValueError
from ray_megatron_env.explanation import explain
from ray_megatron_env.frameworks import compose_yaml, reader_for, readers
from ray_megatron_env.frameworks.nemo_rl import READER, compose
from ray_megatron_env.engines import FSDP, INFERENCE, MEGATRON, MEGATRON_BRIDGE_CHECK
from ray_megatron_env.frameworks.loading import load_spec
from ray_megatron_env.runtime_env import build_runtime_env
from paths import FIXTURES

CONFIGS = FIXTURES / "nemo_rl" / "configs"
DTENSOR = CONFIGS / "grpo_math_1B.yaml"
MEGATRON_TP2 = CONFIGS / "grpo_math_1B_megatron.yaml"
RECIPE = CONFIGS / "recipes" / "llm" / "grpo-qwen3-30ba3b-1n8g-megatron-tp2cp2.yaml"
SFT = CONFIGS / "sft_megatron.yaml"
DISTILLATION = CONFIGS / "distillation_math.yaml"
PPO = CONFIGS / "ppo_math_1B_megatron.yaml"
MCORE_GEN_COLOCATED = CONFIGS / "recipes" / "llm" / "grpo-1b-megatron_generation.yaml"
MCORE_GEN_SEPARATE = CONFIGS / "recipes" / "llm" / "grpo-1b-megatron_generation-noncolocated.yaml"
OVERRIDE = CONFIGS / "gdpo_override.yaml"
MEGATRON_SGLANG = CONFIGS / "grpo_math_1B_megatron_sglang.yaml"
OPD_TEACHERS = CONFIGS / "recipes" / "llm" / "mopd-megatron-noncolocated-teachers.yaml"
MCORE_GEN_DEDICATED = CONFIGS / "recipes" / "llm" / "grpo-1b-megatron_generation-dedicated.yaml"
GPUS = ("8.0", "9.0", "10.0", "9.0,10.0")

# The golden table, by hand from docs/rules.md. Megatron TP or CP > 1 asks
# "1" below major 10 and nothing from 10 on; a mixed node is classed by its
# oldest GPU. DTensor (fsdp kind) and vLLM (inference) ask "not 1", which an
# unset variable satisfies. With no process rule matching (the explain call
# carries no env_vars), a worker is one of the training roles.
GOLDEN = [
    (DTENSOR, (None, None, None, None)),
    (MEGATRON_TP2, ("1", "1", None, "1")),
    (RECIPE, ("1", "1", None, "1")),  # TP=${mul:CP,1}=2, CP=2
    (SFT, ("1", "1", None, "1")),  # TP=4, no generation
    # Teacher Megatron TP=2 CP=2 asks 1; the DTensor student asks "not 1"
    # (preferred); a preference accepting 1 wins below major 10.
    (DISTILLATION, ("1", "1", None, "1")),
    (PPO, ("1", "1", None, "1")),  # the value model has TP=2
    (MCORE_GEN_COLOCATED, ("1", "1", None, "1")),  # the policy's TP=2
    (MCORE_GEN_SEPARATE, ("1", "1", None, "1")),  # the generation policy's TP=2
    (OVERRIDE, (None, None, None, None)),  # Megatron section replaced
]


def engines(config):
    spec, _ = load_spec(config)
    return {role: engine.describe() for role, engine in spec.engines}


@pytest.mark.parametrize("path,values", GOLDEN, ids=lambda v: getattr(v, "name", None))
def test_golden_values_on_each_gpu_class(path, values):
    assert tuple(explain(path, gpus).value for gpus in GPUS) == values


def test_megatron_example_by_path_follows_its_defaults_chain():
    # Only the parent has policy.generation and the DTensor section's keys.
    assert engines(MEGATRON_TP2) == {
        "policy": "megatron TP=2 CP=1 checked by megatron-bridge",
        "generation": "vllm",
    }
    assert explain(MEGATRON_TP2, "9.0").value == "1"
    assert explain(MEGATRON_TP2, "10.0").value is None


def test_dtensor_example_never_gives_1_and_replaces_an_inherited_1():
    for gpus in GPUS:
        assert explain(DTENSOR, gpus).value is None
        assert explain(DTENSOR, gpus, node_value="1").value == "8"


def test_recipe_in_a_subfolder_resolves_mul_and_reads_every_key():
    spec, _ = load_spec(RECIPE)
    policy = dict(spec.engines)["policy"]
    assert (policy.tensor_parallel, policy.context_parallel, policy.expert_parallel) == (2, 2, 8)
    assert policy.checks == (MEGATRON_BRIDGE_CHECK,)
    assert not policy.megatron_fsdp and not policy.torch_fsdp2 and not policy.moe_overlap


def test_a_nemo_rl_dictconfig_and_a_plain_dict_read_the_same():
    composed = compose(str(MEGATRON_TP2), OmegaConf.load(MEGATRON_TP2))
    assert isinstance(composed, type(OmegaConf.create({})))
    as_dict = OmegaConf.to_container(composed, resolve=True)
    expected = {"policy": "megatron TP=2 CP=1 checked by megatron-bridge", "generation": "vllm"}
    assert engines(composed) == engines(as_dict) == expected
    assert explain(as_dict, "9.0").value == "1"


def test_override_marker_replaces_the_parent_section():
    assert engines(OVERRIDE) == {"policy": "automodel"}


def test_sft_has_no_generation_role():
    assert engines(SFT) == {"policy": "megatron TP=4 CP=1 checked by megatron-bridge"}


def test_distillation_teacher_through_the_yaml_anchor():
    spec, _ = load_spec(DISTILLATION)
    found = dict(spec.engines)
    assert found["policy"].strategy == "fsdp2" and found["policy"].kind == FSDP  # _v2: false
    assert (found["teacher"].kind, found["teacher"].tensor_parallel,
            found["teacher"].context_parallel) == (MEGATRON, 2, 2)
    assert explain(DISTILLATION, "9.0", role="policy").value is None
    assert explain(DISTILLATION, "9.0", role="teacher").value == "1"


def test_ppo_value_model_is_the_critic_role():
    assert engines(PPO)["value"] == "megatron TP=2 CP=1 checked by megatron-bridge"


def test_vllm_workers_are_recognised_by_the_variable_nemo_rl_sets():
    spec, _ = load_spec(RECIPE)
    vllm_worker, how = spec.for_process({"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "RANK": "0"})
    assert vllm_worker.roles() == ("generation",) and "VLLM_ENABLE_V1_MULTIPROCESSING" in how
    policy_worker, _ = spec.for_process({"RANK": "0", "WORLD_SIZE": "16"})
    assert policy_worker.roles() == ("policy",)
    # The field the driver ships carries the rule, and the agent parses it back.
    field = build_runtime_env(RECIPE)["megatron_env"]
    assert field["processes"] == [{"roles": ["generation"],
                                   "variable": "VLLM_ENABLE_V1_MULTIPROCESSING", "prefix": "0"}]
    assert field["others"] == ["policy"]


def test_colocated_megatron_generation_is_not_a_separate_engine():
    spec, _ = load_spec(MCORE_GEN_COLOCATED)
    assert spec.roles() == ("policy",)
    assert "generation" in dict(spec.omitted)
    with pytest.raises(FieldValueError, match="policy's Megatron workers"):
        explain(MCORE_GEN_COLOCATED, "9.0", role="generation")


def test_non_colocated_megatron_generation_merges_its_overrides():
    assert engines(MCORE_GEN_SEPARATE) == {
        "policy": "megatron TP=1 CP=1 checked by megatron-bridge",
        "generation": "megatron TP=2 CP=1 checked by megatron-bridge",
    }
    assert not load_spec(MCORE_GEN_SEPARATE)[0].processes  # both run MegatronPolicyWorker


def test_moe_overlap_through_model_overrides_asks_for_32():
    config = _plain(MEGATRON_TP2)
    config["policy"]["megatron_cfg"]["model_overrides"] = {
        "overlap_moe_expert_parallel_comm": True}
    assert dict(load_spec(config)[0].engines)["policy"].moe_overlap
    assert explain(config, "9.0").value == "32"
    assert explain(config, "10.0").value == "32"


# NeMo-RL merges model_overrides into the Megatron-Bridge provider
# (nemo_rl/models/megatron/setup.py, _merge_model_overrides), Bridge passes
# pipeline_model_parallel_comm_backend to initialize_model_parallel
# (training/initialize.py), and Megatron-Core then asserts the value is not
# "1" when it is set (parallel_state.py, "UCC-backend requires
# CUDA_DEVICE_MAX_CONNECTIONS > 1"). TP=2 alone asks "1" before Blackwell,
# required only where Megatron-LM's validate_args runs, which NeMo-RL never
# calls; so UCC's required "not 1" wins: left unset.
@pytest.mark.parametrize("gpus", GPUS)
def test_a_ucc_pipeline_in_model_overrides_never_gets_1(gpus):
    config = _plain(MEGATRON_TP2)
    config["policy"]["megatron_cfg"]["model_overrides"] = {
        "pipeline_model_parallel_comm_backend": "ucc"}
    policy = dict(load_spec(config)[0].engines)["policy"]
    assert (policy.tensor_parallel, policy.pipeline_backend) == (2, "ucc")
    decision = explain(config, gpus, role="policy")
    assert decision.value is None
    assert decision.satisfied


@pytest.mark.parametrize("gpus,value", [("8.0", "1"), ("9.0", "1"), ("10.0", None)])
def test_without_ucc_the_same_config_still_gets_1_before_blackwell(gpus, value):
    config = _plain(MEGATRON_TP2)
    config["policy"]["megatron_cfg"]["model_overrides"] = {
        "pipeline_model_parallel_comm_backend": "nccl"}
    assert explain(config, gpus, role="policy").value == value
    del config["policy"]["megatron_cfg"]["model_overrides"]
    assert explain(config, gpus, role="policy").value == value


@pytest.mark.parametrize("key,value", [
    ("tensor_model_parallel_size", 1), ("context_parallel_size", 2),
    ("expert_model_parallel_size", 4), ("moe_token_dispatcher_type", "flex"),
    ("moe_flex_dispatcher_backend", "hybridep"), ("moe_enable_deepep", True),
])
def test_a_first_class_setting_in_model_overrides_is_refused_as_nemo_rl_does(key, value):
    config = _plain(MEGATRON_TP2)
    config["policy"]["megatron_cfg"]["model_overrides"] = {key: value}
    with pytest.raises(FieldValueError) as error:
        load_spec(config)
    assert (f"policy.megatron_cfg.model_overrides.{key} conflicts with "
            f"policy.megatron_cfg.{key}") in str(error.value)


def test_a_generation_config_model_overrides_replaces_the_policys():
    config = _plain(MCORE_GEN_SEPARATE)
    config["policy"]["megatron_cfg"]["model_overrides"] = {
        "pipeline_model_parallel_comm_backend": "ucc"}
    engines = dict(load_spec(config)[0].engines)
    assert engines["policy"].pipeline_backend == "ucc"
    # mcore_generation_config is shallow-merged: its own model_overrides wins whole
    config["policy"]["generation"]["mcore_generation_config"]["model_overrides"] = {}
    assert dict(load_spec(config)[0].engines)["generation"].pipeline_backend is None


def test_a_trtllm_generation_carries_its_tensor_parallel_size():
    config = _plain(DTENSOR)
    config["policy"]["generation"]["backend"] = "trtllm"
    config["policy"]["generation"]["trtllm_cfg"] = {"tensor_parallel_size": 8}
    assert dict(load_spec(config)[0].engines)["generation"].tensor_parallel == 8


def test_use_custom_fsdp_is_not_read_because_nemo_rl_never_passes_it_on():
    config = _plain(MEGATRON_TP2)
    config["policy"]["megatron_cfg"]["distributed_data_parallel_config"]["use_custom_fsdp"] = True
    assert not dict(load_spec(config)[0].engines)["policy"].megatron_fsdp


@pytest.mark.parametrize("backend,strategy", [("vllm", "vllm"), ("sglang", "sglang"),
                                              ("trtllm", "trtllm"), ("dynamo", "dynamo")])
def test_inference_backends(backend, strategy):
    config = _plain(DTENSOR)
    config["policy"]["generation"]["backend"] = backend
    spec, _ = load_spec(config)
    generation = dict(spec.engines)["generation"]
    assert (generation.strategy, generation.kind) == (strategy, INFERENCE)
    # vLLM workers and SGLang engine actors carry a variable NeMo-RL sets for
    # them alone; TRT-LLM's and Dynamo's workers carry none.
    assert bool(spec.processes) == (backend in ("vllm", "sglang"))


def test_registered_and_detected_without_colliding_with_verl():
    assert READER in readers()
    assert reader_for(_plain(DTENSOR)).name == "nemo-rl"
    assert load_spec(DTENSOR)[0].framework == "nemo-rl"


# ------------------------------------------------------------------ composition

def test_hydra_defaults_lists_are_not_composed(tmp_path):
    path = tmp_path / "verl_style.yaml"
    path.write_text("defaults:\n  - actor@actor_rollout_ref.actor: dp_actor\n  - _self_\n"
                    "actor_rollout_ref: {}\n")
    loaded = OmegaConf.load(path)
    assert compose(str(path), loaded) is None
    assert compose_yaml(str(path), loaded) is loaded


def test_a_file_without_defaults_is_left_alone():
    assert compose(str(DTENSOR), OmegaConf.load(DTENSOR)) is None


def test_a_missing_parent_names_the_file_and_the_chain(tmp_path):
    (tmp_path / "child.yaml").write_text("defaults: middle.yaml\n")
    (tmp_path / "middle.yaml").write_text("defaults: [gone.yaml]\npolicy: {}\n")
    with pytest.raises(FieldValueError) as info:
        load_spec(tmp_path / "child.yaml")
    message = str(info.value)
    assert "gone.yaml" in message and "child.yaml -> " in message and "middle.yaml -> " in message


def test_a_defaults_loop_is_an_error(tmp_path):
    (tmp_path / "a.yaml").write_text("defaults: b.yaml\n")
    (tmp_path / "b.yaml").write_text("defaults: a.yaml\n")
    with pytest.raises(FieldValueError, match="loops"):
        load_spec(tmp_path / "a.yaml")


def test_later_parents_win_and_the_child_wins_over_all(tmp_path):
    (tmp_path / "one.yaml").write_text(DTENSOR.read_text())
    (tmp_path / "two.yaml").write_text(
        "policy:\n  dtensor_cfg: {enabled: false}\n  megatron_cfg: {enabled: true, "
        "tensor_model_parallel_size: 4, context_parallel_size: 1, "
        "expert_model_parallel_size: 1}\n")
    (tmp_path / "child.yaml").write_text(
        "defaults: [one.yaml, two.yaml]\npolicy:\n  megatron_cfg:\n"
        "    context_parallel_size: 2\n")
    assert engines(tmp_path / "child.yaml")["policy"] == \
        "megatron TP=4 CP=2 checked by megatron-bridge"


# ------------------------------------------------------------------------ errors

def _plain(path):
    return OmegaConf.to_container(compose_yaml(str(path), OmegaConf.load(path)), resolve=True)


def _set(config, dotted, value):
    *parents, last = dotted.split(".")
    node = config
    for part in parents:
        node = node[part]
    if value is _DELETE:
        del node[last]
    else:
        node[last] = value


_DELETE = object()


@pytest.mark.parametrize("path,key,value,error,words", [
    (DTENSOR, "policy.megatron_cfg.enabled", True, FieldValueError,
     ["policy.megatron_cfg.enabled", "policy.dtensor_cfg.enabled", "both"]),
    (DTENSOR, "policy.dtensor_cfg.enabled", False, FieldValueError,
     ["policy.megatron_cfg.enabled", "policy.dtensor_cfg.enabled", "neither"]),
    (DISTILLATION, "teacher.dtensor_cfg.enabled", True, FieldValueError,
     ["teacher.megatron_cfg.enabled", "teacher.dtensor_cfg.enabled"]),
    (MEGATRON_TP2, "policy.megatron_cfg.tensor_model_parallel_size", _DELETE, FieldValueError,
     ["policy.megatron_cfg.tensor_model_parallel_size", "missing"]),
    (MEGATRON_TP2, "policy.megatron_cfg.context_parallel_size", 0, FieldValueError,
     ["policy.megatron_cfg.context_parallel_size"]),
    (MEGATRON_TP2, "policy.megatron_cfg.tensor_model_parallel_size", "2", FieldTypeError,
     ["policy.megatron_cfg.tensor_model_parallel_size"]),
    (MEGATRON_TP2, "policy.megatron_cfg.enabled", "yes", FieldTypeError,
     ["policy.megatron_cfg.enabled", "true or false"]),
    (MEGATRON_TP2, "policy.megatron_cfg.model_overrides",
     {"overlap_moe_expert_parallel_comm": "on"}, FieldTypeError,
     ["policy.megatron_cfg.model_overrides.overlap_moe_expert_parallel_comm"]),
    (MEGATRON_TP2, "policy.megatron_cfg.model_overrides",
     {"pipeline_model_parallel_comm_backend": "mpi"}, FieldValueError,
     ["policy.megatron_cfg.model_overrides.pipeline_model_parallel_comm_backend", "ucc"]),
    (DTENSOR, "policy.generation.backend", "hf", FieldValueError,
     ["policy.generation.backend", "'hf'", "vllm", "megatron"]),
    (DTENSOR, "policy.generation.backend", "megatron", FieldValueError,
     ["policy.generation.backend", "policy.megatron_cfg.enabled"]),
    (MCORE_GEN_COLOCATED, "policy.generation.colocated", {}, FieldTypeError,
     ["policy.generation.colocated.enabled"]),
    (DTENSOR, "policy.dtensor_cfg", [1], FieldTypeError, ["policy.dtensor_cfg", "a mapping"]),
    (DTENSOR, "teachers", {"a": 1}, FieldTypeError, ["teachers"]),
])
def test_bad_values_name_the_key(path, key, value, error, words):
    config = _plain(path)
    if key == "teachers":
        config[key] = value
    else:
        _set(config, key, value)
    with pytest.raises(error) as info:
        load_spec(config)
    message = str(info.value)
    assert message.startswith("megatron_env: ")
    for word in words:
        assert word in message


def test_worker_env_vars_in_the_config_are_not_read():
    # megatron_cfg.env_vars reach the workers' runtime_env env_vars; the
    # plugin sees a CUDA_DEVICE_MAX_CONNECTIONS there as the user's own.
    assert engines(RECIPE)["policy"].startswith("megatron TP=2 CP=2")


# --- Issue 17: SGLang engine actors, OPD teachers, a dedicated inference model -----

def test_sglang_engine_actors_are_told_apart_from_the_megatron_policy():
    # Megatron TP=2 policy: 1 below major 10. SGLang (inference) asks "not 1":
    # its engine actors carry SGL_DISABLE_TP_MEMORY_INBALANCE_CHECK=true
    # (sglang_generation.py) and get nothing set; everything else gets 1.
    sglang_actor = {"SGL_DISABLE_TP_MEMORY_INBALANCE_CHECK": "true"}
    engine = explain(MEGATRON_SGLANG, "9.0", worker_env=sglang_actor)
    assert engine.value is None and "generation process" in engine.reason
    assert explain(MEGATRON_SGLANG, "9.0").value == "1"  # a policy worker
    assert explain(MEGATRON_SGLANG, "10.0").value is None
    assert build_runtime_env(MEGATRON_SGLANG)["megatron_env"]["processes"] == [
        {"roles": ["generation"], "variable": "SGL_DISABLE_TP_MEMORY_INBALANCE_CHECK",
         "prefix": "true"}]


def test_non_colocated_opd_teachers_are_read_once_per_checkpoint():
    assert engines(OPD_TEACHERS) == {
        "policy": "megatron TP=2 CP=1 checked by megatron-bridge",
        "generation": "vllm",
        "opd_teachers.default_teacher": "megatron TP=1 CP=1 checked by megatron-bridge",
        "opd_teachers.code_teacher": "megatron TP=4 CP=1 checked by megatron-bridge",
    }
    # The TP=4 teacher asks 1 on its own (its worker group has no marker).
    spec = build_runtime_env(OPD_TEACHERS, role="opd_teachers.code_teacher")
    assert explain(spec["megatron_env"], "9.0").value == "1"


def test_opd_teachers_are_not_read_unless_both_switches_are_on():
    config = _plain(OPD_TEACHERS)
    config["on_policy_distillation"]["non_colocated_teachers"]["enabled"] = False
    assert not any(role.startswith("opd_teachers") for role in engines(config))
    config = _plain(OPD_TEACHERS)
    config["on_policy_distillation"]["enabled"] = False
    assert not any(role.startswith("opd_teachers") for role in engines(config))


def test_a_bad_opd_teacher_size_names_its_key():
    config = _plain(OPD_TEACHERS)
    config["on_policy_distillation"]["non_colocated_teachers"]["teacher_overrides"][
        "code_teacher"]["tensor_model_parallel_size"] = 0
    with pytest.raises(FieldValueError, match=r"teacher_overrides\.code_teacher\."
                                              r"tensor_model_parallel_size"):
        load_spec(config)


def test_colocated_megatron_generation_with_its_own_layout_is_read():
    # TP=1 training, TP=2 inference model in the same workers: 1 below 10.
    assert engines(MCORE_GEN_DEDICATED) == {
        "policy": "megatron TP=1 CP=1 checked by megatron-bridge",
        "generation": "megatron TP=2 CP=1 checked by megatron-bridge",
    }
    assert [explain(MCORE_GEN_DEDICATED, gpus).value for gpus in GPUS] == ["1", "1", None, "1"]


def test_a_megatron_reward_model_environment_is_refused():
    config = _plain(DTENSOR)
    config["env"] = {"reward_model": {"megatron_cfg": {
        "enabled": True, "tensor_model_parallel_size": 1, "context_parallel_size": 1,
        "expert_model_parallel_size": 1}, "dtensor_cfg": {"enabled": False}}}
    with pytest.raises(FieldValueError, match=r"env\.reward_model\.megatron_cfg\.enabled is "
                                              r"true, but .* only on DTensor"):
        load_spec(config)


def test_an_eval_config_points_to_the_compact_form(tmp_path):
    # examples/configs/evals/eval.yaml's top level: eval, generation, tokenizer,
    # data, env, cluster.
    path = tmp_path / "eval.yaml"
    path.write_text("eval:\n  num_tests_per_prompt: 1\ngeneration:\n  backend: vllm\n"
                    "tokenizer:\n  name: x\ndata:\n  max_input_seq_length: 1\nenv: {}\n"
                    "cluster:\n  gpus_per_node: 1\n")
    with pytest.raises(FieldValueError, match=r"NeMo-RL evaluation config .* compact form"):
        load_spec(path)


def test_role_messages_use_nemo_rls_own_terms():
    with pytest.raises(FieldValueError) as info:
        build_runtime_env(SFT, role="nope")
    assert "teachers.<i>" in str(info.value) and "opd_teachers.<alias>" in str(info.value)
    with pytest.raises(FieldValueError) as info:
        build_runtime_env(SFT, role="value")
    assert "not enabled in this nemo-rl config" in str(info.value)
    assert "enable: false" not in str(info.value)


def test_a_conflict_under_nemo_rl_says_where_a_per_role_env_would_go():
    # NeMo-RL builds each worker group's runtime env in its own code
    # (nemo_rl/distributed/worker_groups.py): "use role=" alone does not apply.
    from ray_megatron_env import explain

    engines = {"policy": {"strategy": "megatron", "tensor_parallel": 2},
               "teacher": {"strategy": "fsdp"}}
    nemo = explain({"version": 2, "framework": "nemo-rl", "engines": engines}, "9.0")
    assert nemo.value == "1" and len(nemo.warnings) == 1
    assert "NeMo-RL builds each worker group's runtime env itself" in nemo.warnings[0]
    assert "role='teacher'" not in nemo.warnings[0]
    plain = explain({"version": 2, "engines": engines}, "9.0")
    assert "build_runtime_env(config, role='teacher')" in plain.warnings[0]
