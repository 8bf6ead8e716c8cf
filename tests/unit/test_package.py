"""The package's face (ray_megatron_env/__init__.py): the public names
(README, docs/field.md, docs/record.md), each loaded from its own module on
first use, so that importing the package (as Ray's agent does on every node,
for the plugin) loads nothing else."""

import subprocess
import sys
from importlib import import_module

import pytest

import ray_megatron_env

# The public names and the module each lives in.
PUBLIC = {
    "__version__": "_version",
    "build_runtime_env": "runtime_env",
    "check_cluster": "check",
    "explain": "explanation",
    "read_decision": "record",
    "Decision": "record",
    "MegatronEnvError": "errors",
    "FieldTypeError": "errors",
    "FieldValueError": "errors",
}


def _loaded_after(statement: str) -> list:
    code = (f"import sys; {statement}; "
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('ray_megatron_env'))))")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.split()


@pytest.mark.parametrize("name", PUBLIC)
def test_each_public_name_is_its_modules_own(name):
    module = import_module(f"ray_megatron_env.{PUBLIC[name]}")
    assert getattr(ray_megatron_env, name) is getattr(module, name)


def test_the_public_names_are_all_there_is():
    assert sorted(ray_megatron_env.__all__) == sorted(PUBLIC)
    namespace = {}
    exec("from ray_megatron_env import *", namespace)
    assert set(namespace) - {"__builtins__"} == set(PUBLIC)


def test_importing_the_package_loads_nothing_else_and_a_name_only_its_module():
    assert _loaded_after("import ray_megatron_env") == ["ray_megatron_env"]
    assert _loaded_after("import ray_megatron_env; ray_megatron_env.__version__") == [
        "ray_megatron_env", "ray_megatron_env._version"]


def test_an_unknown_name_is_an_attribute_error_naming_it():
    with pytest.raises(AttributeError, match="module 'ray_megatron_env' has no attribute 'nope'"):
        ray_megatron_env.nope  # noqa: B018


def test_every_re_export_is_listed_and_defined():
    import ray_megatron_env

    assert ray_megatron_env.__all__ == sorted(ray_megatron_env._EXPORTS)
    assert [name for name in ray_megatron_env.__all__
            if not hasattr(ray_megatron_env, name)] == []
