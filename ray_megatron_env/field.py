"""The ``megatron_env`` field as Ray carries it: one parser for driver and agent.

``parse_field`` is the single entry point for a raw field value. The driver
helper, the ``RAY_RUNTIME_ENV_HOOK`` hook and the plugin in every node's
agent all call it, so a value accepted on the driver is accepted on the
node, and a bad one gets the same message in both places. Which layout the
value is in (the compact form, verl, NeMo-RL, slime, AReaL) is the
registry's call (``frameworks``).
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Tuple

from .errors import FieldTypeError, FieldValueError
from .frameworks import read_config
from .spec import Spec
from .values import FIELD, fail_type

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
    return read_config(value)
