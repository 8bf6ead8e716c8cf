"""The bad-input matrix (helpers/reliability_cases.py) on both sides: the driver
helper and hook raise the documented error; the agent of a real node fails
the worker fast with the same words, never a hang."""

import time

import pytest
import ray
from ray.exceptions import RuntimeEnvSetupError

from ray_megatron_env import build_runtime_env
from ray_megatron_env.hook import runtime_env_hook
from reliability_cases import BAD_INPUTS

NODES = ("cpu_head", "a100", "b200", "h100_b200")  # every registered GPU class of the set


@ray.remote(num_cpus=0)
def started():
    return True


def test_the_matrix_is_big_enough_and_ids_are_unique():
    assert len(BAD_INPUTS) >= 40
    assert len({case.id for case in BAD_INPUTS}) == len(BAD_INPUTS)


@pytest.mark.parametrize("case", BAD_INPUTS, ids=lambda case: case.id)
def test_driver_helper_refuses(case):
    base = {k: v for k, v in case.runtime_env.items() if k != "megatron_env"}
    with pytest.raises(case.error) as info:
        build_runtime_env(case.runtime_env["megatron_env"], base=base)
    assert str(info.value).startswith("megatron_env: ") and case.says in str(info.value)


@pytest.mark.parametrize("case", BAD_INPUTS, ids=lambda case: case.id)
def test_hook_refuses(case):
    with pytest.raises(case.error) as info:
        runtime_env_hook(dict(case.runtime_env))
    assert case.says in str(info.value)


# Which inputs Ray itself refuses in the driver (TypeError) and which reach
# the agent, and how the agent's error comes back: Ray's, per version.
@pytest.mark.ray_version_specific
def test_the_agent_refuses_every_bad_input_fast(cluster):
    # All at once, spread over the nodes: each must come back as a
    # RuntimeEnvSetupError naming the problem, none may hang.
    submitted = {}
    for i, case in enumerate(BAD_INPUTS):
        options = dict(runtime_env=case.runtime_env, **cluster.pin(NODES[i % len(NODES)]))
        if not case.reaches_agent:
            with pytest.raises(TypeError):  # Ray's own check, before anything is scheduled
                started.options(**options).remote()
            continue
        submitted[started.options(**options).remote()] = (case, time.monotonic())
    took = {}
    pending = list(submitted)
    deadline = time.monotonic() + 120
    while pending and time.monotonic() < deadline:
        ready, pending = ray.wait(pending, num_returns=1, timeout=deadline - time.monotonic())
        for ref in ready:
            case, at = submitted[ref]
            took[case.id] = time.monotonic() - at
            with pytest.raises(RuntimeEnvSetupError) as info:
                ray.get(ref)
            assert case.in_agent in str(info.value), case.id
    assert not pending, "some bad inputs hung in the agent"
    assert max(took.values()) < 60, took
