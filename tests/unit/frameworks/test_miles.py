"""Topical: miles (radixark/miles @ 31f1ca96, a slime fork), which has no
reader of its own: its arguments are slime's and read by the slime reader;
its SGLang engines carry SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK=false
(miles/ray/rollout/server_group.py) instead of slime's variable, and are
told apart by it.

The argument lists are the ones miles' Python launcher scripts/
run_qwen3_4b.py builds with its defaults (hardware H100: 8 GPUs; Qwen3-4B:
TP 2, CP 4; Qwen3-0.6B: TP 1, CP 1; --train-backend fsdp for the FSDP run),
reduced to the options the reader reads. The job env is execute_train's
(miles/utils/external_utils/command_utils.py), whose "1" is miles' own once
the config is known as miles: by use_miles_router in a namespace, a miles
option in a list, or the driver the launch runs (miles' train.py).
Expected values from docs/rules.md by hand: miles' driver runs Megatron-LM's
validate_args as slime's does, so TP/CP > 1 below major 10 is a required 1.
"""

import pytest

from ray_megatron_env import build_runtime_env
from ray_megatron_env.frameworks import parse_field
from ray_megatron_env.node import parse_gpu_list

from deciding import UNSET, decided, shown
from paths import FIXTURES

COMMON = ["--actor-num-nodes", "1", "--actor-num-gpus-per-node", "8", "--colocate",
          "--rollout-num-gpus-per-engine", "1"]
QWEN3_4B = COMMON + ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "1",
                     "--context-parallel-size", "4", "--expert-model-parallel-size", "1"]
QWEN3_06B = COMMON + ["--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size",
                      "1", "--context-parallel-size", "1", "--expert-model-parallel-size", "1"]
FSDP = COMMON + ["--train-backend", "fsdp", "--train-env-vars",
                 '{"PYTORCH_CUDA_ALLOC_CONF":"expandable_segments:True"}']

JOB_ENV = {"PYTHONUNBUFFERED": "1", "NCCL_NVLS_ENABLE": "1", "MASTER_ADDR": "10.0.0.1"}
# miles/ray/rollout/server_group.py (engines), miles/ray/train/actor_factory.py (trainers).
ENGINE = {**JOB_ENV, "NVSHMEM_DISABLE_NCCL": "1", "SGLANG_JIT_DEEPGEMM_PRECOMPILE": "false",
          "SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK": "false",
          "SGLANG_MEMORY_SAVER_CUDA_GRAPH": "true"}
TRAINER = {**JOB_ENV, "NCCL_CUMEM_ENABLE": "0", "NVSHMEM_DISABLE_NCCL": "1"}

GPUS = ("8.0", "9.0", "10.0", "9.0,10.0")
R = "1 (required)"
GOLDEN = [
    ("qwen3-4b", QWEN3_4B, dict(zip(GPUS, (R, R, UNSET, R)))),
    ("qwen3-0.6b", QWEN3_06B, dict.fromkeys(GPUS, UNSET)),
    ("fsdp", FSDP, dict.fromkeys(GPUS, UNSET)),
]


def on_node(args, gpus, env):
    spec = parse_field(build_runtime_env(args)["megatron_env"])
    return decided(spec, parse_gpu_list(gpus), worker_env=env)


@pytest.mark.parametrize("name,args,train", GOLDEN, ids=[g[0] for g in GOLDEN])
@pytest.mark.parametrize("gpus", GPUS)
def test_engines_are_told_apart_from_trainers(name, args, train, gpus):
    assert shown(on_node(args, gpus, TRAINER)) == train[gpus]
    assert shown(on_node(args, gpus, JOB_ENV)) == train[gpus]  # the driver
    engine = on_node(args, gpus, ENGINE)
    assert shown(engine) == UNSET and set(engine.engines) == {"rollout"}


def test_a_job_wide_true_does_not_make_the_driver_an_engine():
    # examples/swe-agent-harbor-docker/run-glm47-flash-agentic-async.py sets
    # the variable to "true" for the whole job.
    env = {**JOB_ENV, "SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK": "true"}
    decision = on_node(QWEN3_4B, "9.0", env)
    assert decision.value == "1" and set(decision.engines) == {"actor"}


# -- miles' own "1" (execute_train) --------------------------------------------

def namespace_of(args, **extra):
    """vars() of miles' parse_args as far as the reader reads it: every miles
    namespace has use_miles_router (add_router_arguments)."""
    from ray_megatron_env.frameworks.slime import convert

    return {**convert(args), "use_miles_router": False, **extra}


def test_a_miles_namespace_is_known_by_use_miles_router_and_its_1_is_replaced():
    spec = parse_field(build_runtime_env(namespace_of(QWEN3_4B))["megatron_env"])
    assert spec.framework == "miles" and spec.replaces == "1"
    # execute_train's "1" in the job env: decided anew per process.
    with_one = {**JOB_ENV, "CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    blackwell = decided(spec, parse_gpu_list("10.0"), worker_env=with_one)
    assert blackwell.value is None
    engine = decided(spec, parse_gpu_list("9.0"), worker_env={**ENGINE, **with_one})
    assert engine.value is None
    hopper = decided(spec, parse_gpu_list("9.0"), worker_env={**TRAINER, **with_one})
    assert hopper.value == "1"


def test_the_users_1_in_train_env_vars_is_kept():
    args = QWEN3_4B + ["--train-env-vars", '{"CUDA_DEVICE_MAX_CONNECTIONS": "1"}']
    assert parse_field(build_runtime_env(namespace_of(args))["megatron_env"]).replaces is None


def test_fsdp_has_no_miles_1_to_replace():
    assert parse_field(build_runtime_env(namespace_of(FSDP))["megatron_env"]).replaces is None


def test_a_list_is_miles_only_with_a_miles_option():
    plain = parse_field(build_runtime_env(QWEN3_4B)["megatron_env"])
    assert plain.framework == "slime" and plain.replaces is None
    routed = parse_field(build_runtime_env(QWEN3_4B + ["--use-miles-router"])["megatron_env"])
    assert routed.framework == "miles" and routed.replaces == "1"


def test_a_bad_train_env_vars_value_is_refused_by_name():
    from ray_megatron_env.errors import FieldValueError

    args = QWEN3_4B + ["--train-env-vars", '{"CUDA_DEVICE_MAX_CONNECTIONS": "0"}']
    with pytest.raises(FieldValueError, match="train_env_vars.CUDA_DEVICE_MAX_CONNECTIONS"):
        build_runtime_env(namespace_of(args))
    with pytest.raises(FieldValueError, match="--train-env-vars"):
        build_runtime_env(QWEN3_4B + ["--train-env-vars", "{not json"])


# -- A miles launch as miles launches it: its driver ------------------------------

# execute_train's job env for a Megatron job (command_utils.py:193-227), in part.
EXECUTE_TRAIN_ENV = {"PYTHONUNBUFFERED": "1", "CUDA_DEVICE_MAX_CONNECTIONS": "1",
                     "NCCL_NVLS_ENABLE": "1", "no_proxy": "127.0.0.1,10.0.0.1",
                     "MASTER_ADDR": "10.0.0.1", "PYTHONPATH": "/root/miles:/root/Megatron-LM"}


@pytest.fixture
def checkout(tmp_path):
    """A miles checkout's driver, miles' own train.py (tests/fixtures/miles)."""
    (tmp_path / "train.py").write_text((FIXTURES / "miles" / "train.py.txt").read_text())
    return tmp_path


def test_the_execute_train_line_in_the_docs_knows_miles_by_its_driver(checkout):
    import shlex

    # In execute_train: train_script is f"{repo_base_dir}/train.py"; the job
    # runs `python3 {train_script} {model_args} {train_args}`.
    train_script, train_args = str(checkout / "train.py"), " ".join(QWEN3_4B)
    env = build_runtime_env([train_script, *shlex.split(train_args)],
                            base={"env_vars": EXECUTE_TRAIN_ENV})
    spec = parse_field(env["megatron_env"])
    assert spec.framework == "miles" and spec.replaces == "1"
    assert env["env_vars"]["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"  # kept: decided on each node
    assert spec.processes[1].variable == "SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK"
    for gpus, trainer in (("9.0", "1"), ("10.0", None)):
        assert decided(spec, parse_gpu_list(gpus),
                       worker_env={**TRAINER, **EXECUTE_TRAIN_ENV}).value == trainer
        assert decided(spec, parse_gpu_list(gpus),
                       worker_env={**ENGINE, **EXECUTE_TRAIN_ENV}).value is None


def test_the_shell_launchers_command_from_the_checkout(checkout, monkeypatch, capsys):
    from ray_megatron_env.cli import OK, main

    # examples/lora/run-qwen3-4B-megatron-lora.sh: ray job submit ... -- python3 train.py ...
    monkeypatch.chdir(checkout)
    import json

    code = main(["runtime-env", "--json", "--base-json", json.dumps({"env_vars": EXECUTE_TRAIN_ENV}),
                 "--", "python3", "train.py", *QWEN3_4B])
    field = json.loads(capsys.readouterr().out)["megatron_env"]
    assert code == OK and field["framework"] == "miles" and field["replaces"] == "1"


def test_slimes_driver_or_one_not_here_reads_as_slime(tmp_path):
    slimes = tmp_path / "train.py"
    slimes.write_text((FIXTURES / "slime" / "train.py.txt").read_text())
    for driver in ([str(slimes)], ["python3", str(tmp_path / "elsewhere" / "train.py")]):
        spec = parse_field(build_runtime_env([*driver, *QWEN3_4B])["megatron_env"])
        assert spec.framework == "slime" and spec.replaces is None
