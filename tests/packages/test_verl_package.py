"""Against verl itself (0.9.1): its runtime env, taken over, and its real
RayWorkerGroup on a simulated cluster with a CPU-only head and A100, H100 and
B200 nodes. Runs where verl is importable; .ci/run installs it
(pip install --no-deps verl==0.9.1 and the few modules its Ray code imports).
"""

import os
import sys

import pytest
import ray

verl = pytest.importorskip(
    "verl.single_controller.ray",
    reason="verl is not installed; .ci/run installs verl 0.9.1 without its dependency tree")

from verl.single_controller.base import Worker  # noqa: E402
from verl.single_controller.base.decorator import Dispatch, register  # noqa: E402
from verl.single_controller.ray import (  # noqa: E402
    RayClassWithInitArgs, RayResourcePool, RayWorkerGroup,
)
from verl.trainer.constants_ppo import get_ppo_ray_runtime_env  # noqa: E402

from configs import verl as verl_config  # noqa: E402
from ray.util.placement_group import remove_placement_group  # noqa: E402

from ray_megatron_env import build_runtime_env  # noqa: E402

CLUSTER = "registered"
VARIABLE = "CUDA_DEVICE_MAX_CONNECTIONS"
# Golden, from the rule table: verl_megatron.yaml (Megatron TP=2 actor and
# ref, Megatron TP=1 critic, vLLM rollout) with hybrid_engine false, so the
# rollout runs in standalone worker groups (verl/workers/rollout/replica.py).
# Trainer ranks: 1 below Blackwell, nothing on B200. Rollout ranks: vLLM,
# "not 1": nothing set anywhere.
TRAINER = {"a100": "1", "h100": "1", "b200": None}
ACCELERATORS = {"a100": "A100", "h100": "H100", "b200": "B200"}


# verl's runtime env sets working_dir: None, so workers do not get the
# driver's sys.path; the worker class travels by value instead.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


class EnvWorker(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def seen(self):
        return os.environ.get(VARIABLE), os.environ.get("WG_PREFIX"), \
            os.environ.get("RAY_MEGATRON_ENV_DECISION")


@pytest.fixture(scope="module")
def job_env():
    config = verl_config("actor_rollout_ref.hybrid_engine=false")
    # verl's own driver defaults, as main_ppo merges them, on this CPU-only
    # driver; then the take-over.
    base = get_ppo_ray_runtime_env(config)
    return build_runtime_env(config, base=base, take_over=True)


@pytest.fixture(scope="module")
def as_job(cluster, job_env):
    """Reconnect the driver with the env as the job-level runtime env."""
    ray.shutdown()
    ray.init(address=cluster.address, runtime_env=job_env, log_to_driver=False,
             logging_level="WARNING")
    yield
    ray.shutdown()
    cluster.connect()


def test_verl_runtime_env_on_a_cpu_only_driver_is_taken_over(job_env):
    config = verl_config()
    verl_says = get_ppo_ray_runtime_env(config)["env_vars"]
    # verl decided from this driver's GPU (none): no value for any worker,
    # although its Megatron TP=2 workers need 1 on A100/H100.
    assert VARIABLE not in verl_says
    assert VARIABLE not in job_env["env_vars"]
    assert {k: job_env["env_vars"][k] for k in verl_says} == verl_says  # nothing lost
    assert job_env["megatron_env"]["engines"]["actor"] == {"strategy": "megatron",
                                                         "tensor_parallel": 2}


def test_a_hard_coded_1_from_verls_runtime_env_yaml_is_taken_over():
    # verl's verl/trainer/runtime_env.yaml (ray job submit) sets 1 for everyone.
    base = {"env_vars": {"TORCH_NCCL_AVOID_RECORD_STREAMS": "1", VARIABLE: "1"}}
    env = build_runtime_env(verl_config(), base=base, take_over=True)
    assert VARIABLE not in env["env_vars"]
    assert env["env_vars"]["TORCH_NCCL_AVOID_RECORD_STREAMS"] == "1"


def _group(name, ranks, prefix=None):
    pool = RayResourcePool(process_on_nodes=[ranks], use_gpu=True, max_colocate_count=1,
                           accelerator_type=f"accelerator_type:{ACCELERATORS[name]}")
    group = RayWorkerGroup(resource_pool=pool,
                           ray_cls_with_init=RayClassWithInitArgs(cls=ray.remote(EnvWorker)),
                           name_prefix=prefix, device_name="cuda")
    return group, pool


def _release(group, pool):
    for handle in group.workers:
        ray.kill(handle)
    for pg in pool.pgs or ():
        remove_placement_group(pg)


def _check(group, expected, role):
    seen = group.seen()
    for value, prefix, decision in seen:
        assert decision is not None, f"the plugin did not run for the rank with {prefix}"
        assert value == expected, (prefix, expected, decision)
        assert f'"{role}"' in decision
    return len(seen)


# slow: on the load test's "registered" set, as cluster/test_check_registered.py.
@pytest.mark.slow
def test_every_rank_of_verls_trainer_worker_groups_gets_its_nodes_value(as_job):
    # verl's trainer: no name_prefix, a random WG_PREFIX. One group per node,
    # all made before any is asked, so that their ranks start together.
    made = {}
    try:
        for name in sorted(ACCELERATORS):
            made[name] = _group(name, 2)
        for name, (group, _) in made.items():
            assert _check(group, TRAINER[name], "actor") == 2, name
    finally:
        for group, pool in made.values():
            _release(group, pool)


@pytest.mark.slow
def test_a_standalone_rollout_group_and_the_trainer_differ_under_one_job_env(as_job):
    trainer, trainer_pool = _group("h100", 2)
    rollout, rollout_pool = _group("h100", 1, prefix="rollout_standalone_0")  # replica.py
    try:
        assert _check(trainer, "1", "actor") == 2
        assert _check(rollout, None, "rollout") == 1
    finally:
        _release(trainer, trainer_pool)
        _release(rollout, rollout_pool)


@pytest.mark.parametrize("options", [[], ["--take-over"], ["--take-over", "--ship-package"]])
def test_the_submitted_job_env_merges_with_verls_own_ray_init_env(monkeypatch, capsys,
                                                                  options):
    # ray job submit --runtime-env (the runtime-env verb's output), then
    # verl's main_ppo in the job: ray.init(runtime_env=get_ppo_ray_runtime_env(config))
    # with the submitted env_vars in its environment. Ray refuses the merge
    # when both carry a key (_merge_runtime_env returns None).
    import json

    from ray.runtime_env.runtime_env import _merge_runtime_env

    from configs import MEGATRON_YAML
    from ray_megatron_env.cli import main

    base = {"working_dir": "./", "env_vars": {"TORCH_NCCL_AVOID_RECORD_STREAMS": "1",
                                              "VERL_FULL_DETERMINISM": "0"}}
    args = ["runtime-env", str(MEGATRON_YAML), "--json", "--base-json", json.dumps(base)]
    assert main(args + options) == 0
    submitted = json.loads(capsys.readouterr().out)
    assert "worker_process_setup_hook" in submitted and "megatron_env" in submitted
    if "--ship-package" in options:
        import ray_megatron_env

        assert submitted["py_modules"] == [os.path.dirname(ray_megatron_env.__file__)]
    # What Ray gives a submitted job's driver: the env_vars in its
    # environment, and the submitted runtime env in the job config variable
    # that verl reads (RAY_JOB_CONFIG_JSON_ENV_VAR).
    from ray._private.runtime_env.constants import RAY_JOB_CONFIG_JSON_ENV_VAR

    for key, value in submitted.get("env_vars", {}).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv(RAY_JOB_CONFIG_JSON_ENV_VAR, json.dumps({"runtime_env": submitted}))
    driver = get_ppo_ray_runtime_env(verl_config())
    assert _merge_runtime_env(submitted, driver) is not None
