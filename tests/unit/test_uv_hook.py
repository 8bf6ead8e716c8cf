"""Ray's uv hook and this package's driver hook (uv_hook.py): a driver under
``uv run`` is warned that Ray skips RAY_RUNTIME_ENV_HOOK (Ray 2.47 and
later, ray/_private/worker.py, _maybe_modify_runtime_env), and a driver
nested in a worker on Ray 2.47 to 2.54 gets Ray's uv hook run by ours."""

import pytest

from configs import MEGATRON_YAML
from ray_megatron_env import build_runtime_env
from ray_megatron_env.hook import runtime_env_hook
from ray_megatron_env.names import (
    DRIVER_HOOK_PATH as HOOK_PATH, JOB_CONFIG_VARIABLE, RAY_SETUP_HOOK_VARIABLE,
)
from ray_megatron_env.uv_hook import driver_hook_skipped, rays_uv_hook, uv_hook_replaces_driver_hook

MEGATRON_TP2 = {"version": 2, "engines": {"actor": {"strategy": "megatron",
                                                    "tensor_parallel": 2}}}
HOOK = "ray_megatron_env.setup_hook.setup_hook"
UV = "ray._private.runtime_env.uv_runtime_env_hook"


def test_a_uv_run_driver_is_warned_that_ray_skips_the_driver_hook(monkeypatch):
    import ray._private.runtime_env.uv_runtime_env_hook as uv

    monkeypatch.setattr(uv, "_get_uv_run_cmdline", lambda: ["uv", "run", "train.py"])
    assert driver_hook_skipped({}) is None  # our hook not in use: nothing to say
    reason = driver_hook_skipped({"RAY_RUNTIME_ENV_HOOK": HOOK_PATH})
    assert "RAY_ENABLE_UV_RUN_RUNTIME_ENV" in reason
    monkeypatch.setenv("RAY_RUNTIME_ENV_HOOK", HOOK_PATH)
    with pytest.warns(UserWarning, match="uv run"):
        build_runtime_env(MEGATRON_TP2)
    monkeypatch.setattr(uv, "_get_uv_run_cmdline", lambda: None)
    assert driver_hook_skipped({"RAY_RUNTIME_ENV_HOOK": HOOK_PATH}) is None


def test_under_uv_run_on_ray_2_47_to_2_54_the_driver_hook_runs_rays_uv_hook_first(monkeypatch):
    # Those releases give a driver under `uv run` Ray's uv hook instead of
    # RAY_RUNTIME_ENV_HOOK, and still assert on the setup hook's variable.
    uv = pytest.importorskip("ray._private.runtime_env.uv_runtime_env_hook")
    from ray._private.runtime_env import setup_hook

    from ray_megatron_env.setup_hook import hook_nested_drivers

    monkeypatch.delattr(setup_hook, "_check_setup_hook_consistency", raising=False)
    monkeypatch.setattr(uv, "_get_uv_run_cmdline", lambda: ["uv", "run", "--python", "3.11",
                                                            "train.py"])
    environ = {}
    hook_nested_drivers(environ)
    assert environ == {"RAY_RUNTIME_ENV_HOOK": "ray_megatron_env.hook.runtime_env_hook",
                       "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0", "RAY_MEGATRON_ENV_UV_HOOK": "1",
                       "RAY_MEGATRON_ENV_NESTED_DRIVER": "1"}
    monkeypatch.delenv(JOB_CONFIG_VARIABLE, raising=False)
    monkeypatch.setenv("RAY_MEGATRON_ENV_UV_HOOK", "1")
    job = build_runtime_env(MEGATRON_YAML)
    env = runtime_env_hook({**job, "env_vars": {**job["env_vars"], RAY_SETUP_HOOK_VARIABLE: HOOK}})
    # what Ray's uv hook sets ("uv run --python 3.11", with " python" from 2.5x)
    assert env["py_executable"] == uv.hook({})["py_executable"]
    assert env["py_executable"].startswith("uv run --python 3.11")
    assert RAY_SETUP_HOOK_VARIABLE not in env["env_vars"]
    assert env["worker_process_setup_hook"] == HOOK


def test_with_rays_uv_switch_off_the_driver_hook_runs_and_nothing_is_said(monkeypatch):
    from ray._private import ray_constants

    uv = pytest.importorskip(UV)
    monkeypatch.setattr(uv, "_get_uv_run_cmdline", lambda: ["uv", "run", "train.py"])
    monkeypatch.setattr(ray_constants, "RAY_ENABLE_UV_RUN_RUNTIME_ENV", True)
    assert driver_hook_skipped({"RAY_RUNTIME_ENV_HOOK": f" {HOOK_PATH} "}) is not None
    monkeypatch.setattr(ray_constants, "RAY_ENABLE_UV_RUN_RUNTIME_ENV", False)
    assert driver_hook_skipped({"RAY_RUNTIME_ENV_HOOK": HOOK_PATH}) is None
    assert driver_hook_skipped({"RAY_RUNTIME_ENV_HOOK": "acme.hook"}) is None


def test_rays_uv_hook_is_run_in_place_of_ours_only_on_ray_2_47_to_2_54(monkeypatch):
    # 2.55 added setup_hook._check_setup_hook_consistency, and no longer
    # asserts on the setup hook's variable: nothing to run in its place.
    from ray._private import ray_constants
    from ray._private.runtime_env import setup_hook

    pytest.importorskip(UV)
    monkeypatch.setattr(setup_hook, "_check_setup_hook_consistency", lambda *a: None,
                        raising=False)
    assert uv_hook_replaces_driver_hook() is False
    monkeypatch.delattr(setup_hook, "_check_setup_hook_consistency")
    monkeypatch.setattr(ray_constants, "RAY_ENABLE_UV_RUN_RUNTIME_ENV", True)
    assert uv_hook_replaces_driver_hook() is True
    monkeypatch.setattr(ray_constants, "RAY_ENABLE_UV_RUN_RUNTIME_ENV", False)
    assert uv_hook_replaces_driver_hook() is False


def test_outside_uv_run_rays_uv_hook_leaves_the_env_as_it_is(monkeypatch):
    uv = pytest.importorskip(UV)
    monkeypatch.setattr(uv, "_get_uv_run_cmdline", lambda: None)
    env = {"env_vars": {"A": "1"}}
    assert rays_uv_hook(env) is env
    assert rays_uv_hook(None) is None
