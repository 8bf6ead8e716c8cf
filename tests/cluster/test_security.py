"""Hostile metadata on a real node: the plugin writes two variables, runs
nothing and opens no file in the agent (an interpolation left unresolved:
the bad-input matrix, tests/cluster/test_bad_input.py, and tests/unit/test_plugin.py)."""

import os
import threading

import pytest
from ray.exceptions import RuntimeEnvSetupError

from workers import DECISION, VAR, env_on


def hostile(marker):
    """A verl-shaped field stuffed with everything that could be misread."""
    return {
        "actor_rollout_ref": {"actor": {
            "strategy": "megatron", "megatron": {"tensor_model_parallel_size": 2, "context_parallel_size": 1},
            "env_vars": {"LD_PRELOAD": "/tmp/evil.so"}, "runtime_env": {"PATH": "/evil"}}},
        "env_vars": {"PATH": "/evil", "LD_PRELOAD": "/tmp/evil.so", VAR: "7"},
        "LD_PRELOAD": "/tmp/evil.so", "PATH": "/evil", "PYTHONPATH": "/evil",
        "worker_process_setup_hook": f"os.system('touch {marker}')",
        "trainer": {"cmd": f"$(touch {marker})", "home": "${oc.env:HOME}",
                    "tag": f"!!python/object/apply:os.system ['touch {marker}']",
                    "resolver": "${oc.create:{a: 1}}", "eval": f"__import__('os').system('touch {marker}')"},
    }


# Compared with a plain env_vars env: what else Ray's agent puts in a
# worker's environment for a runtime env depends on the Ray version.
@pytest.mark.ray_version_specific
def test_only_its_two_variables_reach_the_worker(cluster, tmp_path):
    marker = tmp_path / "ran"
    with_field = env_on(cluster, "h100_b200", {"megatron_env": hostile(marker)})
    control = env_on(cluster, "h100_b200", {"env_vars": {"RME_CONTROL": "1"}})
    differ = {k for k in set(with_field) | set(control) if with_field.get(k) != control.get(k)}
    assert differ == {VAR, DECISION, "RME_CONTROL"}
    assert with_field[VAR] == "1"  # the config's Megatron TP=2, not the "7" inside the field
    assert with_field.get("LD_PRELOAD") is None and with_field["PATH"] == control["PATH"]
    assert not marker.exists()


def test_a_path_in_the_field_is_never_opened_in_the_agent(cluster, tmp_path):
    # Opening a FIFO for reading blocks until a writer comes: had the agent
    # tried, the worker would hang; it fails at once instead.
    fifo = tmp_path / "config.yaml"
    os.mkfifo(fifo)
    opened = threading.Event()

    def writer():  # unblocks a reader if there ever is one, and records it
        try:
            with open(fifo, "w") as f:
                opened.set()
                f.write("critic: {strategy: fsdp}\n")
        except OSError:
            pass

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    with pytest.raises(RuntimeEnvSetupError, match="the field must be a mapping"):
        env_on(cluster, "h100_b200", {"megatron_env": str(fifo)})
    assert not opened.is_set()
    os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))  # release the writer
    thread.join(timeout=5)
