"""packs/fla_backend.py: the fla-backend rows against their sources, and
SkyRL's reader that declares its own value. Every expected value is written
by hand from the source named beside it, never computed by the code under
test:

* fla 0.5.1, 0.5.2, 0.6.0 (fla-core wheels): TileLang on where
  ``FLA_TILELANG`` is set to anything but "0"; unset, 0.5.2 and 0.6.0 pick it
  only on Hopper with Triton >= 3.4 (0.5.1: wherever installed); chunk_o.py
  raises on Hopper with Triton 3.4 to < 3.7.1 on the Triton path.
* SkyRL skyrl/train/utils/utils.py @ a9564572: ``env_vars["FLA_TILELANG"] =
  os.environ.get("FLA_TILELANG", "1")`` when ``trainer.strategy ==
  "megatron"``; PR #2170: TileLang's packed backward aborts on B200.
"""

import json

import pytest

from paths import FIXTURES
from ray_megatron_env.cli import OK, PROBLEM, main
from ray_megatron_env.explanation import explain_node
from ray_megatron_env.frameworks.loading import load_spec

TILELANG = "FLA_TILELANG"
MEGATRON_TP2 = {"engines": {"actor": {"strategy": "megatron", "tensor_parallel": 2}}}
ROLLOUT_ONLY = {"engines": {"rollout": {"strategy": "vllm"}}}
SKYRL_QWEN35 = str(FIXTURES / "skyrl" / "run_megatron_qwen3.5.txt")


def decided(result, variable):
    entry = result.decision.variables[variable]
    return entry.value, entry.source, entry.rule, result.decision.satisfied


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
