"""frameworks/reader.py: what a framework reader is. ``has_path`` finds a
dotted path in a plain config (a null section or a value on the way: not
found, never an error, since it only detects a layout), and a reader's
``evidence`` is which of its markers a config has, in the reader's order.
"""

import pytest

from ray_megatron_env.frameworks.reader import Reader, has_path
from ray_megatron_env.frameworks.verl import READER as VERL


@pytest.mark.parametrize("config,path,found", [
    ({"a": {"b": {"c": 1}}}, "a.b.c", True),
    ({"a": {"b": {"c": None}}}, "a.b.c", True),  # present, even if null
    ({"a": {"b": {}}}, "a.b.c", False),
    ({"a": None}, "a.b", False),  # a null section on the way
    ({"a": 3}, "a.b", False),  # a value on the way
    ({"a": "${x}"}, "a.b", False),  # an unresolved interpolation on the way
    ({}, "a", False),
])
def test_has_path(config, path, found):
    assert has_path(config, path) is found


def test_evidence_is_the_markers_a_config_has_in_the_readers_order():
    reader = Reader("x", ("a.b", "c", "d"), read=lambda config: None, roles=(), paths=())
    assert reader.evidence({"d": 1, "a": {"b": 2}}) == ("a.b", "d")
    assert reader.evidence({"a": 3, "e": 1}) == ()
    assert reader.convert is None and reader.compose is None and reader.unsupported == ()


def test_verls_marker_is_actor_rollout_ref():
    assert VERL.evidence({"actor_rollout_ref": {}, "trainer": {}}) == ("actor_rollout_ref",)
    assert VERL.evidence({"trainer": {"nnodes": 1}}) == ()
