"""explanation.py, offline: a node given by ``--gpus`` and/or ``--node``
(inline or a file; the GPUs once), and what ``explain_node``/``explain``
decide there with the job's, the worker's and the node's variables. Expected
decisions are the tables' (docs/rules.md, docs/packs.md). The verb:
tests/unit/test_cli.py."""

import pytest

from ray_megatron_env.errors import FieldValueError
from ray_megatron_env.explanation import explain, explain_node, node_facts

TP2 = {"version": 2, "engines": {"actor": {"strategy": "megatron", "tensor_parallel": 2}}}


@pytest.mark.parametrize("gpus,node,capabilities", [
    ("9.0,9.0", None, ((9, 0), (9, 0))),
    (["8.0", "9.0"], None, ((8, 0), (9, 0))),
    ("none", None, ()),
    (None, '{"gpus": "10.0", "imex_channel": "absent"}', ((10, 0),)),
    ("10.0", ' {"gpus": "10.0"}', ((10, 0),)),   # the same GPUs in both: fine
    ("8.0", '{"p2p": "none"}', ((8, 0),)),       # the GPUs in --gpus, the rest in --node
])
def test_the_nodes_gpus_come_from_either_option(gpus, node, capabilities):
    facts = node_facts(gpus, node)
    assert facts.gpus.capabilities == capabilities
    assert (facts.fabric is None, facts.p2p is None) == (node is None, node is None)


def test_a_node_may_be_a_file(tmp_path):
    path = tmp_path / "gb200.json"
    path.write_text('{"gpus": "10.0,10.0", "imex_channel": "writable"}')
    facts = node_facts(None, str(path))
    assert facts.gpus.capabilities == ((10, 0), (10, 0))
    assert facts.fabric.imex_channel == "writable"


@pytest.mark.parametrize("gpus,node,message", [
    (None, None, "megatron_env: give the node's GPUs with --gpus or --node"),
    ("9.x", None, "megatron_env: --gpus: not a compute capability like '9.0': '9.x'"),
    (None, '{"p2p": "none"}', 'megatron_env: --node has no "gpus"; add it, or give --gpus'),
    ("9.0", '{"gpus": "10.0"}', "megatron_env: --gpus '9.0' and the gpus in --node disagree"),
    (None, "no/such/file.json", "megatron_env: --node 'no/such/file.json' is neither a JSON "
                                "object nor a file"),
    (None, '{"gpus": "10.0", "imex": 1}', "megatron_env: --node: unknown key(s) imex"),
])
def test_a_bad_node_is_the_users_error_naming_the_option(gpus, node, message):
    with pytest.raises(FieldValueError) as caught:
        node_facts(gpus, node)
    assert str(caught.value).startswith(message)


def test_explain_keeps_an_explicit_value_and_records_the_nodes():
    # rules.md: megatron-model-parallel asks 1 (preferred) on a 9.0 node; an
    # explicit value is kept, with a warning.
    decision = explain(TP2, "9.0", explicit="8", node_value="4")
    assert (decision.value, decision.source, decision.node_value) == ("8", "explicit", "4")
    assert "breaks a preferred rule" in decision.warnings[0]
    assert decision.via is None and decision.probe["method"] == "given"


@pytest.mark.parametrize("pack,words", [
    ("nccl-fabric", "no --node given with the fabric facts"),
    ("nccl-host-mem", "no --node given with the peer-access facts"),
])
def test_a_pack_whose_node_facts_were_not_given_leaves_its_variables_alone(pack, words):
    decision = explain(TP2, "10.0", packs=[pack])
    assert decision.warnings and all(words in w for w in decision.warnings)
    assert all(entry.value is None and entry.source == "none"
               for entry in decision.variables.values())


def test_explain_node_writes_what_the_node_would_and_replaces_the_images_arch_list():
    # packs.md, torch-arch misses-node-arch: an image's list without the
    # node's 8.0 is replaced by the node's arch; rules.md: TP=2 on 8.0 asks 1.
    result = explain_node(TP2, "8.0", packs=["torch-arch"],
                          node_env={"TORCH_CUDA_ARCH_LIST": "9.0 10.0"})
    assert {k: v for k, v in result.write.items() if k != "RAY_MEGATRON_ENV_DECISION"} == {
        "CUDA_DEVICE_MAX_CONNECTIONS": "1", "TORCH_CUDA_ARCH_LIST": "8.0"}
    arch = result.decision.variables["TORCH_CUDA_ARCH_LIST"]
    assert (arch.rule, arch.node_value, arch.source) == ("misses-node-arch", "9.0 10.0", "policy")


def test_a_job_env_value_is_explicit():
    decision = explain(TP2, "8.0", packs=["torch-arch"], job_env={"TORCH_CUDA_ARCH_LIST": "8.0"})
    arch = decision.variables["TORCH_CUDA_ARCH_LIST"]
    assert (arch.value, arch.source) == ("8.0", "explicit")
