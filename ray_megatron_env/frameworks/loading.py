"""Any config a user holds, made a plain mapping the readers can read.

A YAML path (composed the way its framework composes it), a DictConfig, a
framework's config dataclass (AReaL's ``GRPOConfig``), an argparse
namespace or an argument list: each is read at exactly the keys the readers
need (``frameworks.all_paths``), resolving interpolations there and nowhere
else, so a broken interpolation in a section no reader reads never fails a
job. OmegaConf is imported only here, and only when a config needs it.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import os
from types import ModuleType
from typing import Any, Dict, Mapping, Optional, Tuple, Union

from ..names import FIELD
from ..errors import FieldValueError
from ..spec import Spec
from ..values import fail_type
from . import all_paths, compose_yaml, load_file, read_config, read_field, to_mapping

# A mapping (dict, DictConfig), a YAML path, an argparse.Namespace, or a
# framework's command-line argument list (slime).
ConfigLike = Union[Mapping[str, Any], str, "os.PathLike[str]", Any]

_ABSENT = object()


def load_spec(config: ConfigLike) -> Tuple[Spec, Tuple[str, ...]]:
    """Parse any accepted config into a Spec, and say which roles it knows."""
    return read_field(to_plain(config))


def to_container(value: Any) -> Any:
    """A deep, plain copy (Ray cannot serialise OmegaConf containers). A
    module (``py_modules: [ray_megatron_env]``, which Ray uploads from the
    driver) is kept as it is: modules cannot be copied."""
    if _is_omegaconf(value):
        from omegaconf import OmegaConf

        return OmegaConf.to_container(value, resolve=True)
    if isinstance(value, Mapping):
        return {key: to_container(item) for key, item in value.items()}
    if type(value) in (list, tuple):
        return type(value)(to_container(item) for item in value)
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
        # A file in a framework's own text form, which YAML cannot load (a
        # reader's load_file); anything else is YAML.
        own = load_file(path) if os.path.isfile(path) else None
        config = own if own is not None else compose_yaml(path, _load_yaml(path))
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
        loaded = OmegaConf.load(path)
    except Exception as exc:
        raise FieldValueError(f"{FIELD}: cannot load config file {path!r}: "
                              f"{type(exc).__name__}: {exc}") from None
    _refuse_a_plain_string(path, loaded)
    return loaded


def _refuse_a_plain_string(path: str, loaded: Any) -> None:
    """OmegaConf loads a file that YAML reads as one string (a command line
    pasted into a file) as ``{that string: None}``; say what it is instead
    of showing the string as the config's top-level keys."""
    from omegaconf import DictConfig

    if not isinstance(loaded, DictConfig) or len(loaded) != 1:
        return
    (key,) = loaded.keys()
    if not isinstance(key, str) or loaded._get_node(key)._value() is not None:
        return
    import yaml

    try:
        with open(path, encoding="utf-8") as handle:
            plain = yaml.safe_load(handle)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return
    if isinstance(plain, str):
        first = plain.split()[0] if plain.split() else plain
        raise FieldValueError(
            f"{FIELD}: config file {path!r} holds plain text, which YAML reads as one string "
            f"(it starts {first[:60]!r}), not a mapping or a list: a framework's arguments go "
            "in a YAML or JSON list of strings, SkyRL's overrides as key=value lines")


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
        return to_container(value)


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
    for path in (*paths, *markers):
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
