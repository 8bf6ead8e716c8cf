"""check.py without a cluster: which nodes ``--node`` names, what a probe
actor's answer (or its failure, inside Ray's text) becomes, and a node
report's verdict. The probe actors on live nodes: tests/cluster/test_operator.py
and tests/cluster/test_check_registered.py; the check verb: tests/unit/test_cli.py."""

import json
import re

import pytest

from ray_megatron_env.check import NodeReport, _WorkerView, _report
from ray_megatron_env.record import Decision

ALIVE = [("ab12cd34" + "1" * 48, "10.0.0.7"), ("ab12ff00" + "2" * 48, "10.0.0.8"),
         ("9f00aa11" + "3" * 48, "10.0.0.8")]


@pytest.mark.parametrize("wanted, expected", [
    (["ab12cd34"], [0]),                          # the table's 8 digits
    (["AB12CD34" + "1" * 48], [0]),               # a whole id, any case
    (["ab12"], [0, 1]),                           # a prefix: every node it starts
    (["10.0.0.8"], [1, 2]),                       # an IP: every node there
    (["9f00aa11", "10.0.0.7"], [0, 2]),           # several, in cluster order
    ([" 9f00aa11 ", "9f00"], [2]),                # each node once
])
def test_check_selects_nodes_by_id_prefix_or_ip(wanted, expected):
    from ray_megatron_env.check import select_nodes

    assert select_nodes(ALIVE, wanted) == [ALIVE[i] for i in expected]


@pytest.mark.parametrize("wanted, words", [
    (["ab12cd34", "10.0.0.9"], "'10.0.0.9'; alive: ab12cd34 (10.0.0.7), ab12ff00 (10.0.0.8)"),
    (["cd34"], "'cd34'"),                         # not a prefix
    ([" "], "no node named"),
])
def test_check_refuses_a_node_that_is_not_alive(wanted, words):
    from ray_megatron_env.check import select_nodes
    from ray_megatron_env.errors import NodeSelectionError

    with pytest.raises(NodeSelectionError, match=re.escape(words)):
        select_nodes(ALIVE, wanted)


def test_check_names_the_exception_inside_rays_text():
    # A setup hook that failed: Ray's text ends with its own line about the
    # actor, after the hook's traceback (Ray 2.60).
    from ray_megatron_env.check import _report

    class ActorDiedError(Exception):
        pass

    died = ActorDiedError(
        "The actor died unexpectedly before finishing this task.\n"
        "Worker exit detail: Failed to execute the setup hook method, "
        "ray_megatron_env.setup_hook.setup_hook from ...\nTraceback (most recent call last):\n"
        '  File "x.py", line 1, in find_spec\n'
        "ModuleNotFoundError: No module named 'ray_megatron_env'\n\n"
        "The actor never ran - it was cancelled before it started running.")
    report = _report("n" * 56, "10.0.0.7", died, 60, None)
    assert report.error.startswith("ActorDiedError: the job env's setup hook could not import "
                                   "this package on the node")
    assert "check --ship-package" in report.error
    assert report.error.endswith("(ModuleNotFoundError: No module named 'ray_megatron_env')")
    other = _report("n" * 56, "10.0.0.7", ActorDiedError("a\nValueError: bad\nlast words"),
                    60, None)
    assert other.error == "ActorDiedError: ValueError: bad"


def _record(via="plugin", **changes):
    """A worker's record of version 1 on an H100 node (what a probe actor
    reads back), with ``changes``."""
    return {"value": "1", "source": "policy", "requirement": "1", "gpus": ["9.0"],
            "reason": "compute capability 9.0: set to 1.", "via": via, "satisfied": True,
            "warnings": [], "probe": {"method": "fake", "error": None}, **changes}


@pytest.mark.parametrize("via,registered", [("plugin", True), ("setup-hook", False)])
def test_the_path_that_decided_tells_whether_the_plugin_is_registered(via, registered):
    report = _report("n" * 56, "10.0.0.7", ("1", json.dumps(_record(via))), 60, "h100")
    assert (report.registered, report.value, report.via, report.label) == (
        registered, "1", via, "h100")
    assert report.ok and report.problem() is None and report.advice is None


def test_a_record_without_via_is_the_plugins():
    # Releases before "via" had only the plugin path.
    report = _report("n" * 56, "10.0.0.7", ("1", json.dumps(_record(via=None))), 60, None)
    assert (report.registered, report.via) == (True, "plugin")


@pytest.mark.parametrize("answer,record,problem", [
    (None, None, "no answer within 60 s (node busy or dead?)"),
    ((None, None), None, "no path decided on this node: the plugin is not registered here"),
    (("8", None), _record(satisfied=False, warnings=["actor needs 1 [x]"]), "actor needs 1 [x]"),
    (("8", None), _record(satisfied=False), "the value breaks the requirement"),
    (("1", None), _record(gpus=None, probe={"method": "nvml", "error": "NVML not found"}),
     "the GPU probe failed (NVML not found); the node gets the conservative value"),
])
def test_each_problem_a_node_can_have_is_said(answer, record, problem):
    if record is not None:
        answer = (answer[0], json.dumps(record))
    report = _report("n" * 56, "10.0.0.7", answer, 60, None)
    assert not report.ok and report.problem().startswith(problem)


def test_a_report_as_json_says_its_verdict():
    report = _report("ab" * 28, "10.0.0.7", ("1", json.dumps(_record())), 60, None)
    data = report.to_dict()
    assert (data["ok"], data["via"], data["problem"], data["registered"]) == (
        True, "plugin", None, True)
    assert Decision.from_dict(data["decision"]) == report.decision
    assert NodeReport("ab" * 28, "10.0.0.7", None, None, error="E: x").to_dict()["problem"] == \
        "E: x"


def test_the_probe_actor_reports_what_its_worker_was_started_with(monkeypatch):
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    monkeypatch.delenv("RAY_MEGATRON_ENV_DECISION", raising=False)
    assert _WorkerView().view() == ("1", None)


def test_an_error_without_a_named_exception_is_its_last_line():
    assert _report("n", "ip", RuntimeError("first\n\nthe last words\n"), 60, None).error == \
        "RuntimeError: the last words"
    assert _report("n", "ip", KeyError("x"), 60, None).error == "KeyError: 'x'"
