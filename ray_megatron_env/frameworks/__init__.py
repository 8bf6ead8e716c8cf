"""The registry of framework readers: which one a config is for.

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
import difflib
from typing import Any, Mapping, Tuple

from ..errors import FieldValueError
from ..spec import Spec
from ..values import FIELD, fail_type
from .compact import is_compact, read_compact
from .reader import Reader


def readers() -> Tuple[Reader, ...]:
    from . import areal, nemo_rl, slime, verl

    return (verl.READER, verl.SFT_READER, areal.READER, nemo_rl.READER, slime.READER)


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
            close = difflib.get_close_matches(root, keys, n=1, cutoff=0.75)
            if close and close[0] != root:
                hints.append(f"{close[0]!r} looks like {reader.name}'s {root!r}")
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
