"""packs/nccl_host_mem.py: the nccl-host-mem pack's golden table, explain
--node-env, check's advice and the record (with torch-arch beside it). The
peer-access facts it reads: tests/unit/probe/test_fake.py (the fake node)
and tests/unit/probe/test_nvml.py (NVML).

Expected values are written by hand from the sources docs/packs.md cites:
NCCL src/misc/cudawrap.cc (CUMEM_HOST_ENABLE -1: on where the driver is
12.6+; ncclCuMemEnable(): 0, or negative but not -2, is off),
src/transport/shm.cc (the cuMem host path only when both are on),
docs/.../runtime_and_mpi_issues.rst (fails without P2P before driver 13.0),
src/graph/paths.cc and shm.cc (P2P_DISABLE / SHM_DISABLE == 1).
"""

import json

import pytest

from configs import MEGATRON_YAML
from ray_megatron_env.check import _advice
from ray_megatron_env.cli import OK, main
from ray_megatron_env.record import Decision
from ray_megatron_env.explanation import explain, explain_node
from ray_megatron_env.node import NodeFabric
from ray_megatron_env.probe.fake import parse_fake_node

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


# --- with torch-arch, explain's CLI ----------------------------------------

def test_explain_node_env_is_what_a_worker_inherits_for_any_pack(capsys):
    code = main(["explain", str(MEGATRON_YAML), "--packs", "torch-arch,nccl-host-mem",
                 "--node", L40S_OLD, "--node-env", "TORCH_CUDA_ARCH_LIST=9.0 10.0",
                 "--node-env", f"{HOST}=1", "--json"])
    assert code == OK
    out = json.loads(capsys.readouterr().out)
    assert out["env"][ARCHS] == "8.9" and out["env"][HOST] == "0"
    assert out["variables"][ARCHS]["node_value"] == "9.0 10.0"
    assert out["variables"][HOST]["node_value"] == "1"


def test_compact_form_and_build_runtime_env_take_both_packs():
    from ray_megatron_env import build_runtime_env
    from ray_megatron_env.frameworks import parse_field

    env = build_runtime_env(MEGATRON_TP2, packs=["torch-arch", "nccl-host-mem"])
    assert env["megatron_env"]["packs"] == ["nccl-host-mem", "torch-arch"]
    assert parse_field({**MEGATRON_TP2, "packs": ["torch-arch"]}).packs == ("torch-arch",)


# --- check's advice, the record -------------------------------------------

def _decision_json(gpus):
    return explain(MEGATRON_TP2, gpus).to_json()


def test_check_names_nccl_host_mem_on_an_l40s_node_with_an_old_driver():
    fabric = NodeFabric((), "absent", "fake").to_dict()
    p2p = parse_fake_node(L40S_OLD).p2p.to_dict()
    advice = _advice(json.dumps({"fabric": fabric, "p2p": p2p}), _decision_json(L40S_8), "l40s",
                     "{}")
    assert advice.startswith("nccl-host-mem would set NCCL_CUMEM_HOST_ENABLE=0 on node l40s: "
                             "8 NVIDIA GPU(s), no peer access")
    assert "packs=['nccl-host-mem']" in advice and "torch-arch" not in advice
    # driver 13.0: nothing to advise
    p2p_new = parse_fake_node(L40S_NEW).p2p.to_dict()
    assert _advice(json.dumps({"fabric": fabric, "p2p": p2p_new}), _decision_json(L40S_8),
                   "l40s", "{}") is None


def test_a_decision_with_both_packs_round_trips_through_json():
    decision = explain(MEGATRON_TP2, node=L40S_OLD, packs=["nccl-host-mem", "torch-arch"],
                       node_env={ARCHS: "9.0 10.0"})
    again = Decision.from_json(decision.to_json())
    assert again.variables[HOST].value == "0" and again.variables[ARCHS].value == "8.9"
    assert again.packs[ARCHS]["rule"] == "misses-node-arch"
