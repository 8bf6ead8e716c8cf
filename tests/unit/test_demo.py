"""The demo's text output (glance, reasons, --json) on hand-built reports; the
demo end to end is tests/cluster/test_demo.py."""

import json
import sys

import pytest

from ray_megatron_env import build_runtime_env
from ray_megatron_env.check import NodeReport
from ray_megatron_env.decision import decide_node
from ray_megatron_env.frameworks import parse_field
from ray_megatron_env.record import Decision

CLI = [sys.executable, "-m", "ray_megatron_env"]


def _decision(value, reason, via, gpus, packs=(), process=None, satisfied=True, warnings=()):
    variables = {"CUDA_DEVICE_MAX_CONNECTIONS": {
        "pack": "cuda-connections", "action": "set" if value else "leave", "value": value,
        "source": "policy" if value else "none", "strength": "preferred", "rule": "r",
        "reason": reason}}
    for name, pack, action, set_to, rule, why, node_value in packs:
        variables[name] = {"pack": pack, "action": action, "value": set_to, "source": "policy",
                           "strength": "required", "rule": rule, "reason": why,
                           "node_value": node_value}
    return Decision.from_dict({"variables": variables, "gpus": gpus, "via": via,
                               "process": process, "satisfied": satisfied,
                               "warnings": list(warnings)})


def _report(label, decision=None, error=None):
    ids = {"head": ("a" * 56, "10.0.0.1", True), "h100": ("b" * 56, "10.0.0.2", False),
           "tray": ("c" * 56, "10.0.0.3", True)}
    node_id, ip, registered = ids[label]
    return NodeReport(node_id, ip, None if error else registered,
                      decision.value if decision else None, decision, error=error, label=label)


def _hand_built_results():
    from ray_megatron_env.demo import DemoResult

    head = _decision(None, "no GPU [no-gpu]; left unset.", "plugin", [])
    tray = _decision(None, "cc 10.0 [blackwell]; left unset.", "plugin", ["10.0"])
    worker = "trainer worker (no rule)"
    mnnvl_left = ("NCCL_MNNVL_ENABLE", "nccl-fabric", "leave", None, "leave-to-nccl",
                  "left to NCCL.", None)
    return [
        DemoResult("verl, Megatron TP=2", None, [
            _report("head", head),
            _report("h100", _decision("1", "cc 9.0: set to 1.", "setup-hook", ["9.0", "9.0"])),
            _report("tray", error="ActorDiedError: boom")], "tp2"),
        DemoResult("verl, a runtime env per role", "actor", [
            _report("head", head),
            _report("h100", _decision("8", "cc 9.0: 8 given.", "setup-hook", ["9.0", "9.0"],
                                      satisfied=False, warnings=["8 breaks a required rule"])),
            _report("tray", tray)], "mix"),
        DemoResult("verl, Megatron TP=2 with packs", None, [
            _report("head", _decision(None, "no GPU [no-gpu]; left unset.", "plugin", [],
                                      [("TORCH_CUDA_ARCH_LIST", "torch-arch", "leave", None,
                                        "leave", "no GPU.", None), mnnvl_left],
                                      process=worker)),
            _report("h100", _decision(
                "1", "cc 9.0: set to 1.", "setup-hook", ["9.0", "9.0"],
                [mnnvl_left, ("TORCH_CUDA_ARCH_LIST", "torch-arch", "set", "9.0",
                              "misses-node-arch", "the image lacks 9.0.", "8.0 10.0")],
                process=worker)),
            _report("tray", _decision(
                None, "cc 10.0 [blackwell]; left unset.", "plugin", ["10.0"],
                # in another order than h100's record (as JSON's sorted keys give)
                [("TORCH_CUDA_ARCH_LIST", "torch-arch", "set", "10.0", "unset", "its arch.",
                  None),
                 ("NCCL_MNNVL_ENABLE", "nccl-fabric", "set", "0", "fabric-without-imex",
                  "no IMEX channel.", None)], process=worker))], "packs"),
    ]


GLANCE = """\
CUDA_DEVICE_MAX_CONNECTIONS per node and scenario: the value (- unset), then the path that decided
NODE  GPUS   tp2       mix/actor  packs
head  none   - plugin  - plugin   - plugin
h100  9.0x2  1 hook    8 hook!    1 hook
tray  10.0   ! none    - plugin   - plugin
Paths: plugin (the node's registered plugin), hook (the job env's setup hook), none; ! a problem
Scenarios (verl): tp2 = Megatron TP=2; mix = a runtime env per role; packs = Megatron TP=2 with
  packs.
! h100 in mix/actor: 8 breaks a required rule
! tray in tp2: ActorDiedError: boom

In packs, what nccl-fabric and torch-arch set where they act (.: left as it was):
      nccl-fabric        torch-arch
NODE  NCCL_MNNVL_ENABLE  TORCH_CUDA_ARCH_LIST
h100  .                  9.0 (node had 8.0 10.0)
tray  0                  10.0"""

REASONS = """\
Nodes (ID, IP, plugin):
  head  aaaaaaaa  10.0.0.1  registered
  h100  bbbbbbbb  10.0.0.2  not registered
  tray  cccccccc  10.0.0.3  registered

== tp2: verl, Megatron TP=2
head  no GPU [no-gpu]; left unset.
h100  cc 9.0: set to 1.
tray  no decision record
        PROBLEM: ActorDiedError: boom

== mix/actor: verl, a runtime env per role
head  no GPU [no-gpu]; left unset.
h100  cc 9.0: 8 given.
        warning: 8 breaks a required rule
        PROBLEM: 8 breaks a required rule
tray  cc 10.0 [blackwell]; left unset.

== packs: verl, Megatron TP=2 with packs (every worker: trainer worker (no rule))
head  no GPU [no-gpu]; left unset.
h100  cc 9.0: set to 1.
        TORCH_CUDA_ARCH_LIST=9.0 [torch-arch: set, misses-node-arch]: the image lacks 9.0.
tray  cc 10.0 [blackwell]; left unset.
        NCCL_MNNVL_ENABLE=0 [nccl-fabric: set, fabric-without-imex]: no IMEX channel.
        TORCH_CUDA_ARCH_LIST=10.0 [torch-arch: set, unset]: its arch."""


def test_the_glance_is_one_matrix_of_value_and_path_then_what_the_packs_set():
    from ray_megatron_env.demo import format_glance

    assert format_glance(_hand_built_results()) == GLANCE


def test_the_reasons_are_one_line_per_node_and_scenario_with_the_ids_once():
    from ray_megatron_env.demo import format_reasons

    assert format_reasons(_hand_built_results()) == REASONS


def test_packs_that_set_nothing_say_so_in_one_line():
    from ray_megatron_env.demo import DemoResult, format_packs

    left = ("NCCL_MNNVL_ENABLE", "nccl-fabric", "leave", None, "leave-to-nccl", "left.", None)
    result = DemoResult("t", None, [_report("head", _decision(None, "r", "plugin", [], [left]))],
                        "packs")
    assert format_packs(result) == ["In packs, nccl-fabric set nothing on any node."]


@pytest.mark.parametrize("verbose", [False, True])
def test_demo_prints_the_glance_and_the_reasons_only_when_asked(monkeypatch, capsys, verbose):
    from ray_megatron_env import demo
    from ray_megatron_env.cli import main

    monkeypatch.setattr(demo, "run_demo", lambda *args, **kwargs: _hand_built_results())
    assert main(["demo", *(["--verbose"] if verbose else [])]) == 0
    out, err = capsys.readouterr()
    if verbose:
        assert out == f"{GLANCE}\n\n{REASONS}\n\nThe simulated cluster is shut down.\n"
    else:
        assert out == (f"{GLANCE}\n\nThe simulated cluster is shut down. --verbose shows why "
                       "each node got each value.\n")
    assert err.startswith("Starting a local simulated Ray cluster") and err.count("\n") == 1


def test_demo_json_keeps_its_fields_and_adds_the_short_name(monkeypatch, capsys):
    from ray_megatron_env import demo
    from ray_megatron_env.cli import main

    monkeypatch.setattr(demo, "run_demo", lambda *args, **kwargs: _hand_built_results())
    assert main(["demo", "--json"]) == 0
    runs = json.loads(capsys.readouterr().out)
    assert [(r["scenario"], r["role"], r["short"]) for r in runs] == [
        ("verl, Megatron TP=2", None, "tp2"), ("verl, a runtime env per role", "actor", "mix"),
        ("verl, Megatron TP=2 with packs", None, "packs")]
    assert set(runs[0]["nodes"][0]) == {"node_id", "ip", "registered", "value", "decision",
                                        "error", "label", "advice", "ok", "via", "problem"}


# --- the demo's nodes (demo --packs te-fp8-scales,fla-backend,net-ifaces) -------------

SCALES, TILELANG = "NVTE_FP8_BLOCK_SCALING_FP32_SCALES", "FLA_TILELANG"
MEGATRON_TP2 = {"engines": {"actor": {"strategy": "megatron", "tensor_parallel": 2}}}


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
