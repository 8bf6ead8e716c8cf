"""The bad-input matrix (helpers/reliability_cases.py) in the agent of a real
node: the worker fails fast with the driver's words (tests/unit/test_bad_input.py),
never a hang."""

import time

import pytest
import ray
from ray.exceptions import RuntimeEnvSetupError

from reliability_cases import BAD_INPUTS
from workers import start_on

NODES = ("cpu_head", "a100", "b200", "h100_b200")  # every registered GPU class of the set


# Which inputs Ray itself refuses in the driver (TypeError) and which reach
# the agent, and how the agent's error comes back: Ray's, per version.
@pytest.mark.ray_version_specific
def test_the_agent_refuses_every_bad_input_fast(cluster):
    # All at once, spread over the nodes: each must come back as a
    # RuntimeEnvSetupError naming the problem, none may hang.
    submitted = {}
    for i, case in enumerate(BAD_INPUTS):
        node = NODES[i % len(NODES)]
        if not case.reaches_agent:
            with pytest.raises(TypeError):  # Ray's own check, before anything is scheduled
                start_on(cluster, node, case.runtime_env)
            continue
        submitted[start_on(cluster, node, case.runtime_env)] = (case, time.monotonic())
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
