"""frameworks/chain.py: one file of a ``defaults:`` chain (NeMo-RL's parent
files, ROLL's ``<path>@_here_`` entries), loaded and checked: no loop, a
bounded length, a file that exists and holds a mapping, each failure naming
the chain so far. Messages as frameworks/chain.py writes them; the readers'
own chains: tests/unit/frameworks/test_nemo_rl.py and test_roll.py.
"""

import pytest

from ray_megatron_env.errors import FieldTypeError, FieldValueError
from ray_megatron_env.frameworks.chain import load_link


def write(folder, name, text):
    path = folder / name
    path.write_text(text)
    return str(path)


def test_a_file_that_holds_a_mapping_is_loaded(tmp_path):
    path = write(tmp_path, "base.yaml", "policy:\n  tensor_model_parallel_size: 2\n")
    loaded = load_link(path, [], 8)
    assert loaded.policy.tensor_model_parallel_size == 2


def test_a_file_already_in_the_chain_is_a_loop(tmp_path):
    a = write(tmp_path, "a.yaml", "x: 1\n")
    b = write(tmp_path, "b.yaml", "x: 2\n")
    with pytest.raises(FieldValueError) as info:
        load_link(a, [a, b], 8)
    assert str(info.value) == f"megatron_env: the defaults: chain loops: {a} -> {b} -> {a}"


def test_a_chain_over_its_bound_is_refused(tmp_path):
    a, b, c = (write(tmp_path, f"{n}.yaml", "x: 1\n") for n in "abc")
    with pytest.raises(FieldValueError) as info:
        load_link(c, [a, b], 2)
    assert str(info.value) == ("megatron_env: the defaults: chain is over 2 files long: "
                               f"{a} -> {b} -> {c}")
    assert load_link(b, [a], 2).x == 1  # the second of two files is within the bound


def test_a_missing_file_names_its_entry_and_the_chain(tmp_path):
    a = write(tmp_path, "a.yaml", "defaults: missing.yaml\n")
    missing = str(tmp_path / "missing.yaml")
    with pytest.raises(FieldValueError) as info:
        load_link(missing, [a], 8, entry="missing.yaml")
    assert str(info.value) == (f"megatron_env: config file {missing!r} named in defaults: entry "
                               f"'missing.yaml' does not exist (chain: {a} -> {missing})")
    with pytest.raises(FieldValueError, match="named in defaults: does not exist"):
        load_link(missing, [a], 8)


def test_a_file_that_is_not_a_mapping_or_not_yaml_is_named(tmp_path):
    listed = write(tmp_path, "list.yaml", "- a\n- b\n")
    with pytest.raises(FieldTypeError) as info:
        load_link(listed, [], 8)
    assert f"config file {listed!r} (chain: {listed}) must be a mapping" in str(info.value)
    broken = write(tmp_path, "broken.yaml", "a: [1, 2\n")
    with pytest.raises(FieldValueError, match=r"cannot load config file .*broken\.yaml"):
        load_link(broken, [], 8)
