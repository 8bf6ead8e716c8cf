"""The canonical ``megatron_env`` spec: which engines are in scope.

Every accepted input (a verl-layout config, the compact form, a DictConfig
on the driver) becomes a ``Spec``; the policy reads nothing else. The
compact form (``Spec.to_field``) is what the driver helper puts in the
runtime env, and parsing it again gives the same ``Spec``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Mapping, Optional, Tuple, Union

from .errors import FieldTypeError, FieldValueError
from .rules import ENGINE_KINDS, KNOWN_STRATEGIES, MEGATRON

FIELD = "megatron_env"
FORMAT_VERSION = 1
MAX_ENGINES = 64
MAX_PARALLEL_SIZE = 65536

# Names end up in the worker's environment (inside the decision's JSON) and
# in log lines, so they are restricted to characters that cannot expand,
# quote or break anything there.
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$")

_ENGINE_KEYS = (
    "strategy", "kind", "tensor_parallel", "context_parallel",
    "megatron_fsdp", "torch_fsdp2", "moe_overlap",
)
_TOP_KEYS = ("version", "engines")

Roles = Union[str, Iterable[str], None]


def fail_type(key: str, expected: str, value: Any) -> FieldTypeError:
    return FieldTypeError(
        f"{FIELD}: {key} must be {expected}, got {_show(value)} ({type(value).__name__})"
    )


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def read_name(value: Any, key: str) -> str:
    if not isinstance(value, str):
        raise fail_type(key, "a string", value)
    if "${" in value:
        raise FieldValueError(
            f"{FIELD}: {key} is an unresolved interpolation {_show(value)}; resolve "
            "the config on the driver (build_runtime_env does; or "
            "OmegaConf.to_container(cfg, resolve=True)): the agent never resolves"
        )
    if not _NAME.match(value):
        raise FieldValueError(
            f"{FIELD}: {key} {_show(value)} is not a valid name (a letter, then up "
            "to 63 letters, digits, '_', '.' or '-')"
        )
    return value


def read_size(value: Any, key: str) -> int:
    # bool is an int in Python; 'true' as a parallel size is a mistake.
    if isinstance(value, str) and "${" in value:
        read_name(value, key)  # raises the interpolation message
    if isinstance(value, bool) or not isinstance(value, int):
        raise fail_type(key, f"an integer from 1 to {MAX_PARALLEL_SIZE}", value)
    if not 1 <= value <= MAX_PARALLEL_SIZE:
        raise FieldValueError(
            f"{FIELD}: {key} must be an integer from 1 to {MAX_PARALLEL_SIZE}, got {value}"
        )
    return value


def read_flag(value: Any, key: str) -> bool:
    if isinstance(value, str) and "${" in value:
        read_name(value, key)
    if not isinstance(value, bool):
        raise fail_type(key, "true or false", value)
    return value


def resolve_kind(strategy: str, declared: Optional[str], key: str,
                 extra_kinds: Mapping[str, str]) -> str:
    """The engine kind of a strategy name: built in, or declared by the user."""
    builtin = KNOWN_STRATEGIES.get(strategy)
    declared = declared if declared is not None else extra_kinds.get(strategy)
    if declared is not None and declared not in ENGINE_KINDS:
        raise FieldValueError(
            f"{FIELD}: the kind declared for engine {strategy!r} is {_show(declared)}; "
            f"kinds are {', '.join(ENGINE_KINDS)}"
        )
    if builtin is not None:
        if declared is not None and declared != builtin:
            raise FieldValueError(
                f"{FIELD}: {key} {strategy!r} is a known {builtin} engine, but it is "
                f"declared as {declared!r}"
            )
        return builtin
    if declared is None:
        raise FieldValueError(
            f"{FIELD}: unknown strategy {strategy!r} at {key}; known: "
            f"{', '.join(sorted(KNOWN_STRATEGIES))}. To use another engine, declare "
            f"its kind ({', '.join(ENGINE_KINDS)}): 'kind' in the compact form, or "
            "megatron_env.engine_kinds in a verl config (see docs/field.md)"
        )
    return declared


@dataclass(frozen=True)
class Engine:
    """One training or inference engine, reduced to what the policy reads."""

    strategy: str
    kind: str
    tensor_parallel: int = 1
    context_parallel: int = 1
    megatron_fsdp: bool = False
    torch_fsdp2: bool = False
    moe_overlap: bool = False

    def __post_init__(self) -> None:
        # Only Megatron's stream use depends on these; dropping them for other
        # kinds keeps the compact form minimal and round trips exact.
        if self.kind != MEGATRON:
            for name in _ENGINE_KEYS[2:]:
                object.__setattr__(self, name, _DEFAULTS[name])

    @property
    def model_parallel(self) -> bool:
        return self.tensor_parallel > 1 or self.context_parallel > 1

    @property
    def fsdp(self) -> bool:
        return self.megatron_fsdp or self.torch_fsdp2

    @property
    def declared(self) -> bool:
        return self.strategy not in KNOWN_STRATEGIES

    def describe(self) -> str:
        if self.kind != MEGATRON:
            return self.strategy if not self.declared else f"{self.strategy} ({self.kind})"
        words = [self.strategy, f"TP={self.tensor_parallel}", f"CP={self.context_parallel}"]
        if self.megatron_fsdp:
            words.append("Megatron-FSDP")
        if self.torch_fsdp2:
            words.append("torch-FSDP2")
        if self.moe_overlap:
            words.append("MoE-overlap")
        return " ".join(words)

    def to_field(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"strategy": self.strategy}
        if self.declared:
            out["kind"] = self.kind
        for name in _ENGINE_KEYS[2:]:
            if getattr(self, name) != _DEFAULTS[name]:
                out[name] = getattr(self, name)
        return out


_DEFAULTS = {f.name: f.default for f in Engine.__dataclass_fields__.values()
             if f.name not in ("strategy", "kind")}


@dataclass(frozen=True)
class Spec:
    """The engines in scope for one runtime env, keyed by role."""

    engines: Tuple[Tuple[str, Engine], ...] = field(default=())

    @classmethod
    def of(cls, engines: Mapping[str, Engine]) -> "Spec":
        return cls(tuple(sorted(engines.items())))

    def roles(self) -> Tuple[str, ...]:
        return tuple(role for role, _ in self.engines)

    def to_field(self) -> Dict[str, Any]:
        """The compact, JSON-ready form for ``runtime_env["megatron_env"]``."""
        return {
            "version": FORMAT_VERSION,
            "engines": {role: engine.to_field() for role, engine in self.engines},
        }

    def narrow(self, roles: Roles, known_roles: Iterable[str] = ()) -> "Spec":
        """Keep only the given roles' engines (``None`` keeps all)."""
        if roles is None:
            return self
        wanted = (roles,) if isinstance(roles, str) else tuple(roles)
        if not wanted:
            raise FieldValueError(f"{FIELD}: role must name at least one role")
        present = dict(self.engines)
        valid = set(known_roles) | set(present)
        for role in wanted:
            if not isinstance(role, str):
                raise fail_type("role", "a role name", role)
            if role not in valid:
                raise FieldValueError(
                    f"{FIELD}: unknown role {role!r}; roles: {', '.join(sorted(valid))}"
                )
            if role not in present:
                raise FieldValueError(
                    f"{FIELD}: role {role!r} has no engine in this config (absent, "
                    f"disabled with enable: false, or with no strategy or engine name set); roles "
                    f"with engines: {', '.join(self.roles()) or 'none'}"
                )
        return Spec.of({role: present[role] for role in wanted})


def read_canonical(value: Mapping[str, Any]) -> Spec:
    """Parse the compact form: ``{"version": 1, "engines": {role: engine}}``."""
    unknown = sorted(str(k) for k in value if k not in _TOP_KEYS)
    if unknown:
        raise FieldValueError(
            f"{FIELD}: unknown key(s) {', '.join(map(repr, unknown))} in the compact "
            f"form; allowed: {', '.join(_TOP_KEYS)}"
        )
    version = value.get("version", FORMAT_VERSION)
    if isinstance(version, bool) or not isinstance(version, int):
        raise fail_type("version", "an integer", version)
    if version != FORMAT_VERSION:
        raise FieldValueError(
            f"{FIELD}: format version {version} is not supported by this "
            f"ray-megatron-env (it reads version {FORMAT_VERSION}); install the same "
            "ray-megatron-env version on the driver and on every node"
        )
    engines = value.get("engines")
    if not isinstance(engines, Mapping):
        raise fail_type("engines", "a mapping of role -> engine", engines)
    if len(engines) > MAX_ENGINES:
        raise FieldValueError(f"{FIELD}: engines has {len(engines)} roles; at most {MAX_ENGINES}")
    parsed = {}
    for role, raw in engines.items():
        read_name(role, "engines (a role name)")
        parsed[role] = read_canonical_engine(raw, f"engines.{role}")
    return Spec.of(parsed)


def read_canonical_engine(raw: Any, key: str) -> Engine:
    if not isinstance(raw, Mapping):
        raise fail_type(key, "a mapping with at least 'strategy'", raw)
    unknown = sorted(str(k) for k in raw if k not in _ENGINE_KEYS)
    if unknown:
        raise FieldValueError(
            f"{FIELD}: unknown key(s) {', '.join(map(repr, unknown))} in {key}; "
            f"allowed: {', '.join(_ENGINE_KEYS)}"
        )
    if "strategy" not in raw:
        raise FieldValueError(f"{FIELD}: {key}.strategy is missing")
    strategy = read_name(raw["strategy"], f"{key}.strategy")
    declared = raw.get("kind")
    if declared is not None:
        declared = read_name(declared, f"{key}.kind")
    kind = resolve_kind(strategy, declared, f"{key}.strategy", {})
    sizes = {name: read_size(raw[name], f"{key}.{name}")
             for name in ("tensor_parallel", "context_parallel") if name in raw}
    flags = {name: read_flag(raw[name], f"{key}.{name}")
             for name in ("megatron_fsdp", "torch_fsdp2", "moe_overlap") if name in raw}
    return Engine(strategy, kind, **sizes, **flags)
