"""The Ray runtime-env plugin: ``runtime_env={"megatron_env": ...}``.

Ray's runtime-env agent on each node imports this module at start-up and
calls the plugin when a worker with the field starts there. Three facts
shape it (docs/design.md):

* A module that fails to import takes the agent, and the raylet with it,
  down: the node never joins. So this module imports only the standard
  library and Ray's base class; the rest of the package loads on first use,
  and a broken install then fails that worker with a clear message instead.
* Ray's base class is private (``ray._private.runtime_env.plugin``) and Ray
  refuses a plugin class that does not subclass it. Should a Ray release
  move it, the class is taken from wherever the agent loaded it, so the node
  still starts, and every ``megatron_env`` setup fails with the Ray version
  and the tested range instead of running on untested plumbing.
* An exception here is retried, cached on the node for ten minutes, and
  reported to the caller as ``RuntimeEnvSetupError``. So only bad user input
  raises; a probe problem is recorded in the decision and never raised.

Registration, on every node, in the environment of ``ray start``::

    RAY_RUNTIME_ENV_PLUGINS='[{"class": "ray_megatron_env.plugin.MegatronEnvPlugin"}]'
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, List, Optional, Tuple

BASE_PATH = "ray._private.runtime_env.plugin.RuntimeEnvPlugin"
# The Ray releases the test suite runs on (.ci/run); docs/operators.md.
TESTED_RAY = ("2.41.0", "2.60.0")


class BrokenInstallError(RuntimeError):
    """The package on this node cannot load its own modules."""


class IncompatibleRayError(RuntimeError):
    """This node's Ray does not offer the plugin interface this package uses."""


def _find_base() -> Tuple[type, Optional[str]]:
    """Ray's plugin base class, and why it is not where this package expects
    it (None when it is)."""
    try:
        from ray._private.runtime_env.plugin import RuntimeEnvPlugin
        return RuntimeEnvPlugin, None
    except Exception as exc:  # any failure here must not stop the node
        problem = f"{BASE_PATH} cannot be imported ({type(exc).__name__}: {exc})"
    # The agent importing this module has loaded its base class already.
    for name, module in list(sys.modules.items()):
        found = getattr(module, "RuntimeEnvPlugin", None) if name.startswith("ray.") else None
        if isinstance(found, type):
            return found, problem
    return object, problem


_Base, _BASE_PROBLEM = _find_base()


def _check_ray() -> None:
    if _BASE_PROBLEM is not None:
        try:
            import ray
            version = ray.__version__
        except Exception:
            version = "unknown"
        raise IncompatibleRayError(
            f"ray-megatron-env does not support this node's Ray {version}: {_BASE_PROBLEM}. "
            f"Tested Ray releases: {' to '.join(TESTED_RAY)}; install one of them, or a "
            "ray-megatron-env release that supports this Ray")


def _core() -> Any:
    _check_ray()
    try:
        from . import agent
    except Exception as exc:
        raise BrokenInstallError(
            f"ray-megatron-env on this node cannot load ({type(exc).__name__}: {exc}); "
            "reinstall the same version as the driver (the same wheel, README.md) and "
            "restart Ray on this node"
        ) from exc
    return agent


class MegatronEnvPlugin(_Base):  # type: ignore[misc, valid-type]
    name = "megatron_env"
    # Runs after plugins with a smaller number, so a value they put in the
    # worker's env_vars counts as explicit rather than being overwritten.
    priority = 90

    def __init__(self) -> None:
        # Per node, not per runtime env: the GPUs are the node's.
        self._node = None

    def _node_side(self) -> Any:
        if self._node is None:
            self._node = _core().NodeAgent()
        return self._node

    @staticmethod
    def validate(runtime_env_dict: dict) -> None:
        _core().check_runtime_env(runtime_env_dict)

    async def create(self, uri: Any, runtime_env: Any, context: Any,
                     logger: logging.Logger) -> float:
        # The probe may run nvidia-smi: do it here, off the event loop, so
        # that modify_context (which Ray calls synchronously) finds it cached.
        await self._node_side().probe_async(runtime_env)
        return 0

    def modify_context(self, uris: List[str], runtime_env: Any, context: Any,
                       logger: logging.Logger) -> None:
        self._node_side().decide_and_write(runtime_env, context.env_vars, os.environ, logger)
