"""A job as a user runs one: a driver script whose ray.init env is given in
its body (Ray honours worker_process_setup_hook only in the job's env), and
what a task on each named node saw."""

import json
import os
import subprocess
import sys
import textwrap

PRELUDE = """
import json, os, sys, ray
from ray_megatron_env import build_runtime_env

@ray.remote(num_cpus=0)
def seen():
    text = os.environ.get("RAY_MEGATRON_ENV_DECISION")
    d = json.loads(text) if text else {}
    return [os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS"), d.get("via"), d.get("source"),
            os.environ.get("USER_HOOK_RAN"), d.get("probe", {}).get("probed_at")]

def on(names, **options):
    refs = [seen.options(resources={"rme_" + n: 1}, **options).remote() for n in names]
    return dict(zip(names, ray.get(refs, timeout=150)))
"""


def driver_environment():
    """This process's environment as a user's driver would have it: none of
    this package's variables, no driver hook (a test sets its own)."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith("RAY_MEGATRON_ENV_") and k != "RAY_RUNTIME_ENV_HOOK"}


def run_job(cluster, tmp_path, body):
    """Run the driver (``sys.argv[1]`` is the cluster's address); the last
    JSON line it prints. Ray's driver prints what the cluster reports (a
    worker that died, with its traceback) to stdout from a thread of its
    own, so that can come after the driver's own last line."""
    script = tmp_path / "job.py"
    script.write_text(PRELUDE + textwrap.dedent(body))
    result = subprocess.run([sys.executable, str(script), cluster.address], capture_output=True,
                            text=True, timeout=240, env=driver_environment())
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith(("{", "["))]
    assert lines, result.stdout[-3000:]
    return json.loads(lines[-1])
