"""What the plugin does on a node, free of Ray's plugin plumbing.

``plugin.py`` is the thin class Ray loads; this module is where a worker's
environment is decided, so it can be exercised directly with a plain dict
for ``env_vars`` and a fake probe. The worker-side fallback (``worker.py``)
writes its decision through the same ``write_decision``, so both paths
apply one precedence and leave one record.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Mapping, MutableMapping, Optional

from .decision import DECISION_VARIABLE, EXPLICIT, VIA_PLUGIN, Decision, decide_for_worker
from .field import explicit_value, parse_field
from .gpus import NodeGpus
from .probe import ProbeCache
from .rules import VARIABLE
from .spec import Spec
from .values import FIELD


def check_runtime_env(runtime_env: Mapping[str, Any]) -> None:
    """Raise the user-facing error for a bad field or explicit value."""
    parse_field(runtime_env.get(FIELD))
    explicit_value(runtime_env.get("env_vars"))


def write_decision(spec: Spec, gpus: NodeGpus, env_vars: MutableMapping[str, str], *,
                   inherited: Optional[str], via: str, logger: logging.Logger) -> Decision:
    """Decide for one worker and write its two variables into ``env_vars``.

    ``env_vars`` are the worker's own (the job's merged with its actor's),
    which is where a framework marks its process kinds and where an explicit
    value lives; ``inherited`` is the node's own value, if any.
    """
    decision = decide_for_worker(spec, gpus, env_vars, inherited=inherited)
    decision = dataclasses.replace(decision, via=via)
    if decision.source != EXPLICIT:
        if decision.value is not None:
            env_vars[VARIABLE] = decision.value
        else:  # a framework's blanket value, decided anew as "unset"
            env_vars.pop(VARIABLE, None)
    env_vars[DECISION_VARIABLE] = decision.to_json()
    log_decision(logger, decision)
    return decision


class NodeAgent:
    """The plugin's state on one node: its GPU probe, cached."""

    def __init__(self, cache: Optional[ProbeCache] = None) -> None:
        self.cache = cache or ProbeCache()

    async def probe_async(self) -> NodeGpus:
        return await self.cache.get_async()

    def apply(self, runtime_env: Mapping[str, Any], env_vars: MutableMapping[str, str],
              node_environ: Mapping[str, str], logger: logging.Logger) -> Decision:
        """Decide for this worker on this node and write its two variables."""
        return write_decision(parse_field(runtime_env.get(FIELD)), self.cache.get(), env_vars,
                              inherited=node_environ.get(VARIABLE), via=VIA_PLUGIN,
                              logger=logger)


def log_decision(logger: logging.Logger, decision: Decision) -> None:
    shown = decision.value if decision.value is not None else "unset"
    logger.info("%s: %s=%s (source: %s; via: %s; GPUs: %s): %s", FIELD, VARIABLE, shown,
                decision.source, decision.via, decision.gpus, decision.reason)
    for warning in decision.warnings:
        logger.warning("%s: %s", FIELD, warning)
