"""Topical: issue 29 (items 2 to 8), the torch-arch, nccl-host-mem and nccl-fabric
rows against their sources. Every expected value here is written by hand
from the source named beside it, never computed by the code under test:

* PyTorch torch/utils/cpp_extension.py ``_get_cuda_arch_flags``, read in the
  2.6.0, 2.7.0, 2.8.0, 2.9.0, 2.10.0, 2.11.0 wheels and the installed 2.13.0:
  ``if not _arch_list`` (from 2.9 ``or _arch_list == "native"``) takes the
  default path before any splitting; otherwise each entry must be in
  ``supported_arches`` (+PTX allowed) or it raises ValueError.
* CUDA binary compatibility: SASS for X.y runs on X.z, z >= y.
* NCCL 2.30.7: src/misc/param.cc (``strtoll(str, nullptr, 0)``, empty is the
  default), src/graph/paths.cc (P2P needs NVML_P2P_STATUS_OK for READ and
  WRITE; ncclGetLevel: NCCL_P2P_DISABLE == 1 gives PATH_LOC = 0),
  src/init.cc (MNNVL check only if ``p2pLevel != 0`` or MNNVL_ENABLE == 1),
  docs/.../runtime_and_mpi_issues.rst (cuMem host memory fails without P2P
  before CUDA 13.0; forward compatibility hides the driver).
* CUDA Toolkit 13.0 release notes, Table 3: CUDA 13.0 GA needs a Linux
  driver >= 580.65.06.
"""

import json

import pytest

from ray_megatron_env.cli import OK, main
from ray_megatron_env.explanation import explain_node
from ray_megatron_env.node import FakeNodeError
from ray_megatron_env.probe.fake import parse_fake_node
from ray_megatron_env.probe import probe_p2p

from configs import MEGATRON_YAML
from fake_nvml import FakeNvml

ARCHS, HOST = "TORCH_CUDA_ARCH_LIST", "NCCL_CUMEM_HOST_ENABLE"
MEGATRON_TP2 = {"engines": {"actor": {"strategy": "megatron", "tensor_parallel": 2}}}

# supported_arches, copied from each wheel's cpp_extension.py.
TORCH_2_7 = {"3.5", "3.7", "5.0", "5.2", "5.3", "6.0", "6.1", "6.2", "7.0", "7.2", "7.5", "8.0",
             "8.6", "8.7", "8.9", "9.0", "9.0a", "10.0", "10.0a", "10.1", "10.1a", "12.0",
             "12.0a"}
TORCH_2_8 = TORCH_2_7 | {"10.3", "10.3a", "12.1", "12.1a"}
TORCH_2_9_TO_2_13 = (TORCH_2_8 - {"10.1", "10.1a"}) | {"11.0", "11.0a"}


# --- torch-arch: what the pack writes ------------------------------------------

# GPUs -> the value written (None: nothing), the rule.
@pytest.mark.parametrize("gpus,value,rule", [
    ("8.0", "8.0", "unset"),
    ("9.0", "9.0", "unset"),
    ("10.0", "10.0", "unset"),
    ("12.0", "12.0", "unset"),
    # GB10 reports 12.1, which 2.7 rejects: 12.0's SASS, with PTX for the
    # driver to JIT where that SASS is refused (issue 37)
    ("12.1", "12.0+PTX", "unset"),
    # B300/GB300 report 10.3, which 2.7 rejects: the same
    ("10.3", "10.0+PTX", "unset"),
    ("10.3,12.1", "10.0+PTX 12.0+PTX", "unset"),
    # Thor under CUDA 12.x (10.1, gone from 2.9): the same
    ("10.1", "10.0+PTX", "unset"),
    # Thor under CUDA 13 (11.0, unknown to 2.7 and 2.8): no entry for it
    ("11.0", None, "no-portable-arch"),
    ("11.0,8.7", None, "no-portable-arch"),
    ("8.7", "8.7", "unset"),
])
def test_torch_arch_writes_what_every_release_from_2_7_accepts(gpus, value, rule):
    result = explain_node(MEGATRON_TP2, gpus, packs=["torch-arch"])
    entry = result.decision.variables[ARCHS]
    assert (result.env().get(ARCHS), entry.rule) == (value, rule)
    if value is not None:
        for arch in value.split():
            arch = arch.removesuffix("+PTX")
            assert arch in TORCH_2_7 and arch in TORCH_2_8 and arch in TORCH_2_9_TO_2_13
    assert any("no-portable-arch" in w for w in result.decision.warnings) == \
        (rule == "no-portable-arch")
    assert result.decision.satisfied


# --- torch-arch: what is already there ---------------------------------------------

# GPUs, job value, node value -> value, source, rule, written, an arch warning, satisfied.
@pytest.mark.parametrize("gpus,job,inherited,value,source,rule,written,warns,satisfied", [
    # "" is PyTorch's unset: never a broken required rule
    ("8.0", None, "", "8.0", "policy", "unset", True, False, True),
    ("8.0", "", None, "", "explicit", "unset", False, True, True),
    ("12.1", None, "", "12.0+PTX", "policy", "unset", True, False, True),
    # "native" is the visible GPUs' archs (2.9+): as unset
    ("9.0", None, "native", "9.0", "policy", "unset", True, False, True),
    ("9.0", "native", None, "native", "explicit", "unset", False, True, True),
    # an empty entry inside a non-empty list is rejected
    ("8.0", None, "8.0 ", "8.0", "policy", "misses-node-arch", True, False, True),
    ("8.0", None, "8.0  9.0", "8.0", "policy", "misses-node-arch", True, False, True),
    ("8.0", "8.0;", None, "8.0;", "explicit", "misses-node-arch", False, True, False),
    # entries outside current supported_arches: 8.0a, 10.1 (gone from 2.9)
    ("8.0", None, "8.0a", "8.0", "policy", "misses-node-arch", True, False, True),
    ("10.0", None, "10.0 10.1", "10.0", "policy", "misses-node-arch", True, False, True),
    # Blackwell is 10.0;10.3;12.0;12.1+PTX today: SASS for 10.3 and 12.1
    ("10.3", None, "Blackwell", "Blackwell", "node", "covers-node-archs", False, False, True),
    ("12.1", None, "Blackwell", "Blackwell", "node", "covers-node-archs", False, False, True),
    ("10.0,10.3", "Blackwell", None, "Blackwell", "explicit", "covers-node-archs", False,
     False, True),
    # Blackwell+Tegra is 11.0 today
    ("11.0", None, "Blackwell+Tegra", "Blackwell+Tegra", "node", "no-portable-arch", False,
     True, True),
    # the pack's own entry covers: 12.0+PTX on 12.1, 10.0+PTX on 10.3; the
    # older minor's SASS alone is kept with a warning (issue 37: contested)
    ("12.1", None, "12.0+PTX", "12.0+PTX", "node", "covers-node-archs", False, False, True),
    ("10.3", "10.0+PTX", None, "10.0+PTX", "explicit", "covers-node-archs", False, False, True),
    ("12.1", None, "12.0", "12.0", "node", "covers-only-through-ptx", False, True, True),
    ("10.3", "10.0", None, "10.0", "explicit", "covers-only-through-ptx", False, True, True),
    # arch-specific code runs on its own arch only: 12.0a misses a 12.1 GPU
    ("12.1", None, "12.0a", "12.0+PTX", "policy", "misses-node-arch", True, False, True),
    # another older minor is still indirect: 8.0 on 8.6, 8.6 on 8.9
    ("8.6", None, "8.0", "8.0", "node", "covers-only-through-ptx", False, True, True),
    ("8.9", None, "8.6", "8.6", "node", "covers-only-through-ptx", False, True, True),
])
def test_torch_arch_reads_values_as_pytorch_does(gpus, job, inherited, value, source, rule,
                                                 written, warns, satisfied):
    result = explain_node(MEGATRON_TP2, gpus, packs=["torch-arch"],
                          job_env={ARCHS: job} if job is not None else None,
                          node_env={ARCHS: inherited} if inherited is not None else None)
    entry = result.decision.variables[ARCHS]
    assert (entry.value, entry.source, entry.rule) == (value, source, rule)
    assert (ARCHS in result.env()) == written
    assert any(ARCHS in w or "torch-arch" in w for w in result.decision.warnings) == warns
    assert result.decision.satisfied == satisfied


def test_a_jobs_empty_list_breaks_only_a_preferred_rule():
    result = explain_node(MEGATRON_TP2, "8.0", packs=["torch-arch"], job_env={ARCHS: ""})
    [warning] = [w for w in result.decision.warnings if ARCHS in w]
    assert "breaks a preferred rule" in warning and "required" not in warning


# --- nccl-host-mem: the kernel driver decides ------------------------------------

def _node(cuda=None, kernel=None, p2p="none", gpus="8.9,8.9,8.9,8.9"):
    facts = {"gpus": gpus, "p2p": p2p}
    if cuda is not None:
        facts["cuda_driver"] = cuda
    if kernel is not None:
        facts["kernel_driver"] = kernel
    return json.dumps(facts)


# node facts, job env -> written, the record's (value, source, rule), warns, satisfied
@pytest.mark.parametrize("facts,job,written,host,warns,satisfied", [
    # the Done-when rows: CUDA 13.0 through forward compat on a 570 kernel driver
    (_node("13.0", "570.172.08"), {}, {HOST: "0"}, ("0", "policy", "no-p2p-old-driver"),
     False, True),
    (_node("13.0", "580.65.06"), {}, {}, (None, "none", "leave-to-nccl"), False, True),
    (_node("13.0", "580.82.07"), {}, {}, (None, "none", "leave-to-nccl"), False, True),
    (_node("13.0", "580.65.05"), {}, {HOST: "0"}, ("0", "policy", "no-p2p-old-driver"),
     False, True),
    (_node("12.9", "575.57.08"), {}, {HOST: "0"}, ("0", "policy", "no-p2p-old-driver"),
     False, True),
    # kernel driver unknown: the CUDA version NVML reports, as before
    (_node("13.0"), {}, {}, (None, "none", "leave-to-nccl"), False, True),
    (_node("12.8"), {}, {HOST: "0"}, ("0", "policy", "no-p2p-old-driver"), False, True),
    # a 570 kernel driver with every pair peer-accessible: nothing
    (_node("13.0", "570.172.08", p2p="all"), {}, {}, (None, "none", "leave-to-nccl"), False,
     True),
    # a job's 0x0 is 0 to NCCL: it meets the rule
    (_node("13.0", "570.172.08"), {HOST: "0x0"}, {}, ("0x0", "explicit", "no-p2p-old-driver"),
     False, True),
    (_node("13.0", "570.172.08"), {HOST: "00"}, {}, ("00", "explicit", "no-p2p-old-driver"),
     False, True),
    (_node("13.0", "570.172.08"), {HOST: "0x1"}, {}, ("0x1", "explicit", "no-p2p-old-driver"),
     True, False),
])
def test_nccl_host_mem_decides_from_the_kernel_driver(facts, job, written, host, warns,
                                                      satisfied):
    result = explain_node(MEGATRON_TP2, node=facts, packs=["nccl-host-mem"], job_env=job)
    assert {k: v for k, v in result.env().items() if k.startswith("NCCL_")} == written
    entry = result.decision.variables[HOST]
    assert (entry.value, entry.source, entry.rule) == host
    assert any(HOST in w for w in result.decision.warnings) == warns
    assert result.decision.satisfied == satisfied


def test_an_inherited_0x0_is_kept():
    result = explain_node(MEGATRON_TP2, node=_node("12.8"), packs=["nccl-host-mem"],
                          node_env={HOST: "0x0"})
    entry = result.decision.variables[HOST]
    assert (entry.value, entry.source, HOST in result.env()) == ("0x0", "node", False)


def test_the_reason_names_the_kernel_driver_and_forward_compatibility():
    result = explain_node(MEGATRON_TP2, node=_node("13.0", "570.172.08"),
                          packs=["nccl-host-mem"])
    reason = result.decision.variables[HOST].reason
    assert "kernel driver 570.172.08 < 580.65.06" in reason
    assert "CUDA 13.0 reported: forward compatibility" in reason


def test_explain_node_takes_the_kernel_driver(capsys):
    assert main(["explain", str(MEGATRON_YAML), "--packs", "nccl-host-mem", "--node",
                 _node("13.0", "570.172.08"), "--json"]) == OK
    out = json.loads(capsys.readouterr().out)
    assert out["env"][HOST] == "0"


def test_the_fake_node_reads_the_kernel_driver_and_names_a_bad_one():
    assert parse_fake_node(_node("13.0", "570.172.08")).p2p.kernel_driver == "570.172.08"
    assert parse_fake_node(_node("13.0")).p2p.kernel_driver is None  # absent: unknown
    for bad, words in ((570, "kernel_driver must be a string"),
                       ("r570", "kernel_driver: not a kernel driver version")):
        with pytest.raises(FakeNodeError, match=words):
            parse_fake_node(json.dumps({"gpus": "8.9", "kernel_driver": bad}))


# --- the probe: READ and WRITE, and the kernel driver ------------------------------

def test_a_pair_whose_write_status_fails_has_no_peer_access():
    # READ is OK everywhere; WRITE fails 0 -> 1 only (NCCL needs both)
    p2p = probe_p2p({}, nvml=FakeNvml(3, without_write={(0, 1)}))
    assert p2p.without == ((0, 1),)


@pytest.mark.parametrize("returned,kernel", [
    ("570.172.08", "570.172.08"), (b"580.65.06", "580.65.06"), ("garbage", None),
    (None, None),  # the call is missing from the binding
])
def test_the_probe_reads_the_kernel_driver_from_nvml(returned, kernel):
    p2p = probe_p2p({}, nvml=FakeNvml(2, kernel=returned, driver=13000))
    assert (p2p.kernel_driver, p2p.cuda_driver) == (kernel, (13, 0))


# --- nccl-fabric: NCCL_P2P_DISABLE=1 turns MNNVL off -----------------------------

GB200_IMEX = json.dumps({"gpus": "10.0,10.0,10.0,10.0", "imex_channel": "writable",
                         "fabric": {"state": "completed", "status": "success",
                                    "cluster_uuid": "3f4e0c1a-9b2d-4c1e-8f00-5a6b7c8d9e01",
                                    "clique_id": 1, "health": "ok"}})


@pytest.mark.parametrize("node,job,warns", [
    (GB200_IMEX, {"NCCL_P2P_DISABLE": "1"}, True),
    (GB200_IMEX, {"NCCL_P2P_DISABLE": "0x1"}, True),  # strtol base 0
    (GB200_IMEX, {"NCCL_P2P_DISABLE": "0"}, False),
    (GB200_IMEX, {"NCCL_P2P_DISABLE": "1", "NCCL_MNNVL_ENABLE": "1"}, False),  # forced
    (json.dumps({"gpus": "9.0,9.0"}), {"NCCL_P2P_DISABLE": "1"}, False),  # no fabric
])
def test_p2p_disable_on_a_fabric_node_warns_that_mnnvl_is_off(node, job, warns):
    result = explain_node(MEGATRON_TP2, node=node, packs=["nccl-fabric"], job_env=job)
    assert any("p2p-off-disables-mnnvl" in w for w in result.decision.warnings) == warns
    assert "NCCL_MNNVL_ENABLE" not in result.env()
    assert result.decision.satisfied


def test_the_kernel_driver_survives_the_node_cache_and_checks_probe_json(tmp_path):
    from ray_megatron_env.cache import NodeCache
    from ray_megatron_env.node import facts_from_record
    from ray_megatron_env.names import P2P

    facts = parse_fake_node(_node("13.0", "570.172.08")).p2p
    cache = NodeCache(str(tmp_path), "node1")
    cache.get(lambda: facts, "p2p")
    again = cache.get(lambda: pytest.fail("probed twice"), "p2p")
    assert again.kernel_driver == "570.172.08"
    assert facts_from_record(P2P, facts.to_dict()).kernel_driver == "570.172.08"


def test_check_advises_nccl_host_mem_from_the_kernel_driver():
    from ray_megatron_env.check import _advice
    from ray_megatron_env.explanation import explain
    from ray_megatron_env.node import NodeFabric

    fabric = NodeFabric((), "absent", "fake").to_dict()
    decision = explain(MEGATRON_TP2, "8.9,8.9,8.9,8.9").to_json()
    old = parse_fake_node(_node("13.0", "570.172.08")).p2p.to_dict()
    new = parse_fake_node(_node("13.0", "580.65.06")).p2p.to_dict()
    assert _advice(json.dumps({"fabric": fabric, "p2p": old}), decision, "l4", "{}").startswith(
        "nccl-host-mem would set NCCL_CUMEM_HOST_ENABLE=0 on node l4")
    assert _advice(json.dumps({"fabric": fabric, "p2p": new}), decision, "l4", "{}") is None
