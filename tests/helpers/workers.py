"""What a worker on node X saw: one Ray task (or actor) started there with a
runtime env, returning its whole environment, read back one way. For a
pytest process connected to a cluster fixture (``cluster.pin(node)`` places
it); driver scripts get the same view from drivers.PRELUDE."""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Dict, Iterable, Optional, Tuple

import ray
import ray.cloudpickle
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

VAR, DECISION = "CUDA_DEVICE_MAX_CONNECTIONS", "RAY_MEGATRON_ENV_DECISION"

# Shipped by value: a worker need not import tests/helpers.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


@ray.remote(num_cpus=0)
def environment() -> Dict[str, str]:
    return dict(os.environ)


@ray.remote(num_cpus=0)
class Worker:
    """A long-lived worker (an actor), as verl's worker groups are."""

    def environment(self) -> Dict[str, str]:
        return dict(os.environ)


def read(env: Dict[str, str]) -> Tuple[Optional[str], Optional[dict]]:
    """(CUDA_DEVICE_MAX_CONNECTIONS, the decision record or None) of a worker's environment."""
    text = env.get(DECISION)
    return env.get(VAR), json.loads(text) if text else None


def start_on(cluster: Any, node: str, runtime_env: Optional[dict] = None) -> "ray.ObjectRef":
    """A task on ``node``, started; ray.get gives its environment."""
    options = {"runtime_env": runtime_env} if runtime_env is not None else {}
    return environment.options(**options, **cluster.pin(node)).remote()


def env_on(cluster: Any, node: str, runtime_env: Optional[dict] = None,
           timeout: float = 120) -> Dict[str, str]:
    """The whole environment a task on ``node`` got."""
    return ray.get(start_on(cluster, node, runtime_env), timeout=timeout)


def seen_on(cluster: Any, node: str, runtime_env: Optional[dict] = None,
            timeout: float = 120) -> Tuple[Optional[str], Optional[dict]]:
    """(value, decision) a task on ``node`` got."""
    return read(env_on(cluster, node, runtime_env, timeout))


def seen_on_nodes(cluster: Any, nodes: Iterable[str], runtime_env: Optional[dict],
                  timeout: float = 180) -> Dict[str, Tuple[Optional[str], Optional[dict]]]:
    """{node: (value, decision)}, one task on each, all at once."""
    nodes = list(nodes)
    envs = ray.get([start_on(cluster, n, runtime_env) for n in nodes], timeout=timeout)
    return {n: read(env) for n, env in zip(nodes, envs)}


def env_in_actors(cluster: Any, nodes: Iterable[str], runtime_env: dict,
                  timeout: float = 300) -> Dict[str, Dict[str, str]]:
    """{node: environment} of one actor on each node (hard node affinity,
    as check and verl place theirs), all at once; the actors are killed."""
    actors = {n: Worker.options(runtime_env=runtime_env, scheduling_strategy=
                                NodeAffinitySchedulingStrategy(cluster.node_ids[n], soft=False))
              .remote() for n in nodes}
    try:
        envs = ray.get([a.environment.remote() for a in actors.values()], timeout=timeout)
    finally:
        for actor in actors.values():
            ray.kill(actor)
    return dict(zip(actors, envs))
