"""The tables the docs show, rendered from the code: ``docs/rules.md``'s rule
and engine tables and ``docs/packs.md``'s packs (``tests/house/test_docs.py``
keeps each page in step). Tools, not the core: nothing decides with these.
"""

from __future__ import annotations

from typing import Optional

from .engines import ALWAYS_RUN, CHECKS, KNOWN_STRATEGIES
from .packs import get_pack, Pack
from .names import ALWAYS_ON, PACK_NAMES
from .packs.connections import RULES, Rule


def _either(value: Optional[bool], yes: str, no: str) -> str:
    return "any" if value is None else (yes if value else no)


def _strength_words(rule: Rule) -> str:
    if not rule.requirement.is_constraint:
        return "-"
    if set(rule.required_by) & set(ALWAYS_RUN):
        return "required (" + " and ".join(f"`{c}`" for c in rule.required_by) + ": always runs)"
    if rule.required_by:
        return ("required where " + " or ".join(f"`{c}`" for c in rule.required_by) +
                " checks run; else preferred")
    return "preferred"


def markdown_rules() -> str:
    """The rule and engine tables as ``docs/rules.md`` shows them; a test
    keeps the page in step with this module."""
    lines = [
        "| # | rule | applies | engine | GPUs (oldest on the node) | TP or CP > 1 | "
        "Megatron-FSDP | torch FSDP2 | MoE A2A overlap | DeepEP/HybridEP dispatcher | "
        "UCC pipeline | asks | strength | why | source |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for number, rule in enumerate(RULES, 1):
        lines.append(
            f"| {number} | `{rule.id}` | {'beside' if rule.beside else 'first match'} | "
            f"{rule.engine} | {rule.gpus} | "
            f"{_either(rule.model_parallel, 'yes', 'no')} | "
            f"{_either(rule.megatron_fsdp, 'yes', 'no')} | "
            f"{_either(rule.torch_fsdp2, 'yes', 'no')} | "
            f"{_either(rule.moe_overlap, 'yes', 'no')} | {_either(rule.dispatcher, 'yes', 'no')} | "
            f"{_either(rule.ucc_pipeline, 'yes', 'no')} | {rule.requirement.label} | "
            f"{_strength_words(rule)} | {rule.why} | {rule.source} |")
    lines += ["", "| strategy / engine name | kind |", "|---|---|"]
    lines += [f"| `{name}` | {kind} |" for name, kind in sorted(KNOWN_STRATEGIES.items())]
    lines += ["", "| check (`checks` in the compact form) | what it is |", "|---|---|"]
    lines += [f"| `{name}` | {words} |" for name, words in CHECKS.items()]
    lines += [f"| `{name}` (never listed: always runs) | {words} |"
              for name, words in ALWAYS_RUN.items()]
    return "\n".join(lines)


def markdown_table(pack: Pack) -> str:
    """A pack's rows as ``docs/packs.md`` shows them (a test keeps it in step),
    with a column for what a node's nccl.conf means where the rows say."""
    conf = any(row.conf for row in pack.rows)
    lines = ["| # | row | when | action | variables | strength | why | source |" +
             (" a node's nccl.conf |" if conf else ""),
             "|---|---|---|---|---|---|---|---|" + ("---|" if conf else "")]
    for number, row in enumerate(pack.rows, 1):
        values = ", ".join(f"`{var}={val}`" if val else f"`{var}`" for var, val in row.values)
        lines.append(f"| {number} | `{row.id}` | {row.when} | {row.action} | {values or '-'} | "
                     f"{row.strength} | {row.why} | {row.source} |" +
                     (f" {row.conf or '-'} |" if conf else ""))
    return "\n".join(lines)


def markdown_packs() -> str:
    """Every pack: what it owns and reads, and its table."""
    out = []
    for name in PACK_NAMES:
        pack = get_pack(name)
        on = "always on" if name in ALWAYS_ON else f"opt-in, `packs: [{name}]`"
        defaults = dict(pack.defaults)
        variables = "; ".join(f"`{v}`: {defaults[v]}" if v in defaults else f"`{v}`"
                              for v in pack.variables)
        out += [f"### `{name}`: {on}",
                f"{pack.summary} **Variables, with the library's default when unset:** "
                f"{variables}. **Node facts:** "
                f"{'; '.join(pack.node_facts)}. **Config facts:** {'; '.join(pack.config_facts)}."]
        # The always-on pack's table, with every condition, is rules.md's alone.
        table = ("Its rows, with every condition, are in [rules.md](rules.md#the-table)."
                 if name in ALWAYS_ON else markdown_table(pack))
        out += ["", table, ""]
    return "\n".join(out).rstrip()
