"""Reading verl's config layouts into a ``Spec``: PPO-style trainers and SFT on Ray.

The reader mirrors verl's own choice of workers (read from verl 0.9.1,
``verl/trainer/ppo/utils.py`` and ``verl/trainer/ppo/v1/trainer_base.py``):
a critic only when ``critic.enable`` says so or, when it is null, the
advantage estimator is GAE; a reference policy only with a KL loss or KL in
the reward, and not with LoRA (the actor is the reference then); a reward
model only when ``reward.reward_model.enable`` is true; teachers only with
``distillation.enabled``. A listed role verl never starts is reported in
``Spec.omitted`` with the reason, never decided for.

It also tells the agent how to recognise verl's processes from what verl
itself puts in their runtime env (``verl/single_controller/ray/base.py``
``_create_worker`` sets ``WG_PREFIX``; ``verl/workers/rollout/replica.py``
names standalone and colocated rollout, reward and teacher worker groups;
the vLLM/SGLang server actors carry ``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES``),
so one job-level env gives each process kind its own value.

Only the keys listed here are read; everything else in the config (about
28 KB of JSON) is ignored, so keys that merely look alike elsewhere
(``trainer.v1.sampler.max_off_policy_strategy``) never count.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Tuple

from ..errors import FieldValueError
from ..engines import DISPATCHER_KEYS, ENGINE_KINDS, INFERENCE, MEGATRON, MOE_OVERLAP_KEY
from ..spec import Engine, ProcessRule, Spec, resolve_kind
from ..megatron_core import read_dispatcher
from ..values import (
    fail_type, lookup, not_a_mapping, optional_flag, read_flag, read_name, read_size,
)
from ..names import CONNECTIONS_VARIABLE, FIELD
from .reader import Reader

VERSIONS = "verl 0.9.1 (and verl-project/verl 1dda039b)"
ROLES = ("actor", "ref", "rollout", "critic", "reward_model", "teacher")
DECLARATIONS = "megatron_env"  # optional top-level section: {engine_kinds: {name: kind}}

ACTOR = "actor_rollout_ref.actor"
REF = "actor_rollout_ref.ref"
ROLLOUT = "actor_rollout_ref.rollout"
CRITIC = "critic"
REWARD = "reward.reward_model"  # verl 0.9: served by inference engines
LEGACY_REWARD = "reward_model"  # older verl: a training engine with a strategy
DISTILLATION = "distillation"
SFT_ENGINE = "engine"  # verl.trainer.sft_trainer(_ray): the one engine of an SFT run

GAE = "gae"  # the one advantage estimator that needs a critic (AdvantageEstimator.GAE)
MLITE = "mlite"  # Megatron-Lite (Megatron-LM experimental/lite, verl_mlite)

# Where a Megatron engine's settings live, relative to its section: verl's
# megatron engines keep them under ``megatron`` in PPO and directly under
# ``engine`` in SFT; Megatron-Lite under ``engine`` with short names.
# (setting, key, reader, required)
_MEGATRON_KEYS = (
    ("tensor_parallel", "tensor_model_parallel_size", read_size, True),
    ("context_parallel", "context_parallel_size", read_size, True),
    ("expert_parallel", "expert_model_parallel_size", read_size, False),
    ("megatron_fsdp", "use_megatron_fsdp", read_flag, False),
    ("moe_overlap", f"override_transformer_config.{MOE_OVERLAP_KEY}", read_flag, False),
)
_MLITE_KEYS = (
    ("tensor_parallel", "tp", read_size, True),
    ("context_parallel", "cp", read_size, True),
    ("expert_parallel", "ep", read_size, False),
)
# Megatron-Lite's optimizer: "fsdp2" shards with torch FSDP2 (fully_shard);
# the default, "dist_opt", is Megatron-Core's distributed optimizer
# (Megatron-LM experimental/lite/megatron/lite/model/*/lite/protocol.py).
_MLITE_OPTIMIZER = "impl_cfg.optimizer"

# OmegaConf's marker for a mandatory value nobody set (verl ships
# ``rollout.name: ???``): the engine is not declared yet.
_UNSET = (None, "???")

# WG_PREFIX values verl gives its rollout worker groups (replica.py), most
# specific first: the reward and teacher prefixes also start with "rollout_".
_WORKER_GROUPS = (
    ("reward_model", "rollout_reward_"),
    ("teacher", "rollout_teacher_"),
    ("rollout", "rollout_standalone_"),
    ("rollout", "rollout_colocate_"),
)
# Every vLLM / SGLang / TRT-LLM server actor verl starts has this in its
# env_vars (verl/plugin/platform/platform_cuda.py ray_noset_envvars), and
# verl's own worker groups do not.
_SERVER_VARIABLE = "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"


# The MoE token dispatcher, as verl hands it to Megatron-Core: verl has no key
# of its own, so users pass TransformerConfig fields through
# ``override_transformer_config`` (verl merges it into the model's config).
_DISPATCHER_KEYS = tuple(f"override_transformer_config.{key}" for key in DISPATCHER_KEYS)


def _megatron_paths(section: str) -> Tuple[str, ...]:
    return tuple(f"{section}.megatron.{key}" for _, key, _, _ in _MEGATRON_KEYS) + tuple(
        f"{section}.megatron.{key}" for key in _DISPATCHER_KEYS)


def _mlite_paths(section: str) -> Tuple[str, ...]:
    return tuple(f"{section}.engine.{key}" for _, key, _, _ in _MLITE_KEYS) + (
        f"{section}.engine.{_MLITE_OPTIMIZER}",)


# Where a verl user sets their own worker env vars (merged by verl's driver
# over its defaults): a value for the variable there is deliberate
# (runtime_env.configured_value, build_runtime_env(take_over=True)).
USER_ENV_VARS = "ray_kwargs.ray_init.runtime_env.env_vars"

# Every path this module reads, so the driver can resolve exactly these in a
# DictConfig and nothing else (an unrelated broken interpolation elsewhere in
# the config must not fail the job).
PATHS: Tuple[str, ...] = (
    DECLARATIONS, f"{USER_ENV_VARS}.{CONNECTIONS_VARIABLE}", f"{ROLLOUT}.name", "actor_rollout_ref.hybrid_engine",
    f"{ACTOR}.use_kl_loss", "algorithm.use_kl_in_reward", "algorithm.adv_estimator",
    "actor_rollout_ref.model.lora_rank", "actor_rollout_ref.model.lora.rank",
    "actor_rollout_ref.model.lora_adapter_path",
    f"{CRITIC}.enable", f"{REWARD}.enable", f"{REWARD}.rollout.name",
    f"{LEGACY_REWARD}.enable", f"{LEGACY_REWARD}.rollout.name",
    f"{DISTILLATION}.enabled", f"{DISTILLATION}.teacher_models",
    *(path for section in (ACTOR, REF, CRITIC, LEGACY_REWARD)
      for path in (f"{section}.strategy", *_megatron_paths(section), *_mlite_paths(section))),
)
SFT_PATHS: Tuple[str, ...] = (
    DECLARATIONS, f"{SFT_ENGINE}.strategy", f"{SFT_ENGINE}._target_",
    *(f"{SFT_ENGINE}.{key}" for _, key, _, _ in _MEGATRON_KEYS),
    *(f"{SFT_ENGINE}.{key}" for key in _DISPATCHER_KEYS),
    *(f"{SFT_ENGINE}.{key}" for _, key, _, _ in _MLITE_KEYS),
    f"{SFT_ENGINE}.{_MLITE_OPTIMIZER}",
)


def read_verl(config: Mapping[str, Any]) -> Spec:
    """Engines of a verl PPO-style config (a plain, resolved mapping)."""
    kinds = _read_declarations(config.get(DECLARATIONS))
    engines: Dict[str, Engine] = {}
    omitted: Dict[str, str] = {}

    def consider(role: str, engine: Optional[Engine]) -> None:
        if engine is not None:
            engines[role] = engine

    def trained(role: str, path: str, why_not: Optional[str]) -> None:
        # A role verl never starts is named, not read: its section may be
        # half-configured (a strategy inherited from the actor, no sizes).
        if why_not is None:
            consider(role, _section_engine(config, path, kinds))
        elif _mapping(config, path).get("strategy") not in _UNSET:
            omitted[role] = why_not

    consider("actor", _section_engine(config, ACTOR, kinds))
    consider("rollout", _named_engine(config, f"{ROLLOUT}.name", kinds))
    trained("ref", REF, _why_no_ref(config))
    trained("critic", CRITIC, _why_no_critic(config))
    consider("reward_model", _reward_model(config, kinds))
    consider("teacher", _teacher(config, kinds))
    hybrid = optional_flag(config, "actor_rollout_ref.hybrid_engine", True)
    processes, others = _processes(engines, hybrid)
    return Spec.of(engines, framework="verl", omitted=omitted, processes=processes,
                   others=others)


def read_verl_sft(config: Mapping[str, Any]) -> Spec:
    """The engine of a verl SFT config (``verl.trainer.sft_trainer_ray``): one
    worker group of TrainingWorkers, role ``trainer``."""
    kinds = _read_declarations(config.get(DECLARATIONS))
    section = _mapping(config, SFT_ENGINE)
    strategy = section.get("strategy")
    name_path = f"{SFT_ENGINE}.strategy"
    if strategy in _UNSET:
        # verl's engine/megatron.yaml has no strategy line: McoreEngineConfig
        # carries "megatron" only as its dataclass default.
        target = section.get("_target_")
        if (isinstance(target, str) and target.endswith("McoreEngineConfig")) or (
                "tensor_model_parallel_size" in section):
            strategy = "megatron"
        else:
            raise FieldValueError(
                f"{FIELD}: {name_path} is not set and {SFT_ENGINE}._target_ is not verl's "
                "McoreEngineConfig, so the SFT engine is unknown; set engine.strategy")
    strategy = read_name(strategy, name_path)
    kind = resolve_kind(strategy, None, name_path, kinds)
    at = f"{SFT_ENGINE}."
    return Spec.of({"trainer": _engine(config, SFT_ENGINE, at, at, strategy, kind)},
                   framework="verl")


def _mapping(config: Mapping[str, Any], path: str) -> Mapping[str, Any]:
    found, section = lookup(config, path)
    if not found or section is None:
        return {}
    if not isinstance(section, Mapping):
        raise not_a_mapping(path, section)
    return section


def _why_no_critic(config: Mapping[str, Any]) -> Optional[str]:
    found, enable = lookup(config, f"{CRITIC}.enable")
    if found and enable is not None:
        return None if read_flag(enable, f"{CRITIC}.enable") else "not created: critic.enable is false"
    found, estimator = lookup(config, "algorithm.adv_estimator")
    estimator = estimator if found and estimator is not None else GAE
    estimator = read_name(estimator, "algorithm.adv_estimator")
    if estimator == GAE:
        return None
    return f"not created: algorithm.adv_estimator is {estimator}, which needs no critic"


def _why_no_ref(config: Mapping[str, Any]) -> Optional[str]:
    kl_loss = optional_flag(config, f"{ACTOR}.use_kl_loss", False)
    kl_reward = optional_flag(config, "algorithm.use_kl_in_reward", False)
    if not (kl_loss or kl_reward):
        return "not created: neither actor.use_kl_loss nor algorithm.use_kl_in_reward is set"
    for path in ("actor_rollout_ref.model.lora.rank", "actor_rollout_ref.model.lora_rank"):
        found, rank = lookup(config, path)
        if found and rank not in (None, 0):
            if read_size(rank, path) > 0:
                return "not created: with LoRA the actor, adapter disabled, is the reference"
    found, adapter = lookup(config, "actor_rollout_ref.model.lora_adapter_path")
    if found and adapter is not None:
        return "not created: with a LoRA adapter the actor, adapter disabled, is the reference"
    return None


def _reward_model(config: Mapping[str, Any], kinds: Mapping[str, str]) -> Optional[Engine]:
    """verl 0.9 serves a reward model with inference engines (reward.reward_model,
    engine named by its rollout.name); older verl trained one under a top-level
    reward_model section with a strategy. The newer section wins."""
    if optional_flag(config, f"{REWARD}.enable", False):
        return _named_engine(config, f"{REWARD}.rollout.name", kinds)
    if optional_flag(config, f"{LEGACY_REWARD}.enable", False):
        engine = _section_engine(config, LEGACY_REWARD, kinds)
        return engine or _named_engine(config, f"{LEGACY_REWARD}.rollout.name", kinds)
    return None


def _teacher(config: Mapping[str, Any], kinds: Mapping[str, str]) -> Optional[Engine]:
    """Distillation teachers are inference servers (teacher_models.<name>.inference.name)."""
    if not optional_flag(config, f"{DISTILLATION}.enabled", False):
        return None
    teachers = _mapping(config, f"{DISTILLATION}.teacher_models")
    found = [_named_engine(config, f"{DISTILLATION}.teacher_models.{name}.inference.name", kinds)
             for name in teachers]
    found = [engine for engine in found if engine is not None]
    if not found:
        raise FieldValueError(
            f"{FIELD}: {DISTILLATION}.enabled is true but no teacher under "
            f"{DISTILLATION}.teacher_models names its engine (inference.name)")
    if len({engine.kind for engine in found}) > 1:
        raise FieldValueError(f"{FIELD}: {DISTILLATION}.teacher_models mixes engine kinds "
                              f"({', '.join(e.describe() for e in found)}); verl serves "
                              "teachers with inference engines")
    return found[0]


def _processes(engines: Mapping[str, Engine], hybrid: bool
               ) -> Tuple[Tuple[ProcessRule, ...], Optional[Tuple[str, ...]]]:
    """How the agent recognises each of verl's process kinds. Trainer worker
    groups (and an older verl's reward-model worker group) get a random
    WG_PREFIX, so they are "the others": every role not served by an
    inference engine. With the hybrid engine the rollout runs inside the
    trainer's processes and takes their value."""
    rules = [ProcessRule((role,), "WG_PREFIX", prefix)
             for role, prefix in _WORKER_GROUPS if role in engines]
    servers = tuple(role for role in ("rollout", "reward_model", "teacher")
                    if role in engines and engines[role].kind == INFERENCE)
    if servers:
        rules.append(ProcessRule(servers, _SERVER_VARIABLE, "1"))
    if not rules:
        return (), None
    others = tuple(role for role in ROLES
                   if role in engines and engines[role].kind != INFERENCE)
    if hybrid and "rollout" in engines and not others:
        others = ("rollout",)
    return tuple(rules), others


def _read_declarations(section: Any) -> Dict[str, str]:
    if section is None:
        return {}
    if not isinstance(section, Mapping):
        raise fail_type(DECLARATIONS, "a mapping with engine_kinds", section)
    unknown = sorted(str(k) for k in section if k != "engine_kinds")
    if unknown:
        raise FieldValueError(
            f"{FIELD}: unknown key(s) {', '.join(map(repr, unknown))} in "
            f"{DECLARATIONS}; allowed: engine_kinds"
        )
    declared = section.get("engine_kinds") or {}
    if not isinstance(declared, Mapping):
        raise fail_type(f"{DECLARATIONS}.engine_kinds", "a mapping of engine name -> kind",
                        declared)
    kinds = {}
    for name, kind in declared.items():
        key = f"{DECLARATIONS}.engine_kinds.{name}"
        kind = read_name(kind, key)
        if kind not in ENGINE_KINDS:
            raise FieldValueError(f"{FIELD}: {key} must be one of {', '.join(ENGINE_KINDS)}, "
                                  f"got {kind!r}")
        kinds[read_name(name, f"{DECLARATIONS}.engine_kinds (an engine name)")] = kind
    return kinds


def _named_engine(config: Mapping[str, Any], name_path: str,
                  kinds: Mapping[str, str]) -> Optional[Engine]:
    """An engine named by one key (a rollout's ``name``): never Megatron-sized."""
    found, name = lookup(config, name_path)
    if not found or name in _UNSET:
        return None
    name = read_name(name, name_path)
    kind = resolve_kind(name, None, name_path, kinds)
    if kind == MEGATRON:
        raise FieldValueError(f"{FIELD}: {name_path} is {name!r}, a training engine; verl "
                              "serves this role with an inference engine (vllm, sglang, ...)")
    return Engine(name, kind)


def _section_engine(config: Mapping[str, Any], path: str,
                    kinds: Mapping[str, str]) -> Optional[Engine]:
    section = _mapping(config, path)
    strategy = section.get("strategy")
    if strategy in _UNSET:
        return None
    name_path = f"{path}.strategy"
    strategy = read_name(strategy, name_path)
    kind = resolve_kind(strategy, None, name_path, kinds)
    return _engine(config, path, f"{path}.megatron.", f"{path}.engine.", strategy, kind)


def _engine(config: Mapping[str, Any], path: str, megatron_at: str, mlite_at: str,
            strategy: str, kind: str) -> Engine:
    """One engine; a Megatron one with its parallel sizes, which must be there.
    ``megatron_at`` and ``mlite_at`` are where verl keeps a Megatron or a
    Megatron-Lite engine's settings for this section."""
    if kind != MEGATRON:
        return Engine(strategy, kind)
    mlite = strategy == MLITE
    keys = _MLITE_KEYS if mlite else _MEGATRON_KEYS
    prefix = mlite_at if mlite else megatron_at
    settings: Dict[str, Any] = {}
    for name, key, reader, required in keys:
        found, value = lookup(config, prefix + key)
        # null means "not set" for a flag; a null size is a mistake, so it errs.
        if found and not (value is None and reader is read_flag):
            settings[name] = reader(value, prefix + key)
        elif required:
            looked = ", ".join(prefix + k for _, k, _, needed in keys if needed)
            raise FieldValueError(
                f"{FIELD}: {strategy} engine at {path} has no {prefix + key}; looked for "
                f"{looked} (verl's own configs always carry them: pass the composed config)")
    if mlite:
        found, optimizer = lookup(config, prefix + _MLITE_OPTIMIZER)
        if found and optimizer is not None:
            settings["torch_fsdp2"] = read_name(optimizer, prefix + _MLITE_OPTIMIZER) == "fsdp2"
    else:
        settings["dispatcher"] = _dispatcher(config, prefix)
    return Engine(strategy, kind, **settings)


def _dispatcher(config: Mapping[str, Any], prefix: str) -> Optional[str]:
    """DeepEP or HybridEP, when verl's Megatron engine runs the flex dispatcher."""
    keys = tuple(prefix + key for key in _DISPATCHER_KEYS)
    return read_dispatcher(*(lookup(config, key)[1] for key in keys), keys)


READER = Reader(
    name="verl",
    markers=("actor_rollout_ref", "critic.strategy", "reward_model.strategy",
             "reward.reward_model"),
    read=read_verl,
    roles=ROLES,
    paths=PATHS,
)

SFT_READER = Reader(
    name="verl-sft",
    markers=(f"{SFT_ENGINE}.strategy", f"{SFT_ENGINE}._target_",
             f"{SFT_ENGINE}.tensor_model_parallel_size"),
    read=read_verl_sft,
    roles=("trainer",),
    paths=SFT_PATHS,
)
