"""The RAY_RUNTIME_ENV_HOOK hook, called directly (the cluster test calls it
through ray.init)."""

import logging

import pytest
from omegaconf import OmegaConf

from configs import MEGATRON_YAML, job_env, plain, verl
from ray_megatron_env import build_runtime_env
from ray_megatron_env.errors import EnvironmentVariableError, FieldValueError
from ray_megatron_env.hook import runtime_env_hook
from ray_megatron_env.names import NEXT_DRIVER_HOOK_VARIABLE as NEXT_HOOK_VARIABLE, TAKE_OVER_VARIABLE

COMPACT = build_runtime_env(MEGATRON_YAML)["megatron_env"]
HARD_CODED = {"CUDA_DEVICE_MAX_CONNECTIONS": "1", "NCCL_DEBUG": "WARN"}


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    monkeypatch.delenv(TAKE_OVER_VARIABLE, raising=False)
    monkeypatch.delenv(NEXT_HOOK_VARIABLE, raising=False)


@pytest.mark.parametrize("field", [verl(), plain(), str(MEGATRON_YAML), COMPACT])
def test_any_config_form_becomes_the_compact_field(field):
    env = runtime_env_hook({"megatron_env": field, "working_dir": "."})
    assert env == job_env(COMPACT, working_dir=".")


def test_omegaconf_values_elsewhere_in_the_env_become_plain():
    env = runtime_env_hook({"megatron_env": verl(),
                            "env_vars": OmegaConf.create({"A": "${B}", "B": "v"})})
    assert env["env_vars"] == job_env(COMPACT, {"A": "v", "B": "v"})["env_vars"]
    assert type(env["env_vars"]) is dict


def test_a_bad_config_fails_on_the_driver():
    with pytest.raises(FieldValueError, match="unknown strategy 'megatorn'"):
        runtime_env_hook({"megatron_env": verl("actor_rollout_ref.actor.strategy=megatorn")})


def test_without_the_field_the_env_is_untouched():
    env = {"env_vars": dict(HARD_CODED)}
    assert runtime_env_hook(env) == {"env_vars": HARD_CODED}
    assert runtime_env_hook(None) is None


def test_explicit_value_stays_explicit_without_take_over():
    env = runtime_env_hook({"megatron_env": verl(), "env_vars": dict(HARD_CODED)})
    assert env == job_env(COMPACT, HARD_CODED)


def test_take_over_removes_the_hard_coded_value(monkeypatch):
    monkeypatch.setenv(TAKE_OVER_VARIABLE, "1")
    env = runtime_env_hook({"megatron_env": verl(), "env_vars": dict(HARD_CODED)})
    assert env == job_env(COMPACT, {"NCCL_DEBUG": "WARN"})


def test_take_over_keeps_the_value_the_user_set_in_the_config(monkeypatch):
    monkeypatch.setenv(TAKE_OVER_VARIABLE, "true")
    config = verl("ray_kwargs.ray_init.runtime_env.env_vars.CUDA_DEVICE_MAX_CONNECTIONS='4'")
    env = runtime_env_hook({"megatron_env": config, "env_vars": dict(HARD_CODED)})
    assert env["env_vars"]["CUDA_DEVICE_MAX_CONNECTIONS"] == "4"


def test_take_over_without_a_config_keeps_the_value_and_says_why(monkeypatch, caplog):
    # verl's legacy call sites pass no config: nothing to decide from, so
    # the hard-coded value stays rather than silently dropping Megatron's 1.
    monkeypatch.setenv(TAKE_OVER_VARIABLE, "1")
    with caplog.at_level(logging.WARNING, logger="ray_megatron_env.hook"):
        env = runtime_env_hook({"env_vars": dict(HARD_CODED)})
    assert env == {"env_vars": HARD_CODED}
    assert "no megatron_env field" in caplog.text


def test_build_runtime_env_take_over_leaves_base_alone():
    base = {"env_vars": dict(HARD_CODED)}
    env = build_runtime_env(verl(), base=base, take_over=True)
    assert env == job_env(COMPACT, {"NCCL_DEBUG": "WARN"}) and base == {"env_vars": HARD_CODED}


def chained(runtime_env):
    return {**runtime_env, "chained": True}


def test_another_hook_runs_after_this_one(monkeypatch):
    monkeypatch.setenv(NEXT_HOOK_VARIABLE, f"{__name__}.chained")
    assert runtime_env_hook({"megatron_env": COMPACT}) == job_env(COMPACT, chained=True)


@pytest.mark.parametrize("value,words", [
    ("chained", "must name a function as 'package.module.function'"),
    ("no_such_module_here.hook", "cannot be loaded: ModuleNotFoundError"),
    (f"{__name__}.not_there", "cannot be loaded: AttributeError"),
    (f"{__name__}.NOT_A_FUNCTION", "is not a function"),
])
def test_a_bad_next_hook_names_the_variable(monkeypatch, value, words):
    monkeypatch.setenv(NEXT_HOOK_VARIABLE, value)
    with pytest.raises(EnvironmentVariableError) as info:
        runtime_env_hook({"env_vars": {}})
    assert str(info.value).startswith(f"{NEXT_HOOK_VARIABLE}={value!r}")
    assert words in str(info.value)


NOT_A_FUNCTION = 3


def test_a_bad_take_over_value_names_the_variable(monkeypatch):
    monkeypatch.setenv(TAKE_OVER_VARIABLE, "sure")
    with pytest.raises(EnvironmentVariableError, match=f"{TAKE_OVER_VARIABLE}='sure': use one of"):
        runtime_env_hook({"env_vars": {}})
