"""Reading AReaL's experiment config layout into a ``Spec``.

AReaL (inclusionAI/AReaL, read at 4aef98d8 and the PyPI 1.0.4 wheel) names
each engine's backend and parallel layout in one string per engine:
``actor.backend: "megatron:d2p2t2"``, ``rollout.backend: "sglang:d4t2"``;
``critic``, ``ref`` and ``teacher`` sections have their own. The deprecated
top-level ``allocation_mode`` (``"sglang:d4+megatron:d2t2"``) is still read
by its legacy SPMD launchers. That grammar is read in ``areal_grammar.py``.

AReaL writes CUDA_DEVICE_MAX_CONNECTIONS=1 into every worker's env_vars
(``BASE_ENVIRONS``, areal/infra/utils/launcher.py:49), so that "1" is not
the user's choice: the spec says ``replaces="1"`` unless the user's own
config sets the variable in a ``scheduling_spec``'s ``env_vars``.
"""

from __future__ import annotations

import warnings
from typing import Any, Dict, Mapping, Optional, Tuple

from ..errors import FieldValueError
from ..engines import INFERENCE, MEGATRON
from ..names import CONNECTIONS_VARIABLE, FIELD
from ..spec import Engine, ProcessRule, Spec
from ..values import closest, fail_type, lookup, parse_connections, read_flag, read_name, show
from .areal_grammar import (
    INFER_BACKENDS, LEGACY, TRAIN_BACKENDS, Allocation, parse_allocation_mode, parse_backend,
)
from .reader import Reader

FRAMEWORK = "areal"
TRAIN_ROLES = ("actor", "critic", "ref", "teacher")
# judge_engine: an InferenceEngineConfig in an example's own config class
# (examples/search_agent/tongyi_deepresearch/config.py:29), started by its
# train.py as a second rollout controller (role="judge_engine").
INFER_ROLES = ("rollout", "judge_engine")
ROLES = TRAIN_ROLES + INFER_ROLES
# Roles whose backend has no fallback: AReaL declares ``backend`` MISSING
# (required) in TrainEngineConfig and InferenceEngineConfig
# (areal/api/cli_args.py:1203, 2171), so its loader refuses a config
# without one. critic and ref fall back to the actor's (below).
REQUIRED_BACKEND = ("actor", "teacher") + INFER_ROLES

# The value AReaL itself puts in every worker's env_vars.
AREAL_VALUE = "1"
# AReaL's SPMD launchers mark their trainer processes (never the inference
# servers) with this (areal/infra/launcher/ray.py:611; read by
# areal/utils/environ.py is_single_controller).
TRAINER_MARK = ("AREAL_SPMD_MODE", "1")

# Where users give workers env vars: SchedulingSpec.env_vars
# (areal/api/cli_args.py:986), in these places.
SCHEDULING_SPECS = tuple(f"{role}.scheduling_spec" for role in ROLES) + (
    "rollout.agent.scheduling_spec", "train_dataset.scheduling_spec",
    "valid_dataset.scheduling_spec")

_MEGATRON_FLAGS = (("megatron_fsdp", "megatron.use_custom_fsdp"),
                   ("torch_fsdp2", "megatron.use_torch_fsdp2"))

# SchedulerConfig.type (areal/api/cli_args.py): the single-controller
# scheduler. "local" and "slurm" start workers without Ray.
SCHEDULER_TYPE = "scheduler.type"
NOT_RAY_SCHEDULERS = ("local", "slurm")

PATHS: Tuple[str, ...] = (LEGACY, "actor.kl_ctl", SCHEDULER_TYPE) + tuple(
    f"{role}.backend" for role in ROLES) + tuple(
    f"{role}.{key}" for role in TRAIN_ROLES for _, key in _MEGATRON_FLAGS) + SCHEDULING_SPECS


# --- The config layout -------------------------------------------------------------

def _engine(config: Mapping[str, Any], role: str, found: Allocation, key: str) -> Engine:
    training = role in TRAIN_ROLES
    if training and found.backend not in TRAIN_BACKENDS:
        raise FieldValueError(f"{FIELD}: {key} {show(found.text)} names {found.backend!r}, "
                              f"an inference backend; {role} takes one of "
                              f"{', '.join(TRAIN_BACKENDS)}")
    if not training and found.backend not in INFER_BACKENDS:
        raise FieldValueError(f"{FIELD}: {key} {show(found.text)} names {found.backend!r}, "
                              f"a training backend; {role} takes one of "
                              f"{', '.join(INFER_BACKENDS)}")
    if found.kind != MEGATRON:
        return Engine(found.backend, found.kind)
    flags = {}
    for name, sub in _MEGATRON_FLAGS:
        # Passed to mbridge's get_model / Bridge's provide_distributed_model
        # (areal/models/mcore/registry.py:182-183, 265-266).
        present, value = lookup(config, f"{role}.{sub}")
        if present and value is not None:
            flags[name] = read_flag(value, f"{role}.{sub}")
    # No check: AReaL builds Megatron-Core models through mbridge or
    # Megatron-Bridge providers and never runs validate_args
    # (areal/engine/megatron_engine.py), so every row is a preference.
    return Engine(found.backend, found.kind, tensor_parallel=found.size("t"),
                  context_parallel=found.size("c"), expert_parallel=found.size("e"), **flags)


def _kl_ctl(config: Mapping[str, Any]) -> float:
    present, value = lookup(config, "actor.kl_ctl")
    if not present or value is None:
        return 0.1  # PPOActorConfig.kl_ctl's default (areal/api/cli_args.py:1458)
    if isinstance(value, str) and "${" in value:
        read_name(value, "actor.kl_ctl")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise fail_type("actor.kl_ctl", "a number", value)
    return float(value)


def _sections(config: Mapping[str, Any]) -> Tuple[Dict[str, Any], Dict[str, str]]:
    """Role -> its section, for the roles AReaL creates (areal/trainer/
    rl_trainer.py:170-188), and role -> why not, for sections it skips."""
    sections, omitted = {}, {}
    for role in ROLES:
        present, section = lookup(config, role)
        if not present or section is None:
            continue  # AReaL: ``config.critic is not None`` and the like
        if not isinstance(section, Mapping):
            raise fail_type(role, "a mapping (an AReaL engine section)", section)
        sections[role] = section
    if "ref" in sections and _kl_ctl(config) <= 0:
        del sections["ref"]
        omitted["ref"] = "actor.kl_ctl is 0, so AReaL creates no ref engine"
    return sections, omitted


def _backends(sections: Mapping[str, Any], legacy: Mapping[str, Tuple[Allocation, str]]
              ) -> Dict[str, Tuple[Allocation, str]]:
    """Role -> (parsed per-engine backend, the key it came from)."""
    out: Dict[str, Tuple[Allocation, str]] = {}
    for role in ("actor", "rollout", "judge_engine", "teacher", "critic", "ref"):
        if role not in sections:
            continue
        key = f"{role}.backend"
        text = sections[role].get("backend")
        if text in (None, "", "???") and role in ("critic", "ref") and role not in legacy:
            # Documented: an empty critic/ref backend is the actor's
            # (docs/en/reference/alloc_mode.md, "falls back to actor.backend").
            actor = out.get("actor", legacy.get("actor"))
            if actor is None and "actor" in sections:
                raise _missing_backend("actor")
            if actor is None:
                raise FieldValueError(f"{FIELD}: {key} is empty, so it would be actor.backend, "
                                      "which is not set either")
            out[role] = actor
            continue
        if text in (None, "", "???"):
            continue  # not declared here; allocation_mode may declare it (checked below)
        out[role] = (parse_backend(text, key), key)
    return out


def _refuse_a_missing_backend(sections: Mapping[str, Any],
                              backends: Mapping[str, Tuple[Allocation, str]]) -> None:
    """A section AReaL creates but with no backend: AReaL's loader refuses it
    (``backend`` is MISSING), so it is an error here too, never a role
    silently dropped."""
    for role in REQUIRED_BACKEND:
        if role in sections and role not in backends:
            raise _missing_backend(role)


def _missing_backend(role: str) -> FieldValueError:
    example = "'sglang:d4t1'" if role in INFER_ROLES else "'megatron:d2p1t2'"
    return FieldValueError(
        f"{FIELD}: {role}.backend is missing; AReaL requires it (a MISSING field of "
        f"its engine config): set {role}.backend, e.g. {example} (a misspelt key "
        "such as 'backnd' is not read)")


def _warn_without_ray(config: Mapping[str, Any]) -> None:
    present, scheduler = lookup(config, SCHEDULER_TYPE)
    if present and scheduler in NOT_RAY_SCHEDULERS:
        warnings.warn(
            f"{FIELD}: {SCHEDULER_TYPE} is {scheduler!r}: AReaL's {scheduler} scheduler "
            "starts its workers without Ray, so no Ray runtime env reaches them and they keep "
            f"AReaL's {CONNECTIONS_VARIABLE}=1; run with scheduler.type=ray (or the Ray launcher) "
            "for the field to apply", UserWarning, stacklevel=2)


def _refuse_a_misspelt_section(config: Mapping[str, Any]) -> None:
    """A top-level key that is nearly a role name (``rolout:``) would leave
    that role out silently; AReaL's structured config refuses the key."""
    for key in map(str, config):
        close = closest(key, ROLES, cutoff=0.75)
        if close is not None and close != key:
            raise FieldValueError(
                f"{FIELD}: the top-level key {key!r} looks like AReaL's {close!r}; "
                f"AReaL's engine sections are {', '.join(ROLES)}: rename it")


def _legacy(config: Mapping[str, Any]) -> Dict[str, Tuple[Allocation, str]]:
    """Role -> component of the deprecated allocation_mode, as AReaL's SPMD
    launchers read it: the inference component is the rollout servers; a
    training component is the actor unless named for another role."""
    text = config.get(LEGACY)
    if text in (None, ""):
        return {}
    out: Dict[str, Tuple[Allocation, str]] = {}
    for found, _ in parse_allocation_mode(text):
        role = "rollout" if found.kind == INFERENCE else (found.name or "actor")
        if role not in ROLES:
            raise FieldValueError(f"{FIELD}: {LEGACY} {show(text)} names a component "
                                  f"{found.name!r}; roles are {', '.join(TRAIN_ROLES)}")
        if role in out:
            raise FieldValueError(f"{FIELD}: {LEGACY} {show(text)} has two components for "
                                  f"{role} ({out[role][0].text!r} and {found.text!r})")
        out[role] = (found, f"{LEGACY} component {found.text!r}")
    return out


def _user_values(config: Mapping[str, Any]) -> Dict[str, str]:
    """Key -> value, where the config itself sets the variable for some workers."""
    keys: Dict[str, str] = {}
    for path in SCHEDULING_SPECS:
        present, specs = lookup(config, path)
        if not present or specs is None:
            continue
        listed = [specs] if isinstance(specs, Mapping) else specs
        if not isinstance(listed, (list, tuple)):
            raise fail_type(path, "a list of scheduling specs", specs)
        for i, spec in enumerate(listed):
            where = path if isinstance(specs, Mapping) else f"{path}[{i}]"
            if not isinstance(spec, Mapping):
                raise fail_type(where, "a scheduling spec mapping", spec)
            env_vars = spec.get("env_vars")
            if env_vars is None:
                continue
            if not isinstance(env_vars, Mapping):
                raise fail_type(f"{where}.env_vars", "a mapping", env_vars)
            if CONNECTIONS_VARIABLE in env_vars:
                key = f"{where}.env_vars.{CONNECTIONS_VARIABLE}"
                parse_connections(env_vars[CONNECTIONS_VARIABLE], key)
                keys[key] = env_vars[CONNECTIONS_VARIABLE]
    return keys


def read_areal(config: Mapping[str, Any]) -> Spec:
    """Engines of an AReaL-layout config (a plain, resolved mapping)."""
    _refuse_a_misspelt_section(config)
    _warn_without_ray(config)
    sections, omitted = _sections(config)
    legacy = _legacy(config)
    backends = _backends(sections, legacy)
    for role, (found, where) in legacy.items():
        if role != "rollout" and role != "actor" and role not in sections:
            continue  # that section is absent or not created, so neither is the engine
        engine = _engine(config, role, found, LEGACY)
        if role in backends:
            own, key = backends[role]
            if _engine(config, role, own, key) != engine:
                raise FieldValueError(
                    f"{FIELD}: {key} {show(own.text)} and {LEGACY}'s {where} disagree on "
                    f"{role}'s engine; the trainer reads {key}, the legacy launcher "
                    f"{LEGACY}: make them agree, or drop the deprecated {LEGACY}")
            continue
        backends[role] = (found, LEGACY)
    _refuse_a_missing_backend(sections, backends)
    engines = {role: _engine(config, role, found, key)
               for role, (found, key) in backends.items()}
    return Spec.of(engines, framework=FRAMEWORK, omitted=omitted,
                   processes=_process_rules(engines),
                   replaces=_replaces(_user_values(config)))


def _replaces(user_values: Mapping[str, str]) -> Optional[str]:
    """AReaL's own "1" is decided anew, unless the user also wrote "1" in some
    scheduling_spec: a worker carrying "1" could then be theirs, and is kept.
    Any other value of theirs differs from AReaL's, so it stays explicit on
    its own workers while AReaL's "1" on every other worker is still replaced."""
    return None if AREAL_VALUE in user_values.values() else AREAL_VALUE


def _process_rules(engines: Mapping[str, Engine]) -> Tuple[ProcessRule, ...]:
    """Trainer processes of AReaL's SPMD Ray launcher carry AREAL_SPMD_MODE=1;
    nothing marks the inference servers, nor any worker of the single-
    controller scheduler, so every other worker is decided for all roles."""
    trainers = tuple(role for role in TRAIN_ROLES if role in engines)
    if not trainers or "rollout" not in engines:
        return ()
    return (ProcessRule(trainers, *TRAINER_MARK),)


READER = Reader(
    name=FRAMEWORK,
    markers=("actor.backend", "rollout.backend", LEGACY),
    read=read_areal,
    roles=ROLES,
    paths=PATHS,
)
