"""packs/torch_arch.py: the torch-arch pack's golden table, explain, a probe
that failed, and check's advice and the driver's arch list.

Expected values are written by hand from PyTorch
torch/utils/cpp_extension.py _get_cuda_arch_flags (spaces become ';', named
arches expanded, one -gencode per entry, +PTX adds PTX), as docs/packs.md
cites it. torch-arch with nccl-host-mem: tests/unit/packs/test_nccl_host_mem.py.
"""

import json

import pytest

from configs import MEGATRON_YAML
from ray_megatron_env.check import NodeReport, _advice
from ray_megatron_env.cli import OK, PROBLEM, format_check, main
from ray_megatron_env.explanation import explain, explain_node
from ray_megatron_env.node import NodeFabric
from ray_megatron_env.probe.fake import parse_fake_node

ARCHS = "TORCH_CUDA_ARCH_LIST"
MEGATRON_TP2 = {"engines": {"actor": {"strategy": "megatron", "tensor_parallel": 2}}}


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


def test_explain_node_value_still_works_beside_node_env(capsys):
    assert main(["explain", str(MEGATRON_YAML), "--gpus", "9.0", "--node-value", "4",
                 "--node-env", "TORCH_CUDA_ARCH_LIST=9.0", "--packs", "torch-arch"]) == OK
    out = capsys.readouterr().out
    assert "CUDA_DEVICE_MAX_CONNECTIONS: 1" in out
    assert "TORCH_CUDA_ARCH_LIST=9.0 [torch-arch: keep, none, source node]" in out


def test_explain_exits_1_for_an_explicit_list_missing_the_nodes_arch(capsys):
    assert main(["explain", str(MEGATRON_YAML), "--gpus", "8.0", "--packs", "torch-arch",
                 "--job-env", "TORCH_CUDA_ARCH_LIST=9.0"]) == PROBLEM


def _decision_json(gpus):
    return explain(MEGATRON_TP2, gpus).to_json()


def test_check_names_torch_arch_where_the_nodes_list_misses_its_gpus():
    facts = json.dumps({"fabric": NodeFabric((), "absent", "fake").to_dict(),
                        "p2p": parse_fake_node('{"gpus": "8.0"}').p2p.to_dict()})
    advice = _advice(facts, _decision_json("8.0"), "a100", json.dumps({ARCHS: "9.0 10.0"}))
    assert advice.startswith("torch-arch would set TORCH_CUDA_ARCH_LIST=8.0 on node a100")
    # unset is PyTorch's default: no advice for it
    assert _advice(facts, _decision_json("8.0"), "a100", "{}") is None


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
