"""Reading slime's training arguments into a ``Spec``.

slime (THUDM/slime) is configured entirely on the command line of its job
driver, ``train.py``: its own flags (``--actor-num-nodes``,
``--rollout-num-gpus-per-engine``, ...), SGLang's (``--sglang-*``) and
Megatron-LM's (``--tensor-model-parallel-size``, ...), all parsed into one
flat ``argparse.Namespace`` (``slime/utils/arguments.py``, ``parse_args``).
This reader takes that namespace, its ``vars()`` dict, or the argument list
itself, and reads only the keys in ``PATHS``.

Three things decide what it returns:

- ``parse_args`` runs Megatron-LM's ``validate_args`` on the driver when
  ``train_backend == "megatron"`` and not ``debug_rollout_only``
  (``slime/utils/arguments.py`` lines 1635-1638 @ 624b824a;
  ``slime/backends/megatron_utils/arguments.py:79``), so the train engines
  carry the ``megatron-lm`` check: its asserts make "1" (TP/CP > 1 before
  Blackwell) and "not 1" (FSDP) required, not preferred.
- The SGLang engine actors carry env vars in their own ``runtime_env`` that
  no other slime process has (``slime/ray/rollout.py``, the ``env_vars`` of
  ``RolloutRayActor.options``), so one job-level env gives them the
  inference value and everything else (the driver, the Megatron train
  actors) the Megatron one.
- Which processes exist at all: ``--debug-rollout-only`` starts no train
  actors, ``--debug-train-only`` (or ``--load-debug-rollout-data``), external
  engines or ``--rollout-num-gpus 0`` start no SGLang engines, and a critic
  exists only with ``--advantage-estimator ppo`` (``slime_validate_args``:
  ``use_critic = advantage_estimator == "ppo"``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import warnings
from typing import Any, Dict, Mapping, NoReturn, Optional, Sequence, Tuple

from ..errors import FieldValueError
from ..engines import (
    DISPATCHER_KEYS, DISPATCHER_TYPE_KEY, ENABLE_DEEPEP_KEY, FLEX_BACKEND_KEY, FSDP, INFERENCE,
    MEGATRON, MEGATRON_LM_CHECK, MOE_OVERLAP_KEY, PIPELINE_BACKEND_KEY, SIZE_KEYS,
)
from ..names import CONNECTIONS_VARIABLE, FIELD
from ..spec import Engine, ProcessRule, Spec
from ..megatron_core import read_dispatcher, read_pipeline_backend
from ..values import fail_type, optional_flag, parse_connections, read_flag, read_name, read_size
from .reader import Reader

NAME = "slime"
ROLES = ("actor", "critic", "rollout")
TRAIN_ROLES = ("actor", "critic")

# slime's own cluster flags (``add_cluster_arguments``): every slime
# namespace has them, plain Megatron-LM's and other frameworks' have none.
MARKERS = ("actor_num_nodes", "actor_num_gpus_per_node", "rollout_num_gpus_per_engine",
           "rollout_num_gpus")

# The train backends slime has had: megatron always; fsdp from its
# introduction until "Remove FSDP support (#1664)" (e4faf633, 2026-03-04).
BACKENDS = {"megatron": MEGATRON, "fsdp": FSDP}

# (engine setting, key) for the Megatron-LM flags that matter. Sizes
# (engines.SIZE_KEYS) must be there (any slime namespace has them); flags may be absent, because older
# Megatron-LM releases do not define them (use_megatron_fsdp and
# overlap_moe_expert_parallel_comm came in core 0.14; use_custom_fsdp is the
# older name that 0.14 and later still set alongside).
FLAG_KEYS = (
    ("torch_fsdp2", "use_torch_fsdp2"),
    ("megatron_fsdp", "use_megatron_fsdp"),
    ("megatron_fsdp", "use_custom_fsdp"),
    ("moe_overlap", MOE_OVERLAP_KEY),
)

# A variable slime puts in the SGLang engine actors' own runtime_env and in no
# other process's: ``slime/ray/rollout.py`` (``RolloutRayActor.options(
# runtime_env={"env_vars": ...})``, default "true", since v0.2.0). It is the
# legacy ``SGL_`` spelling of an SGLang switch, which nobody has a reason to
# set job-wide (a job-level value would reach every process and make them all
# look like SGLang engines).
SGLANG_VARIABLE = "SGL_DISABLE_TP_MEMORY_INBALANCE_CHECK"
SGLANG_PREFIX = "true"
# miles (radixark/miles, a slime fork read at 31f1ca96) puts SGLang's newer
# switch in its engines' env_vars instead, "false" unless the launching
# process has a value of its own (miles/ray/rollout/server_group.py, the
# env_vars of RolloutRayActor.options; since 75d3c8b4, 2026-06-17, before
# which miles set slime's variable too). Matched exactly: a job-wide "true"
# (one miles example sets it) never makes a train process look like an engine.
MILES_SGLANG_VARIABLE = "SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK"
MILES_SGLANG_VALUE = "false"
# How a config is known to be miles': its parse_args always defines
# --use-miles-router (add_router_arguments, miles/utils/arguments.py:1874;
# slime's is --use-slime-router), so every miles namespace has this key. No
# miles-only option is in every launch, so an argument list is miles' when
# it holds that option or any --miles-* one, or when it starts with the
# driver miles' launches run: execute_train submits `python3
# <checkout>/train.py <model args> <train args>` (miles/utils/external_utils/
# command_utils.py:229-238), the shell launchers `python3 train.py ...`, and
# miles' drivers (train.py, train_async.py, train_multi_lora_async.py) import
# the miles package, which slime's never do.
MILES_KEY = "use_miles_router"
_INTERPRETER = re.compile(r"^(?:.*/)?python[0-9.]*$")
_IMPORTS_MILES = re.compile(r"^\s*(?:from|import)\s+miles(?:[.\s]|$)", re.MULTILINE)
MILES = "miles"
# miles' Python launchers (execute_train, miles/utils/external_utils/
# command_utils.py:193-202) write "1" into the job's env_vars for every
# Megatron job: miles' own, decided anew unless the user also wrote "1" in
# --train-env-vars (which miles puts in its train actors' env_vars,
# miles/ray/train/actor_factory.py:38), where it could be theirs.
MILES_VALUE = "1"
TRAIN_ENV_VARS = "train_env_vars"
# Both put NVTE_FP8_BLOCK_SCALING_FP32_SCALES into every train actor's env_vars
# (slime/ray/actor_group.py: os.environ.get(..., "1"); miles/ray/train/actor_factory.py:
# the default from the driver's GPU, "1" without one), then --train-env-vars over it: their
# "1" unless --train-env-vars sets the variable (the te-fp8-scales pack decides it anew).
FP8_SCALES_VARIABLE = "NVTE_FP8_BLOCK_SCALING_FP32_SCALES"
FP8_SCALES_VALUE = "1"

# (key, option, argparse settings): the options this reader reads, as slime
# and Megatron-LM define them. Types and defaults are theirs, so that an
# argument list reads as slime's ``parse_args`` would read it.
_OPTIONS: Tuple[Tuple[str, str, Dict[str, Any]], ...] = (
    # slime (slime/utils/arguments.py, slime/backends/sglang_utils/arguments.py)
    ("actor_num_nodes", "--actor-num-nodes", {"type": int, "default": 1}),
    ("actor_num_gpus_per_node", "--actor-num-gpus-per-node", {"type": int, "default": 8}),
    ("rollout_num_gpus", "--rollout-num-gpus", {"type": int, "default": None}),
    ("rollout_num_gpus_per_engine", "--rollout-num-gpus-per-engine",
     {"type": int, "default": 1}),
    ("colocate", "--colocate", {"action": "store_true", "default": False}),
    ("train_backend", "--train-backend", {"default": "megatron"}),
    ("debug_rollout_only", "--debug-rollout-only", {"action": "store_true", "default": False}),
    ("debug_train_only", "--debug-train-only", {"action": "store_true", "default": False}),
    ("load_debug_rollout_data", "--load-debug-rollout-data", {"default": None}),
    ("rollout_external_engine_addrs", "--rollout-external-engine-addrs",
     {"nargs": "+", "default": None}),
    ("sglang_config", "--sglang-config", {"default": None}),
    ("advantage_estimator", "--advantage-estimator", {"default": "grpo"}),
    ("num_rollout", "--num-rollout", {"type": int, "default": None}),
    ("megatron_config_path", "--megatron-config-path", {"default": None}),
    # slime and miles: JSON env vars for the train actors (type json.loads)
    (TRAIN_ENV_VARS, "--train-env-vars", {"type": json.loads, "default": None}),
    # Megatron-LM (megatron/training/arguments.py)
    ("tensor_model_parallel_size", "--tensor-model-parallel-size", {"type": int, "default": 1}),
    ("context_parallel_size", "--context-parallel-size", {"type": int, "default": 1}),
    ("expert_model_parallel_size", "--expert-model-parallel-size", {"type": int, "default": 1}),
    ("use_torch_fsdp2", "--use-torch-fsdp2", {"action": "store_true", "default": False}),
    ("use_megatron_fsdp", "--use-megatron-fsdp", {"action": "store_true", "default": False}),
    ("use_custom_fsdp", "--use-custom-fsdp", {"action": "store_true", "default": False}),
    (MOE_OVERLAP_KEY, "--overlap-moe-expert-parallel-comm",
     {"action": "store_true", "default": False}),
    (DISPATCHER_TYPE_KEY, "--moe-token-dispatcher-type", {"default": "allgather"}),
    (FLEX_BACKEND_KEY, "--moe-flex-dispatcher-backend", {"default": "deepep"}),
    (ENABLE_DEEPEP_KEY, "--moe-enable-deepep", {"action": "store_true", "default": False}),
    (PIPELINE_BACKEND_KEY, "--pipeline-model-parallel-comm-backend",
     {"default": None}),
)
# The MoE dispatcher and the pipeline backend (engines' DISPATCHER_KEYS and
# PIPELINE_BACKEND_KEY), which slime passes straight to Megatron-LM
# (megatron/training/arguments.py, then TransformerConfig and
# initialize_model_parallel).
_MEGATRON_KEYS = ({key for _, key in SIZE_KEYS} | {key for _, key in FLAG_KEYS}
                  | set(DISPATCHER_KEYS) | {PIPELINE_BACKEND_KEY})
# Options only slime defines: one of them is what makes a list slime's.
_SLIME_OPTIONS = {option: key for key, option, _ in _OPTIONS if key not in _MEGATRON_KEYS}

PATHS: Tuple[str, ...] = tuple(key for key, _, _ in _OPTIONS) + (MILES_KEY,)


def read_slime(config: Mapping[str, Any]) -> Spec:
    """Engines and process rules of slime's parsed arguments (a flat mapping)."""
    omitted: Dict[str, str] = {}
    engines: Dict[str, Engine] = {}
    if optional_flag(config, "debug_rollout_only"):
        for role in TRAIN_ROLES:
            omitted[role] = "debug_rollout_only: slime starts no train actors"
    else:
        train = _train_engine(config)
        _warn_about_role_overrides(config)
        engines["actor"] = train
        if _uses_critic(config):
            # The critic is built from a copy of the same arguments
            # (slime/ray/placement_group.py, create_training_models).
            engines["critic"] = train
    why_no_rollout = _no_rollout(config)
    if why_no_rollout:
        omitted["rollout"] = why_no_rollout
    else:
        engines["rollout"] = Engine("sglang", INFERENCE)
    train_roles = tuple(role for role in TRAIN_ROLES if role in engines)
    processes: Tuple[ProcessRule, ...] = ()
    others: Optional[Tuple[str, ...]] = None
    if "rollout" in engines and train_roles:
        # The driver (where validate_args runs), the train actors and slime's
        # CPU-only helpers match no rule: they get the Megatron decision.
        processes = (ProcessRule(("rollout",), SGLANG_VARIABLE, SGLANG_PREFIX),
                     ProcessRule(("rollout",), MILES_SGLANG_VARIABLE, MILES_SGLANG_VALUE,
                                 exact=True))
        others = train_roles
    miles = MILES_KEY in config
    user_value = _train_env_value(config.get(TRAIN_ENV_VARS))
    # execute_train writes its "1" unless --train-backend fsdp, whichever
    # processes the arguments start.
    backend = config.get("train_backend")
    megatron = backend is None or BACKENDS.get(read_name(backend, "train_backend")) == MEGATRON
    replaces = MILES_VALUE if miles and megatron and user_value != MILES_VALUE else None
    return Spec.of(engines, framework=MILES if miles else NAME, omitted=omitted,
                   processes=processes, others=others, replaces=replaces,
                   framework_env=_fp8_scales(config, train_roles))


def _fp8_scales(config: Mapping[str, Any], train_roles: Tuple[str, ...]) -> Dict[str, str]:
    """The train actors' own NVTE_FP8_BLOCK_SCALING_FP32_SCALES, where the
    framework writes it (train actors exist, --train-env-vars leaves it)."""
    given = config.get(TRAIN_ENV_VARS)
    if not train_roles or (isinstance(given, Mapping) and FP8_SCALES_VARIABLE in given):
        return {}
    return {FP8_SCALES_VARIABLE: FP8_SCALES_VALUE}


def _train_env_value(env: Any) -> Optional[str]:
    """The user's own value for the train actors (--train-env-vars), checked."""
    if env is None:
        return None
    if not isinstance(env, Mapping):
        raise fail_type(TRAIN_ENV_VARS, "a JSON object of environment variables", env)
    if CONNECTIONS_VARIABLE not in env:
        return None
    parse_connections(env[CONNECTIONS_VARIABLE], f"{TRAIN_ENV_VARS}.{CONNECTIONS_VARIABLE}")
    return env[CONNECTIONS_VARIABLE]


def _train_engine(config: Mapping[str, Any]) -> Engine:
    backend = config.get("train_backend")
    backend = "megatron" if backend is None else read_name(backend, "train_backend")
    kind = BACKENDS.get(backend)
    if kind is None:
        raise FieldValueError(
            f"{FIELD}: train_backend {backend!r} is not a slime train backend; slime has "
            "megatron (and, before e4faf633 of 2026-03-04, fsdp)")
    if kind != MEGATRON:
        return Engine(backend, kind)
    missing = [key for _, key in SIZE_KEYS if config.get(key) is None]
    if missing:
        raise FieldValueError(
            f"{FIELD}: slime's Megatron train engine needs its parallel sizes; looked for "
            f"{', '.join(key for _, key in SIZE_KEYS)}, and {', '.join(missing)} is missing. "
            "Pass slime's whole argument list or vars(args) (both always carry them)")
    settings: Dict[str, Any] = {name: read_size(config[key], key) for name, key in SIZE_KEYS}
    for name, key in FLAG_KEYS:
        value = config.get(key)
        if value is not None and read_flag(value, key):
            settings[name] = True
    settings["dispatcher"] = read_dispatcher(*(config.get(key) for key in DISPATCHER_KEYS),
                                             DISPATCHER_KEYS)
    settings["pipeline_backend"] = read_pipeline_backend(config.get(PIPELINE_BACKEND_KEY),
                                                         PIPELINE_BACKEND_KEY)
    # parse_args runs Megatron-LM's validate_args for this backend (the
    # debug_rollout_only case never gets here).
    return Engine(backend, kind, checks=(MEGATRON_LM_CHECK,), **settings)


def _warn_about_role_overrides(config: Mapping[str, Any]) -> None:
    """``--megatron-config-path`` names a YAML of per-role overrides that
    slime applies to copies of the arguments for the actor and the critic
    train groups (``parse_megatron_role_args``, slime/utils/arguments.py;
    slime/ray/placement_group.py). That file is not read here."""
    path = config.get("megatron_config_path")
    if path is None:
        return
    warnings.warn(
        f"{FIELD}: megatron_config_path {path!r}: its per-role overrides are not read; both "
        "train roles are read from the base arguments (those validate_args checks). If an "
        "override changes a role's tensor/context/expert parallel size or FSDP, write that "
        "role's engine in the compact form (docs/field.md)", UserWarning, stacklevel=2)


def _uses_critic(config: Mapping[str, Any]) -> bool:
    estimator = config.get("advantage_estimator")
    if estimator is None or read_name(estimator, "advantage_estimator") != "ppo":
        return False
    rounds = config.get("num_rollout")
    # create_training_models: a critic only when num_rollout != 0.
    return rounds is None or _count(rounds, "num_rollout") != 0


def _count(value: Any, key: str) -> int:
    """A size that may also be 0 (num_rollout, rollout_num_gpus)."""
    if value == 0 and not isinstance(value, bool):
        return 0
    return read_size(value, key)


def _no_rollout(config: Mapping[str, Any]) -> Optional[str]:
    """Why slime starts no SGLang engine with these arguments, or None."""
    if optional_flag(config, "debug_train_only"):
        return "debug_train_only: slime starts no SGLang engines"
    if config.get("load_debug_rollout_data") is not None:
        return "load_debug_rollout_data: slime trains on saved rollouts, no SGLang engines"
    if config.get("rollout_external_engine_addrs") is not None:
        return "rollout_external_engine_addrs: the SGLang servers run outside this job"
    gpus = config.get("rollout_num_gpus")
    if gpus is not None and _count(gpus, "rollout_num_gpus") == 0 \
            and config.get("sglang_config") is None:
        return "rollout_num_gpus 0: slime starts the router only, no SGLang engines"
    return None


class _Parser(argparse.ArgumentParser):
    """argparse that raises this package's error instead of exiting."""

    def error(self, message: str) -> NoReturn:  # type: ignore[override]
        raise FieldValueError(f"{FIELD}: slime's argument list: {message}")


def _parser() -> argparse.ArgumentParser:
    # allow_abbrev=False as slime and Megatron-LM do, so that an abbreviated
    # or longer look-alike option is never taken for one of these.
    parser = _Parser(add_help=False, allow_abbrev=False)
    for key, option, settings in _OPTIONS:
        parser.add_argument(option, dest=key, **settings)
    return parser


def _is_slime(args: Sequence[str]) -> bool:
    """Whether the list has one of slime's own options (Megatron-LM's alone
    are any Megatron-LM script's, not slime's)."""
    return any(arg.split("=", 1)[0] in _SLIME_OPTIONS for arg in args)


def convert(value: Any) -> Optional[Dict[str, Any]]:
    """slime's argument list -> the keys this reader reads, typed as
    ``parse_args`` types them; None when the list is not slime's."""
    if not isinstance(value, (list, tuple)) or not all(isinstance(a, str) for a in value):
        return None
    if not _is_slime(value):
        return None
    # Unknown options (slime has hundreds) are left aside; a repeated option
    # keeps its last value, as argparse does in slime itself.
    parsed, _ = _parser().parse_known_args(list(value))
    mapping = vars(parsed)
    if any(arg.split("=", 1)[0] == "--use-miles-router" or arg.startswith("--miles-")
           for arg in value) or _driver_is_miles(value):
        mapping[MILES_KEY] = "--use-miles-router" in value
    return mapping


def _driver_is_miles(args: Sequence[str]) -> bool:
    """Whether the list starts with a driver script (after an interpreter
    and its flags, as ``ray job submit -- python3 train.py ...`` passes it)
    that imports miles. A script this machine cannot read says nothing."""
    words = list(args[:4])
    if words and _INTERPRETER.match(words[0]):
        words = words[1:]
        while words and words[0].startswith("-") and len(words[0]) == 2:
            words = words[1:]  # python3 -u train.py
    if not words or not words[0].endswith(".py"):
        return False
    try:
        with open(os.path.expanduser(words[0]), encoding="utf-8") as handle:
            return _IMPORTS_MILES.search(handle.read(1 << 18)) is not None
    except (OSError, UnicodeDecodeError):
        return False


def compose(path: str, loaded: Any) -> Optional[Any]:
    """A YAML or JSON file holding slime's argument list (a list of strings)
    -> its mapping, so that every verb can read it from a file."""
    from omegaconf import ListConfig, OmegaConf

    if not isinstance(loaded, ListConfig):
        return None
    items = OmegaConf.to_container(loaded, resolve=True)
    # YAML reads `- 2` as a number; on a command line it is the string "2".
    args = [str(item) if isinstance(item, (int, float)) and not isinstance(item, bool)
            else item for item in items]
    if not all(isinstance(arg, str) for arg in args):
        raise fail_type(path, "a list of slime's arguments (strings)", items)
    mapping = convert(args)
    if mapping is None and args:
        # A list of strings in a file is only ever read as slime's arguments.
        raise FieldValueError(
            f"{FIELD}: {path} holds a list of strings, which is read only as slime's "
            "argument list, and it has none of slime's own options (e.g. "
            f"{', '.join(sorted(_SLIME_OPTIONS)[:3])}): pass slime's whole train.py "
            "argument list")
    return None if mapping is None else OmegaConf.create(mapping)


READER = Reader(
    name=NAME,
    markers=MARKERS,
    read=read_slime,
    roles=ROLES,
    paths=PATHS,
    convert=convert,
    compose=compose,
)
