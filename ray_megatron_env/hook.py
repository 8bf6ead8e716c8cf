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
submitted env's own ``env_vars`` are the user's (``driver_environment``).

In a job from ``ray job submit`` with an env that ``ray-megatron-env
runtime-env`` wrote, the hook also completes the merge of the submitted env
with the driver's own ``ray.init`` env (``complete_submitted_env``): the
driver's ``worker_process_setup_hook`` runs after this package's, instead
of replacing it or failing the merge.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
from typing import Any, Callable, Dict, Mapping, Optional

from .errors import EnvironmentVariableError
from .runtime_env import build_runtime_env
from .engines import CONNECTIONS_VARIABLE
from .values import FIELD

TAKE_OVER_VARIABLE = "RAY_MEGATRON_ENV_TAKE_OVER"
NEXT_HOOK_VARIABLE = "RAY_MEGATRON_ENV_NEXT_HOOK"
# Ray's driver hook (ray_constants.RAY_RUNTIME_ENV_HOOK), its switch that lets
# ray.init's env win a conflict with a submitted job's, and the variable in
# which the job supervisor hands a submitted job's env to its driver
# (ray._private.runtime_env.constants): the same names from 2.41 to 2.60.
DRIVER_HOOK_VARIABLE = "RAY_RUNTIME_ENV_HOOK"
OVERRIDE_VARIABLE = "RAY_OVERRIDE_JOB_RUNTIME_ENV"
JOB_CONFIG_VARIABLE = "RAY_JOB_CONFIG_JSON_ENV_VAR"
# How a submitted env wants its merge with the driver's ray.init env: strict
# (Ray's default: a key both set differently is an error) or override (the
# driver's wins, as RAY_OVERRIDE_JOB_RUNTIME_ENV=1 makes it). The submitted
# env sets RAY_OVERRIDE_JOB_RUNTIME_ENV=1 itself so that Ray merges at all;
# this says what the user asked for.
MERGE_VARIABLE = "RAY_MEGATRON_ENV_MERGE"
MERGE_STRICT, MERGE_OVERRIDE = "strict", "override"
SETUP_HOOK_FIELD = "worker_process_setup_hook"
# What Ray writes into Ray's own setup-hook variable for a callable hook
# (setup_hook.RUNTIME_ENV_FUNC_IDENTIFIER): a key into one job's exports.
_EXPORTED_FUNCTION = "ray_runtime_env_func::"

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


def submitted_job_env(environ: Mapping[str, str] = os.environ) -> Optional[Dict[str, Any]]:
    """The runtime env ``ray job submit`` gave this driver (its job
    supervisor's, in RAY_JOB_CONFIG_JSON_ENV_VAR, which ``ray.init`` merges
    with its own), when it carries the field; else None."""
    text = environ.get(JOB_CONFIG_VARIABLE)
    if not text:
        return None
    try:
        env = (json.loads(text) or {}).get("runtime_env") or {}
    except (ValueError, AttributeError):
        return None
    return env if isinstance(env, dict) and env.get(FIELD) is not None else None


def _ours(name: str) -> bool:
    """An env_vars key the submitted env sets for this package."""
    return name.startswith("RAY_MEGATRON_ENV_") or name in (DRIVER_HOOK_VARIABLE,
                                                            OVERRIDE_VARIABLE)


def _same(a: Any, b: Any) -> bool:
    def text(value: Any) -> str:
        return json.dumps(value, sort_keys=True, default=repr)
    return text(a) == text(b)


def complete_submitted_env(runtime_env: Optional[Dict[str, Any]], job_env: Mapping[str, Any],
                           strict: bool) -> Dict[str, Any]:
    """The env Ray merged (the submitted ``job_env`` with this driver's
    ``ray.init`` env, the driver's winning every conflict, since the
    submitted env sets RAY_OVERRIDE_JOB_RUNTIME_ENV=1), completed so that
    nothing of either is lost:

    * ``strict``: a key both set to different values (outside this
      package's own) is refused, as Ray's own merge refuses it;
    * this package's ``env_vars`` and ``py_modules`` entries come back
      where the driver's replaced them;
    * the driver's own ``worker_process_setup_hook`` runs after this
      package's (``build_runtime_env`` chains it next), never instead.

    Raises ValueError where both cannot be kept, naming the conflict and
    the line that resolves it. Ray calls the hook in ``ray.init`` before it
    uploads anything, so the job fails before any worker starts."""
    env = dict(runtime_env or {})
    env_vars = dict(env.get("env_vars") or {})
    job_vars = job_env.get("env_vars") or {}
    if strict:
        clashes = [key for key, value in job_env.items()
                   if key not in ("env_vars", "py_modules", SETUP_HOOK_FIELD)
                   and key in env and not _same(env[key], value)]
        clashes += [f"env_vars.{key}" for key, value in job_vars.items()
                    if not _ours(key) and key in env_vars and env_vars[key] != value]
        if clashes:
            raise ValueError(
                f"ray_megatron_env: this driver's ray.init runtime env sets {', '.join(clashes)} "
                "to a value other than the submitted job env's, and Ray refuses to merge two "
                "envs that both set a key (\"Failed to merge the Job's runtime env\"); this job "
                f"env does the same ({MERGE_VARIABLE}={MERGE_STRICT}). To let the driver's "
                f"values win, as {OVERRIDE_VARIABLE}=1 does, set {MERGE_VARIABLE}: "
                f"{MERGE_OVERRIDE} in the job env's env_vars (or give ray-megatron-env "
                f"runtime-env a base whose env_vars have {OVERRIDE_VARIABLE}: \"1\"); or "
                "remove the key from one of the two")
    for key, value in job_vars.items():
        if _ours(key):
            env_vars[key] = value
    modules = list(env.get("py_modules") or [])
    missing = [m for m in job_env.get("py_modules") or () if m not in modules]
    if missing:
        env["py_modules"] = modules + missing
    take_inherited_setup_hook(env_vars)
    if env_vars:
        env["env_vars"] = env_vars
    else:
        env.pop("env_vars", None)
    return env


def driver_environment(job_env: Optional[Mapping[str, Any]],
                       environ: Mapping[str, str] = os.environ) -> Dict[str, str]:
    """This driver's own environment, as a framework copies it into env_vars,
    less what a submitted job env put there (its ``env_vars`` are in the
    driver's environment, and they are the user's explicit values)."""
    given = (job_env or {}).get("env_vars") or {}
    return {k: v for k, v in environ.items() if _ours(k) or given.get(k) != v}


def take_inherited_setup_hook(env_vars: Dict[str, str]) -> None:
    """Ray's own carrier of a setup hook, ``__RAY_WORKER_PROCESS_SETUP_HOOK_ENV_VAR``,
    taken out of ``env_vars`` (in place) of an env that carries the field.

    It is there when the driver runs inside a worker of a job whose env had
    a setup hook: vLLM's Ray executor passes the worker's own runtime env
    (``ray.get_runtime_context().runtime_env``, which holds the variable
    Ray wrote, beside the field and the setup hook), and a driver that
    passes its environment as ``env_vars`` (NeMo-RL) copies it. Beside a
    ``worker_process_setup_hook`` field Ray refuses it (2.41 to 2.54: an
    assertion in ``export_setup_func_module``, "reserved for the internal
    use"; from 2.55: "Conflicting worker_process_setup_hook" unless it is
    the same string). This package's own hook is dropped, since
    ``build_runtime_env`` sets the field to it again and Ray writes the
    variable anew; another hook module becomes a chained hook. A function
    another job exported cannot be called from this job's hook: refused."""
    from .worker import NEXT_SETUP_HOOK_VARIABLE, RAY_SETUP_HOOK_VARIABLE, SETUP_HOOK_PATH

    inherited = env_vars.pop(RAY_SETUP_HOOK_VARIABLE, None)
    if not inherited or inherited == SETUP_HOOK_PATH:
        return
    if inherited.startswith(_EXPORTED_FUNCTION):
        raise ValueError(
            f"ray_megatron_env: this driver's ray.init env_vars carry {RAY_SETUP_HOOK_VARIABLE}"
            f"={inherited[:60]}..., a function another job exported as its setup hook, which "
            "no setup hook of this job can call; remove that variable from the env_vars "
            "the driver passes to ray.init (it is Ray's own, reserved)")
    from .worker import next_setup_hooks

    hooks = next_setup_hooks(env_vars)
    if inherited not in hooks:
        env_vars[NEXT_SETUP_HOOK_VARIABLE] = ",".join([inherited, *hooks])


def rays_uv_hook(runtime_env: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """What Ray 2.47 to 2.54 run instead of RAY_RUNTIME_ENV_HOOK in a driver
    under ``uv run``, where a worker's setup hook turned Ray's switch off so
    that this hook runs too (``worker.uv_hook_replaces_driver_hook``)."""
    from ray._private.runtime_env import uv_runtime_env_hook as uv

    return uv.hook(runtime_env) if uv._get_uv_run_cmdline() else runtime_env


def runtime_env_hook(runtime_env: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:

    from .worker import NESTED_VARIABLE, UV_HOOK_VARIABLE

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
        runtime_env = build_runtime_env(runtime_env[FIELD], base=base, take_over=take_over,
                                        driver_environ=({} if os.environ.get(NESTED_VARIABLE) == "1"
                                                        else driver_environment(job_env)))
    elif take_over and CONNECTIONS_VARIABLE in ((runtime_env or {}).get("env_vars") or {}):
        logger.warning(
            "%s=1 but the job's runtime env has no %s field: keeping the explicit %s=%s for "
            "every worker, since without the training config nothing can be decided per node",
            TAKE_OVER_VARIABLE, FIELD, CONNECTIONS_VARIABLE,
            runtime_env["env_vars"][CONNECTIONS_VARIABLE])
    then = next_hook()
    return then(runtime_env) if then is not None else runtime_env
