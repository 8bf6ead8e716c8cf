"""How NCCL reads its own parameters from the environment, for every NCCL
pack: one reader, so two packs never disagree about what a value means."""

from __future__ import annotations

import re
from typing import Any, Mapping, Optional

CUMEM_AUTO = -2  # NCCL src/misc/cudawrap.cc: NCCL_PARAM(CuMemEnable, "CUMEM_ENABLE", -2)

_STRTOLL = re.compile(r"^\s*([+-]?)(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)")
_INT64 = 2 ** 63


def nccl_param(value: Optional[Any], default: Optional[int]) -> Optional[int]:
    """An NCCL integer parameter as NCCL reads it (src/misc/param.cc,
    ncclLoadParam): unset or empty is the default; otherwise ``strtoll(str,
    NULL, 0)``: leading blanks, a sign, hex (0x), octal (0) or decimal, the
    rest ignored; no digits at all reads as 0; out of range is the default."""
    if value is None or str(value) == "":
        return default
    match = _STRTOLL.match(str(value))
    if not match:
        return 0
    number = int(match.group(2), 0) if not match.group(2).startswith("0") or \
        match.group(2)[:2].lower() == "0x" else int(match.group(2), 8)
    number = -number if match.group(1) == "-" else number
    return default if not -_INT64 <= number < _INT64 else number


def cumem_off(value: Optional[Any]) -> bool:
    """Whether NCCL_CUMEM_ENABLE=value makes ncclCuMemEnable() false whatever
    the platform supports (src/misc/cudawrap.cc): 0, or a negative value
    other than -2 (auto)."""
    param = nccl_param(value, CUMEM_AUTO)
    return param == 0 or (param < 0 and param != CUMEM_AUTO)


def worker_value(name: str, env_vars: Mapping[str, str],
                 node_environ: Mapping[str, str]) -> Optional[str]:
    """What NCCL in the worker reads for ``name``: the job's env_vars value,
    else the node's (Ray puts env_vars over the environment the worker
    inherits)."""
    return env_vars.get(name, node_environ.get(name))
