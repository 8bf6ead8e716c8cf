"""The driver side: turn a training config into a runtime env for Ray.

Ray never runs a plugin's ``validate`` on the driver, so a bad config would
otherwise surface only when a worker starts on some node. ``build_runtime_env``
checks it here, with the same parser the agents use, and ships only the
compact form (a few hundred bytes instead of ~28 KB with every task spec).
"""

from __future__ import annotations

import copy
import os
from typing import Any, Dict, Mapping, Optional, Tuple, Union

from .errors import FieldValueError
from .field import explicit_value, parse_field
from .spec import FIELD, Roles, Spec, fail_type
from .verl import PATHS, ROLES, looks_like_verl

ConfigLike = Union[Mapping[str, Any], str, "os.PathLike[str]"]

_ABSENT = object()


def build_runtime_env(config: ConfigLike, *, role: Roles = None,
                      base: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """A new runtime env: ``base`` (copied, never modified) plus the field.

    ``config`` is a verl-layout config (``DictConfig``, dict, or the path of
    a YAML file) or the compact form. ``role`` (a role name or several)
    narrows the decision to those engines, for per-role runtime envs.
    Raises ``TypeError``/``ValueError`` (``MegatronEnvError``) naming the bad
    key before anything is scheduled.
    """
    spec, known_roles = load_spec(config)
    env = plain_runtime_env(base)
    explicit_value(env.get("env_vars"))
    env[FIELD] = spec.narrow(role, known_roles).to_field()
    return env


def load_spec(config: ConfigLike) -> Tuple[Spec, Tuple[str, ...]]:
    """Parse any accepted config into a Spec, and say which roles it knows."""
    plain = to_plain(config)
    spec = parse_field(plain)
    return spec, (ROLES if looks_like_verl(plain) else ())


def plain_runtime_env(base: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    if base is None:
        return {}
    if _is_omegaconf(base):
        from omegaconf import OmegaConf

        base = OmegaConf.to_container(base, resolve=True)
    if not isinstance(base, Mapping):
        raise fail_type("base", "a runtime env mapping", base)
    return copy.deepcopy(dict(base))


def to_plain(config: ConfigLike) -> Mapping[str, Any]:
    """A plain mapping the shared parser can read.

    A YAML path is loaded with OmegaConf (safe YAML: no tags that run code).
    A DictConfig is read at exactly the keys the parser needs, resolving
    interpolations there and nowhere else.
    """
    if isinstance(config, (str, os.PathLike)):
        config = _load_yaml(os.fspath(config))
    if _is_omegaconf(config):
        return _pluck(config)
    return config


def _is_omegaconf(value: Any) -> bool:
    # Avoid importing omegaconf for plain dicts; a DictConfig's class lives there.
    return type(value).__module__.startswith("omegaconf")


def _load_yaml(path: str) -> Any:
    from omegaconf import OmegaConf

    if not os.path.isfile(path):
        raise FieldValueError(f"{FIELD}: config file {path!r} does not exist")
    try:
        return OmegaConf.load(path)
    except Exception as exc:
        raise FieldValueError(f"{FIELD}: cannot load config file {path!r}: "
                              f"{type(exc).__name__}: {exc}") from None


def _pluck(config: Any) -> Mapping[str, Any]:
    from omegaconf import DictConfig, OmegaConf

    if not isinstance(config, DictConfig):
        raise fail_type("the config", "a mapping", OmegaConf.to_container(config))
    if "engines" in config or "version" in config:  # the compact form, written in YAML
        return _resolve(config, "", OmegaConf)
    out: Dict[str, Any] = {}
    for path in PATHS:
        parts = path.split(".")
        for depth in range(1, len(parts) + 1):
            prefix = ".".join(parts[:depth])
            value = _resolve(config, prefix, OmegaConf)
            if value is _ABSENT:
                break
            if depth < len(parts) and isinstance(value, DictConfig):
                continue
            if hasattr(value, "_metadata"):  # a container: resolve what is under it
                value = OmegaConf.to_container(value, resolve=True)
            _put(out, parts[:depth], value)
            break
    return out


def _resolve(config: Any, path: str, omegaconf: Any) -> Any:
    try:
        if not path:
            return omegaconf.to_container(config, resolve=True)
        return omegaconf.select(config, path, default=_ABSENT, throw_on_missing=False)
    except Exception as exc:
        where = path or "the config"
        raise FieldValueError(f"{FIELD}: cannot resolve {where}: "
                              f"{type(exc).__name__}: {str(exc).splitlines()[0]}") from None


def _put(tree: Dict[str, Any], parts: list, value: Any) -> None:
    for part in parts[:-1]:
        tree = tree.setdefault(part, {})
    tree[parts[-1]] = value
