"""The README's main job, run as a user runs it; then its text output on
hand-built reports.

The end-to-end test is marked slow (60 to 90 s here, on 2 shared cores: a cluster of its own
and 42 worker starts): the README's test command leaves it, like the load
test, to .ci/run, which runs both; the README's first command runs the same
job. The text tests below it need no cluster.
"""

import json
import socket
import subprocess
import sys

import pytest

from ray_megatron_env.check import NodeReport
from ray_megatron_env.decision import Decision

CLI = [sys.executable, "-m", "ray_megatron_env"]


@pytest.mark.slow
def test_demo_reports_every_node_for_every_example(no_cluster):
    # As beside another Ray on this machine, whose dashboard holds Ray's
    # default port (if something holds it already, so much the better).
    with socket.socket() as other_dashboard:
        try:
            other_dashboard.bind(("127.0.0.1", 8265))
            other_dashboard.listen()
        except OSError:
            pass
        result = subprocess.run([*CLI, "demo", "--json"], capture_output=True, text=True,
                                timeout=240)
    assert result.returncode == 0, result.stderr
    runs = json.loads(result.stdout)
    by_title = {(r["scenario"], r["role"]): {n["label"]: n for n in r["nodes"]} for r in runs}
    assert len(by_title) == 6
    generations = {tuple(n["decision"]["gpus"]) for nodes in by_title.values()
                   for n in nodes.values()}
    assert {(), ("7.0",), ("8.0",), ("9.0", "9.0"), ("10.0",), ("9.0", "10.0"),
            ("8.9",) * 4} <= generations
    values = {key: {label: n["value"] for label, n in nodes.items()}
              for key, nodes in by_title.items()}
    pre_blackwell = {"cpu_head": None, "v100": "1", "a100": "1", "h100": "1", "gb200": None,
                     "h100_b200": "1", "l40s": "1"}
    nothing = dict.fromkeys(pre_blackwell)
    assert [v for (title, _), v in values.items() if title.startswith("verl, Megatron actor/")] \
        == [pre_blackwell]
    # The packs scenario: each node's own answer, the row named in its record
    # (docs/packs.md): the GB200 tray without an IMEX channel gets
    # NCCL_MNNVL_ENABLE=0; the L40S node (no peer access, driver 12.8)
    # NCCL_CUMEM_HOST_ENABLE=0; the A100 node's image list "9.0 10.0" is
    # replaced by its own 8.0; the others get their own archs, the CPU head none.
    [packed] = [nodes for (title, _), nodes in by_title.items() if "packs" in title]
    assert values[next(k for k in values if "packs" in k[0])] == pre_blackwell
    decided = {label: {var: (entry["value"], entry["rule"])
                       for var, entry in n["decision"]["variables"].items()
                       if var in ("NCCL_MNNVL_ENABLE", "NCCL_CUMEM_HOST_ENABLE",
                                  "TORCH_CUDA_ARCH_LIST")}
               for label, n in packed.items()}
    leave = (None, "leave-to-nccl")
    nccl = {"NCCL_MNNVL_ENABLE": leave, "NCCL_CUMEM_HOST_ENABLE": leave}
    assert decided == {
        "cpu_head": {**nccl, "TORCH_CUDA_ARCH_LIST": (None, "leave")},
        "v100": {**nccl, "TORCH_CUDA_ARCH_LIST": ("7.0", "unset")},
        "a100": {**nccl, "TORCH_CUDA_ARCH_LIST": ("8.0", "misses-node-arch")},
        "h100": {**nccl, "TORCH_CUDA_ARCH_LIST": ("9.0", "unset")},
        "gb200": {**nccl, "NCCL_MNNVL_ENABLE": ("0", "fabric-without-imex"),
                  "TORCH_CUDA_ARCH_LIST": ("10.0", "unset")},
        "h100_b200": {**nccl, "TORCH_CUDA_ARCH_LIST": ("9.0 10.0", "unset")},
        "l40s": {**nccl, "NCCL_CUMEM_HOST_ENABLE": ("0", "no-p2p-old-driver"),
                 "TORCH_CUDA_ARCH_LIST": ("8.9", "unset")}}
    assert [v for (title, _), v in values.items() if "TP=1" in title] == [nothing]
    assert [v for (title, _), v in values.items() if "FSDP engines" in title] == [nothing]
    per_role = {role: v for (title, role), v in values.items() if "per role" in title}
    assert per_role == {"actor": pre_blackwell, "critic": nothing}
    assert all(n["node_id"] and n["ip"] and n["ok"] for nodes in by_title.values()
               for n in nodes.values())
    # The plugin where it is registered; the setup hook on the V100 and
    # H100+B200 nodes, which the demo starts without it.
    paths = {(label, n["registered"], n["via"]) for nodes in by_title.values()
             for label, n in nodes.items()}
    assert paths == {(label, label not in ("v100", "h100_b200"),
                      "setup-hook" if label in ("v100", "h100_b200") else "plugin")
                     for label in pre_blackwell}
    # Calm: nothing but the demo's own start line on stderr (no Ray warning).
    assert result.stderr.splitlines() == [result.stderr.splitlines()[0]]
    assert result.stderr.startswith("Starting a local simulated Ray cluster")
    # At a glance: the text these reports print (cli.cmd_demo: the glance, a
    # blank line, the closing line) fits one screen, 100 columns by 25 lines;
    # its matrix has a row per node and a column per run, and its packs block
    # shows NCCL_MNNVL_ENABLE=0 on the tray, NCCL_CUMEM_HOST_ENABLE=0 on the
    # L40S node and the A100 node's 8.0 over its image's list.
    from ray_megatron_env.demo import DemoResult, format_glance

    results = [DemoResult(run["scenario"], run["role"], [
        NodeReport(**{**{k: v for k, v in n.items() if k not in ("ok", "problem", "via")},
                      "decision": Decision.from_dict(n["decision"])})
        for n in run["nodes"]], run["short"]) for run in runs]
    glance = format_glance(results).splitlines()
    assert len(glance) + 2 <= 25 and max(len(line) for line in glance) <= 100, glance
    assert glance[1].split() == ["NODE", "GPUS", "tp2", "tp1", "fsdp", "mix/actor",
                                 "mix/critic", "packs"]
    assert [line.split()[0] for line in glance[2:9]] == list(pre_blackwell)
    assert glance[3].split() == ["v100", "7.0", "1", "hook", "-", "hook", "-", "hook",
                                 "1", "hook", "-", "hook", "1", "hook"]
    packs = glance[glance.index(next(line for line in glance if line.startswith("In packs"))):]
    assert packs[1].split() == ["nccl-fabric", "nccl-host-mem", "torch-arch"]
    assert packs[2].split() == ["NODE", "NCCL_MNNVL_ENABLE", "NCCL_CUMEM_HOST_ENABLE",
                                "TORCH_CUDA_ARCH_LIST"]
    assert {line.split()[0]: line.split()[1:] for line in packs[3:]} == {
        "v100": [".", ".", "7.0"], "a100": [".", ".", "8.0", "(node", "had", "9.0", "10.0)"],
        "h100": [".", ".", "9.0"], "gb200": ["0", ".", "10.0"],
        "h100_b200": [".", ".", "9.0", "10.0"], "l40s": [".", "0", "8.9"]}


def test_demo_refuses_a_bad_config_before_starting_anything(no_cluster, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("critic:\n  strategy: megatorn\n")
    result = subprocess.run([*CLI, "demo", "--config", str(bad)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 2
    assert "unknown strategy 'megatorn' at critic.strategy" in result.stderr


# --- the text output, on hand-built reports (no cluster) ---------------------------------------

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
