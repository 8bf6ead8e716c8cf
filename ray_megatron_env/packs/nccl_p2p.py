"""Where NCCL turns peer-to-peer off between every two GPUs: the one
reading of NCCL_P2P_DISABLE and NCCL_P2P_LEVEL that both NCCL packs share."""

from __future__ import annotations

from typing import Any, Mapping, Optional

from ..names import P2P_DISABLE_VARIABLE as P2P_DISABLE, P2P_LEVEL_VARIABLE as P2P_LEVEL
from .nccl_params import c_int_strtol, worker_value


def p2p_level_loc(env_vars: Mapping[str, Any],
                  node_environ: Mapping[str, str]) -> Optional[str]:
    """The variable that makes NCCL's user P2P level PATH_LOC (0), which
    turns off P2P between any two GPUs and NCCL's MNNVL check; None where
    neither does (NCCL src/graph/paths.cc ncclGetLevel, 2.30.7):
    NCCL_P2P_DISABLE read as ``(int)strtol(str, NULL, 0) == 1``; only where
    it is not 1, NCCL_P2P_LEVEL: exactly ``LOC`` (strcmp against
    topoPathTypeStr), or the old numbering, a value that starts with a digit
    and whose strtol is 0 (levelsOldToNew[0] is PATH_LOC)."""
    disable = worker_value(P2P_DISABLE, env_vars, node_environ)
    if disable is not None and c_int_strtol(str(disable)) == 1:
        return P2P_DISABLE
    level = worker_value(P2P_LEVEL, env_vars, node_environ)
    if level is None:
        return None
    level = str(level)
    if level == "LOC" or (level[:1] != "" and level[0] in "0123456789"
                          and c_int_strtol(level) == 0):
        return P2P_LEVEL
    return None
