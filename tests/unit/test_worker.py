"""The worker-side fallback without a cluster: the decision it makes from a
worker's environment and the node's, the per-node probe file, the job env
build_runtime_env hands Ray, and what the job-submission env leaves out.
Expected values come from the rule table (docs/rules.md), written by hand."""

import json
import logging
import multiprocessing
import os

import pytest

from cache_race import probe_in_process
from configs import FSDP_YAML, verl
from ray_megatron_env import build_runtime_env
from ray_megatron_env.node import NodeGpus
from ray_megatron_env.runtime_env import HOOK_PATH, driver_hook_skipped
from ray_megatron_env.job_submission import job_submission_env
from ray_megatron_env.cache import NodeCache
from ray_megatron_env.worker import (
    FIELD_VARIABLE, NEXT_SETUP_HOOK_VARIABLE, RAY_SETUP_HOOK_VARIABLE, SETUP_HOOK_PATH,
    as_actor_env, chained, decide_in_worker, node_environment,
)

LOG = logging.getLogger("test_worker_fallback")
MEGATRON_TP2 = {"version": 2, "engines": {"actor": {"strategy": "megatron",
                                                    "tensor_parallel": 2}}}
FSDP = {"version": 2, "engines": {"actor": {"strategy": "fsdp"}}}



@pytest.fixture(autouse=True)
def restored_environ():
    """setup_hook writes the driver hook into its worker's os.environ (for a
    driver started there): here that is the test process's, so each test
    gets it back as it was."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)

def node(gpus="9.0", **env):
    return {"RAY_MEGATRON_ENV_FAKE_GPUS": gpus, "PATH": "/usr/bin", **env}


def worker(node_env, **env_vars):
    """A worker's process environment: the node's, with its runtime env's
    env_vars applied on top (what Ray's setup step does)."""
    return {**node_env, **env_vars}


def direct(probe, kind):
    return probe()


@pytest.mark.parametrize("field,gpus,value,source", [
    (MEGATRON_TP2, "9.0", "1", "policy"),  # megatron-model-parallel
    (MEGATRON_TP2, "10.0", None, "none"),  # megatron-blackwell
    (MEGATRON_TP2, "none", None, "none"),  # no-gpu
    (FSDP, "8.0", None, "none"),  # fsdp-style: not 1, left unset
])
def test_the_job_field_is_decided_from_the_nodes_gpus(field, gpus, value, source):
    node_env = node(gpus)
    environ = worker(node_env)
    decision = decide_in_worker(environ, node_env, field, direct, LOG)
    assert (decision.value, decision.source, decision.via) == (value, source, "setup-hook")
    assert environ.get("CUDA_DEVICE_MAX_CONNECTIONS") == value
    assert json.loads(environ["RAY_MEGATRON_ENV_DECISION"])["via"] == "setup-hook"


def test_the_nodes_own_gpus_decide_not_the_workers_visible_devices():
    # The probe reads the node's environment (the raylet's): a worker whose
    # CUDA_VISIBLE_DEVICES is empty still gets its node's decision.
    node_env = node("9.0")
    environ = worker(node_env, CUDA_VISIBLE_DEVICES="")
    assert decide_in_worker(environ, node_env, MEGATRON_TP2, direct, LOG).gpus == ["9.0"]


def test_an_inherited_value_that_breaks_a_rule_is_replaced():
    node_env = node("8.0", CUDA_DEVICE_MAX_CONNECTIONS="1")
    environ = worker(node_env)
    decision = decide_in_worker(environ, node_env, FSDP, direct, LOG)
    assert (decision.value, decision.source, decision.node_value) == ("8", "policy", "1")
    assert environ["CUDA_DEVICE_MAX_CONNECTIONS"] == "8"


def test_a_value_from_env_vars_is_explicit_and_kept():
    node_env = node("8.0", CUDA_DEVICE_MAX_CONNECTIONS="1")
    environ = worker(node_env, CUDA_DEVICE_MAX_CONNECTIONS="4")
    decision = decide_in_worker(environ, node_env, MEGATRON_TP2, direct, LOG)
    assert (decision.value, decision.source) == ("4", "explicit")
    assert environ["CUDA_DEVICE_MAX_CONNECTIONS"] == "4"
    assert "breaks a preferred rule" in decision.warnings[0]


def test_a_job_env_vars_value_equal_to_the_nodes_own_is_explicit():
    # The plugin sees the job's env_vars as explicit; the hook reads them
    # from the job config, so it agrees even where the node exports the same.
    node_env = node("8.0", CUDA_DEVICE_MAX_CONNECTIONS="1")
    environ = worker(node_env)
    decision = decide_in_worker(environ, node_env, FSDP, direct, LOG,
                                job_env_vars={"CUDA_DEVICE_MAX_CONNECTIONS": "1"})
    assert (decision.value, decision.source) == ("1", "explicit")
    assert environ["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"


def test_an_actors_value_over_the_jobs_is_explicit_too():
    node_env = node("8.0", CUDA_DEVICE_MAX_CONNECTIONS="1")
    environ = worker(node_env, CUDA_DEVICE_MAX_CONNECTIONS="4")
    decision = decide_in_worker(environ, node_env, FSDP, direct, LOG,
                                job_env_vars={"CUDA_DEVICE_MAX_CONNECTIONS": "1"})
    assert (decision.value, decision.source) == ("4", "explicit")


def test_the_workers_own_field_wins_over_the_jobs():
    node_env = node("9.0")
    environ = worker(node_env, **{FIELD_VARIABLE: json.dumps(FSDP)})
    decision = decide_in_worker(environ, node_env, MEGATRON_TP2, direct, LOG)
    assert decision.engines == {"actor": "fsdp"} and decision.value is None


def test_where_the_plugin_decided_the_fallback_does_nothing():
    node_env = node("9.0")
    environ = worker(node_env, CUDA_DEVICE_MAX_CONNECTIONS="1",
                     RAY_MEGATRON_ENV_DECISION='{"via":"plugin"}')
    before = dict(environ)
    assert decide_in_worker(environ, node_env, FSDP, direct, LOG) is None
    assert environ == before


def test_without_a_field_nothing_is_decided():
    node_env = node("9.0")
    environ = worker(node_env)
    assert decide_in_worker(environ, node_env, None, direct, LOG) is None
    assert "RAY_MEGATRON_ENV_DECISION" not in environ


def test_a_bad_field_fails_the_worker_with_the_fields_message():
    node_env = node("9.0")
    with pytest.raises(ValueError, match="unknown strategy 'megatorn'"):
        decide_in_worker(worker(node_env), node_env,
                         {"version": 2, "engines": {"a": {"strategy": "megatorn"}}}, direct, LOG)


def test_an_unreadable_node_environment_keeps_what_the_worker_has():
    # No way to tell inherited from explicit: what the worker has is kept.
    environ = worker(node("8.0"), CUDA_DEVICE_MAX_CONNECTIONS="1")
    decision = decide_in_worker(environ, None, FSDP, direct, LOG)
    assert (decision.value, decision.source) == ("1", "explicit")


def test_the_worker_names_the_decision_variable_as_the_core_does():
    from ray_megatron_env import decision, worker

    assert worker.DECISION_VARIABLE == decision.DECISION_VARIABLE


def test_a_field_variable_that_is_not_json_names_the_variable():
    node_env = node("9.0")
    with pytest.raises(ValueError, match="RAY_MEGATRON_ENV_FIELD is not JSON"):
        decide_in_worker(worker(node_env, **{FIELD_VARIABLE: "{oops"}), node_env, None, direct,
                         LOG)


def test_node_environment_reads_only_a_raylet_parent():
    # This test's parent is not a raylet.
    assert node_environment() is None
    assert node_environment(pid=2 ** 22 + 12345) is None  # no such process


def test_workers_starting_together_share_one_probe(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=probe_in_process, args=(str(tmp_path), out)) for _ in range(4)]
    for p in procs:
        p.start()
    results = {out.get(timeout=60) for _ in procs}
    for p in procs:
        p.join(timeout=60)
    assert len(results) == 1  # one prober, read by the other three


def test_a_failed_probe_is_retried_after_a_while(tmp_path):
    now = [1000.0]
    cache = NodeCache(str(tmp_path), "n", retry_failed_after_s=60, clock=lambda: now[0])
    calls = []

    def failing():
        calls.append(1)
        return NodeGpus.unknown("nvml", "boom")

    cache.get(failing)
    cache.get(failing)
    now[0] += 61
    cache.get(failing)
    assert len(calls) == 2


def test_fabric_facts_have_their_own_file(tmp_path):
    from ray_megatron_env.node import COMPLETED, GpuFabric, NodeFabric

    cache = NodeCache(str(tmp_path), "n")
    fabric = NodeFabric((GpuFabric(COMPLETED, "success", "1234-5678", 7, "ok"),), "absent", "fake")
    cache.get(lambda: NodeGpus.known([(10, 0)], "fake"), "gpus")
    got = cache.get(lambda: fabric, "fabric")
    again = cache.get(lambda: None, "fabric")  # read back from the file
    assert again.gpus == fabric.gpus and again.imex_channel == "absent" and again == got


def test_a_damaged_cache_file_means_a_new_probe(tmp_path):
    cache = NodeCache(str(tmp_path), "n")
    os.makedirs(cache.folder, exist_ok=True)
    with open(cache.path(), "w") as f:
        f.write("{not json")
    assert cache.get(lambda: NodeGpus.known([(8, 0)], "fake")).capabilities == ((8, 0),)


def test_the_job_env_carries_the_setup_hook_and_the_field():
    env = build_runtime_env(MEGATRON_TP2)
    assert env["worker_process_setup_hook"] == SETUP_HOOK_PATH
    assert json.loads(env["env_vars"][FIELD_VARIABLE]) == env["megatron_env"]


def test_a_role_env_carries_its_own_field_and_the_hook():
    # The hook for a role-narrowed env given to ray.init; Ray ignores it in an
    # actor's env, where the job env's hook reads the actor's own field.
    env = build_runtime_env(verl(), role="critic")
    assert env["worker_process_setup_hook"] == SETUP_HOOK_PATH
    assert json.loads(env["env_vars"][FIELD_VARIABLE])["engines"] == {
        "critic": {"strategy": "megatron"}}


def test_a_users_string_hook_is_chained_after_ours():
    env = build_runtime_env(MEGATRON_TP2, base={"worker_process_setup_hook": "acme.setup"})
    assert env["worker_process_setup_hook"] == SETUP_HOOK_PATH
    assert env["env_vars"][NEXT_SETUP_HOOK_VARIABLE] == "acme.setup"


def test_a_users_callable_hook_is_wrapped():
    def setup():
        pass

    env = build_runtime_env(MEGATRON_TP2, base={"worker_process_setup_hook": setup})
    assert callable(env["worker_process_setup_hook"])
    assert env["worker_process_setup_hook"].__name__ == "megatron_env_then_setup"


def test_chained_runs_ours_then_theirs(monkeypatch):
    order = []
    monkeypatch.setattr("ray_megatron_env.worker.decide_in_worker",
                        lambda *a, **k: order.append("ours"))
    chained(lambda: order.append("theirs"))()
    assert order == ["ours", "theirs"]


def test_a_hook_of_another_kind_is_refused():
    with pytest.raises(TypeError, match="worker_process_setup_hook must be"):
        build_runtime_env(MEGATRON_TP2, base={"worker_process_setup_hook": 3})


@pytest.mark.parametrize("field", ["image_uri", "container"])
def test_an_exclusive_ray_field_in_the_base_is_refused_on_the_driver(field):
    with pytest.raises(ValueError, match=f"base has '{field}'.*cannot be used together"):
        build_runtime_env(MEGATRON_TP2, base={field: "rayproject/ray:2.60.0"})


def test_an_actor_env_carries_the_hook_as_ray_does():
    env = as_actor_env(build_runtime_env(MEGATRON_TP2))
    assert "worker_process_setup_hook" not in env
    assert env["env_vars"][RAY_SETUP_HOOK_VARIABLE] == SETUP_HOOK_PATH
    assert as_actor_env({"env_vars": {"A": "1"}}) == {"env_vars": {"A": "1"}}


def test_a_uv_run_driver_is_warned_that_ray_skips_the_driver_hook(monkeypatch):
    import ray._private.runtime_env.uv_runtime_env_hook as uv

    monkeypatch.setattr(uv, "_get_uv_run_cmdline", lambda: ["uv", "run", "train.py"])
    assert driver_hook_skipped({}) is None  # our hook not in use: nothing to say
    reason = driver_hook_skipped({"RAY_RUNTIME_ENV_HOOK": HOOK_PATH})
    assert "RAY_ENABLE_UV_RUN_RUNTIME_ENV" in reason
    monkeypatch.setenv("RAY_RUNTIME_ENV_HOOK", HOOK_PATH)
    with pytest.warns(UserWarning, match="uv run"):
        build_runtime_env(MEGATRON_TP2)
    monkeypatch.setattr(uv, "_get_uv_run_cmdline", lambda: None)
    assert driver_hook_skipped({"RAY_RUNTIME_ENV_HOOK": HOOK_PATH}) is None


# What every submitted env sets for its driver (job_submission.complete_submitted_env).
DRIVER_SIDE = {"RAY_RUNTIME_ENV_HOOK": "ray_megatron_env.hook.runtime_env_hook",
               "RAY_OVERRIDE_JOB_RUNTIME_ENV": "1", "RAY_MEGATRON_ENV_MERGE": "strict"}


def test_the_job_submission_env_has_no_field_copy_in_env_vars():
    env, notes = job_submission_env(build_runtime_env(FSDP_YAML), "verl")
    assert env["env_vars"] == DRIVER_SIDE and notes == []
    assert env["worker_process_setup_hook"] == SETUP_HOOK_PATH and "megatron_env" in env


def test_the_job_submission_env_for_nemo_rl_lets_its_driver_win_the_merge():
    # NeMo-RL's init_ray passes its whole environment as env_vars: every
    # submitted env_vars key would collide.
    env, notes = job_submission_env({"megatron_env": {}, "env_vars": {"A": "1"}}, "nemo-rl")
    assert env["env_vars"] == {"A": "1", **DRIVER_SIDE, "RAY_MEGATRON_ENV_MERGE": "override"}
    assert "whole environment" in notes[0]


def test_a_base_that_asks_for_rays_override_gets_it_and_a_driver_hook_moves_next():
    env, notes = job_submission_env({"env_vars": {"RAY_OVERRIDE_JOB_RUNTIME_ENV": "1",
                                                  "RAY_RUNTIME_ENV_HOOK": "acme.hook"}}, "verl")
    assert env["env_vars"] == {**DRIVER_SIDE, "RAY_MEGATRON_ENV_MERGE": "override",
                               "RAY_MEGATRON_ENV_NEXT_HOOK": "acme.hook"} and notes == []


def test_the_job_submission_env_leaves_out_what_verls_driver_always_sets():
    env, notes = job_submission_env({"env_vars": {"VERL_FULL_DETERMINISM": "1", "A": "b"}},
                                    "verl")
    assert env["env_vars"] == {"A": "b", **DRIVER_SIDE} and "VERL_FULL_DETERMINISM" in notes[0]


# A GB200 tray in a multi-node NVLink domain, no IMEX channel in the container
# (tests/unit/packs/test_nccl_fabric.py has the same node): nccl-fabric's first row (docs/packs.md).
GB200_NO_IMEX = json.dumps({"gpus": "10.0,10.0,10.0,10.0", "imex_channel": "absent",
                            "fabric": {"state": "completed", "status": "success",
                                       "cluster_uuid": "5d3f0c2a-8b1e-4c7d-9a6f-2e4b8c1d7f30",
                                       "clique_id": 32766, "health": "ok"}})


def test_the_fallback_decides_the_packs_too():
    node_env = {"RAY_MEGATRON_ENV_FAKE_NODE": GB200_NO_IMEX}
    environ = worker(node_env)
    field = {**MEGATRON_TP2, "packs": ["nccl-fabric"]}
    kinds = []

    def cache(probe, kind):
        kinds.append(kind)
        return probe()

    decision = decide_in_worker(environ, node_env, field, cache, LOG)
    assert kinds == ["gpus", "fabric"]  # the fabric is read because the pack needs it
    # Without an IMEX channel only MNNVL goes off (NCCL src/mnnvl.cc); NVLS
    # then uses POSIX handles per host (src/transport/nvls.cc) and is left alone.
    assert environ["NCCL_MNNVL_ENABLE"] == "0" and "NCCL_NVLS_ENABLE" not in environ
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in environ  # Blackwell
    assert decision.via == "setup-hook"
    assert {v: (e["value"], e["strength"]) for v, e in decision.packs.items()
            if e["value"] is not None} == {"NCCL_MNNVL_ENABLE": ("0", "required")}


def test_without_packs_the_fallback_reads_no_fabric():
    kinds = []

    def cache(probe, kind):
        kinds.append(kind)
        return probe()

    node_env = node("9.0")
    decide_in_worker(worker(node_env), node_env, MEGATRON_TP2, cache, LOG)
    assert kinds == ["gpus"]


def test_a_later_worker_takes_the_nodes_decision_from_its_cache(tmp_path, monkeypatch):
    from ray_megatron_env import worker as worker_module
    from ray_megatron_env.worker import decide_here

    cache = NodeCache(str(tmp_path), "node-1")
    node_env = node("9.0", CUDA_DEVICE_MAX_CONNECTIONS="4")
    first = worker(node_env)
    decide_here(first, node_env, MEGATRON_TP2, cache, lambda: LOG)
    assert first["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"  # the node's 4 replaced

    def no_core(*args, **kwargs):
        raise AssertionError("the core ran again for the same inputs")

    monkeypatch.setattr(worker_module, "decide_in_worker", no_core)
    second = worker(node_env)
    decide_here(second, node_env, MEGATRON_TP2, cache, lambda: LOG)
    assert second == first
    # Other inputs (an explicit value) are decided anew, not taken from the cache.
    with pytest.raises(AssertionError, match="the core ran again"):
        decide_here(worker(node_env, CUDA_DEVICE_MAX_CONNECTIONS="8"), node_env, MEGATRON_TP2,
                    cache, lambda: LOG)
    with pytest.raises(AssertionError, match="the core ran again"):
        decide_here(worker(node_env), node_env, FSDP, cache, lambda: LOG)
    # The same worker environment under a job whose env_vars gave the value.
    with pytest.raises(AssertionError, match="the core ran again"):
        decide_here(worker(node_env), node_env, MEGATRON_TP2, cache, lambda: LOG,
                    job_env_vars={"CUDA_DEVICE_MAX_CONNECTIONS": "4"})


def test_the_workers_lists_of_names_match_the_cores():
    from ray_megatron_env import cache, node
    from ray_megatron_env.packs import PACK_NAMES, get_pack
    from ray_megatron_env.packs import ALWAYS_ON
    from ray_megatron_env.worker import PACK_FACT_KINDS, PACK_VARIABLES

    assert set(PACK_VARIABLES) == {v for name in PACK_NAMES for v in get_pack(name).variables}
    assert PACK_FACT_KINDS == {name: get_pack(name).fact_kinds for name in PACK_NAMES
                               if name not in ALWAYS_ON}
    assert {node.GPUS, *node.FACT_KINDS} == set(cache.KNOWN_KEYS)
