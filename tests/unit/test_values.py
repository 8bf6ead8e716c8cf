"""values.py: one value read from a config, checked, with the key in every
error (docs/field.md#errors: each message starts ``megatron_env: `` and
names the key). Bounds are the field's (docs/field.md) and CUDA's (1 to 32)."""

import pytest

from ray_megatron_env.errors import FieldTypeError, FieldValueError
from ray_megatron_env.values import (
    closest, lookup, not_a_mapping, optional, optional_flag, parse_connections, read_flag,
    read_name, read_names, read_size, read_token, show,
)


@pytest.mark.parametrize("read,value", [
    (read_name, "actor"), (read_name, "Reward_model.v2-b"), (read_name, "a" * 64),
    (read_token, "0"), (read_token, "rollout_standalone_"),
    (read_size, 1), (read_size, 65536),
    (read_flag, True), (read_flag, False),
])
def test_a_good_value_comes_back_as_given(read, value):
    assert read(value, "k") == value


@pytest.mark.parametrize("read,value,error,message", [
    (read_name, 3, FieldTypeError, "megatron_env: k must be a string, got 3 (int)"),
    (read_name, "1st", FieldValueError, "megatron_env: k '1st' is not a valid name"),
    (read_name, "a" * 65, FieldValueError, "is not a valid name"),
    (read_name, "a b", FieldValueError, "is not a valid name"),
    (read_name, "$HOME", FieldValueError, "is not a valid name"),
    (read_token, "", FieldValueError, "megatron_env: k '' must be 1 to 64 letters"),
    (read_size, 0, FieldValueError, "megatron_env: k must be an integer from 1 to 65536, got 0"),
    (read_size, 65537, FieldValueError, "from 1 to 65536, got 65537"),
    (read_size, True, FieldTypeError, "megatron_env: k must be an integer from 1 to 65536, "
                                      "got True (bool)"),
    (read_size, "2", FieldTypeError, "got '2' (str)"),
    (read_flag, "true", FieldTypeError, "megatron_env: k must be true or false, got 'true' (str)"),
    (read_flag, 1, FieldTypeError, "must be true or false, got 1 (int)"),
])
def test_a_bad_value_is_the_documented_error_naming_the_key(read, value, error, message):
    with pytest.raises(error) as caught:
        read(value, "k")
    assert message in str(caught.value)


@pytest.mark.parametrize("read", [read_name, read_token, read_size, read_flag])
def test_an_unresolved_interpolation_is_said_to_be_one(read):
    with pytest.raises(FieldValueError, match=r"megatron_env: k is an unresolved interpolation "
                                              r"'\$\{a\.b\}'; resolve the config on the driver"):
        read("${a.b}", "k")


def test_names_must_each_be_known():
    assert read_names(["b", "a"], "k", ("a", "b"), "check") == ("b", "a")
    with pytest.raises(FieldValueError, match=r"k names unknown check\(s\) \['c'\]; known: a, b"):
        read_names(["a", "c"], "k", ("a", "b"), "check")
    with pytest.raises(FieldTypeError, match=r"k must be a list of check names \(a, b\)"):
        read_names("a", "k", ("a", "b"), "check")


@pytest.mark.parametrize("value,expected", [("1", 1), ("32", 32), ("8", 8)])
def test_a_connections_value_cuda_accepts(value, expected):
    assert parse_connections(value, "env_vars.X") == expected


@pytest.mark.parametrize("value,error", [
    ("0", FieldValueError), ("33", FieldValueError), ("-1", FieldValueError),
    ("1.0", FieldValueError), (" 1", FieldValueError), ("1000", FieldValueError),
    (1, FieldTypeError),
])
def test_a_connections_value_outside_cudas_range_is_refused(value, error):
    with pytest.raises(error, match="env_vars.X"):
        parse_connections(value, "env_vars.X")


def test_a_long_value_is_shown_cut_to_80_characters():
    assert show("x") == "'x'"
    assert show("x" * 78) == repr("x" * 78)  # 80 characters: whole
    assert show("x" * 79) == "'" + "x" * 76 + "..."  # 81: cut
    shown = show("x" * 200)
    assert len(shown) == 80 and shown.endswith("...") and shown.startswith("'xxx")


CONFIG = {"a": {"b": {"c": 3}, "none": None, "list": [1]}}


@pytest.mark.parametrize("path,expected", [
    ("a.b.c", (True, 3)), ("a.b", (True, {"c": 3})), ("a.x", (False, None)),
    ("a.none.c", (False, None)),  # a null section: not there
    ("a.none", (True, None)),
])
def test_lookup_walks_a_dotted_path(path, expected):
    assert lookup(CONFIG, path) == expected


def test_lookup_through_a_value_is_an_error_only_when_strict():
    with pytest.raises(FieldTypeError, match=r"megatron_env: a.list must be a mapping, got \[1\]"):
        lookup(CONFIG, "a.list.x")
    assert lookup(CONFIG, "a.list.x", strict=False) == (False, None)
    with pytest.raises(FieldValueError, match="a is an unresolved interpolation"):
        lookup({"a": "${x}"}, "a.b")


def test_not_a_mapping_names_the_section():
    assert str(not_a_mapping("engines", [])) == "megatron_env: engines must be a mapping, got [] " \
                                                "(list)"


# --- the readers' shared helpers ---------------------------------------------------

SECTIONS = {"trainer": {"colocate": True, "epochs": None, "name": "x"}, "flat": False}


@pytest.mark.parametrize("path,default,expected", [
    ("trainer.colocate", None, True),
    ("trainer.epochs", 3, 3),        # null: the framework's default applies
    ("trainer.missing", "d", "d"),
    ("flat", True, False),           # a false value is a value, not a missing one
])
def test_optional_is_the_value_or_the_default(path, default, expected):
    assert optional(SECTIONS, path, default) == expected


def test_optional_flag_checks_its_type_and_names_the_path():
    assert optional_flag(SECTIONS, "trainer.colocate") is True
    assert optional_flag(SECTIONS, "trainer.epochs", default=True) is True
    assert optional_flag(SECTIONS, "nowhere") is False
    with pytest.raises(TypeError, match="trainer.name"):
        optional_flag(SECTIONS, "trainer.name")


@pytest.mark.parametrize("word,known,expected", [
    ("generater", ("trainer", "generator"), "generator"),
    ("trainer", ("trainer", "generator"), "trainer"),
    ("zzz", ("trainer", "generator"), None),
])
def test_closest_names_the_likely_misspelt_key(word, known, expected):
    assert closest(word, known) == expected
