"""The canonical ``megatron_env`` spec: which engines are in scope, and which
worker processes run which of them.

Every framework reader (``frameworks/``) produces a ``Spec``; the policy reads
nothing else. The compact form (``Spec.to_field``) is what the driver helper
puts in the runtime env, and parsing it again gives the same ``Spec``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from typing import Any, Dict, Iterable, Mapping, Optional, Tuple, Union

from .errors import FieldValueError
from .engines import (
    CHECKS, ENGINE_KINDS, FLEX_BACKENDS, INFERENCE, KNOWN_STRATEGIES, MEGATRON,
    PIPELINE_BACKENDS,
)
from .names import ALWAYS_ON, FIELD, PACK_NAMES
from .values import fail_type, read_names, show

FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)  # version 1 is version 2 without the optional keys

Roles = Union[str, Iterable[str], None]

# Free text a reader writes (why a role was left out). It reaches the worker's
# environment and log lines, so it stays plain.
_NOTE = re.compile(r"^[A-Za-z0-9 _.,:;=()'/+<>-]{1,200}$")


def read_note(value: Any, key: str) -> str:
    if not isinstance(value, str):
        raise fail_type(key, "a string", value)
    if not _NOTE.match(value):
        raise FieldValueError(f"{FIELD}: {key} {show(value)} must be 1 to 200 letters, digits, "
                              "spaces or .,:;=()'/+<>_- characters")
    return value


def read_checks(value: Any, key: str) -> Tuple[str, ...]:
    return read_names(value, key, tuple(CHECKS), "check")


def resolve_kind(strategy: str, declared: Optional[str], key: str,
                 extra_kinds: Mapping[str, str]) -> str:
    """The engine kind of a strategy name: built in, or declared by the user."""
    builtin = KNOWN_STRATEGIES.get(strategy)
    declared = declared if declared is not None else extra_kinds.get(strategy)
    if declared is not None and declared not in ENGINE_KINDS:
        raise FieldValueError(
            f"{FIELD}: the kind declared for engine {strategy!r} is {show(declared)}; "
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
    """One training or inference engine, reduced to what the policy reads.

    ``checks`` names the checks (``rules.CHECKS``) that the framework driving
    a Megatron engine runs on it, whose asserts turn some rows from a matter
    of speed into a matter of the job starting. ``dispatcher`` is the flex
    token dispatcher's backend when it is DeepEP or HybridEP (``None``: the
    all-to-all or all-gather dispatcher); ``pipeline_backend`` is ``"ucc"``
    when pipeline communication runs on UCC (``None``: NCCL, the default).
    """

    strategy: str
    kind: str
    tensor_parallel: int = 1
    context_parallel: int = 1
    expert_parallel: int = 1
    megatron_fsdp: bool = False
    torch_fsdp2: bool = False
    moe_overlap: bool = False
    checks: Tuple[str, ...] = ()
    dispatcher: Optional[str] = None
    pipeline_backend: Optional[str] = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "checks", tuple(sorted(set(self.checks))))
        if self.dispatcher is not None and self.dispatcher not in FLEX_BACKENDS:
            raise FieldValueError(
                f"{FIELD}: dispatcher {show(self.dispatcher)} is not one of "
                f"{', '.join(FLEX_BACKENDS)}; leave it out for the all-to-all or all-gather "
                "dispatcher")
        if self.pipeline_backend not in (None, *PIPELINE_BACKENDS):
            raise FieldValueError(
                f"{FIELD}: pipeline_backend {show(self.pipeline_backend)} is not one of "
                f"{', '.join(PIPELINE_BACKENDS)}")
        if self.pipeline_backend == "nccl":
            # NCCL is Megatron-Core's default: stored as the default, so one
            # layout has one compact form.
            object.__setattr__(self, "pipeline_backend", None)
        # Only Megatron's stream use depends on these; dropping them for other
        # kinds keeps the compact form minimal and round trips exact.
        if self.kind != MEGATRON:
            for name in MEGATRON_SETTINGS:
                if name == "tensor_parallel" and self.kind == INFERENCE:
                    continue  # the nccl-fabric pack reads it (a TP group across nodes)
                object.__setattr__(self, name, ENGINE_DEFAULTS[name])

    @property
    def model_parallel(self) -> bool:
        return self.tensor_parallel > 1 or self.context_parallel > 1

    @property
    def fsdp(self) -> bool:
        return self.megatron_fsdp or self.torch_fsdp2

    @property
    def flex_dispatcher(self) -> bool:
        return self.dispatcher is not None

    @property
    def ucc_pipeline(self) -> bool:
        return self.pipeline_backend == "ucc"

    @property
    def declared(self) -> bool:
        return self.strategy not in KNOWN_STRATEGIES

    def describe(self) -> str:
        if self.kind != MEGATRON:
            name = self.strategy if not self.declared else f"{self.strategy} ({self.kind})"
            return name if self.tensor_parallel == 1 else f"{name} TP={self.tensor_parallel}"
        words = [self.strategy, f"TP={self.tensor_parallel}", f"CP={self.context_parallel}"]
        if self.expert_parallel > 1:
            words.append(f"EP={self.expert_parallel}")
        if self.megatron_fsdp:
            words.append("Megatron-FSDP")
        if self.torch_fsdp2:
            words.append("torch-FSDP2")
        if self.moe_overlap:
            words.append("MoE-A2A-overlap")
        if self.dispatcher:
            words.append(f"dispatcher={self.dispatcher}")
        if self.pipeline_backend:
            words.append(f"PP-backend={self.pipeline_backend}")
        if self.checks:
            words.append(f"checked by {'+'.join(self.checks)}")
        return " ".join(words)

    def to_field(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"strategy": self.strategy}
        if self.declared:
            out["kind"] = self.kind
        for name in MEGATRON_SETTINGS:
            if getattr(self, name) != ENGINE_DEFAULTS[name]:
                out[name] = list(self.checks) if name == "checks" else getattr(self, name)
        return out


ENGINE_DEFAULTS = {f.name: f.default for f in fields(Engine) if f.name not in ("strategy", "kind")}
MEGATRON_SETTINGS = tuple(ENGINE_DEFAULTS)
SIZES = ("tensor_parallel", "context_parallel", "expert_parallel")
FLAGS = ("megatron_fsdp", "torch_fsdp2", "moe_overlap")
CHOICES = {"dispatcher": FLEX_BACKENDS, "pipeline_backend": PIPELINE_BACKENDS}


@dataclass(frozen=True)
class ProcessRule:
    """How to recognise the worker processes of some roles: a variable the
    framework itself puts in those workers' ``env_vars``, and the prefix its
    value starts with (``exact``: the whole value, where one role's name can
    begin another's, as ROLL's ``CLUSTER_NAME`` values can)."""

    roles: Tuple[str, ...]
    variable: str
    prefix: str
    exact: bool = False

    def matches(self, env_vars: Mapping[str, Any]) -> bool:
        value = env_vars.get(self.variable)
        return isinstance(value, str) and (value == self.prefix if self.exact
                                           else value.startswith(self.prefix))

    def describe(self) -> str:
        return f"{self.variable}={self.prefix}{'' if self.exact else '*'}"

    def to_field(self) -> Dict[str, Any]:
        out = {"roles": list(self.roles), "variable": self.variable, "prefix": self.prefix}
        if self.exact:
            out["exact"] = True
        return out


@dataclass(frozen=True)
class Spec:
    """The engines in scope for one runtime env, keyed by role.

    ``omitted`` names roles a config lists but its framework never creates,
    with why. ``processes`` classify a worker by its own ``env_vars`` so that
    one job-level env gives each process kind its own decision; ``others``
    are the roles of a worker no rule matches (``None``: every role).
    ``replaces`` is a value the framework itself writes into every worker's
    ``env_vars`` (AReaL's blanket "1"): there it is not the user's intent, so
    the agent decides anew instead of keeping it as explicit.
    """

    engines: Tuple[Tuple[str, Engine], ...] = field(default=())
    framework: Optional[str] = None
    omitted: Tuple[Tuple[str, str], ...] = ()
    processes: Tuple[ProcessRule, ...] = ()
    others: Optional[Tuple[str, ...]] = None
    replaces: Optional[str] = None
    # Job-wide, for the rule packs (packs/): the optional packs the job asked
    # for, and the roles whose tensor parallel group spans nodes.
    packs: Tuple[str, ...] = ()
    tp_spans_nodes: Tuple[str, ...] = ()
    # (variable, value) pairs of the packs' variables that the job's env_vars
    # carry with exactly the driver process's own value: a framework's copy of
    # the driver's environment (NeMo-RL's init_ray: env_vars = dict(os.environ)),
    # decided as an inherited value, not kept as the job's explicit one.
    driver_env: Tuple[Tuple[str, str], ...] = ()
    # (variable, value) pairs of the packs' variables that the framework
    # itself writes into its workers' env_vars whatever the node (SkyRL's
    # FLA_TILELANG=1, slime's NVTE_FP8_BLOCK_SCALING_FP32_SCALES=1): like
    # ``replaces``, a worker carrying exactly that value is decided anew.
    framework_env: Tuple[Tuple[str, str], ...] = ()

    @classmethod
    def of(cls, engines: Mapping[str, Engine], **kw: Any) -> "Spec":
        kw["omitted"] = tuple(sorted(dict(kw.get("omitted", ())).items()))
        kw["driver_env"] = tuple(sorted(dict(kw.get("driver_env", ())).items()))
        kw["framework_env"] = tuple(sorted(dict(kw.get("framework_env", ())).items()))
        return cls(tuple(sorted(engines.items())), **kw)

    def roles(self) -> Tuple[str, ...]:
        return tuple(role for role, _ in self.engines)

    def to_field(self) -> Dict[str, Any]:
        """The compact, JSON-ready form for ``runtime_env["megatron_env"]``."""
        out: Dict[str, Any] = {
            "version": FORMAT_VERSION,
            "engines": {role: engine.to_field() for role, engine in self.engines},
        }
        if self.framework is not None:
            out["framework"] = self.framework
        if self.omitted:
            out["omitted"] = dict(self.omitted)
        if self.processes:
            out["processes"] = [rule.to_field() for rule in self.processes]
        if self.others is not None:
            out["others"] = list(self.others)
        if self.replaces is not None:
            out["replaces"] = self.replaces
        if self.packs:
            out["packs"] = list(self.packs)
        if self.tp_spans_nodes:
            out["tp_spans_nodes"] = list(self.tp_spans_nodes)
        if self.driver_env:
            out["driver_env"] = dict(self.driver_env)
        if self.framework_env:
            out["framework_env"] = dict(self.framework_env)
        return out

    def _job_wide(self) -> Dict[str, Any]:
        """What every narrower spec of this job keeps."""
        return {"packs": self.packs, "tp_spans_nodes": self.tp_spans_nodes,
                "driver_env": self.driver_env, "framework_env": self.framework_env}

    def narrow(self, roles: Roles, known_roles: Iterable[str] = ()) -> "Spec":
        """Keep only the given roles' engines (``None`` keeps all). A runtime
        env for named roles serves only their processes, so it carries no
        process rules."""
        if roles is None:
            return self
        wanted = (roles,) if isinstance(roles, str) else tuple(roles)
        if not wanted:
            raise FieldValueError(f"{FIELD}: role must name at least one role")
        present = dict(self.engines)
        omitted = dict(self.omitted)
        valid = set(known_roles) | set(present) | set(omitted)
        for role in wanted:
            if not isinstance(role, str):
                raise fail_type("role", "a role name", role)
            if role not in valid:
                raise FieldValueError(
                    f"{FIELD}: unknown role {role!r}; roles: {', '.join(sorted(valid))}"
                )
            if role in omitted:
                raise FieldValueError(
                    f"{FIELD}: role {role!r} is never started by "
                    f"{self.framework or 'the framework'} with this config ({omitted[role]})"
                )
            if role not in present:
                # verl's words where they apply; other layouts have no such keys.
                why = ("absent, disabled with enable: false, or with no strategy or engine "
                       "name set" if self.framework in (None, "verl", "verl-sft")
                       else f"absent or not enabled in this {self.framework} config")
                raise FieldValueError(
                    f"{FIELD}: role {role!r} has no engine in this config ({why}); roles "
                    f"with engines: {', '.join(self.roles()) or 'none'}"
                )
        return Spec.of({role: present[role] for role in wanted}, framework=self.framework,
                       replaces=self.replaces, **self._job_wide())

    def for_process(self, env_vars: Mapping[str, Any]) -> Tuple["Spec", Optional[str]]:
        """The spec for one worker, classified by its own ``env_vars``, and
        words that say how it was recognised (``None``: not classified)."""
        if not self.processes:
            return self, None
        present = dict(self.engines)
        for rule in self.processes:
            if rule.matches(env_vars):
                roles = [r for r in rule.roles if r in present]
                return (Spec.of({r: present[r] for r in roles}, framework=self.framework,
                                omitted=self.omitted, replaces=self.replaces,
                                **self._job_wide()),
                        f"{', '.join(rule.roles)} process ({rule.describe()})")
        if self.others is None:
            return self, None
        return (Spec.of({r: present[r] for r in self.others if r in present},
                        framework=self.framework, omitted=self.omitted,
                        replaces=self.replaces, **self._job_wide()),
                f"{', '.join(self.others) or 'no engine'} worker (no process rule matched "
                "its env_vars)")

    def partitions(self) -> Tuple["Spec", ...]:
        """The spec of each kind of process the field tells apart (one when
        it tells none apart): what one worker can be decided for."""
        if not self.processes:
            return (self,)
        kinds = [self.for_process({rule.variable: rule.prefix})[0] for rule in self.processes]
        return tuple(kinds) + (self.for_process({})[0],)


def read_packs(value: Any, key: str = "packs") -> Tuple[str, ...]:
    """A job's pack list, checked: names of optional packs, sorted, once each.
    ``cuda-connections`` is always on and may be named."""
    if isinstance(value, str):
        value = [value]
    names = read_names(value, key, PACK_NAMES, "pack", "known packs")
    return tuple(sorted({v for v in names if v not in ALWAYS_ON}))
