"""What a simulated node costs the test suite: start-up, idle CPU, and how
much slower a worker starts on a cluster of many nodes than of few.

For each cluster size (a CPU head plus N-1 registered single-GPU nodes, as
the test sets are built), interleaved over rounds:

- start: wall time of ``SimulatedCluster.start()`` and the CPU time (user +
  system) its processes used to get there;
- idle: CPU the cluster's processes use per second of wall time while
  nothing runs (raylets, agents, GCS), over ``--idle-s``;
- worker: wall time for a task with a runtime env never seen before to
  return from one node (a worker start with the plugin deciding), median of
  ``--workers`` in a row;
- stop: wall time of ``shutdown()``.

Every process counted carries the cluster's own ``RAY_TMPDIR`` (the same
test as the suite's straggler stop), so another Ray on this machine is not.

    python benchmarks/cluster_cost.py --sizes 1 6 10 16 --rounds 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid
from typing import Dict, List

import ray

from common import machine, table
from ray_megatron_env import build_runtime_env
from ray_megatron_env.simulation import SimulatedCluster, SimulatedNode, ray_processes

MEGATRON_TP2 = {"engines": {"actor": {"strategy": "megatron", "tensor_parallel": 2}}}
TICKS = os.sysconf("SC_CLK_TCK")


@ray.remote(num_cpus=0)
def value():
    return os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS")


def cpu_seconds(entry: str) -> float:
    """User + system CPU of the live processes carrying ``entry``, children
    that have exited and been waited for included."""
    total = 0
    for pid in ray_processes(entry):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
        except (OSError, IndexError):
            continue
    return total / TICKS


def nodes(size: int):
    head = SimulatedNode("cpu_head", "none")
    return (head, *(SimulatedNode(f"n{i}", "9.0") for i in range(size - 1)))


def once(size: int, idle_s: float, workers: int) -> Dict[str, float]:
    cluster = SimulatedCluster(nodes(size))
    started = time.perf_counter()
    cluster.start()
    start_s = time.perf_counter() - started
    entry = f"RAY_TMPDIR={os.environ['RAY_TMPDIR']}"
    try:
        start_cpu = cpu_seconds(entry)
        time.sleep(2)  # agents finish what they do at start
        before, at = cpu_seconds(entry), time.perf_counter()
        time.sleep(idle_s)
        idle = (cpu_seconds(entry) - before) / (time.perf_counter() - at)
        target = cluster.nodes[-1].name
        took: List[float] = []
        for _ in range(workers):
            env = build_runtime_env(MEGATRON_TP2, base={"env_vars": {"TAG": uuid.uuid4().hex}})
            at = time.perf_counter()
            ray.get(value.options(runtime_env=env, **cluster.pin(target)).remote(), timeout=120)
            took.append(time.perf_counter() - at)
    finally:
        at = time.perf_counter()
        cluster.shutdown()
        stop_s = time.perf_counter() - at
    return {"start": start_s, "start_cpu": start_cpu, "idle": idle,
            "worker": statistics.median(took), "stop": stop_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 6, 10, 16])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--idle-s", type=float, default=10.0)
    parser.add_argument("--workers", type=int, default=5)
    args = parser.parse_args()
    print(machine())
    runs: Dict[int, List[Dict[str, float]]] = {size: [] for size in args.sizes}
    for round_ in range(args.rounds):
        for size in (args.sizes if round_ % 2 == 0 else list(reversed(args.sizes))):
            runs[size].append(once(size, args.idle_s, args.workers))
            print(f"round {round_ + 1}, {size} node(s): {runs[size][-1]}", flush=True)

    def med(size, key):
        return statistics.median(r[key] for r in runs[size])

    rows = [[size, f"{med(size, 'start'):.1f} s", f"{med(size, 'start_cpu'):.1f} s",
             f"{med(size, 'start') / size:.2f} s", f"{med(size, 'idle'):.2f}",
             f"{med(size, 'worker') * 1000:.0f} ms", f"{med(size, 'stop'):.1f} s"]
            for size in args.sizes]
    print(table(["nodes", "start", "start CPU", "start per node", "idle CPUs busy",
                 "worker start", "stop"], rows))


if __name__ == "__main__":
    main()
