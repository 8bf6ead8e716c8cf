"""Scale: how the plugin's work grows with nodes and with actors.

Starts many actors at once with two runtime envs (per-role envs) on clusters
of several sizes and counts: decisions the plugin made (its line in the
nodes' runtime-env setup logs), runtime-env creations Ray's agents made
(their own log), and GPU probes (distinct probe times in the decisions).
Ray's agent caches a created runtime env while any worker holds it, so the
plugin runs per node per runtime env and again only when Ray re-creates
the env; the probe runs once per node.

    python benchmarks/scale.py
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import time

import ray

from common import machine, table
from ray_megatron_env import build_runtime_env
from ray_megatron_env.demo import load_example
from ray_megatron_env.simulation import MIXED_NODES, SimulatedCluster

DECISION_LINE = "megatron_env: CUDA_DEVICE_MAX_CONNECTIONS="
CREATION_LINE = "Creating runtime env: {\"megatron_env\""


@ray.remote(num_cpus=0)
class Worker:
    def decision(self) -> dict:
        return json.loads(os.environ["RAY_MEGATRON_ENV_DECISION"])


def run(nodes: int, per_node: int):
    config = load_example("verl_megatron.yaml", "critic.strategy=fsdp")
    envs = [build_runtime_env(config, role=role) for role in ("actor", "critic")]
    with SimulatedCluster(MIXED_NODES[:nodes]) as cluster:
        names = [n.name for n in cluster.nodes]
        started = time.perf_counter()
        actors = [Worker.options(runtime_env=envs[(i // nodes) % 2], **cluster.pin(names[i % nodes]))
                  .remote() for i in range(nodes * per_node)]
        decisions = ray.get([a.decision.remote() for a in actors], timeout=900)
        took = time.perf_counter() - started
        for actor in actors:
            ray.kill(actor)
        logged = _count(cluster.logs_dir(), "runtime_env_setup-*.log", DECISION_LINE)
        created = _count(cluster.logs_dir(), "runtime_env_agent*.log", CREATION_LINE)
        probes = len({(d["probe"]["pid"], d["probe"]["probed_at"]) for d in decisions})
    return [nodes, len(actors), nodes * len(envs), logged, created, probes, f"{took:.1f} s"]


def _count(logs_dir: str, pattern: str, needle: str) -> int:
    return sum(open(path, errors="replace").read().count(needle)
               for path in glob.glob(os.path.join(logs_dir, pattern)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default="2x4,2x16,2x32,4x8,6x8",
                        help="NODESxACTORS_PER_NODE, comma-separated")
    args = parser.parse_args()
    rows = [run(*map(int, spec.split("x"))) for spec in args.runs.split(",")]
    print(f"machine: {machine()}\n")
    print(table(["nodes", "actors", "node x env pairs", "plugin decisions",
                 "Ray env creations", "GPU probes", "all actors up in"], rows))


if __name__ == "__main__":
    main()
