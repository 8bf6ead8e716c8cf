"""The runtime env for ``ray job submit``, kept clear of the job driver's own.

A submitted job's driver calls ``ray.init(runtime_env=...)`` itself, and Ray
merges that env with the submitted one, refusing a key both carry. What each
framework's driver adds (verl 0.9.1 ``get_ppo_ray_runtime_env``, NeMo-RL
``init_ray``), what the submitted env therefore leaves out and sets for the
driver hook, and why: docs/how-it-works.md#ray-job-submit-the-drivers-own-env-and-setup-hook.
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

# SkyRL's prepare_runtime_environment: set to these values, for some configs,
# whatever the driver's environment holds (nccl weight sync; Megatron;
# Megatron with flash_attn; the vLLM backend).
SKYRL_SETS = {"NCCL_CUMEM_ENABLE": "0", "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
              "NVTE_FUSED_ATTN": "0", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "true",
              "VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}


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
    out["env_vars"] = env_vars
    return out, notes
