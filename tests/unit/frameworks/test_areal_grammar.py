"""areal_grammar.py: AReaL's allocation strings, parsed to the backend and
the TP, CP and EP sizes the rules need. Expected values are AReaL's own
parser's (areal/api/alloc_mode.py, ALLOCATION_GRAMMAR), written by hand."""

import pytest

from ray_megatron_env.errors import FieldTypeError, FieldValueError
from ray_megatron_env.frameworks.areal_grammar import parse_allocation_mode, parse_backend

# (string, backend, TP, CP, EP): the sizes AReaL's own parser gives
# (areal/api/alloc_mode.py run by hand; /tmp/research notes), by hand here.
PARSED = [
    ("fsdp:d4t2", "fsdp", 2, 1, 1),
    ("megatron:d2p2t2c2", "megatron", 2, 2, 1),
    ("megatron:d2p2t4e4", "megatron", 4, 1, 4),
    ("megatron:(attn:d2t2c1|ffn:e4t1)", "megatron", 2, 1, 4),
    ("megatron:(attn:d4p4t2|ffn:d2p4e4)", "megatron", 2, 1, 4),
    ("megatron:attn:d1p12t4|ffn:d1p12e4", "megatron", 4, 1, 4),
    ("archon:(attn:d1p4t2c2|ffn:d1p4t1e4)", "archon", 2, 2, 4),
    ("megatron[actor]:d2t2", "megatron", 2, 1, 1),
    ("megatron : d4 t2", "megatron", 2, 1, 1),
    ("sglang:d4t2", "sglang", 2, 1, 1),
    ("vllm:d2t4p2", "vllm", 4, 1, 1),
]


@pytest.mark.parametrize("text,backend,tp,cp,ep", PARSED)
def test_backend_strings(text, backend, tp, cp, ep):
    found = parse_backend(text, "actor.backend")
    assert (found.backend, found.size("t"), found.size("c"), found.size("e")) == (
        backend, tp, cp, ep)


@pytest.mark.parametrize("text,words", [
    ("megatron.d2t2", "':' after 'megatron'"),  # the old dot separator
    ("d4t2", "bare dimensions"),
    ("torchtitan:d4", "unknown backend 'torchtitan'"),
    ("megatron:", "a training dimension"),
    ("megatron:d0", "a size from 1"),
    ("megatron:d2d2", "'d' is given twice"),
    ("fsdp:d4p2", "fsdp takes only d, t and c"),
    ("sglang:d4c2", "an inference dimension (d, t, p), not 'c'"),
    ("megatron:(attn:d1t2|ffn:e2", "')' closing"),
    ("sglang:d4+fsdp:d4", "'+' belongs only in the deprecated allocation_mode"),
    ("fsdp:d4|fsdp[critic]:d4", "unexpected text"),
    ("", "it is empty"),
])
def test_bad_backend_strings_name_key_and_text(text, words):
    with pytest.raises(FieldValueError) as err:
        parse_backend(text, "actor.backend")
    assert f"actor.backend {text!r}" in str(err.value) and words in str(err.value)


def test_the_deprecated_allocation_mode_lists_each_component_and_who_shares_gpus():
    text = "sglang:d4+megatron[actor]:d2t2|megatron[critic]:d2t2"
    found = [(a.name, a.backend, a.size("t"), colocated)
             for a, colocated in parse_allocation_mode(text)]
    # A component without [name] carries none: the reader gives it its role.
    assert found == [(None, "sglang", 1, False), ("actor", "megatron", 2, False),
                     ("critic", "megatron", 2, True)]


def test_a_non_string_is_refused_naming_the_key():
    with pytest.raises(FieldTypeError, match="allocation_mode"):
        parse_allocation_mode(4)
