"""errors.py: each error is the built-in one a caller would catch and a
``MegatronEnvError`` (docs/field.md#errors, docs/cli.md, docs/driver.md),
and the field's errors read as docs/field.md shows them."""

import inspect

import pytest

import ray_megatron_env
from ray_megatron_env import errors

# Each error and the built-in it is, as the docs name them.
BUILT_IN = {
    "FieldTypeError": TypeError,
    "FieldValueError": ValueError,
    "RegistrationError": ValueError,
    "NodeSelectionError": ValueError,
    "EnvironmentVariableError": ValueError,
}


def test_every_error_is_a_megatron_env_error_and_one_built_in_error():
    defined = {name for name, value in vars(errors).items()
               if inspect.isclass(value) and value.__module__ == errors.__name__}
    assert defined == set(BUILT_IN) | {"MegatronEnvError"}
    for name, built_in in BUILT_IN.items():
        error = getattr(errors, name)
        assert issubclass(error, errors.MegatronEnvError) and issubclass(error, built_in), name
        other = ValueError if built_in is TypeError else TypeError
        assert not issubclass(error, other), name


def test_the_base_class_is_neither_built_in_error():
    assert issubclass(errors.MegatronEnvError, Exception)
    assert not issubclass(errors.MegatronEnvError, (TypeError, ValueError))


def test_the_fields_errors_and_their_base_come_from_the_package():
    for name in ("MegatronEnvError", "FieldTypeError", "FieldValueError"):
        assert getattr(ray_megatron_env, name) is getattr(errors, name)


FIELD_MD = [  # docs/field.md#errors, the examples
    ({"engines": {"a": {"strategy": "megatron", "tensor_parallel": "2"}}}, TypeError,
     "megatron_env: engines.a.tensor_parallel must be an integer from 1 to 65536, got '2' (str)"),
    ({"engines": {"a": {"strategy": "megatron", "checks": ["megatron"]}}}, ValueError,
     "megatron_env: engines.a.checks names unknown check(s) ['megatron']; known: megatron-lm, "
     "megatron-bridge"),
]


@pytest.mark.parametrize("engines,built_in,message", FIELD_MD)
def test_a_bad_field_is_caught_as_the_built_in_error_with_the_documented_message(
        engines, built_in, message):
    with pytest.raises(built_in) as caught:
        ray_megatron_env.build_runtime_env({"version": 2, **engines})
    assert isinstance(caught.value, errors.MegatronEnvError)
    assert str(caught.value) == message
