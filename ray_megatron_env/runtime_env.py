"""The driver side: turn a training config into a runtime env for Ray.

Ray never runs a plugin's ``validate`` on the driver, so a bad config would
otherwise surface only when a worker starts on some node. ``build_runtime_env``
checks it here, with the same parser the agents use, and ships only the
compact form (a few hundred bytes instead of ~28 KB with every task spec).
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from typing import Any, Dict, FrozenSet, Mapping, Optional, Sequence, Tuple

from .decision import split_driver_env
from .errors import EnvironmentVariableError, FieldValueError
from .frameworks.compact import MAX_DRIVER_VALUE
from .frameworks.loading import ConfigLike, load_spec, to_container, to_plain
from .frameworks.verl import USER_ENV_VARS
from .names import (
    ALWAYS_ON, CONNECTIONS_VARIABLE, EXPLICIT_VARIABLE, FIELD, PACK_NAMES,
)
from .packs import variables_of
from .packs.connections import explicit_value, hard_conflict_everywhere
from .setup_hook import add_setup_hook
from .spec import Roles, Spec, read_packs
from .uv_hook import driver_hook_skipped
from .values import fail_type, lookup




def build_runtime_env(config: ConfigLike, *, role: Roles = None,
                      base: Optional[Mapping[str, Any]] = None,
                      take_over: bool = False,
                      packs: Optional[Sequence[str]] = None,
                      tp_spans_nodes: Optional[Sequence[str]] = None,
                      driver_environ: Optional[Mapping[str, str]] = None) -> Dict[str, Any]:
    """A new runtime env: ``base`` (copied, never modified) plus the field.

    ``config`` is a verl-layout config (``DictConfig``, dict, or the path of
    a YAML file) or the compact form. ``role`` (a role name or several)
    narrows the decision to those engines, for per-role runtime envs.

    ``take_over=True`` says that a CUDA_DEVICE_MAX_CONNECTIONS in ``base``'s
    ``env_vars`` is a framework's hard-coded default (verl's "1"): it is
    removed so that each node decides. A value the user set in the config
    itself (verl: ``ray_kwargs.ray_init.runtime_env.env_vars``) is their
    intent and stays, as an explicit value.

    ``packs`` names the optional rule packs to decide as well (``["nccl-fabric"]``;
    docs/packs.md); ``tp_spans_nodes`` the roles whose tensor parallel group
    spans nodes, which the ``nccl-fabric`` pack reads. Both add to what a
    compact-form config says itself.

    A value of a decided variable in ``base``'s ``env_vars`` that equals the
    driver's own (``driver_environ``, default this process's ``os.environ``)
    is a framework's copy of the driver's environment (NeMo-RL's
    ``dict(os.environ)``): the field lists it under ``driver_env`` and each
    node decides it as an inherited value, except the variables named in
    the driver's ``RAY_MEGATRON_ENV_EXPLICIT`` (``*``: all). ``{}`` turns
    this off.

    Raises ``TypeError``/``ValueError`` (``MegatronEnvError``) naming the bad
    key before anything is scheduled.
    """
    plain = to_plain(config)
    spec, known_roles = load_spec(plain)
    spec = with_packs(spec, packs, tp_spans_nodes)
    env = plain_runtime_env(base)
    _refuse_exclusive_fields(env)
    if take_over:
        _take_over(env, plain)
    spec = spec.narrow(role, known_roles)
    deliberate = (CONNECTIONS_VARIABLE,) if take_over and configured_value(plain) is not None else ()
    spec = dataclasses.replace(spec, driver_env=driver_copies(
        spec, env.get("env_vars"), os.environ if driver_environ is None else driver_environ,
        keep=deliberate))
    env_vars = env.get("env_vars")
    explicit_value(split_driver_env(spec, env_vars)[0] if isinstance(env_vars, Mapping)
                   else env_vars)
    _refuse_a_conflict_on_every_gpu(spec)
    env[FIELD] = spec.to_field()
    add_setup_hook(env)
    _warn_if_driver_hook_skipped()
    return env


ALL_VARIABLES = "*"  # in EXPLICIT_VARIABLE: every pack variable


def stated_explicit(environ: Mapping[str, str]) -> FrozenSet[str]:
    """The variables ``RAY_MEGATRON_ENV_EXPLICIT`` names (comma or space
    separated; ``*`` for every pack variable), each checked."""
    known = variables_of(PACK_NAMES)
    names = environ.get(EXPLICIT_VARIABLE, "").replace(",", " ").split()
    if ALL_VARIABLES in names:
        return frozenset(known)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise EnvironmentVariableError(
            f"{EXPLICIT_VARIABLE}={environ[EXPLICIT_VARIABLE]!r} names {', '.join(unknown)}, "
            f"which no pack decides; use {ALL_VARIABLES} or names from: {', '.join(known)}")
    return frozenset(names)


def driver_copies(spec: Spec, env_vars: Any, environ: Mapping[str, str],
                  keep: Sequence[str] = ()) -> Tuple[Tuple[str, str], ...]:
    """``spec.driver_env`` with the variables of the job's packs whose
    ``env_vars`` value is exactly ``environ``'s (the driver's), less those
    ``RAY_MEGATRON_ENV_EXPLICIT`` or ``keep`` name. Only what the job
    decides is listed; every other variable stays as it is."""
    explicit = stated_explicit(environ) | frozenset(keep)
    found = dict(spec.driver_env)
    if isinstance(env_vars, Mapping):
        for name in variables_of((*ALWAYS_ON, *spec.packs)):
            mine = environ.get(name)
            if mine is not None and name in env_vars and str(env_vars[name]) == mine \
                    and "$" not in mine and len(mine) <= MAX_DRIVER_VALUE:
                found[name] = mine
    return tuple(sorted((n, v) for n, v in found.items() if n not in explicit))


# Ray refuses any field beside these two but a few of its own
# (RuntimeEnv.__init__: "The 'image_uri' field currently cannot be used
# together with other fields of runtime_env"), so neither the field nor the
# setup hook can ride with them.
EXCLUSIVE_FIELDS = ("image_uri", "container")


def _refuse_exclusive_fields(env: Mapping[str, Any]) -> None:
    for name in EXCLUSIVE_FIELDS:
        if env.get(name):
            raise FieldValueError(
                f"{FIELD}: base has {name!r}, and Ray refuses any other runtime_env field next "
                f"to {name!r} (RuntimeEnv: \"The '{name}' field currently cannot be used "
                "together with other fields\"), so neither this field nor its setup hook "
                "could reach the workers. Instead: run the image as the nodes' own image "
                "with the package installed (the plugin registered there, or the field's "
                "setup hook from a job env without image_uri), or set "
                f"{CONNECTIONS_VARIABLE} per role yourself from 'ray-megatron-env explain'")




def _warn_if_driver_hook_skipped() -> None:
    reason = driver_hook_skipped()
    if reason:
        warnings.warn(reason, stacklevel=3)


def with_packs(spec: Spec, packs: Optional[Sequence[str]],
               tp_spans_nodes: Optional[Sequence[str]] = None) -> Spec:
    """``spec`` asking also for ``packs`` (checked) and naming also the
    roles in ``tp_spans_nodes`` (each must have an engine)."""
    if packs is None and tp_spans_nodes is None:
        return spec
    asked = read_packs(packs if packs is not None else (), "packs") + spec.packs
    spans = tuple(tp_spans_nodes or ())
    if isinstance(tp_spans_nodes, str) or not all(isinstance(r, str) for r in spans):
        raise fail_type("tp_spans_nodes", "a list of role names", tp_spans_nodes)
    unknown = [r for r in spans if r not in spec.roles()]
    if unknown:
        raise FieldValueError(f"{FIELD}: tp_spans_nodes names role(s) without an engine: "
                              f"{', '.join(unknown)}; roles: {', '.join(spec.roles()) or 'none'}")
    return dataclasses.replace(spec, packs=tuple(sorted(set(asked))),
                               tp_spans_nodes=tuple(sorted(set(spans + spec.tp_spans_nodes))))


def _refuse_a_conflict_on_every_gpu(spec: Spec) -> None:
    """Required rules that cannot all hold on any GPU would fail the job on
    every node: say so now. A conflict on some GPU classes only is left to
    each node (a Blackwell-only cluster may run what a Hopper node cannot)."""
    for part in spec.partitions():
        verdict = hard_conflict_everywhere(part)
        if verdict is not None:
            raise FieldValueError(f"{FIELD}: on every GPU: {verdict.reason}")


def configured_value(config: ConfigLike) -> Optional[Any]:
    """The value the user set in a verl config's own worker env vars, if any."""
    return lookup(to_plain(config), f"{USER_ENV_VARS}.{CONNECTIONS_VARIABLE}", strict=False)[1]


def _take_over(env: Dict[str, Any], plain: Mapping[str, Any]) -> None:
    env_vars = env.get("env_vars")
    if isinstance(env_vars, dict):
        env_vars.pop(CONNECTIONS_VARIABLE, None)
    deliberate = configured_value(plain)
    if deliberate is not None:
        env.setdefault("env_vars", {})[CONNECTIONS_VARIABLE] = deliberate


def plain_runtime_env(base: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    if base is None:
        return {}
    if not isinstance(base, Mapping):
        raise fail_type("base", "a runtime env mapping", base)
    return {key: to_container(value) for key, value in base.items()}


