"""The policy: engines in scope x a node's GPUs -> what the variable must be.

Pure: no Ray, no I/O, no clock. It walks ``rules.RULES`` for each engine,
combines the requirements, and says why in one sentence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

from .gpus import NodeGpus
from .rules import (
    ANY, BLACKWELL_OR_NEWER, NO_GPU, NOTHING, PRE_BLACKWELL, RULES, Requirement, Rule,
)
from .spec import Engine, Spec


@dataclass(frozen=True)
class Finding:
    role: str
    engine: Engine
    rule: Rule


@dataclass(frozen=True)
class Verdict:
    requirement: Requirement
    findings: Tuple[Finding, ...]
    conflict: bool
    reason: str  # a sentence without its final full stop; precedence adds to it


def gpu_class(gpus: NodeGpus) -> str:
    if gpus.capabilities is None:
        return PRE_BLACKWELL  # unknown: the conservative class (see rules.py)
    if not gpus.capabilities:
        return NO_GPU
    return BLACKWELL_OR_NEWER if gpus.oldest[0] >= 10 else PRE_BLACKWELL


def _matches(rule: Rule, engine: Engine, gpus: str) -> bool:
    return (
        rule.engine in (ANY, engine.kind)
        and rule.gpus in (ANY, gpus)
        and rule.model_parallel in (None, engine.model_parallel)
        and rule.fsdp in (None, engine.fsdp)
        and rule.moe_overlap in (None, engine.moe_overlap)
    )


def rule_for(engine: Engine, gpus: str) -> Rule:
    for rule in RULES:
        if _matches(rule, engine, gpus):
            return rule
    raise AssertionError(f"no rule covers {engine} on {gpus}")  # the table is total


def _phrase(requirement: Requirement) -> str:
    if requirement == NOTHING:
        return "needs nothing"
    if requirement.label == "not 1":
        return "must not run with 1"
    return f"needs {requirement.label}"


def _clauses(findings: Tuple[Finding, ...]) -> str:
    """'actor and ref (megatron TP=2 CP=1) need 1 [rule]; ...': roles with
    the same engine and rule share one clause."""
    groups: dict = {}
    for f in findings:
        groups.setdefault((f.engine.describe(), f.rule), []).append(f.role)
    parts = []
    for (engine, rule), roles in groups.items():
        phrase = _phrase(rule.requirement)
        if len(roles) > 1:
            phrase = phrase.replace("needs", "need")
        who = ", ".join(roles[:-1]) + " and " + roles[-1] if len(roles) > 1 else roles[0]
        parts.append(f"{who} ({engine}) {phrase} [{rule.id}]")
    return "; ".join(parts)


def evaluate(spec: Spec, gpus: NodeGpus) -> Verdict:
    """What the engines of ``spec`` require on a node with ``gpus``."""
    where = gpus.describe()
    if gpus.capabilities == ():
        # One statement for the node rather than one per engine.
        rule = RULES[0]
        findings = tuple(Finding(role, engine, rule) for role, engine in spec.engines)
        return Verdict(NOTHING, findings, False,
                       f"no NVIDIA GPU on this node, so there is nothing to set [{rule.id}]")
    if not spec.engines:
        return Verdict(NOTHING, (), False, "no engine is in scope, so nothing is required")
    cls = gpu_class(gpus)
    findings = tuple(Finding(role, engine, rule_for(engine, cls))
                     for role, engine in spec.engines)
    clauses = _clauses(findings)
    combined = NOTHING
    for finding in findings:
        combined = combined.meet(finding.rule.requirement)
        if combined is None:
            break
    else:
        return Verdict(combined, findings, False, f"{where}: {clauses}")
    # No value satisfies every engine. The engines that need 1 fail outright
    # without it (Megatron asserts); the others only lose overlap. So 1 wins.
    winners = [f for f in findings if 1 in f.rule.requirement.accepted
               and f.rule.requirement.is_constraint]
    combined = NOTHING
    for finding in winners:
        combined = combined.meet(finding.rule.requirement)
    return Verdict(combined, findings, True,
                   f"{where}: {clauses}; these conflict in one runtime env, so "
                   f"{combined.label} wins for correctness (give each role its own env "
                   "with build_runtime_env(role=...))")
