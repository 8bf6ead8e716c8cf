"""Rule packs: the unit of rules. Each pack owns some variables and decides
them for one node from the node's facts and the job's config.

Shape
-----
A pack is data plus one small function:

* ``Pack``: its name, the variables it owns, the node facts and config
  facts it reads (in words, for the docs), its rows, and whether it is
  always on (``cuda-connections``) or asked for per job (``nccl-fabric``).
* ``PackRow``: one row of its table as the docs show it: when it applies,
  the action on its variables, the values, the strength, why, and the
  upstream source.
* Actions: ``set`` a value; ``remove`` a value the job set; ``keep`` the
  job's value with a warning; ``leave`` the variable to its library's own
  default.
* ``evaluate(spec, facts, env_vars, node_environ) -> PackVerdict``: one
  ``Outcome`` per variable the pack owns (what to write, which values
  already there may stay, and each row's ``Demand`` on the value), plus
  warnings that set nothing. Pure.

``decision.decide_node`` composes the packs a job asked for (always
``cuda-connections`` first) over one node's facts, applies the one
precedence (explicit ``env_vars`` value, value inherited from the node or
copied from the driver's environment (``Spec.driver_env``), unset) to every
outcome, and writes one record entry per variable. No pack knows the
precedence; the precedence knows no rule.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import import_module
from typing import TYPE_CHECKING, Any, Callable, Dict, FrozenSet, Iterable, Mapping, Optional, Tuple

from ..errors import FieldValueError
from ..values import FIELD, read_names, show

if TYPE_CHECKING:  # pragma: no cover
    from ..node import NodeFacts
    from ..spec import Spec

SET, REMOVE, KEEP, LEAVE = "set", "remove", "keep", "leave"
ACTIONS = (SET, REMOVE, KEEP, LEAVE)
REQUIRED, PREFERRED, NONE = "required", "preferred", "none"

CUDA_CONNECTIONS = "cuda-connections"
NCCL_FABRIC = "nccl-fabric"
NCCL_HOST_MEM = "nccl-host-mem"
TORCH_ARCH = "torch-arch"
# name -> module under packs/; the first is always on.
_MODULES = {CUDA_CONNECTIONS: "connections", NCCL_FABRIC: "nccl_fabric",
            NCCL_HOST_MEM: "nccl_host_mem", TORCH_ARCH: "torch_arch"}
PACK_NAMES = tuple(_MODULES)
ALWAYS_ON = (CUDA_CONNECTIONS,)
OPTIONAL_PACKS = tuple(name for name in PACK_NAMES if name not in ALWAYS_ON)


@dataclass(frozen=True)
class PackRow:
    """One row of a pack's table."""

    id: str
    when: str  # the condition, in words
    action: str  # set | remove | keep | leave
    values: Tuple[Tuple[str, str], ...]  # (variable, value) the action is about
    strength: str  # required | preferred | none
    why: str
    source: str


@dataclass(frozen=True)
class Demand:
    """One row's demand on one variable's final value, whatever the
    precedence chose: what meets it, and who asks, in words for a warning."""

    rule: str
    strength: str  # required | preferred
    accepts: FrozenSet[str]  # values that meet it (as ``canonical`` writes them)
    unset_ok: bool
    who: str  # "actor (asks not 1) [megatron-fsdp; required: ...]"
    variable: str = ""  # whose reading ``canonical`` applies

    def allows(self, value: Optional[str]) -> bool:
        return self.unset_ok if value is None else \
            canonical(value, self.variable) in self.accepts


@dataclass(frozen=True)
class Outcome:
    """What a pack says about one variable on one node.

    ``set``: ``value`` is written unless the job's own value is there (kept;
    a warning where a demand breaks) or the node's value is in ``accepts``
    (kept). ``fill=False`` leaves an unset variable unset (the value is only
    written over an inherited one outside ``accepts``). ``remove``: a job's
    value is deleted. ``keep`` and ``leave`` write nothing. ``demands``
    check the final value (``satisfied``, warnings); a ``set`` or
    ``remove`` without them demands its own value, or no value, of itself.
    ``replaces`` is a framework's own blanket value found in ``env_vars``:
    not the user's intent, so decided anew instead of kept. ``detail`` is
    added to the variable's record entry as it is (plain JSON values).
    """

    variable: str
    action: str
    value: Optional[str]  # set: the value to write; otherwise the value the row is about
    strength: str
    rule: str
    reason: str
    accepts: Optional[FrozenSet[str]] = None  # set: None means only ``value``
    fill: bool = True
    demands: Optional[Tuple[Demand, ...]] = None
    replaces: Optional[str] = None
    detail: Dict[str, Any] = field(default_factory=dict)


def canonical(value: str, variable: str = "") -> str:
    """A variable's value as its library reads it, so that two spellings of
    one value meet the same rule. NCCL's variables (every one a pack owns is
    an integer parameter) as NCCL reads them, ``strtoll(str, NULL, 0)``
    (src/misc/param.cc ncclLoadParam; src/graph/paths.cc ncclGetLevel uses
    ``strtol(str, NULL, 0)``): ``"0x0"`` is 0, ``"010"`` is 8, trailing text
    ignored; empty is NCCL's default and stays ``""``. Any other variable
    (``CUDA_DEVICE_MAX_CONNECTIONS``, read by the closed-source CUDA driver):
    a decimal integer (``"01"`` is 1, ``" 0"`` is 0); anything else exactly
    as written (``"8.0 "`` is not ``"8.0"`` to PyTorch: it ends in an empty
    entry)."""
    if variable.startswith("NCCL_") and value != "":
        from .nccl_params import nccl_param

        number = nccl_param(value, None)
        return value if number is None else str(number)
    try:
        return str(int(value.strip()))
    except ValueError:
        return value


@dataclass(frozen=True)
class PackVerdict:
    outcomes: Tuple[Outcome, ...]
    warnings: Tuple[str, ...] = ()


Evaluate = Callable[["Spec", "NodeFacts", Mapping[str, Any], Mapping[str, str]], PackVerdict]


@dataclass(frozen=True)
class Pack:
    name: str
    summary: str
    variables: Tuple[str, ...]
    node_facts: Tuple[str, ...]
    config_facts: Tuple[str, ...]
    rows: Tuple[PackRow, ...]
    evaluate: Evaluate
    # Kinds of node facts besides the GPUs it reads (FACT_KINDS), probed
    # only for jobs that ask for the pack.
    fact_kinds: Tuple[str, ...] = ()
    defaults: Tuple[Tuple[str, str], ...] = field(default=())  # variable -> the library's default

    def row(self, rule_id: str) -> PackRow:
        return next(r for r in self.rows if r.id == rule_id)


def get_pack(name: str) -> Pack:
    """The pack called ``name``; a ``FieldValueError`` listing the known ones."""
    if name not in _MODULES:
        raise FieldValueError(f"{FIELD}: unknown pack {show(name)}; known packs: "
                              f"{', '.join(PACK_NAMES)}")
    return import_module(f".{_MODULES[name]}", __name__).PACK


def fact_kinds(names: Iterable[str]) -> FrozenSet[str]:
    """The kinds of node fact besides the GPUs (``node.FACT_KINDS``) that the
    packs called ``names`` read: only those are probed."""
    return frozenset(kind for name in names for kind in get_pack(name).fact_kinds)


def read_packs(value: Any, key: str = "packs") -> Tuple[str, ...]:
    """A job's pack list, checked: names of optional packs, sorted, once each.
    ``cuda-connections`` is always on and may be named."""
    if isinstance(value, str):
        value = [value]
    names = read_names(value, key, PACK_NAMES, "pack", "known packs")
    return tuple(sorted({v for v in names if v not in ALWAYS_ON}))


def markdown_table(pack: Pack) -> str:
    """A pack's rows as ``docs/packs.md`` shows them (a test keeps it in step)."""
    lines = ["| # | row | when | action | variables | strength | why | source |",
             "|---|---|---|---|---|---|---|---|"]
    for number, row in enumerate(pack.rows, 1):
        values = ", ".join(f"`{var}={val}`" if val else f"`{var}`" for var, val in row.values)
        lines.append(f"| {number} | `{row.id}` | {row.when} | {row.action} | {values or '-'} | "
                     f"{row.strength} | {row.why} | {row.source} |")
    return "\n".join(lines)


def markdown_packs() -> str:
    """Every pack: what it owns and reads, and its table."""
    out = []
    for name in PACK_NAMES:
        pack = get_pack(name)
        on = "always on" if name in ALWAYS_ON else f"opt-in, `packs: [{name}]`"
        out += [f"### `{name}`: {on}", "", pack.summary, "",
                f"- variables: {', '.join(f'`{v}`' for v in pack.variables)}",
                f"- node facts: {'; '.join(pack.node_facts)}",
                f"- config facts: {'; '.join(pack.config_facts)}"]
        if pack.defaults:
            out.append("- the library's default when unset: " +
                       "; ".join(f"`{v}`: {d}" for v, d in pack.defaults))
        # The always-on pack's table, with every condition, is rules.md's alone.
        table = ("Its rows, with every condition, are in [rules.md](rules.md#the-table)."
                 if name in ALWAYS_ON else markdown_table(pack))
        out += ["", table, ""]
    return "\n".join(out).rstrip()
