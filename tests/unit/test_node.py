"""node.py, what a node is: the GPU types and their words (the reason
sentences docs/record.md shows), NVLink fabric and peer-access facts with
NCCL's own conditions (NCCL src/mnnvl.cc: every GPU COMPLETED with a
non-zero cluster UUID), the version readers, the text form of a GPU list,
and a fact read back from its JSON. The fake node's whole text form:
tests/unit/probe/test_fabric.py and the packs' tests."""

import dataclasses

import pytest

from ray_megatron_env.node import (
    COMPLETED, NOT_SUPPORTED, FakeNodeError, GpuFabric, NodeFabric, NodeGpus, NodeP2P,
    facts_from_record, format_capability, parse_capability, parse_driver, parse_gpu_list,
    parse_kernel_driver,
)

UUID = "5d3f0c2a-8b1e-4c7d-9a6f-2e4b8c1d7f30"
ZERO_UUID = "00000000-0000-0000-0000-000000000000"


# --- the GPUs -------------------------------------------------------------------------

@pytest.mark.parametrize("text,capability", [("9.0", (9, 0)), (" 12.1 ", (12, 1)),
                                             ("10.3", (10, 3))])
def test_a_compute_capability_reads_and_writes_back(text, capability):
    assert parse_capability(text) == capability
    assert format_capability(capability) == text.strip()


@pytest.mark.parametrize("text", ["9", "9.0.1", "a.b", "100.0", "", "sm_90"])
def test_anything_else_is_not_a_compute_capability(text):
    with pytest.raises(ValueError, match="not a compute capability like '9.0'"):
        parse_capability(text)


@pytest.mark.parametrize("gpus,words", [
    (NodeGpus.known([(9, 0), (9, 0)], "nvml"), "compute capability 9.0"),
    (NodeGpus.known([(10, 0), (9, 0), (10, 0)], "nvml"),
     "compute capability 9.0 (the oldest of 9.0, 10.0)"),
    (NodeGpus.known([], "nvml"), "no NVIDIA GPU"),
    (NodeGpus.other("ascend", "listing"), "Huawei Ascend NPUs"),
    (NodeGpus.other("amd", "listing"), "AMD (ROCm) GPUs"),
    (NodeGpus.unknown("nvidia-smi", "no answer in 3 s"),
     "unknown GPUs (nvidia-smi probe failed: no answer in 3 s)"),
])
def test_a_node_in_the_words_of_a_reason(gpus, words):
    assert gpus.describe() == words


def test_the_oldest_gpu_decides_a_mixed_node_and_the_labels_are_the_records():
    mixed = NodeGpus.known([(10, 0), (8, 0), (9, 0)], "fake")
    assert mixed.oldest == (8, 0) and mixed.is_known
    assert mixed.labels() == ["10.0", "8.0", "9.0"]  # as seen, not sorted
    assert NodeGpus.known([], "fake").oldest is None
    assert NodeGpus.other("musa", "fake").labels() == ["musa"]
    failed = NodeGpus.unknown("nvml", "boom")
    assert (failed.is_known, failed.labels(), failed.oldest) == (False, None, None)


# --- the NVLink fabric ----------------------------------------------------------------

def _fabric(*gpus, imex="absent"):
    return NodeFabric(tuple(gpus), imex, "fake")


ATTACHED = GpuFabric(COMPLETED, "success", UUID, 32766, "ok")


@pytest.mark.parametrize("uuid,cluster", [(UUID, True), (ZERO_UUID, False), (None, False),
                                          ("", False)])
def test_a_zero_or_missing_cluster_uuid_is_no_nvlink_domain(uuid, cluster):
    assert GpuFabric(COMPLETED, "success", uuid).has_cluster is cluster


def test_ncccls_condition_for_the_mnnvl_path_is_every_gpu_attached():
    assert _fabric(ATTACHED, ATTACHED).attached
    assert not _fabric(ATTACHED, GpuFabric("in_progress", None, UUID)).attached
    assert not _fabric(ATTACHED, GpuFabric(COMPLETED, "success", ZERO_UUID)).attached
    assert not _fabric().attached  # no GPU


def test_the_status_is_not_part_of_attached_but_of_ready_and_a_failed_registration():
    failed = GpuFabric(COMPLETED, "NVML_ERROR_UNKNOWN", UUID)
    node = _fabric(ATTACHED, failed)
    assert node.attached and not node.ready and node.registration_failed
    assert _fabric(ATTACHED).ready and not _fabric(ATTACHED).registration_failed


def test_pcie_gpus_are_not_switched_and_a_degraded_gpu_is_said():
    pcie = _fabric(GpuFabric(NOT_SUPPORTED), GpuFabric(NOT_SUPPORTED))
    assert not pcie.switched and not pcie.attached
    assert _fabric(GpuFabric("not_started"), GpuFabric(NOT_SUPPORTED)).switched
    degraded = _fabric(ATTACHED, dataclasses.replace(ATTACHED, health="degraded"))
    assert degraded.degraded and degraded.health_problems == ("degraded_bw=true",)


@pytest.mark.parametrize("fabric,words", [
    (NodeFabric(None, "absent", "nvml", error="NVML not found"),
     "fabric unknown (nvml: NVML not found)"),
    (NodeFabric((), "absent", "nvml"), "no NVIDIA GPU fabric"),
    (NodeFabric((ATTACHED, ATTACHED), "writable", "nvml", imex_status="ready"),
     f"fabric completed, cluster {UUID}, IMEX channel writable, IMEX ready"),
    (NodeFabric((GpuFabric(COMPLETED, "NVML_ERROR_UNKNOWN", ZERO_UUID),), "absent", "nvml"),
     "fabric completed (status NVML_ERROR_UNKNOWN), IMEX channel absent, IMEX unknown"),
])
def test_a_fabric_in_the_words_of_a_reason(fabric, words):
    assert fabric.describe() == words


# --- peer access and the drivers ------------------------------------------------------

@pytest.mark.parametrize("p2p,words", [
    (NodeP2P(2, (), (12, 8)), "2 NVIDIA GPU(s), peer access between every pair, CUDA driver 12.8"),
    (NodeP2P(1), "1 NVIDIA GPU(s), no GPU pair, CUDA driver not reported"),
    (NodeP2P(3, ((0, 1), (0, 2), (1, 2)), (13, 0), kernel_driver="580.65.06"),
     "3 NVIDIA GPU(s), no peer access between any pair, CUDA driver 13.0, kernel driver "
     "580.65.06"),
    (NodeP2P(8, ((0, 1), (0, 2), (0, 3), (0, 4), (0, 5), (0, 6)), (12, 4)),
     "8 NVIDIA GPU(s), no peer access between GPUs 0-1, 0-2, 0-3, 0-4 and 2 more, "
     "CUDA driver 12.4"),
    (NodeP2P(None, method="nvml", error="boom"), "peer access unknown (nvml: boom)"),
])
def test_peer_access_in_the_words_of_a_reason(p2p, words):
    assert p2p.describe() == words


@pytest.mark.parametrize("text,version", [("570.172.08", (570, 172, 8)), ("580.65", (580, 65)),
                                          (" 535.230.02\n", (535, 230, 2))])
def test_the_kernel_drivers_version_as_nvml_writes_it(text, version):
    assert parse_kernel_driver(text) == version


@pytest.mark.parametrize("text", ["570", "570.172.08.1", "v570.172", None])
def test_anything_else_is_not_a_kernel_driver_version(text):
    with pytest.raises(ValueError, match="not a kernel driver version"):
        parse_kernel_driver(text)


def test_parse_driver_reads_nvmls_integer_and_words():
    assert parse_driver(12080) == (12, 8)
    assert parse_driver(13000) == (13, 0)
    assert parse_driver(12060) == (12, 6)
    assert parse_driver("12.10") == (12, 10)


# --- a GPU list as text (RAY_MEGATRON_ENV_FAKE_GPUS, explain --gpus) ------------------

@pytest.mark.parametrize("text,capabilities,vendor", [
    ("9.0, 10.0", ((9, 0), (10, 0)), None),
    (["8.0"], ((8, 0),), None),
    ("none", (), None), ("", (), None), ("NONE", (), None),
    ("amd", (), "amd"), ("npu", (), "ascend"), ("Ascend", (), "ascend"), ("musa", (), "musa"),
])
def test_a_gpu_list_names_capabilities_nothing_or_a_vendor(text, capabilities, vendor):
    gpus = parse_gpu_list(text, "fake")
    assert (gpus.capabilities, gpus.vendor, gpus.method) == (capabilities, vendor, "fake")


def test_a_bad_gpu_list_names_where_it_came_from_and_what_is_allowed():
    with pytest.raises(FakeNodeError) as caught:
        parse_gpu_list("9.0,amd", where="RAY_MEGATRON_ENV_FAKE_GPUS")
    assert str(caught.value) == ("RAY_MEGATRON_ENV_FAKE_GPUS: not a compute capability like "
                                 "'9.0': 'amd'; or one of none, amd, npu, ascend, musa")


# --- a fact read back from its JSON (the node cache, check's probe actor) ---------------

@pytest.mark.parametrize("kind,facts", [
    ("gpus", NodeGpus.known([(9, 0), (10, 0)], "nvml", detail="2 device(s)", probed_at=1.5,
                            probe_pid=7)),
    ("gpus", NodeGpus.unknown("nvml", "boom")),
    ("fabric", NodeFabric((ATTACHED,), "absent", "nvml", imex_status="not-ready")),
    ("fabric", NodeFabric(None, "absent", "nvml", error="boom")),
    ("p2p", NodeP2P(2, ((0, 1),), (12, 8), kernel_driver="570.172.08")),
    ("p2p", NodeP2P(None, error="boom")),
])
def test_each_kind_of_fact_comes_back_equal_from_its_json(kind, facts):
    import json

    data = json.loads(json.dumps(dataclasses.asdict(facts)))
    assert facts_from_record(kind, {**data, "written_by_a_later_version": 1}) == facts


def test_an_unknown_kind_of_fact_is_an_error():
    with pytest.raises(ValueError, match="unknown kind of node fact 'wifi'"):
        facts_from_record("wifi", {})
