"""packs/nccl_params.py: how NCCL reads its own parameters, for every NCCL
pack. Expected values by hand from NCCL 2.30.7: src/misc/param.cc
ncclLoadParam (unset or empty: the default; else ``strtoll(str, NULL, 0)``,
out of range: the default), src/misc/cudawrap.cc (NCCL_PARAM(CuMemEnable,
"CUMEM_ENABLE", -2); ncclCuMemEnable() false for 0 or a negative value but
-2) and src/graph/paths.cc ncclGetLevel (``(int)strtol(str, NULL, 0)``, a
long stored in an int) with C's strtol/strtoll: leading blanks, a sign, 0x
hex, 0 octal, the rest ignored, no digits is 0, overflow is LONG_MAX/LONG_MIN.
"""

import pytest

from ray_megatron_env.packs.nccl_params import (
    CUMEM_AUTO, c_int_strtol, cumem_off, nccl_param, worker_value,
)


@pytest.mark.parametrize("value,default,number", [
    (None, -2, -2), ("", -2, -2), ("", None, None),  # unset or empty: the default
    ("1", -2, 1), ("0x10", 0, 16), ("0X1f", 0, 31), ("010", 0, 8), ("08", 0, 0),
    ("  12abc", 0, 12), ("-3", 0, -3), ("+7", 0, 7), ("abc", 5, 0), ("0x", 5, 0),
    ("9223372036854775807", 0, 2 ** 63 - 1),
    ("9223372036854775808", 7, 7),  # out of int64's range: the default
    ("-9223372036854775808", 7, -2 ** 63),
    (3, 0, 3),  # a non-string value is read as its text
])
def test_nccl_param_reads_as_strtoll_base_0(value, default, number):
    assert nccl_param(value, default) == number


@pytest.mark.parametrize("value,off", [
    ("0", True), ("-1", True), ("-3", True), ("0x0", True), ("00", True),
    ("-2", False),  # auto
    ("1", False), ("2", False), (None, False), ("", False),  # unset and empty: -2
    ("abc", True),  # no digits reads as 0
])
def test_cumem_off_is_0_or_negative_but_not_auto(value, off):
    assert CUMEM_AUTO == -2
    assert cumem_off(value) is off


def test_the_worker_reads_the_jobs_value_over_the_nodes():
    assert worker_value("X", {"X": "job"}, {"X": "node"}) == "job"
    assert worker_value("X", {}, {"X": "node"}) == "node"
    assert worker_value("X", {"Y": "1"}, {}) is None


@pytest.mark.parametrize("value,number", [
    ("1", 1), ("0x1", 1), ("010", 8), (" -1", -1), ("abc", 0), ("", 0),
    ("4294967296", 0),  # 2^32: the long's low 32 bits are 0
    ("4294967297", 1),
    ("2147483648", -2 ** 31),  # 2^31 does not fit an int: it wraps
    ("99999999999999999999", -1),  # overflow: LONG_MAX, whose low 32 bits are all 1
    ("-99999999999999999999", 0),  # LONG_MIN: low 32 bits 0
])
def test_c_int_strtol_is_a_long_stored_in_an_int(value, number):
    assert c_int_strtol(value) == number
