"""check on a cluster where every node registers the plugin."""

import json
import subprocess
import sys

from conftest import NODE_SETS

CLUSTER = "registered"


def test_check_strict_passes_and_reports_every_node(cluster):
    result = subprocess.run([sys.executable, "-m", "ray_megatron_env", "check", "--address",
                             cluster.address, "--strict", "--json"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    reports = json.loads(result.stdout)
    assert sorted(r["node_id"] for r in reports) == sorted(cluster.node_ids.values())
    assert len(reports) == len(NODE_SETS["registered"])
    assert all(r["ok"] and r["registered"] and r["problem"] is None for r in reports)
    gpus = sorted(tuple(r["decision"]["gpus"]) for r in reports)
    assert gpus == [(), ("10.0",), ("8.0",), ("9.0", "9.0")]
