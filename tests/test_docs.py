"""Docs that are generated from code must match it."""

from pathlib import Path

from ray_megatron_env.rules import markdown_tables

DOCS = Path(__file__).parent.parent / "docs"


def between(text: str, name: str) -> str:
    return text.split(f"<!-- {name}:begin -->\n", 1)[1].split(f"\n<!-- {name}:end -->", 1)[0]


def test_rules_page_shows_the_rule_table_in_code():
    assert between((DOCS / "rules.md").read_text(), "rules") == markdown_tables()
