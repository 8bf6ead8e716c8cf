"""Load: many actors at once on several nodes, with several runtime envs;
and the plugin, called as Ray's agent calls it, many times over.

Live (marked slow, run by .ci/run): every worker gets its node's value, the
probe runs once per node per agent process, nothing deadlocks, and the
agents' resident memory stays flat. 64 actors, 16 per agent (each of the
20 node and runtime-env pairs three times or more): each worker start costs
about 1.5 CPU-seconds here, so this is the test's largest cost, and the
agents' RSS can only show a retention of about a MiB per worker (its noise is
MiBs).
In process: tests/unit/test_plugin.py, the plugin's own calls under
tracemalloc.
"""

import time

import pytest

from configs import verl
from ray_megatron_env import build_runtime_env
from ray_megatron_env.check import observe_many
from conftest import NODE_SETS

CLUSTER = "registered"
ACTORS = 64

ROLES = ("actor", "critic", "rollout", ("actor", "rollout"), None)
# Golden values, written from the rule table for verl_megatron.yaml with an
# FSDP critic (actor and ref Megatron TP=2, rollout vLLM): per role, on a node
# with GPUs older than Blackwell. A node without GPUs, and a Blackwell node
# (Megatron-LM asks for 1 only below compute capability 10), get nothing for
# any. None (every role, one job env): the worker has no WG_PREFIX, so it is
# one of verl's trainer processes: actor, ref (1) and the FSDP critic (not 1)
# share it; the preferences conflict and 1 wins.
GOLDEN_PRE_BLACKWELL = {"actor": "1", "critic": None, "rollout": None,
                        ("actor", "rollout"): "1", None: "1"}
NOTHING_SET = ("none", "10.0")


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def start(cluster, plan):
    """One actor per (node, runtime env) of ``plan``, all started at once, the
    way ``check`` starts them (each ends as soon as it has answered):
    [(value, decision)]."""
    observed = observe_many([([(cluster.node_ids[node], "-")], env) for node, env in plan],
                            timeout_s=900)
    assert all(report.error is None for report, in observed), observed
    return [(report.value, report.decision) for report, in observed]


@pytest.mark.slow
def test_many_actors_at_once(cluster):
    config = verl("critic.strategy=fsdp")
    envs = [build_runtime_env(config, role=role) for role in ROLES]
    nodes = {node.name: node for node in NODE_SETS[CLUSTER]}
    assert {node.fake_gpus for node in nodes.values()} == {"none", "8.0", "9.0,9.0", "10.0"}
    expected = {(name, i): None if node.fake_gpus in NOTHING_SET else GOLDEN_PRE_BLACKWELL[ROLES[i]]
                for name, node in nodes.items() for i in range(len(ROLES))}
    plan = [(name, i) for n in range(ACTORS)
            for name, i in [(list(nodes)[n % len(nodes)], (n // len(nodes)) % len(ROLES))]]

    # Warm up: one worker per node, so each agent has loaded the plugin and
    # probed once; then measure the agents.
    warm = start(cluster, [(name, envs[0]) for name in nodes])
    agents = {d.probe["pid"] for _, d in warm}
    assert len(agents) == len(nodes)
    before = {pid: rss_mib(pid) for pid in agents}

    started = time.monotonic()
    results = start(cluster, [(name, envs[i]) for name, i in plan])
    took = time.monotonic() - started
    assert len(results) == ACTORS

    by_node = {}
    for (name, i), (value, decision) in zip(plan, results):
        assert value == decision.value == expected[name, i], (name, ROLES[i])
        by_node.setdefault(name, set()).add((decision.probe["pid"], decision.probe["probed_at"]))
    # One probe per node: every decision there carries the same agent pid and
    # the same probe time as the warm-up's.
    for name, probes in by_node.items():
        assert len(probes) == 1, (name, probes)
    assert {pid for probes in by_node.values() for pid, _ in probes} == agents

    growth = {pid: rss_mib(pid) - before[pid] for pid in agents}
    assert max(growth.values()) < 16, growth  # no per-worker state
    print(f"{ACTORS} actors in {took:.1f} s; agent RSS growth (MiB): "
          f"{ {pid: round(g, 1) for pid, g in growth.items()} }")
