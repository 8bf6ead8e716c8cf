"""The runtime env for ``ray job submit``, kept clear of the job driver's own.

A submitted job's driver calls ``ray.init(runtime_env=...)`` itself, and Ray
merges that env with the submitted one, refusing the merge when both carry
the same top-level field or the same ``env_vars`` key
(``ray/runtime_env/runtime_env.py``, ``_merge_runtime_env``; verl hit it in
its PR #7313). So the submitted env must hold nothing the framework's driver
adds. What each framework's driver adds, read from its source:

* verl 0.9.1 (``verl/trainer/constants_ppo.py``, ``get_ppo_ray_runtime_env``):
  its default ``env_vars`` minus every key already in the driver's
  environment (where a submitted env's ``env_vars`` are), except
  ``VERL_FULL_DETERMINISM``, ``VLLM_BATCH_INVARIANT``,
  ``VERL_RL_INSIGHT_ENABLE`` and ``NVTX_INJECTION64_PATH``, which it always
  sets; and ``working_dir: None`` when the submitted env has no working_dir.
* NeMo-RL (``nemo_rl/distributed/virtual_cluster.py``, ``init_ray``): its
  driver's whole environment as ``env_vars``, so every ``env_vars`` key of a
  submitted env collides. Ray's ``RAY_OVERRIDE_JOB_RUNTIME_ENV=1`` lets the
  driver's env win the merge instead, and loses nothing there: the driver's
  environment already holds every submitted variable.
* slime and AReaL: no runtime env in ``ray.init`` (AReaL
  ``areal/infra/launcher/ray.py``).

The setup hook (the worker-side fallback) goes in as the top-level
``worker_process_setup_hook`` string, which ``ray job submit`` accepts; the
field itself reaches it through the job's config, so the submitted env has
no copy of it in ``env_vars``.
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

from .worker import FIELD_VARIABLE

# verl's driver sets these whatever the driver's environment holds.
VERL_ALWAYS_SET = ("VERL_FULL_DETERMINISM", "VLLM_BATCH_INVARIANT", "VERL_RL_INSIGHT_ENABLE",
                   "NVTX_INJECTION64_PATH")
OVERRIDE_VARIABLE = "RAY_OVERRIDE_JOB_RUNTIME_ENV"


def job_submission_env(env: Dict[str, Any], framework: str) -> Tuple[Dict[str, Any], List[str]]:
    """``env`` (from ``build_runtime_env``) made safe to submit beside the
    framework's own ``ray.init`` env, and notes for the user."""
    out = dict(env)
    env_vars = dict(out.get("env_vars") or {})
    env_vars.pop(FIELD_VARIABLE, None)
    notes: List[str] = []
    if framework == "verl":
        clash = sorted(set(env_vars) & set(VERL_ALWAYS_SET))
        if clash:
            notes.append(f"verl's driver sets {', '.join(clash)} in ray.init whatever its "
                         "environment holds, so Ray would refuse to merge the two envs: "
                         "set them in the config or the driver's shell instead")
        for key in clash:
            env_vars.pop(key)
    elif framework == "nemo-rl" and env_vars:
        env_vars[OVERRIDE_VARIABLE] = "1"
        notes.append(f"NeMo-RL's driver passes its whole environment as env_vars to ray.init, "
                     f"so every submitted env_vars key collides; {OVERRIDE_VARIABLE}=1 is added "
                     "so that Ray lets the driver's env win the merge (it holds these "
                     "variables too)")
    if env_vars:
        out["env_vars"] = env_vars
    else:
        out.pop("env_vars", None)
    return out, notes
