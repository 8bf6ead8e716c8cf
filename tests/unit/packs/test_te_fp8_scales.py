"""packs/te_fp8_scales.py: the te-fp8-scales rows against their sources, the
readers that declare slime's and miles' own value, explain and check.
Every expected value is written by hand from the source named beside it,
never computed by the code under test:

* Transformer Engine transformer_engine/common/recipe/__init__.py (2.8, 2.9,
  main): ``use_f32_scales = os.getenv("NVTE_FP8_BLOCK_SCALING_FP32_SCALES",
  "0") == "1"``; the blockwise cast kernels (quantize_transpose_square_ and
  _vector_blockwise.cu, from 2.9): ``if (sm_arch() >= 100)
  NVTE_CHECK(pow_2_scale, ...)``, sm_arch = 10 * major + minor.
* slime slime/ray/actor_group.py and miles miles/ray/train/actor_factory.py
  @ 31f1ca96: the train actors' env_vars get ``os.environ.get(..., "1")``
  (miles: its driver's GPU decides the default), then ``--train-env-vars``.
"""

import json

import pytest

from ray_megatron_env import build_runtime_env
from ray_megatron_env.check import NodeReport, fp8_scales_disagree
from ray_megatron_env.cli import PROBLEM, OK, format_check, main
from ray_megatron_env.decision import decide_node
from ray_megatron_env.explanation import explain_node
from ray_megatron_env.frameworks import parse_field
from ray_megatron_env.frameworks.loading import load_spec
from ray_megatron_env.node import NodeFacts, NodeGpus, parse_gpu_list

SCALES = "NVTE_FP8_BLOCK_SCALING_FP32_SCALES"
MEGATRON_TP2 = {"engines": {"actor": {"strategy": "megatron", "tensor_parallel": 2}}}
ROLLOUT_ONLY = {"engines": {"rollout": {"strategy": "vllm"}}}
# slime's Megatron argument list for FP8 block-scaling training (its docs,
# low-precision.md: --fp8-format e4m3 --fp8-recipe blockwise).
SLIME_FP8 = ["--actor-num-nodes", "2", "--actor-num-gpus-per-node", "8",
             "--tensor-model-parallel-size", "2", "--context-parallel-size", "1",
             "--expert-model-parallel-size", "1", "--rollout-num-gpus-per-engine", "2",
             "--fp8-format", "e4m3", "--fp8-recipe", "blockwise"]


def decided(result, variable):
    entry = result.decision.variables[variable]
    return entry.value, entry.source, entry.rule, result.decision.satisfied


# --- te-fp8-scales -----------------------------------------------------------------

# GPUs, the job's value, the node's -> the worker's value, its source, the row, satisfied.
@pytest.mark.parametrize("gpus,job,inherited,want", [
    # sm_arch() >= 100 refuses FP32 scales: 10.0 (B200), 10.3 (B300), 12.0
    # (RTX 50), 12.1 (GB10); a node with one such GPU among Hopper ones too.
    ("10.0", None, "1", ("0", "policy", "fp32-scales-on-blackwell", True)),
    ("10.3", None, "1", ("0", "policy", "fp32-scales-on-blackwell", True)),
    ("12.1", None, "1", ("0", "policy", "fp32-scales-on-blackwell", True)),
    ("9.0,10.0", None, "1", ("0", "policy", "fp32-scales-on-blackwell", True)),
    # the job's own 1: kept, and the required row breaks
    ("10.0", "1", None, ("1", "explicit", "fp32-scales-on-blackwell", False)),
    # TE reads only exactly "1" as FP32: anything else is powers of 2
    ("10.0", None, "true", ("true", "node", "leave", True)),
    ("10.0", None, " 1", (" 1", "node", "leave", True)),
    ("10.0", None, "0", ("0", "node", "leave", True)),
    ("10.0", None, None, (None, "none", "leave", True)),
    # Hopper (sm_arch 90) takes FP32 scales: the frameworks' choice stays
    ("9.0", None, "1", ("1", "node", "before-blackwell", True)),
    ("9.0", "1", None, ("1", "explicit", "before-blackwell", True)),
    ("8.0", None, "1", ("1", "node", "before-blackwell", True)),
    # no GPU: nothing to say
    ("none", None, "1", ("1", "node", "leave", True)),
])
def test_te_fp8_scales_rows(gpus, job, inherited, want):
    result = explain_node(MEGATRON_TP2, gpus, packs=["te-fp8-scales"],
                          job_env={SCALES: job} if job is not None else None,
                          node_env={SCALES: inherited} if inherited is not None else None)
    assert decided(result, SCALES) == want
    assert (SCALES in result.env()) == (want[1] == "policy")


def test_te_fp8_scales_leaves_inference_processes():
    result = explain_node(ROLLOUT_ONLY, "10.0", packs=["te-fp8-scales"], node_env={SCALES: "1"})
    assert decided(result, SCALES) == ("1", "node", "leave", True)


def test_te_fp8_scales_on_unreadable_gpus_leaves_and_warns():
    facts = NodeFacts(NodeGpus.unknown("nvml", "boom"))
    spec = parse_field(build_runtime_env(MEGATRON_TP2, packs=["te-fp8-scales"])["megatron_env"])
    result = decide_node(spec, facts, {}, {SCALES: "1"})
    assert result.decision.variables[SCALES].rule == "leave"
    assert any("te-fp8-scales: the node's GPUs could not be read (boom)" in w
               for w in result.decision.warnings)


def test_slime_and_miles_declare_their_train_actors_1():
    # slime/ray/actor_group.py: every train actor; miles the same (its
    # default "1" where its driver sees no GPU). --train-env-vars goes over it.
    assert load_spec(SLIME_FP8)[0].framework_env == ((SCALES, "1"),)
    assert load_spec([*SLIME_FP8, "--use-miles-router"])[0].framework_env == ((SCALES, "1"),)
    own = [*SLIME_FP8, "--train-env-vars", json.dumps({SCALES: "1"})]
    assert load_spec(own)[0].framework_env == ()
    # no train actors at all: nothing of slime's
    assert load_spec([*SLIME_FP8, "--debug-rollout-only"])[0].framework_env == ()


# Done when (issue 40): slime's own 1 -> 0 on 10.0 and 12.1, 1 on 9.0; a job's
# explicit 1 on 10.0 kept, warned, not satisfied; an inherited 1 on 10.0 -> 0;
# a CPU head left alone.
@pytest.mark.parametrize("gpus,value,code", [("10.0", "0", OK), ("12.1", "0", OK),
                                             ("9.0", "1", OK)])
def test_explain_slime_own_1(tmp_path, capsys, gpus, value, code):
    config = tmp_path / "slime.json"
    config.write_text(json.dumps(SLIME_FP8))
    args = ["explain", str(config), "--gpus", gpus, "--packs", "te-fp8-scales",
            "--job-env", f"{SCALES}=1", "--json"]
    assert main(args) == code
    record = json.loads(capsys.readouterr().out)
    assert record["variables"][SCALES]["value"] == value
    assert record["env"].get(SCALES) == (value if gpus != "9.0" else None)


def test_explain_job_1_inherited_1_and_cpu_head(tmp_path, capsys):
    config = tmp_path / "slime.json"
    config.write_text(json.dumps([*SLIME_FP8, "--train-env-vars", json.dumps({SCALES: "1"})]))
    base = ["explain", str(config), "--packs", "te-fp8-scales"]
    assert main([*base, "--gpus", "10.0", "--job-env", f"{SCALES}=1"]) == PROBLEM
    out = capsys.readouterr().out
    assert f"{SCALES}=1 [te-fp8-scales: set, required, source explicit]" in out
    assert f"warning: te-fp8-scales: explicit {SCALES}=1 breaks a required rule" in out
    assert main([*base, "--gpus", "10.0", "--node-env", f"{SCALES}=1"]) == OK
    assert "the node's value 1 is replaced by 0" in capsys.readouterr().out
    assert main([*base, "--gpus", "none", "--node-env", f"{SCALES}=1"]) == OK
    assert f"{SCALES}=1 [te-fp8-scales: leave, none, source node]" in capsys.readouterr().out


def test_check_warns_where_trainer_nodes_read_different_scales():
    spec = parse_field(build_runtime_env(MEGATRON_TP2, packs=["te-fp8-scales"])["megatron_env"])

    def report(name, gpus):
        decision = decide_node(spec, NodeFacts(parse_gpu_list(gpus)), {}, {SCALES: "1"},
                               via="plugin").decision
        return NodeReport(name * 8, "10.0.0.1", True, decision.value, decision, label=name)

    # The H100 keeps 1 (FP32), the B200 gets 0: they disagree; the CPU head
    # trains nothing and does not count.
    reports = [report("cpu", "none"), report("h100", "9.0"), report("b200", "10.0")]
    warning = fp8_scales_disagree(reports)
    assert warning.startswith(f"{SCALES} differs between trainer nodes: FP32 scales (1) on "
                              "h100, powers of 2 on b200;")
    assert "quantizer_fp8.py" in warning
    assert "warning: NVTE_FP8_BLOCK_SCALING_FP32_SCALES differs" in format_check(reports)
    assert fp8_scales_disagree([report("h100", "9.0"), report("h200", "9.0")]) is None
    assert fp8_scales_disagree([report("b200", "10.0"), report("b300", "10.3")]) is None

