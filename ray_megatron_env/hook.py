"""A ``RAY_RUNTIME_ENV_HOOK`` for drivers: validate and compact on ``ray.init``.

Set ``RAY_RUNTIME_ENV_HOOK=ray_megatron_env.hook.runtime_env_hook`` in the
driver's environment and ``ray.init(runtime_env={"megatron_env": cfg})``
works with an OmegaConf ``DictConfig`` (or a YAML path, or a raw dict): the
hook turns the field into the compact form and validates it before any node
is touched. Ray calls the hook only from ``ray.init`` (the job's runtime
env), on the merged env in a submitted job.

``RAY_MEGATRON_ENV_TAKE_OVER=1`` additionally removes a hard-coded
CUDA_DEVICE_MAX_CONNECTIONS from the job's ``env_vars`` (see
``build_runtime_env(take_over=True)``), which is how a verl driver that
hard-codes "1" hands the decision to each node without being edited.
Without a ``megatron_env`` field there is nothing to decide from, so the
hook then changes nothing and says so: removing the value blindly would
take Megatron's required 1 away.

Another hook already in use goes in ``RAY_MEGATRON_ENV_NEXT_HOOK``; it runs
after this one.
"""

from __future__ import annotations

import importlib
import logging
import os
from typing import Any, Callable, Dict, Mapping, Optional

from .errors import EnvironmentVariableError
from .engines import VARIABLE
from .values import FIELD

HOOK_PATH = "ray_megatron_env.hook.runtime_env_hook"
TAKE_OVER_VARIABLE = "RAY_MEGATRON_ENV_TAKE_OVER"
NEXT_HOOK_VARIABLE = "RAY_MEGATRON_ENV_NEXT_HOOK"

logger = logging.getLogger(__name__)


_YES = ("1", "true", "yes", "on")
_NO = ("", "0", "false", "no", "off")


def take_over_requested(environ: Mapping[str, str] = os.environ) -> bool:
    text = environ.get(TAKE_OVER_VARIABLE, "").strip().lower()
    if text not in _YES + _NO:
        raise EnvironmentVariableError(
            f"{TAKE_OVER_VARIABLE}={environ[TAKE_OVER_VARIABLE]!r}: use one of "
            f"{', '.join(v for v in _YES + _NO if v)} (or leave it unset)")
    return text in _YES


def next_hook(environ: Mapping[str, str] = os.environ) -> Optional[Callable[[Any], Any]]:
    """The hook named in RAY_MEGATRON_ENV_NEXT_HOOK ('module.function'), loaded."""
    path = environ.get(NEXT_HOOK_VARIABLE, "").strip()
    if not path:
        return None
    module, _, name = path.rpartition(".")
    if not module or not name:
        raise EnvironmentVariableError(
            f"{NEXT_HOOK_VARIABLE}={path!r} must name a function as 'package.module.function'")
    try:
        found = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise EnvironmentVariableError(
            f"{NEXT_HOOK_VARIABLE}={path!r} cannot be loaded: {type(exc).__name__}: {exc}"
        ) from None
    if not callable(found):
        raise EnvironmentVariableError(f"{NEXT_HOOK_VARIABLE}={path!r} is not a function")
    return found


def driver_hook_skipped(environ: Mapping[str, str] = os.environ) -> Optional[str]:
    """Why Ray will not call this driver's RAY_RUNTIME_ENV_HOOK, when this
    package's hook is the one set: from Ray 2.47, a driver run under
    ``uv run`` with RAY_ENABLE_UV_RUN_RUNTIME_ENV on (Ray's default) gets
    Ray's uv hook instead (``ray/_private/worker.py``,
    ``_maybe_modify_runtime_env``). None when the hook will run."""
    if environ.get("RAY_RUNTIME_ENV_HOOK", "").strip() != HOOK_PATH:
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
            f"skips RAY_RUNTIME_ENV_HOOK={HOOK_PATH}: a hard-coded {VARIABLE} in ray.init is "
            "not taken over and a raw megatron_env field is not checked. Pass "
            "build_runtime_env(cfg) to ray.init, or set RAY_ENABLE_UV_RUN_RUNTIME_ENV=0")


def runtime_env_hook(runtime_env: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    from .runtime_env import build_runtime_env

    take_over = take_over_requested()
    if runtime_env and runtime_env.get(FIELD) is not None:
        base = {key: value for key, value in runtime_env.items() if key != FIELD}
        runtime_env = build_runtime_env(runtime_env[FIELD], base=base, take_over=take_over)
    elif take_over and VARIABLE in ((runtime_env or {}).get("env_vars") or {}):
        logger.warning(
            "%s=1 but the job's runtime env has no %s field: keeping the explicit %s=%s for "
            "every worker, since without the training config nothing can be decided per node",
            TAKE_OVER_VARIABLE, FIELD, VARIABLE, runtime_env["env_vars"][VARIABLE])
    then = next_hook()
    return then(runtime_env) if then is not None else runtime_env
