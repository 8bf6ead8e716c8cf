"""tests/unit mirrors the package, so a module's tests are found by its name
(issue 39): ``ray_megatron_env/<path>/<name>.py`` has them in
``tests/unit/<path>/test_<name>.py``. A test file there that mirrors no
module is topical and says so: its docstring's first line starts
``Topical:``.

The mirror of a module (``mirror`` below):

- ``ray_megatron_env/a/b.py`` -> ``tests/unit/a/test_b.py``;
- a package, ``ray_megatron_env/a/__init__.py`` -> ``tests/unit/a/test_a.py``,
  beside its modules' tests; the top package's -> ``tests/unit/test_package.py``;
- underscores around a name go: ``_version.py`` -> ``test_version.py``,
  ``__main__.py`` -> ``test_main.py``.
"""

import ast
from pathlib import Path

import pytest

import ray_megatron_env

PACKAGE = Path(ray_megatron_env.__file__).parent
ROOT = PACKAGE.parent
UNIT = ROOT / "tests" / "unit"
SHARE = 0.9  # of the modules that must have a mirror (issue 39)


def mirror(module: Path) -> Path:
    """The test file of ``module``, a path relative to the repository root."""
    *folders, name = module.relative_to(PACKAGE.name).with_suffix("").parts
    if name == "__init__":
        name = folders[-1] if folders else "package"
    return Path("tests", "unit", *folders, f"test_{name.strip('_')}.py")


def _files(folder: Path, pattern: str) -> list:
    """The files under ``folder`` named like ``pattern``, relative to the repository."""
    return sorted(p.relative_to(ROOT) for p in folder.rglob(pattern))


def _modules() -> list:
    return _files(PACKAGE, "*.py")


@pytest.mark.parametrize("module,expected", [
    ("ray_megatron_env/cache.py", "tests/unit/test_cache.py"),
    ("ray_megatron_env/packs/pack.py", "tests/unit/packs/test_pack.py"),
    ("ray_megatron_env/packs/__init__.py", "tests/unit/packs/test_packs.py"),
    ("ray_megatron_env/__init__.py", "tests/unit/test_package.py"),
    ("ray_megatron_env/__main__.py", "tests/unit/test_main.py"),
    ("ray_megatron_env/_version.py", "tests/unit/test_version.py"),
])
def test_the_mirror_of_each_kind_of_module(module, expected):
    assert mirror(Path(module)) == Path(expected)


def test_no_two_modules_share_a_mirror():
    mirrors = [mirror(module) for module in _modules()]
    assert sorted({m for m in mirrors if mirrors.count(m) > 1}) == []


def test_most_modules_have_a_test_file_of_their_name():
    modules = _modules()
    missing = [f"{module} -> {mirror(module)}" for module in modules
               if not (ROOT / mirror(module)).is_file()]
    have = len(modules) - len(missing)
    print(f"{have} of {len(modules)} modules ({have / len(modules):.0%}) have a test file of "
          "their name; missing:", *missing, sep="\n  ")
    assert have >= SHARE * len(modules), (
        f"{have} of {len(modules)} modules have a test file of their name, under {SHARE:.0%} "
        "(the captured stdout lists the missing ones)")


def test_a_test_file_that_mirrors_no_module_says_it_is_topical():
    mirrors = {mirror(module) for module in _modules()}
    unsaid = []
    for path in _files(UNIT, "test_*.py"):
        if path in mirrors:
            continue
        docstring = ast.get_docstring(ast.parse((ROOT / path).read_text())) or ""
        if not docstring.startswith("Topical:"):
            unsaid.append(f"{path}: {docstring.splitlines()[0] if docstring else '(no docstring)'}")
    assert unsaid == [], "not a module's mirror, and not said to be topical:\n  " + \
        "\n  ".join(unsaid)
