"""Start-up overhead of the worker-side fallback on a node without the plugin.

(a) the env build_runtime_env makes, on nodes started without the plugin
    registered: every worker runs the setup hook (imports the package,
    reads the node's probe file, decides, writes the record);
(b) a plain env_vars runtime env of the same shape (what frameworks do today).
Each actor gets a runtime env never seen before (a unique tag), so every
start is a new worker process. The hook travels as Ray carries a job's
setup hook to its workers (an env var; worker.as_actor_env), so both
variants run in one job and interleave. The first rounds are warm-up.

    python benchmarks/fallback_overhead.py [--repetitions 40]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import ray

from common import interleaved, machine, ms, spread, table
from ray_megatron_env import build_runtime_env
from ray_megatron_env.demo import load_example
from ray_megatron_env.simulation import SimulatedCluster, SimulatedNode
from ray_megatron_env.worker import as_actor_env

NODES = [SimulatedNode("cpu_head", "none"), SimulatedNode("a100", "8.0", plugin=False),
         SimulatedNode("h100", "9.0,9.0", plugin=False)]


@ray.remote(num_cpus=0)
class Probe:
    def ping(self) -> str:
        import os
        return os.environ.get("RAY_MEGATRON_ENV_DECISION", "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repetitions", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    fallback = as_actor_env(build_runtime_env(load_example("verl_megatron.yaml")))

    def with_tag(env, tag):
        return {**env, "env_vars": {**env["env_vars"], "BENCH_TAG": tag}}

    variants = {
        "fallback": lambda tag: with_tag(fallback, tag),
        "env_vars": lambda tag: {"env_vars": {"BENCH_TAG": tag,
                                              "CUDA_DEVICE_MAX_CONNECTIONS": "1"}},
    }
    samples = {name: [] for name in variants}
    paired = []
    with SimulatedCluster(NODES) as cluster:
        workers = [n.name for n in NODES[1:]]
        order = interleaved(list(variants), args.warmup + args.repetitions)
        last = {}
        for i, name in enumerate(order):
            rep = i // len(variants)
            node = workers[rep % len(workers)]
            started = time.perf_counter()
            actor = Probe.options(runtime_env=variants[name](f"{rep}-{name}"),
                                  **cluster.pin(node)).remote()
            decision = ray.get(actor.ping.remote(), timeout=120)
            took = time.perf_counter() - started
            if name == "fallback" and '"via":"setup-hook"' not in decision:
                raise SystemExit(f"the fallback did not decide on {node}: {decision!r}")
            ray.kill(actor)
            if rep >= args.warmup:
                samples[name].append(took)
                last[name] = took
            if len(last) == len(variants) and i % len(variants) == len(variants) - 1:
                paired.append(last["fallback"] / last["env_vars"])
                last = {}

    stats = {name: spread(values) for name, values in samples.items()}
    ratio = stats["fallback"]["median"] / stats["env_vars"]["median"]
    result = {"machine": machine(), "repetitions": args.repetitions, "stats": stats,
              "ratio_of_medians_a_over_b": ratio,
              "median_paired_ratio_a_over_b": statistics.median(paired)}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"machine: {result['machine']}; {args.repetitions} repetitions per variant, "
          f"interleaved, after {args.warmup} warm-up rounds; nodes without the plugin\n")
    print(table(["variant", "median", "q1", "q3"],
                [[name, ms(s["median"]), ms(s["q1"]), ms(s["q3"])] for name, s in stats.items()]))
    print(f"\n(a)/(b) ratio of medians: {ratio:.3f}   "
          f"median of paired ratios: {result['median_paired_ratio_a_over_b']:.3f}   "
          f"(target <= 1.05)")


if __name__ == "__main__":
    main()
