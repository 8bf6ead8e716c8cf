"""Docs that are generated from code must match it."""

from pathlib import Path

import importlib

from ray_megatron_env.packs import markdown_packs
from ray_megatron_env.packs.connections import markdown_tables
from reliability_cases import FAULTS, render

DOCS = Path(__file__).parent.parent / "docs"


def between(text: str, name: str) -> str:
    return text.split(f"<!-- {name}:begin -->\n", 1)[1].split(f"\n<!-- {name}:end -->", 1)[0]


def test_rules_page_shows_the_rule_table_in_code():
    assert between((DOCS / "rules.md").read_text(), "rules") == markdown_tables()


def test_packs_page_shows_every_pack_table_in_code():
    assert between((DOCS / "packs.md").read_text(), "packs") == markdown_packs()


def test_reliability_page_shows_every_case_tried():
    assert between((DOCS / "reliability.md").read_text(), "cases") == render()


def test_every_test_the_reliability_page_names_exists():
    for fault in FAULTS:
        for test in fault.tests:
            module, _, function = test.partition("::")
            assert hasattr(importlib.import_module(module.removesuffix(".py")), function), test
