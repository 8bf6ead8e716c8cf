"""Docs that are generated from code must match it; every link in them, and
every page or anchor the code names, must resolve."""

import importlib.util
import re
from pathlib import Path

from ray_megatron_env.doc_tables import markdown_packs, markdown_rules
from reliability_cases import FAULTS, render
from paths import ROOT, TESTS

DOCS = ROOT / "docs"


def between(text: str, name: str) -> str:
    return text.split(f"<!-- {name}:begin -->\n", 1)[1].split(f"\n<!-- {name}:end -->", 1)[0]


def test_rules_page_shows_the_rule_table_in_code():
    assert between((DOCS / "rules.md").read_text(), "rules") == markdown_rules()


def test_packs_page_shows_every_pack_table_in_code():
    assert between((DOCS / "packs.md").read_text(), "packs") == markdown_packs()


def test_reliability_page_shows_every_case_tried():
    assert between((DOCS / "reliability.md").read_text(), "cases") == render()


def test_every_test_the_reliability_page_names_exists():
    # Each names a module by its path under tests/, loaded from that file.
    modules = {}
    for fault in FAULTS:
        for test in fault.tests:
            path, _, function = test.partition("::")
            if path not in modules:
                spec = importlib.util.spec_from_file_location(
                    "named_" + path.removesuffix(".py").replace("/", "_"), TESTS / path)
                modules[path] = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(modules[path])
            assert hasattr(modules[path], function), test


# Relative links: every one in the pages and README.md, and every page and
# heading anchor the code and tests name, must reach a file and a heading.

ROOT = DOCS.parent


def anchors(markdown: str) -> set[str]:
    """GitHub's heading ids: lowercase, punctuation but '-' and '_' dropped,
    spaces to '-', a repeated id suffixed -1, -2, ..."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in markdown.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        heading = None if fenced else re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.group(1))
            slug = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
            found.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
            seen[slug] = seen.get(slug, 0) + 1
    return found


def links(markdown: str):
    """(line number, target) of every inline link outside code."""
    fenced = False
    for number, line in enumerate(markdown.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            for target in re.findall(r"\]\(([^)\s]+)\)", re.sub(r"`[^`]*`", "", line)):
                yield number, target


def broken_links(page: Path) -> list[str]:
    bad = []
    for number, target in links(page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue                      # http:, https:, mailto:
        path, _, fragment = target.partition("#")
        dest = (page.parent / path) if path else page
        if not dest.exists():
            bad.append(f"{page.name}:{number}: {target}: no such file")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest.read_text()):
            bad.append(f"{page.name}:{number}: {target}: no such heading")
    return bad


def test_every_relative_link_in_the_docs_resolves():
    pages = sorted(DOCS.glob("*.md")) + [ROOT / "README.md"]
    assert [bad for page in pages for bad in broken_links(page)] == []


def test_every_docs_anchor_the_code_names_exists():
    bad = []
    sources = [*sorted((ROOT / "ray_megatron_env").rglob("*.py")),
               *sorted((ROOT / "tests").rglob("*.py")), *sorted((ROOT / "benchmarks").rglob("*.py")),
               ROOT / "conftest.py", ROOT / "pyproject.toml", ROOT / ".ci" / "run"]
    for source in sources:
        for page, fragment in re.findall(r"\bdocs/([\w-]+\.md)(?:#([\w-]+))?", source.read_text()):
            if not (DOCS / page).exists():
                bad.append(f"{source.relative_to(ROOT)}: docs/{page}: no such file")
            elif fragment and fragment not in anchors((DOCS / page).read_text()):
                bad.append(f"{source.relative_to(ROOT)}: docs/{page}#{fragment}: no such heading")
    assert bad == []


def test_the_link_check_finds_a_broken_link(tmp_path):
    (tmp_path / "a.md").write_text(
        "# A page\n\n## Two `paths`, here\n\n## Same\n\n## Same\n\n```\n## Not a heading\n```\n")
    (tmp_path / "b.md").write_text(
        "[ok](a.md#two-paths-here) [ok](a.md#same-1) [ok](a.md) [ok](https://x.org/y#z)\n"
        "[gone](a.md#two-paths) [gone](a.md#same-2) [gone](a.md#not-a-heading) [gone](c.md)\n"
        "`[code](c.md)`\n")
    assert [b.split(": ", 2)[1] for b in broken_links(tmp_path / "b.md")] == [
        "a.md#two-paths", "a.md#same-2", "a.md#not-a-heading", "c.md"]


# Every page is reachable from the reading order (docs/README.md), link by link.

def test_every_page_is_reachable_from_the_reading_order():
    seen, todo = set(), [DOCS / "README.md"]
    while todo:
        page = todo.pop()
        if page in seen:
            continue
        seen.add(page)
        for _, target in links(page.read_text()):
            path = target.partition("#")[0]
            if path.endswith(".md") and not re.match(r"[a-z]+:", path):
                dest = (page.parent / path).resolve()
                if dest.parent == DOCS.resolve() and dest.exists():
                    todo.append(dest)
    assert sorted(p.name for p in DOCS.glob("*.md")) == sorted(p.name for p in seen)


# cli.md's console samples are what the CLI prints. A block after
# "<!-- sample -->" is a command (no cluster) and its stdout, run here; the
# block after "<!-- sample: check -->" is check's table for six fixed nodes,
# rendered by check's own formatter.

SAMPLE = re.compile(r"<!-- sample(?:: (\w+))? -->\n```console\n(.*?)\n```", re.S)
EXAMPLE = ROOT / "ray_megatron_env" / "examples" / "verl_megatron.yaml"


def check_sample() -> str:
    from ray_megatron_env.check import NodeReport
    from ray_megatron_env.cli import format_check
    from ray_megatron_env.decision import decide_node
    from ray_megatron_env.frameworks import parse_field
    from ray_megatron_env.node import NodeFacts, NodeGpus, parse_gpu_list
    from ray_megatron_env.runtime_env import build_runtime_env

    spec = parse_field(build_runtime_env(str(EXAMPLE), role="actor")["megatron_env"])

    def node(name, gpus=None, via=None, error=None):
        decision = None if gpus is None else decide_node(
            spec, NodeFacts(gpus if isinstance(gpus, NodeGpus) else parse_gpu_list(gpus)),
            {}, {}, via=via).decision
        return NodeReport(name * 7, f"10.0.0.{name[-1]}", None if error else via == "plugin",
                          decision.value if decision else None, decision, error)

    failed = NodeGpus.unknown("nvml", "CUDA_VISIBLE_DEVICES names device 5, but the node has "
                                      "2 GPU(s)")
    return "$ ray-megatron-env check --config ppo.yaml --role actor\n" + format_check([
        node("aaaa1111", "none", "plugin"), node("bbbb2222", "9.0,9.0", "plugin"),
        node("cccc3333", "8.0", "setup-hook"), node("dddd4444"),
        node("eeee5555", failed, "plugin"),
        node("ffff6666", error="no answer within 60 s (node busy or dead?)")])


def test_every_cli_sample_is_what_the_cli_prints(capsys, monkeypatch):
    import shlex

    from ray_megatron_env.cli import main

    monkeypatch.chdir(ROOT)
    monkeypatch.delenv("RAY_RUNTIME_ENV_PLUGINS", raising=False)
    found = SAMPLE.findall((DOCS / "cli.md").read_text())
    assert {name for name, _ in found} == {"", "check"} and len(found) >= 4
    for name, block in found:
        if name == "check":
            assert block == check_sample()
            continue
        command, _, shown = block.partition("\n")
        assert command.startswith("$ ray-megatron-env "), command
        main(shlex.split(command)[2:])
        assert capsys.readouterr().out.rstrip("\n") == shown, command


# The size the standards set: how-it-works.md fits one screen, and README.md
# with docs/ stays within 3,600 lines (as `wc -l README.md docs/*.md` counts).

def test_the_docs_stay_within_their_size():
    lines = {str(page.relative_to(ROOT)): page.read_text().count("\n")
             for page in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]}
    assert lines["docs/how-it-works.md"] <= 250
    assert sum(lines.values()) <= 3600, lines
