"""Reading SkyRL's config into a ``Spec``.

SkyRL (NovaSky-AI/SkyRL; the ``skyrl`` 0.4.0 wheel, ``skyrl/train/...``)
is configured by ``SkyRLTrainConfig``, a tree of dataclasses its entry
points build from ``key=value`` overrides (``from_cli_overrides(sys.argv
[1:])``, ``skyrl/train/config/config.py``). Overrides carry only what
differs, so every key read here falls back to SkyRL's own default, cited
where it is read. Accepted forms: the override list (the entry point's
argv), a file of them (one or more per line, as in a launch script, or a
YAML list), the nested dict or YAML, and the ``SkyRLTrainConfig`` object
itself (``frameworks.loading`` reads dataclasses at ``PATHS``).

The SFT entry point (``skyrl.train.main_sft``) has its own flat layout,
``SFTConfig`` (``skyrl/train/config/sft_config.py``): ``SFT_READER``.

SkyRL writes CUDA_DEVICE_MAX_CONNECTIONS=1 for every process of every
Megatron job (``prepare_runtime_environment``, ``skyrl/train/utils/
utils.py``, ``if cfg.trainer.strategy == "megatron"``; passed to
``ray.init(runtime_env={"env_vars": ...})`` by ``initialize_ray``) and
never forwards a user's value for it, so for a Megatron job that "1" is
SkyRL's: ``replaces="1"``. An FSDP job gets no value from SkyRL, so a "1"
there is the user's and is kept. No SkyRL process carries a marker of its
own (trainer workers get no ``env_vars``; vLLM engines only an allocator
setting), so one decision covers the job's processes. SkyRL builds models
through Megatron-Bridge providers and ``mpu.initialize_model_parallel``
(``megatron_strategy.py``), never Megatron-LM's ``validate_args``: every
row is a preference (no checks).
"""

from __future__ import annotations

import re
import shlex
import warnings
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..errors import FieldValueError
from ..engines import (
    DISPATCHER_TYPE_KEY, ENABLE_DEEPEP_KEY, FLEX_BACKEND_KEY, FSDP, INFERENCE, MEGATRON,
    MOE_OVERLAP_KEY, PIPELINE_BACKEND_KEY, SIZE_KEYS,
)
from ..spec import Engine, Spec
from ..megatron_core import read_config_keys, read_dispatcher
from ..values import (
    closest, fail_type, lookup, optional, optional_flag, read_flag, read_name, read_size, show,
)
from ..names import FIELD
from .reader import Reader

FRAMEWORK = "skyrl"
SFT_FRAMEWORK = "skyrl-sft"
ROLES = ("policy", "ref", "critic", "inference_engine")

# SkyRLTrainConfig's fields (config.py, class SkyRLTrainConfig).
TOP_KEYS = ("data", "trainer", "generator", "environment")

STRATEGY = "trainer.strategy"
# TrainerConfig.strategy = "fsdp"; validate_cfg renames the deprecated
# "fsdp2" to "fsdp" before initialize_ray (utils.py, validate_cfg).
STRATEGY_DEFAULT = "fsdp"
STRATEGIES = {"fsdp": FSDP, "fsdp2": FSDP, "megatron": MEGATRON}
POLICY_MCORE = "trainer.policy.megatron_config"
REF_MCORE = "trainer.ref.megatron_config"
USE_KL_LOSS = "trainer.algorithm.use_kl_loss"  # AlgorithmConfig: True
USE_KL_IN_REWARD = "trainer.algorithm.use_kl_in_reward"  # AlgorithmConfig: False
CRITIC_PATH = "trainer.critic.model.path"  # CriticConfig.model = ModelConfig(): path None
ENGINE = "generator.inference_engine"
# InferenceEngineConfig: backend "vllm", tensor_parallel_size 1,
# run_engines_locally True, num_engines 1 (config.py, class InferenceEngineConfig).
ENGINE_DEFAULTS = (("backend", "vllm"), ("tensor_parallel_size", 1),
                   ("run_engines_locally", True), ("num_engines", 1))
# Either set (not None), build_new_inference_client (backends/skyrl_train/
# inference_servers/setup.py) uses those servers and starts no vLLM engine
# of its own; run_engines_locally=false without them is refused by
# validate_cfg (utils.py, _validate_new_inference_cfg).
EXTERNAL_KEYS = ("external_proxy_url", "external_server_urls")
# FullyAsyncConfig.simulate_training (False): BasePPOExp._setup_trainer
# (entrypoints/main_base.py) then skips trainer.build_models, so no policy,
# ref or critic worker starts; only the inference engines run.
SIMULATE = "trainer.fully_async.simulate_training"
_FULLY_ASYNC_FIELDS = ("enabled", "max_staleness_steps", "num_parallel_generation_workers",
                       "sample_full_batch", "clear_kv_cache_on_weight_sync", "simulate_training",
                       "simulate_training_step_seconds", "simulate_weight_sync_seconds")
ENGINE_BACKENDS = ("vllm",)  # the docstring's only value; validate_megatron_cfg asserts it

# MegatronConfig's first-class keys read here; each defaults to 1, the
# dispatcher to "alltoall" (config.py, class MegatronConfig).
SIZES = SIZE_KEYS
DISPATCHER_DEFAULT = "alltoall"
KWARGS = "transformer_config_kwargs"
# MegatronWorker.init_configs (backends/skyrl_train/workers/megatron/
# megatron_worker.py) sets the provider's sizes from the first-class keys,
# then ``setattr(provider, k, v)`` for every transformer_config_kwargs key,
# which "can override the above"; mpu.initialize_model_parallel
# (megatron_strategy.py) still takes the first-class sizes. A size there
# would make the two disagree, so it is refused, naming both keys.
KWARG_SIZES = tuple(key for _, key in SIZES)
# Read from the kwargs (no first-class key, or the kwarg wins).
KWARG_READ = (MOE_OVERLAP_KEY, DISPATCHER_TYPE_KEY, FLEX_BACKEND_KEY, ENABLE_DEEPEP_KEY,
              PIPELINE_BACKEND_KEY)

# Known fields of each section read, from the 0.4.0 dataclasses: a key
# close to one read here but not among these is a misspelling (SkyRL's
# build_nested_dataclass refuses unknown keys too).
_MEGATRON_FIELDS = (
    "tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
    "expert_model_parallel_size", "expert_tensor_parallel_size", "moe_token_dispatcher_type",
    "moe_router_load_balancing_type", "moe_aux_loss_coeff", "moe_grouped_gemm",
    "moe_router_score_function", "moe_router_enable_expert_bias", "moe_enable_routing_replay",
    "moe_per_layer_logging", "moe_router_dtype", "ddp_config", "hf_export_config",
    "lora_config", "optimizer_config_kwargs", "fp8", "fp8_recipe", "fp8_param",
    "fp8_amax_compute_algo", KWARGS, "empty_cuda_cache", "model_config_kwargs",
    "dist_ckpt_optim_fully_reshardable", "freeze_moe_router", "freeze_dsa_indexer",
    "mtp_num_layers", "mtp_loss_weight", "mtp_loss_chunk_size", "mtp_loss_topk",
    "async_dist_ckpt_save", "async_save_prestage_to_cpu")
_ENGINE_FIELDS = (
    "model_dtype", "fp8_weight_sync_mode", "run_engines_locally", "num_engines", "backend",
    "weight_sync_backend", "weight_transfer_threshold_cuda_ipc_GB", "delta_weight_sync",
    "tensor_parallel_size", "pipeline_parallel_size", "expert_parallel_size",
    "data_parallel_size", "vllm_v1_disable_multiproc", "enable_prefix_caching",
    "enable_chunked_prefill", "enable_return_routed_experts",
    "enable_return_sample_support_set", "max_num_batched_tokens", "enforce_eager",
    "fully_sharded_loras", "enable_ray_prometheus_stats", "gpu_memory_utilization",
    "offload_kv_for_weight_sync", "use_expandable_segments", "max_num_seqs",
    "served_model_name", "distributed_executor_backend", "language_model_only",
    "engine_init_kwargs", "speculative_config", "external_proxy_url", "external_server_urls",
    "enable_pd", "num_prefill", "prefill_init_kwargs", "decode_init_kwargs",
    "router_init_kwargs")
_TRAINER_READ = ("strategy", "policy", "ref", "critic", "algorithm", "fully_async")
_TRAINER_FIELDS = (
    "placement", "use_expandable_segments", "sequence_parallel_backend", "strategy", "policy",
    "ref", "critic", "algorithm", "mtp", "fully_async", "gradient_checkpointing",
    "gradient_checkpointing_use_reentrant", "seed", "resume_mode", "resume_path", "log_path",
    "ckpt_path", "max_ckpts_to_keep", "ckpt_interval", "hf_save_interval", "export_path",
    "bf16", "epochs", "max_training_steps", "update_epochs_per_batch", "train_batch_size",
    "policy_mini_batch_size", "critic_mini_batch_size", "micro_train_batch_size_per_gpu",
    "micro_forward_batch_size_per_gpu", "max_tokens_per_microbatch",
    "recompute_old_logprobs_per_minibatch", "update_ref_every_epoch",
    "remove_microbatch_padding", "eval_batch_size", "eval_before_train", "eval_interval",
    "max_prompt_length", "flash_attn", "disable_fast_tokenizer", "project_name", "run_name",
    "logger", "enable_ray_gpu_monitor", "tags", "dump_data_batch", "dump_eval_results",
    "print_example_interval", "num_logger_eval_samples", "num_logger_train_samples",
    "log_example_interval", "logprobs_chunk_size", "vocab_entropy_chunk_size",
    "vocab_entropy_chunk_memory_mb", "fused_lm_head_logprob", "fused_lm_head_logprob_backend",
    # main_base.main peeks it from argv before the strict parse (not a field)
    "override_entrypoint")
_ALGORITHM_FIELDS = (
    "advantage_estimator", "kl_ctrl", "kl_estimator_type", "use_kl_in_reward", "use_kl_loss",
    "kl_loss_coef", "use_entropy_loss", "entropy_loss_coef", "temperature",
    "advantage_batch_normalize", "value_head_prefix", "policy_loss_type", "loss_reduction",
    "grpo_norm_by_std", "zero_variance_filter", "zero_variance_filter_tol", "lambd", "gamma",
    "eps_clip_low", "eps_clip_high", "clip_ratio_c", "tis_imp_ratio_cap", "use_tis",
    "off_policy_correction", "enable_sample_support_replay", "sapo", "value_clip",
    "dynamic_sampling", "clip_cov", "kl_cov", "cispo", "dppo", "max_seq_len")
# (section, keys read there, its known fields)
_CHECKED = (
    ("", TOP_KEYS, TOP_KEYS),
    ("trainer", _TRAINER_READ, _TRAINER_FIELDS),
    ("trainer.policy", ("megatron_config",),
     ("model", "optimizer_config", "fsdp_config", "sequence_parallel_size", "use_torch_compile",
      "record_memory", "torch_profiler_config", "megatron_config", "model_config_kwargs",
      "language_model_only", "inference_only_init")),
    ("trainer.ref", ("megatron_config",),
     ("model", "sequence_parallel_size", "fsdp_config", "megatron_config",
      "model_config_kwargs", "language_model_only")),
    ("trainer.critic", ("model",), ("model", "optimizer_config", "fsdp_config",
                                    "sequence_parallel_size", "model_config_kwargs")),
    ("trainer.critic.model", ("path",), ("path", "lora", "fake_int4_qat")),
    ("trainer.algorithm", ("use_kl_loss", "use_kl_in_reward"), _ALGORITHM_FIELDS),
    ("trainer.fully_async", ("simulate_training",), _FULLY_ASYNC_FIELDS),
    ("generator", ("inference_engine",), ("inference_engine",)),
    (ENGINE, (*(key for key, _ in ENGINE_DEFAULTS), *EXTERNAL_KEYS), _ENGINE_FIELDS),
    (POLICY_MCORE, (*KWARG_SIZES, DISPATCHER_TYPE_KEY, KWARGS), _MEGATRON_FIELDS),
    (REF_MCORE, (*KWARG_SIZES, DISPATCHER_TYPE_KEY, KWARGS), _MEGATRON_FIELDS),
)

# What the driver must resolve in a DictConfig or dataclass (whole
# megatron_config sections: the misspelling check reads their keys).
PATHS: Tuple[str, ...] = (
    STRATEGY, POLICY_MCORE, REF_MCORE, USE_KL_LOSS, USE_KL_IN_REWARD, CRITIC_PATH, SIMULATE,
    *(f"{ENGINE}.{key}" for key, _ in ENGINE_DEFAULTS), *(f"{ENGINE}.{key}" for key in EXTERNAL_KEYS))

# --- SFT (skyrl.train.main_sft, SFTConfig) -------------------------------------------

SFT_STRATEGY = "strategy"
SFT_STRATEGY_DEFAULT = "megatron"  # SFTConfig.strategy
SFT_STRATEGIES = {"megatron": MEGATRON, "fsdp": FSDP, "fsdp2": FSDP}  # validate_sft_cfg
SFT_MCORE = "megatron_config"
# SFTConfig.megatron_config's default_factory is MegatronConfig(TP=2, PP=2);
# but an override of any megatron_config key builds MegatronConfig(**given)
# (build_nested_dataclass), whose own defaults (1) then fill the rest.
SFT_SIZES_WITHOUT_SECTION = {"tensor_model_parallel_size": 2}
SFT_FIELDS = (
    "model", "optimizer_config", "placement", "megatron_config", "fsdp_config",
    "sequence_parallel_size", "model_config_kwargs", "use_torch_compile", "record_memory",
    "torch_profiler_config", "strategy", "dataset_name", "dataset_split", "train_datasets",
    "train_dataset_splits", "train_dataset_weights", "pretokenized_dataset_paths",
    "messages_key", "tools_key", "system_key", "eval_dataset_name", "eval_dataset_split",
    "eval_datasets", "eval_dataset_splits", "eval_dataset_names",
    "eval_pretokenized_dataset_paths", "eval_interval", "eval_before_train", "max_length",
    "num_steps", "num_epochs", "batch_size", "micro_train_batch_size_per_gpu", "logger",
    "project_name", "run_name", "tags", "ckpt_path", "ckpt_interval", "enable_ray_gpu_monitor",
    "max_ckpts_to_keep", "resume_from", "hf_save_interval", "export_path", "seed",
    "num_workers", "async_batch_collation", "dataloader_num_workers",
    "dataloader_persistent_workers", "sampler", "sampler_class_path", "sampler_kwargs",
    "cache_dir", "force_recache", "disable_cache", "train_on_what",
    "remove_microbatch_padding", "use_sequence_packing", "max_tokens_per_microbatch",
    "dummy_run_full_ctx", "dummy_run_max_steps", "max_training_steps")
SFT_PATHS: Tuple[str, ...] = (SFT_STRATEGY, SFT_MCORE)
_SFT_CHECKED = (
    ("", (SFT_STRATEGY, SFT_MCORE), SFT_FIELDS),
    (SFT_MCORE, (*KWARG_SIZES, DISPATCHER_TYPE_KEY, KWARGS), _MEGATRON_FIELDS),
)

SKYRL_VALUE = "1"
# prepare_runtime_environment also writes FLA_TILELANG=os.environ.get("FLA_TILELANG", "1")
# for every Megatron job (same block, same condition): without the driver's own value,
# SkyRL's "1" (the fla-backend pack decides it anew; a driver's copy is driver_env).
FLA_VARIABLE = "FLA_TILELANG"


def _framework_env(megatron: bool) -> Dict[str, str]:
    return {FLA_VARIABLE: SKYRL_VALUE} if megatron else {}


# --- Reading -------------------------------------------------------------------------

def _refuse_misspellings(config: Mapping[str, Any], checked: Sequence[Tuple[str, Sequence[str],
                                                                          Sequence[str]]],
                         framework: str) -> None:
    for section, read, known in checked:
        found, node = (True, config) if not section else lookup(config, section)
        if not found or not isinstance(node, Mapping):
            continue
        for key in map(str, node):
            if key in known:
                continue
            close = closest(key, read)
            if close is not None:
                where = f"{section}.{key}" if section else key
                meant = f"{section}.{close}" if section else close
                raise FieldValueError(
                    f"{FIELD}: {where} is not a {framework} config key; did you mean {meant}? "
                    f"(SkyRL refuses unknown keys; this reader would otherwise read "
                    f"{meant}'s default)")


def _strategy(config: Mapping[str, Any], key: str, default: str,
              known: Mapping[str, str]) -> str:
    strategy = read_name(optional(config, key, default), key)
    if strategy not in known:
        raise FieldValueError(f"{FIELD}: {key} is {strategy!r}; SkyRL's strategies are "
                              f"{', '.join(known)}")
    return strategy


def _megatron_engine(config: Mapping[str, Any], path: str,
                     size_defaults: Optional[Mapping[str, int]] = None) -> Engine:
    """One Megatron model from its ``megatron_config`` section as SkyRL's
    MegatronWorker builds its provider."""
    found, section = lookup(config, path)
    if found and section is not None and not isinstance(section, Mapping):
        raise fail_type(path, "a mapping (SkyRL's MegatronConfig)", section)
    section = section if found and section is not None else {}
    defaults = size_defaults if size_defaults is not None and not section else {}
    sizes = {}
    for name, key in SIZES:
        value = section.get(key)
        sizes[name] = (defaults.get(key, 1) if value is None
                       else read_size(value, f"{path}.{key}"))
    kwargs = section.get(KWARGS)
    where = f"{path}.{KWARGS}"
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, Mapping):
        raise fail_type(where, "a mapping", kwargs)
    clash = [key for key in KWARG_SIZES if key in kwargs]
    if clash:
        named = ", ".join(f"{where}.{key} (beside {path}.{key})" for key in clash)
        raise FieldValueError(
            f"{FIELD}: {named}: SkyRL sets the model provider's sizes from {path} and then "
            f"every {KWARGS} key over them, while Megatron-Core's initialize_model_parallel "
            f"takes {path}'s; the two would disagree: set the size in {path} only")
    settings = read_config_keys(kwargs, where)
    # The dispatcher type: the kwarg wins over the first-class key (set first).
    if kwargs.get(DISPATCHER_TYPE_KEY) is not None:
        kind, kind_key = kwargs[DISPATCHER_TYPE_KEY], f"{where}.{DISPATCHER_TYPE_KEY}"
    else:
        kind = section.get(DISPATCHER_TYPE_KEY)
        kind = DISPATCHER_DEFAULT if kind is None else kind
        kind_key = f"{path}.{DISPATCHER_TYPE_KEY}"
    dispatcher = read_dispatcher(kind, kwargs.get(FLEX_BACKEND_KEY),
                                 kwargs.get(ENABLE_DEEPEP_KEY),
                                 (kind_key, f"{where}.{FLEX_BACKEND_KEY}",
                                  f"{where}.{ENABLE_DEEPEP_KEY}"))
    return Engine(MEGATRON, MEGATRON, dispatcher=dispatcher, **sizes, **settings)


def _inference_engine(config: Mapping[str, Any], omitted: Dict[str, str]) -> Optional[Engine]:
    values = {key: optional(config, f"{ENGINE}.{key}", default) for key, default in ENGINE_DEFAULTS}
    external = [key for key in EXTERNAL_KEYS if optional(config, f"{ENGINE}.{key}", None) is not None]
    if external:
        omitted["inference_engine"] = (f"{ENGINE}.{external[0]} is set: SkyRL uses servers "
                                       "outside this job and starts no vLLM engine")
        return None
    if not read_flag(values["run_engines_locally"], f"{ENGINE}.run_engines_locally"):
        raise FieldValueError(
            f"{FIELD}: {ENGINE}.run_engines_locally is false without {ENGINE}."
            f"{EXTERNAL_KEYS[0]} or {EXTERNAL_KEYS[1]}; SkyRL refuses that too "
            "(validate_cfg: run_engines_locally=false requires one of them)")
    count = values["num_engines"]
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise fail_type(f"{ENGINE}.num_engines", "an integer from 0", count)
    if count == 0:
        omitted["inference_engine"] = f"{ENGINE}.num_engines is 0"
        return None
    backend = read_name(values["backend"], f"{ENGINE}.backend")
    if backend not in ENGINE_BACKENDS:
        raise FieldValueError(f"{FIELD}: {ENGINE}.backend is {backend!r}; SkyRL's inference "
                              f"backends are {', '.join(ENGINE_BACKENDS)}")
    tp = read_size(values["tensor_parallel_size"], f"{ENGINE}.tensor_parallel_size")
    return Engine(backend, INFERENCE, tensor_parallel=tp)


def read_skyrl(config: Mapping[str, Any]) -> Spec:
    """Engines of a SkyRL (``SkyRLTrainConfig``) config: a plain mapping of
    its overrides or its whole tree."""
    _refuse_misspellings(config, _CHECKED, "SkyRL")
    strategy = _strategy(config, STRATEGY, STRATEGY_DEFAULT, STRATEGIES)
    if strategy == "fsdp2":
        warnings.warn(f"{FIELD}: {STRATEGY}='fsdp2' is SkyRL's deprecated name for 'fsdp'",
                      DeprecationWarning, stacklevel=2)
    megatron = STRATEGIES[strategy] == MEGATRON
    engines: Dict[str, Engine] = {}
    # A SkyRLTrainConfig subclass's own sections (main_harbor.py's
    # harbor_trial_config) hold no model: named in the record, not read.
    omitted: Dict[str, str] = {
        key: "a section of a SkyRLTrainConfig subclass, not SkyRL's: not read"
        for key in map(str, config) if key not in TOP_KEYS and _NAME.match(key)}
    critic = optional(config, CRITIC_PATH, None)
    critic = critic not in (None, "")
    if critic and megatron:
        # validate_megatron_cfg: "only GRPO training is currently supported for megatron"
        raise FieldValueError(f"{FIELD}: {CRITIC_PATH} is set with {STRATEGY}=megatron; "
                              "SkyRL refuses a critic under Megatron (validate_megatron_cfg)")
    kl = optional_flag(config, USE_KL_LOSS, True) or optional_flag(config, USE_KL_IN_REWARD, False)
    if optional_flag(config, SIMULATE, False):
        why = f"{SIMULATE} is true: SkyRL builds no trainer models (BasePPOExp._setup_trainer)"
        omitted.update({"policy": why, **({"ref": why} if kl else {}),
                        **({"critic": why} if critic else {})})
    else:
        engines["policy"] = (_megatron_engine(config, POLICY_MCORE) if megatron
                             else Engine("fsdp2", FSDP))
        if critic:
            engines["critic"] = Engine("fsdp2", FSDP)  # CriticConfig: FSDP only
    # The ref exists when KL is used (RefConfig's docstring; main_base builds
    # it for use_kl_loss or use_kl_in_reward). It runs trainer.strategy with
    # its OWN megatron_config (default MegatronConfig(): all sizes 1).
    if not kl:
        omitted["ref"] = f"{USE_KL_LOSS} and {USE_KL_IN_REWARD} are false"
    elif "policy" in engines:
        engines["ref"] = (_megatron_engine(config, REF_MCORE) if megatron
                          else Engine("fsdp2", FSDP))
    engine = _inference_engine(config, omitted)
    if engine is not None:
        engines["inference_engine"] = engine
    return Spec.of(engines, framework=FRAMEWORK, omitted=omitted,
                   replaces=SKYRL_VALUE if megatron else None,
                   framework_env=_framework_env(megatron))


def read_skyrl_sft(config: Mapping[str, Any]) -> Spec:
    """The one model of SkyRL's SFT entry point (``SFTConfig``): no ref and
    no inference engine (``build_skyrl_config_for_sft``), and the same "1"
    from ``initialize_ray`` for a Megatron run."""
    _refuse_misspellings(config, _SFT_CHECKED, "SkyRL SFT")
    strategy = _strategy(config, SFT_STRATEGY, SFT_STRATEGY_DEFAULT, SFT_STRATEGIES)
    megatron = SFT_STRATEGIES[strategy] == MEGATRON
    policy = (_megatron_engine(config, SFT_MCORE, SFT_SIZES_WITHOUT_SECTION) if megatron
              else Engine("fsdp2", FSDP))
    return Spec.of({"policy": policy}, framework=SFT_FRAMEWORK,
                   replaces=SKYRL_VALUE if megatron else None,
                   framework_env=_framework_env(megatron))


# --- Override lists -----------------------------------------------------------------

_OVERRIDE = re.compile(r"^([+~]{0,2})([A-Za-z_][A-Za-z0-9_]*)((?:\.[A-Za-z0-9_]+)*)=")
# An entry point's own option (visgym's --env_variant), which it strips with
# parse_known_args before SkyRL parses the rest (examples/train/visgym/entrypoint.py).
_OPTION = re.compile(r"^--?[A-Za-z]")
# A name the record can show (a role name's form, values.read_name).
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$")


def _tops(args: Sequence[str]) -> Optional[List[Tuple[str, str]]]:
    """(prefix, top-level key) of each override, or None when one is not."""
    out = []
    for arg in args:
        match = _OVERRIDE.match(arg)
        if match is None:
            return None
        out.append((match.group(1), match.group(2)))
    return out


def _split(args: Sequence[str]) -> Tuple[List[str], List[str], Optional[str]]:
    """(the key=value overrides, the options with their values, the first
    token that is neither). An option's value is the next token when that is
    neither an override nor an option, as argparse would take it."""
    overrides: List[str] = []
    options: List[str] = []
    stray = None
    i = 0
    while i < len(args):
        arg = args[i]
        if _OVERRIDE.match(arg):
            overrides.append(arg)
        elif _OPTION.match(arg):
            options.append(arg)
            if "=" not in arg and i + 1 < len(args) and not _OVERRIDE.match(args[i + 1]) \
                    and not _OPTION.match(args[i + 1]):
                i += 1
                options.append(args[i])
        elif stray is None:
            stray = arg
        i += 1
    return overrides, options, stray


def _trainer_keys_are_skyrls(overrides: Sequence[str]) -> bool:
    """Whether every trainer.<key> override names a field of SkyRL's
    TrainerConfig (or is close to one read here, refused later by name):
    verl's Hydra overrides have trainer.* keys too (trainer.n_gpus_per_node)."""
    for arg in overrides:
        match = _OVERRIDE.match(arg)
        if match is None or match.group(2) != "trainer" or not match.group(3):
            continue
        key = match.group(3).split(".")[1]
        if key not in _TRAINER_FIELDS and closest(key, _TRAINER_READ) is None:
            return False
    return True


def _parse(args: Sequence[str]) -> Dict[str, Any]:
    """The overrides as SkyRL parses them (``OmegaConf.from_cli``)."""
    plus = [arg for arg in args if arg.startswith(("+", "~"))]
    if plus:
        raise FieldValueError(
            f"{FIELD}: SkyRL override {show(plus[0])}: SkyRL refuses the '+' prefix (and "
            "Hydra's other prefixes); it has no new keys to add (from_cli_overrides)")
    from omegaconf import OmegaConf

    try:
        parsed = OmegaConf.to_container(OmegaConf.from_cli(list(args)), resolve=True)
    except Exception as exc:
        raise FieldValueError(f"{FIELD}: SkyRL's overrides cannot be parsed: "
                              f"{type(exc).__name__}: {str(exc).splitlines()[0]}") from None
    return parsed  # type: ignore[return-value]


def convert(value: Any) -> Optional[Dict[str, Any]]:
    """A SkyRL entry point's argv (``key.path=value`` overrides) -> the
    nested mapping; None when the list is not SkyRL's.

    Top-level sections SkyRLTrainConfig lacks are a subclass's (SkyRL's
    documented extension point; the Harbor entry point adds
    ``harbor_trial_config``): parsed, and left to ``read_skyrl``, which
    names them in the record and reads none. Options before or among the
    overrides (an entry point's own, stripped by it before SkyRL parses the
    rest) are skipped, with a warning naming them."""
    if not isinstance(value, (list, tuple)) or not value \
            or not all(isinstance(arg, str) for arg in value):
        return None
    overrides, options, stray = _split(value)
    if not overrides:
        return None
    keys = {key for _, key in _tops(overrides) or ()}
    if keys & {"trainer", "generator"}:
        unknown = sorted(keys - set(TOP_KEYS))
        hints = {key: closest(key, TOP_KEYS) for key in unknown}
        misspelt = [key for key in unknown if hints[key]]
        if misspelt:
            named = ", ".join(f"{key!r} (SkyRL's {hints[key]!r}?)" for key in misspelt)
            raise FieldValueError(f"{FIELD}: SkyRL's overrides have the top-level key(s) "
                                  f"{named}; SkyRL's are {', '.join(TOP_KEYS)}")
        if unknown and not _trainer_keys_are_skyrls(overrides):
            return None  # another framework's Hydra overrides (verl's)
        if stray is not None:
            raise FieldValueError(
                f"{FIELD}: SkyRL's overrides stop at {show(stray)}, which is neither a "
                "key=value override nor an option; pass the entry point's arguments only")
        if options:
            warnings.warn(
                f"{FIELD}: SkyRL's overrides: {' '.join(options)} skipped (an entry point's own "
                "option, which it strips before SkyRL parses the rest); if it changes SkyRL's "
                "config, write that as a key=value override", UserWarning, stacklevel=3)
        mapping = _parse(overrides)
        # The marker: the strategy is always there (its default made explicit).
        trainer = mapping.setdefault("trainer", {})
        if isinstance(trainer, dict) and trainer.get("strategy") is None:
            trainer["strategy"] = STRATEGY_DEFAULT
        return mapping
    if keys <= set(SFT_FIELDS) and not options and stray is None:
        mapping = _parse(overrides)
        if mapping.get(SFT_STRATEGY) is None:
            mapping[SFT_STRATEGY] = SFT_STRATEGY_DEFAULT
        return mapping
    return None


def overrides_file(path: str) -> Optional[Dict[str, Any]]:
    """A file of SkyRL overrides (the override lines of a launch script:
    ``\\`` continuations, ``#`` comments, shell quoting) -> its mapping;
    None when the file is anything else (a YAML file is not split into
    ``key=value`` words). YAML cannot load such a file, so ``loading`` asks
    here (the reader's ``load_file``) before it tries."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read(1 << 20)
        first = next((line.strip().lstrip("\"'") for line in text.splitlines()
                      if line.strip() and not line.strip().startswith("#")), "")
        if _OVERRIDE.match(first) is None and _OPTION.match(first) is None:
            return None  # YAML (or anything else) starts otherwise: no need to split it
        args = shlex.split(text.replace("\\\n", " "), comments=True)
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return convert(args) if args else None


def compose(path: str, loaded: Any) -> Optional[Any]:
    """A YAML list of SkyRL override strings -> its mapping."""
    from omegaconf import ListConfig, OmegaConf

    if not isinstance(loaded, ListConfig):
        return None
    items = OmegaConf.to_container(loaded, resolve=False)
    if not all(isinstance(item, str) for item in items):
        return None
    return convert(items)


READER = Reader(
    name=FRAMEWORK,
    markers=(STRATEGY, "trainer.policy.megatron_config", ENGINE),
    read=read_skyrl,
    roles=ROLES,
    paths=PATHS,
    convert=convert,
    compose=compose,
    load_file=overrides_file,
)

SFT_READER = Reader(
    name=SFT_FRAMEWORK,
    markers=(SFT_STRATEGY, SFT_MCORE),
    read=read_skyrl_sft,
    roles=("policy",),
    paths=SFT_PATHS,
)
