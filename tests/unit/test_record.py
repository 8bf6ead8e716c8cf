"""The record (record.py): ``Decision`` and its entries as JSON, both
versions read back, the node log's lines, and ``read_decision``. The keys,
the example and the log line are docs/record.md's and docs/operators.md's."""

import json
import logging
import re
from pathlib import Path

from deciding import decided as decide
from ray_megatron_env.engines import MEGATRON
from ray_megatron_env.node import NodeGpus
from ray_megatron_env.record import Decision, VariableDecision, read_decision
from ray_megatron_env.spec import Engine, Spec

H100 = NodeGpus.known([(9, 0), (9, 0)], "fake")
MEGATRON_TP2 = Spec.of({"actor": Engine("megatron", MEGATRON, tensor_parallel=2)})
DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_decision_round_trips_through_json():
    decision = decide(MEGATRON_TP2, H100, inherited="4")
    data = json.loads(decision.to_json())
    assert data["value"] == "1" and data["gpus"] == ["9.0", "9.0"]
    assert data["engines"] == {"actor": "megatron TP=2 CP=1"}
    assert data["rules"] == {"actor": "megatron-model-parallel"}
    assert Decision.from_json(decision.to_json()) == decision


def test_json_has_no_dollar_sign_for_ray_to_expand():
    # Ray runs os.path.expandvars on env_vars values in the worker.
    node = NodeGpus.unknown("nvidia-smi", "unexpected output '$HOME ${PATH}'")
    text = decide(MEGATRON_TP2, node).to_json()
    assert "$" not in text
    assert "$HOME ${PATH}" in Decision.from_json(text).probe["error"]


def test_every_variable_has_one_entry_of_one_shape():
    from ray_megatron_env.explanation import explain_node
    result = explain_node({"engines": {"actor": {"strategy": "megatron", "tensor_parallel": 2}}},
                          node='{"gpus": "10.0", "fabric": {"state": "completed", '
                               '"cluster_uuid": "11111111-2222-3333-4444-555555555555"}}',
                          packs=["nccl-fabric"])
    record = json.loads(result.write["RAY_MEGATRON_ENV_DECISION"])
    assert record["record"] == 2
    assert sorted(record["variables"]) == ["CUDA_DEVICE_MAX_CONNECTIONS", "NCCL_CUMEM_ENABLE",
                                           "NCCL_MNNVL_ENABLE", "NCCL_NVLS_ENABLE"]
    shape = {"pack", "action", "value", "source", "strength", "rule", "reason", "node_value"}
    for entry in record["variables"].values():
        assert shape <= set(entry)
    assert record["variables"]["CUDA_DEVICE_MAX_CONNECTIONS"]["pack"] == "cuda-connections"


# A record as version 0.x wrote it (record version 1: no "variables", CUDA's
# answer at the top, other variables under "packs").
VERSION_1_RECORD = {
    "value": "1", "source": "policy", "requirement": "1", "gpus": ["9.0", "9.0"],
    "reason": "actor worker (no process rule matched): compute capability 9.0: actor "
              "(megatron TP=2 CP=1) needs 1 (preferred) [megatron-model-parallel]; set to 1.",
    "engines": {"actor": "megatron TP=2 CP=1"}, "rules": {"actor": "megatron-model-parallel"},
    "strengths": {"actor": "preferred"},
    "because": {"actor": "preferred: keeps tensor/context-parallel collectives ahead of compute"},
    "conflict": False, "satisfied": True, "warnings": [], "node_value": None,
    "process": "actor worker (no process rule matched)", "framework": "verl",
    "probe": {"method": "nvml", "error": None, "detail": "2 device(s) on the node, all visible",
              "vendor": None, "probed_at": 1767225600.5, "pid": 48213},
    "via": "plugin", "version": "0.9.0",
    "packs": {"NCCL_NVLS_ENABLE": {"pack": "nccl-fabric", "action": "set", "value": "0",
                                   "source": "policy", "strength": "required",
                                   "rule": "nvswitch-fabric-not-ready", "reason": "r"}},
}


def test_a_version_1_record_is_still_read():
    from ray_megatron_env import read_decision
    decision = read_decision({"RAY_MEGATRON_ENV_DECISION": json.dumps(VERSION_1_RECORD)})
    assert decision.record == 1
    assert (decision.value, decision.source, decision.reason) == (
        "1", "policy", VERSION_1_RECORD["reason"])
    assert decision.rules == {"actor": "megatron-model-parallel"}
    assert decision.strengths == {"actor": "preferred"}
    assert decision.variables["CUDA_DEVICE_MAX_CONNECTIONS"].strength == "preferred"
    assert decision.variables["NCCL_NVLS_ENABLE"].value == "0"
    assert decision.packs == VERSION_1_RECORD["packs"]
    # Written again, it carries both shapes, the version-1 keys unchanged.
    again = decision.to_dict()
    for key in ("value", "source", "reason", "requirement", "engines", "rules", "strengths",
                "because", "conflict", "node_value", "packs"):
        assert again[key] == VERSION_1_RECORD[key], key


def _documented_example() -> dict:
    """docs/record.md's example record (a verl Megatron TP=2 actor on an H100
    and a B200 node)."""
    page = (DOCS / "record.md").read_text().split("## Example", 1)[1]
    return json.loads(re.search(r"```json\n(.*?)\n```", page, re.S).group(1))


def test_the_documented_example_reads_as_the_page_says():
    decision = Decision.from_dict(_documented_example())
    assert (decision.record, decision.via, decision.satisfied) == (2, "plugin", True)
    assert (decision.value, decision.source, decision.node_value) == ("1", "policy", None)
    assert decision.gpus == ["9.0", "10.0"]
    assert decision.requirement == "1" and decision.conflict is False
    assert decision.engines == {"actor": "megatron TP=2 CP=1"}
    assert decision.rules == {"actor": "megatron-model-parallel"}
    assert decision.strengths == {"actor": "preferred"}
    # The version-1 reason: the process first, then the variable's own.
    assert decision.reason == (
        "actor worker (no process rule matched its env_vars): compute capability 9.0 (the "
        "oldest of 9.0, 10.0): actor (megatron TP=2 CP=1) needs 1 (preferred) "
        "[megatron-model-parallel]; set to 1.")
    assert decision.packs == {}  # only the always-on pack: no version-1 "packs"


def test_written_again_the_documented_example_gains_only_version_1s_keys():
    example = _documented_example()
    written = Decision.from_dict(example).to_dict()
    version_1 = {"value", "source", "reason", "requirement", "engines", "rules", "strengths",
                 "because", "conflict", "node_value"}
    assert set(written) == set(example) | version_1
    assert {k: written[k] for k in example} == example


def test_the_log_line_is_the_one_operators_md_shows():
    decision = Decision.from_dict({**_documented_example(), "warnings": ["a warning"]})
    assert decision.log_lines() == [
        (logging.INFO, "megatron_env: CUDA_DEVICE_MAX_CONNECTIONS=1 (source: policy; via: "
                       "plugin; GPUs: ['9.0', '10.0']): " + decision.reason),
        (logging.WARNING, "megatron_env: a warning")]


def test_a_pack_variable_logs_its_pack_action_and_strength():
    entry = VariableDecision("nccl-fabric", "set", "0", "policy", "required",
                             "nvswitch-fabric-not-ready", "fabric not ready; set to 0.")
    decision = Decision({"NCCL_NVLS_ENABLE": entry}, gpus=["9.0"], via="setup-hook")
    assert decision.log_lines() == [(
        logging.INFO, "megatron_env: NCCL_NVLS_ENABLE=0 (pack nccl-fabric, set, required; "
                      "source: policy; via: setup-hook): fabric not ready; set to 0.")]


def test_an_entry_carries_its_packs_detail_at_its_own_level_and_back():
    entry = VariableDecision("cuda-connections", "set", "1", "policy", "preferred", "r",
                             "why.", detail={"requirement": "1", "conflict": False},
                             driver_value="8")
    data = entry.to_dict()
    assert data == {"pack": "cuda-connections", "action": "set", "value": "1",
                    "source": "policy", "strength": "preferred", "rule": "r", "reason": "why.",
                    "node_value": None, "driver_value": "8", "requirement": "1",
                    "conflict": False}
    assert VariableDecision.from_dict(data) == entry
    # driver_value only where there was one (docs/record.md's keys).
    assert "driver_value" not in VariableDecision(*list(data.values())[:7]).to_dict()


def test_read_decision_reads_this_process_or_the_mapping_given(monkeypatch):
    monkeypatch.delenv("RAY_MEGATRON_ENV_DECISION", raising=False)
    assert read_decision() is None  # started without the field
    assert read_decision({"RAY_MEGATRON_ENV_DECISION": ""}) is None
    monkeypatch.setenv("RAY_MEGATRON_ENV_DECISION", json.dumps(_documented_example()))
    assert read_decision().via == "plugin"
    assert read_decision({}) is None  # the mapping given, not this process's
