"""The nccl-host-mem and torch-arch packs: golden tables, the peer-access
and CUDA-driver facts (fake node, fake NVML), explain --node-env, check's
advice and the driver's arch list.

Expected values are written by hand from the sources docs/packs.md cites:
NCCL src/misc/cudawrap.cc (CUMEM_HOST_ENABLE -1: on where the driver is
12.6+; ncclCuMemEnable(): 0, or negative but not -2, is off),
src/transport/shm.cc (the cuMem host path only when both are on),
docs/.../runtime_and_mpi_issues.rst (fails without P2P before driver 13.0),
src/graph/paths.cc and shm.cc (P2P_DISABLE / SHM_DISABLE == 1), and
PyTorch torch/utils/cpp_extension.py _get_cuda_arch_flags (spaces become
';', named arches expanded, one -gencode per entry, +PTX adds PTX).
"""

import json

import pynvml
import pytest

from configs import MEGATRON_YAML
from fake_nvml import FakeNvml
from ray_megatron_env.check import NodeReport, _advice
from ray_megatron_env.cli import OK, PROBLEM, format_check, main
from ray_megatron_env.record import Decision
from ray_megatron_env.errors import FieldValueError
from ray_megatron_env.explanation import explain, explain_node
from ray_megatron_env.node import FakeNodeError, NodeFabric, parse_driver, parse_fake_node
from ray_megatron_env.names import FAKE_NODE_VARIABLE
from ray_megatron_env.probe import FAKE_VARIABLE, probe_p2p

HOST, P2P_OFF, SHM_OFF = "NCCL_CUMEM_HOST_ENABLE", "NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE"
ARCHS = "TORCH_CUDA_ARCH_LIST"
MEGATRON_TP2 = {"engines": {"actor": {"strategy": "megatron", "tensor_parallel": 2}}}

# 8xL40S on two PCIe root complexes: GPUs 0-3 and 4-7 reach each other only
# within a root.
ACROSS_ROOTS = [[i, j] for i in range(4) for j in range(4, 8)]
L40S_8 = "8.9,8.9,8.9,8.9,8.9,8.9,8.9,8.9"


def node(gpus, p2p=None, driver=None):
    facts = {"gpus": gpus}
    if p2p is not None:
        facts["p2p"] = p2p
    if driver is not None:
        facts["cuda_driver"] = driver
    return json.dumps(facts)


L40S_OLD = node(L40S_8, ACROSS_ROOTS, "12.8")
L40S_NEW = node(L40S_8, ACROSS_ROOTS, "13.0")
L4_4_OLD = node("8.9,8.9,8.9,8.9", "none", "12.6")
L4_DRIVER_UNREPORTED = node("8.9,8.9,8.9,8.9", "none")
L4_PRE_12_6 = node("8.9,8.9", "none", "12.4")
ONE_L40S = node("8.9", "none", "12.8")
HGX_H100 = node("9.0,9.0,9.0,9.0,9.0,9.0,9.0,9.0", "all", "12.8")
CPU = node("none", "none", "12.8")


def variables(result, *names):
    return {n: result.decision.variables[n] for n in names}


# --- nccl-host-mem ---------------------------------------------------------

# node facts, job env_vars, node env -> written, the record's (value, source,
# rule) of NCCL_CUMEM_HOST_ENABLE, whether a warning is given, satisfied.
@pytest.mark.parametrize("facts,job,inherited,written,host,warns,satisfied", [
    # the Done-when row: no P2P across the roots, driver 12.8 -> 0
    (L40S_OLD, {}, {}, {HOST: "0"}, ("0", "policy", "no-p2p-old-driver"), False, True),
    (L4_4_OLD, {}, {}, {HOST: "0"}, ("0", "policy", "no-p2p-old-driver"), False, True),
    # NVML did not say which driver: read as an old one
    (L4_DRIVER_UNREPORTED, {}, {}, {HOST: "0"}, ("0", "policy", "no-p2p-old-driver"), False,
     True),
    # below 12.6 NCCL's own default is 0 already; forward compatibility may
    # show NCCL a newer one, so 0 is written all the same
    (L4_PRE_12_6, {}, {}, {HOST: "0"}, ("0", "policy", "no-p2p-old-driver"), False, True),
    # driver 13.0, one GPU, every pair with P2P, no GPU: nothing
    (L40S_NEW, {}, {}, {}, (None, "none", "leave-to-nccl"), False, True),
    (ONE_L40S, {}, {}, {}, (None, "none", "leave-to-nccl"), False, True),
    (HGX_H100, {}, {}, {}, (None, "none", "leave-to-nccl"), False, True),
    (CPU, {}, {}, {}, (None, "none", "leave-to-nccl"), False, True),
    # cuMem off in the job (0, or negative but not -2): the host path is unused
    # only while it stays off (NeMo-RL turns it on in its workers), so 0 is
    # written there too, inert where cuMem stays off (issue 37)
    (L40S_OLD, {"NCCL_CUMEM_ENABLE": "0"}, {}, {HOST: "0"}, ("0", "policy", "cumem-off"), False,
     True),
    (L40S_OLD, {"NCCL_CUMEM_ENABLE": "-1"}, {}, {HOST: "0"}, ("0", "policy", "cumem-off"), False,
     True),
    (L40S_OLD, {}, {"NCCL_CUMEM_ENABLE": "0"}, {HOST: "0"}, ("0", "policy", "cumem-off"), False,
     True),
    # -2 is auto, 1 is on: still the crash
    (L40S_OLD, {"NCCL_CUMEM_ENABLE": "-2"}, {}, {HOST: "0"},
     ("0", "policy", "no-p2p-old-driver"), False, True),
    (L40S_OLD, {"NCCL_CUMEM_ENABLE": "1"}, {}, {HOST: "0"},
     ("0", "policy", "no-p2p-old-driver"), False, True),
    # the job's own 1 there: kept, a warning, a required rule broken
    (L40S_OLD, {HOST: "1"}, {}, {}, ("1", "explicit", "no-p2p-old-driver"), True, False),
    # the node's (an image's) 1: replaced; its 0: kept
    (L40S_OLD, {}, {HOST: "1"}, {HOST: "0"}, ("0", "policy", "no-p2p-old-driver"), False, True),
    (L40S_OLD, {}, {HOST: "0"}, {}, ("0", "node", "no-p2p-old-driver"), False, True),
    # NCCL_P2P_DISABLE=1 does not avoid it (NVIDIA-NeMo/RL#1683): still 0
    (L4_4_OLD, {P2P_OFF: "1"}, {}, {HOST: "0"}, ("0", "policy", "no-p2p-old-driver"), False,
     True),
])
def test_nccl_host_mem_rows(facts, job, inherited, written, host, warns, satisfied):
    result = explain_node(MEGATRON_TP2, node=facts, packs=["nccl-host-mem"], job_env=job,
                          node_env=inherited)
    assert {k: v for k, v in result.env().items() if k.startswith("NCCL_")} == written
    entry = result.decision.variables[HOST]
    assert (entry.value, entry.source, entry.rule) == host
    assert entry.pack == "nccl-host-mem"
    assert any(HOST in w for w in result.decision.warnings) == warns
    assert result.decision.satisfied == satisfied


@pytest.mark.parametrize("variable", [P2P_OFF, SHM_OFF])
def test_p2p_or_shm_off_on_an_all_p2p_node_is_kept_with_a_warning(variable):
    result = explain_node(MEGATRON_TP2, node=HGX_H100, packs=["nccl-host-mem"],
                          job_env={variable: "1"})
    # nothing NCCL written: the job's own value stays
    assert {k for k in result.env() if k.startswith("NCCL_")} == set()
    entry = result.decision.variables[variable]
    assert (entry.value, entry.source, entry.action, entry.rule) == \
        ("1", "explicit", "keep", "p2p-transports-off-on-p2p-node")
    [warning] = [w for w in result.decision.warnings if variable in w]
    assert warning.startswith("nccl-host-mem [p2p-transports-off-on-p2p-node]: 8 NVIDIA GPU(s), "
                              "peer access between every pair, CUDA driver 12.8:")
    assert "costs this node its fast" in warning
    assert result.decision.satisfied


def test_p2p_off_on_a_node_without_p2p_says_nothing_of_it():
    result = explain_node(MEGATRON_TP2, node=L4_4_OLD, packs=["nccl-host-mem"],
                          job_env={P2P_OFF: "1", SHM_OFF: "0"})
    assert result.decision.variables[P2P_OFF].rule == "leave-to-nccl"
    assert result.decision.variables[SHM_OFF].rule == "leave-to-nccl"
    assert not any(P2P_OFF in w for w in result.decision.warnings)


def test_without_the_pack_asked_nothing_changes():
    plain = explain_node(MEGATRON_TP2, node=L40S_OLD)
    assert HOST not in plain.env() and HOST not in plain.decision.variables
    assert ARCHS not in plain.decision.variables
    assert plain.decision.packs == {}
    # ... the same record as a node described by its GPUs alone
    assert plain.decision.to_dict() == explain_node(MEGATRON_TP2, L40S_8).decision.to_dict()


def test_peer_access_not_given_to_explain_leaves_nccl_alone_with_a_warning():
    result = explain_node(MEGATRON_TP2, "8.9,8.9", packs=["nccl-host-mem"])
    assert HOST not in result.env()
    assert "nccl-host-mem: the node's GPU peer access could not be read (no --node given " \
           "with the peer-access facts)" in result.decision.warnings[0]


def test_the_record_names_the_row_and_the_facts():
    decision = explain(MEGATRON_TP2, node=L40S_OLD, packs=["nccl-host-mem"])
    record = decision.to_dict()["variables"][HOST]
    assert record["rule"] == "no-p2p-old-driver"
    assert record["reason"].startswith(
        "8 NVIDIA GPU(s), no peer access between GPUs 0-4, 0-5, 0-6, 0-7 and 12 more, CUDA "
        "driver 12.8: NCCL's cuMem host allocations fail between GPUs without peer access on "
        "CUDA driver 12.8 < 13.0")


# --- torch-arch ------------------------------------------------------------

# GPUs, job env_vars value, node value -> the worker's value, source, rule,
# written, a warning, satisfied.
@pytest.mark.parametrize("gpus,job,inherited,value,source,rule,written,warns,satisfied", [
    # the Done-when rows
    ("8.0", None, None, "8.0", "policy", "unset", True, False, True),
    ("8.6,12.0", None, None, "8.6 12.0", "policy", "unset", True, False, True),
    ("8.0", None, "9.0 10.0", "8.0", "policy",
     "misses-node-arch", True, False, True),
    ("10.0", None, "9.0 10.0", "9.0 10.0", "node", "covers-node-archs", False, False, True),
    ("8.0", "9.0", None, "9.0", "explicit", "misses-node-arch", False, True, False),
    # distinct, ascending
    ("12.0,8.6,8.6", None, None, "8.6 12.0", "policy", "unset", True, False, True),
    # the 'a' suffix is never added or stripped: 9.0a covers 9.0
    ("9.0", None, "9.0a", "9.0a", "node", "covers-node-archs", False, False, True),
    ("9.0,9.0", "8.0;9.0a", None, "8.0;9.0a", "explicit", "covers-node-archs", False, False,
     True),
    # arch-specific PTX runs on that arch alone: B200 is missing
    ("10.0", None, "9.0a+PTX", "10.0", "policy", "misses-node-arch", True, False, True),
    # covered only through +PTX (JIT at first launch) or an older minor: kept, warned
    ("9.0", None, "8.0+PTX", "8.0+PTX", "node", "covers-only-through-ptx", False, True, True),
    ("8.6", "8.0", None, "8.0", "explicit", "covers-only-through-ptx", False, True, True),
    # PyTorch's named arches: Ampere is 8.0;8.6+PTX
    ("8.0", None, "Ampere", "Ampere", "node", "covers-node-archs", False, False, True),
    ("8.9", None, "Ampere", "Ampere", "node", "covers-only-through-ptx", False, True, True),
    # an entry PyTorch rejects (the empty one after a trailing ';'): replaced
    ("8.0", None, "8.0;", "8.0", "policy", "misses-node-arch", True, False, True),
    # AReaL's image list on an H100 node: covered
    ("9.0", None, "8.0 8.9 9.0 9.0a", "8.0 8.9 9.0 9.0a", "node", "covers-node-archs", False,
     False, True),
    # no NVIDIA GPU: nothing, whatever is there
    ("none", None, None, None, "none", "leave", False, False, True),
    ("none", None, "9.0", "9.0", "node", "leave", False, False, True),
    ("amd", None, None, None, "none", "leave", False, False, True),
])
def test_torch_arch_rows(gpus, job, inherited, value, source, rule, written, warns, satisfied):
    result = explain_node(MEGATRON_TP2, gpus, packs=["torch-arch"],
                          job_env={ARCHS: job} if job is not None else None,
                          node_env={ARCHS: inherited} if inherited is not None else None)
    entry = result.decision.variables[ARCHS]
    assert (entry.value, entry.source, entry.rule, entry.pack) == \
        (value, source, rule, "torch-arch")
    assert (ARCHS in result.env()) == written
    if written:
        assert result.env()[ARCHS] == value
    assert any(ARCHS in w for w in result.decision.warnings) == warns
    assert result.decision.satisfied == satisfied


def test_an_explicit_list_missing_the_nodes_arch_says_so():
    decision = explain(MEGATRON_TP2, "8.0", packs=["torch-arch"], job_env={ARCHS: "9.0"})
    [warning] = [w for w in decision.warnings if ARCHS in w]
    assert warning.startswith("torch-arch: explicit TORCH_CUDA_ARCH_LIST=9.0 breaks a required "
                              "rule of the torch-arch pack (asks 8.0)")
    assert "has no code for 8.0" in warning


def test_a_probe_that_failed_leaves_the_list_with_a_warning():
    from ray_megatron_env.decision import decide_node
    from ray_megatron_env.frameworks import parse_field
    from ray_megatron_env.node import NodeGpus
    from ray_megatron_env.node import NodeFacts

    spec = parse_field({**MEGATRON_TP2, "packs": ["torch-arch"]})
    result = decide_node(spec, NodeFacts(NodeGpus.unknown("nvml", "GPU is lost")), {}, {})
    assert result.decision.variables[ARCHS].rule == "leave"
    assert any("torch-arch: the node's GPUs could not be read (GPU is lost)" in w
               for w in result.decision.warnings)


# --- both, explain's CLI ---------------------------------------------------

def test_explain_node_env_is_what_a_worker_inherits_for_any_pack(capsys):
    code = main(["explain", str(MEGATRON_YAML), "--packs", "torch-arch,nccl-host-mem",
                 "--node", L40S_OLD, "--node-env", "TORCH_CUDA_ARCH_LIST=9.0 10.0",
                 "--node-env", f"{HOST}=1", "--json"])
    assert code == OK
    out = json.loads(capsys.readouterr().out)
    assert out["env"][ARCHS] == "8.9" and out["env"][HOST] == "0"
    assert out["variables"][ARCHS]["node_value"] == "9.0 10.0"
    assert out["variables"][HOST]["node_value"] == "1"


def test_explain_node_value_still_works_beside_node_env(capsys):
    assert main(["explain", str(MEGATRON_YAML), "--gpus", "9.0", "--node-value", "4",
                 "--node-env", "TORCH_CUDA_ARCH_LIST=9.0", "--packs", "torch-arch"]) == OK
    out = capsys.readouterr().out
    assert "CUDA_DEVICE_MAX_CONNECTIONS: 1" in out
    assert "TORCH_CUDA_ARCH_LIST=9.0 [torch-arch: keep, none, source node]" in out


def test_explain_exits_1_for_an_explicit_list_missing_the_nodes_arch(capsys):
    assert main(["explain", str(MEGATRON_YAML), "--gpus", "8.0", "--packs", "torch-arch",
                 "--job-env", "TORCH_CUDA_ARCH_LIST=9.0"]) == PROBLEM


def test_node_env_takes_name_value(capsys):
    assert main(["explain", str(MEGATRON_YAML), "--gpus", "8.0", "--node-env", "X"]) == 2
    assert "--node-env takes NAME=VALUE" in capsys.readouterr().err


def test_compact_form_and_build_runtime_env_take_both_packs():
    from ray_megatron_env import build_runtime_env
    from ray_megatron_env.frameworks import parse_field

    env = build_runtime_env(MEGATRON_TP2, packs=["torch-arch", "nccl-host-mem"])
    assert env["megatron_env"]["packs"] == ["nccl-host-mem", "torch-arch"]
    assert parse_field({**MEGATRON_TP2, "packs": ["torch-arch"]}).packs == ("torch-arch",)


# --- node facts: the fake node ---------------------------------------------

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


def test_parse_driver_reads_nvmls_integer_and_words():
    assert parse_driver(12080) == (12, 8)
    assert parse_driver(13000) == (13, 0)
    assert parse_driver(12060) == (12, 6)
    assert parse_driver("12.10") == (12, 10)


def test_probe_reads_the_fake_node_and_the_fake_gpus():
    environ = {FAKE_NODE_VARIABLE: L40S_OLD}
    p2p = probe_p2p(environ)
    assert (p2p.method, p2p.count, len(p2p.without), p2p.cuda_driver) == ("fake", 8, 16, (12, 8))
    only_gpus = probe_p2p({FAKE_VARIABLE: "9.0,10.0"})
    assert (only_gpus.count, only_gpus.without) == (2, ())
    bad = probe_p2p({FAKE_NODE_VARIABLE: '{"p2p": 3}'})
    assert bad.count is None and "p2p must be" in bad.error


# --- node facts: NVML ------------------------------------------------------

def test_nvml_pairs_without_peer_access_across_two_roots():
    roots = {(i, j) for i in (0, 1) for j in (2, 3)} | {(j, i) for i in (0, 1) for j in (2, 3)}
    nvml = FakeNvml(4, without=roots, driver=12080)
    p2p = probe_p2p({}, nvml=nvml)
    assert (p2p.method, p2p.count, p2p.without, p2p.cuda_driver, p2p.error) == \
        ("nvml", 4, ((0, 2), (0, 3), (1, 2), (1, 3)), (12, 8), None)
    assert nvml.shut
    assert p2p.describe() == ("4 NVIDIA GPU(s), no peer access between GPUs 0-2, 0-3, 1-2, 1-3, "
                              "CUDA driver 12.8")


def test_nvml_a_pair_is_without_peer_access_if_either_direction_is():
    p2p = probe_p2p({}, nvml=FakeNvml(2, without={(1, 0)}, driver=13000))
    assert (p2p.without, p2p.cuda_driver) == (((0, 1),), (13, 0))


def test_nvml_every_pair_with_peer_access_and_every_pair_asked():
    nvml = FakeNvml(3)
    p2p = probe_p2p({}, nvml=nvml)
    assert p2p.without == () and p2p.count == 3
    assert sorted(nvml.p2p_asked) == [(0, 1), (0, 2), (1, 0), (1, 2), (2, 0), (2, 1)]


def test_nvml_driver_not_reported_is_none_not_a_failure():
    nvml = FakeNvml(2, fail={"nvmlSystemGetCudaDriverVersion": pynvml.NVMLError_NotSupported()})
    p2p = probe_p2p({}, nvml=nvml)
    assert (p2p.count, p2p.cuda_driver) == (2, None)


@pytest.mark.parametrize("fail,words", [
    ({"nvmlInit": pynvml.NVMLError_DriverNotLoaded()}, "nvmlInit failed"),
    ({"nvmlDeviceGetP2PStatus": pynvml.NVMLError_GpuIsLost()}, "NVML P2P query failed"),
])
def test_nvml_failures_are_unknown_never_raised(fail, words):
    nvml = FakeNvml(2, fail=fail)
    p2p = probe_p2p({}, nvml=nvml)
    assert p2p.count is None and not p2p.is_known and words in p2p.error


def test_rays_bundled_binding_has_both_calls():
    from ray._private.thirdparty import pynvml as bundled

    assert callable(bundled.nvmlDeviceGetP2PStatus)
    assert callable(bundled.nvmlSystemGetCudaDriverVersion)
    assert callable(bundled.nvmlSystemGetDriverVersion)
    assert bundled.NVML_P2P_STATUS_OK == 0


def test_the_node_caches_round_trip_the_facts(tmp_path):
    from ray_megatron_env.cache import NodeCache

    cache = NodeCache(str(tmp_path), "node1")
    first = cache.get(lambda: parse_fake_node(L40S_OLD).p2p, "p2p")
    again = cache.get(lambda: pytest.fail("probed twice"), "p2p")
    assert (again.count, again.without, again.cuda_driver) == \
        (first.count, first.without, first.cuda_driver) == (8, first.without, (12, 8))
    assert cache.stamp(("p2p",)) is not None


# --- check: advice and the driver's list -------------------------------------

def _decision_json(gpus):
    return explain(MEGATRON_TP2, gpus).to_json()


def test_check_names_nccl_host_mem_on_an_l40s_node_with_an_old_driver():
    fabric = json.dumps(NodeFabric((), "absent", "fake").to_dict())
    p2p = json.dumps(parse_fake_node(L40S_OLD).p2p.to_dict())
    advice = _advice(fabric, _decision_json(L40S_8), "l40s", p2p, "{}")
    assert advice.startswith("nccl-host-mem would set NCCL_CUMEM_HOST_ENABLE=0 on node l40s: "
                             "8 NVIDIA GPU(s), no peer access")
    assert "packs=['nccl-host-mem']" in advice and "torch-arch" not in advice
    # driver 13.0: nothing to advise
    p2p_new = json.dumps(parse_fake_node(L40S_NEW).p2p.to_dict())
    assert _advice(fabric, _decision_json(L40S_8), "l40s", p2p_new, "{}") is None


def test_check_names_torch_arch_where_the_nodes_list_misses_its_gpus():
    fabric = json.dumps(NodeFabric((), "absent", "fake").to_dict())
    p2p = json.dumps(parse_fake_node('{"gpus": "8.0"}').p2p.to_dict())
    advice = _advice(fabric, _decision_json("8.0"), "a100", p2p,
                     json.dumps({ARCHS: "9.0 10.0"}))
    assert advice.startswith("torch-arch would set TORCH_CUDA_ARCH_LIST=8.0 on node a100")
    # unset is PyTorch's default: no advice for it
    assert _advice(fabric, _decision_json("8.0"), "a100", p2p, "{}") is None


def test_check_prints_every_nodes_arch_list_for_the_driver():
    reports = [NodeReport(f"{i:08x}" * 4, "10.0.0.1", True, None,
                          explain(MEGATRON_TP2, gpus, packs=["torch-arch"],
                                  node_env=env))
               for i, (gpus, env) in enumerate([("8.0", {}), ("9.0,10.0", {}),
                                                ("10.0", {ARCHS: "9.0 10.0"}), ("none", {})])]
    text = format_check(reports)
    assert "driver: export TORCH_CUDA_ARCH_LIST='8.0 9.0 10.0' where a driver-side check " \
           "wants it" in text
    assert "TORCH_CUDA_ARCH_LIST=8.0 [torch-arch: set, preferred, source policy]" in text
    # without the pack: no such line
    plain = [NodeReport("0" * 32, "10.0.0.1", True, "1", explain(MEGATRON_TP2, "8.0"))]
    assert "driver:" not in format_check(plain)


def test_a_decision_with_both_packs_round_trips_through_json():
    decision = explain(MEGATRON_TP2, node=L40S_OLD, packs=["nccl-host-mem", "torch-arch"],
                       node_env={ARCHS: "9.0 10.0"})
    again = Decision.from_json(decision.to_json())
    assert again.variables[HOST].value == "0" and again.variables[ARCHS].value == "8.9"
    assert again.packs[ARCHS]["rule"] == "misses-node-arch"
