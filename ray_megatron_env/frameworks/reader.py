"""What a framework reader is: one layout, how to recognise it, how to read it.

Every reader module (``verl``, ``nemo_rl``, ``slime``, ``areal``, ...) does
``from .reader import Reader`` and defines its ``READER``; the registry
(``frameworks/__init__``) sits above them and lists them. A reader never
imports the registry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Tuple

from ..values import lookup

if TYPE_CHECKING:  # pragma: no cover
    from ..spec import Spec


@dataclass(frozen=True)
class Reader:
    """One framework's layout: how to recognise it and how to read it."""

    name: str
    markers: Tuple[str, ...]  # dotted paths; any one present says "this layout"
    read: Callable[[Mapping[str, Any]], Spec]
    roles: Tuple[str, ...]  # every role name the layout can have
    paths: Tuple[str, ...]  # every dotted path it reads (what a DictConfig must resolve)
    # A config given as something other than a mapping (slime's argument
    # list) -> a mapping, or None when it is not this framework's.
    convert: Optional[Callable[[Any], Optional[Mapping[str, Any]]]] = None
    # A YAML file whose layout composes several files (NeMo-RL's defaults:
    # chain): (path, the file as loaded) -> the composed config, or None.
    compose: Optional[Callable[[str, Any], Optional[Any]]] = None
    # A file in the framework's own text form, which YAML cannot load
    # (SkyRL's key=value override lines): path -> the mapping, or None.
    load_file: Optional[Callable[[str], Optional[Mapping[str, Any]]]] = None
    # Layouts of this framework that no reader reads: (top-level keys that
    # all say "this layout", what to do instead), for the unknown-layout error.
    unsupported: Tuple[Tuple[Tuple[str, ...], str], ...] = ()

    def evidence(self, config: Mapping[str, Any]) -> Tuple[str, ...]:
        return tuple(marker for marker in self.markers if has_path(config, marker))


def has_path(config: Mapping[str, Any], path: str) -> bool:
    return lookup(config, path, strict=False)[0]
