"""The plugin on a real local multi-node cluster (see conftest.py).

Nodes fake their GPUs through RAY_MEGATRON_ENV_FAKE_GPUS; everything else
(the agent loading the plugin, the field travelling with the task spec, the
worker's environment) is Ray's real machinery.
"""

import glob
import os
import time

import pytest
import ray

from configs import FSDP_YAML, MEGATRON_CP2, MEGATRON_TP2, verl
from ray_megatron_env import build_runtime_env
from drivers import run_job
from workers import read, seen_on, start_on
from agent_matrix import CASES, GPUS, PRECEDENCE, agrees_with_explain, expected
from ray_megatron_env.check import observe_many
from ray_megatron_env.probe import probe_gpus

@ray.remote(num_cpus=0)
class Trainer:
    def env(self):
        from ray_megatron_env import read_decision
        return os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS"), read_decision()


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
    value, decision = seen_on(cluster, "a100", build_runtime_env(config))
    assert value == "1" and decision["conflict"] and "conflict" in decision["reason"]
    for actor in actors.values():
        ray.kill(actor)


# Ray's agent hands the plugin the runtime env's env_vars (explicit) and
# the node's own environment (inherited): version-specific plumbing.
@pytest.mark.ray_version_specific
@pytest.mark.parametrize("config,node,explicit,value,source,warned", PRECEDENCE)
def test_precedence_on_real_nodes(cluster, config, node, explicit, value, source, warned):
    base = {"env_vars": {"CUDA_DEVICE_MAX_CONNECTIONS": explicit}} if explicit else None
    env = build_runtime_env(verl(*config), base=base)
    got, decision = seen_on(cluster, node, env)
    assert (got, decision["value"], decision["source"]) == (value, value, source)
    assert bool(decision["warnings"]) == warned


# How Ray treats a field no plugin claims, and where it honours the setup
# hook (the job env only): both Ray's, per version.
@pytest.mark.ray_version_specific
def test_a_task_env_alone_is_not_decided_on_a_node_without_the_plugin(cluster):
    # Ray ignores the field there, and honours worker_process_setup_hook only
    # in the job's env (ray.init): the fallback needs the job env
    # (tests/cluster/test_fallback.py).
    env = build_runtime_env(verl(*MEGATRON_TP2))
    assert seen_on(cluster, "unplugged", env) == (None, None)


def test_nvml_unloadable_falls_back_to_nvidia_smi_on_a_real_node(cluster):
    # The node probes in auto mode: NVML first, which cannot load here, then
    # tests/fakes/nvidia-smi on its PATH, which lists 8.0 and 9.0; the node
    # shows workers GPU-2222... (9.0) only.
    if probe_gpus({}).method == "nvml":
        pytest.skip("NVML loads on this machine, so the node would not fall back")
    value, decision = seen_on(cluster, "smi", build_runtime_env(verl()))
    assert decision["gpus"] == ["9.0"] and decision["probe"]["method"] == "nvidia-smi"
    assert "the NVML library (libnvidia-ml) cannot be loaded" in decision["probe"]["detail"]
    assert value == "1"


def test_nvml_path_on_a_real_node_agrees_with_a_local_probe(cluster):
    local = probe_gpus({})  # same machine, same NVML, no fake
    _, decision = seen_on(cluster, "real_nvml", build_runtime_env(verl()))
    # This machine has no NVML library and no nvidia-smi: both say so through
    # the listing step; a GPU machine answers through NVML.
    assert decision["probe"]["method"] == local.method in ("nvml", "nvidia-smi", "listing")
    assert decision["gpus"] == local.labels()


# How Ray's agent awaits a plugin's create while other envs are created.
@pytest.mark.ray_version_specific
def test_a_hung_nvidia_smi_does_not_block_the_agent(cluster):
    # What a plain worker start costs on this node, now (a loaded machine
    # starts workers slower; the limit below follows it, and is 3 s idle).
    started = time.monotonic()
    ray.get(start_on(cluster, "smi_hang", {"env_vars": {"X": "0"}}), timeout=60)
    unhindered = time.monotonic() - started
    megatron = start_on(cluster, "smi_hang", build_runtime_env(verl(*MEGATRON_TP2)))
    time.sleep(0.5)  # the probe is now waiting on the hung nvidia-smi
    started = time.monotonic()
    ray.get(start_on(cluster, "smi_hang", {"env_vars": {"X": "1"}}), timeout=60)
    other_env_took = time.monotonic() - started
    value, decision = read(ray.get(megatron, timeout=60))
    # A blocked event loop would hold this start for the 2.5 s of the hang still to run.
    assert other_env_took < max(3.0, unhindered + 2.0), \
        f"the agent's event loop was blocked by the probe ({other_env_took:.1f} s)"
    assert value == "1" and "did not answer within 3 s" in decision["probe"]["error"]


# The logger Ray hands a plugin, and the file it writes to.
@pytest.mark.ray_version_specific
def test_the_decision_is_in_the_nodes_setup_log(cluster):
    seen_on(cluster, "a100", build_runtime_env(verl(*MEGATRON_CP2), role="actor"))
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
    got = run_job(cluster, tmp_path, f"""
        ray.init(address=ADDRESS, log_to_driver=False,
                 runtime_env=build_runtime_env({str(FSDP_YAML)!r}, base={{"env_vars": {{"A": "b"}}}}))
        print(json.dumps(on(["a100_inherit1", "b200"])))
    """)
    assert [[env.get("CUDA_DEVICE_MAX_CONNECTIONS"), env.get("A"), read(env)[1]["gpus"]]
            for env in got.values()] == [["8", "b", ["8.0"]], [None, "b", ["10.0"]]]
