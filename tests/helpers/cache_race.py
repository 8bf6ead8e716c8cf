"""A worker process probing through the per-node cache file, for the test
that several workers starting together share one probe
(tests/unit/test_cache.py). A module of its own, importable by name, since
a spawned process imports its target by module name (a test module's name
under pytest's importlib mode is not importable there)."""

import time

from ray_megatron_env.cache import NodeCache
from ray_megatron_env.node import NodeGpus


def probe_in_process(folder, out):
    cache = NodeCache(folder, "node-1")

    def slow_probe():
        time.sleep(0.3)
        return NodeGpus.known([(9, 0)], "fake")

    result = cache.get(slow_probe)
    out.put((result.probe_pid, result.probed_at))
