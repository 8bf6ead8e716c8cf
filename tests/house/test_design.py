"""docs/design.md's map of the code is the code's: every module is on it,
and every import (lazy ones, and those within a package, included) points to
a lower floor, so no import runs up and no two modules import each other."""

import ast
import re
from pathlib import Path

import ray_megatron_env

PACKAGE = Path(ray_megatron_env.__file__).parent
MAP = (PACKAGE.parent / "docs" / "design.md").read_text()
MAX_FLOORS = 11


def _module(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, name: str, known: set) -> set:
    """The package's modules ``path`` imports anywhere, TYPE_CHECKING blocks
    left out. ``from pkg import x`` imports the module ``pkg.x`` when there is
    one, else ``pkg`` itself (its ``__init__``): a module that takes a name
    from its own package's ``__init__`` imports it like any other.
    ``import_module``/``__import__`` of a literal, or of ``f".{TABLE[...]}"``
    with ``TABLE`` a module-level dict of names (a lazy registry), count too."""
    tree = ast.parse(path.read_text())
    typing_only = {id(node) for block in ast.walk(tree) if isinstance(block, ast.If)
                   and "TYPE_CHECKING" in ast.unparse(block.test)
                   for stmt in block.body for node in ast.walk(stmt)}
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    tables = {target.id: node.value for node in tree.body if isinstance(node, ast.Assign)
              and isinstance(node.value, ast.Dict) for target in node.targets
              if isinstance(target, ast.Name)}
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                found.add(f"{module}.{alias.name}" if f"{module}.{alias.name}" in known
                          else module)
        elif (isinstance(node, ast.Call) and node.args
              and ast.unparse(node.func) in ("import_module", "importlib.import_module",
                                             "__import__")):
            target = node.args[0]
            if isinstance(target, ast.Constant) and isinstance(target.value, str):
                relative = target.value.startswith(".")
                found.add(".".join(package) + target.value if relative else target.value)
            elif isinstance(target, ast.JoinedStr):
                text = ast.unparse(target)
                table = re.fullmatch(r"f'\.\{(\w+)\[.*\]\}'", text)
                assert table and table.group(1) in tables, (
                    f"{name}: a lazy import the map cannot read: {text}")
                found.update(f"{'.'.join(package)}.{value.value}"
                             for value in tables[table.group(1)].values)
    return {m for m in found & known if m != name}


def _graph() -> dict:
    modules = {_module(p): p for p in PACKAGE.rglob("*.py")}
    return {name: _imports(path, name, set(modules)) for name, path in modules.items()}


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
    upward = [f"{name} (floor {floors[name]}) imports {other} (floor {floors[other]})"
              for name, imported in _graph().items() for other in imported
              if floors[other] >= floors[name]]
    assert upward == []


def test_no_module_reaches_itself():
    """No circle, whatever the map says: from each module, follow its imports."""
    graph = _graph()
    circles = []
    for start in sorted(graph):
        came_from, todo = {}, [(start, other) for other in graph[start]]
        while todo:
            before, module = todo.pop()
            if module in came_from:
                continue
            came_from[module] = before
            if module == start:
                path = [start]
                while len(path) == 1 or path[-1] != start:
                    path.append(came_from[path[-1]])
                circles.append(" <- ".join(path))
                break
            todo.extend((module, other) for other in graph[module])
    assert circles == []


def test_the_map_has_at_most_eleven_floors():
    assert max(_floors().values()) <= MAX_FLOORS
    assert sorted(set(_floors().values())) == list(range(1, max(_floors().values()) + 1))


def test_the_reader_sees_imports_within_a_package(tmp_path):
    """The rule above is only as good as ``_imports``: a reader that takes a
    name from its package's ``__init__``, and a lazy registry, are arrows."""
    known = {"pkg", "pkg.reader", "pkg.registry"}
    reader = tmp_path / "reader.py"
    reader.write_text("from . import Reader\nfrom .registry import x\n")
    assert _imports(reader, "pkg.reader", known) == {"pkg", "pkg.registry"}
    init = tmp_path / "__init__.py"
    init.write_text("from importlib import import_module\n_MODULES = {'a': 'reader'}\n"
                    "def get(n):\n    return import_module(f'.{_MODULES[n]}', __name__)\n"
                    "def lazy():\n    from . import registry\n")
    assert _imports(init, "pkg", known) == {"pkg.reader", "pkg.registry"}
