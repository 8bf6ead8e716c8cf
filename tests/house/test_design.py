"""docs/design.md's map of the code is the code's: every module is on it,
and every import (lazy ones included) points to a lower floor."""

import ast
import re
from pathlib import Path

import ray_megatron_env

PACKAGE = Path(ray_megatron_env.__file__).parent
MAP = (PACKAGE.parent / "docs" / "design.md").read_text()


def _module(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, name: str, known: set) -> set:
    """The package's modules ``path`` imports anywhere, TYPE_CHECKING blocks left out."""
    tree = ast.parse(path.read_text())
    typing_only = {id(node) for block in ast.walk(tree) if isinstance(block, ast.If)
                   and "TYPE_CHECKING" in ast.unparse(block.test)
                   for stmt in block.body for node in ast.walk(stmt)}
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    # A module's own package (its __init__) is where it is registered, not a dependency.
    return {m for m in found & known if m != name and not name.startswith(m + ".")}


def _floors() -> dict:
    table = MAP.split("<!-- map:begin -->", 1)[1].split("<!-- map:end -->", 1)[0]
    floors = {}
    for line in table.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].isdigit():
            for module in re.findall(r"`([\w.]+)`", cells[1]):
                floors[f"ray_megatron_env.{module}" if module != "ray_megatron_env"
                       else module] = int(cells[0])
    return floors


def test_the_map_lists_every_module_once():
    modules = {_module(p) for p in PACKAGE.rglob("*.py")}
    assert set(_floors()) == modules


def test_every_import_points_to_a_lower_floor():
    floors = _floors()
    modules = {_module(p): p for p in PACKAGE.rglob("*.py")}
    upward = [f"{name} (floor {floors[name]}) imports {other} (floor {floors[other]})"
              for name, path in modules.items()
              for other in _imports(path, name, set(modules))
              if floors[other] >= floors[name]]
    assert upward == []
