"""What the plugin does on a node, free of Ray's plugin plumbing.

``plugin.py`` is the thin class Ray loads; this module is where a worker's
environment is decided, so it can be exercised directly with a plain dict
for ``env_vars`` and a fake probe. The worker-side fallback (``worker.py``)
writes its decision through the same ``write_decision``, so both paths
apply one precedence and leave one record.
"""

from __future__ import annotations

import logging
from typing import Any, List, Mapping, MutableMapping, Optional, Tuple

from .cache import ProbeCache
from .decision import VIA_PLUGIN, Decision, decide_node
from .field import parse_field
from .packs.connections import explicit_value
from .node import NodeGpus
from .node import NodeFacts
from .node import FABRIC, P2P
from .packs import get_pack
from .probe import probe_fabric, probe_gpus, probe_p2p
from .engines import VARIABLE
from .spec import Spec
from .values import FIELD


def check_runtime_env(runtime_env: Mapping[str, Any]) -> None:
    """Raise the user-facing error for a bad field or explicit value."""
    parse_field(runtime_env.get(FIELD))
    explicit_value(runtime_env.get("env_vars"))


def fact_kinds(spec: Spec) -> frozenset:
    """The kinds of node facts besides the GPUs that the job's packs read
    (packs.FACT_KINDS): only those are probed."""
    return frozenset(kind for name in spec.packs for kind in get_pack(name).fact_kinds)


def needs_fabric(spec: Spec) -> bool:
    """Whether one of the job's packs reads the node's fabric facts."""
    return FABRIC in fact_kinds(spec)


def write_decision(spec: Spec, facts: NodeFacts, env_vars: MutableMapping[str, str],
                   node_environ: Mapping[str, str], *, via: str,
                   logger: logging.Logger) -> Decision:
    """Decide for one worker and write its variables into ``env_vars``.

    ``env_vars`` are the worker's own (the job's merged with its actor's),
    which is where a framework marks its process kinds and where an explicit
    value lives; ``node_environ`` is what the worker would inherit from the
    node.
    """
    result = decide_node(spec, facts, env_vars, node_environ, via=via)
    result.apply(env_vars)
    log_decision(logger, result.decision)
    return result.decision


class NodeAgent:
    """The plugin's state on one node: its GPU probe and, for jobs that ask
    for a pack that reads them, its fabric and peer-access probes; each cached."""

    def __init__(self, cache: Optional[ProbeCache] = None,
                 fabric_cache: Optional[ProbeCache] = None,
                 p2p_cache: Optional[ProbeCache] = None) -> None:
        self.cache = cache or ProbeCache(probe_gpus)
        self.fabric_cache = fabric_cache or ProbeCache(probe_fabric)
        self.p2p_cache = p2p_cache or ProbeCache(probe_p2p)

    def _caches(self, kinds: frozenset) -> List[ProbeCache]:
        return [cache for kind, cache in ((FABRIC, self.fabric_cache), (P2P, self.p2p_cache))
                if kind in kinds]

    async def probe_async(self, runtime_env: Optional[Mapping[str, Any]] = None) -> NodeGpus:
        """Probe off the event loop before ``apply`` needs the results: the
        GPUs always, the other facts only when the job's packs read them."""
        gpus = await self.cache.get_async()
        for cache in self._caches(_fact_kinds(runtime_env) if runtime_env is not None
                                  else frozenset()):
            await cache.get_async()
        return gpus

    def facts(self, spec: Spec) -> NodeFacts:
        kinds = fact_kinds(spec)
        return NodeFacts(self.cache.get(), self.fabric_cache.get() if FABRIC in kinds else None,
                         self.p2p_cache.get() if P2P in kinds else None)

    def apply(self, runtime_env: Mapping[str, Any], env_vars: MutableMapping[str, str],
              node_environ: Mapping[str, str], logger: logging.Logger) -> Decision:
        """Decide for this worker on this node and write its variables."""
        spec = parse_field(runtime_env.get(FIELD))
        return write_decision(spec, self.facts(spec), env_vars, node_environ, via=VIA_PLUGIN,
                              logger=logger)


def _fact_kinds(runtime_env: Mapping[str, Any]) -> frozenset:
    try:
        spec = parse_field(runtime_env.get(FIELD))
    except Exception:  # validate and apply report a bad field; nothing to probe for it
        return frozenset()
    return fact_kinds(spec)


def log_decision(logger: logging.Logger, decision: Decision) -> None:
    for level, line in log_lines(decision):
        logger.log(level, "%s", line)


def log_lines(decision: Decision) -> List[Tuple[int, str]]:
    """The node log's lines for one decision: the value and why, each pack
    variable, each warning."""
    shown = decision.value if decision.value is not None else "unset"
    lines = [(logging.INFO, f"{FIELD}: {VARIABLE}={shown} (source: {decision.source}; via: "
                            f"{decision.via}; GPUs: {decision.gpus}): {decision.reason}")]
    for variable, entry in decision.packs.items():
        value = entry["value"] if entry["value"] is not None else "unset"
        lines.append((logging.INFO, f"{FIELD}: {variable}={value} (pack {entry['pack']}, "
                                    f"{entry['action']}, {entry['strength']}; source: "
                                    f"{entry['source']}; via: {decision.via}): {entry['reason']}"))
    lines += [(logging.WARNING, f"{FIELD}: {warning}") for warning in decision.warnings]
    return lines
