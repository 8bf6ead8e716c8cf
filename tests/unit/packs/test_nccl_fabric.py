"""Rule packs: the nccl-fabric pack's rows on golden nodes, its precedence,
the record, explain's env/removed, and what stays the same without packs.

Expected values are written from NCCL's source (docs/packs.md cites each
row): src/mnnvl.cc, src/init.cc, src/transport/nvls.cc, src/misc/cudawrap.cc.
"""

import json
import logging

import pytest

from configs import MEGATRON_YAML
from ray_megatron_env import build_runtime_env
from ray_megatron_env.agent import NodeAgent
from ray_megatron_env.cli import OK, PROBLEM, main
from ray_megatron_env.decision import decide_node
from ray_megatron_env.names import CONNECTIONS_VARIABLE, DECISION_VARIABLE, PACK_NAMES
from ray_megatron_env.errors import FieldValueError
from ray_megatron_env.explanation import explain, explain_node
from ray_megatron_env.frameworks import parse_field
from ray_megatron_env.node import NodeFacts, NodeGpus
from ray_megatron_env.probe.fake import parse_fake_node
from ray_megatron_env.spec import read_packs
from ray_megatron_env.cache import ProbeCache

MNNVL, NVLS, CUMEM = "NCCL_MNNVL_ENABLE", "NCCL_NVLS_ENABLE", "NCCL_CUMEM_ENABLE"
CLUSTER_UUID = "3f4e0c1a-9b2d-4c1e-8f00-5a6b7c8d9e01"
GB200 = {"gpus": "10.0,10.0,10.0,10.0",
         "fabric": {"state": "completed", "status": "success", "cluster_uuid": CLUSTER_UUID,
                    "clique_id": 32766, "health": "ok"}}
GB200_NO_IMEX = json.dumps({**GB200, "imex_channel": "absent"})
GB200_LOCKED_IMEX = json.dumps({**GB200, "imex_channel": "unwritable"})
GB200_IMEX = json.dumps({**GB200, "imex_channel": "writable"})
GB200_IMEX_READY = json.dumps({**GB200, "imex_channel": "writable", "imex_status": "ready"})
GB200_IMEX_DOWN = json.dumps({**GB200, "imex_channel": "writable", "imex_status": "not-ready"})
# COMPLETED with an error status: NCCL's check (src/mnnvl.cc) reads only the
# state and the UUID, so it takes the MNNVL path.
_FAILED = {**GB200["fabric"], "status": "NVML error 999"}
GB200_FAILED_IMEX = json.dumps({**GB200, "fabric": _FAILED, "imex_channel": "writable"})
GB200_FAILED_NO_IMEX = json.dumps({**GB200, "fabric": _FAILED, "imex_channel": "absent"})
GB200_DEGRADED = json.dumps({**GB200, "imex_channel": "writable",
                             "fabric": {**GB200["fabric"], "health": "degraded"}})
# NVIDIA/nccl#2186's mask: under NVML's layout every field reads 2 (false).
GB200_MASK_2186 = json.dumps({**GB200, "imex_channel": "writable",
                              "fabric": {**GB200["fabric"], "health": None,
                                         "health_mask": 0xAA}})
# DEGRADED_BW false (2), INCORRECT_CONFIGURATION no_partition (4 << 8).
GB200_NO_PARTITION = json.dumps({**GB200, "imex_channel": "writable",
                                 "fabric": {**GB200["fabric"], "health": None,
                                            "health_mask": 0x402}})
GB200_FABRIC_STARTING = json.dumps({"gpus": "10.0", "fabric": {"state": "in_progress"},
                                    "imex_channel": "absent"})
# HGX H100: NVSwitch GPUs report a fabric state with an all-zero cluster UUID.
HGX_NOT_READY = json.dumps({"gpus": "9.0,9.0", "fabric": {"state": "not_started"}})
HGX_READY = json.dumps({"gpus": "9.0,9.0",
                        "fabric": {"state": "completed", "cluster_uuid":
                                   "00000000-0000-0000-0000-000000000000", "clique_id": 0}})
HGX_A100_NOT_READY = json.dumps({"gpus": "8.0", "fabric": {"state": "not_started"}})
L40S = json.dumps({"gpus": "8.9"})
CPU = json.dumps({"gpus": "none"})

MEGATRON_TP2 = {"engines": {"actor": {"strategy": "megatron", "tensor_parallel": 2}}}
TRTLLM_ROLLOUT = {"engines": {"actor": {"strategy": "megatron", "tensor_parallel": 2},
                              "rollout": {"strategy": "trtllm"}}}
# TP=8 on a 4-GPU GB200 tray spans trays; TP=4 fits in one.
TRTLLM_TP8 = {"engines": {"actor": {"strategy": "megatron", "tensor_parallel": 2},
                          "rollout": {"strategy": "trtllm", "tensor_parallel": 8}}}
TRTLLM_TP4 = {"engines": {"actor": {"strategy": "megatron", "tensor_parallel": 2},
                          "rollout": {"strategy": "trtllm", "tensor_parallel": 4}}}
VLLM_ROLLOUT = {"engines": {"actor": {"strategy": "megatron", "tensor_parallel": 2},
                            "rollout": {"strategy": "vllm"}}}
LEAVE = "leave-to-nccl"


def nccl(env):
    return {k: v for k, v in env.items() if k.startswith("NCCL_")}


# Golden table: node, job env_vars, config, tp_spans_nodes -> NCCL variables
# written, variables removed, the rule deciding each, whether a warning says so.
@pytest.mark.parametrize("node,job_env,config,spans,written,removed,rules,warns", [
    # fabric-attached without a usable IMEX channel: mnnvl.cc fails init; MNNVL
    # off only (NVLS then uses POSIX handles per host: nvls.cc, cudawrap.cc)
    (GB200_NO_IMEX, {}, MEGATRON_TP2, (), {MNNVL: "0"}, [],
     {MNNVL: "fabric-without-imex", NVLS: LEAVE, CUMEM: LEAVE}, False),
    (GB200_LOCKED_IMEX, {}, MEGATRON_TP2, (), {MNNVL: "0"}, [],
     {MNNVL: "fabric-without-imex", NVLS: LEAVE}, False),
    # COMPLETED with another status and no channel: NCCL still takes MNNVL
    (GB200_FAILED_NO_IMEX, {}, MEGATRON_TP2, (), {MNNVL: "0", NVLS: "0"}, [],
     {MNNVL: "fabric-without-imex", NVLS: "nvswitch-fabric-not-ready"}, False),
    # ... and with a channel: the registration failed
    (GB200_FAILED_IMEX, {}, MEGATRON_TP2, (), {MNNVL: "0", NVLS: "0"}, [],
     {MNNVL: "fabric-registration-failed", NVLS: "nvswitch-fabric-not-ready"}, False),
    # a channel, but the IMEX domain is down: the export/import check fails
    (GB200_IMEX_DOWN, {}, MEGATRON_TP2, (), {MNNVL: "0"}, [],
     {MNNVL: "fabric-imex-not-ready", NVLS: LEAVE}, False),
    # the same tray with its channel, IMEX ready or unknown: NCCL's default is right
    (GB200_IMEX_READY, {}, MEGATRON_TP2, (), {}, [],
     {MNNVL: LEAVE, NVLS: LEAVE, CUMEM: LEAVE}, False),
    (GB200_IMEX, {}, MEGATRON_TP2, (), {}, [],
     {MNNVL: LEAVE, NVLS: LEAVE, CUMEM: LEAVE}, False),
    # NVSwitch fabric not registered, Hopper and later: NVLS off only
    (HGX_NOT_READY, {}, MEGATRON_TP2, (), {NVLS: "0"}, [],
     {MNNVL: LEAVE, NVLS: "nvswitch-fabric-not-ready"}, False),
    (GB200_FABRIC_STARTING, {}, MEGATRON_TP2, (), {NVLS: "0"}, [],
     {NVLS: "nvswitch-fabric-not-ready"}, False),
    # A100 has no NVLS multicast: nothing
    (HGX_A100_NOT_READY, {}, MEGATRON_TP2, (), {}, [], {NVLS: LEAVE}, False),
    (HGX_READY, {}, MEGATRON_TP2, (), {}, [], {NVLS: LEAVE}, False),
    # PCIe: the job's own NVLS=1 stays, nothing written
    (L40S, {NVLS: "1"}, MEGATRON_TP2, (), {}, [], {NVLS: LEAVE}, False),
    (CPU, {}, MEGATRON_TP2, (), {}, [], {MNNVL: LEAVE}, False),
    # cuMem off under a TRT-LLM rollout with TP across nodes: kept, with a warning
    (GB200_IMEX, {CUMEM: "0"}, TRTLLM_ROLLOUT, ("rollout",), {}, [],
     {CUMEM: "cumem-off-under-trtllm-multinode-tp"}, True),
    # ... derived from TP=8 on a 4-GPU tray; -1 is off as 0 is (cudawrap.cc)
    (GB200_IMEX, {CUMEM: "-1"}, TRTLLM_TP8, (), {}, [],
     {CUMEM: "cumem-off-under-trtllm-multinode-tp"}, True),
    # ... TRT-LLM within a node, or another engine: kept, with the other warning
    (GB200_IMEX, {CUMEM: "-1"}, TRTLLM_TP4, (), {}, [],
     {CUMEM: "cumem-off-disables-mnnvl"}, True),
    (GB200_IMEX, {CUMEM: "0"}, TRTLLM_ROLLOUT, (), {}, [],
     {CUMEM: "cumem-off-disables-mnnvl"}, True),
    (GB200_IMEX, {CUMEM: "0"}, VLLM_ROLLOUT, ("rollout",), {}, [],
     {CUMEM: "cumem-off-disables-mnnvl"}, True),
    # -2 is auto and 1 is on: nothing to say
    (GB200_IMEX, {CUMEM: "-2"}, TRTLLM_TP8, (), {}, [], {CUMEM: LEAVE}, False),
    (GB200_IMEX, {CUMEM: "1"}, TRTLLM_TP8, (), {}, [], {CUMEM: LEAVE}, False),
    # cuMem off without IMEX: MNNVL is off anyway, the 0 is the job's
    (GB200_NO_IMEX, {CUMEM: "0"}, TRTLLM_ROLLOUT, ("rollout",), {MNNVL: "0"}, [],
     {CUMEM: LEAVE}, False),
    # fabric health: a warning, nothing set; #2186's 0xaa is healthy
    (GB200_DEGRADED, {}, MEGATRON_TP2, (), {}, [], {MNNVL: LEAVE}, True),
    (GB200_NO_PARTITION, {}, MEGATRON_TP2, (), {}, [], {MNNVL: LEAVE}, True),
    (GB200_MASK_2186, {}, MEGATRON_TP2, (), {}, [], {MNNVL: LEAVE}, False),
])
def test_nccl_fabric_rows(node, job_env, config, spans, written, removed, rules, warns):
    result = explain_node(config, node=node, packs=["nccl-fabric"], job_env=job_env,
                          tp_spans_nodes=spans)
    assert nccl(result.env()) == written
    assert list(result.remove) == removed
    records = result.decision.packs
    assert {v: records[v]["rule"] for v in rules} == rules
    assert all(records[v]["pack"] == "nccl-fabric" for v in (MNNVL, NVLS, CUMEM))
    assert any("nccl-fabric" in w for w in result.decision.warnings) == warns
    assert result.decision.satisfied


def test_a_trtllm_cumem_0_is_kept_and_the_warning_names_it_and_both_sources():
    result = explain_node(TRTLLM_TP8, node=GB200_IMEX, packs=["nccl-fabric"],
                          job_env={CUMEM: "0"})
    assert CUMEM not in result.remove and CUMEM not in result.write
    assert result.decision.packs[CUMEM]["value"] == "0"
    assert result.decision.packs[CUMEM]["source"] == "explicit"
    warning, = [w for w in result.decision.warnings
                if "cumem-off-under-trtllm-multinode-tp" in w]
    for words in ("NCCL_CUMEM_ENABLE=0", "rollout (TP=8 on a 4-GPU node)", "#5693",
                  "#6086", "#7564", "platform_cuda.py"):
        assert words in warning, words


def test_the_health_warning_names_each_problem_nvml_reports():
    result = explain_node(MEGATRON_TP2, node=GB200_NO_PARTITION, packs=["nccl-fabric"])
    warning, = [w for w in result.decision.warnings if "fabric-health" in w]
    assert "incorrect_configuration=no_partition" in warning
    assert "degraded_bw" not in warning  # 2: false


def test_the_megatron_value_and_the_nccl_values_come_together():
    result = explain_node(MEGATRON_TP2, node=HGX_NOT_READY, packs=["nccl-fabric"])
    assert result.env() == {"CUDA_DEVICE_MAX_CONNECTIONS": "1", NVLS: "0"}


def test_an_explicit_value_a_required_row_disagrees_with_is_kept_with_a_warning():
    result = explain_node(MEGATRON_TP2, node=GB200_NO_IMEX, packs=["nccl-fabric"],
                          job_env={MNNVL: "1"})
    assert nccl(result.env()) == {}
    entry = result.decision.packs[MNNVL]
    assert (entry["value"], entry["source"], entry["strength"]) == ("1", "explicit", "required")
    assert any(f"explicit {MNNVL}=1 breaks a required rule of the nccl-fabric pack (asks 0) "
               "[fabric-without-imex;" in w for w in result.decision.warnings)
    assert not result.decision.satisfied  # check and explain report it as a problem


def test_an_inherited_value_a_row_disagrees_with_is_replaced():
    spec = parse_field({**MEGATRON_TP2, "packs": ["nccl-fabric"]})
    facts = NodeFacts(NodeGpus.known([(9, 0), (9, 0)], "fake"), parse_fake_node(HGX_NOT_READY).fabric)
    result = decide_node(spec, facts, {}, {NVLS: "1"})
    assert result.write[NVLS] == "0"
    assert result.decision.packs[NVLS]["source"] == "policy"


def test_an_inherited_cumem_off_is_kept_and_warned_about():
    spec = parse_field({**TRTLLM_TP8, "packs": ["nccl-fabric"]})
    facts = NodeFacts(NodeGpus.known([(10, 0)] * 4, "fake"), parse_fake_node(GB200_IMEX)[1])
    result = decide_node(spec, facts, {}, {CUMEM: "-1"})
    assert CUMEM not in result.remove and CUMEM not in result.write
    assert result.decision.packs[CUMEM]["source"] == "node"
    assert any("NCCL_CUMEM_ENABLE=-1" in w and "#5693" in w for w in result.decision.warnings)


def test_without_packs_the_decision_and_its_record_are_what_they_were():
    spec = parse_field(MEGATRON_TP2)
    gpus = NodeGpus.known([(9, 0)], "given")
    after = decide_node(spec, NodeFacts(gpus), {}, {})
    record = json.loads(after.write[DECISION_VARIABLE])
    assert "packs" not in record and list(record["variables"]) == [CONNECTIONS_VARIABLE]
    assert after.env() == {CONNECTIONS_VARIABLE: "1"}
    assert explain(MEGATRON_TP2, "9.0") == after.decision


def test_the_record_has_one_entry_per_pack_variable():
    result = explain_node(MEGATRON_TP2, node=GB200_NO_IMEX, packs=["nccl-fabric"])
    record = json.loads(result.write[DECISION_VARIABLE])
    assert sorted(record["packs"]) == [CUMEM, MNNVL, NVLS]
    assert set(record["packs"][MNNVL]) == {"pack", "action", "value", "source", "strength",
                                           "rule", "reason"}
    assert record["packs"][MNNVL]["action"] == "set"
    assert record["value"] is None  # CUDA_DEVICE_MAX_CONNECTIONS on Blackwell: unchanged keys


def test_pack_names_are_checked_with_the_known_ones_listed():
    assert PACK_NAMES == ("cuda-connections", "nccl-fabric", "nccl-host-mem", "torch-arch",
                          "te-fp8-scales", "fla-backend", "net-ifaces")
    assert read_packs(["nccl-fabric", "cuda-connections", "nccl-fabric"]) == ("nccl-fabric",)
    with pytest.raises(FieldValueError, match="known packs: cuda-connections, nccl-fabric, "
                                              "nccl-host-mem, torch-arch, te-fp8-scales, "
                                              "fla-backend, net-ifaces"):
        build_runtime_env(MEGATRON_TP2, packs=["nccl-fabrik"])
    with pytest.raises(FieldValueError, match="packs names unknown"):
        parse_field({**MEGATRON_TP2, "packs": ["mnnvl"]})
    with pytest.raises(FieldValueError, match="tp_spans_nodes names role"):
        build_runtime_env(MEGATRON_TP2, packs=["nccl-fabric"], tp_spans_nodes=["rollout"])


def test_build_runtime_env_ships_the_packs_in_the_compact_form():
    env = build_runtime_env(MEGATRON_YAML, packs=["nccl-fabric"])
    assert env["megatron_env"]["packs"] == ["nccl-fabric"]
    assert parse_field(env["megatron_env"]).packs == ("nccl-fabric",)
    assert "packs" not in build_runtime_env(MEGATRON_YAML)["megatron_env"]


class _CountingFabric:
    def __init__(self):
        self.runs = 0

    def __call__(self):
        self.runs += 1
        return parse_fake_node(GB200_NO_IMEX)[1]


def test_the_agent_probes_the_fabric_only_for_jobs_that_ask():
    fabric = _CountingFabric()
    agent = NodeAgent(ProbeCache(lambda: NodeGpus.known([(10, 0)], "fake")),
                      {"fabric": ProbeCache(fabric)})
    env_vars = {}
    agent.decide_and_write({"megatron_env": MEGATRON_TP2}, env_vars, {}, logging.getLogger("t"))
    assert fabric.runs == 0 and nccl(env_vars) == {}
    env_vars = {}
    agent.decide_and_write({"megatron_env": {**MEGATRON_TP2, "packs": ["nccl-fabric"]}}, env_vars, {},
                logging.getLogger("t"))
    assert fabric.runs == 1 and nccl(env_vars) == {MNNVL: "0"}


def test_explain_json_has_env_and_removed(capsys):
    code = main(["explain", str(MEGATRON_YAML), "--node", GB200_NO_IMEX, "--packs",
                 "nccl-fabric", "--job-env", "NCCL_DEBUG=INFO", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == OK
    assert out["env"] == {MNNVL: "0"}
    assert out["removed"] == []
    assert out["packs"][MNNVL]["rule"] == "fabric-without-imex"
    assert out["packs"][NVLS]["rule"] == "leave-to-nccl"


def test_explain_text_lists_each_pack_variable_and_fails_on_a_broken_required_row(capsys):
    code = main(["explain", str(MEGATRON_YAML), "--node", HGX_NOT_READY, "--packs",
                 "nccl-fabric", "--job-env", f"{NVLS}=1"])
    out = capsys.readouterr().out
    assert code == PROBLEM
    assert f"{NVLS}=1 [nccl-fabric: set, required, source explicit]" in out


def test_explain_node_from_a_file_and_gpus_given_once(tmp_path, capsys):
    facts = tmp_path / "node.json"
    facts.write_text(json.dumps({"fabric": {"state": "not_started"}}))
    result = explain_node(MEGATRON_TP2, "9.0", node=str(facts), packs=["nccl-fabric"])
    assert nccl(result.env()) == {NVLS: "0"}
    with pytest.raises(FieldValueError, match="disagree"):
        explain_node(MEGATRON_TP2, "9.0", node=L40S, packs=["nccl-fabric"])
    with pytest.raises(FieldValueError, match="neither a JSON object nor a file"):
        explain_node(MEGATRON_TP2, node="nowhere.json")
    with pytest.raises(FieldValueError, match="fabric.state must be one of"):
        explain_node(MEGATRON_TP2, node='{"gpus": "9.0", "fabric": {"state": "done"}}')


def test_without_fabric_facts_the_pack_sets_nothing_and_says_why():
    result = explain_node(MEGATRON_TP2, "10.0", packs=["nccl-fabric"])
    assert nccl(result.env()) == {}
    assert any("could not be read" in w for w in result.decision.warnings)


def test_check_text_shows_each_pack_variable_and_the_advice():
    from ray_megatron_env.check import NodeReport
    from ray_megatron_env.cli import format_check

    decision = explain(MEGATRON_TP2, node=HGX_NOT_READY, packs=["nccl-fabric"])
    report = NodeReport("ab" * 28, "10.0.0.7", True, "1", decision, label="h100",
                        advice="nccl-fabric would set NCCL_MNNVL_ENABLE=0 on node b200: ...")
    text = format_check([report])
    assert f"{NVLS}=0 [nccl-fabric: set, required, source policy]" in text
    assert f"{MNNVL}=unset [nccl-fabric: leave, none, source none]" in text
    assert "advice: nccl-fabric would set NCCL_MNNVL_ENABLE=0 on node b200" in text
    assert max(len(line) for line in text.splitlines()) <= 100


def test_runtime_env_verb_ships_the_packs_and_refuses_an_unknown_one(capsys):
    assert main(["runtime-env", str(MEGATRON_YAML), "--packs", "nccl-fabric", "--json"]) == OK
    assert json.loads(capsys.readouterr().out)["megatron_env"]["packs"] == ["nccl-fabric"]
    assert main(["runtime-env", str(MEGATRON_YAML), "--packs", "fabric", "--json"]) == 2
    assert "known packs: cuda-connections, nccl-fabric" in capsys.readouterr().err


def test_every_row_of_every_pack_cites_a_source_and_says_why():
    from ray_megatron_env.packs import get_pack
    from ray_megatron_env.packs.connections import RULES

    for name in PACK_NAMES:
        for row in get_pack(name).rows:
            assert row.source.strip() and row.why.strip(), (name, row.id)
    for rule in RULES:
        assert rule.source.strip(), rule.id
        assert rule.why.strip(), rule.id


def test_no_row_claims_what_its_source_was_found_to_contradict():
    """Claims an independent reading of the sources refuted (issue 22)."""
    from ray_megatron_env.packs import get_pack
    from ray_megatron_env.packs.connections import RULES

    texts = [f"{r.why} {r.source}" for r in get_pack("nccl-fabric").rows]
    texts += [f"{r.why} {r.source}" for r in RULES]
    for text in texts:
        assert "NCCL still works" not in text  # nccl#2186 is a SIGSEGV
        assert "run scripts export 1" not in text  # slime: docker/npu_patch/slime.patch
        assert "token_dispatcher.py (overlap only" not in text  # no such line
        assert "Ascend e2e CI with the MindSpeed-LLM engine failed" not in text  # verl #7040


def test_every_nccl_pack_reads_nccl_cumem_enable_as_nccl_does():
    # One reader (packs/nccl_params.py) for every NCCL pack: a value that
    # reads as off in one pack reads as off in the other (they had drifted:
    # "junk" was off for nccl-fabric and on for nccl-host-mem). NCCL reads
    # the variable with strtoll(str, NULL, 0) (src/misc/param.cc), so text
    # without digits is 0, and ncclCuMemEnable() is off for 0 and for any
    # negative value but -2 (src/misc/cudawrap.cc).
    from ray_megatron_env.packs import nccl_fabric, nccl_host_mem

    golden = {"0": True, "-1": True, "junk": True, "0x0": True, " -3": True,
              "1": False, "-2": False, "2": False, "0x1": False, None: False, "": False}
    for value, off in golden.items():
        assert nccl_fabric.cumem_off(value) is off, value
        assert nccl_host_mem.cumem_off(value) is off, value
