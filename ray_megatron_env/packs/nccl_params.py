"""How NCCL reads its own parameters from the environment, for every NCCL
pack: one reader, so two packs never disagree about what a value means."""

from __future__ import annotations

import re
from typing import Any, Mapping, Optional

CUMEM_AUTO = -2  # NCCL src/misc/cudawrap.cc: NCCL_PARAM(CuMemEnable, "CUMEM_ENABLE", -2)

# The NCCL releases every NCCL row was read against.
NCCL_READ = ("read in NCCL's source at v2.30.7 (and at each release the row names), and in the 2.31.2 "
             "and 2.32.3 libnccl.so.2 of PyPI's nvidia-nccl-cu12 as strings only (the same "
             "variables and messages; their source is not in the NVIDIA/nccl snapshot read)")
# NCCL's config files (src/misc/param.cc initEnvFunc: NCCL_CONF_FILE, else
# ~/.nccl.conf, then /etc/nccl.conf) go in with setenv(name, value, 0)
# (src/os/linux.cc): they fill unset variables only, and no pack reads them.
CONF_SET = ("no effect on the variable written: the files fill only unset variables "
            "(setenv without overwrite)")
CONF_UNSEEN = ("a value set only there is not read by the pack: NCCL applies it, without this "
               "row's warning")
CONF_FILLS = "fills each variable left unset, and NCCL reads it as if set in the environment"

_STRTOLL = re.compile(r"^\s*([+-]?)(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)")
_INT64 = 2 ** 63
_INT32 = 2 ** 32


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


def c_int_strtol(value: str) -> int:
    """``(int)strtol(str, NULL, 0)`` as NCCL's ncclGetLevel computes it: no
    digits is 0, an overflow is LONG_MAX or LONG_MIN, and the long is
    stored in an int (its low 32 bits on Linux)."""
    match = _STRTOLL.match(value)
    if not match:
        return 0
    digits = match.group(2)
    number = int(digits, 16) if digits[:2].lower() == "0x" else int(digits, 8 if
                                                                    digits.startswith("0") else 10)
    number = -number if match.group(1) == "-" else number
    number = max(-_INT64, min(_INT64 - 1, number))
    number %= _INT32
    return number - _INT32 if number >= _INT32 // 2 else number
