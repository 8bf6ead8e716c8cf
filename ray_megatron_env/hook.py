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

A pack variable whose ``env_vars`` value is exactly this driver's own (a
framework's copy of its environment: NeMo-RL's ``dict(os.environ)``) goes
into the field's ``driver_env``, so each node decides it as inherited; a
submitted env's own ``env_vars`` are the user's (``job_submission.driver_environment``).

In a job from ``ray job submit`` with an env that ``ray-megatron-env
runtime-env`` wrote, the hook also completes the merge of the submitted env
with the driver's own ``ray.init`` env (``job_submission.complete_submitted_env``): the
driver's ``worker_process_setup_hook`` runs after this package's, instead
of replacing it or failing the merge.
"""

from __future__ import annotations

import importlib
import logging
import os
from typing import Any, Callable, Dict, Mapping, Optional

from .errors import EnvironmentVariableError
from .job_submission import (
    MERGE_STRICT, complete_submitted_env, driver_environment, submitted_job_env,
)
from .names import (
    CONNECTIONS_VARIABLE, FIELD, MERGE_VARIABLE, NESTED_VARIABLE,
    NEXT_DRIVER_HOOK_VARIABLE as NEXT_HOOK_VARIABLE, TAKE_OVER_VARIABLE, UV_HOOK_VARIABLE,
)
from .runtime_env import build_runtime_env
from .setup_hook import take_inherited_setup_hook
from .uv_hook import rays_uv_hook

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


def runtime_env_hook(runtime_env: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    if os.environ.get(UV_HOOK_VARIABLE) == "1":
        runtime_env = rays_uv_hook(runtime_env)
    job_env = submitted_job_env()
    if job_env is not None:
        runtime_env = complete_submitted_env(
            runtime_env, job_env, strict=os.environ.get(MERGE_VARIABLE) == MERGE_STRICT)
    take_over = take_over_requested()
    if runtime_env and runtime_env.get(FIELD) is not None:
        base = {key: value for key, value in runtime_env.items() if key != FIELD}
        if isinstance(base.get("env_vars"), Mapping):
            # A driver inside a worker (vLLM's Ray executor) passes that
            # worker's env, with Ray's own setup-hook variable in it.
            base["env_vars"] = dict(base["env_vars"])
            take_inherited_setup_hook(base["env_vars"])
            if not base["env_vars"]:
                del base["env_vars"]
        # A nested driver's environment is its worker's, not a driver host's.
        nested = os.environ.get(NESTED_VARIABLE) == "1"
        runtime_env = build_runtime_env(runtime_env[FIELD], base=base, take_over=take_over,
                                        driver_environ={} if nested else driver_environment(job_env))
    elif take_over and CONNECTIONS_VARIABLE in ((runtime_env or {}).get("env_vars") or {}):
        logger.warning(
            "%s=1 but the job's runtime env has no %s field: keeping the explicit %s=%s for "
            "every worker, since without the training config nothing can be decided per node",
            TAKE_OVER_VARIABLE, FIELD, CONNECTIONS_VARIABLE,
            runtime_env["env_vars"][CONNECTIONS_VARIABLE])
    then = next_hook()
    return then(runtime_env) if then is not None else runtime_env
