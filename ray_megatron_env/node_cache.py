"""One GPU probe per node, shared by every worker process on it.

The plugin probes once per agent process (``probe.ProbeCache``). The
worker-side fallback runs in each worker process instead, so its probe is
kept in a file in the node's Ray session folder, keyed by the Ray node id:
the first worker to start on a node probes, every later one reads, for as
long as that Ray node runs. An exclusive ``flock`` around read-probe-write
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
from typing import Any, Callable, Dict, Optional

from .gpus import NodeGpus
from .probe import RETRY_FAILED_AFTER_S

FOLDER = "megatron_env"


def to_record(gpus: NodeGpus) -> Dict[str, Any]:
    return dataclasses.asdict(gpus)


def from_record(data: Dict[str, Any]) -> NodeGpus:
    known = {f.name for f in dataclasses.fields(NodeGpus)}
    values = {k: v for k, v in data.items() if k in known}
    caps = values.get("capabilities")
    values["capabilities"] = None if caps is None else tuple(tuple(c) for c in caps)
    return NodeGpus(**values)


class NodeCache:
    """The node's probe result in ``<session folder>/megatron_env/``."""

    def __init__(self, session_folder: str, node_id: str,
                 retry_failed_after_s: float = RETRY_FAILED_AFTER_S,
                 clock: Callable[[], float] = time.time) -> None:
        self.folder = os.path.join(session_folder, FOLDER)
        self.path = os.path.join(self.folder, f"probe-{node_id}.json")
        self._retry_after = retry_failed_after_s
        self._clock = clock

    def get(self, probe: Callable[[], NodeGpus]) -> NodeGpus:
        try:
            os.makedirs(self.folder, exist_ok=True)
            lock = open(self.path + ".lock", "a")
        except OSError:
            return self._stamp(probe())
        with lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            cached = self._read()
            if cached is not None and self._fresh(cached):
                return cached
            result = self._stamp(probe())
            self._write(result)
            return result

    def _fresh(self, gpus: NodeGpus) -> bool:
        # A node's GPUs do not change under a running raylet; a failed probe
        # is retried, as the agent's cache does, so a transient error does
        # not stick for the life of the node.
        return gpus.is_known or self._clock() - (gpus.probed_at or 0.0) < self._retry_after

    def _read(self) -> Optional[NodeGpus]:
        try:
            with open(self.path) as f:
                return from_record(json.load(f))
        except (OSError, ValueError, TypeError):
            return None  # absent, or written by another version: probe again

    def _write(self, gpus: NodeGpus) -> None:
        temporary = f"{self.path}.{os.getpid()}.tmp"
        try:
            with open(temporary, "w") as f:
                json.dump(to_record(gpus), f)
            os.replace(temporary, self.path)
        except OSError:
            pass  # the next worker probes again

    def _stamp(self, gpus: NodeGpus) -> NodeGpus:
        return dataclasses.replace(gpus, probed_at=self._clock(), probe_pid=os.getpid())
