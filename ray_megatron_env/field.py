"""The ``megatron_env`` field as Ray carries it: one parser for driver and agent.

``parse_field`` is the single entry point for a raw field value. The driver
helper, the ``RAY_RUNTIME_ENV_HOOK`` hook and the plugin in every node's
agent all call it, so a value accepted on the driver is accepted on the
node, and a bad one gets the same message in both places.
"""

from __future__ import annotations

import json
import re
from typing import Any, Mapping, Optional

from .errors import FieldTypeError, FieldValueError
from .rules import CUDA_RANGE, VARIABLE
from .spec import FIELD, Spec, fail_type, read_canonical
from .verl import ROOTS, looks_like_verl, read_verl

# A full verl config is about 28 KB of JSON. Ray's raylet refuses to send the
# agent a runtime env over 1 MiB (HTTP 413, measured on Ray 2.60), so the cap
# sits well below that: the user gets this package's message, not the 413.
MAX_FIELD_BYTES = 512 * 1024
# verl's configs nest about 8 levels deep.
MAX_DEPTH = 32

_DECIMAL = re.compile(r"^[0-9]{1,3}$")


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
    """Parse a raw ``megatron_env`` value (verl layout or compact form)."""
    if not isinstance(value, Mapping):
        raise fail_type("the field", "a mapping (a verl-layout config or the compact form)",
                        value)
    _check_depth(value)
    size = field_size(value)
    if size > MAX_FIELD_BYTES:
        raise FieldValueError(
            f"{FIELD}: the value is {size} bytes of JSON; the limit is {MAX_FIELD_BYTES}. A "
            "training config is about 30 KB, and the compact form that build_runtime_env "
            "ships is a few hundred bytes"
        )
    if "engines" in value or "version" in value:
        return read_canonical(value)
    if looks_like_verl(value):
        return read_verl(value)
    keys = ", ".join(sorted(map(str, value))[:8]) or "none"
    raise FieldValueError(
        f"{FIELD}: the value is neither the compact form (with 'engines') nor a verl-"
        f"layout config (with one of {', '.join(ROOTS)}); its top-level keys: {keys}"
    )


def parse_connections(value: Any, key: str) -> int:
    """A CUDA_DEVICE_MAX_CONNECTIONS value set by the user: '1'..'32'."""
    if not isinstance(value, str):
        raise fail_type(key, "a string of an integer from 1 to 32", value)
    if not _DECIMAL.match(value) or int(value) not in CUDA_RANGE:
        raise FieldValueError(
            f"{FIELD}: {key} is {value!r}; CUDA accepts an integer from "
            f"{CUDA_RANGE.start} to {CUDA_RANGE.stop - 1}"
        )
    return int(value)


def explicit_value(env_vars: Optional[Mapping[str, Any]]) -> Optional[str]:
    """The runtime env's own value for the variable, checked, or None."""
    if not env_vars or VARIABLE not in env_vars:
        return None
    parse_connections(env_vars[VARIABLE], f"env_vars.{VARIABLE}")
    return env_vars[VARIABLE]
