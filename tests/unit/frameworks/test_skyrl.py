"""The SkyRL reader on SkyRL's own example launches, decided per node offline.

The fixtures are the override lines of SkyRL's examples/train/megatron/*.sh
(NovaSky-AI/SkyRL @ a9564572; each file names its script). The expected
values are written by hand from the issue's table and SkyRL's sources, never
computed by the code under test.
"""

import json
import logging
from pathlib import Path

import pytest

from deciding import decided
from ray_megatron_env.agent import NodeAgent
from ray_megatron_env.cache import ProbeCache
from ray_megatron_env.cli import OK, main
from ray_megatron_env.errors import FieldValueError
from ray_megatron_env.explanation import explain
from ray_megatron_env.frameworks.loading import load_spec
from ray_megatron_env.node import NodeGpus
from ray_megatron_env.runtime_env import build_runtime_env
from paths import FIXTURES

FIXTURES = FIXTURES / "skyrl"
VARIABLE = "CUDA_DEVICE_MAX_CONNECTIONS"
GPUS = ("8.0", "9.0", "10.0")  # A100, H100, B200
UNSET = (None, None, None)
ONE_BEFORE_10 = ("1", "1", None)

# script -> (engines by role, omitted roles, SkyRL's "1" replaced?, value on GPUS)
GOLDEN = {
    "run_megatron.txt": (
        {"policy": "megatron TP=2 CP=1", "ref": "megatron TP=2 CP=1",
         "inference_engine": "vllm"}, set(), True, ONE_BEFORE_10),
    "run_megatron_qwen3-30b-a3b.txt": (
        {"policy": "megatron TP=4 CP=1 EP=8", "ref": "megatron TP=4 CP=1 EP=8",
         "inference_engine": "vllm TP=8"}, set(), True, ONE_BEFORE_10),
    # examples.train.algorithms.dapo.main_dapo: trainer.algorithm.overlong_buffer_*
    # are DAPO's own keys; use_kl_loss=false, so no ref.
    "run_megatron_dapo_qwen3_4b.txt": (
        {"policy": "megatron TP=4 CP=1", "inference_engine": "vllm TP=2"}, {"ref"}, True,
        ONE_BEFORE_10),
    "run_megatron_lora_qwen3-0.6b.txt": (
        {"policy": "megatron TP=1 CP=1", "ref": "megatron TP=1 CP=1",
         "inference_engine": "vllm"}, set(), True, UNSET),
    "run_megatron_grpo_glm4_7_30b.txt": (
        {"policy": "megatron TP=1 CP=1 EP=8", "inference_engine": "vllm TP=4"}, {"ref"}, True,
        UNSET),
    "run_fsdp_baseline.txt": (
        {"policy": "fsdp2", "ref": "fsdp2", "inference_engine": "vllm"}, set(), False, UNSET),
}


def path(name):
    return str(FIXTURES / name)


def spec_of(config):
    return load_spec(config)[0]


def args_of(name):
    """The fixture as the entry point's argv (what the shell would pass)."""
    import shlex

    return shlex.split(Path(path(name)).read_text().replace("\\\n", " "), comments=True)


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_engines_omitted_roles_and_replaces(name):
    engines, omitted, replaced, _ = GOLDEN[name]
    spec = spec_of(path(name))
    assert {role: e.describe() for role, e in spec.engines} == engines
    assert set(dict(spec.omitted)) == omitted
    assert spec.framework == "skyrl"
    assert spec.replaces == ("1" if replaced else None)
    assert all(e.checks == () for _, e in spec.engines)  # no validate_args: preferences


@pytest.mark.parametrize("name,gpus", [(n, g) for n in sorted(GOLDEN) for g in GPUS])
def test_value_per_gpu_class(name, gpus):
    assert explain(path(name), gpus).value == GOLDEN[name][3][GPUS.index(gpus)]


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_the_argv_reads_as_the_file(name):
    assert spec_of(args_of(name)) == spec_of(path(name))
    assert build_runtime_env(args_of(name))["megatron_env"] == \
        build_runtime_env(path(name))["megatron_env"]


@pytest.mark.parametrize("name,gpus", [(n, g) for n in sorted(GOLDEN) for g in GPUS])
def test_skyrls_one_in_the_job_env(name, gpus):
    """SkyRL's "1" (every process of a Megatron job) is decided anew; an
    FSDP job's "1" is the user's, kept."""
    spec = spec_of(path(name))
    decision = decided(spec, NodeGpus.known([tuple(map(int, gpus.split(".")))], "fake"),
                       explicit="1")
    if GOLDEN[name][2]:
        assert decision.value == GOLDEN[name][3][GPUS.index(gpus)]
    else:
        assert decision.value == "1" and decision.source == "explicit"


def agent_on(capability):
    return NodeAgent(ProbeCache(lambda: NodeGpus.known([capability], "fake")))


@pytest.mark.parametrize("name,capability,expected", [
    ("run_megatron.txt", (9, 0), "1"),
    ("run_megatron.txt", (10, 0), None),
    ("run_megatron_lora_qwen3-0.6b.txt", (9, 0), None),
    ("run_fsdp_baseline.txt", (10, 0), "1"),
])
def test_agent_on_the_job_env_skyrl_passes_to_ray_init(name, capability, expected):
    # What a worker sees: SkyRL's env_vars from initialize_ray, merged with
    # the submitted job env that build_runtime_env gave.
    runtime_env = build_runtime_env(args_of(name))
    env_vars = {VARIABLE: "1", "VLLM_USE_V1": "1"}
    agent_on(capability).decide_and_write(runtime_env, env_vars, {}, logging.getLogger("t"))
    assert env_vars.get(VARIABLE) == expected


def test_the_warning_when_roles_want_different_values():
    mixed = explain(path("run_megatron.txt"), "9.0")
    assert mixed.value == "1" and len(mixed.warnings) == 1
    assert "inference_engine" in mixed.warnings[0]


BASE = ["trainer.strategy=megatron", "generator.inference_engine.num_engines=2"]
MCORE = "trainer.policy.megatron_config"


def read(*extra):
    return dict(spec_of([*BASE, *extra]).engines)


def test_defaults_when_the_overrides_say_nothing():
    # TrainerConfig.strategy "fsdp"; use_kl_loss true; vLLM, TP 1, one engine.
    spec = spec_of(["trainer.policy.model.path=Qwen/Qwen3-0.6B"])
    assert {r: e.describe() for r, e in spec.engines} == {
        "policy": "fsdp2", "ref": "fsdp2", "inference_engine": "vllm"}
    assert spec.replaces is None
    # MegatronConfig sizes 1, dispatcher alltoall (not flex).
    policy = read()["policy"]
    assert (policy.tensor_parallel, policy.context_parallel, policy.expert_parallel,
            policy.dispatcher, policy.moe_overlap) == (1, 1, 1, None, False)


def test_the_ref_has_its_own_sizes():
    engines = read(f"{MCORE}.tensor_model_parallel_size=4",
                   "trainer.ref.megatron_config.context_parallel_size=2")
    assert engines["policy"].describe() == "megatron TP=4 CP=1"
    assert engines["ref"].describe() == "megatron TP=1 CP=2"


def test_the_ref_exists_for_kl_in_the_loss_or_the_reward():
    assert "ref" not in read("trainer.algorithm.use_kl_loss=false")
    assert "ref" in read("trainer.algorithm.use_kl_loss=false",
                         "trainer.algorithm.use_kl_in_reward=true")


def test_moe_overlap_and_flex_dispatcher_are_read_from_transformer_config_kwargs():
    kw = f"{MCORE}.transformer_config_kwargs"
    policy = read(f"{MCORE}.tensor_model_parallel_size=2",
                  f"{MCORE}.expert_model_parallel_size=8",
                  f"{kw}.overlap_moe_expert_parallel_comm=true")["policy"]
    assert policy.moe_overlap is True
    # The kwarg's dispatcher type wins over the first-class one (set after it).
    assert read(f"{MCORE}.moe_token_dispatcher_type=alltoall",
                f"{kw}.moe_token_dispatcher_type=flex")["policy"].dispatcher == "deepep"
    assert read(f"{MCORE}.moe_token_dispatcher_type=flex",
                f"{kw}.moe_flex_dispatcher_backend=hybridep")["policy"].dispatcher == "hybridep"
    assert read(f"{MCORE}.moe_token_dispatcher_type=flex")["policy"].dispatcher == "deepep"


def test_moe_overlap_changes_the_value():
    # Megatron-LM's validate_args row: TP>1 before Blackwell asks 1, unless MoE
    # A2A overlap is on; hand-checked against docs/rules.md.
    kw = f"{MCORE}.transformer_config_kwargs"
    overlap = [*BASE, "trainer.algorithm.use_kl_loss=false",
               "generator.inference_engine.external_server_urls=['http://10.0.0.9:8000']",
               f"{MCORE}.tensor_model_parallel_size=2", f"{MCORE}.expert_model_parallel_size=8"]
    assert explain(overlap, "9.0").value == "1"
    assert explain([*overlap, f"{kw}.overlap_moe_expert_parallel_comm=true"], "9.0").value \
        != "1"


@pytest.mark.parametrize("key", ["tensor_model_parallel_size", "context_parallel_size",
                                 "expert_model_parallel_size"])
def test_a_size_in_transformer_config_kwargs_is_refused_by_name(key):
    with pytest.raises(FieldValueError) as info:
        read(f"{MCORE}.transformer_config_kwargs.{key}=2")
    assert f"{MCORE}.transformer_config_kwargs.{key}" in str(info.value)
    assert f"{MCORE}.{key}" in str(info.value)


@pytest.mark.parametrize("typo,meant", [
    ("trainer.stratgy=megatron", "trainer.strategy"),
    (f"{MCORE}.tensor_model_paralel_size=2", f"{MCORE}.tensor_model_parallel_size"),
    ("generator.inference_engine.num_engine=2", "generator.inference_engine.num_engines"),
    ("trainer.algorithm.use_kl_los=false", "trainer.algorithm.use_kl_loss"),
    ("trainer.ref.megatron_confg.tensor_model_parallel_size=2", "trainer.ref.megatron_config"),
])
def test_a_misspelt_key_that_is_read_is_refused_with_a_hint(typo, meant):
    with pytest.raises(FieldValueError) as info:
        spec_of([*BASE, typo])
    assert meant in str(info.value)


def test_a_misspelt_top_level_key_in_the_overrides_is_named():
    with pytest.raises(FieldValueError, match="'generatr' .SkyRL's 'generator'"):
        spec_of(["trainer.strategy=megatron", "generatr.inference_engine.num_engines=2"])


def test_keys_not_read_are_ignored():
    # DAPO's algorithm keys, SkyRL's other Megatron keys, main_base's peeked
    # override_entrypoint: none stops the reader.
    engines = read("trainer.algorithm.overlong_buffer_len=4096",
                   f"{MCORE}.pipeline_model_parallel_size=2",
                   f"{MCORE}.expert_tensor_parallel_size=1",
                   "generator.inference_engine.data_parallel_size=2",
                   "trainer.override_entrypoint=my.entrypoint")
    assert engines["policy"].describe() == "megatron TP=1 CP=1"


def test_a_critic_is_fsdp_and_refused_under_megatron():
    spec = spec_of(["trainer.strategy=fsdp", "trainer.critic.model.path=Qwen/Qwen3-0.6B"])
    assert dict(spec.engines)["critic"].describe() == "fsdp2"
    with pytest.raises(FieldValueError, match="trainer.critic.model.path"):
        read("trainer.critic.model.path=Qwen/Qwen3-0.6B")


@pytest.mark.parametrize("external", [
    "generator.inference_engine.external_proxy_url=http://10.0.0.9:40859",
    "generator.inference_engine.external_server_urls=['http://10.0.0.9:8000']"])
@pytest.mark.parametrize("locally", ["true", "false"])
def test_engines_not_started_here(external, locally):
    # build_new_inference_client (inference_servers/setup.py): either URL set
    # means external servers, whatever run_engines_locally says.
    spec = spec_of([*BASE, f"generator.inference_engine.run_engines_locally={locally}",
                    external])
    assert "inference_engine" not in dict(spec.engines)
    assert external.split("=")[0] in dict(spec.omitted)["inference_engine"]


def test_run_engines_locally_false_without_servers_is_refused():
    # validate_cfg (_validate_new_inference_cfg) refuses it.
    with pytest.raises(FieldValueError, match="run_engines_locally is false without"):
        spec_of([*BASE, "generator.inference_engine.run_engines_locally=false"])


def test_bad_values_are_named():
    with pytest.raises(FieldValueError, match="trainer.strategy"):
        spec_of(["trainer.strategy=megatorn"])
    with pytest.raises(FieldValueError, match="generator.inference_engine.backend"):
        spec_of(["generator.inference_engine.backend=sglang"])
    with pytest.raises(FieldValueError, match=r"'\+' prefix"):
        spec_of(["+trainer.strategy=megatron"])


def test_a_nested_dict_and_yaml_read_as_the_overrides(tmp_path):
    overrides = [*BASE, f"{MCORE}.tensor_model_parallel_size=2"]
    nested = {"trainer": {"strategy": "megatron", "policy": {"megatron_config": {
        "tensor_model_parallel_size": 2}}}, "generator": {"inference_engine": {"num_engines": 2}}}
    import yaml

    file = tmp_path / "skyrl.yaml"
    file.write_text(yaml.safe_dump(nested))
    listed = tmp_path / "overrides.yaml"
    listed.write_text(yaml.safe_dump(overrides))
    assert spec_of(nested) == spec_of(overrides) == spec_of(str(file)) == spec_of(str(listed))


def test_other_lists_are_not_skyrls():
    slime = ["--actor-num-nodes", "1", "--tensor-model-parallel-size", "2"]
    assert spec_of(slime).framework == "slime"
    with pytest.raises(FieldValueError, match="command-line arguments"):
        spec_of(["actor_rollout_ref.actor.strategy=megatron", "trainer.n_gpus_per_node=8"])


# --- The SFT entry point (skyrl.train.main_sft) ---------------------------------------

def test_sft_defaults_and_overrides():
    # SFTConfig: strategy "megatron", megatron_config MegatronConfig(TP=2, PP=2).
    spec = spec_of(["model.path=Qwen/Qwen3-0.6B"])
    assert spec.framework == "skyrl-sft" and spec.replaces == "1"
    assert {r: e.describe() for r, e in spec.engines} == {"policy": "megatron TP=2 CP=1"}
    # An override of a megatron_config key builds MegatronConfig(**given):
    # the other sizes are then MegatronConfig's own 1.
    spec = spec_of(["megatron_config.context_parallel_size=2", "batch_size=8"])
    assert dict(spec.engines)["policy"].describe() == "megatron TP=1 CP=2"
    fsdp = spec_of(["strategy=fsdp", "model.path=Qwen/Qwen3-0.6B"])
    assert fsdp.replaces is None and dict(fsdp.engines)["policy"].describe() == "fsdp2"
    assert explain(["model.path=Qwen/Qwen3-0.6B"], "9.0").value == "1"
    assert explain(["model.path=Qwen/Qwen3-0.6B"], "10.0").value is None


# --- The command line ------------------------------------------------------------------

def test_explain_on_a_file_of_overrides(capsys):
    code = main(["explain", path("run_megatron_qwen3-30b-a3b.txt"), "--gpus", "8.0", "--json"])
    result = json.loads(capsys.readouterr().out)
    assert code == OK and result["value"] == "1"


def test_runtime_env_for_ray_job_submit(capsys):
    code = main(["runtime-env", "--json", "--", *args_of("run_megatron.txt")])
    env = json.loads(capsys.readouterr().out)
    assert code == OK
    assert env["megatron_env"]["replaces"] == "1"
    assert env["megatron_env"]["framework"] == "skyrl"
    assert env["env_vars"]["RAY_OVERRIDE_JOB_RUNTIME_ENV"] == "1"
    assert VARIABLE not in env["env_vars"]


def test_runtime_env_notes_a_value_skyrls_driver_sets_itself(capsys, tmp_path):
    base = tmp_path / "base.json"
    base.write_text(json.dumps({"env_vars": {"NCCL_CUMEM_ENABLE": "1", "HF_HOME": "/data"}}))
    code = main(["runtime-env", "--json", "--base", str(base), "--",
                 *args_of("run_megatron.txt")])
    out, err = capsys.readouterr()
    assert code == OK and "NCCL_CUMEM_ENABLE=0" in err and "HF_HOME" not in err
    assert json.loads(out)["env_vars"]["NCCL_CUMEM_ENABLE"] == "1"


# --- Through Ray's merge of the submitted env with SkyRL's ray.init env --------------

# What SkyRL's prepare_runtime_environment gives initialize_ray for a Megatron
# job with vLLM and nccl weight sync (skyrl/train/utils/utils.py), in part.
SKYRL_DRIVER_ENV = {"env_vars": {
    VARIABLE: "1", "NCCL_CUMEM_ENABLE": "0", "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
    "FLA_TILELANG": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "true",
    "VLLM_ALLOW_INSECURE_SERIALIZATION": "1", "VLLM_USE_V1": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}}


@pytest.mark.parametrize("under_uv_run", [True, False])
@pytest.mark.parametrize("capability,expected", [((9, 0), "1"), ((10, 0), None)])
def test_a_submitted_job_under_uv_run_and_without(monkeypatch, under_uv_run, capability,
                                                  expected):
    """ray.init in SkyRL's driver merges the submitted env (from
    `runtime-env`) with its own, the driver's winning (RAY_OVERRIDE_JOB_
    RUNTIME_ENV=1); under `uv run` Ray then calls its uv hook instead of
    RAY_RUNTIME_ENV_HOOK (ray/_private/worker.py, _maybe_modify_runtime_env),
    so nothing of this package runs in the driver. The field survives the
    merge either way, and each node decides over SkyRL's "1"."""
    from ray.runtime_env.runtime_env import _merge_runtime_env

    from ray_megatron_env.hook import runtime_env_hook
    from ray_megatron_env.names import JOB_CONFIG_VARIABLE
    from ray_megatron_env.job_submission import job_submission_env

    job, _ = job_submission_env(build_runtime_env(args_of("run_megatron.txt")), "skyrl")
    job = json.loads(json.dumps(job))
    for key, value in job["env_vars"].items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv(JOB_CONFIG_VARIABLE, json.dumps({"runtime_env": job}))
    merged = _merge_runtime_env(job, SKYRL_DRIVER_ENV, override=True)
    if not under_uv_run:
        merged = runtime_env_hook(merged)  # strict: SkyRL's keys differ from none submitted
    assert merged["megatron_env"]["replaces"] == "1"
    env_vars = dict(merged["env_vars"])
    assert env_vars[VARIABLE] == "1"  # SkyRL's, until the worker's node decides
    agent_on(capability).decide_and_write(merged, env_vars, {}, logging.getLogger("t"))
    assert env_vars.get(VARIABLE) == expected


# --- A SkyRLTrainConfig subclass's sections; an entry point's own options -------------

HARBOR = "run_codecontest.txt"  # main_harbor: HarborSkyRLConfig adds harbor_trial_config
MEGATRON_TP2 = ["trainer.strategy=megatron", f"{MCORE}.tensor_model_parallel_size=2"]


def test_a_subclass_section_is_named_in_the_record_and_not_read():
    spec = spec_of(path(HARBOR))
    # trainer.strategy=fsdp, use_kl_loss=false, vLLM TP=2 (4 engines)
    assert {r: e.describe() for r, e in spec.engines} == {
        "policy": "fsdp2", "inference_engine": "vllm TP=2"}
    assert set(dict(spec.omitted)) == {"harbor_trial_config", "ref"}
    assert "subclass" in dict(spec.omitted)["harbor_trial_config"]
    assert "harbor_trial_config" in explain(path(HARBOR), "9.0").reason


@pytest.mark.parametrize("gpus,value", [("8.0", "1"), ("9.0", "1"), ("10.0", None)])
def test_harbor_overrides_with_a_megatron_tp2_policy(gpus, value, tmp_path, capsys):
    """Through each way in: the argv, a file of its lines, a YAML list and
    `runtime-env --`: a Megatron TP=2 policy asks 1 below Blackwell, over
    SkyRL's own 1 (replaces)."""
    args = [*args_of(HARBOR), *MEGATRON_TP2]
    import yaml

    lines = tmp_path / "harbor.txt"
    lines.write_text(Path(path(HARBOR)).read_text() + " ".join(MEGATRON_TP2) + "\n")
    listed = tmp_path / "harbor.yaml"
    listed.write_text(yaml.safe_dump(args))
    assert spec_of(str(lines)) == spec_of(str(listed)) == spec_of(args)
    assert main(["runtime-env", "--json", "--", *args]) == OK
    field = json.loads(capsys.readouterr().out)["megatron_env"]
    assert field["replaces"] == "1" and "harbor_trial_config" in field["omitted"]
    assert explain(args, gpus, explicit="1").value == value


@pytest.mark.parametrize("typo,meant", [
    ("trainer.stratgy=megatron", "trainer.strategy"),
    ("generatr.inference_engine.num_engines=2", "'generatr' (SkyRL's 'generator'?)"),
])
def test_a_misspelt_skyrl_key_beside_a_subclass_section_is_still_refused(typo, meant):
    with pytest.raises(FieldValueError) as info:
        spec_of([*args_of(HARBOR), typo])
    assert meant in str(info.value)


VISGYM = "run_visgym_from_sft.txt"  # entrypoint.py: parse_known_args strips --env_variant


def test_an_entry_points_own_option_is_skipped_and_named():
    with pytest.warns(UserWarning, match="--env_variant sft skipped"):
        spec = spec_of(path(VISGYM))
    # strategy fsdp, use_kl_loss false, vLLM TP=1
    assert {r: e.describe() for r, e in spec.engines} == {
        "policy": "fsdp2", "inference_engine": "vllm"}
    with pytest.warns(UserWarning, match="--env_variant sft skipped"):
        assert spec_of(args_of(VISGYM)) == spec
        assert tuple(explain(args_of(VISGYM), gpus).value for gpus in GPUS) == UNSET


def test_a_word_that_is_neither_an_override_nor_an_option_is_named():
    with pytest.raises(FieldValueError, match="stop at 'entrypoint.py'"):
        spec_of(["entrypoint.py", *args_of(VISGYM)])


SIM = "run_fully_async_sim_gsm8k_e2e.txt"  # trainer.fully_async.simulate_training=true
SIM_EXTERNAL = "run_fully_async_sim_gsm8k_external.txt"


def test_simulated_training_starts_no_trainer_model():
    # BasePPOExp._setup_trainer skips build_models: only the vLLM engines run.
    spec = spec_of(path(SIM))
    assert {r: e.describe() for r, e in spec.engines} == {"inference_engine": "vllm"}
    assert "simulate_training" in dict(spec.omitted)["policy"]


@pytest.mark.parametrize("gpus", GPUS)
def test_simulated_training_under_megatron_replaces_skyrls_1(gpus):
    args = [*args_of(SIM), *MEGATRON_TP2]
    # SkyRL's 1 (prepare_runtime_environment, strategy megatron) in every
    # process; only vLLM runs, which asks "not 1": the 1 is removed.
    decision = explain(args, gpus, explicit="1")
    assert decision.value is None and spec_of(args).replaces == "1"
    # The same overrides without simulate_training train a TP=2 policy.
    real = [arg for arg in args if not arg.startswith("trainer.fully_async.simulate_training=")]
    assert explain(real, gpus, explicit="1").value == ONE_BEFORE_10[GPUS.index(gpus)]


def test_external_servers_and_a_simulated_trainer_start_nothing():
    spec = spec_of([*args_of(SIM_EXTERNAL), *MEGATRON_TP2])
    assert spec.engines == ()
    assert "external_proxy_url" in dict(spec.omitted)["inference_engine"]
    assert set(dict(spec.omitted)) == {"policy", "ref", "inference_engine"}
    assert explain([*args_of(SIM_EXTERNAL), *MEGATRON_TP2], "9.0", explicit="1").value is None
