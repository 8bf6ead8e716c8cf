"""packs/__init__, the registry: every pack by its name (docs/packs.md), a
clear error for an unknown one, and the variables and node facts of the
packs a job asks for, in the order asked. What each pack owns:
tests/unit/test_names.py; a pack's shape: tests/unit/packs/test_pack.py.
"""

import pytest

from ray_megatron_env.errors import FieldValueError
from ray_megatron_env.packs import fact_kinds, get_pack, variables_of

NAMES = ("cuda-connections", "nccl-fabric", "nccl-host-mem", "torch-arch", "te-fp8-scales",
         "fla-backend", "net-ifaces")


@pytest.mark.parametrize("name", NAMES)
def test_every_pack_is_found_by_its_name(name):
    pack = get_pack(name)
    assert pack.name == name
    assert get_pack(name) is pack  # loaded once


@pytest.mark.parametrize("name", ["nccl_fabric", "NCCL-FABRIC", "", "pack"])
def test_an_unknown_pack_is_an_error_listing_the_known_ones(name):
    with pytest.raises(FieldValueError) as info:
        get_pack(name)
    assert str(info.value) == (f"megatron_env: unknown pack {name!r}; known packs: "
                               + ", ".join(NAMES))


def test_the_variables_of_packs_in_the_order_asked():
    assert variables_of(["torch-arch", "cuda-connections"]) == (
        "TORCH_CUDA_ARCH_LIST", "CUDA_DEVICE_MAX_CONNECTIONS")
    assert variables_of(["te-fp8-scales", "fla-backend"]) == (
        "NVTE_FP8_BLOCK_SCALING_FP32_SCALES", "FLA_TILELANG")
    assert variables_of([]) == ()


def test_only_the_fact_kinds_the_packs_asked_read_are_probed():
    assert fact_kinds(["cuda-connections", "torch-arch"]) == frozenset()
    assert fact_kinds(["nccl-host-mem"]) == frozenset({"p2p"})
    assert fact_kinds(["nccl-fabric", "nccl-host-mem", "net-ifaces"]) == \
        frozenset({"fabric", "p2p", "net"})
    with pytest.raises(FieldValueError, match="unknown pack 'gpus'"):
        fact_kinds(["gpus"])
