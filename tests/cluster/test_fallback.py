"""The worker-side fallback on a real cluster: nodes started without the
plugin registered (conftest.py UNREGISTERED) are decided by the job env's
setup hook, registered ones by the plugin, with the same values.

Each job is a driver script whose ray.init env is build_runtime_env(cfg):
Ray honours worker_process_setup_hook only in the job's env.
"""

import glob
import json
import os
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from configs import FSDP_YAML, MEGATRON_TP2, verl
from drivers import brief, run_job
from paths import TESTS

HELPERS = TESTS / "helpers"
# Every test here rests on Ray's handling of worker_process_setup_hook (only
# in the job env; a string or a callable; run before the worker's first
# task), on the job config a worker reads its job's env_vars from, and on
# each node having a runtime-env agent of its own (agent ports Ray 2.41
# picks in Python): all of it changes between Ray versions.
pytestmark = pytest.mark.ray_version_specific


@pytest.fixture(scope="module")
def megatron_job(cluster, tmp_path_factory):
    """A verl Megatron TP=2 job (FSDP critic) with a user's own string hook,
    whose ray.init env is build_runtime_env(cfg)."""
    tmp = tmp_path_factory.mktemp("megatron_job")
    config = tmp / "config.yaml"
    OmegaConf.save(verl(*MEGATRON_TP2, "critic.strategy=fsdp"), config)
    return {part: seen if part == "nested" else brief(seen) for part, seen in run_job(cluster, tmp, f"""
        env = build_runtime_env({str(config)!r}, base={{
            "worker_process_setup_hook": "fallback_user_hook.mark",
            "env_vars": {{"PYTHONPATH": {str(HELPERS)!r}}}}})
        ray.init(address=sys.argv[1], log_to_driver=False, runtime_env=env)
        # vLLM's Ray executor in an actor on each path (tests/helpers/nested_driver.py).
        sys.path.insert(0, {str(HELPERS)!r})
        from nested_driver import Engine

        engines = {{n: Engine.options(resources={{"rme_" + n: 1}}).remote()
                    for n in ("h100_b200", "unplugged")}}
        nested = {{n: e.start_nested_driver.remote(["h100_b200", "unplugged", "b200"])
                   for n, e in engines.items()}}
        nodes = ["cpu_head", "a100", "b200", "unplugged", "a100_inherit1_unplugged"]
        out = {{"job": on(nodes), "again": on(["unplugged"])}}
        # A per-role env under the job env: the critic is FSDP.
        out["critic"] = on(["a100_inherit1_unplugged", "unplugged"],
                           runtime_env=build_runtime_env({str(config)!r}, role="critic"))
        # Per-actor env_vars on top of the job env (verl's worker groups).
        out["env_vars"] = on(["unplugged", "a100_inherit1_unplugged"],
                             runtime_env={{"env_vars": {{"WG_PREFIX": "actor_"}}}})
        out["explicit"] = on(["a100_inherit1_unplugged", "a100"],
                             runtime_env={{"env_vars": {{"CUDA_DEVICE_MAX_CONNECTIONS": "4"}}}})
        out["nested"] = {{n: ray.get(ref, timeout=220) for n, ref in nested.items()}}
        print(json.dumps(out))
    """).items()}


def test_every_node_has_a_runtime_env_agent_of_its_own(cluster):
    # Two simulated nodes given one agent port would have the unregistered
    # node served by a registered node's agent (simulation.AGENT_PORTS).
    import ray

    nodes = [n for n in ray.nodes() if n["Alive"]]
    ports = [n["RuntimeEnvAgentPort"] for n in nodes]
    assert len(nodes) == len(cluster.nodes) and len(set(ports)) == len(ports)


def test_every_node_gets_its_value_registered_or_not(megatron_job):
    # Megatron TP=2 under verl before Blackwell: 1 (the A100's inherited 1
    # meets it, so it is kept as the node's); Blackwell and CPU: unset. The
    # setup hook's decision on a Blackwell node (unset) is unit-tested
    # (unit/test_setup_hook.py::test_the_job_field_is_decided_from_the_nodes_gpus);
    # an unset value by the setup hook on a live worker: the critic below.
    assert {n: (v, via, source) for n, (v, via, source, *_) in megatron_job["job"].items()} == {
        "cpu_head": (None, "plugin", "none"), "a100": ("1", "plugin", "policy"),
        "b200": (None, "plugin", "none"),
        "unplugged": ("1", "setup-hook", "policy"),
        "a100_inherit1_unplugged": ("1", "setup-hook", "node")}


def test_a_driver_nested_in_a_worker_starts_and_its_workers_are_decided(megatron_job):
    # vLLM's Ray executor in an actor on a registered node decided by its
    # H100 and on an unregistered H100 node: its ray.init with the actor's
    # env, which Ray 2.41 to 2.54 refused ("reserved for the internal use").
    # Its workers: each node's value, on both paths, the user's hook after ours.
    workers = {"h100_b200": ["1", "plugin", "policy", "string"],
               "unplugged": ["1", "setup-hook", "policy", "string"],
               "b200": [None, "plugin", "none", "string"]}
    hook = "ray_megatron_env.setup_hook.setup_hook"
    assert megatron_job["nested"] == {driver: {"workers": workers, "hook": [hook, hook]}
                                      for driver in ("h100_b200", "unplugged")}


def test_the_users_own_setup_hook_still_runs(megatron_job):
    assert all(ran == "string" for *_, ran, _ in megatron_job["job"].values())


def test_one_probe_per_node_for_every_worker_there(megatron_job):
    first = megatron_job["job"]["unplugged"][4]
    assert first is not None and megatron_job["again"]["unplugged"][4] == first
    assert megatron_job["env_vars"]["unplugged"][4] == first


def test_a_per_role_env_is_decided_for_its_role_on_unregistered_nodes(megatron_job):
    # FSDP critic: nothing to set, and the node's inherited 1 is replaced.
    assert megatron_job["critic"] == {
        "a100_inherit1_unplugged": ["8", "setup-hook", "policy", "string",
                                    megatron_job["job"]["a100_inherit1_unplugged"][4]],
        "unplugged": [None, "setup-hook", "none", "string",
                      megatron_job["job"]["unplugged"][4]]}


def test_per_actor_env_vars_keep_the_jobs_decision(megatron_job):
    got = {n: (v, via, source) for n, (v, via, source, *_) in megatron_job["env_vars"].items()}
    assert got == {"unplugged": ("1", "setup-hook", "policy"),
                   "a100_inherit1_unplugged": ("1", "setup-hook", "node")}
    assert got == {n: tuple(megatron_job["job"][n][:3]) for n in got}


def test_an_explicit_value_is_kept_on_either_path(megatron_job):
    got = {n: (v, via, source) for n, (v, via, source, *_) in megatron_job["explicit"].items()}
    # On the A100 without the plugin the node's own value is 1: the 4 came
    # from env_vars, so it is explicit there too.
    assert got == {"a100_inherit1_unplugged": ("4", "setup-hook", "explicit"),
                   "a100": ("4", "plugin", "explicit")}


def test_the_node_log_says_which_path_decided(cluster, megatron_job):
    logs = glob.glob(os.path.join(cluster.logs_dir(), "megatron_env_setup_hook-*.log"))
    text = "".join(Path(path).read_text() for path in logs)
    assert "megatron_env: CUDA_DEVICE_MAX_CONNECTIONS=1 (source: policy; via: setup-hook; " \
           "GPUs: ['9.0'])" in text


def test_an_fsdp_job_replaces_a_nodes_inherited_1_with_a_callable_user_hook(cluster, tmp_path):
    got = brief(run_job(cluster, tmp_path, f"""
        def mark():
            os.environ["USER_HOOK_RAN"] = "callable"

        env = build_runtime_env({str(FSDP_YAML)!r}, base={{"worker_process_setup_hook": mark}})
        ray.init(address=sys.argv[1], log_to_driver=False, runtime_env=env)
        print(json.dumps(on(["a100_inherit1_unplugged", "a100_inherit1", "unplugged"])))
    """))
    assert {n: (v, via, source, ran) for n, (v, via, source, ran, _) in got.items()} == {
        "a100_inherit1_unplugged": ("8", "setup-hook", "policy", "callable"),
        "a100_inherit1": ("8", "plugin", "policy", "callable"),
        "unplugged": (None, "setup-hook", "none", "callable")}


NEMO_RL_MEGATRON = TESTS / "fixtures/nemo_rl/configs/grpo_math_1B_megatron.yaml"


def archs(env):
    """A worker's arch list and connections value, each with its record's source."""
    d = json.loads(env["RAY_MEGATRON_ENV_DECISION"])["variables"]
    a, c = d["TORCH_CUDA_ARCH_LIST"], d["CUDA_DEVICE_MAX_CONNECTIONS"]
    return [env.get("TORCH_CUDA_ARCH_LIST"), a["source"], a.get("driver_value"),
            env.get("CUDA_DEVICE_MAX_CONNECTIONS"), c["source"]]


def test_nemo_rls_copy_of_the_drivers_environment_is_decided_per_node(cluster, tmp_path):
    # NeMo-RL's driver (the image's TORCH_CUDA_ARCH_LIST, a stray 1 on its
    # host) behind the driver line (docs/frameworks.md#nemo-rl): init_ray
    # passes dict(os.environ) to ray.init, worker_groups.py each worker's
    # env_vars again from os.environ; VLLM_ENABLE_V1_MULTIPROCESSING=0 marks
    # a vLLM worker. Golden (unit/test_driver_env.py's sources): the image's
    # "9.0 10.0" has no code for an A100, so 8.0 there; it covers the H100
    # nodes (kept, as the driver's). The Megatron TP=2 policy prefers 1
    # before Blackwell (the copy is kept); vLLM must not run with 1 (CUDA's
    # default 8 replaces it), where the job's own 1 would have been kept.
    got = run_job(cluster, tmp_path, f"""
        os.environ["TORCH_CUDA_ARCH_LIST"] = "9.0 10.0"
        os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
        import ray_megatron_env as rme
        _ri = ray.init
        ray.init = lambda *a, **k: _ri(*a, **{{**k, "runtime_env": rme.build_runtime_env(
            {str(NEMO_RL_MEGATRON)!r}, base=k.get("runtime_env"), packs=["torch-arch"])}})
        env_vars = dict(os.environ)
        env_vars.pop("RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES", None)
        ray.init(address=sys.argv[1], log_to_driver=False, runtime_env={{"env_vars": env_vars}})

        def at(names, extra):
            return on(names, runtime_env={{"env_vars": {{**os.environ, **extra}}}})

        print(json.dumps({{
            "policy": at(["a100_inherit1", "h100_b200", "unplugged"], {{}}),
            "vllm": at(["a100_inherit1_unplugged"], {{"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}})}}))
    """)
    got = {part: {node: archs(env) for node, env in seen.items()} for part, seen in got.items()}
    image, copied = "9.0 10.0", "driver-env"
    assert got == {
        "policy": {"a100_inherit1": ["8.0", "policy", image, "1", copied],  # plugin
                   "h100_b200": [image, copied, image, "1", copied],  # plugin
                   "unplugged": [image, copied, image, "1", copied]},  # setup hook
        # setup hook; the node's own 1 as well
        "vllm": {"a100_inherit1_unplugged": ["8.0", "policy", image, "8", "policy"]}}
