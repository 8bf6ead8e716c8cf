"""verl-shaped configs for the tests: the package's example plus overrides.

``verl("actor_rollout_ref.actor.megatron.tensor_model_parallel_size=1")``
gives a DictConfig the way Hydra overrides give one to verl's driver.
"""

from pathlib import Path

from omegaconf import OmegaConf

from ray_megatron_env.demo import EXAMPLES, load_example
MEGATRON_YAML = EXAMPLES / "verl_megatron.yaml"
FSDP_YAML = EXAMPLES / "verl_fsdp.yaml"

ACTOR = "actor_rollout_ref.actor"
ACTOR_TP = f"{ACTOR}.megatron.tensor_model_parallel_size"
ACTOR_CP = f"{ACTOR}.megatron.context_parallel_size"


def verl(*overrides: str, base: Path = MEGATRON_YAML):
    """Hydra-style ``key=value`` overrides (a leading '+' adds a key)."""
    return load_example(base, *overrides)


def plain(*overrides: str, base: Path = MEGATRON_YAML) -> dict:
    return OmegaConf.to_container(verl(*overrides, base=base), resolve=True)


# Named scenarios used by several test modules: config -> engines in scope.
MEGATRON_TP2 = ()
MEGATRON_TP1 = (f"{ACTOR_TP}=1",)
MEGATRON_CP2 = (f"{ACTOR_TP}=1", f"{ACTOR_CP}=2")
MEGATRON_FSDP = (f"{ACTOR}.megatron.use_megatron_fsdp=true",
                 "actor_rollout_ref.ref.megatron.use_megatron_fsdp=true")
# Only the reference policy (or only the reward model) is Megatron with TP>1.
REF_ONLY = (f"{ACTOR}.strategy=fsdp", "critic.strategy=fsdp", "actor_rollout_ref.ref.strategy=megatron")
REWARD_MODEL_ONLY = (f"{ACTOR}.strategy=fsdp", "critic.strategy=fsdp",
                     "reward_model.enable=true", "reward_model.strategy=megatron",
                     "reward_model.megatron.tensor_model_parallel_size=4",
                     "reward_model.megatron.context_parallel_size=1")


def job_env(field, env_vars=None, **rest):
    """The job env build_runtime_env returns for a compact ``field``: the
    field, the field again in env_vars for the worker-side fallback, a mark
    beside each pack variable env_vars set, and Ray's setup hook
    (docs/how-it-works.md#two-paths)."""
    import json as _json

    from ray_megatron_env.names import PACK_VARIABLES

    env_vars = dict(env_vars or {})
    marks = {f"RAY_MEGATRON_ENV_GIVEN_{name}": "1" for name in env_vars if name in PACK_VARIABLES}
    return {"megatron_env": field,
            "env_vars": {**env_vars, **marks,
                         "RAY_MEGATRON_ENV_FIELD": _json.dumps(field, separators=(",", ":"),
                                                                 sort_keys=True)},
            "worker_process_setup_hook": "ray_megatron_env.setup_hook.setup_hook", **rest}
