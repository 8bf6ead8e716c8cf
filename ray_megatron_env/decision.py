"""The decision for one worker on one node: every variable of the packs the
job asked for, where its value came from, and why.

``decide_node`` is the one entry point: the plugin's agent, the setup hook in
a worker and ``explain`` all call it. It runs each pack's ``evaluate`` over
the node's facts and applies ``settle``, the one precedence
(docs/how-it-works.md#precedence), to every outcome. The ``Decision`` it
returns travels to the worker as JSON in ``RAY_MEGATRON_ENV_DECISION`` and is
what the CLI prints.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field, fields
from typing import Any, Dict, List, Mapping, MutableMapping, Optional, Tuple

from ._version import __version__
from .engines import CONNECTIONS_VARIABLE
from .node import NodeFacts
from .packs import (
    ALWAYS_ON, CUDA_CONNECTIONS, LEAVE, PREFERRED, REMOVE, REQUIRED, SET, Demand, Outcome,
    canonical, get_pack,
)
from .spec import Spec
from .values import FIELD

DECISION_VARIABLE = "RAY_MEGATRON_ENV_DECISION"

# Where a variable's value came from. DRIVER_ENV: the driver's own value,
# which a framework copied into env_vars (Spec.driver_env), kept as an
# inherited value.
EXPLICIT, POLICY, NODE, NONE = "explicit", "policy", "node", "none"
DRIVER_ENV = "driver-env"
VIA_PLUGIN, VIA_SETUP_HOOK = "plugin", "setup-hook"
# 1: CUDA's answer in top-level keys, other variables under "packs" (0.x).
# 2: one entry per variable under "variables"; the version-1 keys are still
# written beside it for one release (docs/record.md#version-1s-keys-until-030).
RECORD_VERSION = 2
_STRONGEST = (REQUIRED, PREFERRED, "none")


@dataclass(frozen=True)
class VariableDecision:
    """One variable's entry in the record. ``detail`` is what its pack adds
    (``cuda-connections``: the requirement, a conflict flag, each role's
    engine and rule)."""

    pack: str
    action: str  # set | remove | keep | leave
    value: Optional[str]  # what the worker has; None: unset
    source: str  # explicit | policy | node | driver-env | none
    strength: str  # required | preferred | none
    rule: str  # the deciding row's id ('+' between several)
    reason: str
    node_value: Optional[str] = None  # inherited from the node's environment
    detail: Dict[str, Any] = field(default_factory=dict)
    # The driver's own value found in env_vars (Spec.driver_env), decided as
    # inherited; written into the record only when there was one.
    driver_value: Optional[str] = None

    def to_dict(self) -> Dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)
               if f.name not in ("detail", "driver_value")}
        if self.driver_value is not None:
            out["driver_value"] = self.driver_value
        return {**out, **self.detail}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "VariableDecision":
        names = {f.name for f in fields(cls)} - {"detail"}
        known = {k: v for k, v in data.items() if k in names}
        known.setdefault("node_value", None)
        return cls(**known, detail={k: v for k, v in data.items() if k not in names})


@dataclass(frozen=True)
class Decision:
    """What one worker got on one node: one entry per variable, the node's
    facts, the path that decided (``via``), the warnings, and whether every
    required row is met (``satisfied``)."""

    variables: Dict[str, VariableDecision]
    gpus: Optional[List[str]]  # capabilities seen on the node; None if not readable
    probe: Dict[str, Any] = field(default_factory=dict)
    warnings: Tuple[str, ...] = ()
    satisfied: bool = True
    process: Optional[str] = None  # how this worker was classified, if the field says how
    framework: Optional[str] = None
    via: Optional[str] = None  # plugin (the node's agent) | setup-hook (the worker)
    version: str = __version__
    record: int = RECORD_VERSION

    # CUDA_DEVICE_MAX_CONNECTIONS as record version 1 carried it; kept for one
    # release beside ``variables`` (docs/record.md#version-1s-keys-until-030).
    @property
    def cuda(self) -> VariableDecision:
        return self.variables[CONNECTIONS_VARIABLE]

    @property
    def value(self) -> Optional[str]:
        return self.cuda.value

    @property
    def source(self) -> str:
        return self.cuda.source

    @property
    def reason(self) -> str:
        return f"{self.process}: {self.cuda.reason}" if self.process else self.cuda.reason

    @property
    def node_value(self) -> Optional[str]:
        return self.cuda.node_value

    @property
    def requirement(self) -> str:
        return self.cuda.detail.get("requirement", "none")

    @property
    def conflict(self) -> bool:
        return bool(self.cuda.detail.get("conflict", False))

    def _roles(self, key: str) -> Dict[str, str]:
        return {role: entry[key] for role, entry in self.cuda.detail.get("roles", {}).items()}

    @property
    def engines(self) -> Dict[str, str]:
        return self._roles("engine")

    @property
    def rules(self) -> Dict[str, str]:
        return self._roles("rule")

    @property
    def strengths(self) -> Dict[str, str]:
        return self._roles("strength")

    @property
    def because(self) -> Dict[str, str]:
        return self._roles("because")

    @property
    def packs(self) -> Dict[str, Dict[str, Any]]:
        """The optional packs' variables, as record version 1 listed them."""
        keys = ("pack", "action", "value", "source", "strength", "rule", "reason")
        return {name: {k: getattr(entry, k) for k in keys}
                for name, entry in self.variables.items() if entry.pack not in ALWAYS_ON}

    def to_dict(self) -> Dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "variables"}
        out["warnings"] = list(self.warnings)
        out["variables"] = {name: entry.to_dict() for name, entry in self.variables.items()}
        if CONNECTIONS_VARIABLE in self.variables:
            out.update(value=self.value, source=self.source, reason=self.reason,
                       requirement=self.requirement, engines=self.engines, rules=self.rules,
                       strengths=self.strengths, because=self.because, conflict=self.conflict,
                       node_value=self.node_value)
        if self.packs:
            out["packs"] = self.packs
        return out

    def log_lines(self) -> List[Tuple[int, str]]:
        """The node log's lines: each variable, its value and why, then each
        warning (``CUDA_DEVICE_MAX_CONNECTIONS``'s first, with the GPUs)."""
        lines = []
        for name, entry in self.variables.items():
            shown = entry.value if entry.value is not None else "unset"
            if name == CONNECTIONS_VARIABLE:
                lines.append((logging.INFO, f"{FIELD}: {name}={shown} (source: {entry.source}; "
                                            f"via: {self.via}; GPUs: {self.gpus}): {self.reason}"))
            else:
                lines.append((logging.INFO, f"{FIELD}: {name}={shown} (pack {entry.pack}, "
                                            f"{entry.action}, {entry.strength}; source: "
                                            f"{entry.source}; via: {self.via}): {entry.reason}"))
        return lines + [(logging.WARNING, f"{FIELD}: {warning}") for warning in self.warnings]

    def to_json(self) -> str:
        text = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        # Ray expands $VAR and ${VAR} in env_vars values when it starts the
        # worker; JSON's own escape keeps any '$' literal.
        return text.replace("$", "\\u0024")

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "Decision":
        """A record of either version."""
        if "variables" in data:
            variables = {name: VariableDecision.from_dict(entry)
                         for name, entry in data["variables"].items()}
        else:
            variables = _version_1_variables(data)
        known = {k: v for k, v in data.items()
                 if k in cls.__dataclass_fields__ and k != "variables"}
        known["warnings"] = tuple(known.get("warnings", ()))
        known.setdefault("gpus", None)
        known.setdefault("record", 1)
        return cls(variables, **known)

    @classmethod
    def from_json(cls, text: str) -> "Decision":
        return cls.from_dict(json.loads(text))


def _version_1_variables(data: Mapping[str, Any]) -> Dict[str, VariableDecision]:
    strengths = data.get("strengths") or {}
    requirement = data.get("requirement", "none")
    reason = data.get("reason", "")
    process = data.get("process")
    if process and reason.startswith(f"{process}: "):
        reason = reason[len(process) + 2:]
    roles = {role: {"engine": engine, "rule": (data.get("rules") or {}).get(role, ""),
                    "strength": strengths.get(role, "none"),
                    "because": (data.get("because") or {}).get(role, "")}
             for role, engine in (data.get("engines") or {}).items()}
    cuda = VariableDecision(
        CUDA_CONNECTIONS, LEAVE if requirement == "none" else SET, data.get("value"),
        data.get("source", NONE),
        min(strengths.values(), key=_STRONGEST.index, default="none"),
        "+".join(dict.fromkeys(i for ids in (data.get("rules") or {}).values()
                               for i in ids.split("+"))),
        reason, data.get("node_value"),
        {"requirement": requirement, "conflict": bool(data.get("conflict")), "roles": roles})
    variables = {CONNECTIONS_VARIABLE: cuda}
    for name, entry in (data.get("packs") or {}).items():
        variables[name] = VariableDecision.from_dict(entry)
    return variables


@dataclass(frozen=True)
class Settled:
    """One outcome after the precedence: its record entry, what to do to the
    worker's ``env_vars``, the warnings, and whether its required demands
    hold."""

    entry: VariableDecision
    write: Optional[str]
    remove: bool
    warnings: Tuple[str, ...]
    satisfied: bool


def settle(outcome: Outcome, env_vars: Mapping[str, Any], node_environ: Mapping[str, str], *,
           pack: str, framework: Optional[str] = None,
           default: Optional[str] = None, driver_value: Optional[str] = None) -> Settled:
    """The one precedence, for every variable of every pack: the job's own
    ``env_vars`` value is kept (a warning names each demand it breaks),
    except where the outcome removes it; else a value inherited from the
    node is kept where the outcome accepts it and replaced where it does
    not; else the outcome's value is written, or the variable stays unset.
    ``default`` words the library's own value for an unset variable.

    ``driver_value`` is the driver's own value that a framework copied into
    the worker's ``env_vars`` (``split_driver_env``; not in ``env_vars``
    here): it is the inherited value, in place of the node's."""
    name = outcome.variable
    present = env_vars.get(name)
    explicit = None if present is None or outcome.replaces is not None else str(present)
    node_own = node_environ.get(name)
    inherited = driver_value if driver_value is not None else node_own
    whose = ("the driver's value {0} (copied into env_vars from the driver's environment)"
             if driver_value is not None else "the node's value {0}")
    demands = outcome.demands if outcome.demands is not None else _own_demands(outcome, pack)
    accepts = outcome.accepts if outcome.accepts is not None else (
        frozenset({canonical(outcome.value, name)}) if outcome.value is not None else frozenset())
    warnings: List[str] = []
    write, remove = None, False
    if outcome.action == REMOVE and explicit is not None:
        value, source, said, remove = None, POLICY, f"the explicit env_vars value {explicit} " \
                                                    "is removed", True
    elif explicit is not None:
        value, source, said = explicit, EXPLICIT, f"the explicit env_vars value {explicit} is kept"
        broken = [d for d in demands if not d.allows(explicit)]
        if broken:
            kind = ("a required rule" if any(d.strength == REQUIRED for d in broken)
                    else "a preferred rule")
            said += f" although it breaks {kind}"
            warnings.append(f"explicit {name}={explicit} breaks {kind} of "
                            f"{', '.join(d.who for d in broken)}; kept because env_vars is the "
                            "user's intent")
    elif driver_value is not None and outcome.action == REMOVE:
        # The copy is the job's env_vars: it can go, and the node's own stays.
        write, remove = node_own, node_own is None
        value, source = node_own, NODE if node_own is not None else POLICY
        said = f"{whose.format(driver_value)} is removed" + (
            f"; the node's value {node_own} stays" if node_own is not None else "")
        if node_own is not None:
            warnings.append(f"{name}={node_own} comes from the node's environment, which a "
                            f"runtime env cannot unset: {outcome.reason}; unset it where Ray is "
                            "started")
    elif inherited is not None and (outcome.action != SET or canonical(inherited, name) in accepts):
        value, source = inherited, DRIVER_ENV if driver_value is not None else NODE
        said = f"{whose.format(inherited)} is kept"
        if outcome.action == REMOVE:
            said = f"the node's value {inherited} stays: a runtime env cannot unset it"
            warnings.append(f"{name}={inherited} comes from the node's environment, which a "
                            f"runtime env cannot unset: {outcome.reason}; unset it where Ray is "
                            "started")
    elif outcome.action == SET and (inherited is not None or outcome.fill):
        value = write = outcome.value
        source = POLICY
        said = (f"{whose.format(inherited)} is replaced by {value}" if inherited is not None
                else f"set to {value}")
    else:
        value, source = None, NONE
        said = f"left unset ({default})" if outcome.action == SET and default else "left unset"
    if outcome.replaces is not None:
        # The framework's own value sits in env_vars: the answer goes over it.
        write, remove = value, value is None
        said = (f"{framework or 'the framework'}'s own {name}={outcome.replaces} for every "
                f"process is replaced: {said}")
    entry = VariableDecision(pack, outcome.action, value, source, outcome.strength, outcome.rule,
                             f"{outcome.reason}; {said}.", node_own, dict(outcome.detail),
                             driver_value)
    satisfied = all(d.allows(value) for d in demands if d.strength == REQUIRED)
    return Settled(entry, write, remove, tuple(warnings), satisfied)


def _own_demands(outcome: Outcome, pack: str) -> Tuple[Demand, ...]:
    """A ``set`` demands its accepted values (or unset, without ``fill``), a
    ``remove`` no value, at the outcome's strength."""
    if outcome.strength not in (REQUIRED, PREFERRED) or outcome.action not in (SET, REMOVE):
        return ()
    if outcome.action == SET:
        accepts = outcome.accepts if outcome.accepts is not None else frozenset(
            {canonical(outcome.value or "", outcome.variable)})
        asks = outcome.value
    else:
        accepts, asks = frozenset(), "it unset"
    unset_ok = outcome.action == REMOVE or not outcome.fill
    return (Demand(outcome.rule, outcome.strength, accepts, unset_ok,
                   f"the {pack} pack (asks {asks}) [{outcome.rule}; {outcome.reason}]",
                   outcome.variable),)


def split_driver_env(spec: Spec, env_vars: Mapping[str, Any]
                     ) -> Tuple[Mapping[str, Any], Dict[str, str]]:
    """``env_vars`` without the values the field's ``driver_env`` names
    (each exactly the driver's own value: a framework's copy of the driver's
    environment), and those values, by variable. A framework's own blanket
    value (``replaces``) is left to its own rule."""
    copied = {name: value for name, value in spec.driver_env
              if name in env_vars and str(env_vars[name]) == value
              and not (name == CONNECTIONS_VARIABLE and value == spec.replaces)}
    if not copied:
        return env_vars, {}
    return {k: v for k, v in env_vars.items() if k not in copied}, copied


@dataclass(frozen=True)
class NodeDecision:
    """Everything one worker gets on one node: the decision (the record),
    the variables to write into its ``env_vars`` (the record itself
    included) and the variables to delete from them."""

    decision: Decision
    write: Dict[str, str]
    remove: Tuple[str, ...]

    def write_to(self, env_vars: MutableMapping[str, str],
                 logger: Optional[logging.Logger] = None) -> None:
        """Write the worker's variables into ``env_vars``, and log the
        decision (both ways in do this, the same way)."""
        for name in self.remove:
            env_vars.pop(name, None)
        env_vars.update(self.write)
        for level, line in self.decision.log_lines() if logger is not None else ():
            logger.log(level, "%s", line)

    def env(self) -> Dict[str, str]:
        """The variables written, without the record."""
        return {k: v for k, v in self.write.items() if k != DECISION_VARIABLE}


def decide_node(spec: Spec, facts: NodeFacts, env_vars: Mapping[str, Any],
                node_environ: Mapping[str, str], *, via: Optional[str] = None) -> NodeDecision:
    """The decision for one worker on a node: ``cuda-connections`` and the
    packs the job asked for over this node's ``facts``, each outcome
    settled by the one precedence.

    ``env_vars`` are the worker's own (the job's merged with its actor's):
    where a framework marks its process kinds and where explicit values
    live; ``node_environ`` the environment the worker would inherit.
    """
    worker, process = spec.for_process(env_vars)
    variables: Dict[str, VariableDecision] = {}
    warnings: List[str] = []
    write: Dict[str, str] = {}
    remove: List[str] = []
    satisfied = True
    # The driver's copied values: inherited, as if the worker had them from its node.
    job_vars, copied = split_driver_env(spec, env_vars)
    seen_environ = {**node_environ, **copied} if copied else node_environ
    for name in (*ALWAYS_ON, *spec.packs):
        pack = get_pack(name)
        verdict = pack.evaluate(worker, facts, job_vars, seen_environ)
        warnings.extend(verdict.warnings)
        defaults = dict(pack.defaults)
        for outcome in verdict.outcomes:
            settled = settle(outcome, job_vars, node_environ, pack=name,
                             framework=spec.framework, default=defaults.get(outcome.variable),
                             driver_value=copied.get(outcome.variable))
            variables[outcome.variable] = settled.entry
            if settled.write is not None:
                write[outcome.variable] = settled.write
            if settled.remove:
                remove.append(outcome.variable)
            prefix = "" if name in ALWAYS_ON else f"{name}: "
            warnings.extend(prefix + warning for warning in settled.warnings)
            satisfied = satisfied and settled.satisfied
    gpus = facts.gpus
    decision = Decision(
        variables, gpus.labels(),
        {"method": gpus.method, "error": gpus.error, "detail": gpus.detail,
         "vendor": gpus.vendor, "probed_at": gpus.probed_at, "pid": gpus.probe_pid},
        tuple(warnings), satisfied, process, spec.framework, via)
    write[DECISION_VARIABLE] = decision.to_json()
    return NodeDecision(decision, write, tuple(remove))
