"""packs/nccl_p2p.py: where NCCL turns P2P off between every two GPUs, the
reading of NCCL_P2P_DISABLE and NCCL_P2P_LEVEL both NCCL packs share.
Expected values by hand from NCCL 2.30.7 src/graph/paths.cc ncclGetLevel:
NCCL_P2P_DISABLE read with ``int disable = strtol(str, NULL, 0)``, 1 gives
PATH_LOC; otherwise NCCL_P2P_LEVEL: strcmp against "LOC", "NVL", ... "SYS"
(PATH_LOC = 0), else, if str[0] is a digit, ``int oldLevel = strtol(str,
NULL, 0)`` through levelsOldToNew = {PATH_LOC, PATH_PIX, PATH_PXB,
PATH_PHB, PATH_SYS, PATH_SYS}.
"""

import pytest

from ray_megatron_env.packs.nccl_p2p import p2p_level_loc

P2P_OFF, LEVEL = "NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL"


# NCCL_P2P_DISABLE, NCCL_P2P_LEVEL -> the variable that makes the level PATH_LOC
@pytest.mark.parametrize("disable,level,which", [
    (None, "LOC", LEVEL),
    (None, "0", LEVEL),          # old numbering: levelsOldToNew[0] is PATH_LOC
    (None, "00", LEVEL),         # strtol base 0: octal 0
    (None, "0x0", LEVEL),
    (None, "08", LEVEL),         # strtol stops at '8' (not octal): 0
    (None, "0abc", LEVEL),       # trailing text ignored
    (None, "4294967296", LEVEL),  # 2^32: the long's low 32 bits in an int are 0
    (None, "1", None),           # PATH_PIX
    (None, "5", None),           # clamped to PATH_SYS
    (None, "NVL", None), (None, "PIX", None), (None, "SYS", None),
    (None, "loc", None),         # strcmp is case-sensitive; 'l' is not a digit
    (None, " LOC", None), (None, " 0", None),  # str[0] is a blank
    (None, "", None), (None, None, None),
    ("1", None, P2P_OFF), ("0x1", None, P2P_OFF), ("1abc", None, P2P_OFF),
    ("4294967297", None, P2P_OFF),  # (int) of 2^32 + 1 is 1
    ("1", "LOC", P2P_OFF),       # the level is read only where DISABLE is not 1
    ("0", "LOC", LEVEL), ("", "LOC", LEVEL), ("2", "LOC", LEVEL),
    ("0", "SYS", None),
])
def test_ncclgetlevels_reading(disable, level, which):
    job = {k: v for k, v in ((P2P_OFF, disable), (LEVEL, level)) if v is not None}
    assert p2p_level_loc(job, {}) == which
    # the same from the node's environment
    assert p2p_level_loc({}, job) == which


@pytest.mark.parametrize("job,inherited,which", [
    # Ray puts env_vars over the environment the worker inherits
    ({LEVEL: "NVL"}, {LEVEL: "LOC"}, None),
    ({LEVEL: "LOC"}, {LEVEL: "NVL"}, LEVEL),
    ({P2P_OFF: "0"}, {P2P_OFF: "1"}, None),
    ({}, {P2P_OFF: "1", LEVEL: "LOC"}, P2P_OFF),
    ({P2P_OFF: "0"}, {LEVEL: "LOC"}, LEVEL),  # the job's 0, the node's level
])
def test_the_jobs_value_is_read_over_the_nodes(job, inherited, which):
    assert p2p_level_loc(job, inherited) == which
