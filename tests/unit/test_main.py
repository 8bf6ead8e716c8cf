"""``python -m ray_megatron_env`` (ray_megatron_env/__main__.py): the command
line, its exit status passed on (docs/cli.md: 0 fine, 2 bad input)."""

import ast
import os
import subprocess
import sys
from pathlib import Path

VERSION_MODULE = Path(__file__).resolve().parents[2] / "ray_megatron_env" / "_version.py"


def _run(*argv):
    env = {k: v for k, v in os.environ.items() if k != "RAY_RUNTIME_ENV_PLUGINS"}
    return subprocess.run([sys.executable, "-m", "ray_megatron_env", *argv], capture_output=True,
                          text=True, env=env, timeout=120)


def test_the_module_prints_the_version():
    version = ast.parse(VERSION_MODULE.read_text()).body[1].value.value
    done = _run("--version")
    assert (done.returncode, done.stdout, done.stderr) == (0, f"ray-megatron-env {version}\n", "")


def test_the_commands_exit_status_is_the_processes():
    done = _run("register", "--priority", "500")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == ("ray-megatron-env register: --priority must be from 0 to 100 "
                           "(Ray's range), got 500\n")
