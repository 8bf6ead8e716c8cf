"""frameworks/loading.py: any config a user holds made a plain mapping. A
YAML file (safe YAML: no tag runs code; plain text named as such; a missing
file named), interpolations resolved, and deep plain copies (Ray cannot
serialise OmegaConf containers; a module is kept as it is).
"""

import json

import pytest
from omegaconf import OmegaConf

import ray_megatron_env
from ray_megatron_env.errors import FieldValueError
from ray_megatron_env.frameworks.loading import load_yaml, to_container
from ray_megatron_env.runtime_env import build_runtime_env


def test_a_yaml_file_is_read_with_its_interpolations_resolved(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("trainer:\n  nnodes: 2\ncopy: ${trainer.nnodes}\nlist: [a, b]\n")
    assert load_yaml(path) == {"trainer": {"nnodes": 2}, "copy": 2, "list": ["a", "b"]}


def test_a_missing_file_is_named(tmp_path):
    missing = tmp_path / "nowhere.yaml"
    with pytest.raises(FieldValueError) as info:
        load_yaml(missing)
    assert str(info.value) == f"megatron_env: config file {str(missing)!r} does not exist"


def test_to_container_is_a_plain_deep_copy():
    config = OmegaConf.create({"a": {"b": [1, 2]}, "c": "${a.b}"})
    assert to_container(config) == {"a": {"b": [1, 2]}, "c": [1, 2]}
    original = {"a": {"b": [1, 2]}, "t": (1, 2)}
    copied = to_container(original)
    copied["a"]["b"].append(3)
    assert original == {"a": {"b": [1, 2]}, "t": (1, 2)} and copied["t"] == (1, 2)
    json.dumps(to_container({"x": OmegaConf.create({"y": 1})}))  # no OmegaConf left inside


def test_a_module_is_kept_as_it_is():
    # py_modules: [ray_megatron_env], which Ray uploads from the driver
    kept = to_container({"py_modules": [ray_megatron_env]})
    assert kept["py_modules"][0] is ray_megatron_env


def test_a_file_of_plain_text_is_not_described_by_top_level_keys(tmp_path):
    # YAML reads a pasted command line as one string; OmegaConf would make it
    # the single key of a mapping.
    from ray_megatron_env.frameworks.loading import load_spec

    path = tmp_path / "args.txt"
    path.write_text("python3 train.py \\\n  --actor-num-nodes 1 \\\n  --colocate\n")
    with pytest.raises(FieldValueError) as info:
        load_spec(str(path))
    assert "holds plain text" in str(info.value) and "'python3'" in str(info.value)
    assert "top-level keys" not in str(info.value)


def test_yaml_tags_cannot_run_code(tmp_path):
    marker = tmp_path / "ran"
    path = tmp_path / "evil.yaml"
    path.write_text(f"critic: !!python/object/apply:os.system ['touch {marker}']\n")
    with pytest.raises(FieldValueError, match="cannot load config file"):
        build_runtime_env(path)
    assert not marker.exists()
