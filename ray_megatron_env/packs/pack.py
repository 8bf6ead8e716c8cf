"""What a pack is: its rows and outcomes (the packs' names are in ``names``).

Every pack module (``connections``, ``nccl_fabric``, ...) imports its shape
from here; the registry (``packs/__init__``), which loads the pack modules,
sits above them. A pack module never imports the registry.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Dict, FrozenSet, Mapping, Optional, Tuple

from ..engines import INFERENCE
from ..names import TEXT_VARIABLES

if TYPE_CHECKING:  # pragma: no cover
    from ..node import NodeFacts
    from ..spec import Spec

SET, REMOVE, KEEP, LEAVE = "set", "remove", "keep", "leave"
ACTIONS = (SET, REMOVE, KEEP, LEAVE)
REQUIRED, PREFERRED, NONE = "required", "preferred", "none"


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
    # What a node's NCCL config file (/etc/nccl.conf, ~/.nccl.conf,
    # NCCL_CONF_FILE) means for the row; only NCCL's rows have one.
    conf: str = ""


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
    one value meet the same rule. ``TEXT_VARIABLES`` exactly as written.
    NCCL's other variables (integer parameters) as NCCL reads them,
    ``strtoll(str, NULL, 0)`` (src/misc/param.cc ncclLoadParam; src/graph/paths.cc ncclGetLevel uses
    ``strtol(str, NULL, 0)``): ``"0x0"`` is 0, ``"010"`` is 8, trailing text
    ignored; empty is NCCL's default and stays ``""``. Any other variable
    (``CUDA_DEVICE_MAX_CONNECTIONS``, read by the closed-source CUDA driver):
    a decimal integer (``"01"`` is 1, ``" 0"`` is 0); anything else exactly
    as written (``"8.0 "`` is not ``"8.0"`` to PyTorch: it ends in an empty
    entry)."""
    if variable in TEXT_VARIABLES:
        return value
    if variable.startswith("NCCL_") and value != "":
        from .nccl_params import nccl_param

        number = nccl_param(value, None)
        return value if number is None else str(number)
    try:
        return str(int(value.strip()))
    except ValueError:
        return value


def trains(spec: Spec) -> bool:
    """The worker runs a trainer: some engine of its spec is not an
    inference engine (the processes that run Transformer Engine's recipes
    and fla's backward kernels)."""
    return any(engine.kind != INFERENCE for _, engine in spec.engines)


@dataclass(frozen=True)
class PackVerdict:
    outcomes: Tuple[Outcome, ...]
    warnings: Tuple[str, ...] = ()


@dataclass(frozen=True)
class Seen:
    """One variable as a pack finds it for a worker: the runtime env's value
    (``explicit``), what the worker has (``value``: that, else the node's),
    and ``replaces``: the explicit value where it is the framework's own
    blanket one (``Spec.framework_env``), decided anew rather than kept."""

    explicit: Optional[str]
    value: Optional[str]
    replaces: Optional[str]

    @property
    def whose(self) -> str:
        # settle names the framework where its own value is replaced.
        return ("the" if self.replaces is not None else
                "the job's" if self.explicit is not None else "the inherited")


def seen(variable: str, spec: Spec, env_vars: Mapping[str, Any],
         node_environ: Mapping[str, str]) -> Seen:
    """``variable`` as the worker will have it (``Seen``)."""
    explicit = env_vars.get(variable)
    explicit = None if explicit is None else str(explicit)
    value = explicit if explicit is not None else node_environ.get(variable)
    blanket = dict(spec.framework_env).get(variable)
    return Seen(explicit, value, explicit if explicit is not None and explicit == blanket else None)


def unless_a_trainer_on_gpus(pack: str, variable: str, spec: Spec, facts: NodeFacts,
                             leave: Callable[[str], Outcome],
                             no_trainer: str = "") -> Optional[PackVerdict]:
    """The verdict of a pack that acts only in trainer processes on NVIDIA
    GPUs, where the worker is not one: ``leave(reason)``, with a warning
    where the GPUs could not be read; None where the pack has to decide."""
    gpus = facts.gpus
    if not gpus.capabilities:
        warnings = () if gpus.is_known else (
            f"{pack}: the node's GPUs could not be read ({gpus.error}); "
            f"{variable} is left as it is",)
        return PackVerdict((leave(f"{gpus.describe()}: nothing to decide [leave]"),), warnings)
    if not trains(spec):
        return PackVerdict((leave(f"{gpus.describe()}: no trainer engine in this "
                                  f"process{no_trainer} [leave]"),))
    return None


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
