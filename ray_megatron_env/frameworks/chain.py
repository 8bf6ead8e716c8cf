"""One file of a YAML ``defaults:`` chain, loaded and checked.

NeMo-RL's configs name a parent file in ``defaults:`` and ROLL's examples
list ``<path>@_here_`` entries; each reader composes its own chain, and
both load every file of it the same way: no loop, a bounded length, a file
that exists and holds a mapping, each failure naming the chain so far.
"""

from __future__ import annotations

import os
from typing import Any, List, Optional

from ..errors import FieldValueError
from ..values import fail_type
from ..names import FIELD


def load_link(path: str, chain: List[str], max_files: int, entry: Optional[str] = None) -> Any:
    """The mapping in ``path`` (an OmegaConf ``DictConfig``), the next file
    after ``chain``; ``entry`` is the ``defaults:`` entry that named it."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    shown = " -> ".join(chain + [path])
    if path in chain:
        raise FieldValueError(f"{FIELD}: the defaults: chain loops: {shown}")
    if len(chain) >= max_files:
        raise FieldValueError(f"{FIELD}: the defaults: chain is over {max_files} files long: "
                              f"{shown}")
    if not os.path.isfile(path):
        named = f"defaults: entry {entry!r}" if entry is not None else "defaults:"
        raise FieldValueError(f"{FIELD}: config file {path!r} named in {named} does not "
                              f"exist (chain: {shown})")
    try:
        loaded = OmegaConf.load(path)
    except Exception as exc:
        raise FieldValueError(f"{FIELD}: cannot load config file {path!r} (chain: {shown}): "
                              f"{type(exc).__name__}: {exc}") from None
    if not isinstance(loaded, DictConfig):
        raise fail_type(f"config file {path!r} (chain: {shown})", "a mapping", "a list"
                        if isinstance(loaded, ListConfig) else loaded)
    return loaded
