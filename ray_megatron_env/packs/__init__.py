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

The shape lives in ``packs/pack.py``, below the pack modules, which import
it from there; this registry loads them (``get_pack``) and hands the shape
on to code outside the package.
"""

from importlib import import_module
from typing import FrozenSet, Iterable, Tuple

from ..errors import FieldValueError
from ..values import show
from ..names import (
    CUDA_CONNECTIONS, FIELD, FLA_BACKEND, NCCL_FABRIC, NCCL_HOST_MEM, NET_IFACES, PACK_NAMES,
    TE_FP8_SCALES, TORCH_ARCH,
)
from .pack import Pack


# name -> module under packs/, loaded on first use.
_MODULES = {CUDA_CONNECTIONS: "connections", NCCL_FABRIC: "nccl_fabric",
            NCCL_HOST_MEM: "nccl_host_mem", TORCH_ARCH: "torch_arch",
            TE_FP8_SCALES: "te_fp8_scales", FLA_BACKEND: "fla_backend", NET_IFACES: "net_ifaces"}


def get_pack(name: str) -> Pack:
    """The pack called ``name``; a ``FieldValueError`` listing the known ones."""
    if name not in _MODULES:
        raise FieldValueError(f"{FIELD}: unknown pack {show(name)}; known packs: "
                              f"{', '.join(PACK_NAMES)}")
    return import_module(f".{_MODULES[name]}", __name__).PACK


def variables_of(names: Iterable[str]) -> Tuple[str, ...]:
    """Every variable the packs called ``names`` own, in pack order."""
    return tuple(v for name in names for v in get_pack(name).variables)


def fact_kinds(names: Iterable[str]) -> FrozenSet[str]:
    """The kinds of node fact besides the GPUs (``node.FACT_KINDS``) that the
    packs called ``names`` read: only those are probed."""
    return frozenset(kind for name in names for kind in get_pack(name).fact_kinds)
