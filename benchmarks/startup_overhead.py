"""Start-up overhead of the plugin: actor creation to first reply.

(a) runtime_env from build_runtime_env (the megatron_env field),
(b) a plain env_vars runtime env of the same shape (what frameworks do today),
(c) no runtime env.
Each (a) and (b) actor gets a runtime env never seen before (a unique tag),
so every start pays for a new runtime env in the agent, plugin included.
Variants are interleaved; the first repetitions are discarded as warm-up.

    python benchmarks/startup_overhead.py [--repetitions 40]
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
from ray_megatron_env.simulation import MIXED_NODES, SimulatedCluster

NODES = [n for n in MIXED_NODES if n.name in ("cpu_head", "a100", "h100", "b200")]


@ray.remote(num_cpus=0)
class Probe:
    def ping(self) -> int:
        return 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repetitions", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    field = build_runtime_env(load_example("verl_megatron.yaml"))["megatron_env"]
    variants = {
        "megatron_env": lambda tag: {"megatron_env": field, "env_vars": {"BENCH_TAG": tag}},
        "env_vars": lambda tag: {"env_vars": {"BENCH_TAG": tag,
                                              "CUDA_DEVICE_MAX_CONNECTIONS": "1"}},
        "none": lambda tag: None,
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
            env = variants[name](f"{rep}-{name}")
            started = time.perf_counter()
            actor = Probe.options(runtime_env=env, **cluster.pin(node)).remote()
            ray.get(actor.ping.remote(), timeout=120)
            took = time.perf_counter() - started
            ray.kill(actor)
            if rep >= args.warmup:
                samples[name].append(took)
                last[name] = took
            if len(last) == len(variants) and i % len(variants) == len(variants) - 1:
                paired.append(last["megatron_env"] / last["env_vars"])
                last = {}

    stats = {name: spread(values) for name, values in samples.items()}
    ratio = stats["megatron_env"]["median"] / stats["env_vars"]["median"]
    result = {"machine": machine(), "repetitions": args.repetitions, "stats": stats,
              "ratio_of_medians_a_over_b": ratio,
              "median_paired_ratio_a_over_b": statistics.median(paired)}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"machine: {result['machine']}; {args.repetitions} repetitions per variant, "
          f"interleaved, after {args.warmup} warm-up rounds\n")
    print(table(["variant", "median", "q1", "q3"],
                [[name, ms(s["median"]), ms(s["q1"]), ms(s["q3"])] for name, s in stats.items()]))
    print(f"\n(a)/(b) ratio of medians: {ratio:.3f}   "
          f"median of paired ratios: {result['median_paired_ratio_a_over_b']:.3f}   "
          f"(target <= 1.02)")


if __name__ == "__main__":
    main()
