"""Topical: a framework's copy of the driver's environment in the job's env_vars
(NeMo-RL's init_ray: ``env_vars = dict(os.environ)``; worker_groups.py again
per worker) is decided per node as an inherited value, not kept as the
job's explicit one: the driver-side detection (build_runtime_env, the driver
hook, ray job submit), the field's ``driver_env``, and the precedence on
both ways in (the agent and the setup hook).

Golden values are written from the sources, not from the code:
NeMo-RL's image sets TORCH_CUDA_ARCH_LIST="9.0 10.0" (docker/Dockerfile);
PyTorch's _get_cuda_arch_flags builds one -gencode per listed arch, so that
list has no code for an A100 (8.0) and covers an H100 (9.0); the node's own
list is its distinct capabilities ("8.0"). CUDA_DEVICE_MAX_CONNECTIONS: a
Megatron TP=2 policy before Blackwell prefers 1, an inference engine must
not run with 1 (CUDA's default 8 is written over an inherited 1), Blackwell
asks nothing (docs/rules.md). NCCL: 4 GPUs without peer access on CUDA driver
12.8 need NCCL_CUMEM_HOST_ENABLE=0 (docs/packs.md, nccl-host-mem).
"""

import json
import logging

import pytest

from ray_megatron_env import build_runtime_env
from ray_megatron_env.agent import NodeAgent, check_runtime_env
from ray_megatron_env.cache import ProbeCache
from ray_megatron_env.decision import decide_node, settle
from ray_megatron_env.record import Decision
from ray_megatron_env.errors import EnvironmentVariableError, FieldTypeError, FieldValueError
from ray_megatron_env.frameworks import parse_field
from ray_megatron_env.hook import runtime_env_hook
from ray_megatron_env.job_submission import driver_environment
from ray_megatron_env.names import JOB_CONFIG_VARIABLE
from ray_megatron_env.node import NodeFacts, NodeGpus
from ray_megatron_env.probe.fake import parse_fake_node
from ray_megatron_env.packs.pack import REMOVE, Outcome
from ray_megatron_env.setup_hook import decide_in_worker
from paths import FIXTURES

# NeMo-RL's examples/configs/grpo_math_1B_megatron.yaml (Megatron TP=2 policy, vLLM)
NEMO_RL_MEGATRON = FIXTURES / "nemo_rl/configs/grpo_math_1B_megatron.yaml"

CUDA, ARCHS, HOST = "CUDA_DEVICE_MAX_CONNECTIONS", "TORCH_CUDA_ARCH_LIST", "NCCL_CUMEM_HOST_ENABLE"
IMAGE_ARCHS = "9.0 10.0"  # NeMo-RL docker/Dockerfile: ENV TORCH_CUDA_ARCH_LIST="9.0 10.0"
# A NeMo-RL driver's environment: the image's list, a stray 1 on the driver
# host, and what every shell has.
DRIVER = {ARCHS: IMAGE_ARCHS, CUDA: "1", "PATH": "/usr/bin", "HOME": "/root"}
LOG = logging.getLogger("test_driver_env")

A100, H100, B200 = ([(8, 0)], [(9, 0)], [(10, 0)])


def nemo_rl_env(driver=DRIVER, env_vars=None, **kw):
    """The driver line around NeMo-RL's init_ray: its env_vars are a copy of
    the driver's environment."""
    copied = dict(driver) if env_vars is None else env_vars
    return build_runtime_env(str(NEMO_RL_MEGATRON), base={"env_vars": copied},
                             driver_environ=driver, **kw)


# --- the driver side --------------------------------------------------------

@pytest.mark.parametrize("driver,env_vars,packs,expected", [
    # NeMo-RL's copy: both decided variables are the driver's own
    (DRIVER, None, ["torch-arch"], {ARCHS: IMAGE_ARCHS, CUDA: "1"}),
    # only the variables of the job's packs: without torch-arch, its
    # variable is not decided, so it is not listed (and stays in env_vars)
    (DRIVER, None, None, {CUDA: "1"}),
    # a value other than the driver's own is the job's: explicit
    (DRIVER, {ARCHS: "8.0", CUDA: "1"}, ["torch-arch"], {CUDA: "1"}),
    # a driver variable the env_vars do not carry: nothing copied
    (DRIVER, {"PATH": "/usr/bin"}, ["torch-arch"], {}),
    # the driver has no such variable: env_vars' value is the job's
    ({"PATH": "/usr/bin"}, {CUDA: "1"}, ["torch-arch"], {}),
    # the user's list of explicit variables wins
    ({**DRIVER, "RAY_MEGATRON_ENV_EXPLICIT": ARCHS}, None, ["torch-arch"], {CUDA: "1"}),
    ({**DRIVER, "RAY_MEGATRON_ENV_EXPLICIT": f"{CUDA}, {ARCHS}"}, None, ["torch-arch"], {}),
    ({**DRIVER, "RAY_MEGATRON_ENV_EXPLICIT": "*"}, None, ["torch-arch"], {}),
    # Ray expands $VAR in env_vars values: such a value is not listed
    ({ARCHS: "$X"}, None, ["torch-arch"], {}),
    # detection off (the env ray-megatron-env runtime-env writes for ray job submit)
    ({}, DRIVER, ["torch-arch"], {}),
])
def test_the_driver_lists_the_decided_variables_it_copied(driver, env_vars, packs, expected):
    env = nemo_rl_env(driver, env_vars, packs=packs)
    assert env["megatron_env"].get("driver_env", {}) == expected
    # never dropped: env_vars keep every value they had
    assert all(env["env_vars"][k] == v for k, v in (env_vars or driver).items())
    # the setup hook's copy of the field carries it too
    assert json.loads(env["env_vars"]["RAY_MEGATRON_ENV_FIELD"]).get("driver_env", {}) == expected


def test_a_bad_explicit_list_names_the_variable():
    with pytest.raises(EnvironmentVariableError, match="RAY_MEGATRON_ENV_EXPLICIT='TORCH_ARCH'"):
        nemo_rl_env({**DRIVER, "RAY_MEGATRON_ENV_EXPLICIT": "TORCH_ARCH"})


def test_a_copied_value_cuda_cannot_read_is_the_nodes_problem_not_the_jobs():
    driver = {CUDA: "0"}
    env = nemo_rl_env(driver)  # inherited: warned on the node, as a node's own value
    assert env["megatron_env"]["driver_env"] == {CUDA: "0"}
    check_runtime_env(env)
    with pytest.raises(FieldValueError, match="env_vars.CUDA_DEVICE_MAX_CONNECTIONS is '0'"):
        nemo_rl_env({}, {CUDA: "0"})  # the job's own: refused on the driver, as before


def test_take_over_keeps_the_configs_own_value_explicit():
    cfg = {"actor_rollout_ref": {"actor": {"strategy": "megatron", "megatron": {
        "tensor_model_parallel_size": 2, "context_parallel_size": 1}}},
        "ray_kwargs": {"ray_init": {"runtime_env": {"env_vars": {CUDA: "1"}}}}}
    env = build_runtime_env(cfg, base={"env_vars": {CUDA: "1"}}, take_over=True,
                            driver_environ={CUDA: "1"})
    assert "driver_env" not in env["megatron_env"] and env["env_vars"][CUDA] == "1"


def test_the_driver_hook_finds_nemo_rls_copy(monkeypatch):
    # Ray calls the hook inside NeMo-RL's ray.init with env_vars = dict(os.environ).
    for name in (JOB_CONFIG_VARIABLE, "RAY_MEGATRON_ENV_EXPLICIT", "RAY_MEGATRON_ENV_TAKE_OVER",
                 "RAY_MEGATRON_ENV_NEXT_HOOK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(ARCHS, IMAGE_ARCHS)
    monkeypatch.setenv(CUDA, "1")
    import os

    field = {**json.loads(json.dumps(build_runtime_env(str(NEMO_RL_MEGATRON),
                                                       driver_environ={})["megatron_env"])),
             "packs": ["torch-arch"]}
    env = runtime_env_hook({"megatron_env": field, "env_vars": dict(os.environ)})
    assert env["megatron_env"]["driver_env"] == {ARCHS: IMAGE_ARCHS, CUDA: "1"}


def test_a_driver_nested_in_a_worker_lists_no_copy(monkeypatch):
    # In a worker the environment holds the values the job set (kept
    # explicit) or the decision wrote, never a driver host's copy: a driver
    # started there (vLLM's Ray executor; the setup hook marks the worker)
    # passes the worker's runtime env, and those values stay what they were.
    from ray_megatron_env.setup_hook import hook_nested_drivers

    for name in (JOB_CONFIG_VARIABLE, "RAY_MEGATRON_ENV_EXPLICIT", "RAY_MEGATRON_ENV_TAKE_OVER",
                 "RAY_MEGATRON_ENV_NEXT_HOOK", "RAY_RUNTIME_ENV_HOOK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(ARCHS, IMAGE_ARCHS)
    import os

    marked = dict(os.environ)
    hook_nested_drivers(marked)
    for name in set(marked) - set(os.environ):
        monkeypatch.setenv(name, marked[name])
    field = {**json.loads(json.dumps(build_runtime_env(str(NEMO_RL_MEGATRON),
                                                       driver_environ={})["megatron_env"])),
             "packs": ["torch-arch"]}
    env = runtime_env_hook({"megatron_env": field, "env_vars": {ARCHS: IMAGE_ARCHS}})
    assert "driver_env" not in env["megatron_env"] and env["env_vars"][ARCHS] == IMAGE_ARCHS


def test_a_submitted_env_vars_value_is_the_users_not_the_drivers():
    # ray job submit puts the submitted env_vars into the driver's
    # environment: there they are the user's explicit values.
    job_env = {"megatron_env": {"engines": {}}, "env_vars": {ARCHS: "8.0 9.0",
                                                           "RAY_MEGATRON_ENV_MERGE": "override"}}
    environ = {ARCHS: "8.0 9.0", CUDA: "1", "RAY_MEGATRON_ENV_MERGE": "override",
               "RAY_MEGATRON_ENV_EXPLICIT": CUDA, "PATH": "/usr/bin"}
    assert driver_environment(job_env, environ) == {
        CUDA: "1", "RAY_MEGATRON_ENV_MERGE": "override", "RAY_MEGATRON_ENV_EXPLICIT": CUDA,
        "PATH": "/usr/bin"}
    assert driver_environment(None, environ) == environ


def test_the_submitted_path_end_to_end_in_the_hook(monkeypatch):
    import os

    field = build_runtime_env(str(NEMO_RL_MEGATRON), packs=["torch-arch"],
                              driver_environ={})["megatron_env"]
    submitted = {"megatron_env": field, "env_vars": {CUDA: "1",
                                                     "RAY_MEGATRON_ENV_MERGE": "override"}}
    for name in ("RAY_MEGATRON_ENV_EXPLICIT", "RAY_MEGATRON_ENV_TAKE_OVER",
                 "RAY_MEGATRON_ENV_NEXT_HOOK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(JOB_CONFIG_VARIABLE, json.dumps({"runtime_env": submitted}))
    monkeypatch.setenv("RAY_MEGATRON_ENV_MERGE", "override")
    monkeypatch.setenv(CUDA, "1")  # from the submitted env: the user's
    monkeypatch.setenv(ARCHS, IMAGE_ARCHS)  # the image's
    # Ray has merged NeMo-RL's env_vars (its environment) over the submitted env.
    env = runtime_env_hook({**submitted, "env_vars": dict(os.environ)})
    assert env["megatron_env"]["driver_env"] == {ARCHS: IMAGE_ARCHS}


# --- the field ----------------------------------------------------------------

def test_driver_env_round_trips_and_is_checked():
    field = nemo_rl_env(packs=["torch-arch"])["megatron_env"]
    assert parse_field(field).to_field() == field
    base = {"engines": {}, "packs": ["nccl-host-mem"]}
    assert parse_field({**base, "driver_env": {HOST: "1"}}).driver_env == ((HOST, "1"),)
    with pytest.raises(FieldValueError, match="driver_env names 'TORCH_CUDA_ARCH_LIST', which "
                                              "no pack of this job decides"):
        parse_field({**base, "driver_env": {ARCHS: "8.0"}})
    with pytest.raises(FieldTypeError, match="driver_env.NCCL_CUMEM_HOST_ENABLE must be a string"):
        parse_field({**base, "driver_env": {HOST: 1}})
    with pytest.raises(FieldTypeError, match="without '\\$'"):
        parse_field({**base, "driver_env": {HOST: "$X"}})
    with pytest.raises(FieldTypeError, match="driver_env must be a mapping"):
        parse_field({**base, "driver_env": [HOST]})
    with pytest.raises(FieldValueError, match="unknown key"):
        parse_field({"version": 1, "engines": {}, "driver_env": {}})


# --- the precedence -----------------------------------------------------------

def field(packs=("torch-arch",), driver_env=None, engines=None):
    return parse_field({"engines": engines or {"policy": {"strategy": "megatron",
                                                          "tensor_parallel": 2}},
                        "packs": list(packs), "driver_env": driver_env or {}})


FSDP = {"critic": {"strategy": "fsdp"}}
VLLM = {"generation": {"strategy": "vllm"}}
COPIED = {ARCHS: IMAGE_ARCHS, CUDA: "1"}


# (engines, GPUs, driver_env, worker env_vars, node's own environment) ->
# (variable, value, source, driver_value, written)
@pytest.mark.parametrize("engines,gpus,driver_env,env_vars,node,variable,expected", [
    # the issue's case: the image's list, copied, on an A100: replaced
    (None, A100, COPIED, COPIED, {}, ARCHS, ("8.0", "policy", IMAGE_ARCHS, "8.0")),
    # ... on an A100 whose own image lists 8.0: replaced all the same
    (None, A100, COPIED, COPIED, {ARCHS: "8.0"}, ARCHS, ("8.0", "policy", IMAGE_ARCHS, "8.0")),
    # ... on an H100 (and a B200) it covers: kept, as the driver's
    (None, H100, COPIED, COPIED, {}, ARCHS, (IMAGE_ARCHS, "driver-env", IMAGE_ARCHS, None)),
    (None, B200, COPIED, COPIED, {}, ARCHS, (IMAGE_ARCHS, "driver-env", IMAGE_ARCHS, None)),
    # ... on a node without GPUs (leave): kept
    (None, [], COPIED, COPIED, {}, ARCHS, (IMAGE_ARCHS, "driver-env", IMAGE_ARCHS, None)),
    # the same list, but not the driver's value: the job's, kept on an A100
    (None, A100, {CUDA: "1"}, COPIED, {}, ARCHS, (IMAGE_ARCHS, "explicit", None, None)),
    # an actor's own value over the copy is not the driver's: explicit
    (None, A100, COPIED, {**COPIED, ARCHS: "9.0"}, {}, ARCHS, ("9.0", "explicit", None, None)),
    # a stray 1 on the driver: kept where Megatron TP=2 prefers 1 (A100, H100)
    (None, A100, COPIED, COPIED, {}, CUDA, ("1", "driver-env", "1", None)),
    (None, H100, COPIED, COPIED, {}, CUDA, ("1", "driver-env", "1", None)),
    # ... kept where nothing is asked (Blackwell), as a node's would be
    (None, B200, COPIED, COPIED, {}, CUDA, ("1", "driver-env", "1", None)),
    # ... replaced by CUDA's default where an engine must not run with 1
    (FSDP, H100, COPIED, COPIED, {}, CUDA, ("8", "policy", "1", "8")),
    (VLLM, A100, COPIED, COPIED, {}, CUDA, ("8", "policy", "1", "8")),
    # ... where Megatron asks 1, the driver's 4 is replaced
    (None, H100, {CUDA: "4"}, {CUDA: "4"}, {}, CUDA, ("1", "policy", "4", "1")),
    # without driver_env, the old reading: the job's, kept
    (FSDP, H100, None, COPIED, {}, CUDA, ("1", "explicit", None, None)),
])
def test_precedence_of_a_copied_value(engines, gpus, driver_env, env_vars, node, variable,
                                      expected):
    spec = field(driver_env=driver_env, engines=engines)
    result = decide_node(spec, NodeFacts(NodeGpus.known(gpus, "fake")), dict(env_vars), node)
    entry = result.decision.variables[variable]
    assert (entry.value, entry.source, entry.driver_value,
            result.write.get(variable)) == expected
    assert entry.node_value == node.get(variable)
    copied = entry.driver_value is not None
    assert ("copied into env_vars from the driver's environment" in entry.reason) == copied
    # a copied value is never "explicit ... kept because env_vars is the user's intent"
    assert not (copied and any("user's intent" in w for w in result.decision.warnings))
    record = json.loads(result.decision.to_json())["variables"][variable]
    assert ("driver_value" in record) == copied
    assert Decision.from_json(result.decision.to_json()) == result.decision


def test_a_copied_value_cuda_cannot_read_is_warned_and_replaced():
    spec = field(driver_env={CUDA: "0"})
    result = decide_node(spec, NodeFacts(NodeGpus.known(H100, "fake")), {CUDA: "0"}, {})
    entry = result.decision.variables[CUDA]
    assert (entry.value, entry.source, result.write[CUDA]) == ("1", "policy", "1")
    assert any("'0' is not an integer from 1 to 32" in w for w in result.decision.warnings)


def test_a_copied_nccl_value_is_replaced_where_nccl_would_fail():
    fake = parse_fake_node('{"gpus": "8.9,8.9,8.9,8.9", "p2p": "none", "cuda_driver": "12.8"}')
    facts = NodeFacts(fake.gpus, fake.fabric, fake.p2p)
    copied = field(packs=["nccl-host-mem"], driver_env={HOST: "1"})
    result = decide_node(copied, facts, {HOST: "1"}, {})
    entry = result.decision.variables[HOST]
    assert (entry.value, entry.source, result.write.get(HOST)) == ("0", "policy", "0")
    assert result.decision.satisfied
    # the job's own 1 (not the driver's): kept, and the required row is broken
    own = decide_node(field(packs=["nccl-host-mem"]), facts, {HOST: "1"}, {})
    assert (own.decision.variables[HOST].source, own.decision.satisfied) == ("explicit", False)


@pytest.mark.parametrize("node,value,source,write,remove,warned", [
    ({}, None, "policy", None, True, False),  # the copy goes; nothing is left
    ({HOST: "1"}, "1", "node", "1", False, True),  # the node's own stays, with a warning
])
def test_a_remove_takes_the_copy_away(node, value, source, write, remove, warned):
    outcome = Outcome(HOST, REMOVE, None, "required", "r", "because")
    settled = settle(outcome, {}, node, pack="p", driver_value="0")
    assert (settled.entry.value, settled.entry.source, settled.write, settled.remove,
            bool(settled.warnings)) == (value, source, write, remove, warned)


# --- both ways in ---------------------------------------------------------------

def test_the_plugin_and_the_setup_hook_agree_on_an_a100_and_an_h100():
    env = nemo_rl_env(packs=["torch-arch"])
    for gpus, archs, source in (("8.0", "8.0", "policy"), ("9.0", IMAGE_ARCHS, "driver-env")):
        caps = NodeGpus.known([tuple(map(int, gpus.split(".")))], "fake")
        env_vars = dict(env["env_vars"])
        decision = NodeAgent(ProbeCache(lambda: caps)).decide_and_write(env, env_vars, {"PATH": "/usr/bin"},
                                                             LOG)
        assert (env_vars[ARCHS], decision.variables[ARCHS].source) == (archs, source)
        assert (env_vars[CUDA], decision.variables[CUDA].source) == ("1", "driver-env")
        # the setup hook: the worker has the node's environment with env_vars over it
        node = {"RAY_MEGATRON_ENV_FAKE_GPUS": gpus, "PATH": "/usr/bin"}
        environ = {**node, **env["env_vars"]}
        hooked = decide_in_worker(environ, node, lambda probe, kind: probe(), LOG)
        assert (environ[ARCHS], hooked.variables[ARCHS].source) == (archs, source)
        assert hooked.variables[ARCHS].driver_value == IMAGE_ARCHS


def test_the_env_for_ray_job_submit_lists_no_copy_of_this_shell(capsys, tmp_path, monkeypatch):
    # Its env_vars are the user's; the driver hook looks in the job's driver.
    from ray_megatron_env.cli import main

    monkeypatch.setenv(ARCHS, IMAGE_ARCHS)
    base = tmp_path / "base.json"
    base.write_text(json.dumps({"env_vars": {ARCHS: IMAGE_ARCHS}}))
    assert main(["runtime-env", str(NEMO_RL_MEGATRON), "--base", str(base), "--json",
                 "--packs", "torch-arch"]) == 0
    env = json.loads(capsys.readouterr().out)
    assert env["env_vars"][ARCHS] == IMAGE_ARCHS and "driver_env" not in env["megatron_env"]
