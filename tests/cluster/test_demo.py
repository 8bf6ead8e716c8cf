"""The README's main job, run as a user runs it; then its text output on
hand-built reports.

The end-to-end test is marked slow (60 to 90 s here, on 2 shared cores: a cluster of its own
and 42 worker starts): the README's test command leaves it, like the load
test, to .ci/run, which runs both; the README's first command runs the same
job. The text tests are tests/unit/test_demo.py.
"""

import json
import socket
import subprocess
import sys

import pytest

from ray_megatron_env.check import NodeReport
from ray_megatron_env.record import Decision

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
