"""ray-megatron-env: the right CUDA_DEVICE_MAX_CONNECTIONS on every Ray node.

The names below load on first use: Ray's runtime-env agent imports
``ray_megatron_env.plugin`` (and so this file) on every node, and a plugin
import that pulls in more than it needs can only slow the node down or, if
something is broken, keep it from joining the cluster.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "__version__": "_version",
    "build_runtime_env": "runtime_env",
    "read_decision": "record",
    "check_cluster": "check",
    "explain": "explanation",
    "Decision": "record",
    "MegatronEnvError": "errors",
    "FieldTypeError": "errors",
    "FieldValueError": "errors",
}

# Spelled out, not sorted(_EXPORTS), so that a linter sees the names the
# TYPE_CHECKING imports below define as the package's exports; a test keeps
# the two equal.
__all__ = ["Decision", "FieldTypeError", "FieldValueError", "MegatronEnvError", "__version__",
           "build_runtime_env", "check_cluster", "explain", "read_decision"]

if TYPE_CHECKING:  # pragma: no cover
    from ._version import __version__
    from .check import check_cluster
    from .errors import FieldTypeError, FieldValueError, MegatronEnvError
    from .explanation import explain
    from .record import Decision, read_decision
    from .runtime_env import build_runtime_env


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
