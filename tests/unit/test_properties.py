"""Topical: property-based tests (hypothesis) of the parser, the policy and the agent.

Any input either yields a valid decision or raises the documented error
type; the driver and the agent agree; the agent writes two variables only.
"""

import json
import logging

from hypothesis import HealthCheck, given, settings, strategies as st

from ray_megatron_env import build_runtime_env
from ray_megatron_env.agent import NodeAgent
from ray_megatron_env.names import CONNECTIONS_VARIABLE, DECISION_VARIABLE
from ray_megatron_env.errors import MegatronEnvError
from ray_megatron_env.frameworks import parse_field
from ray_megatron_env.node import NodeGpus
from ray_megatron_env.cache import ProbeCache
from ray_megatron_env.engines import CUDA_RANGE, ENGINE_KINDS, KNOWN_STRATEGIES

from deciding import decided as decide

SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
QUIET = logging.getLogger("properties")
QUIET.addHandler(logging.NullHandler())
QUIET.propagate = False

names = st.one_of(st.sampled_from(sorted(KNOWN_STRATEGIES) + list(ENGINE_KINDS)),
                  st.sampled_from(["megatorn", "Megatron", "${oc.env:HOME}", "$HOME", "a b", ""]),
                  st.text(max_size=12))
scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 70000),
                    st.integers(min_value=-(2**70), max_value=2**70),
                    st.floats(allow_nan=True), names)
json_like = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(names, inner, max_size=3)), max_leaves=12)

engine_keys = st.sampled_from(["strategy", "kind", "tensor_parallel", "context_parallel",
                               "megatron_fsdp", "torch_fsdp2", "moe_overlap", "env_vars"])
engine_values = st.one_of(st.sampled_from(sorted(KNOWN_STRATEGIES)), st.integers(0, 9),
                          st.booleans(), scalars)
engines = st.dictionaries(engine_keys, engine_values, max_size=7)
compact = st.fixed_dictionaries(
    {"engines": st.one_of(st.dictionaries(names, engines, max_size=4), json_like)},
    optional={"version": st.one_of(st.just(1), scalars)})

sizes = st.one_of(st.integers(1, 8), scalars)
megatron_section = st.fixed_dictionaries({}, optional={
    "tensor_model_parallel_size": sizes, "context_parallel_size": sizes,
    "use_megatron_fsdp": st.one_of(st.booleans(), scalars)})
role_section = st.fixed_dictionaries({}, optional={
    "strategy": st.one_of(st.sampled_from(sorted(KNOWN_STRATEGIES)), names, scalars),
    "enable": st.one_of(st.booleans(), st.none(), scalars),
    "megatron": st.one_of(megatron_section, json_like),
    "name": names, "extra": json_like})
verl = st.fixed_dictionaries({}, optional={
    "actor_rollout_ref": st.one_of(st.fixed_dictionaries({}, optional={
        "actor": role_section, "ref": role_section, "rollout": role_section}), json_like),
    "critic": st.one_of(role_section, json_like),
    "reward_model": role_section,
    "reward": st.fixed_dictionaries({}, optional={"reward_model": role_section}),
    "trainer": json_like,
    "megatron_env": st.one_of(st.fixed_dictionaries({}, optional={
        "engine_kinds": st.dictionaries(names, names, max_size=2)}), json_like)})
# Mostly-valid inputs, so that accepted configs with engines are common too.
roles = st.sampled_from(["actor", "ref", "critic", "rollout", "reward_model", "policy", "value"])
flags = st.fixed_dictionaries({}, optional={
    "megatron_fsdp": st.booleans(), "torch_fsdp2": st.booleans(), "moe_overlap": st.booleans()})
valid_engine = st.one_of(
    st.builds(lambda tp, cp, f: {"strategy": "megatron", "tensor_parallel": tp,
                                 "context_parallel": cp, **f},
              st.integers(1, 8), st.integers(1, 4), flags),
    st.sampled_from(sorted(KNOWN_STRATEGIES)).map(lambda name: {"strategy": name}),
    st.sampled_from(ENGINE_KINDS).map(lambda kind: {"strategy": "custom_engine", "kind": kind}))
valid_compact = st.builds(lambda e: {"version": 1, "engines": e},
                          st.dictionaries(roles, valid_engine, min_size=1, max_size=5))
valid_section = st.builds(
    lambda strategy, tp, cp, fsdp, enable: {
        "strategy": strategy, "enable": enable,
        "megatron": {"tensor_model_parallel_size": tp, "context_parallel_size": cp,
                     "use_megatron_fsdp": fsdp}},
    st.sampled_from(sorted(KNOWN_STRATEGIES)), st.integers(1, 8), st.integers(1, 4),
    st.booleans(), st.sampled_from([None, True, False]))
valid_verl = st.builds(
    lambda actor, ref, critic, rollout: {
        "actor_rollout_ref": {"actor": actor, "ref": ref, "rollout": {"name": rollout}},
        "critic": critic, "trainer": {"v1": {"sampler": {"max_off_policy_strategy": "drop"}}}},
    valid_section, valid_section, valid_section, st.sampled_from(["vllm", "sglang", "???"]))
fields = st.one_of(valid_compact, valid_verl, compact, verl, json_like)

capabilities = st.tuples(st.integers(3, 12), st.integers(0, 9))
node_gpus = st.one_of(
    st.lists(capabilities, max_size=4).map(lambda caps: NodeGpus.known(caps, "fake")),
    st.just(NodeGpus.unknown("nvml", "probe failed")))
valid_values = st.one_of(st.none(), st.integers(1, 32).map(str))


def outcome(function, *args, **kw):
    """('ok', result) or ('error', type name, message); anything else fails."""
    try:
        return ("ok", function(*args, **kw))
    except MegatronEnvError as exc:
        assert isinstance(exc, (TypeError, ValueError))
        assert str(exc).startswith("megatron_env: ")
        return ("error", type(exc).__name__, str(exc))


def apply_in_agent(field, gpus, env_vars, node_environ=None, agent=None):
    agent = agent or NodeAgent(ProbeCache(probe=lambda: gpus))
    return agent.decide_and_write({"megatron_env": field}, env_vars, node_environ or {}, QUIET)


@SETTINGS
@given(fields, node_gpus, valid_values)
def test_any_input_gives_a_valid_decision_or_the_documented_error(field, gpus, inherited):
    result = outcome(parse_field, field)
    if result[0] == "ok":
        decision = decide(result[1], gpus, inherited=inherited)
        assert decision.value is None or int(decision.value) in CUDA_RANGE
        assert decision.satisfied
        assert decision.reason.endswith(".")


@SETTINGS
@given(fields, node_gpus, valid_values)
def test_the_driver_and_the_agent_agree(field, gpus, inherited):
    environ = {CONNECTIONS_VARIABLE: inherited} if inherited else {}
    node = NodeAgent(ProbeCache(probe=lambda: gpus))  # one node: one probe
    on_driver = outcome(build_runtime_env, field) if isinstance(field, dict) else None
    in_agent = outcome(apply_in_agent, field, gpus, {}, environ, node)
    if on_driver is not None:
        assert on_driver[0] == in_agent[0]
        if on_driver[0] == "error":
            assert on_driver == in_agent
        else:
            # What the driver ships decides exactly as the raw value would.
            shipped = apply_in_agent(on_driver[1]["megatron_env"], gpus, {}, environ, node)
            assert shipped == in_agent[1]


@SETTINGS
@given(compact)
def test_the_compact_form_round_trips(field):
    result = outcome(parse_field, field)
    if result[0] == "ok":
        spec = result[1]
        shipped = json.loads(json.dumps(spec.to_field()))
        assert parse_field(shipped) == spec
        assert len(json.dumps(shipped)) <= 2048 or len(spec.engines) > 5


@SETTINGS
@given(fields, node_gpus, st.one_of(st.none(), st.integers(1, 32).map(str)),
       st.dictionaries(st.sampled_from(["PATH", "LD_PRELOAD", "HOME", "X"]), st.text(max_size=5),
                       max_size=3))
def test_the_agent_writes_only_its_two_variables(field, gpus, explicit, other_env_vars):
    env_vars = dict(other_env_vars)
    if explicit:
        env_vars[CONNECTIONS_VARIABLE] = explicit
    before = dict(env_vars)
    if outcome(apply_in_agent, field, gpus, env_vars)[0] == "error":
        assert env_vars == before  # nothing written on a refusal
        return
    changed = {k for k in set(env_vars) | set(before) if env_vars.get(k) != before.get(k)}
    assert changed <= {CONNECTIONS_VARIABLE, DECISION_VARIABLE}
    assert all(isinstance(v, str) for v in env_vars.values())
    if explicit:
        assert env_vars[CONNECTIONS_VARIABLE] == explicit
    assert "$" not in env_vars[DECISION_VARIABLE]
