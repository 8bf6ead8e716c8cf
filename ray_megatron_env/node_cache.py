"""One probe per node, shared by every worker process on it.

The plugin probes once per agent process (``probe.ProbeCache``). The
worker-side fallback runs in each worker process instead, so its probe is
kept in a file in the node's Ray session folder, keyed by the Ray node id:
the first worker to start on a node probes, every later one reads, for as
long as that Ray node runs. The GPUs and the fabric facts (read only for
jobs whose packs need them) and the peer access (likewise) have a file each. An exclusive ``flock`` around read-probe-write
makes workers that start at the same moment wait for the one probe rather
than each run their own; the file is replaced atomically, so a reader never
sees half of it. Any file-system problem falls back to probing in-process:
a slower start, never a wrong one.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional

if TYPE_CHECKING:  # pragma: no cover
    from .gpus import NodeGpus
    from .node import NodeFabric, NodeP2P

FOLDER = "megatron_env"
# probe.RETRY_FAILED_AFTER_S (a test keeps them equal); named here so that a
# worker reading a cached decision imports nothing of the core.
RETRY_FAILED_AFTER_S = 60.0



def to_record(facts: Any) -> Dict[str, Any]:
    return dataclasses.asdict(facts)


def gpus_from_record(data: Dict[str, Any]) -> "NodeGpus":
    from .gpus import NodeGpus

    values = _known_fields(NodeGpus, data)
    caps = values.get("capabilities")
    values["capabilities"] = None if caps is None else tuple(tuple(c) for c in caps)
    return NodeGpus(**values)


def fabric_from_record(data: Dict[str, Any]) -> "NodeFabric":
    from .node import GpuFabric, NodeFabric

    values = _known_fields(NodeFabric, data)
    gpus = values.get("gpus")
    values["gpus"] = None if gpus is None else tuple(GpuFabric(**g) for g in gpus)
    return NodeFabric(**values)


def p2p_from_record(data: Dict[str, Any]) -> "NodeP2P":
    from .node import NodeP2P

    values = _known_fields(NodeP2P, data)
    values["without"] = tuple(tuple(p) for p in values.get("without") or ())
    driver = values.get("cuda_driver")
    values["cuda_driver"] = None if driver is None else tuple(driver)
    return NodeP2P(**values)


KINDS: Dict[str, Callable[[Dict[str, Any]], Any]] = {
    "gpus": gpus_from_record, "fabric": fabric_from_record, "p2p": p2p_from_record}
# The key of each kind's record that is None when its probe failed.
KNOWN_KEYS = {"gpus": "capabilities", "fabric": "gpus", "p2p": "count"}


def _known_fields(cls: type, data: Dict[str, Any]) -> Dict[str, Any]:
    known = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in data.items() if k in known}


class NodeCache:
    """The node's probe result in ``<session folder>/megatron_env/``."""

    def __init__(self, session_folder: str, node_id: str,
                 retry_failed_after_s: float = RETRY_FAILED_AFTER_S,
                 clock: Callable[[], float] = time.time) -> None:
        self.folder = os.path.join(session_folder, FOLDER)
        self.node_id = node_id
        self._retry_after = retry_failed_after_s
        self._clock = clock

    def path(self, kind: str = "gpus") -> str:
        return os.path.join(self.folder, f"{kind}-{self.node_id}.json")

    def get(self, probe: Callable[[], Any], kind: str = "gpus") -> Any:
        """The node's ``kind`` of facts (``gpus``, ``fabric`` or ``p2p``), probed with
        ``probe`` only if no worker on the node has yet."""
        path = self.path(kind)
        try:
            os.makedirs(self.folder, exist_ok=True)
            lock = open(path + ".lock", "a")
        except OSError:
            return self._stamp(probe())
        with lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            cached = self._read(path, KINDS[kind])
            if cached is not None and self._fresh(cached):
                return cached
            result = self._stamp(probe())
            self._write(path, result)
            return result

    def stamp(self, kinds: Any) -> Optional[str]:
        """The cached facts of ``kinds`` as they are on disk, when every one is
        there and known (a probe that failed is retried, so what a decision
        was made from then may change); None otherwise."""
        parts = []
        for kind in kinds:
            try:
                with open(self.path(kind)) as f:
                    text = f.read()
                known = json.loads(text).get(KNOWN_KEYS[kind])
            except (OSError, ValueError, AttributeError):
                return None
            if known is None:
                return None
            parts.append(text)
        return "\n".join(parts)

    def decision(self, key: str) -> Optional[Dict[str, Any]]:
        """A decision already made on this node for the same inputs (``key``)."""
        try:
            with open(os.path.join(self.folder, f"decision-{self.node_id}-{key}.json")) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def keep_decision(self, key: str, entry: Dict[str, Any]) -> None:
        path = os.path.join(self.folder, f"decision-{self.node_id}-{key}.json")
        self._write_text(path, json.dumps(entry))

    def _fresh(self, facts: Any) -> bool:
        # A node's hardware does not change under a running raylet; a failed
        # probe is retried, as the agent's cache does, so a transient error
        # does not stick for the life of the node.
        return facts.is_known or self._clock() - (facts.probed_at or 0.0) < self._retry_after

    @staticmethod
    def _read(path: str, decode: Callable[[Dict[str, Any]], Any]) -> Optional[Any]:
        try:
            with open(path) as f:
                return decode(json.load(f))
        except (OSError, ValueError, TypeError):
            return None  # absent, or written by another version: probe again

    @classmethod
    def _write(cls, path: str, facts: Any) -> None:
        cls._write_text(path, json.dumps(to_record(facts)))

    @staticmethod
    def _write_text(path: str, text: str) -> None:
        temporary = f"{path}.{os.getpid()}.tmp"
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(temporary, "w") as f:
                f.write(text)
            os.replace(temporary, path)
        except OSError:
            pass  # the next worker does the work again

    def _stamp(self, facts: Any) -> Any:
        return dataclasses.replace(facts, probed_at=self._clock(), probe_pid=os.getpid())
