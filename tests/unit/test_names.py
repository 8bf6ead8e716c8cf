"""names.py, the one home of every shared name: it imports nothing; Ray's
names are Ray's own (read from Ray's modules, not copied); the paths Ray is
given name real objects; each pack's variables and fact kinds are the ones
docs/packs.md lists, and the derived tuples are what they say."""

import ast
import importlib
import inspect
import re
from pathlib import Path

import pytest

from ray_megatron_env import names

SOURCE = Path(names.__file__).read_text()


def test_it_imports_nothing():
    imports = [ast.unparse(node) for node in ast.walk(ast.parse(SOURCE))
               if isinstance(node, (ast.Import, ast.ImportFrom))]
    assert imports == []


def test_rays_variables_and_fields_are_rays_own():
    from ray._private import ray_constants
    from ray._private.runtime_env import constants, setup_hook
    from ray.runtime_env import RuntimeEnv

    assert names.DRIVER_HOOK_VARIABLE == ray_constants.RAY_RUNTIME_ENV_HOOK
    assert names.RAY_SETUP_HOOK_VARIABLE == ray_constants.WORKER_PROCESS_SETUP_HOOK_ENV_VAR
    assert names.EXPORTED_FUNCTION == setup_hook.RUNTIME_ENV_FUNC_IDENTIFIER
    assert names.PLUGINS_VARIABLE == constants.RAY_RUNTIME_ENV_PLUGINS_ENV_VAR
    assert names.JOB_CONFIG_VARIABLE == constants.RAY_JOB_CONFIG_JSON_ENV_VAR
    assert names.SETUP_HOOK_FIELD in RuntimeEnv.known_fields
    # Read by name where Ray reads them, not kept as constants of their names.
    assert f'env_bool("{names.UV_SWITCH_VARIABLE}"' in inspect.getsource(ray_constants)
    assert f'os.getenv("{names.OVERRIDE_VARIABLE}")' in inspect.getsource(
        importlib.import_module("ray._private.worker"))


def test_the_field_is_a_plugins_not_one_of_rays():
    from ray.runtime_env import RuntimeEnv

    assert names.FIELD == "megatron_env"
    assert names.FIELD not in RuntimeEnv.known_fields


@pytest.mark.parametrize("path,kind", [
    (names.PLUGIN_CLASS_PATH, type),
    (names.SETUP_HOOK_PATH, type(lambda: None)),
    (names.DRIVER_HOOK_PATH, type(lambda: None)),
])
def test_each_path_ray_is_given_names_a_real_object(path, kind):
    module, _, attribute = path.rpartition(".")
    assert isinstance(getattr(importlib.import_module(module), attribute), kind)


def test_the_packages_own_variables_are_the_ones_the_docs_name():
    own = [value for name, value in vars(names).items()
           if name.endswith(("_VARIABLE", "_PREFIX")) and value.startswith(names.OWN_PREFIX)]
    root = Path(names.__file__).parents[1]
    documented = {word for page in [root / "README.md", *sorted((root / "docs").glob("*.md"))]
                  for word in re.findall(r"RAY_MEGATRON_ENV_[A-Z_]+", page.read_text())}
    # The test harness's own (the root conftest.py), not the package's.
    documented.discard("RAY_MEGATRON_ENV_TEST_SESSION")
    assert len(set(own)) == len(own)
    assert set(own) - {names.OWN_PREFIX} == documented


# docs/packs.md, each pack's "variables" and "node facts" (gpus: every job).
PACKS = {
    "cuda-connections": (("CUDA_DEVICE_MAX_CONNECTIONS",), ()),
    "nccl-fabric": (("NCCL_MNNVL_ENABLE", "NCCL_NVLS_ENABLE", "NCCL_CUMEM_ENABLE"), ("fabric",)),
    "nccl-host-mem": (("NCCL_CUMEM_HOST_ENABLE", "NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL",
                       "NCCL_SHM_DISABLE"), ("p2p",)),
    "torch-arch": (("TORCH_CUDA_ARCH_LIST",), ()),
    "te-fp8-scales": (("NVTE_FP8_BLOCK_SCALING_FP32_SCALES",), ()),
    "fla-backend": (("FLA_TILELANG",), ()),
    "net-ifaces": (("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "TP_SOCKET_IFNAME",
                    "HCCL_SOCKET_IFNAME", "NCCL_IB_HCA", "NCCL_IB_GID_INDEX"), ("net",)),
}


def test_each_pack_has_its_variables_and_fact_kinds():
    assert names.PACK_NAMES == tuple(PACKS)
    assert {name: (names.PACK_VARIABLES_OF[name], names.PACK_FACT_KINDS[name])
            for name in names.PACK_NAMES} == PACKS
    assert set(names.PACK_VARIABLES_OF) == set(names.PACK_FACT_KINDS) == set(PACKS)


def test_the_packs_themselves_say_the_same():
    from ray_megatron_env.packs import get_pack

    for name, (variables, kinds) in PACKS.items():
        pack = get_pack(name)
        assert (tuple(pack.variables), tuple(pack.fact_kinds)) == (variables, kinds), name


def test_the_derived_names_are_what_they_say():
    every = [v for name in PACKS for v in PACKS[name][0]]
    assert names.PACK_VARIABLES == tuple(every)  # the union, in pack order
    assert len(set(every)) == len(every)  # no variable in two packs
    assert names.ALWAYS_ON == ("cuda-connections",)
    assert names.OPTIONAL_PACKS == ("nccl-fabric", "nccl-host-mem", "torch-arch",
                                    "te-fp8-scales", "fla-backend", "net-ifaces")
    assert names.FACT_KINDS == ("fabric", "p2p", "net") and names.GPUS == "gpus"
    assert {k for kinds in names.PACK_FACT_KINDS.values() for k in kinds} == set(names.FACT_KINDS)
