"""``--must-run PATH``: a test module whose skip fails the run.

The framework-package tests (``tests/packages/``) skip where their framework
does not import, as on a developer's machine. ``.ci/run`` installs each
framework in the venv that runs its test and names the module here, so a
skip there (a broken install, a moved module) fails CI instead of passing it
by. A skip at collection (a module-level ``importorskip``) becomes a
collection error; one in a fixture or a test becomes a failure. A path that
names no file is a usage error, so a typo cannot turn the check off.
Loaded by the root ``conftest.py`` (``pytest_plugins``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Set

import pytest

OPTION = "--must-run"


def pytest_addoption(parser: Any) -> None:
    parser.addoption(OPTION, action="append", default=[], metavar="PATH",
                     help="a test module (path from the rootdir) that must run: a skip in it "
                          "fails the run (.ci/run, where the module's framework is installed)")


def pytest_configure(config: Any) -> None:
    missing = [path for path in config.getoption("must_run")
               if not (config.rootpath / path).is_file()]
    if missing:
        raise pytest.UsageError(f"{OPTION}: no such test module: {', '.join(missing)}")


def _must_run(config: Any) -> Set[Path]:
    return {(config.rootpath / path).resolve() for path in config.getoption("must_run")}


def _fail_a_skip(config: Any, report: Any, path: Path) -> None:
    if not report.skipped or Path(path).resolve() not in _must_run(config):
        return
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    report.outcome = "failed"
    report.longrepr = (f"{os.path.relpath(path, config.rootpath)} skipped ({reason}), but "
                       f"{OPTION} names it: its framework should be installed here")


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: Any) -> Any:
    outcome = yield
    _fail_a_skip(collector.config, outcome.get_result(), collector.path)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: Any, call: Any) -> Any:
    outcome = yield
    _fail_a_skip(item.config, outcome.get_result(), item.path)
