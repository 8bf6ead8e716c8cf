"""The setup hook (setup_hook.py), both ends, without a cluster: the job env
that carries it (build_runtime_env, an actor's env, a user's hook chained
after ours), the decision it makes in a worker from the worker's environment
and the node's, a later worker's cached decision, and the driver hook it
sets for drivers nested in a worker. The per-node cache files:
tests/unit/test_cache.py; the job-submission env: tests/unit/test_job_submission.py.
Expected values come from the rule table (docs/rules.md), written by hand."""

import json
import logging
import os

import pytest

from configs import verl
from ray_megatron_env import build_runtime_env
from ray_megatron_env.names import (
    FIELD_VARIABLE, NEXT_SETUP_HOOK_VARIABLE,
    RAY_SETUP_HOOK_VARIABLE, SETUP_HOOK_PATH,
)
from ray_megatron_env.job_submission import job_submission_env
from ray_megatron_env.cache import NodeCache
from ray_megatron_env.setup_hook import as_actor_env, chained, decide_in_worker, node_environment

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


def decide(environ, node_env, field, cache, log):
    """decide_in_worker for a worker whose runtime env carries ``field``
    (as RAY_MEGATRON_ENV_FIELD, where build_runtime_env puts it)."""
    if field is not None:
        environ[FIELD_VARIABLE] = json.dumps(field)
    return decide_in_worker(environ, node_env, cache, log)


@pytest.mark.parametrize("field,gpus,value,source", [
    (MEGATRON_TP2, "9.0", "1", "policy"),  # megatron-model-parallel
    (MEGATRON_TP2, "10.0", None, "none"),  # megatron-blackwell
    (MEGATRON_TP2, "none", None, "none"),  # no-gpu
    (FSDP, "8.0", None, "none"),  # fsdp-style: not 1, left unset
])
def test_the_job_field_is_decided_from_the_nodes_gpus(field, gpus, value, source):
    node_env = node(gpus)
    environ = worker(node_env)
    decision = decide(environ, node_env, field, direct, LOG)
    assert (decision.value, decision.source, decision.via) == (value, source, "setup-hook")
    assert environ.get("CUDA_DEVICE_MAX_CONNECTIONS") == value
    assert json.loads(environ["RAY_MEGATRON_ENV_DECISION"])["via"] == "setup-hook"


def test_the_nodes_own_gpus_decide_not_the_workers_visible_devices():
    # The probe reads the node's environment (the raylet's): a worker whose
    # CUDA_VISIBLE_DEVICES is empty still gets its node's decision.
    node_env = node("9.0")
    environ = worker(node_env, CUDA_VISIBLE_DEVICES="")
    assert decide(environ, node_env, MEGATRON_TP2, direct, LOG).gpus == ["9.0"]


def test_an_inherited_value_that_breaks_a_rule_is_replaced():
    node_env = node("8.0", CUDA_DEVICE_MAX_CONNECTIONS="1")
    environ = worker(node_env)
    decision = decide(environ, node_env, FSDP, direct, LOG)
    assert (decision.value, decision.source, decision.node_value) == ("8", "policy", "1")
    assert environ["CUDA_DEVICE_MAX_CONNECTIONS"] == "8"


def test_a_value_from_env_vars_is_explicit_and_kept():
    node_env = node("8.0", CUDA_DEVICE_MAX_CONNECTIONS="1")
    environ = worker(node_env, CUDA_DEVICE_MAX_CONNECTIONS="4")
    decision = decide(environ, node_env, MEGATRON_TP2, direct, LOG)
    assert (decision.value, decision.source) == ("4", "explicit")
    assert environ["CUDA_DEVICE_MAX_CONNECTIONS"] == "4"
    assert "breaks a preferred rule" in decision.warnings[0]


CONNECTIONS = "CUDA_DEVICE_MAX_CONNECTIONS"
NODE_OWN_1 = {CONNECTIONS: "1"}


def merged(*envs):
    """A worker's environment on an A100 node that exports 1: the node's,
    with each runtime env's env_vars applied over it, as Ray merges them key
    by key (job, then actor, then task)."""
    out = node("8.0", **NODE_OWN_1)
    for env in envs:
        out.update(env.get("env_vars") or {})
    return out


# The setup hook tells explicit from inherited (the precedence) by
# what the worker's environment carries, never by asking Ray for the job's
# env. FSDP prefers anything but 1 (rules.md: fsdp-style), so a 1 the
# runtime env gave is kept (explicit) and the node's own 1 is replaced by
# CUDA's default 8 (policy).
@pytest.mark.parametrize("case,envs,expected", [
    ("the job's value, equal to the node's own",
     lambda: [build_runtime_env(FSDP, base={"env_vars": NODE_OWN_1})], ("1", "explicit")),
    ("a per-role env under that job env",
     lambda: [build_runtime_env(FSDP, base={"env_vars": NODE_OWN_1}),
              build_runtime_env(FSDP, role="actor")], ("1", "explicit")),
    ("an actor's plain env_vars equal to the node's, over another job value",
     lambda: [build_runtime_env(FSDP, base={"env_vars": {CONNECTIONS: "4"}}),
              {"env_vars": NODE_OWN_1}], ("1", "explicit")),
    ("an actor's value over the job's",
     lambda: [build_runtime_env(FSDP, base={"env_vars": NODE_OWN_1}),
              {"env_vars": {CONNECTIONS: "4"}}], ("4", "explicit")),
    ("a job env without the variable: the node's own",
     lambda: [build_runtime_env(FSDP)], ("8", "policy")),
    ("a job's value the driver hook took over",
     lambda: [build_runtime_env(FSDP, base={"env_vars": NODE_OWN_1}, take_over=True)],
     ("8", "policy")),
])
def test_a_value_a_runtime_env_gave_is_explicit_even_where_it_equals_the_nodes(
        case, envs, expected):
    environ = merged(*envs())
    decision = decide_in_worker(environ, node("8.0", **NODE_OWN_1), direct, LOG)
    assert (decision.value, decision.source) == expected, case
    assert environ[CONNECTIONS] == expected[0]


def test_a_mark_the_node_exports_itself_is_the_nodes():
    # A node whose own environment has the mark (a shell copied from a
    # worker's) gives its workers nothing explicit.
    node_env = node("8.0", **NODE_OWN_1, RAY_MEGATRON_ENV_GIVEN_CUDA_DEVICE_MAX_CONNECTIONS="1")
    environ = worker(node_env, **{FIELD_VARIABLE: json.dumps(FSDP)})
    decision = decide_in_worker(environ, node_env, direct, LOG)
    assert (decision.value, decision.source, decision.node_value) == ("8", "policy", "1")


def test_every_env_the_package_builds_marks_the_pack_variables_it_sets():
    env = build_runtime_env(FSDP, base={"env_vars": {CONNECTIONS: "1", "A": "b"}},
                            packs=["torch-arch"])
    marks = {k: v for k, v in env["env_vars"].items() if k.startswith("RAY_MEGATRON_ENV_GIVEN_")}
    assert marks == {"RAY_MEGATRON_ENV_GIVEN_CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    assert as_actor_env(env)["env_vars"]["RAY_MEGATRON_ENV_GIVEN_CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    # ray job submit: a value left to verl's driver loses its mark with it.
    submitted, _ = job_submission_env(env, "verl")
    assert submitted["env_vars"]["RAY_MEGATRON_ENV_GIVEN_CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    del env["env_vars"][CONNECTIONS]
    submitted, _ = job_submission_env(env, "verl")
    assert not any(k.startswith("RAY_MEGATRON_ENV_GIVEN_") for k in submitted["env_vars"])


def test_the_workers_own_field_is_what_is_decided():
    node_env = node("9.0")
    environ = worker(node_env, **{FIELD_VARIABLE: json.dumps(FSDP)})
    decision = decide_in_worker(environ, node_env, direct, LOG)
    assert decision.engines == {"actor": "fsdp"} and decision.value is None


def test_where_the_plugin_decided_the_fallback_does_nothing():
    node_env = node("9.0")
    environ = worker(node_env, CUDA_DEVICE_MAX_CONNECTIONS="1",
                     RAY_MEGATRON_ENV_DECISION='{"via":"plugin"}',
                     **{FIELD_VARIABLE: json.dumps(FSDP)})
    before = dict(environ)
    assert decide_in_worker(environ, node_env, direct, LOG) is None
    assert environ == before


def test_without_a_field_nothing_is_decided_and_the_worker_log_says_so(caplog):
    node_env = node("9.0")
    environ = worker(node_env)
    with caplog.at_level(logging.WARNING, logger=LOG.name):
        assert decide(environ, node_env, None, direct, LOG) is None
    assert "RAY_MEGATRON_ENV_DECISION" not in environ
    assert "has no RAY_MEGATRON_ENV_FIELD" in caplog.text


def test_a_bad_field_fails_the_worker_with_the_fields_message():
    node_env = node("9.0")
    with pytest.raises(ValueError, match="unknown strategy 'megatorn'"):
        decide(worker(node_env), node_env,
               {"version": 2, "engines": {"a": {"strategy": "megatorn"}}}, direct, LOG)


def test_an_unreadable_node_environment_keeps_what_the_worker_has():
    # No way to tell inherited from explicit: what the worker has is kept.
    environ = worker(node("8.0"), CUDA_DEVICE_MAX_CONNECTIONS="1")
    decision = decide(environ, None, FSDP, direct, LOG)
    assert (decision.value, decision.source) == ("1", "explicit")


def test_a_field_variable_that_is_not_json_names_the_variable():
    node_env = node("9.0")
    with pytest.raises(ValueError, match="RAY_MEGATRON_ENV_FIELD is not JSON"):
        decide(worker(node_env, **{FIELD_VARIABLE: "{oops"}), node_env, None, direct, LOG)


def test_node_environment_reads_only_a_raylet_parent():
    # This test's parent is not a raylet.
    assert node_environment() is None
    assert node_environment(pid=2 ** 22 + 12345) is None  # no such process


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
    monkeypatch.setattr("ray_megatron_env.setup_hook.decide_in_worker",
                        lambda *a, **k: order.append("ours"))
    chained(lambda: order.append("theirs"))()
    assert order == ["ours", "theirs"]


def test_a_hook_of_another_kind_is_refused():
    with pytest.raises(TypeError, match="worker_process_setup_hook must be"):
        build_runtime_env(MEGATRON_TP2, base={"worker_process_setup_hook": 3})


def test_an_actor_env_carries_the_hook_as_ray_does():
    env = as_actor_env(build_runtime_env(MEGATRON_TP2))
    assert "worker_process_setup_hook" not in env
    assert env["env_vars"][RAY_SETUP_HOOK_VARIABLE] == SETUP_HOOK_PATH
    assert as_actor_env({"env_vars": {"A": "1"}}) == {"env_vars": {"A": "1"}}


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

    decision = decide(environ, node_env, field, cache, LOG)
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
    decide(worker(node_env), node_env, MEGATRON_TP2, cache, LOG)
    assert kinds == ["gpus"]


def test_a_later_worker_takes_the_nodes_decision_from_its_cache(tmp_path, monkeypatch):
    from ray_megatron_env import setup_hook as worker_module
    from ray_megatron_env.setup_hook import decide_here

    cache = NodeCache(str(tmp_path), "node-1")
    node_env = node("9.0", CUDA_DEVICE_MAX_CONNECTIONS="4")
    tp2 = {FIELD_VARIABLE: json.dumps(MEGATRON_TP2)}
    first = worker(node_env, **tp2)
    decide_here(first, node_env, cache, lambda: LOG)
    assert first["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"  # the node's 4 replaced

    def no_core(*args, **kwargs):
        raise AssertionError("the core ran again for the same inputs")

    monkeypatch.setattr(worker_module, "decide_in_worker", no_core)
    second = worker(node_env, **tp2)
    decide_here(second, node_env, cache, lambda: LOG)
    assert second == first
    # Other inputs (an explicit value) are decided anew, not taken from the cache.
    with pytest.raises(AssertionError, match="the core ran again"):
        decide_here(worker(node_env, CUDA_DEVICE_MAX_CONNECTIONS="8", **tp2), node_env,
                    cache, lambda: LOG)
    with pytest.raises(AssertionError, match="the core ran again"):
        decide_here(worker(node_env, **{FIELD_VARIABLE: json.dumps(FSDP)}), node_env, cache,
                    lambda: LOG)
    # The same worker environment where a runtime env gave the node's own value.
    with pytest.raises(AssertionError, match="the core ran again"):
        decide_here(worker(node_env, RAY_MEGATRON_ENV_GIVEN_CUDA_DEVICE_MAX_CONNECTIONS="1",
                           **tp2), node_env, cache, lambda: LOG)


def test_a_workers_own_driver_hook_runs_after_ours():
    from ray._private import ray_constants

    from ray_megatron_env import names
    from ray_megatron_env.setup_hook import hook_nested_drivers

    assert names.DRIVER_HOOK_VARIABLE == ray_constants.RAY_RUNTIME_ENV_HOOK
    environ = {"RAY_RUNTIME_ENV_HOOK": "my.hook"}
    hook_nested_drivers(environ)
    hook_nested_drivers(environ)
    assert {k: environ[k] for k in ("RAY_RUNTIME_ENV_HOOK", "RAY_MEGATRON_ENV_NEXT_HOOK")} == {
        "RAY_RUNTIME_ENV_HOOK": "ray_megatron_env.hook.runtime_env_hook",
        "RAY_MEGATRON_ENV_NEXT_HOOK": "my.hook"}



class RayWorkerStandIn:
    """Stands for Ray's ``global_worker`` in a worker process: answers what
    Ray fixes when it starts the process (its node, node id and job id) and
    records every attribute and call asked of it, whatever the answer."""

    def __init__(self, seen, path="", answers=None):
        self._seen, self._path, self._answers = seen, path, answers or {}

    def __getattr__(self, name):
        path = f"{self._path}.{name}" if self._path else name
        self._seen.append(path)
        if path in self._answers:
            return self._answers[path]
        return RayWorkerStandIn(self._seen, path, self._answers)

    def __call__(self, *args, **kwargs):
        self._seen.append(f"{self._path}()")
        return RayWorkerStandIn(self._seen, f"{self._path}()", self._answers)


# What Ray fills in a worker only when its first task arrives, and then
# keeps for the process's life (docs/design.md): the job's config (its
# runtime env, namespace, the driver's sys.path) and the task's runtime env.
LAZY_RAY_STATE = ("job_config", "namespace", "runtime_env", "get_runtime_context")


def test_the_setup_hook_asks_ray_nothing_it_fills_with_the_first_task(tmp_path, monkeypatch):
    import types

    import ray
    from ray_megatron_env import setup_hook as worker_module

    seen = []
    folder = types.SimpleNamespace(get_session_dir_path=lambda: str(tmp_path),
                                   get_logs_dir_path=lambda: str(tmp_path))
    stand_in = RayWorkerStandIn(seen, answers={
        "node": folder, "current_node_id": types.SimpleNamespace(hex=lambda: "node-1"),
        "current_job_id": types.SimpleNamespace(hex=lambda: "01000000")})
    monkeypatch.setattr(ray._private.worker, "global_worker", stand_in)
    monkeypatch.setattr(ray, "get_runtime_context", lambda: seen.append("get_runtime_context"))
    node_env = node("8.0", **NODE_OWN_1)
    monkeypatch.setattr(worker_module, "node_environment", lambda: node_env)
    job = build_runtime_env(FSDP, base={"env_vars": NODE_OWN_1})
    os.environ.update(merged(job))

    worker_module.setup_hook()

    decision = json.loads(os.environ["RAY_MEGATRON_ENV_DECISION"])
    assert (decision["via"], os.environ[CONNECTIONS]) == ("setup-hook", "1")
    assert decision["variables"][CONNECTIONS]["source"] == "explicit"
    assert seen, "the hook asked Ray's worker nothing: the stand-in was not used"
    assert [p for p in seen if any(lazy in p for lazy in LAZY_RAY_STATE)] == []
