"""Topical: issue 37 (rule truth, round six), the nccl-host-mem, nccl-fabric and
torch-arch rows against their sources. Every expected value is written by
hand from the source named beside it, never computed by the code under test:

* NVIDIA-NeMo/RL 7ea279ab: nemo_rl/models/policy/workers/
  dtensor_policy_worker.py, models/megatron/setup.py and
  models/automodel/setup.py set os.environ["NCCL_CUMEM_ENABLE"] = "1" where
  generation is not colocated, whatever the job sent.
* NCCL 2.30.7 src/transport/shm.cc: the cuMem host path only if
  ncclCuMemEnable() && ncclCuMemHostEnable().
* NCCL 2.30.7 src/graph/paths.cc ncclGetLevel: NCCL_P2P_DISABLE read with
  ``int disable = strtol(str, NULL, 0)``, 1 gives PATH_LOC; otherwise
  NCCL_P2P_LEVEL: strcmp against "LOC", "NVL", ... "SYS" (PATH_LOC = 0),
  else, if str[0] is a digit, ``int oldLevel = strtol(str, NULL, 0)``
  through levelsOldToNew = {PATH_LOC, PATH_PIX, PATH_PXB, PATH_PHB,
  PATH_SYS, PATH_SYS}; src/init.cc skips ncclMnnvlCheck where p2pLevel == 0
  unless MNNVL_ENABLE == 1; ncclTopoCheckP2p allows P2P only where the path
  type <= the level (two GPUs are at least NVL, 1).
* PyTorch torch/utils/cpp_extension.py _get_cuda_arch_flags, read in the
  2.7.0, 2.8.0, 2.9.0 ... 2.13.0, 2.14.0, 2.14.1 and 2.15.0 wheels: 2.14.0,
  2.14.1 and 2.15.0 add '10.7', '10.7a' and ('Rubin', '10.7+PTX'); 2.7 and
  2.8 test only ``if not _arch_list``, so 'native' is split and rejected.
* GB10 (12.1): NVIDIA/cuvs PR #2568 (an sm_120 cubin rejected on 12.1),
  slime docker/Dockerfile.gb10 (TORCH_CUDA_ARCH_LIST="12.0+PTX").
"""

import json

import pytest

from configs import MEGATRON_YAML
from ray_megatron_env.cli import OK, main
from ray_megatron_env.doc_tables import markdown_table
from ray_megatron_env.explanation import explain_node
from ray_megatron_env.packs import get_pack
from ray_megatron_env.packs.pack import canonical

HOST, CUMEM = "NCCL_CUMEM_HOST_ENABLE", "NCCL_CUMEM_ENABLE"
P2P_OFF, LEVEL, SHM_OFF = "NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL", "NCCL_SHM_DISABLE"
ARCHS = "TORCH_CUDA_ARCH_LIST"
MEGATRON_TP2 = {"engines": {"actor": {"strategy": "megatron", "tensor_parallel": 2}}}

# The Done-when node: four Ada GPUs, no peer access, a 570 kernel driver.
L4_570 = json.dumps({"gpus": "8.9,8.9,8.9,8.9", "p2p": "none", "kernel_driver": "570.172.08"})
L4_580 = json.dumps({"gpus": "8.9,8.9,8.9,8.9", "p2p": "none", "kernel_driver": "580.65.06"})
HGX_H100 = json.dumps({"gpus": "9.0,9.0,9.0,9.0,9.0,9.0,9.0,9.0", "p2p": "all",
                       "kernel_driver": "570.172.08"})
GB200_IMEX = json.dumps({"gpus": "10.0,10.0,10.0,10.0", "imex_channel": "writable",
                         "imex_status": "ready",
                         "fabric": {"state": "completed", "status": "success",
                                    "cluster_uuid": "3f4e0c1a-9b2d-4c1e-8f00-5a6b7c8d9e01",
                                    "clique_id": 1, "health": "ok"}})

# supported_arches, copied from each wheel's cpp_extension.py.
TORCH_2_7 = {"3.5", "3.7", "5.0", "5.2", "5.3", "6.0", "6.1", "6.2", "7.0", "7.2", "7.5", "8.0",
             "8.6", "8.7", "8.9", "9.0", "9.0a", "10.0", "10.0a", "10.1", "10.1a", "12.0",
             "12.0a"}
TORCH_2_8 = TORCH_2_7 | {"10.3", "10.3a", "12.1", "12.1a"}
TORCH_2_9_TO_2_13 = (TORCH_2_8 - {"10.1", "10.1a"}) | {"11.0", "11.0a"}
TORCH_2_14_TO_2_15 = TORCH_2_9_TO_2_13 | {"10.7", "10.7a"}
EVERY_RELEASE = (TORCH_2_7, TORCH_2_8, TORCH_2_9_TO_2_13, TORCH_2_14_TO_2_15)


def nccl_env(result):
    return {k: v for k, v in result.env().items() if k.startswith("NCCL_")}


# --- 1. nccl-host-mem: a job's cuMem off is no guarantee ---------------------------

# node, job env, node env -> written, the record's (value, source, rule), a
# NCCL_CUMEM_HOST_ENABLE warning, satisfied
@pytest.mark.parametrize("node,job,inherited,written,host,warns,satisfied", [
    # the Done-when row: cuMem off in the job, 0 written all the same
    (L4_570, {CUMEM: "0"}, {}, {HOST: "0"}, ("0", "policy", "cumem-off"), False, True),
    (L4_570, {CUMEM: "-1"}, {}, {HOST: "0"}, ("0", "policy", "cumem-off"), False, True),
    (L4_570, {}, {CUMEM: "0"}, {HOST: "0"}, ("0", "policy", "cumem-off"), False, True),
    # strtoll: 0x0 is 0, off too
    (L4_570, {CUMEM: "0x0"}, {}, {HOST: "0"}, ("0", "policy", "cumem-off"), False, True),
    # -2 (auto) and 1: cuMem on, the required row
    (L4_570, {CUMEM: "-2"}, {}, {HOST: "0"}, ("0", "policy", "no-p2p-old-driver"), False, True),
    # the job's own 1 beside its cuMem off: kept; it breaks only a preferred
    # rule (inert unless something turns cuMem back on)
    (L4_570, {CUMEM: "0", HOST: "1"}, {}, {}, ("1", "explicit", "cumem-off"), True, True),
    # an image's 1 there: replaced
    (L4_570, {CUMEM: "0"}, {HOST: "1"}, {HOST: "0"}, ("0", "policy", "cumem-off"), False, True),
    # a 580.65.06 kernel driver: nothing, cuMem off or not
    (L4_580, {CUMEM: "0"}, {}, {}, (None, "none", "leave-to-nccl"), False, True),
])
def test_cumem_off_still_writes_the_host_switch_off(node, job, inherited, written, host, warns,
                                                    satisfied):
    result = explain_node(MEGATRON_TP2, node=node, packs=["nccl-host-mem"], job_env=job,
                          node_env=inherited)
    assert nccl_env(result) == written
    entry = result.decision.variables[HOST]
    assert (entry.value, entry.source, entry.rule) == host
    assert any(HOST in w for w in result.decision.warnings) == warns
    assert result.decision.satisfied == satisfied


def test_the_cumem_off_reason_names_nemo_rl():
    result = explain_node(MEGATRON_TP2, node=L4_570, packs=["nccl-host-mem"],
                          job_env={CUMEM: "0"})
    reason = result.decision.variables[HOST].reason
    assert "NCCL_CUMEM_ENABLE=0" in reason and "NeMo-RL" in reason and "[cumem-off]" in reason


def test_done_when_explain_writes_0_under_the_jobs_cumem_off(capsys):
    assert main(["explain", str(MEGATRON_YAML), "--packs", "nccl-host-mem", "--node", L4_570,
                 "--job-env", "NCCL_CUMEM_ENABLE=0", "--json"]) == OK
    out = json.loads(capsys.readouterr().out)
    assert out["env"][HOST] == "0"
    assert out["variables"][HOST]["rule"] == "cumem-off"


# --- 6. NCCL_P2P_LEVEL=LOC: P2P level 0 (its reading: test_nccl_p2p.py) ---------

@pytest.mark.parametrize("job,inherited,warns", [
    ({LEVEL: "LOC"}, {}, True),          # the Done-when row
    ({LEVEL: "0"}, {}, True),
    ({}, {LEVEL: "LOC"}, True),          # an image's value: the same
    ({LEVEL: "LOC", "NCCL_MNNVL_ENABLE": "1"}, {}, False),  # forces the check
    ({LEVEL: "NVL"}, {}, False),
    ({LEVEL: "LOC", P2P_OFF: "0"}, {}, True),
])
def test_p2p_level_loc_on_a_fabric_node_warns_that_mnnvl_is_off(job, inherited, warns):
    result = explain_node(MEGATRON_TP2, node=GB200_IMEX, packs=["nccl-fabric"], job_env=job,
                          node_env=inherited)
    found = [w for w in result.decision.warnings if "p2p-off-disables-mnnvl" in w]
    assert bool(found) == warns
    if warns:
        assert f"{LEVEL}=" in found[0] and "multi-node NVLink off" in found[0]
    assert "NCCL_MNNVL_ENABLE" not in result.env()
    assert result.decision.satisfied


def test_p2p_disable_still_warns_and_is_named_before_the_level():
    result = explain_node(MEGATRON_TP2, node=GB200_IMEX, packs=["nccl-fabric"],
                          job_env={P2P_OFF: "1", LEVEL: "LOC"})
    [warning] = [w for w in result.decision.warnings if "p2p-off-disables-mnnvl" in w]
    assert "NCCL_P2P_DISABLE=1" in warning and LEVEL not in warning


# job env -> (variable, rule) of each P2P-transport outcome on an all-P2P node
@pytest.mark.parametrize("job,rules", [
    ({LEVEL: "LOC"}, {P2P_OFF: "leave-to-nccl", LEVEL: "p2p-transports-off-on-p2p-node",
                      SHM_OFF: "leave-to-nccl"}),
    ({LEVEL: "0x0"}, {P2P_OFF: "leave-to-nccl", LEVEL: "p2p-transports-off-on-p2p-node",
                      SHM_OFF: "leave-to-nccl"}),
    # P2P_DISABLE=1 wins: NCCL never reads the level then
    ({P2P_OFF: "1", LEVEL: "LOC"}, {P2P_OFF: "p2p-transports-off-on-p2p-node",
                                    LEVEL: "leave-to-nccl", SHM_OFF: "leave-to-nccl"}),
    ({LEVEL: "PXB"}, {P2P_OFF: "leave-to-nccl", LEVEL: "leave-to-nccl",
                      SHM_OFF: "leave-to-nccl"}),
])
def test_p2p_level_loc_on_an_all_p2p_node_is_kept_with_a_warning(job, rules):
    result = explain_node(MEGATRON_TP2, node=HGX_H100, packs=["nccl-host-mem"], job_env=job)
    variables = result.decision.variables
    assert {v: variables[v].rule for v in rules} == rules
    assert nccl_env(result) == {}
    warned = {v for v in rules
              if any(f"{v}=" in w and "p2p-transports-off-on-p2p-node" in w
                     for w in result.decision.warnings)}
    assert warned == {v for v, rule in rules.items() if rule != "leave-to-nccl"}
    assert result.decision.satisfied


def test_p2p_level_keeps_its_spelling():
    # a path name, compared with strcmp: never read as a number
    assert canonical("LOC", LEVEL) == "LOC" and canonical("PIX", LEVEL) == "PIX"
    assert canonical("0x1", P2P_OFF) == "1"


# --- 7. nccl.conf and the releases read, per NCCL row -------------------------------

@pytest.mark.parametrize("pack", ["nccl-host-mem", "nccl-fabric"])
def test_every_nccl_row_says_what_nccl_conf_means_and_which_releases_it_read(pack):
    for row in get_pack(pack).rows:
        assert row.conf, row.id
        assert "2.30.7" in row.source and "2.32.3" in row.source, row.id
    assert "a node's nccl.conf" in markdown_table(get_pack(pack)).splitlines()[0]


def test_torch_arch_has_no_nccl_conf_column():
    assert "nccl.conf" not in markdown_table(get_pack("torch-arch"))


# --- 2 to 5. torch-arch through PyTorch 2.15 -----------------------------------------

# GPUs -> the value written, rule
@pytest.mark.parametrize("gpus,value,rule", [
    ("9.0", "9.0", "unset"),
    ("12.0", "12.0", "unset"),
    # GB10: 12.1 is not in 2.7: 12.0 with PTX (the Done-when row)
    ("12.1", "12.0+PTX", "unset"),
    # Rubin (10.7) is not in 2.7 to 2.13; B300 (10.3) not in 2.7
    ("10.7", "10.0+PTX", "unset"),
    ("10.3", "10.0+PTX", "unset"),
    # Thor under CUDA 12 (10.1, gone from 2.9): what no-portable-arch's row says
    ("10.1", "10.0+PTX", "unset"),
    # one entry per arch, +PTX where any GPU needs it
    ("10.0,10.3", "10.0+PTX", "unset"),
    ("8.6,12.1", "8.6 12.0+PTX", "unset"),
    # Thor under CUDA 13 (11.0, not in 2.7 and 2.8; no other 11.x entry)
    ("11.0", None, "no-portable-arch"),
])
def test_what_the_pack_writes_every_release_accepts(gpus, value, rule):
    result = explain_node(MEGATRON_TP2, gpus, packs=["torch-arch"])
    assert (result.env().get(ARCHS), result.decision.variables[ARCHS].rule) == (value, rule)
    for entry in (value or "").split():
        for release in EVERY_RELEASE:
            assert entry.removesuffix("+PTX") in release


def test_the_no_portable_arch_row_says_what_the_code_does():
    row = get_pack("torch-arch").row("no-portable-arch")
    assert "11.0" in row.when and "10.1 and gets 10.0+PTX" in row.when


# GPUs, job value, node value -> value, source, rule, written, older-torch
# warning (the releases it names), satisfied
@pytest.mark.parametrize("gpus,job,inherited,value,source,rule,written,older,satisfied", [
    # the Done-when rows
    ("10.7", "10.7", None, "10.7", "explicit", "covers-node-archs", False, "2.7 to 2.13", True),
    ("10.0", "10.0 10.7", None, "10.0 10.7", "explicit", "covers-node-archs", False,
     "2.7 to 2.13", True),
    ("10.7", None, "Rubin", "Rubin", "node", "covers-node-archs", False, "2.7 to 2.13", True),
    ("9.0", "native", None, "native", "explicit", "unset", False, "2.7 to 2.8", True),
    # an inherited 'native' is replaced: no such warning
    ("9.0", None, "native", "9.0", "policy", "unset", True, None, True),
    # 10.7a: its own arch-specific SASS
    ("10.7", None, "10.7a", "10.7a", "node", "covers-node-archs", False, "2.7 to 2.13", True),
    # Rubin is 10.7+PTX: no code a 10.0 GPU runs; an image's is replaced
    ("10.0", None, "Rubin", "10.0", "policy", "misses-node-arch", True, None, True),
    # GB10's own 12.1 is accepted from 2.8
    ("12.1", "12.1", None, "12.1", "explicit", "covers-node-archs", False, "2.7", True),
    # the pack's own entry; and the older minor's SASS alone, kept with a warning
    ("12.1", None, "12.0+PTX", "12.0+PTX", "node", "covers-node-archs", False, None, True),
    ("12.1", None, "12.0", "12.0", "node", "covers-only-through-ptx", False, None, True),
    # Blackwell on a Rubin GPU: 10.0 and 10.3 SASS, no PTX of major 10
    ("10.7", None, "Blackwell", "Blackwell", "node", "covers-only-through-ptx", False, None,
     True),
    # 10.1 is rejected by 2.9 to 2.15 themselves: still misses-node-arch
    ("10.0", None, "10.0 10.1", "10.0", "policy", "misses-node-arch", True, None, True),
])
def test_values_are_read_as_2_15_reads_them(gpus, job, inherited, value, source, rule, written,
                                            older, satisfied):
    result = explain_node(MEGATRON_TP2, gpus, packs=["torch-arch"],
                          job_env={ARCHS: job} if job is not None else None,
                          node_env={ARCHS: inherited} if inherited is not None else None)
    entry = result.decision.variables[ARCHS]
    assert (entry.value, entry.source, entry.rule) == (value, source, rule)
    assert (ARCHS in result.env()) == written
    found = [w for w in result.decision.warnings if "[older-torch-rejects]" in w]
    if older is None:
        assert found == []
    else:
        [warning] = found
        assert f"PyTorch {older} reject" in warning
    assert result.decision.satisfied == satisfied


def test_a_jobs_10_7_on_rubin_is_not_said_to_have_no_code():
    result = explain_node(MEGATRON_TP2, "10.7", packs=["torch-arch"], job_env={ARCHS: "10.7"})
    text = " ".join(result.decision.warnings) + result.decision.variables[ARCHS].reason
    assert "no code for" not in text and "breaks a required rule" not in text


def test_a_value_older_releases_reject_twice_names_each_run():
    # 10.7a: 2.7 to 2.13 reject it; 11.0: 2.7 and 2.8 (on a 10.7 GPU that
    # 10.7a serves)
    result = explain_node(MEGATRON_TP2, "10.7", packs=["torch-arch"],
                          job_env={ARCHS: "10.7a 11.0"})
    [warning] = [w for w in result.decision.warnings if "[older-torch-rejects]" in w]
    assert "PyTorch 2.7 to 2.8 reject '10.7a', '11.0'; PyTorch 2.9 to 2.13 reject '10.7a'" \
        in warning


def test_done_when_explain_keeps_a_jobs_10_7(capsys):
    assert main(["explain", str(MEGATRON_YAML), "--gpus", "10.7", "--packs", "torch-arch",
                 "--job-env", "TORCH_CUDA_ARCH_LIST=10.7", "--json"]) == OK
    out = json.loads(capsys.readouterr().out)
    assert out["variables"][ARCHS]["value"] == "10.7" and out["satisfied"] is True
