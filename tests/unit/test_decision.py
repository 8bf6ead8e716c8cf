"""Precedence (docs/how-it-works.md#precedence) on top of the policy: one
variable's (decision.settle) and CUDA's, for every node. The record these
build, and its JSON: tests/unit/test_record.py."""

import pytest

from ray_megatron_env.errors import FieldValueError
from ray_megatron_env.node import NodeGpus
from ray_megatron_env.engines import FSDP, MEGATRON
from ray_megatron_env.spec import Engine, Spec

from deciding import decided as decide

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


# --- the one precedence, for every variable (decision.settle) ----------------------
#
# One row per (action, where the value is, strength). The expectations are the
# precedence as docs/how-it-works.md#precedence states it, written out by hand.

from ray_megatron_env.decision import settle  # noqa: E402
from ray_megatron_env.packs.pack import Outcome

V = "SOME_VARIABLE"


def _outcome(action, value=None, strength="required", **kw):
    return Outcome(V, action, value, strength, "row", "because", **kw)


ALL_BUT_1 = frozenset(str(n) for n in range(2, 33))


@pytest.mark.parametrize("outcome,job,node,value,source,write,remove,warns,satisfied", [
    # set: the job's value is kept, a broken demand warned about at its strength
    (_outcome("set", "0"), None, None, "0", "policy", "0", False, None, True),
    (_outcome("set", "0"), "0", None, "0", "explicit", None, False, None, True),
    (_outcome("set", "0"), "1", None, "1", "explicit", None, False, "a required rule", False),
    (_outcome("set", "0", "preferred"), "1", None, "1", "explicit", None, False,
     "a preferred rule", True),
    (_outcome("set", "0"), "1", "0", "1", "explicit", None, False, "a required rule", False),
    # set: the node's value is kept where accepted, replaced where not
    (_outcome("set", "0"), None, "0", "0", "node", None, False, None, True),
    (_outcome("set", "0"), None, "00", "00", "node", None, False, None, True),  # NCCL reads 0
    (_outcome("set", "0"), None, "1", "0", "policy", "0", False, None, True),
    # set without fill: unset is fine, only a refused node value is replaced
    (_outcome("set", "8", accepts=ALL_BUT_1, fill=False), None, None, None, "none", None,
     False, None, True),
    (_outcome("set", "8", accepts=ALL_BUT_1, fill=False), None, "1", "8", "policy", "8",
     False, None, True),
    (_outcome("set", "8", accepts=ALL_BUT_1, fill=False), None, "4", "4", "node", None,
     False, None, True),
    # remove: the job's value goes; the node's cannot, and that is said
    (_outcome("remove", "0"), "0", None, None, "policy", None, True, None, True),
    (_outcome("remove", "0"), None, "0", "0", "node", None, False, "cannot unset", False),
    (_outcome("remove", "0", "preferred"), None, "0", "0", "node", None, False,
     "cannot unset", True),
    (_outcome("remove", "0"), None, None, None, "none", None, False, None, True),
    # keep and leave: whatever is there stays, nothing is written
    (_outcome("keep", "0", "preferred"), "0", None, "0", "explicit", None, False, None, True),
    (_outcome("leave", None, "none"), None, "5", "5", "node", None, False, None, True),
    (_outcome("leave", None, "none"), "5", None, "5", "explicit", None, False, None, True),
    (_outcome("leave", None, "none"), None, None, None, "none", None, False, None, True),
    # a framework's own blanket value is decided anew: written over, or removed
    (_outcome("set", "8", replaces="1"), "1", None, "8", "policy", "8", False, None, True),
    (_outcome("leave", None, "none", replaces="1"), "1", None, None, "none", None, True,
     None, True),
    (_outcome("leave", None, "none", replaces="1"), "1", "4", "4", "node", "4", False, None,
     True),
])
def test_the_precedence_table(outcome, job, node, value, source, write, remove, warns,
                              satisfied):
    settled = settle(outcome, {V: job} if job is not None else {},
                     {V: node} if node is not None else {}, pack="some-pack")
    assert (settled.entry.value, settled.entry.source) == (value, source)
    assert (settled.write, settled.remove) == (write, remove)
    assert settled.satisfied == satisfied
    if warns is None:
        assert settled.warnings == ()
    else:
        assert len(settled.warnings) == 1 and warns in settled.warnings[0]
    assert settled.entry.node_value == node
    assert settled.entry.reason.startswith("because; ") and settled.entry.reason.endswith(".")


def test_a_left_unset_variable_names_its_library_default_where_a_row_allowed_it():
    outcome = _outcome("set", "8", accepts=ALL_BUT_1, fill=False)
    settled = settle(outcome, {}, {}, pack="cuda-connections", default="CUDA's default, 8")
    assert settled.entry.reason == "because; left unset (CUDA's default, 8)."


