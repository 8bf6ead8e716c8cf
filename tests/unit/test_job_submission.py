"""A submitted job's env and its driver's own ray.init env, merged as Ray's
ray.init merges them (ray/_private/worker.py, init: _merge_runtime_env with
the job config's env, then RAY_RUNTIME_ENV_HOOK, then the setup hook's
upload), with the env that `ray-megatron-env runtime-env` writes: the
driver's own setup hook runs after ours, whatever the driver's shape and
RAY_OVERRIDE_JOB_RUNTIME_ENV; a real conflict fails in ray.init, named. And
that env on its own (job_submission_env): what it sets for the driver, and
what it leaves to the framework's driver.
tests/cluster/test_job_submit.py does the same through `ray job submit`."""

import json
import os

import pytest
from ray.runtime_env.runtime_env import _merge_runtime_env

from configs import FSDP_YAML, MEGATRON_YAML
from ray_megatron_env import build_runtime_env
from ray_megatron_env.hook import runtime_env_hook
from ray_megatron_env.job_submission import complete_submitted_env, job_submission_env
from ray_megatron_env.names import (
    FIELD_VARIABLE, JOB_CONFIG_VARIABLE, MERGE_VARIABLE, NEXT_SETUP_HOOK_VARIABLE, RAY_SETUP_HOOK_VARIABLE,
    SETUP_HOOK_PATH,
)
from ray_megatron_env.setup_hook import is_chained


def submitted(env_vars=None, framework="verl"):
    """What `runtime-env CONFIG [--base ...]` writes (before YAML)."""
    env, _ = job_submission_env(build_runtime_env(MEGATRON_YAML, base={"env_vars": env_vars}
                                                  if env_vars else None), framework)
    return json.loads(json.dumps(env))  # as ray job submit sends it


def ray_init(monkeypatch, job, driver):
    """What ray.init does with the driver's env in a submitted job, up to
    the upload of the setup hook: the job's env_vars are in the driver's
    environment, its env in RAY_JOB_CONFIG_JSON_ENV_VAR."""
    for key, value in job.get("env_vars", {}).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv(JOB_CONFIG_VARIABLE, json.dumps({"runtime_env": job}))
    if callable(driver):
        driver = driver()  # a driver that reads its environment (NeMo-RL)
    merged = _merge_runtime_env(job, driver,
                                override=os.getenv("RAY_OVERRIDE_JOB_RUNTIME_ENV") == "1")
    if merged is None:
        raise ValueError("Failed to merge the Job's runtime env")
    return runtime_env_hook(merged)


def user_hook():
    os.environ["USER_HOOK_RAN"] = "callable"


DRIVERS = {
    "none": None,
    "verl": {"env_vars": {"TOKENIZERS_PARALLELISM": "true"}},
    "nemo-rl": lambda: {"env_vars": dict(os.environ)},
    "hook-string": {"worker_process_setup_hook": "userhook.mark"},
    "hook-callable": {"worker_process_setup_hook": user_hook},
    "nemo-rl-hook": lambda: {"env_vars": dict(os.environ),
                             "worker_process_setup_hook": "userhook.mark"},
}


@pytest.mark.parametrize("override", [False, True])
@pytest.mark.parametrize("shape", DRIVERS)
def test_every_driver_shape_keeps_our_setup_hook_first(monkeypatch, shape, override):
    job = submitted({"RAY_OVERRIDE_JOB_RUNTIME_ENV": "1"} if override else None)
    env = ray_init(monkeypatch, job, DRIVERS[shape])
    hook = env["worker_process_setup_hook"]
    nexts = env["env_vars"].get(NEXT_SETUP_HOOK_VARIABLE, "")
    if shape == "hook-callable":
        assert is_chained(hook) and hook.__name__ == "megatron_env_then_user_hook"
    else:
        assert hook == SETUP_HOOK_PATH
        assert nexts == ("userhook.mark" if "hook" in shape else "")
    assert env["megatron_env"] == job["megatron_env"]


def test_without_the_hook_ray_refuses_or_drops_the_drivers_hook(monkeypatch):
    # What the issue saw, with the job env of before (no driver hook, no
    # override): Ray refuses the merge; with Ray's override, ours is gone.
    old = {"megatron_env": {"version": 2}, "worker_process_setup_hook": SETUP_HOOK_PATH}
    driver = {"worker_process_setup_hook": "userhook.mark"}
    assert _merge_runtime_env(old, driver) is None
    assert _merge_runtime_env(old, driver, override=True)["worker_process_setup_hook"] == \
        "userhook.mark"


def test_a_real_conflict_is_refused_unless_the_job_env_asks_for_rays_override(monkeypatch):
    job = submitted({"NCCL_DEBUG": "WARN"})
    assert job["env_vars"][MERGE_VARIABLE] == "strict"
    with pytest.raises(ValueError, match=r"sets env_vars\.NCCL_DEBUG .*"
                                         r"RAY_MEGATRON_ENV_MERGE: override"):
        ray_init(monkeypatch, job, {"env_vars": {"NCCL_DEBUG": "INFO"}})
    job = submitted({"NCCL_DEBUG": "WARN", "RAY_OVERRIDE_JOB_RUNTIME_ENV": "1"})
    env = ray_init(monkeypatch, job, {"env_vars": {"NCCL_DEBUG": "INFO"}})
    assert env["env_vars"]["NCCL_DEBUG"] == "INFO"


def test_the_same_value_twice_is_no_conflict(monkeypatch):
    job = submitted({"NCCL_DEBUG": "WARN"})
    env = ray_init(monkeypatch, job, {"env_vars": {"NCCL_DEBUG": "WARN"}})
    assert env["env_vars"]["NCCL_DEBUG"] == "WARN"


def test_the_packages_own_modules_and_variables_come_back():
    job = {"megatron_env": {"version": 2}, "py_modules": ["gcs://_ray_pkg_ours.zip"],
           "worker_process_setup_hook": SETUP_HOOK_PATH,
           "env_vars": {"RAY_MEGATRON_ENV_TAKE_OVER": "1", NEXT_SETUP_HOOK_VARIABLE: "a.b"}}
    merged = {"megatron_env": {"version": 2}, "py_modules": ["./mine"],
              "worker_process_setup_hook": "c.d",
              "env_vars": {"RAY_MEGATRON_ENV_TAKE_OVER": "0"}}
    env = complete_submitted_env(merged, job, strict=False)
    assert env["py_modules"] == ["./mine", "gcs://_ray_pkg_ours.zip"]
    assert env["env_vars"] == {"RAY_MEGATRON_ENV_TAKE_OVER": "1",
                               NEXT_SETUP_HOOK_VARIABLE: "a.b"}
    # The chain: the submitted env's own hook, then the driver's.
    from ray_megatron_env.runtime_env import build_runtime_env as build

    built = build(env["megatron_env"] | {"engines": {}}, base={
        k: v for k, v in env.items() if k != "megatron_env"})
    assert built["env_vars"][NEXT_SETUP_HOOK_VARIABLE] == "a.b,c.d"


def test_rays_own_hook_variable_from_a_drivers_environment_is_chained_or_refused():
    job = {"megatron_env": {"version": 2}, "worker_process_setup_hook": SETUP_HOOK_PATH}
    env = complete_submitted_env({**job, "env_vars": {RAY_SETUP_HOOK_VARIABLE: "x.y"}}, job,
                                 strict=True)
    assert env["env_vars"] == {NEXT_SETUP_HOOK_VARIABLE: "x.y"}
    env = complete_submitted_env({**job, "env_vars": {RAY_SETUP_HOOK_VARIABLE: SETUP_HOOK_PATH}},
                                 job, strict=True)
    assert "env_vars" not in env
    with pytest.raises(ValueError, match="another job exported"):
        complete_submitted_env({**job, "env_vars": {
            RAY_SETUP_HOOK_VARIABLE: "ray_runtime_env_func::abc="}}, job, strict=True)


def test_outside_a_submitted_job_nothing_is_completed(monkeypatch):
    monkeypatch.delenv(JOB_CONFIG_VARIABLE, raising=False)
    env = runtime_env_hook({"worker_process_setup_hook": "userhook.mark"})
    assert env == {"worker_process_setup_hook": "userhook.mark"}


# A driver nested in a worker (vLLM's Ray executor) passes that worker's own
# runtime env to ray.init: the job env after Ray's upload in the job's driver
# wrote its setup-hook variable into env_vars. Ray 2.41 to 2.54 assert on it
# beside the field (setup_hook.export_setup_func_module); 2.55 and later
# check that the two agree. tests/cluster/test_fallback.py runs it live.
HOOK = "ray_megatron_env.setup_hook.setup_hook"
NESTED_JOB_ENVS = {
    "build_runtime_env": lambda: build_runtime_env(MEGATRON_YAML),
    "build_runtime_env, a user's hook": lambda: build_runtime_env(
        MEGATRON_YAML, base={"worker_process_setup_hook": "userhook.mark"}),
    "runtime-env": lambda: job_submission_env(build_runtime_env(MEGATRON_YAML), "verl")[0],
    # --ship-package: py_modules as a worker sees it, uploaded
    "runtime-env --ship-package": lambda: job_submission_env(build_runtime_env(
        MEGATRON_YAML, base={"py_modules": ["gcs://_ray_pkg_0123456789abcdef.zip"]}), "verl")[0],
}


@pytest.mark.ray_version_specific  # Ray's own upload of the setup hook
@pytest.mark.parametrize("source", NESTED_JOB_ENVS)
def test_a_driver_nested_in_a_worker_passes_rays_upload(monkeypatch, source):
    from ray._private.runtime_env.setup_hook import upload_worker_process_setup_hook_if_needed
    from ray.runtime_env import RuntimeEnv

    from ray_megatron_env.setup_hook import hook_nested_drivers

    job = json.loads(json.dumps(NESTED_JOB_ENVS[source]()))
    # What the job's driver uploads, and what a worker then reads back.
    worker_env = RuntimeEnv(**upload_worker_process_setup_hook_if_needed(
        json.loads(json.dumps(job)), None))
    assert worker_env["env_vars"][RAY_SETUP_HOOK_VARIABLE] == HOOK
    # The worker's setup hook sets the driver hook; a process it starts
    # inherits it (no job config there: not a submitted job's driver).
    monkeypatch.delenv(JOB_CONFIG_VARIABLE, raising=False)
    environ = {k: v for k, v in os.environ.items() if k != "RAY_RUNTIME_ENV_HOOK"}
    hook_nested_drivers(environ)
    assert environ["RAY_RUNTIME_ENV_HOOK"] == "ray_megatron_env.hook.runtime_env_hook"
    env = runtime_env_hook(worker_env)
    env = upload_worker_process_setup_hook_if_needed(env, None)  # no assertion, no conflict
    assert env["worker_process_setup_hook"] == HOOK
    assert env["env_vars"][RAY_SETUP_HOOK_VARIABLE] == HOOK
    assert env["megatron_env"] == job["megatron_env"]
    assert env["env_vars"].get(NEXT_SETUP_HOOK_VARIABLE) == job["env_vars"].get(
        NEXT_SETUP_HOOK_VARIABLE)
    assert env.get("py_modules") == job.get("py_modules")


# What every submitted env sets for its driver (job_submission.complete_submitted_env).
DRIVER_SIDE = {"RAY_RUNTIME_ENV_HOOK": "ray_megatron_env.hook.runtime_env_hook",
               "RAY_OVERRIDE_JOB_RUNTIME_ENV": "1", "RAY_MEGATRON_ENV_MERGE": "strict"}


def test_the_job_submission_env_carries_the_field_for_the_setup_hook():
    # Also where Ray skips the driver hook (uv run), every worker reads its
    # field from its own environment.
    env, notes = job_submission_env(build_runtime_env(FSDP_YAML), "verl")
    field = env["env_vars"].pop(FIELD_VARIABLE)
    assert env["env_vars"] == DRIVER_SIDE and notes == []
    assert json.loads(field) == env["megatron_env"]
    assert env["worker_process_setup_hook"] == SETUP_HOOK_PATH


def test_the_job_submission_env_for_nemo_rl_lets_its_driver_win_the_merge():
    # NeMo-RL's init_ray passes its whole environment as env_vars: every
    # submitted env_vars key would collide.
    env, notes = job_submission_env({"megatron_env": {}, "env_vars": {"A": "1"}}, "nemo-rl")
    assert env["env_vars"] == {"A": "1", **DRIVER_SIDE, "RAY_MEGATRON_ENV_MERGE": "override"}
    assert "whole environment" in notes[0]


def test_a_base_that_asks_for_rays_override_gets_it_and_a_driver_hook_moves_next():
    env, notes = job_submission_env({"env_vars": {"RAY_OVERRIDE_JOB_RUNTIME_ENV": "1",
                                                  "RAY_RUNTIME_ENV_HOOK": "acme.hook"}}, "verl")
    assert env["env_vars"] == {**DRIVER_SIDE, "RAY_MEGATRON_ENV_MERGE": "override",
                               "RAY_MEGATRON_ENV_NEXT_HOOK": "acme.hook"} and notes == []


def test_the_job_submission_env_leaves_out_what_verls_driver_always_sets():
    env, notes = job_submission_env({"env_vars": {"VERL_FULL_DETERMINISM": "1", "A": "b"}},
                                    "verl")
    assert env["env_vars"] == {"A": "b", **DRIVER_SIDE} and "VERL_FULL_DETERMINISM" in notes[0]
