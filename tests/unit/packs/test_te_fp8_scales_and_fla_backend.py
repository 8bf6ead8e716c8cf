"""Issue 40 (items 1 and 2): the te-fp8-scales and fla-backend rows against
their sources, and the readers that declare a framework's own value. Every
expected value is written by hand from the source named beside it, never
computed by the code under test:

* Transformer Engine transformer_engine/common/recipe/__init__.py (2.8, 2.9,
  main): ``use_f32_scales = os.getenv("NVTE_FP8_BLOCK_SCALING_FP32_SCALES",
  "0") == "1"``; the blockwise cast kernels (quantize_transpose_square_ and
  _vector_blockwise.cu, from 2.9): ``if (sm_arch() >= 100)
  NVTE_CHECK(pow_2_scale, ...)``, sm_arch = 10 * major + minor.
* slime slime/ray/actor_group.py and miles miles/ray/train/actor_factory.py
  @ 31f1ca96: the train actors' env_vars get ``os.environ.get(..., "1")``
  (miles: its driver's GPU decides the default), then ``--train-env-vars``.
* fla 0.5.1, 0.5.2, 0.6.0 (fla-core wheels): TileLang on where
  ``FLA_TILELANG`` is set to anything but "0"; unset, 0.5.2 and 0.6.0 pick it
  only on Hopper with Triton >= 3.4 (0.5.1: wherever installed); chunk_o.py
  raises on Hopper with Triton 3.4 to < 3.7.1 on the Triton path.
* SkyRL skyrl/train/utils/utils.py @ a9564572: ``env_vars["FLA_TILELANG"] =
  os.environ.get("FLA_TILELANG", "1")`` when ``trainer.strategy ==
  "megatron"``; PR #2170: TileLang's packed backward aborts on B200.
"""

import dataclasses
import json

import pytest

from ray_megatron_env import build_runtime_env
from ray_megatron_env.check import NodeReport, fp8_scales_disagree
from ray_megatron_env.cli import PROBLEM, OK, format_check, main
from ray_megatron_env.decision import decide_node
from ray_megatron_env.errors import FieldValueError
from ray_megatron_env.explanation import explain_node
from ray_megatron_env.frameworks import parse_field
from ray_megatron_env.frameworks.loading import load_spec
from ray_megatron_env.node import NodeFacts, NodeGpus, parse_gpu_list
from ray_megatron_env.packs import get_pack
from ray_megatron_env.packs.pack import canonical
from ray_megatron_env.names import TEXT_VARIABLES

from paths import FIXTURES

SCALES, TILELANG = "NVTE_FP8_BLOCK_SCALING_FP32_SCALES", "FLA_TILELANG"
MEGATRON_TP2 = {"engines": {"actor": {"strategy": "megatron", "tensor_parallel": 2}}}
ROLLOUT_ONLY = {"engines": {"rollout": {"strategy": "vllm"}}}
# slime's Megatron argument list for FP8 block-scaling training (its docs,
# low-precision.md: --fp8-format e4m3 --fp8-recipe blockwise).
SLIME_FP8 = ["--actor-num-nodes", "2", "--actor-num-gpus-per-node", "8",
             "--tensor-model-parallel-size", "2", "--context-parallel-size", "1",
             "--expert-model-parallel-size", "1", "--rollout-num-gpus-per-engine", "2",
             "--fp8-format", "e4m3", "--fp8-recipe", "blockwise"]
SKYRL_QWEN35 = str(FIXTURES / "skyrl" / "run_megatron_qwen3.5.txt")


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


# --- fla-backend ---------------------------------------------------------------------

# GPUs, the job's value, the node's -> the worker's value, source, row, satisfied.
@pytest.mark.parametrize("gpus,job,inherited,want", [
    # Blackwell: TileLang's packed backward aborts; any value but "0" is on
    ("10.0", None, "1", ("0", "policy", "tilelang-on-blackwell", True)),
    ("10.0", None, "", ("0", "policy", "tilelang-on-blackwell", True)),
    ("12.0", None, "true", ("0", "policy", "tilelang-on-blackwell", True)),
    ("10.0", "1", None, ("1", "explicit", "tilelang-on-blackwell", False)),
    ("10.0", None, "0", ("0", "node", "leave", True)),
    ("10.0", None, None, (None, "none", "leave", True)),  # fla >= 0.5.2's own Triton
    # Hopper: "0" forces the Triton backward that raises with Triton 3.4 to 3.7.0
    ("9.0", None, "0", ("1", "policy", "tilelang-off-on-hopper", True)),
    ("9.0,9.0", "0", None, ("0", "explicit", "tilelang-off-on-hopper", False)),
    ("9.0", None, "1", ("1", "node", "leave", True)),
    ("9.0", None, None, (None, "none", "leave", True)),  # fla's own TileLang on Hopper
    ("8.0,9.0", None, "0", ("1", "policy", "tilelang-off-on-hopper", True)),
    # Hopper and Blackwell on one node: no value serves both
    ("9.0,10.0", None, None, (None, "none", "hopper-and-blackwell", True)),
    ("9.0,10.0", "0", None, ("0", "explicit", "hopper-and-blackwell", False)),
    ("9.0,10.0", None, "1", ("1", "node", "hopper-and-blackwell", False)),
    # before Hopper: only a framework's own 1 is the pack's business
    ("8.0", None, "1", ("1", "node", "leave", True)),
    ("8.0", "1", None, ("1", "explicit", "leave", True)),
    ("none", None, "0", ("0", "node", "leave", True)),
])
def test_fla_backend_rows(gpus, job, inherited, want):
    result = explain_node(MEGATRON_TP2, gpus, packs=["fla-backend"],
                          job_env={TILELANG: job} if job is not None else None,
                          node_env={TILELANG: inherited} if inherited is not None else None)
    assert decided(result, TILELANG) == want


def test_fla_backend_leaves_inference_processes():
    result = explain_node(ROLLOUT_ONLY, "10.0", packs=["fla-backend"], node_env={TILELANG: "1"})
    assert decided(result, TILELANG) == ("1", "node", "leave", True)


def test_skyrl_declares_its_1_for_megatron_jobs_only():
    assert load_spec(SKYRL_QWEN35)[0].framework_env == ((TILELANG, "1"),)
    fsdp = str(FIXTURES / "skyrl" / "run_fsdp_baseline.txt")
    assert load_spec(fsdp)[0].framework_env == ()


# SkyRL's own 1 (the Qwen3.5 Megatron override list) on each GPU class: the
# worker's value, its source, the row, satisfied; written, removed, replaced.
@pytest.mark.parametrize("gpus,want,written,removed,replaced", [
    ("10.0", ("0", "policy", "tilelang-on-blackwell", True), "0", False, True),
    # TileLang is fla's own choice on Hopper: SkyRL's 1 stays as it is
    ("9.0", ("1", "explicit", "leave", True), None, False, False),
    ("8.0", (None, "none", "framework-tilelang-before-hopper", True), None, True, True),
    ("9.0,10.0", (None, "none", "hopper-and-blackwell", True), None, True, True),
])
def test_skyrl_own_1_per_gpu_class(gpus, want, written, removed, replaced):
    result = explain_node(SKYRL_QWEN35, gpus, packs=["fla-backend"], job_env={TILELANG: "1"})
    assert decided(result, TILELANG) == want
    assert (result.env().get(TILELANG), TILELANG in result.remove) == (written, removed)
    assert ("skyrl's own FLA_TILELANG=1 for every process is replaced"
            in result.decision.variables[TILELANG].reason) == replaced


# Done when: SkyRL's own 1 -> 0 on 10.0, 1 on 9.0; an inherited 0 on 9.0 does
# not stay 0; a job's explicit 0 on 9.0 is kept and warned.
def test_explain_fla_done_when(capsys):
    base = ["explain", SKYRL_QWEN35, "--packs", "fla-backend"]
    assert main([*base, "--gpus", "10.0", "--job-env", "FLA_TILELANG=1", "--json"]) == OK
    assert json.loads(capsys.readouterr().out)["env"][TILELANG] == "0"
    assert main([*base, "--gpus", "9.0", "--job-env", "FLA_TILELANG=1", "--json"]) == OK
    assert json.loads(capsys.readouterr().out)["variables"][TILELANG]["value"] == "1"
    assert main([*base, "--gpus", "9.0", "--node-env", "FLA_TILELANG=0", "--json"]) == OK
    assert json.loads(capsys.readouterr().out)["env"][TILELANG] == "1"
    # a job's own 0 is a value that is not SkyRL's 1: kept, with a warning
    assert main([*base, "--gpus", "9.0", "--job-env", "FLA_TILELANG=0"]) == PROBLEM
    out = capsys.readouterr().out
    assert "FLA_TILELANG=0 [fla-backend: set, required, source explicit]" in out
    assert "warning: fla-backend: explicit FLA_TILELANG=0 breaks a required rule" in out


# --- framework_env in the compact form -----------------------------------------------

def test_the_field_carries_framework_env_and_reads_it_back():
    field = build_runtime_env(SKYRL_QWEN35, packs=["fla-backend"])["megatron_env"]
    assert field["framework_env"] == {TILELANG: "1"}
    assert parse_field(field).framework_env == ((TILELANG, "1"),)
    assert parse_field(field) == dataclasses.replace(load_spec(SKYRL_QWEN35)[0],
                                                     packs=("fla-backend",))


@pytest.mark.parametrize("raw,message", [
    ({"FLA_TILELANG": 1}, "framework_env.FLA_TILELANG must be a string"),
    (["FLA_TILELANG"], "framework_env must be a mapping of variable -> the framework's own"),
    ({"NOT_A_PACK_VARIABLE": "1"}, "framework_env names 'NOT_A_PACK_VARIABLE', which no pack "
                                   "decides"),
])
def test_framework_env_is_checked(raw, message):
    with pytest.raises((FieldValueError, TypeError), match=message):
        parse_field({**MEGATRON_TP2, "framework_env": raw})


# --- how the values are compared ---------------------------------------------------------

def test_text_variables_are_compared_as_written():
    # TE: == "1"; fla: != "0"; interface names and NCCL's string lists; NCCL's
    # P2P level, a path name compared with strcmp (src/graph/paths.cc).
    assert canonical(" 1", SCALES) == " 1" and canonical("01", TILELANG) == "01"
    assert canonical("eth0", "NCCL_SOCKET_IFNAME") == "eth0"
    assert canonical("0x1", "NCCL_IB_GID_INDEX") == "1"  # an integer parameter (strtoll)
    assert canonical("LOC", "NCCL_P2P_LEVEL") == "LOC" and canonical("00", "NCCL_P2P_LEVEL") == "00"
    texts = {v for name in ("te-fp8-scales", "fla-backend", "net-ifaces")
             for v in get_pack(name).variables} - {"NCCL_IB_GID_INDEX"}
    assert TEXT_VARIABLES == texts | {"NCCL_P2P_LEVEL"}


# --- the demo's nodes (demo --packs te-fp8-scales,fla-backend,net-ifaces) -------------

def test_the_demo_nodes_images_meet_the_three_packs():
    from ray_megatron_env.demo import DEMO_NODES
    from ray_megatron_env.probe import probe_node

    spec = parse_field(build_runtime_env(
        MEGATRON_TP2, packs=["te-fp8-scales", "fla-backend", "net-ifaces"])["megatron_env"])
    acted = {}
    for demo_node in DEMO_NODES:
        environ = demo_node.environment()
        decision = decide_node(spec, probe_node(("net",), environ), {}, environ).decision
        acted[demo_node.name] = {name: (entry.value, entry.rule)
                                 for name, entry in decision.variables.items()
                                 if entry.pack != "cuda-connections" and entry.action == "set"
                                 and entry.source == "policy"}
    assert acted == {
        "cpu_head": {}, "v100": {}, "a100": {}, "h100_b200": {},
        "h100": {TILELANG: ("1", "tilelang-off-on-hopper")},
        "gb200": {SCALES: ("0", "fp32-scales-on-blackwell"),
                  TILELANG: ("0", "tilelang-on-blackwell")},
        "l40s": {"NCCL_SOCKET_IFNAME": ("ens5", "names-no-interface-here")}}
