"""Registration and install faults on real nodes: nothing takes a node
down, and each has a clear symptom (see docs/reliability.md)."""

import glob
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import ray
from ray.exceptions import RuntimeEnvSetupError

from drivers import brief, run_job
from ray_megatron_env import build_runtime_env
from workers import env_on

CLUSTER = "faults"
# A node set of its own, nine nodes (about 30 s with its start): .ci/run runs
# it, the README's command leaves it out.
pytestmark = pytest.mark.slow
MEGATRON_TP2 = {"engines": {"actor": {"strategy": "megatron", "tensor_parallel": 2}}}


# Ray's agent importing a plugin class that fails to load, and how the
# failure reaches the caller.
@pytest.mark.ray_version_specific
def test_a_broken_install_fails_workers_not_the_node(cluster):
    with pytest.raises(RuntimeEnvSetupError) as info:
        env_on(cluster, "broken_install", {"megatron_env": MEGATRON_TP2})
    message = str(info.value)
    assert "BrokenInstallError: ray-megatron-env on this node cannot load" in message
    assert "reinstall the same version as the driver" in message
    # The node is up and runs everything that does not use the field.
    assert env_on(cluster, "broken_install", {"env_vars": {"X": "1"}})["X"] == "1"
    assert env_on(cluster, "broken_install").get("Y") is None  # and no runtime env at all


def test_an_old_install_refuses_a_newer_format_clearly(cluster):
    with pytest.raises(RuntimeEnvSetupError) as info:
        env_on(cluster, "old_install", build_runtime_env(MEGATRON_TP2))
    assert "format version 2 is not supported by this ray-megatron-env (it reads versions 1)" \
        in str(info.value)
    assert "install the same ray-megatron-env version on the driver and on every node" \
        in str(info.value)
    assert env_on(cluster, "h100", {"megatron_env": MEGATRON_TP2})["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"


# Several plugins in RAY_RUNTIME_ENV_PLUGINS: Ray's loading and ordering.
@pytest.mark.ray_version_specific
def test_another_plugin_registered_beside_this_one(cluster):
    env = {"megatron_env": MEGATRON_TP2, "other_plugin": "hello"}
    got = env_on(cluster, "two_plugins", env)
    assert got["OTHER_PLUGIN_SAW"] == "hello"
    assert got["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    assert json.loads(got["RAY_MEGATRON_ENV_DECISION"])["gpus"] == ["8.0"]


def test_visible_devices_naming_a_missing_gpu_on_a_real_node(cluster):
    got = env_on(cluster, "smi_missing", build_runtime_env({"engines": {"a": {"strategy": "fsdp"}},
                                                        "version": 1}))
    decision = json.loads(got["RAY_MEGATRON_ENV_DECISION"])
    assert decision["gpus"] is None
    assert "CUDA_VISIBLE_DEVICES names device 5, but the node has 2 GPU(s)" in \
        decision["probe"]["error"]
    assert got.get("CUDA_DEVICE_MAX_CONNECTIONS") is None  # FSDP: conservative is "not 1"


# Ray's own behaviour when a registered plugin class is missing.
@pytest.mark.ray_version_specific
def test_a_registered_but_missing_package_keeps_the_node_out(cluster):
    # Ray's own behaviour, documented for operators: `ray start` on a node
    # whose RAY_RUNTIME_ENV_PLUGINS names a class that is not installed. The
    # agent cannot import it, the raylet exits, the node never joins.
    env = {**os.environ, "RAY_RUNTIME_ENV_PLUGINS":
           '[{"class": "ray_megatron_env_not_installed.plugin.P"}]'}
    before = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    ray_start = subprocess.Popen(
        [os.path.join(os.path.dirname(sys.executable), "ray"), "start",
         f"--address={cluster.address}", "--num-cpus=1", "--disable-usage-stats"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 25
        errors = ""
        while "No module named" not in errors and time.monotonic() < deadline:
            time.sleep(0.5)
            errors = "".join(open(path, errors="replace").read() for path in
                             glob.glob(os.path.join(cluster.logs_dir(), "runtime_env_agent*.err")))
        assert "No module named 'ray_megatron_env_not_installed'" in errors
        time.sleep(2)
        assert {n["NodeID"] for n in ray.nodes() if n["Alive"]} == before
    finally:  # Ray gives up after 30 s; stop it and whatever it started now
        os.killpg(ray_start.pid, signal.SIGKILL)
        ray_start.wait()


def test_nvidia_devices_listed_by_the_kernel_are_never_no_gpu(cluster):
    # Neither NVML nor nvidia-smi answers on this machine; the node's kernel
    # listing shows one NVIDIA device: unknown capability, conservative class.
    got = env_on(cluster, "nvidia_listed", build_runtime_env(MEGATRON_TP2))
    decision = json.loads(got["RAY_MEGATRON_ENV_DECISION"])
    assert decision["gpus"] is None and decision["probe"]["method"] == "listing"
    assert "1 NVIDIA device(s)" in decision["probe"]["error"]
    assert "0000:3b:00.0" in decision["probe"]["error"]
    assert got["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"  # Megatron TP=2, pre-Blackwell
    assert "could not read the GPUs' compute capability" in decision["warnings"][0]


def test_an_amd_node_is_named_and_follows_megatrons_major_9(cluster):
    got = env_on(cluster, "amd", build_runtime_env(MEGATRON_TP2))
    decision = json.loads(got["RAY_MEGATRON_ENV_DECISION"])
    assert decision["gpus"] == ["amd"] and decision["probe"]["vendor"] == "amd"
    assert "AMD (ROCm) GPUs" in decision["reason"]
    assert got["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"


# py_modules uploaded with the job, then the setup hook imported from it.
@pytest.mark.ray_version_specific
def test_a_node_without_the_package_is_decided_when_the_job_ships_it(cluster, tmp_path):
    # The README's py_modules line: the node has neither the package nor
    # the plugin; the job's env carries both the setup hook and the package.
    got = run_job(cluster, tmp_path, f"""
        import ray_megatron_env
        env = build_runtime_env({MEGATRON_TP2!r}, base={{"py_modules": [ray_megatron_env]}})
        ray.init(address=sys.argv[1], log_to_driver=False, runtime_env=env)
        print(json.dumps(on(["not_installed", "h100"])))
    """)
    got = brief(got)
    assert {n: (v, via, source) for n, (v, via, source, *_) in got.items()} == {
        "not_installed": ("1", "setup-hook", "policy"), "h100": ("1", "plugin", "policy")}


# A setup hook that cannot be imported: how Ray fails the worker and what
# the actor's death carries.
@pytest.mark.ray_version_specific
def test_a_node_without_the_package_says_so_when_the_job_does_not_ship_it(cluster, tmp_path):
    # Ray runs the hook before the worker takes anything: the worker exits
    # with the hook's error, which an actor's death carries.
    got = run_job(cluster, tmp_path, f"""
        ray.init(address=sys.argv[1], log_to_driver=False,
                 runtime_env=build_runtime_env({MEGATRON_TP2!r}))

        @ray.remote(num_cpus=0, max_restarts=0)
        class Trainer:
            def ping(self):
                return 1

        trainer = Trainer.options(resources={{"rme_not_installed": 1}}).remote()
        try:
            ray.get(trainer.ping.remote(), timeout=120)
            print(json.dumps({{"error": None}}))
        except Exception as exc:
            print(json.dumps({{"error": str(exc)}}))
    """)
    assert "No module named 'ray_megatron_env'" in got["error"], got
    assert "ray_megatron_env.setup_hook.setup_hook" in got["error"], got


# check's --ship-package: py_modules in an actor env on a node without it.
@pytest.mark.ray_version_specific
def test_check_ships_the_package_as_a_job_would(cluster):
    # check connects itself (a driver of its own), as the CLI does.
    # --node: that node alone (its first 8 digits, as check's table shows them).
    node_id = cluster.node_ids["not_installed"]

    def on_node(*options):
        result = subprocess.run([sys.executable, "-m", "ray_megatron_env", "check", "--address",
                                 cluster.address, "--json", "--node", node_id[:8], *options],
                                capture_output=True, text=True, timeout=180)
        assert result.returncode == 0, result.stderr[-3000:]
        [report] = json.loads(result.stdout)
        assert report["node_id"] == node_id
        return report

    shipped = on_node("--ship-package")
    assert (shipped["via"], shipped["registered"], shipped["ok"]) == ("setup-hook", False, True)
    assert shipped["decision"]["gpus"] == ["9.0"]
    bare = on_node()
    assert not bare["ok"] and "setup hook could not import this package" in bare["error"]
    assert "No module named 'ray_megatron_env'" in bare["error"]
