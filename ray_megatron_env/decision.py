"""The decision for one node: the value, where it came from, and why.

``decide`` applies the precedence (docs/how-it-works.md#precedence) on top
of the policy's verdict. A ``Decision`` travels to every worker as JSON in
``RAY_MEGATRON_ENV_DECISION`` and is what the CLI prints.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Mapping, MutableMapping, Optional, Tuple

from . import __version__
from .field import explicit_value, parse_connections
from .gpus import NodeGpus
from .node import NodeFacts
from .packs import REMOVE, REQUIRED, SET, Outcome, get_pack
from .policy import (
    FRAMEWORK_ROLE_FIX, ONE_ENGINE_FIX, Verdict, by_role, evaluate, within_one_engine,
)
from .rules import NOTHING, VARIABLE
from .spec import Spec

DECISION_VARIABLE = "RAY_MEGATRON_ENV_DECISION"

EXPLICIT, POLICY, NODE, NONE = "explicit", "policy", "node", "none"
VIA_PLUGIN, VIA_SETUP_HOOK = "plugin", "setup-hook"


@dataclass(frozen=True)
class Decision:
    value: Optional[str]  # what the worker's CUDA_DEVICE_MAX_CONNECTIONS is; None: unset
    source: str  # explicit | policy | node | none
    reason: str
    requirement: str  # what the value must meet: '1', 'not 1', 'not 1 (32 preferred)', 'none'
    gpus: Optional[List[str]]  # capabilities seen on the node; None if not readable
    engines: Dict[str, str] = field(default_factory=dict)  # role -> engine
    rules: Dict[str, str] = field(default_factory=dict)  # role -> rule id
    strengths: Dict[str, str] = field(default_factory=dict)  # role -> required|preferred|none
    because: Dict[str, str] = field(default_factory=dict)  # role -> the strength in words
    conflict: bool = False  # some engine's requirement is not met in this env
    satisfied: bool = True  # the value meets every *required* rule in scope
    warnings: Tuple[str, ...] = ()
    node_value: Optional[str] = None  # inherited from the node's environment
    process: Optional[str] = None  # how this worker was classified, if the field says how
    framework: Optional[str] = None
    probe: Dict[str, Any] = field(default_factory=dict)
    via: Optional[str] = None  # which path decided: plugin (the node's agent) | setup-hook (the worker)
    version: str = __version__
    # One entry per variable of the packs the job asked for (packs/): pack,
    # action, value, source, strength, rule, reason. Absent from the record
    # when the job asked for none, so such records are what they always were.
    packs: Dict[str, Dict[str, Any]] = field(default_factory=dict)

    def to_dict(self) -> Dict[str, Any]:
        out = asdict(self)
        out["warnings"] = list(self.warnings)
        if not self.packs:
            del out["packs"]
        return out

    def to_json(self) -> str:
        text = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        # Ray expands $VAR and ${VAR} in env_vars values when it starts the
        # worker; JSON's own escape keeps any '$' literal.
        return text.replace("$", "\\u0024")

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "Decision":
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        known["warnings"] = tuple(known.get("warnings", ()))
        return cls(**known)

    @classmethod
    def from_json(cls, text: str) -> "Decision":
        return cls.from_dict(json.loads(text))


def _as_count(value: Optional[str]) -> Optional[int]:
    """The value as a connection count, or None (unset or not a valid count)."""
    try:
        return parse_connections(value, VARIABLE)
    except (TypeError, ValueError):
        return None


def decide(spec: Spec, gpus: NodeGpus, *, explicit: Optional[str] = None,
           inherited: Optional[str] = None, process: Optional[str] = None,
           replaced: Optional[str] = None) -> Decision:
    """Apply the precedence to the policy's verdict for this node.

    ``explicit`` is the runtime env's own ``env_vars`` value (already checked);
    ``inherited`` is the node's environment value, if any; ``process`` says
    how the worker was classified, when the spec classifies workers;
    ``replaced`` is a framework's blanket value found in ``env_vars`` and
    decided anew (``Spec.replaces``).
    """
    verdict = evaluate(spec, gpus)
    value, source, outcome, warnings = _resolve(verdict, explicit, inherited)
    if replaced is not None:
        outcome = (f"{spec.framework or 'the framework'}'s own {VARIABLE}={replaced} for every "
                   f"process is replaced: {outcome}")
    warnings = _conflict_warnings(verdict, spec.framework) + warnings
    if not gpus.is_known:
        warnings.insert(0, f"the GPU probe ({gpus.method}) could not read the GPUs' compute "
                           f"capability, so the node was treated as pre-Blackwell: {gpus.error}")
    left_out = "".join(f"; {role}: {why}" for role, why in spec.omitted)
    reason = f"{verdict.reason}{left_out}; {outcome}."
    if process:
        reason = f"{process}: {reason}"
    roles = by_role(verdict.findings)  # an engine may take more than one row
    return Decision(
        value=value,
        source=source,
        reason=reason,
        requirement=verdict.requirement.label,
        gpus=gpus.labels(),
        engines={f.role: f.engine.describe() for f in verdict.findings},
        rules={role: ids for role, (ids, _, _) in roles.items()},
        strengths={role: strength for role, (_, strength, _) in roles.items()},
        because={role: words for role, (_, _, words) in roles.items()},
        conflict=verdict.conflict,
        satisfied=not verdict.hard_conflict and verdict.required.allows(_as_count(value)),
        warnings=tuple(warnings),
        node_value=inherited,
        process=process,
        framework=spec.framework,
        probe={"method": gpus.method, "error": gpus.error, "detail": gpus.detail,
               "vendor": gpus.vendor, "probed_at": gpus.probed_at, "pid": gpus.probe_pid},
    )


def decide_for_worker(spec: Spec, gpus: NodeGpus, env_vars: Mapping[str, Any], *,
                      inherited: Optional[str] = None) -> Decision:
    """The decision for one worker: classified by its own ``env_vars`` (the
    spec's process rules), with the explicit value found there, unless it is
    the framework's own blanket value (``Spec.replaces``), decided anew."""
    spec, process = spec.for_process(env_vars)
    explicit = explicit_value(env_vars)
    replaced = explicit if explicit is not None and explicit == spec.replaces else None
    return decide(spec, gpus, explicit=None if replaced else explicit, inherited=inherited,
                  process=process, replaced=replaced)


def _conflict_warnings(verdict: Verdict, framework: Optional[str] = None) -> List[str]:
    out = []
    for finding in verdict.unmet:
        rule = finding.rule
        if within_one_engine(verdict.findings, finding):  # a row and a beside assert
            out.append(f"{finding.role} ({finding.engine.describe()}) asks "
                       f"{rule.requirement.label} [{rule.id}; {finding.because()}] while "
                       f"another of its rows asks {verdict.requirement.label}; fix: "
                       f"{ONE_ENGINE_FIX}")
            continue
        out.append(
            f"{finding.role} ({finding.engine.describe()}) asks {rule.requirement.label} "
            f"[{rule.id}; {finding.because()}], which this shared runtime env "
            f"cannot give ({verdict.requirement.label} is what the other roles need); fix: "
            + (FRAMEWORK_ROLE_FIX[framework] if framework in FRAMEWORK_ROLE_FIX else
               f"give {finding.role} its own env with build_runtime_env(config, "
               f"role={finding.role!r})"))
    return out


def _broken(verdict: Verdict, value: int) -> str:
    """'actor [megatron-model-parallel; required: ...]' for each rule ``value`` breaks."""
    return ", ".join(f"{f.role} (asks {f.rule.requirement.label}) [{f.rule.id}; {f.because()}]"
                     for f in verdict.findings if not f.rule.requirement.allows(value))


def _resolve(verdict: Verdict, explicit: Optional[str], inherited: Optional[str]):
    need = verdict.requirement
    warnings: List[str] = []
    if explicit is not None:
        count = parse_connections(explicit, VARIABLE)
        broken = _broken(verdict, count)
        if not broken:
            return explicit, EXPLICIT, f"the explicit env_vars value {explicit} is kept", warnings
        kind = ("a required rule" if not verdict.required.allows(count)
                else "a preferred rule")
        warnings.append(f"explicit {VARIABLE}={explicit} breaks {kind} of {broken}; kept "
                        "because env_vars is the user's intent")
        return (explicit, EXPLICIT,
                f"the explicit env_vars value {explicit} is kept although it breaks {kind}",
                warnings)
    if inherited is not None:
        parsed = _as_count(inherited)
        if parsed is None:
            warnings.append(f"the node's {VARIABLE}={inherited!r} is not an integer from 1 "
                            "to 32")
        if need == NOTHING or (parsed is not None and need.allows(parsed)):
            return inherited, NODE, f"the node's value {inherited} is kept", warnings
        chosen = str(need.choose())
        return chosen, POLICY, f"the node's value {inherited} is replaced by {chosen}", warnings
    if not need.unset_ok or need.preferred_value is not None:
        chosen = str(need.choose())
        return chosen, POLICY, f"set to {chosen}", warnings
    if need == NOTHING:
        return None, NONE, "left unset", warnings
    return None, NONE, "left unset (CUDA's default, 8)", warnings


@dataclass(frozen=True)
class NodeDecision:
    """Everything one worker gets on one node: the decision (the record),
    the variables to write into its ``env_vars`` (the record itself
    included) and the variables to delete from them."""

    decision: Decision
    write: Dict[str, str]
    remove: Tuple[str, ...]

    def apply(self, env_vars: MutableMapping[str, str]) -> None:
        for name in self.remove:
            env_vars.pop(name, None)
        env_vars.update(self.write)

    def env(self) -> Dict[str, str]:
        """The variables written, without the record."""
        return {k: v for k, v in self.write.items() if k != DECISION_VARIABLE}


def decide_node(spec: Spec, facts: NodeFacts, env_vars: Mapping[str, Any],
                node_environ: Mapping[str, str], *, via: Optional[str] = None) -> NodeDecision:
    """The one entry point for a worker on a node (the agent's plugin path and
    a worker-side fallback both call it): the packs the job asked for over
    this node's ``facts``, with the precedence applied once per variable.

    ``env_vars`` are the worker's own (the job's merged with its actor's);
    ``node_environ`` the environment the worker would inherit. An explicit
    ``env_vars`` value is kept (with a warning where a required row wants
    another), except where a row removes it; an inherited value a row
    disagrees with is replaced.
    """
    decision = decide_for_worker(spec, facts.gpus, env_vars,
                                 inherited=node_environ.get(VARIABLE))
    write: Dict[str, str] = {}
    remove: List[str] = []
    if decision.source != EXPLICIT:
        if decision.value is not None:
            write[VARIABLE] = decision.value
        elif VARIABLE in env_vars:  # a framework's blanket value, decided anew as "unset"
            remove.append(VARIABLE)
    records: Dict[str, Dict[str, Any]] = {}
    warnings = list(decision.warnings)
    broken = False
    worker_spec = spec.for_process(env_vars)[0]
    for name in spec.packs:
        pack = get_pack(name)
        verdict = pack.evaluate(worker_spec, facts, env_vars, node_environ)
        warnings.extend(verdict.warnings)
        for outcome in verdict.outcomes:
            record, warning = _precedence(outcome, env_vars.get(outcome.variable),
                                          node_environ.get(outcome.variable), write, remove)
            records[outcome.variable] = {"pack": name, **record}
            if warning:
                warnings.append(f"{name}: {warning}")
                broken = broken or outcome.strength == REQUIRED
    if records or via is not None:
        decision = dataclasses.replace(
            decision, via=via, packs=records, warnings=tuple(warnings),
            satisfied=decision.satisfied and not broken)
    write[DECISION_VARIABLE] = decision.to_json()
    return NodeDecision(decision, write, tuple(remove))


def _precedence(outcome: Outcome, explicit: Optional[Any], inherited: Optional[str],
                write: Dict[str, str], remove: List[str]) -> Tuple[Dict[str, Any], Optional[str]]:
    """One pack variable: the record entry, and a warning if any. Fills
    ``write`` and ``remove``."""
    name, want = outcome.variable, outcome.value
    entry = {"action": outcome.action, "strength": outcome.strength, "rule": outcome.rule,
             "reason": outcome.reason}
    warning = None
    if outcome.action == REMOVE:
        if explicit is not None:
            remove.append(name)
            return {**entry, "value": None, "source": POLICY}, None
        if inherited is not None:
            warning = (f"{name}={inherited} comes from the node's environment, which a runtime "
                       f"env cannot unset: {outcome.reason}; unset it where Ray is started")
            return {**entry, "value": inherited, "source": NODE}, warning
        return {**entry, "value": None, "source": NONE}, None
    if outcome.action == SET:
        if explicit is not None:
            if str(explicit) != want:
                warning = (f"explicit {name}={explicit} is kept because env_vars is the user's "
                           f"intent, but [{outcome.rule}] ({outcome.strength}) wants {want}: "
                           f"{outcome.reason}")
            return {**entry, "value": str(explicit), "source": EXPLICIT}, warning
        if inherited == want:
            return {**entry, "value": inherited, "source": NODE}, None
        write[name] = want
        return {**entry, "value": want, "source": POLICY}, None
    # keep (the job's value stays; the pack's warning says why) or leave
    if explicit is not None:
        return {**entry, "value": str(explicit), "source": EXPLICIT}, None
    if inherited is not None:
        return {**entry, "value": inherited, "source": NODE}, None
    return {**entry, "value": None, "source": NONE}, None
