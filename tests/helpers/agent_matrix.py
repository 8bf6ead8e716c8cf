"""The agent's decision matrix: GPU classes, configs and what each gets, by
hand from the rule table; the agent's own code run on one (``in_the_agent``).
tests/unit/test_agent.py runs every case on every class; tests/cluster/
test_plugin.py shows each on a live worker."""

import logging

from configs import (
    ACTOR, FSDP_YAML, MEGATRON_CP2, MEGATRON_FSDP, MEGATRON_TP1, MEGATRON_TP2, REF_ONLY,
    REWARD_MODEL_ONLY, verl,
)
from ray_megatron_env import build_runtime_env, explain
from ray_megatron_env.agent import NodeAgent
from ray_megatron_env.cache import ProbeCache
from ray_megatron_env.probe import FAKE_VARIABLE, probe_gpus

# GPU classes of the mixed cluster, and nodes whose own
# CUDA_DEVICE_MAX_CONNECTIONS competes with the decision: name -> (fake GPUs,
# the node's own value). The unit matrix runs the agent's own code for each;
# the live cluster (conftest.py "standard") has one node of each kind.
MATRIX_NODES = {"cpu_head": ("none", None), "v100": ("7.0", None), "a100": ("8.0", None),
                "h100": ("9.0,9.0", None), "b200": ("10.0", None),
                "h100_b200": ("9.0,10.0", None),
                "a100_inherit1": ("8.0", "1"), "h100_inherit4": ("9.0", "4")}
PRE_BLACKWELL = {"v100", "a100", "h100", "h100_b200"}
GPUS = {"cpu_head": [], "v100": ["7.0"], "a100": ["8.0"], "h100": ["9.0", "9.0"],
        "b200": ["10.0"], "h100_b200": ["9.0", "10.0"], "a100_inherit1": ["8.0"],
        "h100_inherit4": ["9.0"]}
QUIET = logging.getLogger("agent_matrix")
QUIET.addHandler(logging.NullHandler())
QUIET.propagate = False


CASES = {  # name: (config, role, nodes that get 1 among the GPU classes)
    "megatron TP=2": (verl(*MEGATRON_TP2), None, PRE_BLACKWELL),
    "megatron TP=2, actor role": (verl(*MEGATRON_TP2), "actor", PRE_BLACKWELL),
    "megatron CP=2": (verl(*MEGATRON_CP2), None, PRE_BLACKWELL),
    "megatron TP=1 CP=1": (verl(*MEGATRON_TP1), None, set()),
    "megatron-fsdp": (verl(*MEGATRON_FSDP), None, set()),
    "ref policy alone": (verl(*REF_ONLY), None, PRE_BLACKWELL),
    "reward model alone": (verl(*REWARD_MODEL_ONLY), None, PRE_BLACKWELL),
    "fsdp": (verl(base=FSDP_YAML), None, set()),
    "veomni": (verl(f"{ACTOR}.strategy=veomni", "actor_rollout_ref.ref.strategy=veomni",
                    "critic.strategy=veomni", base=FSDP_YAML), None, set()),
    "torchtitan": (verl(f"{ACTOR}.strategy=torchtitan", "critic.strategy=torchtitan",
                        base=FSDP_YAML), None, set()),
}
# On the nodes with a value of their own, by hand from the rule table: a
# node's 1 meets a "1" requirement and is kept (source node), its 4 is
# replaced by the policy's 1; a "not 1" preference replaces a node's 1 with
# CUDA's default 8 and keeps its 4; a config that asks nothing keeps either.
INHERITED = {True: {"a100_inherit1": ("1", "node"), "h100_inherit4": ("1", "policy")},
             "asks nothing": {"a100_inherit1": ("1", "node"), "h100_inherit4": ("4", "node")},
             False: {"a100_inherit1": ("8", "policy"), "h100_inherit4": ("4", "node")}}
EXPLAINED = ("value", "source", "reason", "requirement", "gpus", "engines", "rules", "strengths",
             "because", "warnings", "satisfied", "conflict", "node_value", "process", "framework")


def expected(name, node):
    """(value, source) for case ``name`` on node ``node`` of MATRIX_NODES."""
    nodes_with_1 = CASES[name][2]
    if node in INHERITED[True]:
        asks = "asks nothing" if name == "megatron TP=1 CP=1" else bool(nodes_with_1)
        return INHERITED[asks][node]
    return ("1", "policy") if node in nodes_with_1 else (None, "none")


def in_the_agent(config, role, node, base=None):
    """What the agent of ``node`` decides for a worker of this config: the
    plugin's own code (``agent.NodeAgent``, which ``modify_context`` calls),
    its probe reading the node's fake GPUs, the node's own value as its
    environment."""
    gpus, own = MATRIX_NODES[node]
    runtime_env = build_runtime_env(config, role=role, base=base)
    env_vars = dict(runtime_env.get("env_vars", {}))
    node_environ = {"CUDA_DEVICE_MAX_CONNECTIONS": own} if own else {}
    agent = NodeAgent(ProbeCache(probe=lambda: probe_gpus({FAKE_VARIABLE: gpus})))
    decision = agent.decide_and_write(runtime_env, env_vars, node_environ, QUIET)
    # The worker inherits the node's environment under its env_vars.
    return {**node_environ, **env_vars}.get("CUDA_DEVICE_MAX_CONNECTIONS"), decision


def agrees_with_explain(name, node, value, decision):
    config, role, _ = CASES[name]
    gpus, own = MATRIX_NODES[node]
    offline = explain(config, gpus, role=role, node_value=own)
    assert value == offline.value, (name, node)
    for key in EXPLAINED:
        assert getattr(decision, key) == getattr(offline, key), (name, node, key)


PRECEDENCE = [  # config, node, explicit (env_vars), value, source, warned
    (MEGATRON_TP2, "h100_b200", "1", "1", "explicit", False),
    (MEGATRON_TP2, "h100_b200", "8", "8", "explicit", True),
    (MEGATRON_FSDP, "h100_b200", "1", "1", "explicit", True),
    (MEGATRON_TP2, "a100_inherit1", None, "1", "node", False),
    (MEGATRON_FSDP, "a100_inherit1", None, "8", "policy", False),
]
# The same rules for a node whose own value is 4: decided by the agent's
# code (unit), as the two inheriting branches above are shown live.
PRECEDENCE_UNIT = PRECEDENCE + [
    (MEGATRON_TP2, "h100_inherit4", None, "1", "policy", False),
    (MEGATRON_FSDP, "h100_inherit4", None, "4", "node", False),
    (MEGATRON_TP1, "h100_inherit4", None, "4", "node", False),
]
