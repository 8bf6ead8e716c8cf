"""Checked reading of one value from a config, with the key in every error.

Every framework reader and the compact form read sizes, flags and names
through these, so a bad value gets the same message whichever layout it
came in.
"""

from __future__ import annotations

import difflib
import re
from typing import Any, Iterable, Mapping, Optional, Sequence, Tuple

from .errors import FieldTypeError, FieldValueError
from .engines import CUDA_RANGE

from .names import FIELD  # noqa: E402  (the field's name, for the messages here)
MAX_PARALLEL_SIZE = 65536

# Names end up in the worker's environment (inside the decision's JSON) and
# in log lines, so they are restricted to characters that cannot expand,
# quote or break anything there.
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$")
_DECIMAL = re.compile(r"^[0-9]{1,3}$")
_TOKEN = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def fail_type(key: str, expected: str, value: Any) -> FieldTypeError:
    return FieldTypeError(
        f"{FIELD}: {key} must be {expected}, got {show(value)} ({type(value).__name__})"
    )


def show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _reject_interpolation(value: Any, key: str) -> None:
    if isinstance(value, str) and "${" in value:
        raise FieldValueError(
            f"{FIELD}: {key} is an unresolved interpolation {show(value)}; resolve "
            "the config on the driver (build_runtime_env does; or "
            "OmegaConf.to_container(cfg, resolve=True)): the agent never resolves"
        )


def read_name(value: Any, key: str) -> str:
    if not isinstance(value, str):
        raise fail_type(key, "a string", value)
    _reject_interpolation(value, key)
    if not _NAME.match(value):
        raise FieldValueError(
            f"{FIELD}: {key} {show(value)} is not a valid name (a letter, then up "
            "to 63 letters, digits, '_', '.' or '-')"
        )
    return value


def read_token(value: Any, key: str) -> str:
    """A value to compare with (an env var's prefix): like a name, but may
    start with a digit."""
    if not isinstance(value, str):
        raise fail_type(key, "a string", value)
    _reject_interpolation(value, key)
    if not _TOKEN.match(value):
        raise FieldValueError(f"{FIELD}: {key} {show(value)} must be 1 to 64 letters, digits, "
                              "'_', '.' or '-'")
    return value


def read_size(value: Any, key: str) -> int:
    _reject_interpolation(value, key)
    # bool is an int in Python; 'true' as a parallel size is a mistake.
    if isinstance(value, bool) or not isinstance(value, int):
        raise fail_type(key, f"an integer from 1 to {MAX_PARALLEL_SIZE}", value)
    if not 1 <= value <= MAX_PARALLEL_SIZE:
        raise FieldValueError(
            f"{FIELD}: {key} must be an integer from 1 to {MAX_PARALLEL_SIZE}, got {value}"
        )
    return value


def read_names(value: Any, key: str, known: Sequence[str], noun: str,
               known_words: str = "known") -> Tuple[str, ...]:
    """A list of names, each one of ``known`` (checks, packs), as given."""
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise fail_type(key, f"a list of {noun} names ({', '.join(known)})", value)
    unknown = [v for v in value if v not in known]
    if unknown:
        raise FieldValueError(f"{FIELD}: {key} names unknown {noun}(s) {show(unknown)}; "
                              f"{known_words}: {', '.join(known)}")
    return tuple(value)


def read_flag(value: Any, key: str) -> bool:
    _reject_interpolation(value, key)
    if not isinstance(value, bool):
        raise fail_type(key, "true or false", value)
    return value


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


def not_a_mapping(key: str, value: Any) -> FieldTypeError:
    """The error for a section that is not one (an unresolved interpolation
    raises its own message)."""
    _reject_interpolation(value, key)
    return fail_type(key, "a mapping", value)


def closest(word: str, known: Iterable[str], cutoff: float = 0.8) -> Optional[str]:
    """The known name that ``word`` most likely misspells (difflib's ratio
    at least ``cutoff``), or None; ``word`` itself when it is known."""
    close = difflib.get_close_matches(word, list(known), n=1, cutoff=cutoff)
    return close[0] if close else None


def optional(config: Any, path: str, default: Any = None) -> Any:
    """The value at ``path``, or ``default`` where the config leaves it out
    or holds null there (as the framework's own default would apply)."""
    found, value = lookup(config, path)
    return default if not found or value is None else value


def optional_flag(config: Any, path: str, default: bool = False) -> bool:
    """A true/false value at ``path`` (checked), ``default`` where absent or null."""
    value = optional(config, path)
    return default if value is None else read_flag(value, path)


def lookup(config: Any, path: str, *, strict: bool = True) -> Tuple[bool, Any]:
    """``(found, value)`` at a dotted path of a plain config. A null section on
    the way means not found; with ``strict``, anything else on the way that
    is not a mapping is an error naming the path walked so far (an
    unresolved interpolation gets its own message), and without it, not
    found (for detecting a layout)."""
    node: Any = config
    walked = []
    for part in path.split("."):
        if node is None:
            return False, None
        if not isinstance(node, Mapping):
            if not strict:
                return False, None
            raise not_a_mapping(".".join(walked), node)
        if part not in node:
            return False, None
        node = node[part]
        walked.append(part)
    return True, node
