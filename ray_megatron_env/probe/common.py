"""What every source of the probe shares: its variables, its errors, the
node's CUDA_VISIBLE_DEVICES applied as CUDA applies it, and one bounded way
to run a tool (nvidia-smi, nvidia-imex-ctl) so that a hung one never holds a
worker start."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from typing import Any, List, Optional, Sequence

from ..node import Capability

# ROOT_VARIABLE: where the kernel's device listings are looked for; "/"
# unless the node's /proc and /dev are mounted elsewhere (and in tests, a
# prepared folder).
from ..names import DEVICE_ROOT_VARIABLE as ROOT_VARIABLE

METHODS = ("auto", "nvml", "nvidia-smi")

SMI_TIMEOUT_S = 3.0

NVML_TIMEOUT_S = 3.0

_INDEX = re.compile(r"^-?\d+$")


class ProbeError(Exception):
    """A probe backend could not tell what the GPUs are."""

class VisibilityError(ProbeError):
    """The node's CUDA_VISIBLE_DEVICES names GPUs the node does not have.
    Another backend would read the same variable, so there is no fallback."""

class Absent(ProbeError):
    """The backend is not installed here; that alone says nothing about GPUs."""


def root(environ) -> str:
    """Where the node's /proc and /dev are looked for."""
    return environ.get(ROOT_VARIABLE, "/").strip() or "/"


def select_visible(visible: Optional[str], devices: List[tuple],
            extra_uuids: Sequence[tuple] = ()) -> List[Capability]:
    """Apply the node's CUDA_VISIBLE_DEVICES to ``devices``, ``[(uuid, capability)]``
    in index order; ``extra_uuids`` (MIG instances) can be named by UUID only.

    Indices and (prefixes of) GPU-/MIG- UUIDs are accepted as CUDA does; a
    negative index ends the list as in CUDA (``-1`` hides every GPU). A name
    that matches no device is an error rather than CUDA's silent truncation,
    because the decision would otherwise describe GPUs the workers never see.
    """
    if visible is None:
        return [cap for _, cap in devices]
    chosen: List[Capability] = []
    for entry in (e.strip() for e in visible.split(",")):
        if not entry:
            if visible.strip():
                raise VisibilityError(
                    f"CUDA_VISIBLE_DEVICES={clip(visible)!r} has an empty entry")
            break
        if _INDEX.match(entry):
            index = int(entry)
            if index < 0:
                break
            if index >= len(devices):
                raise VisibilityError(f"CUDA_VISIBLE_DEVICES names device {index}, but the "
                                      f"node has {len(devices)} GPU(s)")
            chosen.append(devices[index][1])
            continue
        matches = [cap for uuid, cap in (*devices, *extra_uuids)
                   if uuid and uuid.startswith(entry)]
        if len(matches) != 1:
            problem = "no" if not matches else "more than one"
            raise VisibilityError(f"CUDA_VISIBLE_DEVICES entry {clip(entry)!r} matches "
                                  f"{problem} GPU UUID on the node")
        chosen.append(matches[0])
    return chosen

def run_command(command: Sequence[str], options: Sequence[str], timeout_s: float) -> Optional[str]:
    """nvidia-smi's output with ``options``, bounded; ``None`` when it says
    the node has no devices. Raises ``Absent`` or ``ProbeError``."""
    args = [*command, *options]
    try:
        # Its own session, so a hung nvidia-smi and anything it spawned can
        # be killed together and the pipes close.
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    except FileNotFoundError:
        raise Absent(f"{command[0]} is not installed") from None
    except OSError as exc:
        raise ProbeError(f"cannot run {command[0]}: {exc.strerror or exc}") from None
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        raise ProbeError(f"{command[0]} did not answer within {timeout_s:g} s") from None
    text = out.decode("utf-8", "replace")
    if proc.returncode != 0:
        if "No devices were found" in text + err.decode("utf-8", "replace"):
            return None
        first = (err or out).decode("utf-8", "replace").strip().splitlines()[:1]
        raise ProbeError(f"{command[0]} exited with {proc.returncode}: "
                         f"{clip(first[0]) if first else 'no output'}")
    return text

def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        proc.kill()
    try:
        proc.communicate(timeout=1.0)
    except subprocess.TimeoutExpired:
        pass  # a grandchild escaped the group; its pipe is dropped with proc

def visible_detail(visible: Optional[str], count: int) -> str:
    scope = "all" if visible is None else f"CUDA_VISIBLE_DEVICES={clip(visible)}"
    return f"{count} device(s) on the node, {scope} visible"

def text_of(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)

def clip(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
