"""Reading ROLL's pipeline config into a ``Spec``.

ROLL (alibaba/ROLL, read at 8eb27cc2, 2026-08-19) composes a Hydra YAML
(``examples/start_*_pipeline.py``: ``initialize`` + ``compose``), resolves
it, and builds its dataclasses with ``dacite.from_dict``. Each role is a
``WorkerConfig`` section (``roll/configs/worker_config.py``) whose
``strategy_args.strategy_name`` picks the engine and whose
``strategy_args.strategy_config`` holds its settings; for Megatron that dict
goes straight into mcore_adapter's ``TrainingArguments``
(``roll/distributed/strategy/megatron_strategy.py:107``).

Every worker of a role is a Ray actor whose own ``env_vars`` carry
``CLUSTER_NAME=<the cluster's name>`` with the role's ``system_envs`` on top
(``roll/distributed/executor/cluster.py:127-142``), so each role gets one
exact process rule on ``CLUSTER_NAME``, named as ROLL names the cluster
(``_cluster_name``). Names are exact because one can begin another
(``reward-math`` and ``reward-math_rule``). The driver and ROLL's CPU-only
actors (schedulers, env managers, rule-based reward workers) run no GPU
engine: they are ``others`` with no role, and keep what they inherit. A
section whose cluster the pipeline never creates is ``omitted``, with why
(``_not_started``).

ROLL never sets CUDA_DEVICE_MAX_CONNECTIONS for Megatron (its SGLang patches
set 4 inside the SGLang process, ``roll/third_party/sglang/*/engine.py``),
so a value in ``system_envs`` is the user's, and nothing is replaced. (Its
driver picks a platform from its own GPU, ``roll/platforms/__init__.py``;
that sets nothing for this variable either.)
ROLL builds Megatron-Core models through mcore_adapter and never runs
Megatron-LM's ``validate_args``: every row is a preference.
"""

from __future__ import annotations

import ast
import json
import os
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ..errors import FieldValueError
from ..engines import (
    DISPATCHER_TYPE_KEY, ENABLE_DEEPEP_KEY, FLEX_BACKEND_KEY, FSDP, INFERENCE, MEGATRON,
    MOE_OVERLAP_KEY, SIZE_KEYS,
)
from ..names import CONNECTIONS_VARIABLE, FIELD
from ..spec import Engine, ProcessRule, Spec
from ..megatron_core import read_dispatcher
from ..values import (
    fail_type, lookup, optional_flag, parse_connections, read_flag, read_name, read_size,
    read_token,
)
from .chain import load_link
from .reader import Reader


FRAMEWORK = "roll"
MARKER_VARIABLE = "CLUSTER_NAME"

# strategy_name -> (the engine name this package knows, kind): the names
# roll/distributed/strategy/factory.py creates a strategy for.
STRATEGIES: Dict[str, Tuple[str, str]] = {
    "megatron_train": ("megatron", MEGATRON),
    "megatron_infer": ("megatron", MEGATRON),
    "fsdp2_train": ("fsdp2", FSDP),
    "fsdp2_infer": ("fsdp2", FSDP),
    "vllm": ("vllm", INFERENCE),
    "sglang": ("sglang", INFERENCE),
    "hf_infer": ("hf", INFERENCE),
}
# factory.py's mock strategy runs no model: no engine.
NO_ENGINE = ("mock_infer",)
# StrategyArguments.strategy_name's default (worker_config.py:23-36).
DEFAULT_STRATEGY = "fsdp2_train"

# strategy_config keys mcore_adapter's TrainingArguments reads
# (mcore_adapter/src/mcore_adapter/training_args.py): the sizes
# (engines.SIZE_KEYS) default None, which leaves Megatron-Core's 1 unless a
# Megatron checkpoint says otherwise; the dispatcher type.
DISPATCHER_KEY = DISPATCHER_TYPE_KEY  # allgather (default) or alltoall
# strategy_config.additional_configs (a dict, or a JSON file's path): mcore_adapter's
# McaModelConfig.update_with_args (models/model_config.py:137-160) sets each key
# on the model's TransformerConfig, then every DistributingParallelArguments
# field that strategy_config gives (not None) over it. So a size there counts
# only where strategy_config leaves it None; the dispatcher type (a field
# with the default "allgather") never; the MoE A2A overlap flag and the flex
# backend keys (no such fields) always. Its pipeline_model_parallel_comm_backend
# never reaches initialize_model_parallel (mcore_adapter/initialize.py passes
# only the sizes), so Megatron-Core's UCC assert never sees it: not read.
ADDITIONAL = "additional_configs"
# vLLM's TP size (worker_config.py:285), read for the nccl-fabric pack.
VLLM_TP_KEY = "tensor_parallel_size"

# (role, cluster name) of the fixed sections: PPOConfig.__post_init__
# (base_config.py:650-653), AgenticConfig (agentic_config.py:294-295: the
# reward keeps a name of its own), DPOConfig, SFTConfig, DistillConfig
# (distill_config.py:134-135).
FIXED = (("actor_train", "actor_train"), ("actor_infer", "actor_infer"),
         ("reference", "reference"), ("critic", "critic"), ("reward", "reward"),
         ("sft_train", "sft_train"), ("student", "student"))
OPD_STUDENT = (("student_train", "student_train"), ("student_infer", "student_infer"))
REWARDS = "rewards"          # RLVRConfig.rewards: key -> cluster "reward-<key>"
REWARD_MODEL = "reward_model"  # RLVRConfig.reward_model: cluster named by its own name
REWARD = "reward"            # AgenticConfig.reward: its name, else "reward"
TEACHER = "teacher"
ROLES = (*(role for role, _ in FIXED), *(role for role, _ in OPD_STUDENT), REWARD_MODEL,
         f"{REWARDS}.<key>", TEACHER, f"{TEACHER}.<name>")
# BaseConfig.__post_init__ (base_config.py:354-366) copies the top-level
# system_envs into these roles' (and OPD's teachers') where they lack a key.
INHERIT_SYSTEM_ENVS = ("actor_train", "actor_infer", "reference", "critic", "student_train",
                       "student_infer")

# PPOConfig's switches for which roles start (base_config.py:548-577, 654-656):
# the reference when enable_reference, use_kl_loss, or init_kl_coef > 0
# (default 0.2); the critic when adv_estimator == "gae" (the default).
KL_KEYS = ("enable_reference", "use_kl_loss", "init_kl_coef")
INIT_KL_DEFAULT = 0.2
ADV_ESTIMATOR = "adv_estimator"
GAE = "gae"
LORA = "actor_train.model_args.lora_target"
# AgenticConfig's own sections; an RLVR config has none of them.
AGENTIC_KEYS = ("custom_envs", "train_env_manager", "val_env_manager")

# WorkerConfig fields: a ``teacher`` mapping with one of them is one teacher,
# otherwise a dict of named teachers (PPOConfig.teacher's Union).
_WORKER_KEYS = ("strategy_args", "model_args", "device_mapping", "training_args",
                "generating_args", "data_args", "worker_cls", "world_size", "system_envs",
                "infer_batch_size", "name", "num_gpus_per_worker")

_SECTION_KEYS = ("strategy_args", "system_envs")
PATHS: Tuple[str, ...] = (
    *(f"{role}.{key}" for role, _ in (*FIXED, *OPD_STUDENT) for key in _SECTION_KEYS),
    *(f"{role}.{key}" for role in (REWARD, REWARD_MODEL) for key in ("name", "device_mapping")),
    *(f"{REWARD_MODEL}.{key}" for key in _SECTION_KEYS),
    REWARDS, TEACHER, "system_envs", "is_pure_opd", "use_opd", *KL_KEYS, ADV_ESTIMATOR, LORA,
)
MARKERS = ("actor_train.strategy_args", "actor_infer.strategy_args",
           "student_train.strategy_args", "student.strategy_args", "sft_train.strategy_args")


def read_roll(config: Mapping[str, Any]) -> Spec:
    """Engines and per-role process rules of a composed ROLL config."""
    top_envs = config.get("system_envs")
    _check_user_value(top_envs, "system_envs")
    sections, omitted = _sections(config)
    # OPD's teachers get the top-level system_envs too (as _reference_configs);
    # a DistillConfig has no actor_train, so BaseConfig copies nothing there.
    inherits = () if config.get("student") is not None else (
        *INHERIT_SYSTEM_ENVS, *(role for role in sections if role.split(".")[0] == TEACHER))
    engines: Dict[str, Engine] = {}
    names: Dict[str, str] = {}
    for role, (section, cluster) in sections.items():
        engine = _engine(section, role)
        if engine is None:
            continue  # no strategy_args: a CPU worker (rule-based rewards), no engine
        cluster = _cluster_name(section, role, cluster, top_envs, inherits)
        if cluster in names.values():
            other = next(r for r, c in names.items() if c == cluster)
            raise FieldValueError(f"{FIELD}: {other} and {role} would both be ROLL cluster "
                                  f"{cluster!r} ({MARKER_VARIABLE}); rename one")
        engines[role] = engine
        names[role] = cluster
    processes = tuple(
        ProcessRule((role,), MARKER_VARIABLE,
                    read_token(names[role], f"{role}'s cluster name ({MARKER_VARIABLE})"),
                    exact=True)
        for role in sorted(engines))
    return Spec.of(engines, framework=FRAMEWORK, omitted=omitted, processes=processes,
                   others=() if processes else None)


def _cluster_name(section: Mapping[str, Any], role: str, cluster: str, top_envs: Any,
                  inherits: Tuple[str, ...]) -> str:
    """The CLUSTER_NAME the role's workers carry: Cluster puts the cluster's
    name in their env_vars and then the role's system_envs over it
    (cluster.py:135-142), so a CLUSTER_NAME there (the role's own, or the
    top-level one ROLL copies into the role) is the one they carry."""
    own = section.get("system_envs") or {}
    if MARKER_VARIABLE in own:
        return read_token(own[MARKER_VARIABLE], f"{role}.system_envs.{MARKER_VARIABLE}")
    if role in inherits and isinstance(top_envs, Mapping) and MARKER_VARIABLE in top_envs:
        return read_token(top_envs[MARKER_VARIABLE], f"system_envs.{MARKER_VARIABLE}")
    return cluster


def _number(config: Mapping[str, Any], key: str, default: float) -> float:
    value = config.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise fail_type(key, "a number", value)
    return value


def _sections(config: Mapping[str, Any]
              ) -> Tuple[Dict[str, Tuple[Mapping[str, Any], str]], Dict[str, str]]:
    """Role -> (its section, the cluster name ROLL gives it), and role -> why
    a section present is not started under its own name."""
    out: Dict[str, Tuple[Mapping[str, Any], str]] = {}
    omitted: Dict[str, str] = {}

    def take(role: str, cluster: str) -> None:
        section = config.get(role)
        if section is None:
            return
        if not isinstance(section, Mapping):
            raise fail_type(role, "a mapping (a ROLL WorkerConfig section)", section)
        out[role] = (section, cluster)

    distill = config.get("student") is not None  # DistillConfig: student + teacher
    # start_onpolicy_distill_pipeline.py forces is_pure_opd; its configs have
    # student_train/student_infer, which PPOConfig maps onto actor_train/actor_infer
    # (base_config.py _handle_opd_mapping).
    pure_opd = not distill and (optional_flag(config, "is_pure_opd")
                                or config.get("student_train") is not None)
    opd = pure_opd or (not distill and optional_flag(config, "use_opd"))
    # RLVRPipeline and AgenticPipeline (a PPOConfig with an inference role);
    # DPO, SFT and distillation start every section they have.
    ppo = not distill and (opd or config.get("actor_infer") is not None)
    agentic = ppo and any(key in config for key in AGENTIC_KEYS)
    for role, cluster in FIXED:
        if pure_opd and role in ("actor_train", "actor_infer") and config.get(role) is not None:
            omitted[role] = f"pure OPD: student_{role.split('_')[1]} runs instead"
            continue
        if opd and role == "reference" and config.get(role) is not None:
            omitted[role] = "OPD: the teacher runs as the reference"
            continue
        why = _not_started(config, role, ppo, agentic, pure_opd) \
            if config.get(role) is not None else None
        if why:
            omitted[role] = why
            continue
        if role == REWARD and agentic and isinstance(config.get(role), Mapping):
            name = config[role].get("name")
            cluster = cluster if name is None else read_name(name, f"{REWARD}.name")
        take(role, cluster)
    if pure_opd:
        for role, cluster in OPD_STUDENT:
            take(role, cluster)
    if distill:
        take(TEACHER, "teacher")
    elif config.get(TEACHER) is not None:
        if opd:
            out.update(_teachers(config[TEACHER]))
        else:
            omitted[TEACHER] = "read only with is_pure_opd or use_opd"
    rewards = config.get(REWARDS)
    if rewards is not None:
        if not isinstance(rewards, Mapping):
            raise fail_type(REWARDS, "a mapping of reward name -> WorkerConfig", rewards)
        for key, section in rewards.items():
            role = f"{REWARDS}.{key}"
            if not isinstance(section, Mapping):
                raise fail_type(role, "a mapping (a ROLL RewardConfig section)", section)
            if agentic:
                omitted[role] = "the agentic pipeline starts no rewards clusters"
                continue
            out[role] = (section, f"reward-{key}")  # rlvr_pipeline.py:233
    model = config.get(REWARD_MODEL)
    if model is not None:
        if not isinstance(model, Mapping):
            raise fail_type(REWARD_MODEL, "a mapping (a ROLL WorkerConfig section)", model)
        if agentic:
            omitted[REWARD_MODEL] = "the agentic pipeline starts no reward_model cluster"
        elif not _devices(model, REWARD_MODEL):
            # rlvr_pipeline.py:245-256: only with a non-empty device_mapping
            omitted[REWARD_MODEL] = (f"{REWARD_MODEL}.device_mapping is empty: RLVRPipeline "
                                     "starts no reward model cluster")
        elif model.get("strategy_args") is not None:
            # rlvr_pipeline.py:251 names the cluster by reward_model.name, which
            # has no default (WorkerConfig.name is None).
            name = model.get("name")
            if name is None:
                raise FieldValueError(f"{FIELD}: {REWARD_MODEL}.name is missing; ROLL names "
                                      "the reward model's cluster by it (CLUSTER_NAME)")
            out[REWARD_MODEL] = (model, read_name(name, f"{REWARD_MODEL}.name"))
    for role, (section, _) in out.items():
        _check_user_value(section.get("system_envs"), f"{role}.system_envs")
    return out, omitted


def _not_started(config: Mapping[str, Any], role: str, ppo: bool, agentic: bool,
                 pure_opd: bool) -> Optional[str]:
    """Why a PPO pipeline never creates this fixed section's cluster, or None."""
    if not ppo:
        return None
    if role == "reference":
        kl = optional_flag(config, "enable_reference") or optional_flag(config, "use_kl_loss") \
            or _number(config, "init_kl_coef", INIT_KL_DEFAULT) > 0
        if not kl:
            return ("enable_reference is off: use_kl_loss is false and init_kl_coef is 0 "
                    "(PPOConfig.__post_init__)")
        found, lora = lookup(config, LORA, strict=False)
        if agentic and found and lora is not None:
            # AgenticPipeline (agentic_pipeline.py:53-62): LoRA's reference is
            # the actor itself. RLVRPipeline does the same, but RLVRVLMPipeline,
            # on the same config class, starts it: an RLVR config keeps it.
            return f"LoRA ({LORA}): the agentic pipeline uses the actor as the reference"
        return None
    if role == "critic":
        estimator = "reinforce" if pure_opd else config.get(ADV_ESTIMATOR)
        estimator = GAE if estimator is None else read_name(estimator, ADV_ESTIMATOR)
        if estimator != GAE:
            return f"{ADV_ESTIMATOR} is {estimator!r}: the critic runs only for 'gae'"
        return None
    if role == REWARD:
        if not agentic:
            return "RLVRPipeline starts no 'reward' cluster (its rewards are rewards.<key>)"
        section = config[role]
        if isinstance(section, Mapping) and section.get("device_mapping") is None:
            raise FieldValueError(
                f"{FIELD}: {REWARD}.device_mapping is missing; ROLL's AgenticPipeline takes its "
                "length (agentic_pipeline.py:115-118) and fails without it: give the reward "
                "model's GPUs, or remove the reward section")
        if not _devices(section, REWARD):
            # agentic_pipeline.py:115-125: only with a non-empty device_mapping
            return f"{REWARD}.device_mapping is empty: AgenticPipeline starts no reward cluster"
    return None


def _devices(section: Any, role: str) -> bool:
    """Whether the section's device_mapping names any device: ROLL evaluates
    the string (WorkerConfig.__post_init__: ``eval(device_mapping)``); its
    examples write ``list(range(a,b))``, ``[0, 1]`` and sums of them. A form
    beyond those counts as naming devices: the role is then listed, which
    only costs a rule no worker matches."""
    mapping = section.get("device_mapping") if isinstance(section, Mapping) else None
    if mapping is None:
        return False
    if isinstance(mapping, (list, tuple)):
        return bool(mapping)
    try:
        return _count(ast.parse(str(mapping).strip(), mode="eval").body) > 0
    except (SyntaxError, ValueError, TypeError):
        return True


def _count(node: ast.AST) -> int:
    """How many devices a device_mapping expression names."""
    if isinstance(node, (ast.List, ast.Tuple)):
        return len(node.elts)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _count(node.left) + _count(node.right)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
        if node.func.id in ("list", "tuple") and len(node.args) == 1:
            return _count(node.args[0])
        if node.func.id == "range" and 1 <= len(node.args) <= 3:
            return len(range(*(_integer(arg) for arg in node.args)))
    raise ValueError("not a device list")


def _integer(node: ast.AST) -> int:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_integer(node.operand)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    raise ValueError("not an integer")


def _teachers(value: Any) -> Dict[str, Tuple[Mapping[str, Any], str]]:
    """OPD's teachers: one WorkerConfig (cluster "teacher"), or name ->
    WorkerConfig (clusters "teacher-<name>", or "teacher" when there is one),
    base_config.py _apply_opd_config."""
    if not isinstance(value, Mapping):
        raise fail_type(TEACHER, "a mapping (a WorkerConfig, or name -> WorkerConfig)", value)
    if any(key in value for key in _WORKER_KEYS):
        return {TEACHER: (value, "teacher")}
    many = len(value) > 1
    out = {}
    for name, section in value.items():
        role = f"{TEACHER}.{name}"
        if not isinstance(section, Mapping):
            raise fail_type(role, "a mapping (a ROLL WorkerConfig section)", section)
        out[role] = (section, f"teacher-{name}" if many else "teacher")
    return out


def _check_user_value(envs: Any, key: str) -> None:
    """A value in system_envs reaches that role's workers as the user's own."""
    if envs is None:
        return
    if not isinstance(envs, Mapping):
        raise fail_type(key, "a mapping of environment variables", envs)
    if CONNECTIONS_VARIABLE in envs:
        parse_connections(envs[CONNECTIONS_VARIABLE], f"{key}.{CONNECTIONS_VARIABLE}")


def _engine(section: Mapping[str, Any], role: str) -> Optional[Engine]:
    args = section.get("strategy_args")
    if args is None:
        return None  # WorkerConfig.strategy_args defaults to None: no strategy
    key = f"{role}.strategy_args"
    if not isinstance(args, Mapping):
        raise fail_type(key, "a mapping with strategy_name and strategy_config", args)
    unknown = sorted(str(k) for k in args if k not in ("strategy_name", "strategy_config"))
    if unknown:
        raise FieldValueError(f"{FIELD}: unknown key(s) {', '.join(map(repr, unknown))} in "
                              f"{key}; ROLL's StrategyArguments has strategy_name and "
                              "strategy_config")
    name = args.get("strategy_name")
    name = DEFAULT_STRATEGY if name is None else read_name(name, f"{key}.strategy_name")
    if name in NO_ENGINE:
        return None
    if name not in STRATEGIES:
        hint = (" (DeepSpeed strategies are gone from ROLL's strategy factory; write the role "
                "in the compact form with its kind)" if name.startswith("deepspeed") else "")
        raise FieldValueError(f"{FIELD}: {key}.strategy_name is {name!r}; ROLL's strategies "
                              f"are {', '.join((*STRATEGIES, *NO_ENGINE))}{hint}")
    strategy, kind = STRATEGIES[name]
    settings = args.get("strategy_config")
    settings = {} if settings is None else settings  # StrategyArguments.__post_init__
    where = f"{key}.strategy_config"
    if not isinstance(settings, Mapping):
        raise fail_type(where, "a mapping", settings)
    if kind == INFERENCE:
        tp = settings.get(VLLM_TP_KEY) if name == "vllm" else None
        return Engine(strategy, kind, tensor_parallel=1 if tp is None
                      else read_size(tp, f"{where}.{VLLM_TP_KEY}"))
    if kind != MEGATRON:
        return Engine(strategy, kind)
    extra, extra_key = _additional(settings.get(ADDITIONAL), f"{where}.{ADDITIONAL}")
    sizes = {}
    for attr, k in SIZE_KEYS:
        if settings.get(k) is not None:
            sizes[attr] = read_size(settings[k], f"{where}.{k}")
        elif extra.get(k) is not None:
            sizes[attr] = read_size(extra[k], f"{extra_key}.{k}")
    dispatcher = read_dispatcher(settings.get(DISPATCHER_KEY), extra.get(FLEX_BACKEND_KEY),
                                 extra.get(ENABLE_DEEPEP_KEY),
                                 (f"{where}.{DISPATCHER_KEY}", f"{extra_key}.{FLEX_BACKEND_KEY}",
                                  f"{extra_key}.{ENABLE_DEEPEP_KEY}"))
    flags = {}
    if extra.get(MOE_OVERLAP_KEY) is not None:
        flags["moe_overlap"] = read_flag(extra[MOE_OVERLAP_KEY], f"{extra_key}.{MOE_OVERLAP_KEY}")
    return Engine(strategy, kind, dispatcher=dispatcher, **sizes, **flags)


def _additional(value: Any, key: str) -> Tuple[Mapping[str, Any], str]:
    """strategy_config.additional_configs: a mapping, or the path of a JSON
    file holding one (TrainingArguments.__post_init__ loads it), read here
    when this machine has it; (the mapping, where to say it came from)."""
    if value is None:
        return {}, key
    if isinstance(value, str):
        try:
            with open(value, encoding="utf-8") as handle:
                loaded = json.load(handle)
        except (OSError, ValueError) as exc:
            raise FieldValueError(
                f"{FIELD}: {key} names {value!r}, which cannot be read here ({exc}); mcore_adapter "
                "loads it on each worker: write its keys into the config instead") from None
        value, key = loaded, f"{key} ({value})"
    if not isinstance(value, Mapping):
        raise fail_type(key, "a mapping of Megatron-Core TransformerConfig keys", value)
    return value, key


# --- Composing the YAML as ROLL's entry points do -----------------------------------

DEFAULTS = "defaults"
_HERE = "@_here_"
_MAX_DEPTH = 8  # files below the one given


def compose(path: str, loaded: Any) -> Optional[Any]:
    """A ROLL YAML as Hydra composes it, or None when its ``defaults:`` is not
    ROLL's kind. ROLL's examples use only ``- <relative path>@_here_``
    entries (a file merged at the config's own level, e.g.
    ``../config/traj_envs@_here_``) and ``_self_``; without ``_self_`` the
    file's own keys come last, as in Hydra 1.1 and later."""
    entries = _entries(loaded)
    if entries is None:
        return None
    return _compose(loaded, entries, os.path.dirname(os.path.abspath(path)),
                    [os.path.abspath(path)])


def _entries(loaded: Any) -> Optional[List[str]]:
    from omegaconf import DictConfig, ListConfig

    if not isinstance(loaded, DictConfig) or DEFAULTS not in loaded:
        return None
    raw = loaded._get_node(DEFAULTS)
    if not isinstance(raw, ListConfig):
        return None
    entries = list(raw)
    if not all(isinstance(e, str) and (e.endswith(_HERE) or e == "_self_") for e in entries):
        return None
    if not any(e.endswith(_HERE) for e in entries):
        return None
    return entries


def _compose(config: Any, entries: List[str], folder: str, chain: List[str]) -> Any:
    from omegaconf import OmegaConf

    own = config.copy()
    own.pop(DEFAULTS)
    own.pop("hydra", None)  # Hydra's own settings; not in the composed config
    if "_self_" not in entries:
        entries = entries + ["_self_"]
    merged = OmegaConf.create({})
    for entry in entries:
        if entry == "_self_":
            merged = OmegaConf.merge(merged, own)
            continue
        target = os.path.normpath(os.path.join(folder, entry[:-len(_HERE)] + ".yaml"))
        merged = OmegaConf.merge(merged, _load(target, entry, chain))
    return merged


def _load(path: str, entry: str, chain: List[str]) -> Any:
    shown = " -> ".join(chain + [path])
    loaded = load_link(path, chain, _MAX_DEPTH + 1, entry)
    if DEFAULTS not in loaded:
        loaded.pop("hydra", None)
        return loaded
    entries = _entries(loaded)
    if entries is None:
        raise FieldValueError(f"{FIELD}: {path!r} has a defaults: list that is not ROLL's "
                              f"'<path>@_here_' form (chain: {shown})")
    return _compose(loaded, entries, os.path.dirname(path), chain + [path])


READER = Reader(
    name=FRAMEWORK,
    markers=MARKERS,
    read=read_roll,
    roles=ROLES,
    paths=PATHS,
    compose=compose,
)
