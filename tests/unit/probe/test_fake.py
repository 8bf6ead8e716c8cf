"""probe/fake.py: a node described instead of probed. The GPU list
(RAY_MEGATRON_ENV_FAKE_GPUS, read before NVML and winning over it) and the
whole node (RAY_MEGATRON_ENV_FAKE_NODE, ``node.parse_fake_node``'s JSON): its
peer-access and CUDA-driver facts and the errors that name a bad key. The
fake node's fabric: tests/unit/probe/test_fabric.py; its net key:
tests/unit/probe/test_net.py.
"""

import json

import pytest

from fake_nvml import FakeNvml
from gpu_probe import GPUS, Untouchable, assert_unknown, probe
from ray_megatron_env.errors import FieldValueError
from ray_megatron_env.explanation import explain_node
from ray_megatron_env.names import FAKE_NODE_VARIABLE
from ray_megatron_env.node import FakeNodeError
from ray_megatron_env.probe.fake import parse_fake_node
from ray_megatron_env.probe import FAKE_VARIABLE, probe_p2p

MEGATRON_TP2 = {"engines": {"actor": {"strategy": "megatron", "tensor_parallel": 2}}}
# 8xL40S on two PCIe root complexes (GPUs 0-3 and 4-7 reach each other only
# within a root), CUDA driver 12.8: tests/unit/packs/test_nccl_host_mem.py's node.
L40S_OLD = json.dumps({"gpus": "8.9,8.9,8.9,8.9,8.9,8.9,8.9,8.9",
                       "p2p": [[i, j] for i in range(4) for j in range(4, 8)],
                       "cuda_driver": "12.8"})


# --- RAY_MEGATRON_ENV_FAKE_GPUS ---------------------------------------------

@pytest.mark.parametrize("value, expected", [
    ("9.0", ((9, 0),)),
    ("9.0,9.0,10.0", ((9, 0), (9, 0), (10, 0))),
    (" 8.0, 9.0 ", ((8, 0), (9, 0))),
    ("none", ()),
    ("NONE", ()),
])
def test_fake_variable(value, expected):
    result = probe(Untouchable(), fake=value)
    assert result.capabilities == expected
    assert result.method == "fake"
    assert result.error is None


@pytest.mark.parametrize("value", ["9.x", "abc", "9.0,,10.0", "9", "9.0;10.0", "none,9.0"])
def test_malformed_fake_variable_is_an_error(value):
    assert_unknown(probe(Untouchable(), fake=value), "fake", FAKE_VARIABLE)


@pytest.mark.parametrize("value", ["", "   "])
def test_empty_fake_variable_falls_through_to_nvml(value):
    result = probe(FakeNvml(GPUS), fake=value)
    assert result.method == "nvml"
    assert result.capabilities == ((8, 0), (9, 0), (10, 0))


def test_fake_variable_wins_over_nvml_and_method():
    result = probe(Untouchable(), fake="8.0", method="nvml", visible="5")
    assert result.capabilities == ((8, 0),)


@pytest.mark.parametrize("value, vendor", [("npu", "ascend"), ("ascend", "ascend"),
                                           ("NPU", "ascend"), ("musa", "musa"),
                                           ("amd", "amd")])
def test_fake_vendor_values(value, vendor):
    result = probe(Untouchable(), fake=value)
    assert result.vendor == vendor and result.capabilities == () and result.method == "fake"


# --- RAY_MEGATRON_ENV_FAKE_NODE: peer access and the CUDA driver -------------

def test_fake_node_p2p_and_driver():
    p2p = parse_fake_node(json.dumps({"gpus": "8.9,8.9,8.9", "p2p": [[2, 0], [1, 2]],
                                     "cuda_driver": "12.8"})).p2p
    assert (p2p.count, p2p.without, p2p.cuda_driver) == (3, ((0, 2), (1, 2)), (12, 8))
    assert parse_fake_node('{"gpus": "8.9,8.9,8.9", "p2p": "none"}').p2p.without == \
        ((0, 1), (0, 2), (1, 2))
    # defaults: every pair has peer access; the driver not reported
    default = parse_fake_node('{"gpus": "9.0,9.0"}').p2p
    assert (default.count, default.without, default.cuda_driver) == (2, (), None)
    # the GPUs from the fake GPU list when the record has none
    assert parse_fake_node('{"p2p": "none"}', default_gpus="8.9,8.9").p2p.without == ((0, 1),)
    assert parse_fake_node('{"p2p": "none"}').p2p.count == 0


@pytest.mark.parametrize("facts,words", [
    ({"gpus": "8.9,8.9", "p2p": [[0, 2]]}, "p2p pairs must be [i, j], two different GPU "
                                           "indices below 2, got [0, 2]"),
    ({"gpus": "8.9,8.9", "p2p": [[1, 1]]}, "p2p pairs must be"),
    ({"gpus": "8.9,8.9", "p2p": "some"}, "p2p must be \"all\", \"none\" or a list"),
    ({"gpus": "8.9", "cuda_driver": 12.8}, "cuda_driver must be a string like \"12.8\""),
    ({"gpus": "8.9", "cuda_driver": "twelve"}, "cuda_driver: not a CUDA driver version"),
])
def test_bad_fake_p2p_facts_are_named(facts, words):
    with pytest.raises(FakeNodeError, match=None) as info:
        parse_fake_node(json.dumps(facts)).p2p
    assert words in str(info.value)
    # parse_fake_node checks the same keys: one error for any bad key
    with pytest.raises(FakeNodeError):
        parse_fake_node(json.dumps(facts))
    with pytest.raises(FieldValueError, match="--node"):
        explain_node(MEGATRON_TP2, node=json.dumps(facts), packs=["nccl-host-mem"])


def test_probe_reads_the_fake_node_and_the_fake_gpus():
    environ = {FAKE_NODE_VARIABLE: L40S_OLD}
    p2p = probe_p2p(environ)
    assert (p2p.method, p2p.count, len(p2p.without), p2p.cuda_driver) == ("fake", 8, 16, (12, 8))
    only_gpus = probe_p2p({FAKE_VARIABLE: "9.0,10.0"})
    assert (only_gpus.count, only_gpus.without) == (2, ())
    bad = probe_p2p({FAKE_NODE_VARIABLE: '{"p2p": 3}'})
    assert bad.count is None and "p2p must be" in bad.error
