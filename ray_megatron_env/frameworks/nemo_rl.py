"""Reading NeMo-RL's config layout into a ``Spec``.

NeMo-RL (github NVIDIA-NeMo/RL, read at 7ea279ab) keeps each model's
training backend under ``<section>.megatron_cfg`` or ``<section>.dtensor_cfg``
(exactly one enabled, or its ``Policy`` raises) and the policy's generation
engine under ``policy.generation``. Its YAML files compose through a
``defaults:`` chain of file paths (``nemo_rl/utils/config.py``), which
``compose`` follows the same way, so a recipe file can be given as a path.

Only the keys in ``PATHS`` are read; a value NeMo-RL never passes on to
Megatron (``distributed_data_parallel_config.use_custom_fsdp``) is not read,
because it never changes what the workers run.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..errors import FieldValueError
from ..engines import (
    DISPATCHER_KEYS, FSDP, INFERENCE, MEGATRON, MEGATRON_BRIDGE_CHECK, MOE_OVERLAP_KEY,
    SIZE_KEYS,
)
from ..spec import Engine, ProcessRule, Spec
from ..megatron_core import read_config_keys, read_dispatcher
from ..values import fail_type, lookup, read_flag, read_name, read_size, show
from ..names import FIELD
from .chain import load_link
from .reader import Reader

FRAMEWORK = "nemo-rl"

# (role, where its section lives). Each is a NeMo-RL ``Policy`` (or value
# model) with its own megatron_cfg/dtensor_cfg: the policy (every algorithm),
# the distillation teacher, the PPO value model (critic), and the reward
# model environment's policy.
SECTIONS: Tuple[Tuple[str, str], ...] = (
    ("policy", "policy"),
    ("teacher", "teacher"),
    ("value", "value"),
    ("reward_model", "env.reward_model"),
)
# Cross-tokenizer distillation's list of teachers; entry i is role "teachers.i".
TEACHERS = "teachers"
GENERATION = "generation"
ROLES = ("policy", GENERATION, "teacher", "value", "reward_model", "teachers.<i>",
         "opd_teachers.<alias>")

MEGATRON_CFG = "megatron_cfg"
DTENSOR_CFG = "dtensor_cfg"
_SIZES = SIZE_KEYS
# The MoE dispatcher (DISPATCHER_KEYS): first-class megatron_cfg keys that
# NeMo-RL copies onto the model config (nemo_rl/models/megatron/setup.py; type
# defaults to "allgather", moe_flex_dispatcher_backend is optional).
# ``megatron_cfg.model_overrides`` can set any field of the Megatron-Bridge
# model provider: setup_model_config merges it into the provider
# (_merge_model_overrides) before NeMo-RL's first-class settings, and Bridge
# hands the provider's fields to Megatron-Core (training/initialize.py passes
# pipeline_model_parallel_comm_backend to initialize_model_parallel). Two
# rule inputs have no first-class key and are read from it (MOE_OVERLAP_KEY
# and PIPELINE_BACKEND_KEY):
MODEL_OVERRIDES = "model_overrides"
# The rest have first-class keys, and NeMo-RL refuses them in model_overrides
# (_validate_model_override_conflicts: any MegatronConfig field, or any key
# megatron_cfg holds, raises ValueError naming both paths). The ones a row
# reads are refused here the same way.
FIRST_CLASS = (*(key for _, key in _SIZES), *DISPATCHER_KEYS)
MOE_OVERLAP = f"{MODEL_OVERRIDES}.{MOE_OVERLAP_KEY}"
_MEGATRON_KEYS = ("enabled", *(key for _, key in _SIZES), *DISPATCHER_KEYS, MODEL_OVERRIDES)
_DTENSOR_KEYS = ("enabled", "_v2")

# policy.generation.backend -> the engine name this package knows it by.
# NeMo-RL's Dynamo backend runs vLLM workers (``DynamoVllmWorker``).
BACKENDS: Dict[str, str] = {"vllm": "vllm", "sglang": "sglang", "trtllm": "trtllm",
                            "dynamo": "dynamo"}
MEGATRON_BACKEND = "megatron"
# nemo_rl/models/generation/trtllm/config.py: the TRT-LLM engine's TP size.
TRTLLM_TP = "policy.generation.trtllm_cfg.tensor_parallel_size"
# A non-colocated Megatron generation policy runs policy.megatron_cfg with
# this shallow-merged on top (``nemo_rl/models/generation/megatron/config.py``).
MCORE_GENERATION = "mcore_generation_config"

# vLLM generation workers: ``BaseVllmGenerationWorker.configure_worker``
# (``nemo_rl/models/generation/vllm/vllm_worker.py``) puts this into every
# vLLM worker's runtime_env env_vars, after the driver's environment, and
# nothing else in NeMo-RL sets it. vLLM's own Ray TP workers inherit it.
VLLM_MARKER = ("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
# SGLang engine actors: ``SGLangGeneration`` (``nemo_rl/models/generation/
# sglang/sglang_generation.py``, the env_vars of each engine actor's
# runtime_env) puts this in, "true" unless the driver's own environment
# holds another value; no other NeMo-RL process has it.
SGLANG_MARKER = ("SGL_DISABLE_TP_MEMORY_INBALANCE_CHECK", "true")
GENERATION_MARKERS = {"vllm": VLLM_MARKER, "sglang": SGLANG_MARKER}

# On-policy distillation's non-colocated teachers (``nemo_rl/algorithms/
# opd.py``, ``nemo_rl/models/policy/teacher_worker_group.py``): one Megatron
# worker group per distinct teacher model, sized by default_teacher_cfg with
# teacher_overrides[alias] on top; entry alias is role "opd_teachers.<alias>".
OPD = "on_policy_distillation"
OPD_TEACHERS = "opd_teachers"
# TeacherResourceConfig's sizes and their defaults (all 1).
_OPD_SIZES = SIZE_KEYS


def _section_paths(path: str) -> Tuple[str, ...]:
    return (*(f"{path}.{MEGATRON_CFG}.{key}" for key in _MEGATRON_KEYS),
            *(f"{path}.{DTENSOR_CFG}.{key}" for key in _DTENSOR_KEYS))


# Every path this module reads, so the driver resolves exactly these in a
# DictConfig (a broken interpolation elsewhere must not fail the job).
PATHS: Tuple[str, ...] = (
    *(p for _, path in SECTIONS for p in _section_paths(path)),
    TEACHERS,
    "policy.generation.backend",
    "policy.generation.colocated.enabled",
    TRTLLM_TP,
    # Shallow-merged: a model_overrides here replaces the policy's whole.
    *(f"policy.generation.{MCORE_GENERATION}.{key}" for key in _MEGATRON_KEYS[1:]),
    OPD,
)


def read_nemo_rl(config: Mapping[str, Any]) -> Spec:
    """Engines of a NeMo-RL config (a plain, resolved mapping)."""
    engines: Dict[str, Engine] = {}
    for role, path in SECTIONS:
        engine = _read_model(lookup(config, path)[1], path)
        if engine is not None:
            engines[role] = engine
    if engines.get("reward_model", Engine("fsdp2", FSDP)).kind == MEGATRON:
        # RewardModelEnvironment asserts dtensor_cfg.enabled
        # (nemo_rl/environments/reward_model_environment.py).
        raise FieldValueError(f"{FIELD}: env.reward_model.{MEGATRON_CFG}.enabled is true, but "
                              "NeMo-RL's reward model environment runs only on DTensor: set "
                              f"env.reward_model.{DTENSOR_CFG}.enabled true and "
                              f"env.reward_model.{MEGATRON_CFG}.enabled false")
    engines.update(_read_teachers(config.get(TEACHERS)))
    if "policy" in engines:
        engines.update(_read_opd_teachers(config, engines["policy"]))
    omitted: Dict[str, str] = {}
    generation = None
    if "policy" in engines:
        generation = _read_generation(config, engines["policy"], omitted)
    processes: Tuple[ProcessRule, ...] = ()
    others = None
    if generation is not None:
        engine, backend = generation
        engines[GENERATION] = engine
        if backend in GENERATION_MARKERS:
            # Only vLLM workers and SGLang engine actors carry a marker
            # NeMo-RL itself sets; every other process (training ranks and
            # helpers) runs the other roles.
            processes = (ProcessRule((GENERATION,), *GENERATION_MARKERS[backend]),)
            others = tuple(sorted(role for role in engines if role != GENERATION))
    return Spec.of(engines, framework=FRAMEWORK, omitted=omitted,
                   processes=processes, others=others)



def _read_teachers(value: Any) -> Dict[str, Engine]:
    if value is None:
        return {}
    if not isinstance(value, (list, tuple)):
        raise fail_type(TEACHERS, "a list of teacher configs", value)
    engines = {}
    for index, teacher in enumerate(value):
        engine = _read_model(teacher, f"{TEACHERS}.{index}")
        if engine is not None:
            engines[f"{TEACHERS}.{index}"] = engine
    return engines


def _read_model(section: Any, path: str) -> Optional[Engine]:
    """The training engine of one Policy section, as NeMo-RL's Policy picks it."""
    if section is None:
        return None
    if not isinstance(section, Mapping):
        raise fail_type(path, "a mapping", section)
    megatron = _enabled(section, MEGATRON_CFG, path)
    dtensor = _enabled(section, DTENSOR_CFG, path)
    keys = f"{path}.{MEGATRON_CFG}.enabled and {path}.{DTENSOR_CFG}.enabled"
    # The same two errors NeMo-RL's Policy and value model raise
    # (nemo_rl/models/policy/lm_policy.py, nemo_rl/models/value/lm_value.py).
    if megatron and dtensor:
        raise FieldValueError(f"{FIELD}: {keys} are both true; NeMo-RL runs one training "
                              "backend per model: enable exactly one")
    if not megatron and not dtensor:
        raise FieldValueError(f"{FIELD}: neither {keys} is true; NeMo-RL needs one "
                              "training backend per model: enable exactly one")
    if megatron:
        return _megatron_engine(section[MEGATRON_CFG], f"{path}.{MEGATRON_CFG}")
    v2 = section[DTENSOR_CFG].get("_v2")
    v2 = False if v2 is None else read_flag(v2, f"{path}.{DTENSOR_CFG}._v2")
    # _v2 runs DTensorPolicyWorkerV2 (Automodel); otherwise torch FSDP2/DTensor.
    return Engine("automodel" if v2 else "fsdp2", FSDP)


def _enabled(section: Mapping[str, Any], name: str, path: str) -> bool:
    sub = section.get(name)
    if sub is None:
        return False
    if not isinstance(sub, Mapping):
        raise fail_type(f"{path}.{name}", "a mapping", sub)
    flag = sub.get("enabled")
    # NeMo-RL tests bool(cfg.get("enabled", False)): absent or null is off.
    return False if flag is None else read_flag(flag, f"{path}.{name}.enabled")


def _megatron_engine(cfg: Mapping[str, Any], path: str,
                     over: Optional[Mapping[str, Any]] = None,
                     over_path: str = "") -> Engine:
    """A Megatron engine from megatron_cfg (and, for a dedicated Megatron
    generation policy, the mcore_generation_config shallow-merged on top)."""
    over = over or {}
    sizes = {}
    for name, key in _SIZES:
        source, where = (over, over_path) if key in over else (cfg, path)
        if key not in source:
            # NeMo-RL indexes these keys directly; without them it fails too.
            raise FieldValueError(f"{FIELD}: {path}.{key} is missing; a Megatron engine "
                                  "needs its parallel sizes")
        sizes[name] = read_size(source[key], f"{where}.{key}")
    overrides, where = ((over[MODEL_OVERRIDES], f"{over_path}.{MODEL_OVERRIDES}")
                        if MODEL_OVERRIDES in over
                        else (cfg.get(MODEL_OVERRIDES), f"{path}.{MODEL_OVERRIDES}"))
    settings = _read_overrides(overrides, where, over_path if MODEL_OVERRIDES in over else path)
    # NeMo-RL validates Megatron-Bridge's ConfigContainer in every Megatron
    # worker (megatron_policy_worker.py), never Megatron-LM's validate_args.
    return Engine(MEGATRON, MEGATRON, checks=(MEGATRON_BRIDGE_CHECK,),
                  dispatcher=_dispatcher(cfg, over, path, over_path), **settings, **sizes)


def _read_overrides(overrides: Any, where: str, cfg_path: str) -> Dict[str, Any]:
    """The rule inputs a ``model_overrides`` mapping carries, with NeMo-RL's
    refusal of a key that has a first-class setting."""
    if overrides is None:
        return {}
    if not isinstance(overrides, Mapping):
        raise fail_type(where, "a mapping", overrides)
    conflicts = sorted(key for key in overrides if key in FIRST_CLASS)
    if conflicts:
        named = ", ".join(f"{where}.{key} conflicts with {cfg_path}.{key}" for key in conflicts)
        raise FieldValueError(f"{FIELD}: {named}; NeMo-RL refuses model_overrides for a field "
                              "with a first-class setting (nemo_rl/models/megatron/setup.py, "
                              "_validate_model_override_conflicts): set the first-class field "
                              "instead")
    return read_config_keys(overrides, where)


def _dispatcher(cfg: Mapping[str, Any], over: Mapping[str, Any], path: str,
                over_path: str) -> Optional[str]:
    """DeepEP or HybridEP when the engine runs the flex dispatcher; a
    generation config's own value wins, as for the sizes."""
    values, keys = [], []
    for key in DISPATCHER_KEYS:
        source, where = (over, over_path) if key in over else (cfg, path)
        values.append(source.get(key))
        keys.append(f"{where}.{key}")
    return read_dispatcher(*values, tuple(keys))


def _read_generation(config: Mapping[str, Any], policy: Engine,
                     omitted: Dict[str, str]) -> Optional[Tuple[Engine, str]]:
    generation = lookup(config, "policy.generation")[1]
    if generation is None:
        return None  # SFT, DPO, RM: no generation engine
    if not isinstance(generation, Mapping):
        raise fail_type("policy.generation", "a mapping", generation)
    key = "policy.generation.backend"
    backend = read_name(generation.get("backend"), key)
    if backend in BACKENDS:
        name = BACKENDS[backend]
        if backend == "trtllm":
            # TRTLLMGeneration indexes trtllm_cfg.tensor_parallel_size; the
            # nccl-fabric pack compares it with each node's GPU count.
            size = lookup(config, TRTLLM_TP)[1]
            return Engine(name, INFERENCE, tensor_parallel=1 if size is None
                          else read_size(size, TRTLLM_TP)), backend
        return Engine(name, INFERENCE), backend
    if backend != MEGATRON_BACKEND:
        raise FieldValueError(f"{FIELD}: {key} is {backend!r}; NeMo-RL's backends are "
                              f"{', '.join([*BACKENDS, MEGATRON_BACKEND])}")
    if policy.kind != MEGATRON:
        raise FieldValueError(f"{FIELD}: {key} is 'megatron' but policy.{MEGATRON_CFG}"
                              ".enabled is not true; Megatron generation runs the policy's "
                              "Megatron model")
    colocated_key = "policy.generation.colocated.enabled"
    colocated = read_flag(lookup(config, colocated_key)[1], colocated_key)
    over = generation.get(MCORE_GENERATION)
    over_path = f"policy.generation.{MCORE_GENERATION}"
    if over is not None and not isinstance(over, Mapping):
        raise fail_type(over_path, "a mapping", over)
    cfg = config["policy"][MEGATRON_CFG]
    inference = _megatron_engine(cfg, f"policy.{MEGATRON_CFG}", over, over_path)
    if not colocated:
        return inference, backend
    # Colocated: MegatronGeneration generates with the training model, unless
    # the merged inference layout differs (CP pinned to 1); then each policy
    # worker builds a second, dedicated model from it (``dedicated_inference_
    # megatron_cfg``, nemo_rl/models/generation/megatron/config.py). Either
    # way it runs in the policy's processes.
    inference = replace(inference, context_parallel=1)
    if (inference.tensor_parallel, inference.expert_parallel, policy.context_parallel) \
            == (policy.tensor_parallel, policy.expert_parallel, 1):
        omitted[GENERATION] = ("backend megatron, colocated: generation runs inside the "
                               "policy's Megatron workers")
        return None
    return inference, backend


def _read_opd_teachers(config: Mapping[str, Any], policy: Engine) -> Dict[str, Engine]:
    """The Megatron teachers of on-policy distillation with non-colocated
    teachers, one per distinct teacher model, as NeMo-RL builds them."""
    opd = lookup(config, OPD)[1]
    if opd is None:
        return {}
    if not isinstance(opd, Mapping):
        raise fail_type(OPD, "a mapping", opd)
    enabled = opd.get("enabled")
    non_coloc = opd.get("non_colocated_teachers")
    where = f"{OPD}.non_colocated_teachers"
    if enabled is None or not read_flag(enabled, f"{OPD}.enabled") or non_coloc is None:
        return {}  # is_non_colocated_teachers_enabled: both must be true
    if not isinstance(non_coloc, Mapping):
        raise fail_type(where, "a mapping", non_coloc)
    flag = non_coloc.get("enabled")
    if flag is None or not read_flag(flag, f"{where}.enabled"):
        return {}
    default = non_coloc.get("default_teacher_cfg") or {}
    overrides = non_coloc.get("teacher_overrides") or {}
    models = opd.get("teacher_model_by_agent_name") or {}
    for value, key in ((default, f"{where}.default_teacher_cfg"),
                       (overrides, f"{where}.teacher_overrides"),
                       (models, f"{OPD}.teacher_model_by_agent_name")):
        if not isinstance(value, Mapping):
            raise fail_type(key, "a mapping", value)
    dedupe = opd.get("deduplicate_shared_teacher_checkpoints")
    dedupe = True if dedupe is None else read_flag(
        dedupe, f"{OPD}.deduplicate_shared_teacher_checkpoints")
    engines: Dict[str, Engine] = {}
    seen = set()
    for alias, model in models.items():
        if dedupe and model in seen:
            continue  # one worker group serves every alias of that checkpoint
        seen.add(model)
        role = f"{OPD_TEACHERS}.{read_name(alias, f'{OPD}.teacher_model_by_agent_name (an alias)')}"
        override = overrides.get(alias) or {}
        if not isinstance(override, Mapping):
            raise fail_type(f"{where}.teacher_overrides.{alias}", "a mapping", override)
        sizes = {}
        for name, key in _OPD_SIZES:
            source, path = ((override, f"{where}.teacher_overrides.{alias}") if key in override
                            else (default, f"{where}.default_teacher_cfg"))
            value = source.get(key)
            sizes[name] = 1 if value is None else read_size(value, f"{path}.{key}")
        # The teacher's config is a deep copy of the policy's with these sizes
        # set (TeacherWorkerGroup), so the policy's MoE overlap flag, its
        # dispatcher and its pipeline backend (model_overrides) carry over.
        engines[role] = replace(policy, **sizes)
    return engines


# ---------------------------------------------------------------- composition

DEFAULTS = "defaults"
_MAX_CHAIN = 32
# NeMo-RL's own resolvers (nemo_rl/utils/config.py, register_omegaconf_resolvers).
_RESOLVERS = {
    "add": lambda a, b: a + b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b,
    "max": lambda a, b: max(a, b),
}


def compose(path: str, loaded: Any) -> Optional[Any]:
    """The config NeMo-RL's ``load_config(path)`` returns, or None when the
    file's ``defaults:`` is not NeMo-RL's (absent, or Hydra's defaults list)."""
    parents = _parents(loaded, os.path.dirname(os.path.abspath(path)))
    if parents is None:
        return None
    register_resolvers()
    return _compose(loaded, parents, [os.path.abspath(path)])


def register_resolvers() -> None:
    """NeMo-RL's add/mul/div/max, each only where no resolver has the name."""
    import warnings

    from omegaconf import OmegaConf

    for name, function in _RESOLVERS.items():
        if not OmegaConf.has_resolver(name):
            # register_new_resolver is the call every OmegaConf from 2.1 has
            # (and NeMo-RL makes); 2.4 only warns that it is renamed.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                OmegaConf.register_new_resolver(name, function)


def _parents(loaded: Any, folder: str) -> Optional[List[str]]:
    """The parent files a NeMo-RL ``defaults:`` names, or None when the value
    is not that: NeMo-RL's is a file path or a list of them, while Hydra's
    (verl's) is a list of mappings and ``group@package: name`` entries."""
    from omegaconf import DictConfig, ListConfig

    if not isinstance(loaded, DictConfig) or DEFAULTS not in loaded:
        return None
    raw = loaded[DEFAULTS]
    entries: Sequence[Any] = [raw] if isinstance(raw, str) else (
        list(raw) if isinstance(raw, ListConfig) else [])
    if not entries or not all(isinstance(entry, str) and _names_a_file(entry, folder)
                              for entry in entries):
        return None
    return [entry if os.path.isabs(entry) else os.path.join(folder, entry)
            for entry in entries]


def _names_a_file(entry: str, folder: str) -> bool:
    if entry.endswith((".yaml", ".yml")):
        return True  # a missing one is an error below, naming the chain
    return os.path.isfile(entry if os.path.isabs(entry) else os.path.join(folder, entry))


def _compose(config: Any, parents: List[str], chain: List[str]) -> Any:
    from omegaconf import OmegaConf

    config = config.copy()
    config.pop(DEFAULTS)
    base = OmegaConf.create({})
    for parent in parents:
        base = _merge(base, _load_parent(parent, chain))
    return _merge(base, config)


def _load_parent(path: str, chain: List[str]) -> Any:
    path = os.path.abspath(path)
    shown = " -> ".join(chain + [path])
    loaded = load_link(path, chain, _MAX_CHAIN)
    if DEFAULTS not in loaded:
        return loaded
    folder = os.path.dirname(path)
    parents = _parents(loaded, folder)
    if parents is None:
        raise FieldValueError(f"{FIELD}: {path!r} has defaults: {show(loaded[DEFAULTS])}, "
                              f"which is not a file path or a list of them (chain: {shown})")
    return _compose(loaded, parents, chain + [path])


def _merge(base: Any, child: Any) -> Any:
    """NeMo-RL's ``merge_with_override``: a top-level child section marked
    ``_override_: true`` replaces the parent's instead of merging into it."""
    from omegaconf import DictConfig, OmegaConf

    for key in list(child.keys()):
        if OmegaConf.is_missing(child, key):
            continue  # ??? keeps the parent's value (OmegaConf.merge does that)
        value = child[key]
        if isinstance(value, DictConfig) and value.get("_override_", False):
            value.pop("_override_")
            if key in base:
                base.pop(key)
    return OmegaConf.merge(base, child)


READER = Reader(
    name=FRAMEWORK,
    markers=("policy.megatron_cfg", "policy.dtensor_cfg"),
    read=read_nemo_rl,
    roles=ROLES,
    paths=PATHS,
    compose=compose,
    # examples/configs/evals/*.yaml (run_eval.py): a generation engine and no
    # policy, so neither marker.
    unsupported=((("eval", "generation"),
                  "This looks like a NeMo-RL evaluation config (eval, generation), which "
                  "no reader reads: write the compact form, e.g. {'engines': {'generation': "
                  "{'strategy': 'vllm'}}} (docs/field.md)"),),
)
