"""Reading slime's arguments: the input forms, the engines and processes it
starts, the values on each GPU class, and the runtime-env verb for
``ray job submit``.

Expected values come from the rule table by hand (docs/rules.md): Megatron
with TP or CP > 1 asks "1" below compute capability 10 and nothing from 10
on, and slime's driver runs Megatron-LM's validate_args, so that "1" is
required; TP = CP = 1 asks nothing; SGLang and FSDP ask "not 1" (preferred),
which leaves the variable unset.
"""

import argparse
import json
from pathlib import Path

import pytest

from ray_megatron_env import build_runtime_env
from ray_megatron_env.cli import main
from ray_megatron_env.errors import FieldTypeError, FieldValueError
from ray_megatron_env.explanation import explain
from ray_megatron_env.node import parse_gpu_list
from ray_megatron_env.frameworks import parse_field
from ray_megatron_env.frameworks import slime
from ray_megatron_env.engines import FSDP, INFERENCE, MEGATRON, MEGATRON_LM_CHECK
from ray_megatron_env.frameworks.loading import load_spec

from deciding import UNSET, decided, shown
from paths import FIXTURES

FIXTURES = FIXTURES / "slime"
QWEN3_4B = FIXTURES / "run-qwen3-4B.args.json"
GLM4_9B = FIXTURES / "run-glm4-9B.args.json"
QWEN3_30B = FIXTURES / "run-qwen3-30B-A3B.args.json"
BASE_SFT = FIXTURES / "run-qwen3-4B-base-sft.args.json"
PPO = FIXTURES / "ppo-critic.args.json"
FSDP_BACKEND = FIXTURES / "run-qwen3-4B-fsdp.args.json"
NAMESPACE = FIXTURES / "namespace-qwen3-4B.yaml"

# What slime's own processes carry in their runtime_env (slime/ray/rollout.py
# for the SGLang engines, slime/ray/actor_group.py for the train actors), on
# top of a job env like the launch scripts' (CUDA_DEVICE_MAX_CONNECTIONS
# taken over, so absent).
JOB_ENV = {"PYTHONPATH": "/root/Megatron-LM/", "NCCL_NVLS_ENABLE": "1"}
SGLANG_ENGINE = {**JOB_ENV, "RAY_USE_UVLOOP": "0", "SGLANG_JIT_DEEPGEMM_PRECOMPILE": "false",
                 "SGL_DISABLE_TP_MEMORY_INBALANCE_CHECK": "true",
                 "SGLANG_MEMORY_SAVER_CUDA_GRAPH": "true",
                 "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}
TRAIN_ACTOR = {**JOB_ENV, "RAY_USE_UVLOOP": "0", "NCCL_CUMEM_ENABLE": "0",
               "NVTE_FP8_BLOCK_SCALING_FP32_SCALES": "1",
               "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}
DRIVER = dict(JOB_ENV)

GPUS = ("8.0", "9.0", "10.0", "9.0,10.0")
R = "1 (required)"

# (fixture, {gpus: value for the driver and train actors},
#  {gpus: value for the SGLang engines} or None when slime starts none)
GOLDEN = [
    (QWEN3_4B, dict(zip(GPUS, (R, R, UNSET, R))), dict.fromkeys(GPUS, UNSET)),
    (GLM4_9B, dict(zip(GPUS, (R, R, UNSET, R))), dict.fromkeys(GPUS, UNSET)),
    (QWEN3_30B, dict(zip(GPUS, (R, R, UNSET, R))), dict.fromkeys(GPUS, UNSET)),
    (BASE_SFT, dict.fromkeys(GPUS, UNSET), None),
    (PPO, dict(zip(GPUS, (R, R, UNSET, R))), dict.fromkeys(GPUS, UNSET)),
    (FSDP_BACKEND, dict.fromkeys(GPUS, UNSET), dict.fromkeys(GPUS, UNSET)),
    (NAMESPACE, dict(zip(GPUS, (R, R, UNSET, R))), dict.fromkeys(GPUS, UNSET)),
]


def args_of(path):
    return json.loads(Path(path).read_text())


def engines(config):
    spec, _ = load_spec(config)
    return {role: engine.describe() for role, engine in spec.engines}


def on_node(config, gpus, worker_env):
    """What a worker with these env_vars gets, through the compact form the
    driver ships (as the agent sees it)."""
    spec = parse_field(build_runtime_env(config)["megatron_env"])
    return decided(spec, parse_gpu_list(gpus), worker_env=worker_env)


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


# -- the golden table -------------------------------------------------------

@pytest.mark.parametrize("fixture,train,sglang", GOLDEN, ids=lambda v: getattr(v, "stem", ""))
@pytest.mark.parametrize("gpus", GPUS)
def test_golden_values_per_process(fixture, train, sglang, gpus):
    assert shown(on_node(fixture, gpus, DRIVER)) == train[gpus]
    assert shown(on_node(fixture, gpus, TRAIN_ACTOR)) == train[gpus]
    engine = on_node(fixture, gpus, SGLANG_ENGINE)
    if sglang is None:  # no SGLang engine: nothing tells the processes apart
        assert shown(engine) == train[gpus]
    else:
        assert shown(engine) == sglang[gpus]
        assert set(engine.engines) == {"rollout"}


# -- the done-when checks: scripts/run-qwen3-4B.sh ------------------------------

def test_qwen3_4b_is_a_required_1_before_blackwell_and_nothing_on_blackwell():
    args = args_of(QWEN3_4B)
    hopper = explain(args, "9.0")
    assert hopper.value == "1" and hopper.strengths["actor"] == "required" and hopper.satisfied
    assert "Megatron-LM's argument check" in hopper.because["actor"]
    blackwell = explain(args, "10.0")
    assert blackwell.value is None and blackwell.satisfied


def test_qwen3_4b_with_an_explicit_8_on_hopper_breaks_megatron_lms_check():
    decision = explain(args_of(QWEN3_4B), "9.0", explicit="8")
    assert decision.value == "8" and decision.source == "explicit"
    assert decision.satisfied is False
    assert any("Megatron-LM's argument check" in w for w in decision.warnings)


def test_explain_cli_exits_1_for_it(capsys):
    code, out, _ = run(capsys, "explain", QWEN3_4B, "--gpus", "9.0", "--explicit", "8")
    assert code == 1 and "PROBLEM" in out and "Megatron-LM's argument check" in out
    code, out, _ = run(capsys, "explain", QWEN3_4B, "--gpus", "10.0", "--explicit", "8")
    assert code == 0


def test_explain_cli_for_an_sglang_engine(capsys):
    code, out, _ = run(capsys, "explain", QWEN3_4B, "--gpus", "9.0", "--worker-env",
                       "SGL_DISABLE_TP_MEMORY_INBALANCE_CHECK=true")
    assert code == 0 and "CUDA_DEVICE_MAX_CONNECTIONS: unset" in out
    assert "rollout process" in out


# -- input forms ------------------------------------------------------------------

def test_every_input_form_reads_the_same(tmp_path):
    args = args_of(QWEN3_4B)
    expected = {"actor": "megatron TP=2 CP=1 checked by megatron-lm", "rollout": "sglang"}
    yaml_list = tmp_path / "args.yaml"
    yaml_list.write_text("".join(f"- {json.dumps(a)}\n" for a in args))
    parsed = slime.convert(args)
    for form in (args, tuple(args), QWEN3_4B, str(QWEN3_4B), yaml_list,
                 argparse.Namespace(**parsed), parsed, NAMESPACE):
        assert engines(form) == expected, form


def test_a_yaml_list_may_hold_numbers(tmp_path):
    path = tmp_path / "args.yaml"
    path.write_text("- --actor-num-nodes\n- 1\n- --tensor-model-parallel-size\n- 4\n")
    assert engines(path)["actor"].startswith("megatron TP=4")


def test_convert_types_the_keys_it_reads():
    out = slime.convert(["--actor-num-nodes", "2", "--tensor-model-parallel-size=4",
                         "--use-torch-fsdp2", "--rollout-external-engine-addrs", "a:1", "b:2"])
    assert out["actor_num_nodes"] == 2 and out["tensor_model_parallel_size"] == 4
    assert out["use_torch_fsdp2"] is True and out["use_megatron_fsdp"] is False
    assert out["context_parallel_size"] == 1  # Megatron-LM's default
    assert out["rollout_external_engine_addrs"] == ["a:1", "b:2"]


def test_a_repeated_option_keeps_its_last_value_as_argparse_does():
    out = slime.convert(["--colocate", "--tensor-model-parallel-size", "2",
                         "--tensor-model-parallel-size", "8"])
    assert out["tensor_model_parallel_size"] == 8


def test_look_alike_and_abbreviated_options_are_not_taken():
    out = slime.convert(["--colocate", "--tensor-model-parallel", "4",
                         "--sglang-context-parallel-size", "4", "--use-torch-fsdp2-extra"])
    assert out["tensor_model_parallel_size"] == 1 and out["context_parallel_size"] == 1
    assert out["use_torch_fsdp2"] is False


def test_help_in_the_list_does_not_exit():
    assert slime.convert(["--colocate", "-h"])["colocate"] is True


@pytest.mark.parametrize("args", [
    [],
    ["--lr", "1e-6"],
    ["train.py"],
    # Megatron-LM's own flags alone are any Megatron-LM script's, not slime's.
    ["--tensor-model-parallel-size", "2", "--sequence-parallel"],
])
def test_a_list_without_slimes_options_is_not_slimes(args):
    assert slime.convert(args) is None


def test_a_megatron_only_list_is_refused_with_the_frameworks_named():
    with pytest.raises(FieldValueError, match="command-line arguments .*slime"):
        build_runtime_env(["--tensor-model-parallel-size", "2"])


@pytest.mark.parametrize("args,words", [
    (["--colocate", "--tensor-model-parallel-size", "two"], "--tensor-model-parallel-size"),
    (["--colocate", "--context-parallel-size"], "--context-parallel-size"),
    (["--actor-num-nodes", "1.5"], "--actor-num-nodes"),
])
def test_a_bad_value_names_the_option(args, words):
    with pytest.raises(FieldValueError, match=words):
        slime.convert(args)


def test_a_zero_size_is_refused_with_the_key():
    with pytest.raises(FieldValueError, match="tensor_model_parallel_size"):
        build_runtime_env(["--colocate", "--tensor-model-parallel-size", "0"])


# -- markers ---------------------------------------------------------------------

def test_a_plain_megatron_lm_args_dict_is_not_claimed():
    megatron_only = {"tensor_model_parallel_size": 2, "context_parallel_size": 1,
                     "expert_model_parallel_size": 1, "sequence_parallel": True}
    with pytest.raises(FieldValueError, match="slime: one of actor_num_nodes"):
        build_runtime_env(megatron_only)


@pytest.mark.parametrize("marker", slime.MARKERS)
def test_each_marker_alone_says_slime(marker):
    config = {marker: 1, "tensor_model_parallel_size": 2, "context_parallel_size": 1,
              "expert_model_parallel_size": 1}
    assert parse_field(config).framework == "slime"


def test_a_dict_without_the_parallel_sizes_is_an_error_naming_them():
    with pytest.raises(FieldValueError, match="context_parallel_size, expert_model_parallel_size"):
        parse_field({"actor_num_nodes": 1, "tensor_model_parallel_size": 2})


@pytest.mark.parametrize("key,value,error", [
    ("tensor_model_parallel_size", "2", FieldTypeError),
    ("colocate", "yes", None),  # not read: never an error
    ("use_torch_fsdp2", "true", FieldTypeError),
    ("debug_train_only", 1, FieldTypeError),
    ("train_backend", "deepspeed", FieldValueError),
])
def test_bad_values_in_a_dict_name_the_key(key, value, error):
    config = {**slime.convert(args_of(QWEN3_4B)), key: value}
    if error is None:
        parse_field(config)
        return
    with pytest.raises(error, match=key if key != "train_backend" else "deepspeed"):
        parse_field(config)


# -- engines and processes ----------------------------------------------------------

def test_the_train_engine_carries_megatron_lms_check():
    spec, _ = load_spec(args_of(GLM4_9B))
    actor = dict(spec.engines)["actor"]
    assert actor.kind == MEGATRON and actor.checks == (MEGATRON_LM_CHECK,)
    assert (actor.tensor_parallel, actor.context_parallel) == (2, 2)
    assert dict(spec.engines)["rollout"].kind == INFERENCE


def test_sglang_engines_and_everything_else_are_told_apart():
    spec, _ = load_spec(args_of(QWEN3_4B))
    rule, miles = spec.processes
    assert rule.roles == ("rollout",) and rule.variable == "SGL_DISABLE_TP_MEMORY_INBALANCE_CHECK"
    assert miles.roles == ("rollout",) and miles.exact
    assert miles.variable == "SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK" and miles.prefix == "false"
    assert spec.others == ("actor",)
    for env, roles in ((SGLANG_ENGINE, ("rollout",)), (TRAIN_ACTOR, ("actor",)),
                       (DRIVER, ("actor",))):
        assert spec.for_process(env)[0].roles() == roles


def test_the_compact_form_round_trips():
    field = build_runtime_env(args_of(PPO))["megatron_env"]
    assert field["framework"] == "slime" and field["others"] == ["actor", "critic"]
    assert parse_field(field) == load_spec(args_of(PPO))[0]


def test_ppo_adds_a_critic_with_the_same_engine():
    assert engines(PPO) == {"actor": "megatron TP=1 CP=2 checked by megatron-lm",
                            "critic": "megatron TP=1 CP=2 checked by megatron-lm",
                            "rollout": "sglang"}


def test_no_critic_without_rollouts():
    assert "critic" not in engines([*args_of(PPO), "--num-rollout", "0"])


def test_debug_rollout_only_starts_no_train_actor_and_runs_no_check():
    spec, roles = load_spec([*args_of(PPO), "--debug-rollout-only"])
    assert spec.roles() == ("rollout",) and not spec.processes and spec.others is None
    assert set(dict(spec.omitted)) == {"actor", "critic"}
    with pytest.raises(FieldValueError, match="never started by slime"):
        build_runtime_env([*args_of(PPO), "--debug-rollout-only"], role="actor")
    assert explain([*args_of(PPO), "--debug-rollout-only"], "9.0").value is None


@pytest.mark.parametrize("extra,why", [
    (["--debug-train-only"], "debug_train_only"),
    (["--load-debug-rollout-data", "/data/rollout_{rollout_id}.pt"], "load_debug_rollout_data"),
    (["--rollout-external-engine-addrs", "10.0.0.1:30000"], "rollout_external_engine_addrs"),
    (["--rollout-num-gpus", "0"], "rollout_num_gpus 0"),
])
def test_no_sglang_engine_when_slime_starts_none(extra, why):
    spec, _ = load_spec([*args_of(QWEN3_4B), *extra])
    assert spec.roles() == ("actor",) and why in dict(spec.omitted)["rollout"]
    assert not spec.processes and spec.others is None


def test_an_sglang_config_starts_engines_even_with_rollout_num_gpus_0():
    assert "rollout" in engines([*args_of(QWEN3_4B), "--rollout-num-gpus", "0",
                                 "--sglang-config", "/cfg/sglang.yaml"])


def test_the_removed_fsdp_backend_reads_as_an_fsdp_engine():
    spec, _ = load_spec(args_of(FSDP_BACKEND))
    actor = dict(spec.engines)["actor"]
    assert actor.kind == FSDP and actor.strategy == "fsdp" and actor.checks == ()


def test_an_unknown_train_backend_is_named():
    with pytest.raises(FieldValueError, match="'deepspeed' is not a slime train backend"):
        build_runtime_env(["--colocate", "--train-backend", "deepspeed"])


@pytest.mark.parametrize("flag,setting", [
    ("--use-torch-fsdp2", "torch-FSDP2"),
    ("--use-megatron-fsdp", "Megatron-FSDP"),
    ("--use-custom-fsdp", "Megatron-FSDP"),
])
def test_fsdp_under_megatron_is_a_required_not_1(flag, setting):
    args = [*args_of(QWEN3_4B), flag]
    assert setting in engines(args)["actor"]
    decision = explain(args, "9.0", node_value="1")
    assert decision.value == "8" and decision.strengths["actor"] == "required"
    assert explain(args, "9.0", explicit="1").satisfied is False


def test_moe_a2a_overlap_asks_32_as_a_preference():
    args = [*args_of(QWEN3_30B), "--overlap-moe-expert-parallel-comm"]
    decision = explain(args, "9.0")
    assert decision.value == "32" and decision.strengths["actor"] == "preferred"
    assert decision.satisfied


# -- runtime-env for ray job submit -------------------------------------------------

SCRIPT_ENV = {"env_vars": {"PYTHONPATH": "/root/Megatron-LM/",
                           "CUDA_DEVICE_MAX_CONNECTIONS": "1", "NCCL_NVLS_ENABLE": "1"}}


def test_runtime_env_takes_the_training_arguments_after_a_double_dash(capsys):
    code, out, _ = run(capsys, "runtime-env", "--take-over", "--json",
                       "--base-json", json.dumps(SCRIPT_ENV), "--", *args_of(QWEN3_4B))
    assert code == 0
    env = json.loads(out)
    # The user's own variables stay (a pack variable with its mark); the
    # hard-coded value goes; nothing to take over in slime's driver, which
    # adds no value of its own (the driver hook that keeps a driver's own
    # setup hook is in every submitted env); the field for the setup hook.
    assert json.loads(env["env_vars"].pop("RAY_MEGATRON_ENV_FIELD")) == env["megatron_env"]
    assert env["env_vars"] == {"PYTHONPATH": "/root/Megatron-LM/", "NCCL_NVLS_ENABLE": "1",
                               "RAY_MEGATRON_ENV_GIVEN_NCCL_NVLS_ENABLE": "1",
                               "RAY_RUNTIME_ENV_HOOK": "ray_megatron_env.hook.runtime_env_hook",
                               "RAY_OVERRIDE_JOB_RUNTIME_ENV": "1",
                               "RAY_MEGATRON_ENV_MERGE": "strict"}
    assert env["megatron_env"] == build_runtime_env(args_of(QWEN3_4B))["megatron_env"]
    assert env["megatron_env"]["engines"]["actor"]["tensor_parallel"] == 2


def test_runtime_env_from_a_base_file_and_an_arguments_file(capsys, tmp_path):
    base = tmp_path / "runtime_env.json"
    base.write_text(json.dumps(SCRIPT_ENV))
    code, out, _ = run(capsys, "runtime-env", GLM4_9B, "--base", base, "--take-over", "--json")
    env = json.loads(out)
    assert code == 0 and "CUDA_DEVICE_MAX_CONNECTIONS" not in env["env_vars"]
    assert env["megatron_env"]["engines"]["actor"]["context_parallel"] == 2


def test_runtime_env_without_take_over_keeps_the_value_explicit(capsys):
    code, out, _ = run(capsys, "runtime-env", "--json", "--base-json", json.dumps(SCRIPT_ENV),
                       "--", *args_of(QWEN3_4B))
    assert code == 0 and json.loads(out)["env_vars"]["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"


def test_runtime_env_for_one_role(capsys):
    code, out, _ = run(capsys, "runtime-env", "--json", "--role", "rollout", "--",
                       *args_of(QWEN3_4B))
    assert code == 0 and json.loads(out)["megatron_env"]["engines"] == {
        "rollout": {"strategy": "sglang"}}


@pytest.mark.parametrize("argv,words", [
    (["runtime-env", "--json"], "not both"),
    (["runtime-env", str(QWEN3_4B), "--", "--colocate"], "not both"),
    (["runtime-env", "--base-json", "{not json", "--", "--colocate"], "not valid JSON"),
    (["runtime-env", "--base-json", "[1]", "--", "--colocate"], "JSON object"),
    (["runtime-env", "--", "--tensor-model-parallel-size", "2"], "slime), and this one is not"),
])
def test_runtime_env_usage_errors_exit_2(capsys, argv, words):
    code, _, err = run(capsys, *argv)
    assert code == 2 and words in err


def test_other_verbs_keep_their_double_dash(capsys):
    code, out, _ = run(capsys, "explain", "--gpus", "9.0", "--", QWEN3_4B)
    assert code == 0 and "CUDA_DEVICE_MAX_CONNECTIONS: 1" in out


def test_an_argument_list_file_without_slime_options_names_slime(tmp_path):
    # Megatron-LM's options alone are any Megatron-LM script's, not slime's.
    path = tmp_path / "args.json"
    path.write_text('["--tensor-model-parallel-size", "2", "--seq-length", "4096"]')
    with pytest.raises(FieldValueError, match=r"read only as slime's argument list, and it "
                                              r"has none of slime's own options"):
        load_spec(str(path))


def test_per_role_overrides_in_a_megatron_config_path_are_warned_about():
    # slime's tests/test_qwen3_4B_ppo.py passes --megatron-config-path with
    # role: actor / role: critic override entries.
    args = [*args_of(PPO), "--megatron-config-path", "/tmp/megatron_roles.yaml"]
    with pytest.warns(UserWarning, match=r"megatron_config_path '/tmp/megatron_roles.yaml': "
                                         r"its per-role overrides are not read"):
        load_spec(args)
