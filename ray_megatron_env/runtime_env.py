"""The driver side: turn a training config into a runtime env for Ray.

Ray never runs a plugin's ``validate`` on the driver, so a bad config would
otherwise surface only when a worker starts on some node. ``build_runtime_env``
checks it here, with the same parser the agents use, and ships only the
compact form (a few hundred bytes instead of ~28 KB with every task spec).
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import json
import os
import warnings
from types import ModuleType
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple, Union

from .errors import FieldValueError
from .field import explicit_value, read_field
from .frameworks import all_paths, compose_yaml, read_config, to_mapping
from .packs import read_packs
from .policy import hard_conflict_everywhere
from .rules import VARIABLE
from .spec import Roles, Spec
from .values import FIELD, fail_type

# Where a verl user sets their own worker env vars (merged by verl's driver
# over its defaults): a value for the variable there is deliberate.
USER_ENV_VARS = "ray_kwargs.ray_init.runtime_env.env_vars"

# A mapping (dict, DictConfig), a YAML path, an argparse.Namespace, or a
# framework's command-line argument list (slime).
ConfigLike = Union[Mapping[str, Any], str, "os.PathLike[str]", Any]

_ABSENT = object()


def build_runtime_env(config: ConfigLike, *, role: Roles = None,
                      base: Optional[Mapping[str, Any]] = None,
                      take_over: bool = False,
                      packs: Optional[Sequence[str]] = None,
                      tp_spans_nodes: Optional[Sequence[str]] = None) -> Dict[str, Any]:
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

    Raises ``TypeError``/``ValueError`` (``MegatronEnvError``) naming the bad
    key before anything is scheduled.
    """
    plain = to_plain(config)
    spec, known_roles = _spec_of(plain)
    spec = with_packs(spec, packs, tp_spans_nodes)
    env = plain_runtime_env(base)
    _refuse_exclusive_fields(env)
    if take_over:
        _take_over(env, plain)
    explicit_value(env.get("env_vars"))
    spec = spec.narrow(role, known_roles)
    _refuse_a_conflict_on_every_gpu(spec)
    env[FIELD] = spec.to_field()
    _add_setup_hook(env)
    _warn_if_driver_hook_skipped()
    return env


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
                f"{VARIABLE} per role yourself from 'ray-megatron-env explain'")


def _add_setup_hook(env: Dict[str, Any]) -> None:
    """The worker-side fallback (worker.py): the field in env_vars for the
    hook to read, and Ray's setup hook chained in front of one the base
    already had. Ray runs the hook only from the job's env (ray.init); in an
    actor's or task's env it ignores it, and the job env's hook, which
    reaches those workers through env_vars, reads their own field."""
    from .worker import (FIELD_VARIABLE, NEXT_SETUP_HOOK_VARIABLE, SETUP_HOOK_PATH, chained,
                         next_setup_hooks)

    env_vars = env.get("env_vars")
    if env_vars is None:
        env_vars = env["env_vars"] = {}
    elif not isinstance(env_vars, dict):
        raise fail_type("base.env_vars", "a mapping of names to strings", env_vars)
    env_vars[FIELD_VARIABLE] = json.dumps(env[FIELD], separators=(",", ":"), sort_keys=True)
    theirs = env.get(SETUP_HOOK_FIELD)
    if theirs is None or theirs == SETUP_HOOK_PATH:
        env[SETUP_HOOK_FIELD] = SETUP_HOOK_PATH
    elif isinstance(theirs, str):
        # After any hook already chained (a submitted env's own, when a
        # job's driver brings another: hook.complete_submitted_env).
        hooks = next_setup_hooks(env_vars)
        env_vars[NEXT_SETUP_HOOK_VARIABLE] = ",".join(
            hooks if theirs in hooks else [*hooks, theirs])
        env[SETUP_HOOK_FIELD] = SETUP_HOOK_PATH
    elif callable(theirs):
        env[SETUP_HOOK_FIELD] = chained(theirs)
    else:
        raise fail_type(f"base.{SETUP_HOOK_FIELD}", "a 'module.function' string or a function",
                        theirs)


SETUP_HOOK_FIELD = "worker_process_setup_hook"


def _warn_if_driver_hook_skipped() -> None:
    from .hook import driver_hook_skipped

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


def load_spec(config: ConfigLike) -> Tuple[Spec, Tuple[str, ...]]:
    """Parse any accepted config into a Spec, and say which roles it knows."""
    return _spec_of(to_plain(config))


def _spec_of(plain: Mapping[str, Any]) -> Tuple[Spec, Tuple[str, ...]]:
    return read_field(plain)


def configured_value(config: ConfigLike) -> Optional[Any]:
    """The value the user set in a verl config's own worker env vars, if any."""
    node: Any = to_plain(config)
    for part in (*USER_ENV_VARS.split("."), VARIABLE):
        node = node.get(part) if isinstance(node, Mapping) else None
    return node


def _take_over(env: Dict[str, Any], plain: Mapping[str, Any]) -> None:
    env_vars = env.get("env_vars")
    if isinstance(env_vars, dict):
        env_vars.pop(VARIABLE, None)
    deliberate = configured_value(plain)
    if deliberate is not None:
        env.setdefault("env_vars", {})[VARIABLE] = deliberate


def plain_runtime_env(base: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    if base is None:
        return {}
    if not isinstance(base, Mapping):
        raise fail_type("base", "a runtime env mapping", base)
    return {key: _to_container(value) for key, value in base.items()}


def _to_container(value: Any) -> Any:
    """A deep, plain copy (Ray cannot serialise OmegaConf containers). A
    module (``py_modules: [ray_megatron_env]``, which Ray uploads from the
    driver) is kept as it is: modules cannot be copied."""
    if _is_omegaconf(value):
        from omegaconf import OmegaConf

        return OmegaConf.to_container(value, resolve=True)
    if isinstance(value, Mapping):
        return {key: _to_container(item) for key, item in value.items()}
    if type(value) in (list, tuple):
        return type(value)(_to_container(item) for item in value)
    if isinstance(value, ModuleType):
        return value
    return copy.deepcopy(value)


def to_plain(config: ConfigLike) -> Mapping[str, Any]:
    """A plain mapping the shared parser can read.

    A YAML path is loaded with OmegaConf (safe YAML: no tags that run code).
    A DictConfig, or a framework's own config dataclass (AReaL's
    ``GRPOConfig`` from ``load_expr_config``), is read at exactly the keys
    the parser needs, resolving interpolations there and nowhere else; its
    other top-level keys are kept as bare names (see ``_pluck``).
    """
    if isinstance(config, (str, os.PathLike)):
        path = os.fspath(config)
        config = compose_yaml(path, _load_yaml(path))
    if _is_omegaconf(config):
        return _pluck_omegaconf(config)
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return _pluck(_DataclassTree(config))
    return to_mapping(config)


def _is_omegaconf(value: Any) -> bool:
    # Avoid importing omegaconf for plain dicts; a DictConfig's class lives there.
    return type(value).__module__.startswith("omegaconf")


def load_yaml(path: "str | os.PathLike[str]") -> Any:
    """A YAML file (safe YAML) as plain, resolved data, or a FieldValueError."""
    from omegaconf import OmegaConf

    return _resolve(_load_yaml(os.fspath(path)), "", OmegaConf)


def _load_yaml(path: str) -> Any:
    from omegaconf import OmegaConf

    if not os.path.isfile(path):
        raise FieldValueError(f"{FIELD}: config file {path!r} does not exist")
    try:
        return OmegaConf.load(path)
    except Exception as exc:
        raise FieldValueError(f"{FIELD}: cannot load config file {path!r}: "
                              f"{type(exc).__name__}: {exc}") from None


def _pluck_omegaconf(config: Any) -> Mapping[str, Any]:
    from omegaconf import DictConfig, OmegaConf

    if not isinstance(config, DictConfig):
        raise fail_type("the config", "a mapping", OmegaConf.to_container(config))
    if "engines" in config or "version" in config:  # the compact form, written in YAML
        return _resolve(config, "", OmegaConf)
    return _pluck(_OmegaConfTree(config))


class _OmegaConfTree:
    """A DictConfig seen through the three questions ``_pluck`` asks."""

    def __init__(self, config: Any) -> None:
        from omegaconf import OmegaConf

        self.config, self.omegaconf = config, OmegaConf

    def top_keys(self) -> Dict[str, bool]:
        from omegaconf import DictConfig

        # _get_node reads the node without resolving it: a broken
        # interpolation in a section no reader reads must not fail the job.
        # A structured config's ``critic: None`` is a DictConfig node that is
        # None: not a section.
        out = {}
        for key in self.config.keys():
            node = self.config._get_node(key)
            out[str(key)] = (isinstance(node, DictConfig) and not node._is_none()
                             and not node._is_missing())
        return out

    def select(self, path: str) -> Any:
        return _resolve(self.config, path, self.omegaconf)

    def is_section(self, value: Any) -> bool:
        from omegaconf import DictConfig

        return isinstance(value, DictConfig)

    def is_container(self, value: Any) -> bool:
        return hasattr(value, "_metadata")

    def plain(self, value: Any) -> Any:
        return _to_container(value)


class _DataclassTree:
    """A config dataclass instance (AReaL's experiment configs) seen the same
    way: attributes for keys, and only what a reader reads made plain, so
    nothing that cannot become JSON (a dtype, a tokenizer) is touched."""

    def __init__(self, config: Any) -> None:
        self.config = config

    def top_keys(self) -> Dict[str, bool]:
        return {f.name: self._is_mapping(getattr(self.config, f.name, None))
                for f in dataclasses.fields(self.config)}

    def select(self, path: str) -> Any:
        node: Any = self.config
        for part in path.split("."):
            if self._is_mapping(node) and not isinstance(node, Mapping):
                if part not in {f.name for f in dataclasses.fields(node)}:
                    return _ABSENT
                node = getattr(node, part)
            elif isinstance(node, Mapping):
                if part not in node:
                    return _ABSENT
                node = node[part]
            else:
                return _ABSENT
        return node

    @staticmethod
    def _is_mapping(value: Any) -> bool:
        return isinstance(value, Mapping) or (dataclasses.is_dataclass(value)
                                              and not isinstance(value, type))

    def is_section(self, value: Any) -> bool:
        return self._is_mapping(value)

    def is_container(self, value: Any) -> bool:
        return self._is_mapping(value) or isinstance(value, (list, tuple))

    def plain(self, value: Any) -> Any:
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return {f.name: self.plain(getattr(value, f.name))
                    for f in dataclasses.fields(value)}
        if isinstance(value, Mapping):
            return {str(key): self.plain(item) for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.plain(item) for item in value]
        if isinstance(value, enum.Enum):
            return value.value
        return copy.deepcopy(value)


def _pluck(tree: Any) -> Dict[str, Any]:
    """The parts of a config that readers read, as a plain mapping.

    Every top-level key is kept, a section as an empty mapping and anything
    else as None, so that a section's presence reads the same as in a plain
    dict (an AReaL ``critic:`` with no ``backend`` is still a critic), and
    an unrecognised config is described by its real keys; then each path a
    reader reads is filled in, resolved.
    """
    out: Dict[str, Any] = {key: ({} if section else None)
                           for key, section in tree.top_keys().items()}
    markers, paths = all_paths()
    unresolved: Optional[FieldValueError] = None
    for path in (*paths, f"{USER_ENV_VARS}.{VARIABLE}", *markers):
        parts = path.split(".")
        for depth in range(1, len(parts) + 1):
            prefix = ".".join(parts[:depth])
            try:
                value = tree.select(prefix)
            except FieldValueError as exc:
                unresolved = unresolved or exc
                break
            if value is _ABSENT:
                break
            if depth < len(parts) and tree.is_section(value):
                continue
            if path in markers and path not in paths and depth == len(parts):
                # Detection needs only that it is there: resolving a whole
                # section would fail on any broken interpolation inside it.
                _put(out, parts, {} if tree.is_container(value) else value, replace=False)
                break
            if tree.is_container(value):  # resolve what is under it
                value = tree.plain(value)
            _put(out, parts[:depth], value)
            break
    if unresolved is not None:
        _raise_the_cause(out, unresolved)
    return out


def _raise_the_cause(plucked: Mapping[str, Any], unresolved: FieldValueError) -> None:
    """A path that cannot be resolved is often a symptom: ``ref.backend:
    ${actor.backend}`` with ``actor.backend`` misspelt. When the rest of the
    config already fails the reader, that error names the cause; say both."""
    try:
        read_config(plucked)
    except FieldValueError as cause:
        raise FieldValueError(f"{cause}; and {str(unresolved).split(': ', 1)[-1]}") from None
    raise unresolved


def _resolve(config: Any, path: str, omegaconf: Any) -> Any:
    try:
        if not path:
            return omegaconf.to_container(config, resolve=True)
        return omegaconf.select(config, path, default=_ABSENT, throw_on_missing=False)
    except Exception as exc:
        where = path or "the config"
        raise FieldValueError(f"{FIELD}: cannot resolve {where}: "
                              f"{type(exc).__name__}: {str(exc).splitlines()[0]}") from None


def _put(tree: Dict[str, Any], parts: list, value: Any, replace: bool = True) -> None:
    for part in parts[:-1]:
        if not isinstance(tree.get(part), dict):  # a bare top-level name, or nothing yet
            tree[part] = {}
        tree = tree[part]
    if replace or parts[-1] not in tree:
        tree[parts[-1]] = value
