"""packs/pack.py: what a pack is. ``canonical``, a value as its library
reads it (NCCL's integer parameters with ``strtoll(str, NULL, 0)``, src/misc/param.cc;
TEXT_VARIABLES exactly as written; CUDA_DEVICE_MAX_CONNECTIONS as a decimal
integer), a row's ``Demand`` on the final value, and ``trains``.
"""

import pytest

from ray_megatron_env.frameworks import parse_field
from ray_megatron_env.names import TEXT_VARIABLES
from ray_megatron_env.packs import get_pack
from ray_megatron_env.packs.pack import ACTIONS, Demand, canonical, trains

SCALES, TILELANG = "NVTE_FP8_BLOCK_SCALING_FP32_SCALES", "FLA_TILELANG"


# --- canonical -----------------------------------------------------------------------

# value -> what NCCL's strtoll(str, NULL, 0) gives; CUDA_DEVICE_MAX_CONNECTIONS
# stays decimal (its reader, the CUDA driver, is closed).
@pytest.mark.parametrize("value,nccl,cuda", [
    ("0", "0", "0"), ("0x0", "0", "0x0"), ("010", "8", "10"), (" 0", "0", "0"),
    ("1abc", "1", "1abc"), ("-1", "-1", "-1"), ("", "", ""),
])
def test_canonical_reads_nccl_values_with_strtoll_base_0(value, nccl, cuda):
    assert canonical(value, "NCCL_CUMEM_HOST_ENABLE") == nccl
    assert canonical(value, "CUDA_DEVICE_MAX_CONNECTIONS") == cuda


def test_text_variables_are_compared_as_written():
    # TE: == "1"; fla: != "0"; interface names and NCCL's string lists; NCCL's
    # P2P level, a path name compared with strcmp (src/graph/paths.cc).
    assert canonical(" 1", SCALES) == " 1" and canonical("01", TILELANG) == "01"
    assert canonical("eth0", "NCCL_SOCKET_IFNAME") == "eth0"
    assert canonical("0x1", "NCCL_IB_GID_INDEX") == "1"  # an integer parameter (strtoll)
    assert canonical("LOC", "NCCL_P2P_LEVEL") == "LOC" and canonical("00", "NCCL_P2P_LEVEL") == "00"
    texts = {v for name in ("te-fp8-scales", "fla-backend", "net-ifaces")
             for v in get_pack(name).variables} - {"NCCL_IB_GID_INDEX"}
    assert TEXT_VARIABLES == texts | {"NCCL_P2P_LEVEL"}


# --- a row's demand ------------------------------------------------------------------

def demand(variable, accepts, unset_ok=False):
    return Demand("a-row", "required", frozenset(accepts), unset_ok, "actor", variable)


@pytest.mark.parametrize("variable,accepts,value,allowed", [
    # NCCL reads 0x0, 00 and " 0" as 0; "" is its default, not 0
    ("NCCL_P2P_DISABLE", {"0"}, "0x0", True),
    ("NCCL_P2P_DISABLE", {"0"}, " 0", True),
    ("NCCL_P2P_DISABLE", {"0"}, "00", True),
    ("NCCL_P2P_DISABLE", {"0"}, "", False),
    ("NCCL_P2P_DISABLE", {"0"}, "1", False),
    # the CUDA driver's variable: a decimal integer, or the text as written
    ("CUDA_DEVICE_MAX_CONNECTIONS", {"1"}, "01", True),
    ("CUDA_DEVICE_MAX_CONNECTIONS", {"1"}, " 1 ", True),
    ("CUDA_DEVICE_MAX_CONNECTIONS", {"1"}, "0x1", False),
    ("CUDA_DEVICE_MAX_CONNECTIONS", {"1"}, "1.0", False),
    # fla reads FLA_TILELANG != "0": "00" is not "0"
    (TILELANG, {"0"}, "00", False),
    (TILELANG, {"0"}, "0", True),
])
def test_a_demand_allows_every_spelling_its_library_reads_as_accepted(variable, accepts, value,
                                                                     allowed):
    assert demand(variable, accepts).allows(value) is allowed


def test_an_unset_variable_meets_a_demand_only_where_it_says_so():
    assert demand("CUDA_DEVICE_MAX_CONNECTIONS", {"1"}).allows(None) is False
    assert demand("CUDA_DEVICE_MAX_CONNECTIONS", {"1"}, unset_ok=True).allows(None) is True


# --- the rest of the shape --------------------------------------------------------------

def test_the_four_actions():
    assert ACTIONS == ("set", "remove", "keep", "leave")


@pytest.mark.parametrize("engines,training", [
    ({"actor": {"strategy": "megatron"}}, True),
    ({"actor": {"strategy": "fsdp"}, "rollout": {"strategy": "vllm"}}, True),
    ({"rollout": {"strategy": "vllm"}}, False),
    ({"rollout": {"strategy": "sglang"}}, False),
    ({}, False),
])
def test_trains_is_any_engine_that_is_not_an_inference_engine(engines, training):
    assert trains(parse_field({"engines": engines})) is training


def test_a_row_is_found_by_its_id():
    pack = get_pack("torch-arch")
    assert pack.row("no-portable-arch").id == "no-portable-arch"
    assert [pack.row(row.id) for row in pack.rows] == list(pack.rows)


def test_seen_tells_the_jobs_value_the_nodes_and_the_frameworks_own():
    from ray_megatron_env.packs.pack import seen
    from ray_megatron_env.spec import Spec

    spec = Spec(framework_env=(("FLA_TILELANG", "1"),))
    framework = seen("FLA_TILELANG", spec, {"FLA_TILELANG": "1"}, {"FLA_TILELANG": "0"})
    assert (framework.explicit, framework.value, framework.replaces, framework.whose) == (
        "1", "1", "1", "the")
    job = seen("FLA_TILELANG", spec, {"FLA_TILELANG": 0}, {})
    assert (job.explicit, job.value, job.replaces, job.whose) == ("0", "0", None, "the job's")
    node = seen("FLA_TILELANG", spec, {}, {"FLA_TILELANG": "0"})
    assert (node.explicit, node.value, node.replaces, node.whose) == (
        None, "0", None, "the inherited")
