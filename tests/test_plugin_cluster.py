"""The plugin on a real local multi-node cluster (see conftest.py).

Nodes fake their GPUs through RAY_MEGATRON_ENV_FAKE_GPUS; everything else
(the agent loading the plugin, the field travelling with the task spec, the
worker's environment) is Ray's real machinery.
"""

import glob
import json
import os
import subprocess
import sys
import textwrap
import time

import pytest
import ray
from ray.exceptions import RuntimeEnvSetupError

from configs import (
    ACTOR, FSDP_YAML, MEGATRON_CP2, MEGATRON_FSDP, MEGATRON_TP1, MEGATRON_TP2, REF_ONLY,
    REWARD_MODEL_ONLY, verl,
)
from ray_megatron_env import build_runtime_env, explain
from ray_megatron_env.check import observe_many
from ray_megatron_env.probe import probe_gpus

from conftest import NODE_SETS

MIXED = ("cpu_head", "v100", "a100", "h100", "b200", "h100_b200")
PRE_BLACKWELL = {"v100", "a100", "h100", "h100_b200"}
GPUS = {"cpu_head": [], "v100": ["7.0"], "a100": ["8.0"], "h100": ["9.0", "9.0"],
        "b200": ["10.0"], "h100_b200": ["9.0", "10.0"]}


@ray.remote(num_cpus=0)
def worker_env():
    return (os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS"),
            os.environ.get("RAY_MEGATRON_ENV_DECISION"))


@ray.remote(num_cpus=0)
class Trainer:
    def env(self):
        from ray_megatron_env import read_decision
        return os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS"), read_decision()


def on_nodes(cluster, runtime_env, nodes):
    """{node: (value, decision dict or None)} from a task on each node."""
    refs = [worker_env.options(runtime_env=runtime_env, **cluster.pin(n)).remote() for n in nodes]
    results = ray.get(refs, timeout=180)
    return {n: (v, json.loads(d) if d else None) for n, (v, d) in zip(nodes, results)}


def values(results):
    return {node: value for node, (value, _) in results.items()}


# Every mixed node for one case; for the others, the nodes that tell their
# answer apart (an older architecture, the Blackwell boundary and a node
# mixing both; a node that gets 1 under another case for those that get
# none). The whole GPU-class matrix is the unit tests' golden table; here
# each config's decision is shown to reach a real worker through the agent.
# Each (case, node) costs a worker start (about a CPU-second on 2 cores).
ALL_NODES_CASE = "megatron TP=2"
TELLING = ("a100", "b200", "h100_b200")
NONE_TELLING = ("v100", "h100_b200")
CASES = {  # name: (config, role, nodes that get 1 among MIXED)
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
# Nodes whose own CUDA_DEVICE_MAX_CONNECTIONS competes with the decision: the
# offline explanation must agree there too (source "node" or "policy").
INHERITING = ("a100_inherit1", "h100_inherit4")
ON_INHERITING = ("megatron TP=2", "megatron TP=2, actor role", "megatron TP=1 CP=1",
                 "megatron-fsdp", "fsdp")


def nodes_for(case):
    if case == ALL_NODES_CASE:
        return MIXED
    return TELLING if CASES[case][2] else NONE_TELLING


@pytest.fixture(scope="module")
def every_case(cluster):
    """{(case, node): (value, Decision)}: every case on the mixed nodes that
    tell it apart, and some on the inheriting nodes, in one round of workers."""
    envs = {name: build_runtime_env(config, role=role)
            for name, (config, role, _) in CASES.items()}
    plan = [(name, node) for name in CASES for node in nodes_for(name)]
    plan += [(name, node) for name in ON_INHERITING for node in INHERITING]
    observed = observe_many([([(cluster.node_ids[node], "-")], envs[name]) for name, node in plan],
                            timeout_s=300)
    assert all(report.error is None for report, in observed), observed
    return {key: (report.value, report.decision) for key, (report,) in zip(plan, observed)}


def test_each_config_gets_1_exactly_on_pre_blackwell_nodes(every_case):
    for name, (_, _, nodes_with_1) in CASES.items():
        nodes = nodes_for(name)
        expected = {node: "1" if node in nodes_with_1 else None for node in nodes}
        assert {node: every_case[name, node][0] for node in nodes} == expected, name
        for node in nodes:
            decision = every_case[name, node][1]
            assert decision.value == expected[node]
            assert decision.gpus == GPUS[node]
            assert decision.reason.endswith(".")


def test_explain_gives_the_same_decision_as_the_plugin_on_each_node(every_case):
    nodes = {node.name: node for node in NODE_SETS["standard"]}
    assert len(every_case) == sum(len(nodes_for(name)) for name in CASES) \
        + len(ON_INHERITING) * len(INHERITING)
    for (name, node_name), (value, on_node) in every_case.items():
        config, role, _ = CASES[name]
        node = nodes[node_name]
        offline = explain(config, node.fake_gpus, role=role,
                          node_value=node.env.get("CUDA_DEVICE_MAX_CONNECTIONS"))
        assert value == offline.value, (name, node_name)
        for key in ("value", "source", "reason", "requirement", "gpus", "engines", "rules",
                    "strengths", "because", "warnings", "satisfied", "conflict",
                    "node_value", "process", "framework"):
            assert getattr(on_node, key) == getattr(offline, key), (name, node_name, key)


def test_decision_reads_back_inside_an_actor(cluster):
    env = build_runtime_env(verl(*MEGATRON_TP2), role="actor")
    trainer = Trainer.options(runtime_env=env, **cluster.pin("h100_b200")).remote()
    value, decision = ray.get(trainer.env.remote(), timeout=120)
    assert value == decision.value == "1"
    assert decision.source == "policy"
    assert decision.gpus == ["9.0", "10.0"]
    assert decision.rules == {"actor": "megatron-model-parallel"}
    assert "9.0 (the oldest of 9.0, 10.0)" in decision.reason
    assert decision.probe["method"] == "fake"
    ray.kill(trainer)


def test_per_role_envs_split_a_megatron_actor_from_an_fsdp_critic(cluster):
    config = verl(*MEGATRON_TP2, "critic.strategy=fsdp")
    actors = {role: Trainer.options(runtime_env=build_runtime_env(config, role=role),
                                    **cluster.pin("a100")).remote()
              for role in ("actor", "critic")}
    got = {role: ray.get(a.env.remote(), timeout=120) for role, a in actors.items()}
    assert got["actor"][0] == "1"
    assert got["critic"][0] is None and got["critic"][1].requirement == "not 1"
    # Together in one env they conflict: 1 wins, and the reason says so.
    (value, decision), = on_nodes(cluster, build_runtime_env(config), ["a100"]).values()
    assert value == "1" and decision["conflict"] and "conflict" in decision["reason"]
    for actor in actors.values():
        ray.kill(actor)


@pytest.mark.parametrize("role,expected", [
    ("actor", "1"), ("ref", "1"), ("critic", None), ("rollout", None), ("reward_model", "1"),
])
def test_every_role_alone(cluster, role, expected):
    config = verl(*MEGATRON_TP2, "reward_model.enable=true", "reward_model.strategy=megatron",
                  "reward_model.megatron.tensor_model_parallel_size=2",
                  "reward_model.megatron.context_parallel_size=1")
    (value, decision), = on_nodes(cluster, build_runtime_env(config, role=role), ["h100"]).values()
    assert value == expected
    assert list(decision["engines"]) == [role]


@pytest.mark.parametrize("config,node,explicit,value,source,warned", [
    (MEGATRON_TP2, "h100", "1", "1", "explicit", False),
    (MEGATRON_TP2, "h100", "8", "8", "explicit", True),
    (MEGATRON_FSDP, "h100", "1", "1", "explicit", True),
    (MEGATRON_TP2, "a100_inherit1", None, "1", "node", False),
    (MEGATRON_FSDP, "a100_inherit1", None, "8", "policy", False),
    (MEGATRON_TP2, "h100_inherit4", None, "1", "policy", False),
    (MEGATRON_FSDP, "h100_inherit4", None, "4", "node", False),
    (MEGATRON_TP1, "h100_inherit4", None, "4", "node", False),
])
def test_precedence_on_real_nodes(cluster, config, node, explicit, value, source, warned):
    base = {"env_vars": {"CUDA_DEVICE_MAX_CONNECTIONS": explicit}} if explicit else None
    env = build_runtime_env(verl(*config), base=base)
    (got, decision), = on_nodes(cluster, env, [node]).values()
    assert (got, decision["value"], decision["source"]) == (value, value, source)
    assert bool(decision["warnings"]) == warned


def test_a_task_env_alone_is_not_decided_on_a_node_without_the_plugin(cluster):
    # Ray ignores the field there, and honours worker_process_setup_hook only
    # in the job's env (ray.init): the fallback needs the job env
    # (tests/test_fallback_cluster.py).
    env = build_runtime_env(verl(*MEGATRON_TP2))
    assert on_nodes(cluster, env, ["unplugged"]) == {"unplugged": (None, None)}


def test_nvml_unloadable_falls_back_to_nvidia_smi_on_a_real_node(cluster):
    # The node probes in auto mode: NVML first, which cannot load here, then
    # tests/fakes/nvidia-smi on its PATH, which lists 8.0 and 9.0; the node
    # shows workers GPU-2222... (9.0) only.
    if probe_gpus({}).method == "nvml":
        pytest.skip("NVML loads on this machine, so the node would not fall back")
    (value, decision), = on_nodes(cluster, build_runtime_env(verl()), ["smi"]).values()
    assert decision["gpus"] == ["9.0"] and decision["probe"]["method"] == "nvidia-smi"
    assert "the NVML library (libnvidia-ml) cannot be loaded" in decision["probe"]["detail"]
    assert value == "1"


def test_nvml_path_on_a_real_node_agrees_with_a_local_probe(cluster):
    local = probe_gpus({})  # same machine, same NVML, no fake
    (_, decision), = on_nodes(cluster, build_runtime_env(verl()), ["real_nvml"]).values()
    # This machine has no NVML library and no nvidia-smi: both say so through
    # the listing step; a GPU machine answers through NVML.
    assert decision["probe"]["method"] == local.method in ("nvml", "nvidia-smi", "listing")
    assert decision["gpus"] == local.labels()


def test_a_malformed_fake_is_recorded_and_treated_conservatively(cluster):
    results = on_nodes(cluster, build_runtime_env(verl(*MEGATRON_TP2)), ["bad_fake"])
    value, decision = results["bad_fake"]
    assert value == "1" and decision["gpus"] is None
    assert "9.x" in decision["probe"]["error"] and decision["warnings"]


def test_a_hung_nvidia_smi_does_not_block_the_agent(cluster):
    megatron = worker_env.options(runtime_env=build_runtime_env(verl(*MEGATRON_TP2)),
                                  **cluster.pin("smi_hang")).remote()
    time.sleep(0.5)  # the probe is now waiting on the hung nvidia-smi
    started = time.monotonic()
    plain = worker_env.options(runtime_env={"env_vars": {"X": "1"}}, **cluster.pin("smi_hang"))
    ray.get(plain.remote(), timeout=60)
    other_env_took = time.monotonic() - started
    value, decision = ray.get(megatron, timeout=60)
    assert other_env_took < 3.0, "the agent's event loop was blocked by the probe"
    assert value == "1" and "did not answer within 3 s" in json.loads(decision)["probe"]["error"]


@pytest.mark.parametrize("field,words", [
    ({"actor_rollout_ref": {"actor": {"strategy": "megatorn"}}},
     ["unknown strategy 'megatorn'", "actor_rollout_ref.actor.strategy", "fsdp"]),
    ({"engines": {"a": {"strategy": "megatron", "tensor_parallel": 0}}},
     ["engines.a.tensor_parallel"]),
    ("megatron", ["the field must be a mapping"]),
    ({"critic": {"strategy": "fsdp", "megatron": "${oc.env:HOME}"}, "x": 1}, []),
])
def test_bad_raw_input_fails_fast_in_the_agent(cluster, field, words):
    env = {"megatron_env": field}
    if not words:  # not an error: an unread key is never resolved, only ignored
        assert on_nodes(cluster, env, ["h100"])["h100"][0] is None
        return
    started = time.monotonic()
    with pytest.raises(RuntimeEnvSetupError) as info:
        ray.get(worker_env.options(runtime_env=env, **cluster.pin("h100")).remote(), timeout=60)
    assert time.monotonic() - started < 30
    for word in words:
        assert word in str(info.value)


def test_a_bad_explicit_value_fails_in_the_agent(cluster):
    env = {"megatron_env": {"engines": {}}, "env_vars": {"CUDA_DEVICE_MAX_CONNECTIONS": "64"}}
    with pytest.raises(RuntimeEnvSetupError, match="CUDA accepts an integer from 1 to 32"):
        ray.get(worker_env.options(runtime_env=env, **cluster.pin("v100")).remote(), timeout=60)


def test_the_decision_is_in_the_nodes_setup_log(cluster):
    on_nodes(cluster, build_runtime_env(verl(*MEGATRON_CP2), role="actor"), ["v100"])
    logs = glob.glob(os.path.join(cluster.logs_dir(), "runtime_env_setup-*.log"))
    text = "".join(open(path, errors="replace").read() for path in logs)
    assert "megatron_env: CUDA_DEVICE_MAX_CONNECTIONS=1 (source: policy; via: plugin; GPUs: ['7.0'])" in text
    assert "actor (megatron TP=1 CP=2) needs 1" in text


def test_a_job_level_runtime_env_reaches_every_worker(cluster, tmp_path):
    # How verl uses it: ray.init(runtime_env=...) in the driver, workers anywhere.
    script = tmp_path / "driver.py"
    script.write_text(textwrap.dedent(f"""
        import json, os, ray
        from ray_megatron_env import build_runtime_env
        ray.init(address={cluster.address!r}, log_to_driver=False,
                 runtime_env=build_runtime_env({str(FSDP_YAML)!r}, base={{"env_vars": {{"A": "b"}}}}))

        @ray.remote(num_cpus=0)
        def env():
            return os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS"), os.environ.get("A"), \\
                json.loads(os.environ["RAY_MEGATRON_ENV_DECISION"])["gpus"]

        print(json.dumps([ray.get(env.options(resources={{"rme_" + n: 1}}).remote())
                          for n in ("a100_inherit1", "b200")]))
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert json.loads(out.strip().splitlines()[-1]) == [["8", "b", ["8.0"]], [None, "b", ["10.0"]]]
