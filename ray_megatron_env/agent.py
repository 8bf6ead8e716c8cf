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
from typing import Any, List, Mapping, MutableMapping, Optional, Sequence

from .cache import ProbeCache
from .decision import decide_node, split_driver_env
from .record import VIA_PLUGIN, Decision
from .frameworks import parse_field
from .names import FABRIC, FIELD, NET, P2P
from .node import NodeFacts, NodeGpus
from .packs import fact_kinds
from .packs.connections import explicit_value
from .probe import probe_fabric, probe_gpus, probe_net, probe_p2p
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
    """The plugin's state on one node: its GPU probe and, for jobs that ask
    for a pack that reads them, its fabric, peer-access and network probes;
    each cached."""

    def __init__(self, cache: Optional[ProbeCache] = None,
                 fabric_cache: Optional[ProbeCache] = None,
                 p2p_cache: Optional[ProbeCache] = None,
                 net_cache: Optional[ProbeCache] = None) -> None:
        self.cache = cache or ProbeCache(probe_gpus)
        self.fabric_cache = fabric_cache or ProbeCache(probe_fabric)
        self.p2p_cache = p2p_cache or ProbeCache(probe_p2p)
        self.net_cache = net_cache or ProbeCache(lambda: probe_net(os.environ, agent_node_ip()))

    def _caches(self, kinds: frozenset) -> List[ProbeCache]:
        return [cache for kind, cache in ((FABRIC, self.fabric_cache), (P2P, self.p2p_cache),
                                          (NET, self.net_cache)) if kind in kinds]

    async def probe_async(self, runtime_env: Optional[Mapping[str, Any]] = None) -> NodeGpus:
        """Probe off the event loop before ``decide_and_write`` needs the results: the
        GPUs always, the other facts only when the job's packs read them."""
        gpus = await self.cache.get_async()
        for cache in self._caches(_fact_kinds(runtime_env) if runtime_env is not None
                                  else frozenset()):
            await cache.get_async()
        return gpus

    def facts(self, spec: Spec) -> NodeFacts:
        kinds = fact_kinds(spec.packs)
        return NodeFacts(self.cache.get(), self.fabric_cache.get() if FABRIC in kinds else None,
                         self.p2p_cache.get() if P2P in kinds else None,
                         self.net_cache.get() if NET in kinds else None)

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
