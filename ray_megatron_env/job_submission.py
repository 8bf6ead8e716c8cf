"""``ray job submit``, both ends: the env to submit, and its merge with the
job driver's own ``ray.init`` env, completed in that driver.

* ``submission_env`` (``ray-megatron-env runtime-env``): the job env from
  ``build_runtime_env``, kept clear of what the framework's driver adds in
  its own ``ray.init`` (Ray refuses a key both carry), with the driver hook
  set for the job's driver process.
* ``complete_submitted_env`` (run by the driver hook, ``hook.py``, inside
  that ``ray.init``): the merge Ray made, completed so that nothing of
  either env is lost.

What each framework's driver adds, and why each step is needed:
docs/how-it-works.md#ray-job-submit-the-drivers-own-env-and-setup-hook.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from .names import (
    CONNECTIONS_VARIABLE, DRIVER_HOOK_PATH as HOOK_PATH, DRIVER_HOOK_VARIABLE, FIELD,
    JOB_CONFIG_VARIABLE, MERGE_VARIABLE, NEXT_DRIVER_HOOK_VARIABLE as NEXT_HOOK_VARIABLE,
    OVERRIDE_VARIABLE, OWN_PREFIX, SETUP_HOOK_FIELD, TAKE_OVER_VARIABLE,
)
from .runtime_env import ConfigLike, Roles, build_runtime_env, configured_value
from .setup_hook import mark_given, take_inherited_setup_hook

# How a submitted env wants its merge with the driver's ray.init env
# (MERGE_VARIABLE): strict (Ray's default: a key both set differently is an
# error) or override (the driver's wins, as RAY_OVERRIDE_JOB_RUNTIME_ENV=1
# makes it). The submitted env sets RAY_OVERRIDE_JOB_RUNTIME_ENV=1 itself so
# that Ray merges at all; this says what the user asked for.
MERGE_STRICT, MERGE_OVERRIDE = "strict", "override"

# Frameworks whose job driver adds no value of its own in ray.init (slime's
# train.py never calls ray.init with a runtime env): the value in the job env
# is all there is to take over, so the driver needs no take-over there.
DRIVERS_WITHOUT_A_VALUE = ("slime",)

# verl's driver sets these whatever the driver's environment holds.
VERL_ALWAYS_SET = ("VERL_FULL_DETERMINISM", "VLLM_BATCH_INVARIANT", "VERL_RL_INSIGHT_ENABLE",
                   "NVTX_INJECTION64_PATH")

# SkyRL's prepare_runtime_environment: set to these values, for some configs,
# whatever the driver's environment holds (nccl weight sync; Megatron;
# Megatron with flash_attn; the vLLM backend).
SKYRL_SETS = {"NCCL_CUMEM_ENABLE": "0", "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
              "NVTE_FUSED_ATTN": "0", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "true",
              "VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}


def submission_env(config: ConfigLike, *, role: Roles = None, base: Any = None,
                   take_over: bool = False,
                   packs: Optional[Sequence[str]] = None) -> Tuple[Dict[str, Any], List[str]]:
    """The runtime env to give ``ray job submit`` for ``config``, and notes
    for the user. The env is the submitted one, not a copy of this shell's
    environment: the driver hook looks for a driver's copied values
    (``driver_env``) in the job's own driver."""
    env = build_runtime_env(config, role=role, base=base, take_over=take_over, packs=packs,
                            driver_environ={})
    framework = env["megatron_env"].get("framework")
    notes: List[str] = []
    deliberate = configured_value(config) if take_over else None
    if deliberate is not None:
        # The user's own value (ray_kwargs.ray_init.runtime_env.env_vars) is
        # applied by verl's driver in ray.init; a second copy in the job env
        # would make Ray refuse to merge the two. Nothing to take over there.
        env["env_vars"].pop(CONNECTIONS_VARIABLE, None)
        notes.append(f"the config sets {CONNECTIONS_VARIABLE}={deliberate} itself; verl's "
                     "driver applies it as an explicit value, so the job env leaves it to the "
                     "driver")
    elif take_over and framework not in DRIVERS_WITHOUT_A_VALUE:
        # The job's driver (e.g. verl's main_ppo) may add its own hard-coded
        # value in ray.init; the driver hook takes that over too.
        env.setdefault("env_vars", {})[TAKE_OVER_VARIABLE] = "1"
    env, more = job_submission_env(env, framework)
    return env, notes + more


def job_submission_env(env: Dict[str, Any], framework: str) -> Tuple[Dict[str, Any], List[str]]:
    """``env`` (from ``build_runtime_env``) made safe to submit beside the
    framework's own ``ray.init`` env, and notes for the user."""
    out = dict(env)
    # The field's copy in env_vars stays: it is how the setup hook reads
    # the field in every worker, also where Ray skips the driver hook
    # (uv run); the driver hook writes it anew from the merged field.
    env_vars = dict(out.get("env_vars") or {})
    notes: List[str] = []
    # The driver hook, in front of one the base already had.
    existing = env_vars.get(DRIVER_HOOK_VARIABLE)
    if existing and existing != HOOK_PATH:
        env_vars[NEXT_HOOK_VARIABLE] = existing
    env_vars[DRIVER_HOOK_VARIABLE] = HOOK_PATH
    asked = env_vars.get(OVERRIDE_VARIABLE) == "1"
    if framework == "verl":
        clash = sorted(set(env_vars) & set(VERL_ALWAYS_SET))
        if clash:
            notes.append(f"verl's driver sets {', '.join(clash)} in ray.init whatever its "
                         "environment holds, so Ray would refuse to merge the two envs: "
                         "set them in the config or the driver's shell instead")
        for key in clash:
            env_vars.pop(key)
    elif framework in ("skyrl", "skyrl-sft"):
        for key in sorted(set(env_vars) & set(SKYRL_SETS)):
            if str(env_vars[key]) != SKYRL_SETS[key]:
                notes.append(f"SkyRL's driver sets {key}={SKYRL_SETS[key]} in ray.init for some "
                             f"configs whatever its environment holds; with the submitted "
                             f"{key}={env_vars[key]} the merge then fails naming it "
                             f"({MERGE_VARIABLE}={MERGE_STRICT}), or SkyRL's value wins "
                             f"({MERGE_OVERRIDE}, or under uv run)")
    elif framework == "nemo-rl" and not asked:
        asked = True
        notes.append(f"NeMo-RL's driver passes its whole environment as env_vars to ray.init, "
                     f"so every submitted env_vars key collides; {MERGE_VARIABLE}="
                     f"{MERGE_OVERRIDE} lets the driver's env win the merge, as "
                     f"{OVERRIDE_VARIABLE}=1 does (it holds these variables too)")
    env_vars[OVERRIDE_VARIABLE] = "1"
    env_vars[MERGE_VARIABLE] = MERGE_OVERRIDE if asked else MERGE_STRICT
    mark_given(env_vars)  # after the values left to the driver are gone
    out["env_vars"] = env_vars
    return out, notes


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
    return name.startswith(OWN_PREFIX) or name in (DRIVER_HOOK_VARIABLE,
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
