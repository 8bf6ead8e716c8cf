"""A driver script as a user runs one (its ray.init env in its body: Ray
honours worker_process_setup_hook only in the job's env), against a cluster
fixture, in a process of its own; and what a task on each named node saw.

In the script: ``ADDRESS`` (the cluster's), ``on(names, **options)`` ->
{node: that task's whole environment}, and json, os, sys, ray and
build_runtime_env imported. Read an environment with workers.read."""

import json
import os
import subprocess
import sys
import textwrap
from typing import Any, Dict, Optional

from workers import read

PRELUDE = """
import json, os, sys, ray
from ray_megatron_env import build_runtime_env
ADDRESS = sys.argv[1]

@ray.remote(num_cpus=0)
def environment():
    return dict(os.environ)

def on(names, **options):
    refs = [environment.options(resources={"rme_" + n: 1}, **options).remote() for n in names]
    return dict(zip(names, ray.get(refs, timeout=150)))
"""


def driver_environment() -> Dict[str, str]:
    """This process's environment as a user's driver would have it: none of
    this package's variables, no driver hook (a test sets its own)."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith("RAY_MEGATRON_ENV_") and k != "RAY_RUNTIME_ENV_HOOK"}


def run_driver(cluster: Any, tmp_path: Any, *body: str, env: Optional[Dict[str, str]] = None,
               timeout: float = 240) -> subprocess.CompletedProcess:
    """Run PRELUDE + ``body`` (each part dedented) as ``driver.py`` in
    ``tmp_path``, with driver_environment() and ``env`` over it."""
    script = tmp_path / "driver.py"
    script.write_text(PRELUDE + "".join(textwrap.dedent(part) for part in body))
    return subprocess.run([sys.executable, str(script), cluster.address], capture_output=True,
                          text=True, timeout=timeout, env={**driver_environment(), **(env or {})})


def last_json(result: subprocess.CompletedProcess) -> Any:
    """The last JSON line a driver printed. Ray's driver prints what the
    cluster reports (a worker that died, with its traceback) to stdout from a
    thread of its own, so that can come after the driver's own last line."""
    lines = [line for line in result.stdout.splitlines() if line.startswith(("{", "["))]
    assert lines, result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads(lines[-1])


def run_job(cluster: Any, tmp_path: Any, body: str, **kw: Any) -> Any:
    """run_driver that must succeed: its last JSON line."""
    result = run_driver(cluster, tmp_path, body, **kw)
    assert result.returncode == 0, result.stderr[-3000:]
    return last_json(result)


def brief(seen: Dict[str, Dict[str, str]]) -> Dict[str, list]:
    """{node: [value, via, source, USER_HOOK_RAN, the probe's time]} of on()'s result."""
    out = {}
    for node, env in seen.items():
        value, decision = read(env)
        decision = decision or {}
        out[node] = [value, decision.get("via"), decision.get("source"),
                     env.get("USER_HOOK_RAN"), decision.get("probe", {}).get("probed_at")]
    return out


def seen_in(result: subprocess.CompletedProcess) -> Dict[str, tuple]:
    """{node: (value, decision)} of the on() result a driver printed last."""
    return {node: read(env) for node, env in last_json(result).items()}
