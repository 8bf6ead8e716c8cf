"""The policy: engines in scope x a node's GPUs -> what the variable must be.

Pure: no Ray, no I/O, no clock. It walks ``rules.RULES`` for each engine,
combines the requirements by strength, and says why in one sentence.

Combining: every *required* requirement must hold; two that cannot both
hold are a hard conflict (the job fails somewhere whatever the value).
*Preferred* requirements are then met where they can be; when they disagree
with each other, the ones that accept 1 win (Megatron's collective ordering
over another engine's overlap), and each preference left unmet is named.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, Optional, Sequence, Tuple

from .gpus import NodeGpus
from .rules import (
    ANY, BLACKWELL_OR_NEWER, NO_GPU, NON_CUDA, NONE, NOTHING, PRE_BLACKWELL, PREFERRED,
    REQUIRED, RULES, Requirement, Rule,
)
from .spec import Engine, Spec


@dataclass(frozen=True)
class Finding:
    role: str
    engine: Engine
    rule: Rule

    @property
    def strength(self) -> str:
        return self.rule.strength_for(self.engine.checks)

    def because(self) -> str:
        return self.rule.because(self.strength, self.engine.checks)

    def words(self) -> str:
        return f"{self.role} ({self.engine.describe()}) [{self.rule.id}]"


@dataclass(frozen=True)
class Verdict:
    requirement: Requirement  # what the value must meet: required and kept preferences
    required: Requirement  # the required part alone (NOTHING when nothing is required)
    findings: Tuple[Finding, ...]
    conflict: bool  # some requirement in scope cannot be met
    hard_conflict: bool  # two required requirements cannot both hold
    unmet: Tuple[Finding, ...]  # findings the chosen requirement does not satisfy
    reason: str  # a sentence without its final full stop; precedence adds to it


def gpu_class(gpus: NodeGpus) -> str:
    if gpus.capabilities is None:
        return PRE_BLACKWELL  # unknown: the conservative class (see rules.py)
    if gpus.vendor is not None:
        # AMD, Ascend, Moore Threads: the runtime ignores the variable, but
        # Megatron-LM's Python check still reads it (they report a major
        # version below 10: PyTorch on ROCm gives Instinct GPUs 9.x).
        return NON_CUDA
    if not gpus.capabilities:
        return NO_GPU
    return BLACKWELL_OR_NEWER if gpus.oldest[0] >= 10 else PRE_BLACKWELL


def _matches(rule: Rule, engine: Engine, gpus: str) -> bool:
    return (
        rule.engine in (ANY, engine.kind)
        and rule.gpus in (ANY, gpus)
        and rule.model_parallel in (None, engine.model_parallel)
        and rule.megatron_fsdp in (None, engine.megatron_fsdp)
        and rule.torch_fsdp2 in (None, engine.torch_fsdp2)
        and rule.moe_overlap in (None, engine.moe_overlap)
        and rule.dispatcher in (None, engine.flex_dispatcher)
        and rule.ucc_pipeline in (None, engine.ucc_pipeline)
    )


def rule_for(engine: Engine, gpus: str, rules: Sequence[Rule] = RULES) -> Rule:
    """The first matching row (rows marked ``beside`` are not alternatives)."""
    for rule in rules:
        if not rule.beside and _matches(rule, engine, gpus):
            return rule
    raise AssertionError(f"no rule covers {engine} on {gpus}")  # the table is total


def rules_for(engine: Engine, gpus: str, rules: Sequence[Rule] = RULES) -> Tuple[Rule, ...]:
    """Every row an engine takes: its first match, then each ``beside``
    row (an assert that holds whatever else the engine does) that matches."""
    return (rule_for(engine, gpus, rules),) + tuple(
        rule for rule in rules if rule.beside and _matches(rule, engine, gpus))


_STRONGEST = (REQUIRED, PREFERRED, NONE)


def by_role(findings: Iterable[Finding]) -> Dict[str, Tuple[str, str, str]]:
    """role -> (rule ids joined by '+', the strongest strength, the strengths
    in words joined by '; '): one entry per role even where an engine takes
    more than one row."""
    grouped: Dict[str, list] = {}
    for finding in findings:
        grouped.setdefault(finding.role, []).append(finding)
    out = {}
    for role, found in grouped.items():
        strength = min((f.strength for f in found), key=_STRONGEST.index)
        # Rows that ask nothing add no words beside a row that asks something.
        said = [f for f in found if f.strength != NONE] or found[:1]
        out[role] = ("+".join(f.rule.id for f in found), strength,
                     "; ".join(f.because() for f in said))
    return out


def within_one_engine(findings: Sequence[Finding], finding: Finding) -> bool:
    """Whether ``finding`` conflicts with another row of its own engine (a
    table row and a ``beside`` assert), which no per-role env can fix."""
    return any(f.role == finding.role and f is not finding for f in findings)


ONE_ENGINE_FIX = ("no runtime env can meet both, since one engine's own settings ask for "
                  "them: change that engine's settings (its pipeline backend or its TP/CP)")
ROLE_FIX = "give each role its own env with build_runtime_env(role=...)"
# NeMo-RL builds every worker group's runtime env in its own code
# (nemo_rl/distributed/worker_groups.py), so there is no place for a user's
# per-role env without changing that code.
FRAMEWORK_ROLE_FIX = {
    "nemo-rl": "NeMo-RL builds each worker group's runtime env itself, so a per-role env "
               "needs a change there: that group's env from build_runtime_env(config, role=...)",
}


def role_fix(framework: Optional[str]) -> str:
    return FRAMEWORK_ROLE_FIX.get(framework or "", ROLE_FIX)


def _fix(findings: Sequence[Finding], unmet: Sequence[Finding],
         framework: Optional[str] = None) -> str:
    return (ONE_ENGINE_FIX if all(within_one_engine(findings, f) for f in unmet)
            else role_fix(framework))


def _phrase(requirement: Requirement, strength: str, plural: bool) -> str:
    verb = ("need" if plural else "needs")
    if requirement == NOTHING:
        return f"{verb} nothing"
    label = requirement.label
    if label.startswith("not 1"):
        return f"must not run with 1{label[5:]} ({strength})"
    return f"{verb} {label} ({strength})"


def _clauses(findings: Tuple[Finding, ...]) -> str:
    """'actor and ref (megatron TP=2 CP=1) need 1 (preferred) [rule]; ...':
    roles with the same engine and rule share one clause."""
    groups: dict = {}
    for f in findings:
        groups.setdefault((f.engine.describe(), f.rule, f.strength), []).append(f.role)
    parts = []
    for (engine, rule, strength), roles in groups.items():
        phrase = _phrase(rule.requirement, strength, len(roles) > 1)
        who = ", ".join(roles[:-1]) + " and " + roles[-1] if len(roles) > 1 else roles[0]
        parts.append(f"{who} ({engine}) {phrase} [{rule.id}]")
    return "; ".join(parts)


def _meet_all(findings: Iterable[Finding], start: Requirement = NOTHING) -> Optional[Requirement]:
    combined: Optional[Requirement] = start
    for finding in findings:
        combined = combined.meet(finding.rule.requirement)
        if combined is None:
            return None
    return combined


def _accepts_1_first(findings: Sequence[Finding]) -> Tuple[Tuple[Finding, ...], ...]:
    """The tie-break among preferences: those that accept 1, then the rest."""
    with_1 = tuple(f for f in findings if 1 in f.rule.requirement.accepted)
    return with_1, tuple(f for f in findings if f not in with_1)


def evaluate(spec: Spec, gpus: NodeGpus, rules: Sequence[Rule] = RULES) -> Verdict:
    """What the engines of ``spec`` ask on a node with ``gpus``."""
    where = gpus.describe()
    if gpus.capabilities == () and gpus.vendor is None:
        # One statement for the node rather than one per engine.
        rule = rules[0]
        findings = tuple(Finding(role, engine, rule) for role, engine in spec.engines)
        return Verdict(NOTHING, NOTHING, findings, False, False, (),
                       f"no NVIDIA GPU on this node, so there is nothing to set [{rule.id}]")
    if not spec.engines:
        return Verdict(NOTHING, NOTHING, (), False, False, (),
                       "no engine is in scope, so nothing is required")
    cls = gpu_class(gpus)
    findings = tuple(Finding(role, engine, rule)
                     for role, engine in spec.engines for rule in rules_for(engine, cls, rules))
    clauses = f"{where}: {_clauses(findings)}"
    required = [f for f in findings if f.strength == REQUIRED]
    preferred = [f for f in findings if f.strength == PREFERRED]

    hard = _meet_all(required)
    if hard is None:
        # Nothing satisfies every required rule: the job fails here whatever
        # the value. Write what the tie-break picks, and say it plainly.
        keep = next((k for k in _accepts_1_first(required) if k and _meet_all(k) is not None),
                    (required[0],))
        chosen = _meet_all(keep)
        unmet = tuple(f for f in required if f not in keep)
        return Verdict(chosen, chosen, findings, True, True, unmet,
                       f"{clauses}; these required rules cannot all hold in one runtime env, so "
                       "a worker of " + " and ".join(f.words() for f in unmet) +
                       f" fails on this node ({_fix(findings, unmet, spec.framework)})")
    combined = _meet_all(preferred, hard)
    if combined is not None:
        return Verdict(combined, hard, findings, False, False, (), clauses)
    for keep in _accepts_1_first(preferred):
        combined = _meet_all(keep, hard) if keep else None
        if combined is not None:
            break
    else:
        keep, combined = (), hard
    unmet = tuple(f for f in preferred if f not in keep)
    return Verdict(combined, hard, findings, True, False, unmet,
                   f"{clauses}; these conflict in one runtime env, so {combined.label} is kept "
                   "and the preference of " + " and ".join(f.words() for f in unmet) +
                   f" is not met ({_fix(findings, unmet, spec.framework)})")


REPRESENTATIVE_GPUS = {PRE_BLACKWELL: ((9, 0),), BLACKWELL_OR_NEWER: ((10, 0),)}


def hard_conflict_everywhere(spec: Spec, rules: Sequence[Rule] = RULES) -> Optional[Verdict]:
    """The verdict of a pre-Blackwell node when required rules conflict on
    every GPU class (no node could run the job), else None."""
    verdicts = [evaluate(spec, NodeGpus.known(caps, "given"), rules)
                for caps in REPRESENTATIVE_GPUS.values()]
    return verdicts[0] if all(v.hard_conflict for v in verdicts) else None
