"""The test harness itself: the leak check minds only this session's
processes (a simulated cluster stopping what Ray left: tests/cluster/test_harness.py),
and --must-run turns a framework-package test's skip into a failure."""

import os
import subprocess
import sys
from pathlib import Path

from processes import sleeper
from conftest import SESSION_VARIABLE, our_ray_processes


def test_the_leak_check_counts_our_processes_and_not_another_jobs():
    token = os.environ[SESSION_VARIABLE]  # set for the session by conftest
    ours = sleeper(dict(os.environ))
    other = sleeper({k: v for k, v in os.environ.items() if k != SESSION_VARIABLE})
    try:
        found = our_ray_processes(token)
        assert ours.pid in found
        assert other.pid not in found
    finally:
        for proc in (ours, other):
            proc.kill()
            proc.wait()
    assert ours.pid not in our_ray_processes(token)


# --must-run (tests/helpers/must_run.py): .ci/run names each framework-package
# test there, so that a skip of one fails CI. Run on modules written here,
# which skip whatever is installed.

SKIPS_AT_COLLECTION = 'import pytest\npytest.importorskip("no_such_module_here")\n'
SKIPS_IN_A_FIXTURE = (
    "import pytest\n\n@pytest.fixture\ndef framework():\n"
    "    pytest.skip('the framework is not installed')\n\n"
    "def test_runs(framework):\n    pass\n\ndef test_other():\n    pass\n")


def _pytest(folder, *args):
    (folder / "conftest.py").write_text('pytest_plugins = ["must_run"]\n')
    helpers = Path(__file__).resolve().parents[1] / "helpers"
    # Without the installed plugins (hypothesis, hydra, ...): 0.2 s a run, not 1.5.
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
           "PYTHONPATH": f"{helpers}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rs",
                           *args], cwd=folder, env=env, capture_output=True, text=True)
    return done.returncode, done.stdout + done.stderr


def test_a_module_named_by_must_run_fails_where_it_would_skip(tmp_path):
    (tmp_path / "test_collected.py").write_text(SKIPS_AT_COLLECTION)
    (tmp_path / "test_fixture.py").write_text(SKIPS_IN_A_FIXTURE)

    code, out = _pytest(tmp_path)
    assert code == 0 and "2 skipped" in out and "1 passed" in out, out

    code, out = _pytest(tmp_path, "test_collected.py", "--must-run", "test_collected.py")
    assert code == 2, out  # a collection error
    assert ("test_collected.py skipped (Skipped: could not import 'no_such_module_here'"
            in out), out

    code, out = _pytest(tmp_path, "--must-run", "test_fixture.py", "test_fixture.py")
    assert code == 1 and "1 passed, 1 error" in out, out  # failed in its setup
    assert "test_fixture.py skipped (" in out and "--must-run names it" in out, out

    # Another module's skip is left alone.
    (tmp_path / "test_plain.py").write_text("def test_plain():\n    pass\n")
    code, out = _pytest(tmp_path, "--must-run", "test_fixture.py", "test_collected.py",
                        "test_plain.py")
    assert code == 0 and "1 passed, 1 skipped" in out, out


def test_must_run_refuses_a_path_that_names_no_module(tmp_path):
    (tmp_path / "test_collected.py").write_text(SKIPS_AT_COLLECTION)
    code, out = _pytest(tmp_path, "--must-run", "test_colected.py")
    assert code == 4 and "--must-run: no such test module: test_colected.py" in out, out
