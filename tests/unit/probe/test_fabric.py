"""Topical: the fabric probe across its sources: real nvidia-smi -q
outputs, NVML's fabric record through pynvml's own structures, the IMEX
channel, and the fake node.

Fixtures: tests/fixtures/nvidia_smi/README.md says where each comes from.
"""

import stat
import threading

import pynvml
import pytest

from ray_megatron_env.probe import (
    FAKE_VARIABLE, ROOT_VARIABLE, imex_channel, listings, parse_smi_fabric, probe_fabric,
    probe_gpus,
)
from ray_megatron_env.node import (
    ABSENT, COMPLETED, IN_PROGRESS, NOT_STARTED, NOT_SUPPORTED, UNWRITABLE, WRITABLE,
)
from ray_megatron_env.probe.fake import parse_fake_node
from ray_megatron_env.names import FAKE_NODE_VARIABLE
from fake_nvml import FakeNvml
from paths import FIXTURES

NO_LIBRARY = {"nvmlInit": pynvml.NVMLError_LibraryNotFound()}

SMI = FIXTURES / "nvidia_smi"
NO_SMI = ("/nonexistent/nvidia-smi",)


def read(name):
    return (SMI / name).read_text()


def test_hgx_h100_reports_a_registered_fabric_without_a_multi_node_domain():
    gpus = parse_smi_fabric(read("hgx_h100_sxm_x8.txt"))
    assert len(gpus) == 8
    assert {(g.state, g.status, g.cluster_uuid, g.clique_id) for g in gpus} == {
        (COMPLETED, "success", "00000000-0000-0000-0000-000000000000", 0)}
    assert not any(g.has_cluster for g in gpus)  # mnnvl.cc: a zero UUID is no MNNVL fabric
    assert {g.health for g in gpus} == {None}  # Bandwidth: N/A


def test_l40s_pcie_reports_no_fabric():
    gpus = parse_smi_fabric(read("l40s_pcie.txt"))
    assert [(g.state, g.status, g.cluster_uuid) for g in gpus] == [(NOT_SUPPORTED, None, None)]


def test_a_grep_excerpt_after_fabric_manager_started():
    gpus = parse_smi_fabric(read("hgx_fabric_manager_grep.txt"))
    assert [(g.state, g.status) for g in gpus] == [(COMPLETED, "success")]


def test_gb200_tray_is_fabric_attached_and_one_gpu_degraded_is_seen():
    gpus = parse_smi_fabric(read("gb200_tray_excerpt.txt"))
    assert [(g.state, g.cluster_uuid, g.clique_id, g.health) for g in gpus] == [
        (COMPLETED, "b2daed23-0000-0000-0000-000000000000", 1, "ok")] * 4
    assert all(g.has_cluster for g in gpus)
    degraded = parse_smi_fabric(read("gb200_degraded_excerpt.txt"))
    assert [g.health for g in degraded] == ["ok", "degraded"]


def test_output_without_any_fabric_block_is_not_read_as_no_fabric():
    assert parse_smi_fabric("GPU 00000000:01:00.0\n    Product Name : Tesla V100\n") is None


def _script(tmp_path, text, code=0):
    path = tmp_path / "nvidia-smi"
    path.write_text(f"#!/bin/sh\ncat <<'END'\n{text}\nEND\nexit {code}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return (str(path),)


def test_nvidia_smi_is_the_fallback_when_nvml_is_absent(tmp_path):
    fabric = probe_fabric({ROOT_VARIABLE: str(tmp_path)}, nvml=FakeNvml(fail=NO_LIBRARY),
                          smi_command=_script(tmp_path, read("l40s_pcie.txt")))
    assert fabric.method == "nvidia-smi" and fabric.is_known and not fabric.switched
    assert "after nvml" in fabric.detail
    assert fabric.imex_channel == ABSENT


def test_no_source_gives_unknown_and_never_raises(tmp_path):
    fabric = probe_fabric({ROOT_VARIABLE: str(tmp_path)}, nvml=FakeNvml(fail=NO_LIBRARY), smi_command=NO_SMI)
    assert not fabric.is_known and "nvidia-smi" in fabric.error


def test_a_hung_nvidia_smi_is_bounded(tmp_path):
    hang = tmp_path / "nvidia-smi"
    hang.write_text("#!/bin/sh\nsleep 30\n")
    hang.chmod(0o755)
    fabric = probe_fabric({ROOT_VARIABLE: str(tmp_path)}, nvml=FakeNvml(fail=NO_LIBRARY),
                          smi_command=(str(hang),), smi_timeout_s=0.5)
    assert not fabric.is_known and "did not answer within 0.5 s" in fabric.error


def test_nvml_fabric_record_of_a_gb200_gpu():
    uuid = bytes.fromhex("3f4e0c1a9b2d4c1e8f005a6b7c8d9e01")
    degraded = pynvml.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE << \
        pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW
    nvml = FakeNvml(fabric=[
        {"state": pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, "status": pynvml.NVML_SUCCESS,
         "cliqueId": 32766, "clusterUuid": uuid,
         "healthMask": pynvml.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_FALSE},
        {"state": pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS, "status": pynvml.NVML_SUCCESS,
         "cliqueId": 32766, "clusterUuid": uuid, "healthMask": degraded},
        pynvml.NVMLError_NotSupported(),
    ])
    fabric = probe_fabric({ROOT_VARIABLE: "/nonexistent"}, nvml=nvml)
    first, second, third = fabric.gpus
    assert (first.state, first.status, first.cluster_uuid, first.clique_id, first.health) == (
        COMPLETED, "success", "3f4e0c1a-9b2d-4c1e-8f00-5a6b7c8d9e01", 32766, "ok")
    assert (second.state, second.health) == (IN_PROGRESS, "degraded")
    assert third.state == NOT_SUPPORTED
    assert fabric.method == "nvml"


def test_a_hung_nvml_is_bounded_then_nvidia_smi_answers(tmp_path):
    release = threading.Event()
    try:
        fabric = probe_fabric({ROOT_VARIABLE: str(tmp_path)}, nvml=FakeNvml(fabric=[], hang=release),
                              smi_command=_script(tmp_path, read("hgx_fabric_manager_grep.txt")),
                              nvml_timeout_s=0.3)
    finally:
        release.set()
    assert fabric.method == "nvidia-smi"
    assert "NVML did not answer within 0.3 s" in fabric.detail


def test_imex_channel_writable_unwritable_absent(tmp_path, monkeypatch):
    env = {ROOT_VARIABLE: str(tmp_path)}
    assert imex_channel(env) == ABSENT
    folder = tmp_path / "dev" / "nvidia-caps-imex-channels"
    folder.mkdir(parents=True)
    assert imex_channel(env) == ABSENT
    (folder / "channel0").write_text("")
    assert imex_channel(env) == WRITABLE
    # Tests run as root here, for whom os.access grants everything: the
    # worker's view of a channel it may not open is given by os.access.
    monkeypatch.setattr(listings.os, "access", lambda path, mode: False)
    assert imex_channel(env) == UNWRITABLE


def test_the_fake_node_gives_the_gpus_and_the_fabric():
    text = ('{"gpus": "10.0,10.0", "fabric": {"state": "completed", "cluster_uuid": '
            '"3f4e0c1a-9b2d-4c1e-8f00-5a6b7c8d9e01", "clique_id": 7}, '
            '"imex_channel": "unwritable"}')
    gpus = probe_gpus({FAKE_NODE_VARIABLE: text, FAKE_VARIABLE: "8.0"})
    assert gpus.capabilities == ((10, 0), (10, 0))  # the node's gpus win
    fabric = probe_fabric({FAKE_NODE_VARIABLE: text})
    assert fabric.attached and fabric.imex_channel == UNWRITABLE and len(fabric.gpus) == 2
    only_fabric = '{"fabric": {"state": "not_started"}}'
    assert probe_gpus({FAKE_NODE_VARIABLE: only_fabric, FAKE_VARIABLE: "9.0"}).capabilities \
        == ((9, 0),)


@pytest.mark.parametrize("text,message", [
    ("{", "is not JSON"),
    ("[]", "must be a JSON object"),
    ('{"gpu": "9.0"}', "unknown key(s) gpu"),
    ('{"gpus": 9}', "gpus must be a string"),
    ('{"gpus": "9.x"}', "not a compute capability"),
    ('{"imex_channel": "yes"}', "imex_channel must be one of writable, unwritable, absent"),
    ('{"fabric": {"state": "ready"}}', "fabric.state must be one of"),
    ('{"fabric": {"state": "completed", "health": "bad"}}', "fabric.health must be one of"),
    ('{"fabric": {"state": "completed", "clique_id": "7"}}', "clique_id must be a non-negative integer"),
    ('{"fabric": {"state": "completed", "health_mask": -1}}',
     "health_mask must be a non-negative integer"),
    ('{"imex_status": "up"}', "imex_status must be one of ready, not-ready"),
])
def test_a_bad_fake_node_is_named_and_never_a_silent_value(text, message):
    gpus = probe_gpus({FAKE_NODE_VARIABLE: text})
    assert gpus.capabilities is None and message in gpus.error
    fabric = probe_fabric({FAKE_NODE_VARIABLE: text})
    assert not fabric.is_known and message in fabric.error


def test_a_fabric_not_started_is_switched_but_not_ready():
    fabric = parse_fake_node('{"gpus": "9.0", "fabric": {"state": "not_started"}}')[1]
    assert fabric.switched and not fabric.ready and not fabric.attached
    assert fabric.gpus[0].state == NOT_STARTED


def test_fake_gpus_alone_are_a_node_without_fabric():
    fabric = probe_fabric({FAKE_VARIABLE: "8.0,8.0"}, nvml=FakeNvml(fail=NO_LIBRARY), smi_command=NO_SMI)
    assert fabric.method == "fake" and fabric.is_known
    assert [g.state for g in fabric.gpus] == [NOT_SUPPORTED, NOT_SUPPORTED]
    assert not probe_fabric({FAKE_VARIABLE: "9.x"}).is_known


def test_probe_node_reads_the_fabric_only_for_packs_that_need_it():
    from ray_megatron_env.packs import get_pack
    from ray_megatron_env.probe import probe_node

    environ = {FAKE_NODE_VARIABLE: '{"gpus": "9.0", "fabric": {"state": "not_started"}}'}
    assert probe_node((), environ).fabric is None
    facts = probe_node(get_pack("nccl-fabric").fact_kinds, environ)
    assert facts.gpus.capabilities == ((9, 0),) and facts.fabric.switched


# --- NVML's health mask, decoded by NVML's own layout (nvml.h) ----------------

@pytest.mark.parametrize("mask,fields,problems", [
    # NVIDIA/nccl#2186 reports 0xaa: bits 0-7 read 2 (false) four times, the
    # configuration field 0 (not reported): a healthy GPU, not "4 of 8 degraded".
    (0xAA, {"degraded_bw": "false", "route_recovery": "false", "route_unhealthy": "false",
            "access_timeout_recovery": "false"}, ()),
    (0x0, {}, ()),
    (0x1, {"degraded_bw": "true"}, ("degraded_bw=true",)),
    (0x2 | (4 << 8), {"degraded_bw": "false", "incorrect_configuration": "no_partition"},
     ("incorrect_configuration=no_partition",)),
    ((1 << 8) | (1 << 12) | (2 << 14), {"incorrect_configuration": "none",
                                        "partition_assigned": "true",
                                        "gfm_state": "disconnected"},
     ("gfm_state=disconnected",)),
])
def test_the_health_mask_decodes_as_nvml_defines_it(mask, fields, problems):
    from ray_megatron_env.node import decode_health_mask, health_problems

    assert decode_health_mask(mask) == fields
    assert health_problems(mask) == problems


def test_the_layout_is_nvmls_own():
    from ray_megatron_env.node import HEALTH_FIELDS

    for name, shift, width, _ in HEALTH_FIELDS:
        upper = name.upper()
        assert getattr(pynvml, f"NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_{upper}") == shift, name
        assert getattr(pynvml, f"NVML_GPU_FABRIC_HEALTH_MASK_WIDTH_{upper}") == width, name


def test_nvml_record_keeps_the_whole_mask():
    uuid = bytes.fromhex("3f4e0c1a9b2d4c1e8f005a6b7c8d9e01")
    nvml = FakeNvml(fabric=[{"state": pynvml.NVML_GPU_FABRIC_STATE_COMPLETED,
                         "status": pynvml.NVML_SUCCESS, "cliqueId": 1, "clusterUuid": uuid,
                         "healthMask": 0xAA}])
    gpu, = probe_fabric({ROOT_VARIABLE: "/nonexistent"}, nvml=nvml,
                        imex_command=NO_SMI).gpus
    assert (gpu.health, gpu.health_mask, gpu.health_problems) == ("ok", 0xAA, ())


# --- IMEX's state ---------------------------------------------------------------

UP = ('{"nodes": {"0": {"status": "READY", "host": "10.0.0.1", "connections": {}}}, '
      '"timestamp": "9/4/2026 00:00:00.000", "status": "UP"}')
DOWN = ('{"nodes": {"0": {"status": "UNAVAILABLE", "host": "10.0.0.1", '
        '"connections": {}}}, "status": "DOWN"}')
DEGRADED = '{"nodes": {}, "status": "DEGRADED"}'


@pytest.mark.parametrize("text,status", [
    (UP, "ready"), (DOWN, "not-ready"), (DEGRADED, None), ("", None), ("[]", None),
    ("Connection refused", None),
])
def test_imex_domain_status_from_nvidia_imex_ctl(text, status):
    from ray_megatron_env.probe import parse_imex_domain

    assert parse_imex_domain(text)[0] == status


def _gb200_nvml():
    uuid = bytes.fromhex("3f4e0c1a9b2d4c1e8f005a6b7c8d9e01")
    return FakeNvml(fabric=[{"state": pynvml.NVML_GPU_FABRIC_STATE_COMPLETED,
                         "status": pynvml.NVML_SUCCESS, "cliqueId": 1, "clusterUuid": uuid,
                         "healthMask": 0}])


def test_the_imex_tool_is_asked_on_an_attached_node_and_bounded(tmp_path):
    down = _script(tmp_path, DOWN)
    fabric = probe_fabric({ROOT_VARIABLE: str(tmp_path)}, nvml=_gb200_nvml(),
                          imex_command=down)
    assert fabric.attached and fabric.imex_status == "not-ready"
    absent = probe_fabric({ROOT_VARIABLE: str(tmp_path)}, nvml=_gb200_nvml(),
                          imex_command=NO_SMI)
    assert absent.imex_status is None and "not installed" in absent.imex_detail
    hang = tmp_path / "hang"
    hang.write_text("#!/bin/sh\nsleep 30\n")
    hang.chmod(0o755)
    slow = probe_fabric({ROOT_VARIABLE: str(tmp_path)}, nvml=_gb200_nvml(),
                        imex_command=(str(hang),), imex_timeout_s=0.5)
    assert slow.imex_status is None and "did not answer within 0.5 s" in slow.imex_detail


def test_the_imex_tool_is_not_run_where_nccl_takes_no_mnnvl_path(tmp_path):
    marker = tmp_path / "ran"
    tool = tmp_path / "imex"
    tool.write_text(f"#!/bin/sh\ntouch {marker}\necho '{UP}'\n")
    tool.chmod(0o755)
    fabric = probe_fabric({ROOT_VARIABLE: str(tmp_path)}, nvml=FakeNvml(fail=NO_LIBRARY),
                          smi_command=_script(tmp_path, read("hgx_h100_sxm_x8.txt")),
                          imex_command=(str(tool),))
    assert not fabric.attached and fabric.imex_status is None and not marker.exists()


def test_the_fake_node_carries_imex_status_and_absent_is_unknown():
    base = '{"gpus": "10.0", "fabric": {"state": "completed", "cluster_uuid": "%s"}' % (
        "3f4e0c1a-9b2d-4c1e-8f00-5a6b7c8d9e01")
    assert parse_fake_node(base + ', "imex_status": "ready"}')[1].imex_status == "ready"
    assert parse_fake_node(base + ', "imex_status": "not-ready"}')[1].imex_status == \
        "not-ready"
    assert parse_fake_node(base + "}")[1].imex_status is None


def test_attached_is_nccls_condition_state_and_uuid_not_status():
    text = ('{"gpus": "10.0", "fabric": {"state": "completed", "status": "NVML error 999", '
            '"cluster_uuid": "3f4e0c1a-9b2d-4c1e-8f00-5a6b7c8d9e01"}}')
    fabric = parse_fake_node(text)[1]
    assert fabric.attached and fabric.registration_failed and not fabric.ready
    zero = parse_fake_node('{"gpus": "10.0", "fabric": {"state": "completed", "cluster_uuid": '
                           '"00000000-0000-0000-0000-000000000000"}}')[1]
    assert not zero.attached


def test_without_nvidia_ml_py_the_fabric_is_read_through_rays_bundled_binding(monkeypatch):
    # A node that has the package only through py_modules: no nvidia-ml-py,
    # only the pynvml copy inside Ray. The GPUs and the fabric are read
    # through the same binding; its driver calls are the only thing faked.
    import sys

    from ray._private.thirdparty import pynvml as bundled

    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` now fails
    uuid = bytes.fromhex("3f4e0c1a9b2d4c1e8f005a6b7c8d9e01")
    driver = FakeNvml(fabric=[{"state": bundled.NVML_GPU_FABRIC_STATE_COMPLETED,
                           "status": bundled.NVML_SUCCESS, "cliqueId": 1, "clusterUuid": uuid,
                           "healthMask": 0}] * 2)
    for call in ("nvmlInit", "nvmlShutdown", "nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex",
                 "nvmlDeviceGetGpuFabricInfoV"):
        monkeypatch.setattr(bundled, call, getattr(driver, call))
    fabric = probe_fabric({ROOT_VARIABLE: "/nonexistent"}, imex_command=NO_SMI,
                          smi_command=NO_SMI)
    assert fabric.method == "nvml" and fabric.attached, fabric
    assert [g.cluster_uuid for g in fabric.gpus] == ["3f4e0c1a-9b2d-4c1e-8f00-5a6b7c8d9e01"] * 2


def test_an_ascend_node_is_the_same_node_in_every_text_form():
    # One reader of the GPU list: every vendor name is accepted wherever a
    # GPU list is (issue 21: "npu" failed in the fake node and in --node).
    from ray_megatron_env.names import FAKE_NODE_VARIABLE as NODE

    for text in ({NODE: '{"gpus": "npu"}'}, {FAKE_VARIABLE: "npu"}, {NODE: '{"gpus": "ascend"}'}):
        gpus = probe_gpus(text)
        assert (gpus.capabilities, gpus.vendor, gpus.method) == ((), "ascend", "fake"), text
    assert probe_fabric({NODE: '{"gpus": "npu"}'}).gpus == ()  # no NVIDIA GPU, no fabric
