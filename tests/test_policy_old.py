"""The policy and its rule table, pure: each runs in microseconds."""

import itertools

import pytest

from ray_megatron_env.gpus import NodeGpus
from ray_megatron_env.policy import evaluate, gpu_class, rule_for
from ray_megatron_env.rules import (
    ANY, BLACKWELL_OR_NEWER, ENGINE_KINDS, FSDP, INFERENCE, MEGATRON, MUST_BE_1, NO_GPU,
    NOT_1, NOTHING, ONE_OR_32, PRE_BLACKWELL, RULES,
)
from ray_megatron_env.spec import Engine, Spec

V100, T4, A100, L40, H100, B200, GB300 = (7, 0), (7, 5), (8, 0), (8, 9), (9, 0), (10, 0), (10, 3)


def gpus(*caps):
    return NodeGpus.known(caps, "fake")


def megatron(tp=1, cp=1, **flags):
    return Engine("megatron", MEGATRON, tensor_parallel=tp, context_parallel=cp, **flags)


FSDP_ENGINE = Engine("fsdp", FSDP)
VLLM = Engine("vllm", INFERENCE)


def requirement(engines, node):
    return evaluate(Spec.of(engines), node).requirement


@pytest.mark.parametrize("cap", [V100, T4, A100, L40, H100])
@pytest.mark.parametrize("tp,cp", [(2, 1), (1, 2), (8, 4)])
def test_megatron_model_parallel_needs_1_on_every_pre_blackwell_arch(cap, tp, cp):
    verdict = evaluate(Spec.of({"actor": megatron(tp, cp)}), gpus(cap))
    assert verdict.requirement == MUST_BE_1
    assert verdict.findings[0].rule.id == "megatron-model-parallel"
    assert "needs 1" in verdict.reason


@pytest.mark.parametrize("cap", [B200, GB300, (12, 0)])
def test_blackwell_and_later_need_nothing_for_megatron(cap):
    assert requirement({"actor": megatron(4, 2)}, gpus(cap)) == NOTHING


@pytest.mark.parametrize("cap", [V100, H100, B200])
def test_megatron_without_model_parallelism_needs_nothing(cap):
    assert requirement({"actor": megatron(1, 1)}, gpus(cap)) == NOTHING


@pytest.mark.parametrize("flag", ["megatron_fsdp", "torch_fsdp2"])
@pytest.mark.parametrize("cap", [V100, H100, B200])
def test_megatron_fsdp_forbids_1_everywhere(flag, cap):
    assert requirement({"actor": megatron(2, 2, **{flag: True})}, gpus(cap)) == NOT_1


def test_moe_overlap_accepts_1_or_32_before_blackwell():
    assert requirement({"actor": megatron(2, moe_overlap=True)}, gpus(H100)) == ONE_OR_32
    assert requirement({"actor": megatron(2, moe_overlap=True)}, gpus(B200)) == NOTHING


@pytest.mark.parametrize("engine", [FSDP_ENGINE, Engine("veomni", FSDP), Engine("torchtitan", FSDP),
                                    Engine("automodel", FSDP), VLLM, Engine("sglang", INFERENCE)])
@pytest.mark.parametrize("cap", [V100, H100, B200])
def test_fsdp_style_and_inference_engines_forbid_1(engine, cap):
    assert requirement({"critic": engine}, gpus(cap)) == NOT_1


def test_node_without_gpu_needs_nothing_whatever_the_engines():
    verdict = evaluate(Spec.of({"actor": megatron(8), "critic": FSDP_ENGINE}), gpus())
    assert verdict.requirement == NOTHING
    assert {f.rule.id for f in verdict.findings} == {"no-gpu"}
    assert "no NVIDIA GPU" in verdict.reason


def test_mixed_node_is_decided_by_its_oldest_gpu():
    verdict = evaluate(Spec.of({"actor": megatron(2)}), gpus(B200, H100, B200))
    assert verdict.requirement == MUST_BE_1
    assert "9.0 (the oldest of 9.0, 10.0)" in verdict.reason


def test_unknown_gpus_are_treated_conservatively():
    unknown = NodeGpus.unknown("nvml", "boom")
    assert gpu_class(unknown) == PRE_BLACKWELL
    assert requirement({"actor": megatron(2)}, unknown) == MUST_BE_1
    assert requirement({"critic": FSDP_ENGINE}, unknown) == NOT_1


def test_conflict_in_one_env_resolves_to_1_and_says_so():
    verdict = evaluate(Spec.of({"actor": megatron(2), "critic": FSDP_ENGINE}), gpus(A100))
    assert verdict.conflict
    assert verdict.requirement == MUST_BE_1
    assert "conflict" in verdict.reason and "role=" in verdict.reason


def test_moe_overlap_and_fsdp_agree_on_32_instead_of_conflicting():
    verdict = evaluate(Spec.of({"actor": megatron(2, moe_overlap=True), "critic": FSDP_ENGINE}),
                       gpus(H100))
    assert not verdict.conflict
    assert verdict.requirement.accepted == frozenset({32})


def test_same_engine_in_several_roles_shares_one_clause():
    reason = evaluate(Spec.of({"actor": megatron(2), "ref": megatron(2)}), gpus(H100)).reason
    assert "actor and ref (megatron TP=2 CP=1) need 1" in reason


def test_no_engines_in_scope_needs_nothing():
    assert requirement({}, gpus(H100)) == NOTHING


_GPU_CLASSES = [gpus(), gpus(H100), gpus(B200), NodeGpus.unknown("fake", "x")]


@pytest.mark.parametrize("kind", ENGINE_KINDS)
def test_the_rule_table_covers_every_engine_and_node(kind):
    for node, tp, cp, mf, f2, moe in itertools.product(
            _GPU_CLASSES, (1, 2), (1, 2), (False, True), (False, True), (False, True)):
        engine = Engine("x", kind, tp, cp, mf, f2, moe)
        rule = rule_for(engine, gpu_class(node))  # raises if the table has a hole
        assert rule.engine in (ANY, kind)


def test_rule_ids_are_unique_and_every_rule_is_reachable():
    assert len({r.id for r in RULES}) == len(RULES)
    reached = set()
    for kind, node, tp, fsdp, moe in itertools.product(
            ENGINE_KINDS, _GPU_CLASSES, (1, 2), (False, True), (False, True)):
        reached.add(rule_for(Engine("x", kind, tp, 1, fsdp, False, moe), gpu_class(node)).id)
    assert reached == {r.id for r in RULES}


def test_gpu_classes():
    assert gpu_class(gpus()) == NO_GPU
    assert gpu_class(gpus(V100)) == PRE_BLACKWELL
    assert gpu_class(gpus(B200, GB300)) == BLACKWELL_OR_NEWER
