"""The plugin called as Ray's agent calls it (validate, create,
modify_context), in process: what a worker's environment gets, what the
agent refuses, and what it keeps per worker. The same on live agents:
tests/cluster/test_plugin.py, cluster/test_bad_input.py, cluster/test_load.py."""

import asyncio
import gc
import logging
import os
import tracemalloc

import pytest
from ray._private.runtime_env.context import RuntimeEnvContext
from ray.runtime_env import RuntimeEnv

from configs import verl
from ray_megatron_env import build_runtime_env
from ray_megatron_env.errors import FieldValueError
from ray_megatron_env.plugin import MegatronEnvPlugin

ROLES = ("actor", "critic", "rollout", ("actor", "rollout"), None)
QUIET = logging.getLogger("test_plugin.agent")
QUIET.addHandler(logging.NullHandler())
QUIET.propagate = False


def in_the_agent(monkeypatch, runtime_env, gpus="9.0,10.0"):
    """A worker's env_vars after the plugin's three calls, on a node whose
    fake GPUs are ``gpus``; the plugin's error, raised, where it refuses."""
    monkeypatch.setenv("RAY_MEGATRON_ENV_FAKE_GPUS", gpus)
    env, context = RuntimeEnv(**runtime_env), RuntimeEnvContext()
    plugin, loop = MegatronEnvPlugin(), asyncio.new_event_loop()
    try:
        plugin.validate(env)
        loop.run_until_complete(plugin.create(None, env, context, QUIET))
        plugin.modify_context([], env, context, QUIET)
    finally:
        loop.close()
    return context.env_vars


# What the three live repeats of the bad-input matrix claimed beside it
# (the matrix itself, with its time bound, runs live in
# tests/cluster/test_bad_input.py).

def test_an_unknown_strategy_lists_the_known_ones(monkeypatch):
    field = {"actor_rollout_ref": {"actor": {"strategy": "megatorn"}}}
    with pytest.raises(FieldValueError) as info:
        in_the_agent(monkeypatch, {"megatron_env": field})
    for words in ("unknown strategy 'megatorn'", "actor_rollout_ref.actor.strategy", "fsdp"):
        assert words in str(info.value)


def test_an_interpolation_in_a_key_nobody_reads_is_ignored_not_resolved(monkeypatch):
    field = {"critic": {"strategy": "fsdp", "megatron": "${oc.env:HOME}"}, "x": 1}
    env_vars = in_the_agent(monkeypatch, {"megatron_env": field})
    assert env_vars.get("CUDA_DEVICE_MAX_CONNECTIONS") is None
    assert os.environ["HOME"] not in env_vars["RAY_MEGATRON_ENV_DECISION"]


def test_an_interpolation_where_a_value_is_read_is_quoted_never_resolved(monkeypatch):
    field = {"actor_rollout_ref": {"actor": {"strategy": "${oc.env:HOME}"}}}
    with pytest.raises(FieldValueError) as info:
        in_the_agent(monkeypatch, {"megatron_env": field})
    assert "unresolved interpolation '${oc.env:HOME}'" in str(info.value)
    assert f"'{os.environ['HOME']}'" not in str(info.value)


def test_a_bad_explicit_value_is_refused_for_a_job_that_asks_nothing(monkeypatch):
    env = {"megatron_env": {"engines": {}}, "env_vars": {"CUDA_DEVICE_MAX_CONNECTIONS": "64"}}
    with pytest.raises(FieldValueError, match="CUDA accepts an integer from 1 to 32"):
        in_the_agent(monkeypatch, env)


class _Formatting(logging.Handler):
    """Formats every record, as the agent's file handler does, and keeps none."""

    def emit(self, record):
        self.format(record)


def test_the_plugin_keeps_nothing_per_worker(monkeypatch):
    monkeypatch.setenv("RAY_MEGATRON_ENV_FAKE_GPUS", "9.0,10.0")
    logger = logging.getLogger("test_load.agent")
    logger.addHandler(_Formatting())
    logger.propagate = False
    envs = [RuntimeEnv(**build_runtime_env(verl("critic.strategy=fsdp"), role=role))
            for role in ROLES]
    plugin = MegatronEnvPlugin()
    loop = asyncio.new_event_loop()

    def workers(count):
        for i in range(count):
            env, context = envs[i % len(envs)], RuntimeEnvContext()
            # What Ray's create_for_plugin_if_needed does for a plugin without URIs.
            plugin.validate(env)
            loop.run_until_complete(plugin.create(None, env, context, logger))
            plugin.modify_context([], env, context, logger)
        return context

    try:
        last = workers(100)  # the probe, the caches, the imports: once
        assert last.env_vars["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"  # None: H100+B200 -> 1
        # Collected first: a decision's reference cycles wait for the
        # collector, and are not kept.
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.take_snapshot()
        workers(500)
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
        loop.close()
    grown = after.compare_to(before, "lineno")
    kept = sum(stat.size_diff for stat in grown)
    # 500 worker starts: under 32 bytes each on average (a decision kept per
    # worker is about 2.4 KiB: 1.2 MiB here).
    assert kept < 16 * 1024, [str(stat) for stat in grown[:5]]
