"""The record: what one worker got, written into it as JSON in
``RAY_MEGATRON_ENV_DECISION`` by either path (docs/record.md), and read back
with ``read_decision``. Version 2 holds one entry per variable; a version-1
record (0.x: CUDA's answer in top-level keys, other variables under
``packs``) is still read.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field, fields
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ._version import __version__
from .names import ALWAYS_ON, CONNECTIONS_VARIABLE, CUDA_CONNECTIONS, DECISION_VARIABLE, FIELD
from .packs.connections import ConnectionsDetail, RoleDecision
from .packs.pack import LEAVE, PREFERRED, REQUIRED, SET

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
    def cuda_detail(self) -> ConnectionsDetail:
        """What the cuda-connections pack recorded beside its value, typed."""
        return ConnectionsDetail.from_dict(self.cuda.detail)

    @property
    def requirement(self) -> str:
        return self.cuda_detail.requirement

    @property
    def conflict(self) -> bool:
        return self.cuda_detail.conflict

    def _roles(self, key: str) -> Dict[str, str]:
        return {role: getattr(part, key) for role, part in self.cuda_detail.roles.items()}

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
    roles = {role: RoleDecision(engine, (data.get("rules") or {}).get(role, ""),
                                strengths.get(role, "none"),
                                (data.get("because") or {}).get(role, ""))
             for role, engine in (data.get("engines") or {}).items()}
    cuda = VariableDecision(
        CUDA_CONNECTIONS, LEAVE if requirement == "none" else SET, data.get("value"),
        data.get("source", NONE),
        min(strengths.values(), key=_STRONGEST.index, default="none"),
        "+".join(dict.fromkeys(i for ids in (data.get("rules") or {}).values()
                               for i in ids.split("+"))),
        reason, data.get("node_value"),
        ConnectionsDetail(requirement, bool(data.get("conflict")), roles).to_dict())
    variables = {CONNECTIONS_VARIABLE: cuda}
    for name, entry in (data.get("packs") or {}).items():
        variables[name] = VariableDecision.from_dict(entry)
    return variables


def read_decision(environ: Optional[Mapping[str, str]] = None) -> Optional[Decision]:
    """The decision made for this worker's node (by the plugin or by the
    setup hook: ``.via`` says which), or ``None`` when the worker was started
    without the ``megatron_env`` field or on a node where neither ran."""
    text = (os.environ if environ is None else environ).get(DECISION_VARIABLE)
    return Decision.from_json(text) if text else None
