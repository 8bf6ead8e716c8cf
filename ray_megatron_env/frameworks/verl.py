"""Reading verl's trainer config layout into a ``Spec``.

Only the keys listed in ``SECTIONS`` are read; everything else in the
config (and there is a lot: about 28 KB of JSON) is ignored, so keys that
merely look alike elsewhere (``trainer.v1.sampler.max_off_policy_strategy``)
never count.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Tuple

from ..errors import FieldValueError
from ..rules import ENGINE_KINDS, MEGATRON
from ..spec import Engine, Spec, resolve_kind
from ..values import FIELD, fail_type, read_flag, read_name, read_size
from . import Reader

# (role, where its section lives, the key naming its engine). The newer
# ``reward.reward_model`` comes before the older top-level ``reward_model``:
# when both declare an engine, the newer one is what verl runs.
SECTIONS: Tuple[Tuple[str, str, str], ...] = (
    ("actor", "actor_rollout_ref.actor", "strategy"),
    ("ref", "actor_rollout_ref.ref", "strategy"),
    ("rollout", "actor_rollout_ref.rollout", "name"),
    ("critic", "critic", "strategy"),
    ("reward_model", "reward.reward_model", "strategy"),
    ("reward_model", "reward_model", "strategy"),
)
ROLES = ("actor", "ref", "rollout", "critic", "reward_model")
DECLARATIONS = "megatron_env"  # optional top-level section: {engine_kinds: {name: kind}}

_MEGATRON_KEYS = (
    ("tensor_parallel", "megatron.tensor_model_parallel_size", read_size),
    ("context_parallel", "megatron.context_parallel_size", read_size),
    ("megatron_fsdp", "megatron.use_megatron_fsdp", read_flag),
    ("moe_overlap", "megatron.override_transformer_config.overlap_moe_expert_parallel_comm",
     read_flag),
)
# OmegaConf's marker for a mandatory value nobody set (verl ships
# ``rollout.name: ???``): the engine is not declared yet.
_UNSET = (None, "???")

# Every path this module reads, so the driver can resolve exactly these in a
# DictConfig and nothing else (an unrelated broken interpolation elsewhere in
# the config must not fail the job).
PATHS: Tuple[str, ...] = (DECLARATIONS,) + tuple(
    f"{section}.{key}"
    for _, section, name_key in SECTIONS
    for key in ("enable", name_key, "rollout.name", *(k for _, k, _ in _MEGATRON_KEYS))
)


def read_verl(config: Mapping[str, Any]) -> Spec:
    """Engines of a verl-layout config (a plain, resolved mapping)."""
    kinds = _read_declarations(config.get(DECLARATIONS))
    engines: Dict[str, Engine] = {}
    for role, section_path, name_key in SECTIONS:
        if role in engines:
            continue
        engine = _read_section(config, section_path, name_key, kinds)
        if engine is not None:
            engines[role] = engine
    return Spec.of(engines)


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


def _expect_mapping(value: Any, key: str) -> None:
    if isinstance(value, str) and "${" in value:
        read_name(value, key)  # an unresolved interpolation gets its own message
    raise fail_type(key, "a mapping", value)


def _lookup(config: Mapping[str, Any], path: str) -> Tuple[bool, Any]:
    """(found, value) for a dotted path; a non-mapping on the way is an error."""
    node: Any = config
    walked = []
    for part in path.split("."):
        if node is None:
            return False, None
        if not isinstance(node, Mapping):
            _expect_mapping(node, ".".join(walked))
        if part not in node:
            return False, None
        node = node[part]
        walked.append(part)
    return True, node


def _read_section(config: Mapping[str, Any], path: str, name_key: str,
                  kinds: Mapping[str, str]) -> Optional[Engine]:
    found, section = _lookup(config, path)
    if not found or section is None:
        return None
    if not isinstance(section, Mapping):
        _expect_mapping(section, path)
    enable = section.get("enable")
    if enable is not None and read_flag(enable, f"{path}.enable") is False:
        return None
    name_path = f"{path}.{name_key}"
    strategy = section.get(name_key)
    if strategy in _UNSET and name_key == "strategy":
        # A reward model served by an inference engine names it under rollout.
        name_path = f"{path}.rollout.name"
        _, strategy = _lookup(config, name_path)
    if strategy in _UNSET:
        return None
    strategy = read_name(strategy, name_path)
    kind = resolve_kind(strategy, None, name_path, kinds)
    if kind != MEGATRON:
        return Engine(strategy, kind)
    settings = {}
    for name, key, reader in _MEGATRON_KEYS:
        found, value = _lookup(config, f"{path}.{key}")
        # null means "not set" for a flag; a null size is ambiguous, so it errs.
        if found and not (value is None and reader is read_flag):
            settings[name] = reader(value, f"{path}.{key}")
    return Engine(strategy, kind, **settings)


READER = Reader(
    name="verl",
    markers=("actor_rollout_ref", "critic.strategy", "reward_model.strategy",
             "reward.reward_model"),
    read=read_verl,
    roles=ROLES,
    paths=PATHS,
)
