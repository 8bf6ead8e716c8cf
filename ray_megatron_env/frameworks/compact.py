"""The compact form: ``{"version": 2, "engines": {role: engine}, ...}``.

What the driver helper ships for every framework, and what a user of any
other framework writes by hand (docs/field.md).
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Tuple

from ..errors import FieldValueError
from ..spec import (
    CHOICES, FLAGS, FORMAT_VERSION, READABLE_VERSIONS, SIZES, Engine, ProcessRule, Spec,
    read_checks, read_note, read_packs, resolve_kind,
)
from ..values import fail_type, parse_connections, read_flag, read_name, read_size, read_token
from ..names import FIELD

MAX_ENGINES = 64
MAX_PROCESS_RULES = 16
ENGINE_KEYS = ("strategy", "kind", *SIZES, *FLAGS, "checks", *CHOICES)
TOP_KEYS = ("version", "framework", "engines", "omitted", "processes", "others", "replaces",
            "packs", "tp_spans_nodes", "driver_env", "framework_env")
# An env var's value as the driver copied it; '$' is refused because Ray
# expands $VAR in env_vars values when it starts a worker.
MAX_DRIVER_VALUE = 4096
_RULE_KEYS = ("roles", "variable", "prefix")


def is_compact(value: Mapping[str, Any]) -> bool:
    return "engines" in value or "version" in value


def _unknown(keys: Any, allowed: Tuple[str, ...], where: str) -> None:
    unknown = sorted(str(k) for k in keys if k not in allowed)
    if unknown:
        raise FieldValueError(
            f"{FIELD}: unknown key(s) {', '.join(map(repr, unknown))} in {where}; "
            f"allowed: {', '.join(allowed)}"
        )


def read_compact(value: Mapping[str, Any]) -> Spec:
    _unknown(value, TOP_KEYS, "the compact form")
    version = value.get("version", FORMAT_VERSION)
    if isinstance(version, bool) or not isinstance(version, int):
        raise fail_type("version", "an integer", version)
    if version not in READABLE_VERSIONS:
        raise FieldValueError(
            f"{FIELD}: format version {version} is not supported by this "
            f"ray-megatron-env (it reads versions {', '.join(map(str, READABLE_VERSIONS))}); "
            "install the same ray-megatron-env version on the driver and on every node"
        )
    if version == 1:
        _unknown(value, ("version", "engines"), "the compact form, version 1")
    engines = _by_role(value.get("engines"), "engines", "engine")
    parsed = {role: read_compact_engine(raw, f"engines.{role}") for role, raw in engines.items()}
    framework = value.get("framework")
    if framework is not None:
        framework = read_name(framework, "framework")
    packs = read_packs(value.get("packs", ()))
    return Spec.of(parsed, framework=framework,
                   omitted=_read_omitted(value.get("omitted"), parsed),
                   processes=_read_processes(value.get("processes"), parsed),
                   others=_read_roles(value.get("others"), "others", parsed),
                   replaces=_read_replaces(value.get("replaces")),
                   packs=packs, driver_env=read_driver_env(value.get("driver_env"), packs),
                   framework_env=read_driver_env(value.get("framework_env"), packs,
                                                 "framework_env"),
                   tp_spans_nodes=_read_roles(value.get("tp_spans_nodes"), "tp_spans_nodes",
                                              parsed) or ())


def read_driver_env(raw: Any, packs: Tuple[str, ...],
                    key: str = "driver_env") -> Tuple[Tuple[str, str], ...]:
    """``driver_env``: variable -> the driver's own value, for variables of
    the job's packs (``cuda-connections`` and ``packs``); ``framework_env``
    (``key``), variable -> a framework's own value, read alike."""
    if raw is None:
        return ()
    if not isinstance(raw, Mapping):
        whose = "the driver's" if key == "driver_env" else "the framework's own"
        raise fail_type(key, f"a mapping of variable -> {whose} value", raw)
    # Which pack owns each name is checked where the packs are known
    # (frameworks.read_field): the packs sit above the readers.
    out = []
    for name, text in raw.items():
        if not isinstance(text, str) or len(text) > MAX_DRIVER_VALUE or "$" in text:
            raise fail_type(f"{key}.{name}", f"a string of at most {MAX_DRIVER_VALUE} "
                            "characters without '$'", text)
        out.append((name, text))
    return tuple(sorted(out))


def _read_replaces(raw: Any) -> Optional[str]:
    if raw is None:
        return None
    parse_connections(raw, "replaces")
    return raw


def read_compact_engine(raw: Any, key: str) -> Engine:
    if not isinstance(raw, Mapping):
        raise fail_type(key, "a mapping with at least 'strategy'", raw)
    _unknown(raw, ENGINE_KEYS, key)
    if "strategy" not in raw:
        raise FieldValueError(f"{FIELD}: {key}.strategy is missing")
    strategy = read_name(raw["strategy"], f"{key}.strategy")
    declared = raw.get("kind")
    if declared is not None:
        declared = read_name(declared, f"{key}.kind")
    kind = resolve_kind(strategy, declared, f"{key}.strategy", {})
    sizes = {name: read_size(raw[name], f"{key}.{name}") for name in SIZES if name in raw}
    flags = {name: read_flag(raw[name], f"{key}.{name}") for name in FLAGS if name in raw}
    checks = read_checks(raw["checks"], f"{key}.checks") if "checks" in raw else ()
    choices = {name: read_choice(raw[name], f"{key}.{name}", allowed)
               for name, allowed in CHOICES.items() if name in raw}
    return Engine(strategy, kind, **sizes, **flags, checks=checks, **choices)


def read_choice(value: Any, key: str, allowed: Tuple[str, ...]) -> str:
    """One of a few names (a dispatcher backend, a pipeline backend)."""
    name = read_name(value, key)
    if name not in allowed:
        hint = (" (leave it out for the all-to-all or all-gather dispatcher)"
                if key.endswith(".dispatcher") else "")
        raise FieldValueError(f"{FIELD}: {key} is {name!r}; it must be one of "
                              f"{', '.join(allowed)}{hint}")
    return name


def _by_role(raw: Any, key: str, holds: str) -> Mapping[str, Any]:
    """A mapping keyed by role name, checked: its type, size and names."""
    if not isinstance(raw, Mapping):
        raise fail_type(key, f"a mapping of role -> {holds}", raw)
    if len(raw) > MAX_ENGINES:
        raise FieldValueError(f"{FIELD}: {key} has {len(raw)} roles; at most {MAX_ENGINES}")
    for role in raw:
        read_name(role, f"{key} (a role name)")
    return raw


def _read_omitted(raw: Any, engines: Mapping[str, Engine]) -> Dict[str, str]:
    if raw is None:
        return {}
    out = {}
    for role, why in _by_role(raw, "omitted", "why it is not created").items():
        if role in engines:
            raise FieldValueError(f"{FIELD}: role {role!r} is both in engines and in omitted")
        out[role] = read_note(why, f"omitted.{role}")
    return out


def _read_roles(raw: Any, key: str, engines: Mapping[str, Engine]) -> Optional[Tuple[str, ...]]:
    if raw is None:
        return None
    if not isinstance(raw, (list, tuple)) or len(raw) > MAX_ENGINES:
        raise fail_type(key, f"a list of at most {MAX_ENGINES} role names", raw)
    roles = tuple(read_name(role, f"{key}[{i}]") for i, role in enumerate(raw))
    missing = [role for role in roles if role not in engines]
    if missing:
        raise FieldValueError(f"{FIELD}: {key} names role(s) without an engine: "
                              f"{', '.join(missing)}")
    return roles


def _read_processes(raw: Any, engines: Mapping[str, Engine]) -> Tuple[ProcessRule, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, (list, tuple)) or len(raw) > MAX_PROCESS_RULES:
        raise fail_type("processes", f"a list of at most {MAX_PROCESS_RULES} process rules",
                        raw)
    rules = []
    for i, rule in enumerate(raw):
        key = f"processes[{i}]"
        if not isinstance(rule, Mapping):
            raise fail_type(key, "a mapping with roles, variable and prefix", rule)
        _unknown(rule, (*_RULE_KEYS, "exact"), key)
        missing = [k for k in _RULE_KEYS if k not in rule]
        if missing:
            raise FieldValueError(f"{FIELD}: {key} lacks {', '.join(missing)}")
        roles = _read_roles(rule["roles"], f"{key}.roles", engines)
        if not roles:
            raise FieldValueError(f"{FIELD}: {key}.roles must name at least one role")
        exact = "exact" in rule and read_flag(rule["exact"], f"{key}.exact")
        rules.append(ProcessRule(roles, read_name(rule["variable"], f"{key}.variable"),
                                 read_token(rule["prefix"], f"{key}.prefix"), exact))
    return tuple(rules)
