"""What the plugin does on a node, free of Ray's plugin plumbing.

``plugin.py`` is the thin class Ray loads; this module is where a worker's
environment is decided, so it can be exercised directly with a plain dict
for ``env_vars`` and a fake probe. The worker-side fallback (``setup_hook.py``)
calls the same ``decision.decide_node`` and ``NodeDecision.write_to``, so both
paths apply one precedence and leave one record.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, Dict, Mapping, MutableMapping, Optional, Sequence

from .cache import ProbeCache
from .decision import decide_node, split_driver_env
from .frameworks import parse_field
from .names import FIELD, GPUS
from .node import NodeFacts, NodeGpus
from .packs import fact_kinds
from .packs.connections import explicit_value
from .probe import node_facts, probes
from .record import VIA_PLUGIN, Decision
from .spec import Spec

# How Ray tells the node's runtime-env agent the address it uses for the node
# (its command line, ray/_private/services.py: f"--node-ip-address={ip}",
# read by ray/_private/runtime_env/agent/main.py; the same from Ray 2.41 to 2.60).
NODE_IP_OPTION = "--node-ip-address"


def agent_node_ip(argv: Sequence[str] = sys.argv) -> Optional[str]:
    """The node IP Ray gave the agent this plugin runs in, or None."""
    for i, arg in enumerate(argv):
        if arg.startswith(f"{NODE_IP_OPTION}="):
            return arg.split("=", 1)[1] or None
        if arg == NODE_IP_OPTION and i + 1 < len(argv):
            return argv[i + 1] or None
    return None


def check_runtime_env(runtime_env: Mapping[str, Any]) -> None:
    """Raise the user-facing error for a bad field or explicit value."""
    spec = parse_field(runtime_env.get(FIELD))
    # A value the driver copied (the field's driver_env) is inherited: the
    # decision warns about a bad one, as about a node's.
    explicit_value(split_driver_env(spec, runtime_env.get("env_vars") or {})[0])


class NodeAgent:
    """The plugin's state on one node: one cached probe per kind of node fact
    (``probe.probes``): the GPUs for every job, the others only for jobs
    whose packs read them. ``cache`` and ``caches`` replace the GPUs' and
    other kinds' caches (tests)."""

    def __init__(self, cache: Optional[ProbeCache] = None,
                 caches: Optional[Mapping[str, ProbeCache]] = None) -> None:
        # The agent's own environment is the node's; Ray gives it the node IP.
        bound = probes(os.environ, agent_node_ip())
        self.caches: Dict[str, ProbeCache] = {kind: ProbeCache(probe)
                                              for kind, probe in bound.items()}
        self.caches.update(caches or {})
        if cache is not None:
            self.caches[GPUS] = cache

    async def probe_async(self, runtime_env: Optional[Mapping[str, Any]] = None) -> NodeGpus:
        """Probe off the event loop before ``decide_and_write`` needs the results: the
        GPUs always, the other facts only when the job's packs read them."""
        gpus = await self.caches[GPUS].get_async()
        for kind in _fact_kinds(runtime_env) if runtime_env is not None else ():
            await self.caches[kind].get_async()
        return gpus

    def facts(self, spec: Spec) -> NodeFacts:
        return node_facts(fact_kinds(spec.packs), lambda kind: self.caches[kind].get())

    def decide_and_write(self, runtime_env: Mapping[str, Any],
                         env_vars: MutableMapping[str, str], node_environ: Mapping[str, str],
                         logger: logging.Logger) -> Decision:
        """Decide for this worker on this node and write its variables."""
        spec = parse_field(runtime_env.get(FIELD))
        result = decide_node(spec, self.facts(spec), env_vars, node_environ, via=VIA_PLUGIN)
        result.write_to(env_vars, logger)
        return result.decision


def _fact_kinds(runtime_env: Mapping[str, Any]) -> frozenset:
    try:
        spec = parse_field(runtime_env.get(FIELD))
    except Exception:  # validate and decide_and_write report a bad field; nothing to probe for it
        return frozenset()
    return fact_kinds(spec.packs)
