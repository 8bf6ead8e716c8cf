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
  The driver hook then lists the pack variables that copy carries (an
  image's TORCH_CUDA_ARCH_LIST) in the field's ``driver_env``, so each node
  decides them as inherited; this env lists none itself.
* slime and AReaL: no runtime env in ``ray.init`` (AReaL
  ``areal/infra/launcher/ray.py``).

The setup hook (the worker-side fallback) goes in as the top-level
``worker_process_setup_hook`` string, which ``ray job submit`` accepts; the
field itself reaches it through the job's config, so the submitted env has
no copy of it in ``env_vars``.

A driver may pass a ``worker_process_setup_hook`` of its own to ``ray.init``
(any script; a framework may add one). Ray then refuses the merge (the same
top-level field twice), or, with ``RAY_OVERRIDE_JOB_RUNTIME_ENV=1``, keeps
the driver's and drops ours without a word. So every submitted env also
sets, for the job's driver process (a submitted env's ``env_vars`` are in
its environment):

* ``RAY_RUNTIME_ENV_HOOK=ray_megatron_env.hook.runtime_env_hook``: Ray calls
  it in ``ray.init`` on the merged env, before anything is uploaded or any
  worker starts (``ray/_private/worker.py``, ``init``: the merge with
  ``RAY_JOB_CONFIG_JSON_ENV_VAR``'s env, then the hook; Ray 2.41 to 2.60),
  and it puts ours first again, the driver's hook after it
  (``hook.complete_submitted_env``);
* ``RAY_OVERRIDE_JOB_RUNTIME_ENV=1``, so that Ray merges at all, and
  ``RAY_MEGATRON_ENV_MERGE``: ``strict`` unless the base asked for Ray's
  override itself (or the driver is NeMo-RL's): the hook then refuses what
  Ray's own merge would have refused (a key both set to different values),
  naming it.
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

from .hook import (
    DRIVER_HOOK_VARIABLE, MERGE_OVERRIDE, MERGE_STRICT, MERGE_VARIABLE, NEXT_HOOK_VARIABLE,
    OVERRIDE_VARIABLE,
)
from .runtime_env import HOOK_PATH
from .worker import FIELD_VARIABLE

# verl's driver sets these whatever the driver's environment holds.
VERL_ALWAYS_SET = ("VERL_FULL_DETERMINISM", "VLLM_BATCH_INVARIANT", "VERL_RL_INSIGHT_ENABLE",
                   "NVTX_INJECTION64_PATH")


def job_submission_env(env: Dict[str, Any], framework: str) -> Tuple[Dict[str, Any], List[str]]:
    """``env`` (from ``build_runtime_env``) made safe to submit beside the
    framework's own ``ray.init`` env, and notes for the user."""
    out = dict(env)
    env_vars = dict(out.get("env_vars") or {})
    env_vars.pop(FIELD_VARIABLE, None)
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
    elif framework == "nemo-rl" and not asked:
        asked = True
        notes.append(f"NeMo-RL's driver passes its whole environment as env_vars to ray.init, "
                     f"so every submitted env_vars key collides; {MERGE_VARIABLE}="
                     f"{MERGE_OVERRIDE} lets the driver's env win the merge, as "
                     f"{OVERRIDE_VARIABLE}=1 does (it holds these variables too)")
    env_vars[OVERRIDE_VARIABLE] = "1"
    env_vars[MERGE_VARIABLE] = MERGE_OVERRIDE if asked else MERGE_STRICT
    out["env_vars"] = env_vars
    return out, notes
