"""ray_megatron_env/_version.py: the one home of the version. pyproject.toml
takes the package's version from it (setuptools' dynamic ``attr``, read
without importing the package where the module is one literal), and
``ray-megatron-env --version`` prints it."""

import ast
import tomllib
from pathlib import Path

import pytest
from packaging.version import Version

from ray_megatron_env import _version
from ray_megatron_env.cli import main

ROOT = Path(__file__).resolve().parents[2]
MODULE = ROOT / "ray_megatron_env" / "_version.py"


def _literal() -> str:
    """The version as written in _version.py: its docstring, then one
    assignment of a string, nothing else (no import)."""
    docstring, assignment, *rest = ast.parse(MODULE.read_text()).body
    assert isinstance(docstring, ast.Expr) and isinstance(docstring.value, ast.Constant)
    assert rest == [] and isinstance(assignment, ast.Assign)
    assert [ast.unparse(t) for t in assignment.targets] == ["__version__"]
    assert isinstance(assignment.value, ast.Constant) and isinstance(assignment.value.value, str)
    return assignment.value.value


def test_the_module_is_one_literal_and_the_package_reads_it():
    assert _version.__version__ == _literal()


def test_pyproject_takes_the_version_from_this_module():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" in project["project"]["dynamic"]
    assert "version" not in project["project"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "ray_megatron_env._version.__version__"}


def test_the_version_is_a_normalised_pep_440_version():
    assert str(Version(_literal())) == _literal()


def test_the_command_line_prints_it(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"ray-megatron-env {_literal()}\n"
