"""The ``megatron_env`` field, read: one parser for driver, agent and worker.

``parse_field`` is the single entry point for a raw field value. The driver
helper, the ``RAY_RUNTIME_ENV_HOOK`` hook, the plugin in every node's agent
and the setup hook in a worker all call it, so a value accepted on the
driver is accepted on the node, and a bad one gets the same message in both
places. It checks the value's size and depth, then asks the registry below
which layout it is in.

Each reader turns one framework's own config layout into a ``Spec``. A
config is read by the compact form when it has ``engines`` or ``version``;
otherwise by the one reader whose marker keys it has. None, or more than
one, is an error that names each reader's markers and the keys that
decided, so a misspelt key is pointed out rather than guessed around.

A reader module (``verl``, ``nemo_rl``, ...) takes ``Reader`` from
``.reader``, below it, never from here: this registry imports the readers.
"""

from __future__ import annotations

import argparse
import json
from typing import Any, Mapping, Optional, Tuple

from ..names import ALWAYS_ON, FIELD
from ..errors import FieldTypeError, FieldValueError
from ..spec import Spec
from ..values import closest, fail_type
from .compact import is_compact, read_compact
from .reader import Reader

# A full verl config is about 28 KB of JSON. Ray's raylet refuses to send the
# agent a runtime env over 1 MiB (HTTP 413, measured on Ray 2.60), so the cap
# sits well below that: the user gets this package's message, not the 413.
MAX_FIELD_BYTES = 512 * 1024
# verl's configs nest about 8 levels deep.
MAX_DEPTH = 32


def _check_depth(value: Any) -> None:
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise FieldValueError(f"{FIELD}: the value is nested more than {MAX_DEPTH} levels "
                                  "deep; a training config is not")
        children = node.values() if isinstance(node, Mapping) else (
            node if isinstance(node, (list, tuple)) else ())
        stack.extend((child, depth + 1) for child in children
                     if isinstance(child, (Mapping, list, tuple)))


def field_size(value: Any) -> int:
    """Bytes of the value as compact JSON, or a clear error if it is not JSON."""
    try:
        return len(json.dumps(value, separators=(",", ":"), allow_nan=False))
    except RecursionError:
        raise FieldValueError(f"{FIELD}: the value is nested too deeply to be a config") from None
    except TypeError as exc:
        raise FieldTypeError(f"{FIELD}: the value is not JSON-serialisable ({exc}); pass a "
                             "plain dict, or use build_runtime_env for a DictConfig") from None
    except ValueError as exc:
        raise FieldValueError(f"{FIELD}: the value is not valid JSON ({exc})") from None


def parse_field(value: Any) -> Spec:
    """Parse a raw ``megatron_env`` value (a framework's config or the compact form)."""
    return read_field(value)[0]


def read_field(value: Any) -> Tuple[Spec, Tuple[str, ...]]:
    """``parse_field``, and the role names the value's layout knows."""
    if not isinstance(value, Mapping):
        raise fail_type("the field", "a mapping (a framework's config or the compact form)",
                        value)
    _check_depth(value)
    size = field_size(value)
    if size > MAX_FIELD_BYTES:
        raise FieldValueError(
            f"{FIELD}: the value is {size} bytes of JSON; the limit is {MAX_FIELD_BYTES}. A "
            "training config is about 30 KB, and the compact form that build_runtime_env "
            "ships is a few hundred bytes"
        )
    spec, roles = read_config(value)
    _check_driver_env(spec)
    return spec, roles


def _check_driver_env(spec: Spec) -> None:
    """Each ``driver_env`` variable must be one the job's packs decide, each
    ``framework_env`` one some pack decides (a reader declares its
    framework's values whatever packs the job asks for); checked here, above
    the packs: the compact reader sits below them."""
    if spec.framework_env:
        from ..packs import variables_of
        from ..names import PACK_NAMES

        known = variables_of(PACK_NAMES)
        for name, _ in spec.framework_env:
            if name not in known:
                raise FieldValueError(f"{FIELD}: framework_env names {name!r}, which no pack "
                                      f"decides; the packs' variables: {', '.join(known)}")
    if not spec.driver_env:
        return
    from ..packs import variables_of

    owned = variables_of((*ALWAYS_ON, *spec.packs))
    for name, _ in spec.driver_env:
        if name not in owned:
            raise FieldValueError(f"{FIELD}: driver_env names {name!r}, which no pack of this "
                                  f"job decides; its packs' variables: {', '.join(owned)}")


def readers() -> Tuple[Reader, ...]:
    from . import areal, nemo_rl, roll, skyrl, slime, verl

    return (verl.READER, verl.SFT_READER, areal.READER, nemo_rl.READER, skyrl.READER,
            skyrl.SFT_READER, slime.READER, roll.READER)


def reader_for(config: Mapping[str, Any]) -> Reader:
    """The one reader whose layout ``config`` has, or an error saying why not."""
    candidates = [(reader, reader.evidence(config)) for reader in readers()]
    matched = [(reader, found) for reader, found in candidates if found]
    if len(matched) == 1:
        return matched[0][0]
    if matched:
        named = "; ".join(f"{reader.name} (it has {', '.join(found)})" for reader, found in matched)
        raise FieldValueError(
            f"{FIELD}: the config looks like more than one framework's layout: {named}. "
            "Remove the keys of the framework it is not for, or pass the compact form"
        )
    keys = sorted(map(str, config))
    hints = []
    for reader, _ in candidates:
        for marker in reader.markers:
            root = marker.split(".")[0]
            close = closest(root, keys, cutoff=0.75)
            if close is not None and close != root:
                hints.append(f"{close!r} looks like {reader.name}'s {root!r}")
    looked_for = "; ".join(f"{reader.name}: one of {', '.join(reader.markers)}"
                           for reader, _ in candidates)
    known = [advice for reader, _ in candidates for keys_of, advice in reader.unsupported
             if all(key in config for key in keys_of)]
    raise FieldValueError(
        f"{FIELD}: the value is neither the compact form (with 'engines') nor a known "
        f"framework's config. Looked for {looked_for}. Its top-level keys: "
        f"{', '.join(keys[:8]) or 'none'}{'...' if len(keys) > 8 else ''}"
        + (f". Misspelt? {'; '.join(dict.fromkeys(hints))}" if hints else "")
        + (f". {' '.join(known)}" if known else "")
    )


def read_config(config: Mapping[str, Any]) -> Tuple[Spec, Tuple[str, ...]]:
    """The spec of any accepted layout, and the role names that layout knows."""
    if not isinstance(config, Mapping):
        raise fail_type("the field", "a mapping (a framework's config or the compact form)",
                        config)
    if is_compact(config):
        return read_compact(config), ()
    reader = reader_for(config)
    return reader.read(config), reader.roles


def to_mapping(config: Any) -> Any:
    """A config given as an ``argparse.Namespace`` or an argument list, as the
    mapping its reader reads; anything else is returned as it is."""
    if isinstance(config, argparse.Namespace):
        # A parsed namespace holds far more than any reader reads, some of it
        # not JSON (slime's carries torch dtypes): keep the keys readers read.
        markers, paths = all_paths()
        wanted = {path.split(".")[0] for path in (*markers, *paths)}
        return {key: value for key, value in vars(config).items() if key in wanted}
    if isinstance(config, (list, tuple)) and all(isinstance(arg, str) for arg in config):
        for reader in readers():
            if reader.convert is not None:
                mapping = reader.convert(config)
                if mapping is not None:
                    return mapping
        raise FieldValueError(
            f"{FIELD}: a list is read only as a framework's command-line arguments ("
            + ", ".join(r.name for r in readers() if r.convert is not None)
            + "), and this one is not")
    return config


def load_file(path: str) -> Optional[Mapping[str, Any]]:
    """A file in some framework's own text form (SkyRL's override lines), read
    by that reader's ``load_file``; None when no reader claims it (YAML)."""
    for reader in readers():
        if reader.load_file is not None:
            loaded = reader.load_file(path)
            if loaded is not None:
                return loaded
    return None


def compose_yaml(path: str, loaded: Any) -> Any:
    """A YAML file as its framework composes it (NeMo-RL follows defaults:)."""
    for reader in readers():
        if reader.compose is not None:
            composed = reader.compose(path, loaded)
            if composed is not None:
                return composed
    return loaded


def all_paths() -> Tuple[Tuple[str, ...], Tuple[str, ...]]:
    """(markers, paths): what any reader detects by, and what it reads; what a
    DictConfig must resolve (markers only need to be present)."""
    markers: list = []
    paths: list = []
    for reader in readers():
        markers += reader.markers
        paths += reader.paths
    return tuple(dict.fromkeys(markers)), tuple(dict.fromkeys(paths))
