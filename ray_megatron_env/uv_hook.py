"""Ray's uv hook and this package's driver hook: where one replaces the other.

From Ray 2.47, a driver with a ``uv run`` ancestor gets Ray's own uv hook
instead of ``RAY_RUNTIME_ENV_HOOK`` while ``RAY_ENABLE_UV_RUN_RUNTIME_ENV``
is on (Ray's default; ``ray/_private/worker.py``, ``_maybe_modify_runtime_env``).
The driver is warned (``driver_hook_skipped``); a driver nested in a worker
gets Ray's switch off and this package's hook runs Ray's uv hook itself
(``uv_hook_replaces_driver_hook``, ``rays_uv_hook``).
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any, Dict, Mapping, Optional

from .names import CONNECTIONS_VARIABLE, DRIVER_HOOK_PATH, DRIVER_HOOK_VARIABLE


def driver_hook_skipped(environ: Mapping[str, str] = os.environ) -> Optional[str]:
    """Why Ray will not call this driver's RAY_RUNTIME_ENV_HOOK, when this
    package's hook is the one set: from Ray 2.47, a driver run under
    ``uv run`` with RAY_ENABLE_UV_RUN_RUNTIME_ENV on (Ray's default) gets
    Ray's uv hook instead (``ray/_private/worker.py``,
    ``_maybe_modify_runtime_env``). None when the hook will run."""
    if environ.get(DRIVER_HOOK_VARIABLE, "").strip() != DRIVER_HOOK_PATH:
        return None
    try:
        from ray._private import ray_constants
        from ray._private.runtime_env.uv_runtime_env_hook import _get_uv_run_cmdline
    except Exception:  # a Ray without the uv hook: RAY_RUNTIME_ENV_HOOK always runs
        return None
    if not getattr(ray_constants, "RAY_ENABLE_UV_RUN_RUNTIME_ENV", False):
        return None
    try:
        under_uv = _get_uv_run_cmdline() is not None
    except Exception:
        return None
    if not under_uv:
        return None
    return (f"this driver runs under 'uv run' and RAY_ENABLE_UV_RUN_RUNTIME_ENV is on, so Ray "
            f"skips RAY_RUNTIME_ENV_HOOK={DRIVER_HOOK_PATH}: a hard-coded {CONNECTIONS_VARIABLE} in "
            "ray.init is not taken over and a raw megatron_env field is not checked. Pass "
            "build_runtime_env(cfg) to ray.init, or set RAY_ENABLE_UV_RUN_RUNTIME_ENV=0")


def uv_hook_replaces_driver_hook() -> bool:
    """Ray 2.47 to 2.54: a driver with a ``uv run`` ancestor (a worker of a
    job run under ``uv run`` has one) gets Ray's uv hook instead of
    ``RAY_RUNTIME_ENV_HOOK`` (``ray/_private/worker.py``,
    ``_maybe_modify_runtime_env``), and these releases still assert on the
    setup hook's variable (2.55 checks it instead:
    ``setup_hook._check_setup_hook_consistency``). There Ray's switch goes
    off for processes this worker starts, and the driver hook runs Ray's uv
    hook itself, first (``hook.runtime_env_hook``)."""
    try:
        from ray._private import ray_constants
        from ray._private.runtime_env import setup_hook

        if not getattr(ray_constants, "RAY_ENABLE_UV_RUN_RUNTIME_ENV", False) \
                or hasattr(setup_hook, "_check_setup_hook_consistency"):
            return False
        return importlib.util.find_spec("ray._private.runtime_env.uv_runtime_env_hook") is not None
    except Exception:
        return False


def rays_uv_hook(runtime_env: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """What Ray 2.47 to 2.54 run instead of RAY_RUNTIME_ENV_HOOK in a driver
    under ``uv run``, where a worker's setup hook turned Ray's switch off so
    that this hook runs too (``uv_hook_replaces_driver_hook``)."""
    from ray._private.runtime_env import uv_runtime_env_hook as uv

    return uv.hook(runtime_env) if uv._get_uv_run_cmdline() else runtime_env
