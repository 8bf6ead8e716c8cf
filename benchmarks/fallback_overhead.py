"""Start-up overhead of the worker-side fallback on a node without the plugin.

(a) the env build_runtime_env makes, on nodes started without the plugin
    registered: every worker runs the setup hook (imports the package,
    reads the node's probe file, decides, writes the record);
(b) a plain env_vars runtime env of the same shape (what frameworks do today).
Each actor gets a runtime env never seen before (a unique tag), so every
start is a new worker process. The hook travels as Ray carries a job's
setup hook to its workers (an env var; setup_hook.as_actor_env), so both
variants run in one job and interleave. The first rounds are warm-up.

    python benchmarks/fallback_overhead.py [--repetitions 40]
"""

from __future__ import annotations

import ray

from common import report_starts, start_arguments, time_actor_starts
from ray_megatron_env import build_runtime_env
from ray_megatron_env.demo import load_example
from ray_megatron_env.simulation import SimulatedCluster, SimulatedNode
from ray_megatron_env.setup_hook import as_actor_env

NODES = [SimulatedNode("cpu_head", "none"), SimulatedNode("a100", "8.0", plugin=False),
         SimulatedNode("h100", "9.0,9.0", plugin=False)]


@ray.remote(num_cpus=0)
class Probe:
    def ping(self) -> str:
        import os
        return os.environ.get("RAY_MEGATRON_ENV_DECISION", "")


def main() -> None:
    args = start_arguments(__doc__)

    fallback = as_actor_env(build_runtime_env(load_example("verl_megatron.yaml")))

    def with_tag(env, tag):
        return {**env, "env_vars": {**env["env_vars"], "BENCH_TAG": tag}}

    variants = {
        "fallback": lambda tag: with_tag(fallback, tag),
        "env_vars": lambda tag: {"env_vars": {"BENCH_TAG": tag,
                                              "CUDA_DEVICE_MAX_CONNECTIONS": "1"}},
    }
    def decided_by_the_hook(name, node, decision):
        if name == "fallback" and '"via":"setup-hook"' not in decision:
            raise SystemExit(f"the fallback did not decide on {node}: {decision!r}")

    with SimulatedCluster(NODES) as cluster:
        result = time_actor_starts(cluster, Probe, variants, [n.name for n in NODES[1:]],
                                   args.warmup, args.repetitions, "fallback", "env_vars",
                                   check=decided_by_the_hook)
    report_starts(args, result, 1.05, "; nodes without the plugin")


if __name__ == "__main__":
    main()
