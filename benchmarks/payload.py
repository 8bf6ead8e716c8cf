"""Payload: the megatron_env field's size, raw config vs compact form, and
what a job-level runtime env carrying it costs in task submission.

The throughput part runs many tiny tasks from a fresh driver whose job-level
runtime env carries (raw) the whole resolved config, (compact) the field
from build_runtime_env, (env_vars) a plain env_vars env of the same shape;
Ray puts the job's runtime env in every task spec. Drivers are interleaved.

    python benchmarks/payload.py [--config verl/trainer/config/_generated_ppo_megatron_trainer.yaml ...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from common import interleaved, machine, spread, table

EXAMPLES = Path(__file__).resolve().parent.parent / "ray_megatron_env" / "examples"

DRIVER = textwrap.dedent("""
    import json, sys, time, ray
    address, env, tasks = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
    ray.init(address=address, runtime_env=env, log_to_driver=False, logging_level="ERROR")

    @ray.remote
    def noop():
        return 0

    ray.get([noop.remote() for _ in range(200)])  # workers started, env set up
    started = time.perf_counter()
    ray.get([noop.remote() for _ in range(tasks)])
    print(tasks / (time.perf_counter() - started))
""")


def resolved(path: str) -> dict:
    from omegaconf import OmegaConf

    config = OmegaConf.load(path)
    # verl leaves the rollout engine mandatory (???); a run sets it.
    if OmegaConf.select(config, "actor_rollout_ref.rollout.name", throw_on_missing=False) is None:
        OmegaConf.update(config, "actor_rollout_ref.rollout.name", "vllm", force_add=True)
    return OmegaConf.to_container(config, resolve=True)


def sizes(paths):
    from ray_megatron_env import build_runtime_env

    rows = []
    for path in paths:
        raw = resolved(path)
        compact = build_runtime_env(raw)["megatron_env"]
        raw_bytes, compact_bytes = len(json.dumps(raw)), len(json.dumps(compact))
        rows.append([Path(path).name, raw_bytes, compact_bytes, f"{raw_bytes / compact_bytes:.0f}x"])
    return rows


def throughput(path: str, tasks: int, repetitions: int):
    from ray_megatron_env import build_runtime_env
    from ray_megatron_env.simulation import MIXED_NODES, SimulatedCluster

    raw = resolved(path)
    envs = {
        "raw config": {"megatron_env": raw},
        "compact field": build_runtime_env(raw),
        "plain env_vars": {"env_vars": {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}},
    }
    rates = {name: [] for name in envs}
    cluster = SimulatedCluster([n for n in MIXED_NODES if n.name in ("cpu_head", "h100")])
    with cluster:
        for name in interleaved(list(envs), repetitions):
            out = subprocess.run([sys.executable, "-c", DRIVER, cluster.address,
                                  json.dumps(envs[name]), str(tasks)],
                                 capture_output=True, text=True, check=True, env=os.environ)
            rates[name].append(float(out.stdout.strip().splitlines()[-1]))
    return {name: spread(values) for name, values in rates.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", action="append",
                        help="verl config YAML (repeatable); default: the package's examples")
    parser.add_argument("--tasks", type=int, default=3000)
    parser.add_argument("--repetitions", type=int, default=5)
    args = parser.parse_args()
    paths = args.config or [str(EXAMPLES / "verl_megatron.yaml"), str(EXAMPLES / "verl_fsdp.yaml")]

    print(f"machine: {machine()}\n")
    print(table(["config", "raw JSON bytes", "compact bytes", "raw/compact"], sizes(paths)))
    largest = max(paths, key=lambda p: len(json.dumps(resolved(p))))
    stats = throughput(largest, args.tasks, args.repetitions)
    print(f"\ntask submission, {args.tasks} tiny tasks per driver, {args.repetitions} drivers per "
          f"variant, interleaved; job-level runtime env from {Path(largest).name}:")
    print(table(["job runtime env", "median tasks/s", "q1", "q3"],
                [[n, f"{s['median']:.0f}", f"{s['q1']:.0f}", f"{s['q3']:.0f}"]
                 for n, s in stats.items()]))
    base = stats["plain env_vars"]["median"]
    print(f"\nthroughput relative to plain env_vars: compact "
          f"{stats['compact field']['median'] / base:.3f}, raw {stats['raw config']['median'] / base:.3f}")


if __name__ == "__main__":
    main()
