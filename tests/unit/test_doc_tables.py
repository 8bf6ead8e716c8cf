"""doc_tables.py, the tables docs/rules.md and docs/packs.md show, rendered
from the code. That the pages hold exactly these: tests/house/test_docs.py;
here, how one table is drawn, on hand-built rows and on a few real ones
(their words as docs/rules.md and docs/packs.md print them)."""

import pytest

from ray_megatron_env.doc_tables import (
    _either, _strength_words, markdown_packs, markdown_rules, markdown_table,
)
from ray_megatron_env.packs.connections import RULES
from ray_megatron_env.packs.pack import Pack, PackRow

RULES_HEADER = (
    "| # | rule | applies | engine | GPUs (oldest on the node) | TP or CP > 1 | Megatron-FSDP | "
    "torch FSDP2 | MoE A2A overlap | DeepEP/HybridEP dispatcher | UCC pipeline | asks | "
    "strength | why | source |")


@pytest.mark.parametrize("value,words", [(None, "any"), (True, "yes"), (False, "no")])
def test_a_condition_reads_any_yes_or_no(value, words):
    assert _either(value, "yes", "no") == words


@pytest.mark.parametrize("rule,words", [
    ("megatron-core-ucc-pipeline", "required (`megatron-core`: always runs)"),
    ("megatron-fsdp", "required where `megatron-lm` or `megatron-bridge` checks run; "
                      "else preferred"),
    ("fsdp-style", "preferred"),
    ("megatron-blackwell", "-"),  # asks nothing
])
def test_a_rules_strength_in_words(rule, words):
    assert _strength_words({r.id: r for r in RULES}[rule]) == words


def test_the_rule_table_has_one_numbered_row_per_rule_in_order():
    lines = markdown_rules().splitlines()
    assert lines[0] == RULES_HEADER
    rows = lines[2:len(RULES) + 2]
    assert lines[len(RULES) + 2] == ""  # then the engine table
    assert [row.split(" | ")[1] for row in rows] == [f"`{rule.id}`" for rule in RULES]
    assert [row.split(" | ")[0] for row in rows] == [f"| {n}" for n in range(1, len(RULES) + 1)]
    fsdp = next(row for row in rows if "`fsdp-style`" in row)
    assert " | first match | fsdp | any | any | any | any | any | any | any | not 1 | " \
           "preferred | " in fsdp


def test_the_engine_and_check_tables_follow_the_rules():
    text = markdown_rules()
    assert "\n| strategy / engine name | kind |\n|---|---|\n| `automodel` | fsdp |\n" in text
    assert "\n| `megatron-core` (never listed: always runs) | Megatron-Core's " \
           "initialize_model_parallel asserts it (in every framework) |" in text


def _pack(*rows):
    return Pack("p", "s", ("A", "B"), ("f",), ("c",), rows, lambda *a: None)


def test_a_packs_table_draws_each_row_and_its_values():
    pack = _pack(PackRow("r1", "always", "set", (("A", "0"), ("B", "")), "required", "w", "src"),
                 PackRow("r2", "never", "leave", (), "none", "w2", "src2"))
    assert markdown_table(pack).splitlines() == [
        "| # | row | when | action | variables | strength | why | source |",
        "|---|---|---|---|---|---|---|---|",
        "| 1 | `r1` | always | set | `A=0`, `B` | required | w | src |",
        "| 2 | `r2` | never | leave | - | none | w2 | src2 |"]


def test_a_column_for_nccl_conf_only_where_a_row_says_what_it_means():
    pack = _pack(PackRow("r1", "w", "set", (("A", "0"),), "required", "y", "s", conf="c1"),
                 PackRow("r2", "w", "set", (("A", "1"),), "required", "y", "s"))
    lines = markdown_table(pack).splitlines()
    assert lines[0].endswith("| source | a node's nccl.conf |") and lines[1].endswith("---|---|")
    assert lines[2].endswith("| s | c1 |") and lines[3].endswith("| s | - |")


def test_every_pack_has_a_section_and_only_the_always_on_one_points_to_rules_md():
    text = markdown_packs()
    headings = [line for line in text.splitlines() if line.startswith("### ")]
    assert headings == ["### `cuda-connections`: always on",
                        "### `nccl-fabric`: opt-in, `packs: [nccl-fabric]`",
                        "### `nccl-host-mem`: opt-in, `packs: [nccl-host-mem]`",
                        "### `torch-arch`: opt-in, `packs: [torch-arch]`",
                        "### `te-fp8-scales`: opt-in, `packs: [te-fp8-scales]`",
                        "### `fla-backend`: opt-in, `packs: [fla-backend]`",
                        "### `net-ifaces`: opt-in, `packs: [net-ifaces]`"]
    assert text.count("Its rows, with every condition, are in [rules.md](rules.md#the-table).") == 1
    assert ("**Variables, with the library's default when unset:** "
            "`CUDA_DEVICE_MAX_CONNECTIONS`: CUDA's default, 8.") in text
