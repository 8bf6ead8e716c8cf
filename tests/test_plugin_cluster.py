"""The plugin on a real local multi-node cluster (see conftest.py).

Nodes fake their GPUs through RAY_MEGATRON_ENV_FAKE_GPUS; everything else
(the agent loading the plugin, the field travelling with the task spec, the
worker's environment) is Ray's real machinery.
"""

import glob
import json
import logging
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
from ray_megatron_env.agent import NodeAgent
from ray_megatron_env.check import observe_many
from ray_megatron_env.cache import ProbeCache
from ray_megatron_env.probe import FAKE_VARIABLE, probe_gpus

# GPU classes of the issue's mixed cluster, and nodes whose own
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
QUIET = logging.getLogger("test_plugin_cluster")
QUIET.addHandler(logging.NullHandler())
QUIET.propagate = False


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


# Unit: every case on every GPU class and on both inheriting nodes, through
# the agent's code without Ray (until 0.1.0 this matrix ran on live workers:
# 38 worker starts). Live below: every case once on a real worker.
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


# Live: the case of the issue on one node of every GPU class the cluster has
# (no GPU, A100, B200, H100+B200: the Blackwell boundary and a node mixing
# both sides of it), every other case on the mixed node, each shown to reach
# a real worker through Ray's agent with the value and the decision that
# explain gives. Each (case, node) costs a worker start.
ALL_NODES_CASE = "megatron TP=2"
LIVE_NODES = ("cpu_head", "a100", "b200", "h100_b200")
MIXED_NODE = "h100_b200"
LIVE_PLAN = [(ALL_NODES_CASE, node) for node in LIVE_NODES] + \
    [(name, MIXED_NODE) for name in CASES if name != ALL_NODES_CASE]


@pytest.fixture(scope="module")
def every_case(cluster):
    """{(case, node): (value, Decision)} for LIVE_PLAN, in one round of workers."""
    envs = {name: build_runtime_env(config, role=role)
            for name, (config, role, _) in CASES.items()}
    observed = observe_many([([(cluster.node_ids[node], "-")], envs[name])
                             for name, node in LIVE_PLAN], timeout_s=300)
    assert all(report.error is None for report, in observed), observed
    return {key: (report.value, report.decision) for key, (report,) in zip(LIVE_PLAN, observed)}


def test_each_config_reaches_a_real_worker_with_explains_decision(every_case):
    assert set(every_case) == set(LIVE_PLAN) and len(LIVE_PLAN) == len(CASES) + 3
    for (name, node), (value, decision) in every_case.items():
        assert (value, decision.source) == expected(name, node), (name, node)
        assert decision.gpus == GPUS[node] and decision.via == "plugin"
        agrees_with_explain(name, node, value, decision)
    # The mixed node tells every case apart: 1 exactly where Megatron needs it.
    assert {name for name in CASES if every_case[name, MIXED_NODE][0] == "1"} == \
        {name for name, (_, _, nodes) in CASES.items() if nodes}


# Ray's agent loads the plugin named in RAY_RUNTIME_ENV_PLUGINS and calls
# its validate/create/modify_context: the registered path at its plainest.
@pytest.mark.ray_version_specific
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


@pytest.mark.parametrize("config,node,explicit,value,source,warned", PRECEDENCE_UNIT)
def test_precedence_in_the_agent(config, node, explicit, value, source, warned):
    base = {"env_vars": {"CUDA_DEVICE_MAX_CONNECTIONS": explicit}} if explicit else None
    got, decision = in_the_agent(verl(*config), None, node, base=base)
    assert (got, decision.value, decision.source) == (value, value, source)
    assert bool(decision.warnings) == warned


# Ray's agent hands the plugin the runtime env's env_vars (explicit) and
# the node's own environment (inherited): version-specific plumbing.
@pytest.mark.ray_version_specific
@pytest.mark.parametrize("config,node,explicit,value,source,warned", PRECEDENCE)
def test_precedence_on_real_nodes(cluster, config, node, explicit, value, source, warned):
    base = {"env_vars": {"CUDA_DEVICE_MAX_CONNECTIONS": explicit}} if explicit else None
    env = build_runtime_env(verl(*config), base=base)
    (got, decision), = on_nodes(cluster, env, [node]).values()
    assert (got, decision["value"], decision["source"]) == (value, value, source)
    assert bool(decision["warnings"]) == warned


# How Ray treats a field no plugin claims, and where it honours the setup
# hook (the job env only): both Ray's, per version.
@pytest.mark.ray_version_specific
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


def test_a_malformed_fake_is_recorded_and_treated_conservatively():
    # Unit: the agent's code, its probe reading "9.x" (until 0.1.0 a node of
    # its own). A probe error recorded in a live worker's decision, with the
    # conservative value: test_a_hung_nvidia_smi_does_not_block_the_agent
    # below, and test_faults_cluster.py's smi_missing and nvidia_listed nodes.
    env = build_runtime_env(verl(*MEGATRON_TP2))
    env_vars = dict(env["env_vars"])
    agent = NodeAgent(ProbeCache(probe=lambda: probe_gpus({FAKE_VARIABLE: "9.x"})))
    decision = agent.decide_and_write(env, env_vars, {}, QUIET)
    assert env_vars["CUDA_DEVICE_MAX_CONNECTIONS"] == "1" and decision.gpus is None
    assert "9.x" in decision.probe["error"] and decision.warnings


# How Ray's agent awaits a plugin's create while other envs are created.
@pytest.mark.ray_version_specific
def test_a_hung_nvidia_smi_does_not_block_the_agent(cluster):
    # What a plain worker start costs on this node, now (a loaded machine
    # starts workers slower; the limit below follows it, and is 3 s idle).
    started = time.monotonic()
    ray.get(worker_env.options(runtime_env={"env_vars": {"X": "0"}},
                               **cluster.pin("smi_hang")).remote(), timeout=60)
    unhindered = time.monotonic() - started
    megatron = worker_env.options(runtime_env=build_runtime_env(verl(*MEGATRON_TP2)),
                                  **cluster.pin("smi_hang")).remote()
    time.sleep(0.5)  # the probe is now waiting on the hung nvidia-smi
    started = time.monotonic()
    plain = worker_env.options(runtime_env={"env_vars": {"X": "1"}}, **cluster.pin("smi_hang"))
    ray.get(plain.remote(), timeout=60)
    other_env_took = time.monotonic() - started
    value, decision = ray.get(megatron, timeout=60)
    # A blocked event loop would hold this start for the 2.5 s of the hang still to run.
    assert other_env_took < max(3.0, unhindered + 2.0), \
        f"the agent's event loop was blocked by the probe ({other_env_took:.1f} s)"
    assert value == "1" and "did not answer within 3 s" in json.loads(decision)["probe"]["error"]


# A plugin's error reaches the caller as Ray's RuntimeEnvSetupError, after
# the agent's retries (RUNTIME_ENV_RETRY_INTERVAL_MS, conftest.py).
@pytest.mark.ray_version_specific
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
        assert on_nodes(cluster, env, ["h100_b200"])["h100_b200"][0] is None
        return
    started = time.monotonic()
    with pytest.raises(RuntimeEnvSetupError) as info:
        ray.get(worker_env.options(runtime_env=env, **cluster.pin("h100_b200")).remote(),
                timeout=60)
    assert time.monotonic() - started < 30
    for word in words:
        assert word in str(info.value)


def test_a_bad_explicit_value_fails_in_the_agent(cluster):
    env = {"megatron_env": {"engines": {}}, "env_vars": {"CUDA_DEVICE_MAX_CONNECTIONS": "64"}}
    with pytest.raises(RuntimeEnvSetupError, match="CUDA accepts an integer from 1 to 32"):
        ray.get(worker_env.options(runtime_env=env, **cluster.pin("a100")).remote(), timeout=60)


# The logger Ray hands a plugin, and the file it writes to.
@pytest.mark.ray_version_specific
def test_the_decision_is_in_the_nodes_setup_log(cluster):
    on_nodes(cluster, build_runtime_env(verl(*MEGATRON_CP2), role="actor"), ["a100"])
    logs = glob.glob(os.path.join(cluster.logs_dir(), "runtime_env_setup-*.log"))
    lines = "".join(open(path, errors="replace").read() for path in logs).splitlines()
    # One line: the value, its source and path, the node's GPUs, and why.
    assert [line for line in lines
            if "megatron_env: CUDA_DEVICE_MAX_CONNECTIONS=1 (source: policy; via: plugin; "
               "GPUs: ['8.0'])" in line and "actor (megatron TP=1 CP=2) needs 1" in line], lines


# Ray merges the job-level env (ray.init) into every task's.
@pytest.mark.ray_version_specific
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
