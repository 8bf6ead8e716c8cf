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

import ray

from common import report_starts, start_arguments, time_actor_starts
from ray_megatron_env import build_runtime_env
from ray_megatron_env.demo import load_example
from ray_megatron_env.simulation import MIXED_NODES, SimulatedCluster

NODES = [n for n in MIXED_NODES if n.name in ("cpu_head", "a100", "h100", "b200")]


@ray.remote(num_cpus=0)
class Probe:
    def ping(self) -> int:
        return 1


def main() -> None:
    args = start_arguments(__doc__)

    field = build_runtime_env(load_example("verl_megatron.yaml"))["megatron_env"]
    variants = {
        "megatron_env": lambda tag: {"megatron_env": field, "env_vars": {"BENCH_TAG": tag}},
        "env_vars": lambda tag: {"env_vars": {"BENCH_TAG": tag,
                                              "CUDA_DEVICE_MAX_CONNECTIONS": "1"}},
        "none": lambda tag: None,
    }
    with SimulatedCluster(NODES) as cluster:
        result = time_actor_starts(cluster, Probe, variants, [n.name for n in NODES[1:]],
                                   args.warmup, args.repetitions, "megatron_env", "env_vars")
    report_starts(args, result, 1.02)


if __name__ == "__main__":
    main()
