"""The Ray runtime-env plugin: ``runtime_env={"megatron_env": ...}``.

Ray's runtime-env agent on each node imports this module at start-up and
calls the plugin when a worker with the field starts there. Two facts
shape it (see DESIGN.md):

* A module that fails to import takes the agent, and the raylet with it,
  down: the node never joins. So this module imports only the standard
  library and Ray's base class; the rest of the package loads on first use,
  and a broken install then fails that worker with a clear message instead.
* An exception here is retried, cached on the node for ten minutes, and
  reported to the caller as ``RuntimeEnvSetupError``. So only bad user input
  raises; a probe problem is recorded in the decision and never raised.

Registration, on every node, in the environment of ``ray start``::

    RAY_RUNTIME_ENV_PLUGINS='[{"class": "ray_megatron_env.plugin.MegatronEnvPlugin"}]'
"""

from __future__ import annotations

import logging
import os
from typing import Any, List

from ray._private.runtime_env.plugin import RuntimeEnvPlugin

CLASS_PATH = "ray_megatron_env.plugin.MegatronEnvPlugin"


class BrokenInstallError(RuntimeError):
    """The package on this node cannot load its own modules."""


def _core() -> Any:
    try:
        from . import agent
    except Exception as exc:
        raise BrokenInstallError(
            f"ray-megatron-env on this node cannot load ({type(exc).__name__}: {exc}); "
            "reinstall the same version as the driver (pip install ray-megatron-env) and "
            "restart Ray on this node"
        ) from exc
    return agent


class MegatronEnvPlugin(RuntimeEnvPlugin):
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
        await self._node_side().probe_async()
        return 0

    def modify_context(self, uris: List[str], runtime_env: Any, context: Any,
                       logger: logging.Logger) -> None:
        self._node_side().apply(runtime_env, context.env_vars, os.environ, logger)
