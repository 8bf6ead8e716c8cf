"""Precedence (docs/how-it-works.md#precedence) on top of the policy, and the decision's JSON."""

import json

import pytest

from ray_megatron_env.decision import Decision, decide
from ray_megatron_env.errors import FieldValueError
from ray_megatron_env.gpus import NodeGpus
from ray_megatron_env.rules import FSDP, MEGATRON
from ray_megatron_env.spec import Engine, Spec

H100 = NodeGpus.known([(9, 0), (9, 0)], "fake")
B200 = NodeGpus.known([(10, 0)], "fake")
NO_GPU = NodeGpus.known([], "fake")
MEGATRON_TP2 = Spec.of({"actor": Engine("megatron", MEGATRON, tensor_parallel=2)})
MEGATRON_TP1 = Spec.of({"actor": Engine("megatron", MEGATRON)})
FSDP_CRITIC = Spec.of({"critic": Engine("fsdp", FSDP)})


@pytest.mark.parametrize("spec,node,explicit,inherited,value,source,warns", [
    # 1. explicit env_vars: always kept; a warning when it breaks a requirement
    (MEGATRON_TP2, H100, "1", None, "1", "explicit", False),
    (MEGATRON_TP2, H100, "8", None, "8", "explicit", True),
    (FSDP_CRITIC, H100, "1", None, "1", "explicit", True),
    (FSDP_CRITIC, H100, "4", "1", "4", "explicit", False),
    (MEGATRON_TP2, NO_GPU, "8", None, "8", "explicit", False),
    # 2. the policy's hard requirement
    (MEGATRON_TP2, H100, None, None, "1", "policy", False),
    # 3. the node's inherited value: kept when it satisfies, replaced otherwise
    (MEGATRON_TP2, H100, None, "1", "1", "node", False),
    (MEGATRON_TP2, H100, None, "4", "1", "policy", False),
    (FSDP_CRITIC, H100, None, "1", "8", "policy", False),
    (FSDP_CRITIC, H100, None, "4", "4", "node", False),
    (MEGATRON_TP1, H100, None, "1", "1", "node", False),
    (MEGATRON_TP2, B200, None, "32", "32", "node", False),
    (MEGATRON_TP2, H100, None, "junk", "1", "policy", True),
    (MEGATRON_TP1, H100, None, "junk", "junk", "node", True),
    # 4. otherwise unset
    (MEGATRON_TP2, B200, None, None, None, "none", False),
    (MEGATRON_TP1, H100, None, None, None, "none", False),
    (FSDP_CRITIC, H100, None, None, None, "none", False),
    (MEGATRON_TP2, NO_GPU, None, None, None, "none", False),
])
def test_precedence(spec, node, explicit, inherited, value, source, warns):
    decision = decide(spec, node, explicit=explicit, inherited=inherited)
    assert (decision.value, decision.source) == (value, source)
    assert bool(decision.warnings) == warns
    assert decision.reason.endswith(".")
    assert decision.node_value == inherited


def test_a_broken_requirement_names_the_role_in_the_warning():
    decision = decide(FSDP_CRITIC, H100, explicit="1")
    assert "critic" in decision.warnings[0] and "not 1" in decision.warnings[0]


def test_a_bad_explicit_value_is_an_error():
    with pytest.raises(FieldValueError, match="from 1 to 32"):
        decide(MEGATRON_TP2, H100, explicit="64")


def test_probe_failure_is_recorded_and_warned():
    failed = NodeGpus.unknown("nvidia-smi", "nvidia-smi did not answer within 3 s")
    decision = decide(MEGATRON_TP2, failed)
    assert decision.value == "1"
    assert decision.gpus is None
    assert decision.probe["error"] == "nvidia-smi did not answer within 3 s"
    assert "treated as pre-Blackwell" in decision.warnings[0]


def test_decision_round_trips_through_json():
    decision = decide(MEGATRON_TP2, H100, inherited="4")
    data = json.loads(decision.to_json())
    assert data["value"] == "1" and data["gpus"] == ["9.0", "9.0"]
    assert data["engines"] == {"actor": "megatron TP=2 CP=1"}
    assert data["rules"] == {"actor": "megatron-model-parallel"}
    assert Decision.from_json(decision.to_json()) == decision


def test_json_has_no_dollar_sign_for_ray_to_expand():
    # Ray runs os.path.expandvars on env_vars values in the worker.
    node = NodeGpus.unknown("nvidia-smi", "unexpected output '$HOME ${PATH}'")
    text = decide(MEGATRON_TP2, node).to_json()
    assert "$" not in text
    assert "$HOME ${PATH}" in Decision.from_json(text).probe["error"]
