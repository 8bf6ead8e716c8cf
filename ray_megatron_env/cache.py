"""One probe per node for each kind of fact, shared by the workers there.

The plugin path probes in the node's agent: ``ProbeCache``, one per kind,
in process. The setup-hook path runs in each worker process instead, so its
facts (and the decisions made from them) are kept in files in the node's
Ray session folder, keyed by the Ray node id: ``NodeCache``. The first
worker to start on a node probes, every later one reads. An exclusive
``flock`` around read-probe-write makes workers that start at the same
moment wait for the one probe rather than each run their own; a file is
replaced atomically, so a reader never sees half of it. Any file-system
problem falls back to probing in-process: a slower start, never a wrong one.

Both follow one freshness rule (``fresh``). Light on purpose: a worker that
reads a cached decision imports nothing of the core.
"""

from __future__ import annotations

import asyncio
import dataclasses
import fcntl
import json
import os
import threading
import time
from typing import Any, Callable, Dict, Iterable, Mapping, Optional

from .names import FABRIC, GPUS, NET, P2P, PACK_FACT_KINDS, PACK_VARIABLES

FOLDER = "megatron_env"
RETRY_FAILED_AFTER_S = 60.0
# The key of each kind's record that is None when its probe failed.
KNOWN_KEYS = {GPUS: "capabilities", FABRIC: "gpus", P2P: "count", NET: "ifaces"}


def fresh(facts: Any, age_s: float, retry_failed_after_s: float) -> bool:
    """A node's hardware does not change under a running raylet, so facts
    that were read stay; a failed probe is retried after
    ``retry_failed_after_s``, so a transient error does not stick for the
    life of the node."""
    return facts.is_known or age_s < retry_failed_after_s


class ProbeCache:
    """One probe per agent process, shared by every worker start on the node.

    A successful result is kept for the life of the process (a node's GPUs do
    not change under a running raylet); a failed one is retried after
    ``retry_failed_after_s`` so a transient NVML error does not stick.
    ``get_async`` runs the probe in a thread so a slow nvidia-smi never blocks
    the agent's event loop, and concurrent callers share one probe.
    """

    def __init__(self, probe: Callable[[], Any],
                 retry_failed_after_s: float = RETRY_FAILED_AFTER_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._probe = probe
        self._retry_after = retry_failed_after_s
        self._clock = clock
        self._lock = threading.Lock()
        self._result: Optional[Any] = None
        self._taken_at = 0.0
        self._inflight: Optional[asyncio.Future] = None
        self.runs = 0

    def _fresh(self) -> bool:
        return self._result is not None and fresh(self._result, self._clock() - self._taken_at,
                                                  self._retry_after)

    def get(self) -> Any:
        with self._lock:
            if not self._fresh():
                result = self._probe()
                self._result = dataclasses.replace(
                    result, probed_at=time.time(), probe_pid=os.getpid())
                self._taken_at = self._clock()
                self.runs += 1
            return self._result

    async def get_async(self) -> Any:
        if self._fresh():
            return self._result
        if self._inflight is None or self._inflight.done():
            self._inflight = asyncio.get_running_loop().run_in_executor(None, self.get)
        return await asyncio.shield(self._inflight)


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
        """The node's ``kind`` of facts (``gpus``, ``fabric``, ``p2p`` or ``net``), probed with
        ``probe`` only if no worker on the node has yet."""
        path = self.path(kind)
        try:
            os.makedirs(self.folder, exist_ok=True)
            lock = open(path + ".lock", "a")
        except OSError:
            return self._stamp(probe())
        with lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            cached = self._read(path, kind)
            if cached is not None and fresh(cached, self._clock() - (cached.probed_at or 0.0),
                                            self._retry_after):
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

    def decision_key(self, field: Any, environ: Mapping[str, str],
                     node_environ: Mapping[str, str], given: Iterable[str]) -> Optional[str]:
        """The key of a decision made on this node for one worker's inputs:
        the field, the values of every variable a decision reads (the
        worker's and the node's), those of them a runtime env gave
        (``given``), and the node's cached facts the field's packs read.
        None where a fact is not cached yet, or the field cannot be read
        (the full path then says what is wrong with it)."""
        import hashlib

        try:
            processes = [rule["variable"] for rule in field.get("processes", ())]
            packs = field.get("packs") or ()
            kinds = sorted({kind for name in ([packs] if isinstance(packs, str) else packs)
                            for kind in PACK_FACT_KINDS.get(name, ())})
        except (AttributeError, TypeError, KeyError):
            return None
        facts = self.stamp((GPUS, *kinds))
        if facts is None:
            return None
        names = sorted(set(PACK_VARIABLES) | set(processes))
        material = json.dumps([field, [environ.get(n) for n in names],
                               [node_environ.get(n) for n in names], sorted(given), facts],
                              sort_keys=True)
        return hashlib.sha256(material.encode()).hexdigest()[:32]

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

    @staticmethod
    def _read(path: str, kind: str) -> Optional[Any]:
        from .node import facts_from_record

        try:
            with open(path) as f:
                return facts_from_record(kind, json.load(f))
        except (OSError, ValueError, TypeError):
            return None  # absent, or written by another version: probe again

    @classmethod
    def _write(cls, path: str, facts: Any) -> None:
        cls._write_text(path, json.dumps(dataclasses.asdict(facts)))

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
