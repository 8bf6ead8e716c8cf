"""The plugin module must load fast and alone in every node's agent."""

import subprocess
import sys
from pathlib import Path

HEAVY = ("torch", "pynvml", "omegaconf", "yaml", "numpy")


def _modules_after(statement: str) -> set:
    code = f"import sys; {statement}; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


# What Ray's agent has loaded anyway before it imports a plugin.
BASELINE = "import ray._private.runtime_env.plugin"


def _added_by(statement: str) -> set:
    return _modules_after(f"{BASELINE}; {statement}") - _modules_after(BASELINE)


def test_importing_the_plugin_adds_only_its_own_two_modules():
    added = _added_by("import ray_megatron_env.plugin")
    assert {m for m in added if not m.startswith("__editable__")} == {
        "ray_megatron_env", "ray_megatron_env.plugin"}


def test_the_agent_side_loads_without_omegaconf_nvml_or_torch():
    added = _added_by("import ray_megatron_env.agent")
    assert {m for m in added if m.startswith("ray_megatron_env.")} >= {
        "ray_megatron_env.agent", "ray_megatron_env.probe", "ray_megatron_env.packs.connections"}
    assert not {m.split(".")[0] for m in added} & set(HEAVY)


def test_a_broken_install_fails_the_worker_not_the_import(tmp_path):
    # A copy of the package with one module that cannot be imported.
    import shutil
    import ray_megatron_env

    package = tmp_path / "ray_megatron_env"
    shutil.copytree(Path(ray_megatron_env.__file__).parent, package)
    (package / "packs" / "connections.py").write_text("def broken(:\n")
    code = ("import ray_megatron_env.plugin as p\n"
            "try:\n    p.MegatronEnvPlugin.validate({'megatron_env': {}})\n"
            "except p.BrokenInstallError as e:\n    print('BROKEN', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=tmp_path, check=True).stdout
    assert out.startswith("BROKEN ray-megatron-env on this node cannot load")
    assert "reinstall" in out


def test_a_ray_without_the_base_class_keeps_the_plugin_loadable_and_fails_setups():
    # Ray moves its private base class: the agent has it loaded under another
    # name. The plugin must still subclass it (Ray refuses a class that does
    # not) and fail each megatron_env setup with the version and the range.
    code = (
        "import sys, types, ray\n"
        "for module in [m for n, m in list(sys.modules.items()) if n.startswith('ray.')]:\n"
        "    vars(module).pop('RuntimeEnvPlugin', None)\n"
        "moved = types.ModuleType('ray._moved_plugin')\n"
        "class RuntimeEnvPlugin: pass\n"
        "moved.RuntimeEnvPlugin = RuntimeEnvPlugin\n"
        "sys.modules['ray._moved_plugin'] = moved\n"
        "sys.modules['ray._private.runtime_env.plugin'] = None  # import now fails\n"
        "import ray_megatron_env.plugin as p\n"
        "assert issubclass(p.MegatronEnvPlugin, RuntimeEnvPlugin)\n"
        "try:\n    p.MegatronEnvPlugin.validate({'megatron_env': {}})\n"
        "except p.IncompatibleRayError as e:\n    print('INCOMPATIBLE', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    import ray

    assert out.startswith(f"INCOMPATIBLE ray-megatron-env does not support this node's Ray "
                          f"{ray.__version__}")
    assert "ray._private.runtime_env.plugin.RuntimeEnvPlugin cannot be imported" in out
    assert "Tested Ray releases: 2.41.0 to 2.60.0" in out
