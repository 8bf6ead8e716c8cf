"""The policy, driven by a golden table written from the upstream sources.

``tests/golden/decisions.yaml`` holds the cases and their expected values
with the source of each; nothing here computes an expectation by calling
the code under test. The structural tests below check the table itself.
"""

import itertools

import pytest
import yaml

from ray_megatron_env.node import parse_gpu_list
from ray_megatron_env.frameworks import parse_field
from ray_megatron_env.node import NodeGpus
from ray_megatron_env.engines import ASSERTS, ENGINE_KINDS, MEGATRON
from ray_megatron_env.packs.connections import (
    ANY, BLACKWELL_OR_NEWER, MUST_BE_1, NO_GPU, NON_CUDA, NOT_1, NOTHING, PRE_BLACKWELL, RULES,
    Rule, gpu_class, hard_conflict_everywhere, rule_for, verdict_for,
)
from ray_megatron_env.spec import Engine, Spec

from deciding import decided as decide
from paths import GOLDEN as GOLDEN_DIR, ROOT

GOLDEN = yaml.safe_load((GOLDEN_DIR / "decisions.yaml").read_text())


def node(gpus: str) -> NodeGpus:
    if gpus == "unknown":
        return NodeGpus.unknown("nvml", "the golden table's failed probe")
    return parse_gpu_list(gpus)


@pytest.mark.parametrize("case", GOLDEN, ids=[case["id"] for case in GOLDEN])
def test_golden_decision(case):
    spec = parse_field({"engines": case["engines"]})
    decision = decide(spec, node(case["gpus"]), explicit=case.get("explicit"),
                      inherited=case.get("node_value"))
    assert decision.value == case["value"], decision.reason
    if "source" in case:
        assert decision.source == case["source"]
    if "strengths" in case:
        assert decision.strengths == case["strengths"]
    if "satisfied" in case:
        assert decision.satisfied == case["satisfied"], decision.warnings
    if "conflict" in case:
        assert decision.conflict == case["conflict"]
    for role in case.get("warns_about", ()):
        assert any(f"{role} (" in w for w in decision.warnings), decision.warnings
    if not case.get("warns_about") and case["gpus"] != "unknown":
        assert decision.warnings == ()


def test_the_golden_table_covers_every_rule():
    seen = set()
    for case in GOLDEN:
        rules = decide(parse_field({"engines": case["engines"]}), node(case["gpus"])).rules
        seen.update(rule_id for ids in rules.values() for rule_id in ids.split("+"))
    assert seen == {rule.id for rule in RULES}


def test_strength_is_said_in_words():
    spec = parse_field({"engines": {"actor": {"strategy": "megatron", "tensor_parallel": 2,
                                              "checks": ["megatron-lm"]},
                                    "critic": {"strategy": "fsdp"}}})
    decision = decide(spec, node("9.0"))
    assert decision.because == {
        "actor": "required: Megatron-LM's argument check (validate_args) asserts it",
        "critic": "preferred: keeps FSDP prefetch and reduce-scatter overlapping compute"}


def test_a_hard_conflict_names_both_roles_both_rules_and_the_fix():
    spec = parse_field({"engines": {
        "actor": {"strategy": "megatron", "tensor_parallel": 2, "checks": ["megatron-lm"]},
        "critic": {"strategy": "megatron", "megatron_fsdp": True, "checks": ["megatron-lm"]}}})
    decision = decide(spec, node("9.0"))
    text = decision.reason + " ".join(decision.warnings)
    for words in ("actor", "critic", "megatron-model-parallel", "megatron-fsdp",
                  "role='critic'", "cannot all hold"):
        assert words in text


# --- the table itself ------------------------------------------------------------

_GPU_CLASSES = [node("none"), node("9.0"), node("10.0"), node("unknown"), node("amd"),
                node("npu"), node("musa")]


@pytest.mark.parametrize("kind", ENGINE_KINDS)
def test_the_rule_table_covers_every_engine_and_node(kind):
    for gpus, tp, cp, mf, f2, moe, dispatcher, pipeline in itertools.product(
            _GPU_CLASSES, (1, 2), (1, 2), (False, True), (False, True), (False, True),
            (None, "deepep", "hybridep"), (None, "ucc")):
        engine = Engine("x", kind, tp, cp, 1, mf, f2, moe, dispatcher=dispatcher,
                        pipeline_backend=pipeline)
        rule = rule_for(engine, gpu_class(gpus))  # raises if the table has a hole
        assert rule.engine in (ANY, kind) and not rule.beside


def test_rule_ids_are_unique_and_every_row_cites_a_source_and_its_checks_exist():
    assert len({r.id for r in RULES}) == len(RULES)
    for rule in RULES:
        assert rule.source and rule.why
        assert set(rule.required_by) <= set(ASSERTS)
        assert bool(rule.preferred_because) == rule.requirement.is_constraint


def test_gpu_classes():
    assert gpu_class(node("none")) == NO_GPU
    assert gpu_class(node("7.0")) == PRE_BLACKWELL
    assert gpu_class(node("10.0,10.3")) == BLACKWELL_OR_NEWER
    assert gpu_class(node("unknown")) == PRE_BLACKWELL
    # Named vendors whose runtimes do not read the variable (docs/rules.md).
    for vendor in ("amd", "npu", "ascend", "musa"):
        assert gpu_class(node(vendor)) == NON_CUDA


def test_a_conflict_that_holds_on_every_gpu_class_is_found():
    # Today's table has none (Megatron's 1 is only asked below major 10), so
    # this uses a table where 1 is required everywhere, as Megatron-Core 0.12's
    # check effectively was for TP > 1.
    always_1 = Rule("always-1", MUST_BE_1, "w", "s", "p", ("megatron-lm",), engine=MEGATRON,
                    model_parallel=True, megatron_fsdp=False, torch_fsdp2=False,
                    moe_overlap=False)
    never_1 = Rule("never-1", NOT_1, "w", "s", "p", ("megatron-lm",), engine=MEGATRON,
                   megatron_fsdp=True)
    rest = Rule("rest", NOTHING, "w", "s")
    table = (never_1, always_1, rest)
    both = Spec.of({"a": Engine("megatron", MEGATRON, 2, checks=("megatron-lm",)),
                    "b": Engine("megatron", MEGATRON, megatron_fsdp=True,
                                checks=("megatron-lm",))})
    assert hard_conflict_everywhere(both, table) is not None
    assert hard_conflict_everywhere(both) is None  # the real table: Blackwell runs it
    assert verdict_for(both, node("9.0")).hard_conflict


# --- Megatron-Bridge's recipes as a peer table ------------------------------------

BRIDGE = yaml.safe_load((GOLDEN_DIR / "bridge_recipes.yaml").read_text())
BRIDGE_GPUS = {"h100": "9.0", "b200": "10.0", "gb200": "10.0"}


def _bridge_spec(case):
    return parse_field({"engines": {"trainer": {"strategy": "megatron", **case["layout"],
                                                "checks": ["megatron-bridge"]}}})


@pytest.mark.parametrize("case", BRIDGE, ids=[case["function"] for case in BRIDGE])
def test_megatron_bridge_recipe(case):
    decision = decide(_bridge_spec(case), node(BRIDGE_GPUS[case["gpu"]]))
    assert decision.value == case["ours"], decision.reason
    assert decision.satisfied and decision.warnings == ()
    recipe = str(case["recipe_value"])
    if "difference" not in case:
        assert case["ours"] == recipe
        return
    assert case["ours"] != recipe
    # Where we leave the value to CUDA, the recipe's own value still breaks
    # none of our rules: set explicitly, it is kept without a warning.
    kept = decide(_bridge_spec(case), node(BRIDGE_GPUS[case["gpu"]]), explicit=recipe)
    assert kept.value == recipe and kept.warnings == () and kept.satisfied


def test_the_bridge_table_spans_h100_b200_gb200_and_every_difference_is_explained():
    assert len(BRIDGE) >= 20
    assert {case["gpu"] for case in BRIDGE} == set(BRIDGE_GPUS)
    assert len({(case["recipe"], case["function"]) for case in BRIDGE}) == len(BRIDGE)
    rules_page = (ROOT / "docs" / "rules.md").read_text()
    for case in BRIDGE:
        if "difference" in case:
            assert f'<a id="bridge-{case["difference"]}"></a>' in rules_page
            assert f'`{case["function"]}`' in rules_page, case["function"]


def test_the_packs_record_detail_reads_back_typed():
    from ray_megatron_env.packs.connections import ConnectionsDetail, RoleDecision

    detail = ConnectionsDetail("1", True, {"actor": RoleDecision(
        "megatron TP=2 CP=1", "megatron-model-parallel", "required", "Megatron-LM asserts")})
    as_json = detail.to_dict()
    assert as_json == {"requirement": "1", "conflict": True, "roles": {"actor": {
        "engine": "megatron TP=2 CP=1", "rule": "megatron-model-parallel",
        "strength": "required", "because": "Megatron-LM asserts"}}}
    assert ConnectionsDetail.from_dict(as_json) == detail
    assert ConnectionsDetail.from_dict({}) == ConnectionsDetail("none", False, {})
