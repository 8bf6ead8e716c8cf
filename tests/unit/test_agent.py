"""The node agent's own code (``agent.NodeAgent``, what the plugin's
modify_context calls) for every config on every GPU class, every role, the
precedence rules and a malformed probe; the same cases on live workers:
tests/cluster/test_plugin.py."""

import pytest

from agent_matrix import (
    CASES, GPUS, MATRIX_NODES, PRECEDENCE_UNIT, QUIET, agrees_with_explain, expected, in_the_agent,
)
from configs import MEGATRON_TP2, verl
from ray_megatron_env import build_runtime_env
from ray_megatron_env.agent import NodeAgent
from ray_megatron_env.cache import ProbeCache
from ray_megatron_env.probe import FAKE_VARIABLE, probe_gpus


# Unit: every case on every GPU class and on both inheriting nodes, through
# the agent's code without Ray (until 0.1.0 this matrix ran on live workers:
# 38 worker starts). Live: every case once on a real worker, tests/cluster/test_plugin.py.
@pytest.mark.parametrize("name", CASES)
def test_each_config_gets_1_exactly_on_pre_blackwell_nodes(name):
    for node in MATRIX_NODES:
        value, decision = in_the_agent(CASES[name][0], CASES[name][1], node)
        want, source = expected(name, node)
        assert (value, decision.value, decision.source) == (want, want, source), (name, node)
        assert decision.gpus == GPUS[node]
        assert decision.reason.endswith(".")
        assert decision.via == "plugin"


@pytest.mark.parametrize("name", CASES)
def test_explain_gives_the_same_decision_as_the_agent_on_each_node(name):
    for node in MATRIX_NODES:
        agrees_with_explain(name, node, *in_the_agent(CASES[name][0], CASES[name][1], node))


@pytest.mark.parametrize("role,expected", [
    ("actor", "1"), ("ref", "1"), ("critic", None), ("rollout", None), ("reward_model", "1"),
])
def test_every_role_alone(role, expected):
    # Unit: build_runtime_env narrows the field to the role on the driver;
    # the agent's code decides from what is left. A per-role env on a live
    # worker: test_per_role_envs_split_a_megatron_actor_from_an_fsdp_critic.
    config = verl(*MEGATRON_TP2, "reward_model.enable=true", "reward_model.strategy=megatron",
                  "reward_model.megatron.tensor_model_parallel_size=2",
                  "reward_model.megatron.context_parallel_size=1")
    value, decision = in_the_agent(config, role, "h100")
    assert value == expected
    assert list(decision.engines) == [role]


@pytest.mark.parametrize("config,node,explicit,value,source,warned", PRECEDENCE_UNIT)
def test_precedence_in_the_agent(config, node, explicit, value, source, warned):
    base = {"env_vars": {"CUDA_DEVICE_MAX_CONNECTIONS": explicit}} if explicit else None
    got, decision = in_the_agent(verl(*config), None, node, base=base)
    assert (got, decision.value, decision.source) == (value, value, source)
    assert bool(decision.warnings) == warned


def test_a_malformed_fake_is_recorded_and_treated_conservatively():
    # Unit: the agent's code, its probe reading "9.x" (until 0.1.0 a node of
    # its own). A probe error recorded in a live worker's decision, with the
    # conservative value: test_a_hung_nvidia_smi_does_not_block_the_agent
    # in tests/cluster/test_plugin.py, and cluster/test_faults.py's smi_missing and nvidia_listed nodes.
    env = build_runtime_env(verl(*MEGATRON_TP2))
    env_vars = dict(env["env_vars"])
    agent = NodeAgent(ProbeCache(probe=lambda: probe_gpus({FAKE_VARIABLE: "9.x"})))
    decision = agent.decide_and_write(env, env_vars, {}, QUIET)
    assert env_vars["CUDA_DEVICE_MAX_CONNECTIONS"] == "1" and decision.gpus is None
    assert "9.x" in decision.probe["error"] and decision.warnings
