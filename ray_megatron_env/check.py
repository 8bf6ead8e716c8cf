"""Preflight on a live cluster: what every node will give a worker, and why.

A node whose ``ray start`` lacked ``RAY_RUNTIME_ENV_PLUGINS`` ignores the
``megatron_env`` field with one WARNING in its own log; there the worker-side
setup hook decides instead, if the job env carries it, and nothing does if
not. ``check_cluster`` starts one short-lived actor on every alive node with
the job env ``build_runtime_env`` makes and reads back what its worker
actually got and which path decided, so both are observed, not assumed.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import asdict, dataclass
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from .frameworks.loading import ConfigLike
from .names import (
    CONNECTIONS_VARIABLE, DECISION_VARIABLE, FACT_KINDS, FIELD, OPTIONAL_PACKS, PACK_VARIABLES,
)
from .record import VIA_PLUGIN, Decision
from .runtime_env import build_runtime_env
from .setup_hook import as_actor_env
from .spec import Roles, Spec

DEFAULT_TIMEOUT_S = 60.0
CONNECT_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class NodeReport:
    """What one node gave a worker started with the field."""

    node_id: str  # Ray node id, hex
    ip: str
    # The node's agent has the plugin (it made the decision); None when the
    # probe actor failed or did not answer, so nobody knows.
    registered: Optional[bool]
    value: Optional[str]  # the worker's CUDA_DEVICE_MAX_CONNECTIONS; None: unset
    decision: Optional[Decision] = None
    error: Optional[str] = None  # the probe actor could not start or answer
    label: Optional[str] = None  # a human name, where the caller has one
    # A pack the job did not ask for that would prevent a failure here.
    advice: Optional[str] = None

    @property
    def via(self) -> Optional[str]:
        """The path that decided: 'plugin', 'setup-hook', or None (neither)."""
        if self.decision is None:
            return None
        return self.decision.via or VIA_PLUGIN  # releases before 'via' had only the plugin

    @property
    def ok(self) -> bool:
        """Answered, decided by some path, GPUs known, no hard requirement broken."""
        return self.problem() is None

    def problem(self) -> Optional[str]:
        if self.error is not None:
            return self.error
        if self.decision is None:
            return ("no path decided on this node: the plugin is not registered here and the "
                    "worker-side setup hook did not run (a runtime env not made by "
                    "build_runtime_env, or a job env without its worker_process_setup_hook); "
                    "use build_runtime_env(cfg) as the job env, or register the plugin "
                    "(ray-megatron-env register)")
        if not self.decision.satisfied:
            return "; ".join(self.decision.warnings) or "the value breaks the requirement"
        if self.decision.gpus is None:
            return (f"the GPU probe failed ({self.decision.probe.get('error')}); the node "
                    "gets the conservative value")
        return None

    def to_dict(self) -> Dict[str, Any]:
        out = asdict(self)
        out["decision"] = self.decision.to_dict() if self.decision else None
        out["ok"] = self.ok
        out["via"] = self.via
        out["problem"] = self.problem()
        return out


class _WorkerView:
    """The probe: reports the environment its worker was started with and,
    when asked, the node's facts for packs the job did not ask for (its
    fabric, its GPUs' peer access and CUDA driver, its network) and the
    values its worker has of every variable a pack reads."""

    def view(self, fabric: bool = False) -> Tuple[Optional[str], ...]:
        seen = (os.environ.get(CONNECTIONS_VARIABLE), os.environ.get(DECISION_VARIABLE))
        if not fabric:
            return seen
        import ray

        from .probe import probes

        bound = probes(os.environ, ray.util.get_node_ip_address())
        facts = {kind: asdict(bound[kind]()) for kind in FACT_KINDS}
        values = {name: os.environ[name] for name in PACK_VARIABLES if name in os.environ}
        return seen + (json.dumps(facts), json.dumps(values))


def alive_nodes() -> List[Tuple[str, str]]:
    import ray

    return [(n["NodeID"], n["NodeManagerAddress"]) for n in ray.nodes() if n["Alive"]]


def select_nodes(alive: Sequence[Tuple[str, str]],
                 wanted: Sequence[str]) -> List[Tuple[str, str]]:
    """The ``alive`` (node id, IP) pairs that ``wanted`` names, in cluster
    order: every node whose id starts with an entry (check's table shows the
    first 8 digits) or whose IP is one. An entry that names no alive node is
    an error, never an empty check."""
    from .errors import NodeSelectionError

    entries = [w.strip().lower() for w in wanted if w.strip()]
    if not entries:
        raise NodeSelectionError("no node named: give a node id, an id prefix or an IP")

    def names(entry: str, node: Tuple[str, str]) -> bool:
        return node[0].startswith(entry) or node[1] == entry

    unmatched = [e for e in entries if not any(names(e, node) for node in alive)]
    if unmatched:
        raise NodeSelectionError(
            f"no alive node has the id (or id prefix) or IP {', '.join(map(repr, unmatched))}; "
            f"alive: {', '.join(f'{node_id[:8]} ({ip})' for node_id, ip in alive) or 'none'}")
    return [node for node in alive if any(names(e, node) for e in entries)]


def observe(nodes: Iterable[Tuple[str, str]], runtime_env: Dict[str, Any],
            timeout_s: float = DEFAULT_TIMEOUT_S,
            labels: Optional[Dict[str, str]] = None) -> List[NodeReport]:
    """Start one actor per node with ``runtime_env`` and report what it got.

    Needs a connected driver (``ray.init``). Actors ask for no resources and
    are pinned by node id, so nodes with and without GPUs (or CPUs) are all
    reached; each ends as soon as it has answered.
    """
    return observe_many([(nodes, runtime_env)], timeout_s, labels)[0]


def observe_many(plans: Sequence[Tuple[Iterable[Tuple[str, str]], Dict[str, Any]]],
                 timeout_s: float = DEFAULT_TIMEOUT_S,
                 labels: Optional[Dict[str, str]] = None,
                 fabric: bool = False) -> List[List[NodeReport]]:
    """``observe`` for several runtime envs at once (one wait for all): a
    list of reports per ``(nodes, runtime_env)`` plan."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    remote = ray.remote(num_cpus=0, max_restarts=0)(_WorkerView)
    targets = [(plan, list(nodes)) for plan, (nodes, _) in enumerate(plans)]
    starts = [(plan, node) for plan, nodes in targets for node in nodes]
    envs = [as_actor_env(env) for _, env in plans]
    actors = [remote.options(
        runtime_env=envs[plan],
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
    ).remote() for plan, (node_id, _) in starts]
    answers = _collect(actors, timeout_s, fabric)
    labels = labels or {}
    reports: List[List[NodeReport]] = [[] for _ in plans]
    for i, (plan, (node_id, ip)) in enumerate(starts):
        reports[plan].append(_report(node_id, ip, answers.get(i), timeout_s, labels.get(node_id)))
    return reports


def _collect(actors: List[Any], timeout_s: float, fabric: bool = False) -> Dict[int, Any]:
    """Each actor's answer (or the exception it raised), by index. An actor
    is killed as soon as it has answered, so the ones still starting on a busy
    node do not share its CPU with idle workers; ``ray.kill`` ends the
    process without Python's interpreter shutdown (a graceful exit costs a
    worker start about half as much again) and Ray records it as intended.
    One that did not answer in time is killed too."""
    import ray

    pending = {actor.view.remote(fabric): i for i, actor in enumerate(actors)}
    answers: Dict[int, Any] = {}
    deadline = time.monotonic() + timeout_s
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1,
                            timeout=max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        for ref in ready:
            i = pending.pop(ref)
            try:
                answers[i] = ray.get(ref)
            except Exception as exc:  # RuntimeEnvSetupError, actor death: report it
                answers[i] = exc
            ray.kill(actors[i])
    for i in pending.values():
        ray.kill(actors[i])
    return answers


def _report(node_id: str, ip: str, answer: Any, timeout_s: float,
            label: Optional[str]) -> NodeReport:
    if answer is None:
        return NodeReport(node_id, ip, None, None, label=label,
                          error=f"no answer within {timeout_s:g} s (node busy or dead?)")
    if isinstance(answer, Exception):
        return NodeReport(node_id, ip, None, None, label=label, error=_error_text(answer))
    value, text = answer[:2]
    decision = Decision.from_json(text) if text else None
    registered = decision is not None and (decision.via or VIA_PLUGIN) == VIA_PLUGIN
    return NodeReport(node_id, ip, registered, value, decision, label=label,
                      advice=_advice(answer[2], text, label or node_id[:8], answer[3])
                      if len(answer) > 2 and text else None)


# The line of a traceback that names the exception ("ModuleNotFoundError: ...",
# "ray_megatron_env.plugin.BrokenInstallError: ...").
_EXCEPTION_LINE = re.compile(r"^[\w.]*(Error|Exception)\b[^:]*: ")
NOT_SHIPPED = ("the job env's setup hook could not import this package on the node: install "
               "it there, or ship it with the job (check --ship-package; "
               "base={'py_modules': [ray_megatron_env]})")


def _error_text(error: Exception) -> str:
    """What went wrong, in one line: the exception the node raised (Ray puts
    it inside a longer text: a setup hook's traceback ends with Ray's own
    line about the actor), not the last line of the text."""
    text = str(error)
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    named = [line for line in lines if _EXCEPTION_LINE.match(line)]
    line = named[-1] if named else (lines[-1] if lines else "")
    if "setup hook" in text and "No module named 'ray_megatron_env'" in line:
        return f"{type(error).__name__}: {NOT_SHIPPED} ({line})"
    return f"{type(error).__name__}: {line}"


def _advice(facts_json: str, decision_json: str, where: str,
            environ_json: Optional[str] = None) -> Optional[str]:
    """Each optional pack the job did not ask for, evaluated on this node's
    facts (``{kind: record}`` as JSON, each kind's record as the node cache
    keeps it) and on the values its worker has (from the node or the job):
    every required change it would make, in words."""
    from .node import NodeFacts, facts_from_record, parse_gpu_list
    from .packs import get_pack
    from .packs.pack import REQUIRED, SET

    decision = Decision.from_json(decision_json)
    facts = {kind: facts_from_record(kind, record)
             for kind, record in json.loads(facts_json).items()}
    environ = json.loads(environ_json) if environ_json else {}
    gpus = parse_gpu_list(decision.gpus if decision.gpus is not None else "none")
    asked = {entry["pack"] for entry in decision.packs.values()}
    notes = []
    for name in (p for p in OPTIONAL_PACKS if p not in asked):
        verdict = get_pack(name).evaluate(Spec(), NodeFacts(gpus, **facts), {}, environ)
        for outcome in verdict.outcomes:
            if outcome.strength == REQUIRED and outcome.action == SET:
                notes.append(f"{name} would set {outcome.variable}={outcome.value} on node "
                             f"{where}: {outcome.reason}; ask for it with "
                             f"build_runtime_env(..., packs=[{name!r}]) or --packs {name}")
    return "; ".join(notes) or None


def fp8_scales_disagree(reports: Iterable[NodeReport]) -> Optional[str]:
    """The te-fp8-scales pack's warning where the GPU nodes' workers of one
    job would not all read the same FP8 block scales."""
    from .packs.te_fp8_scales import SCALES_VARIABLE, scales_disagree

    values = {}
    for r in reports:
        entry = r.decision.variables.get(SCALES_VARIABLE) if r.decision is not None else None
        if entry is not None and r.decision.gpus:
            values[r.label or r.node_id[:8]] = entry.value
    return scales_disagree(values)


# Fields whose local paths or modules Ray uploads only from ray.init
# ("only supported at the job level", ray/_private/runtime_env/validation.py);
# an actor's env inherits them from the job's.
JOB_LEVEL_UPLOADS = ("py_modules", "working_dir")


def check_cluster(config: Optional[ConfigLike] = None, *, role: Roles = None,
                  address: Optional[str] = None,
                  timeout_s: float = DEFAULT_TIMEOUT_S,
                  packs: Optional[Sequence[str]] = None,
                  base: Optional[Dict[str, Any]] = None,
                  nodes: Optional[Sequence[str]] = None) -> List[NodeReport]:
    """Preflight every alive node, or the alive nodes ``nodes`` names (node
    ids, id prefixes or IPs; ``NodeSelectionError`` for one that names none).

    From a connected driver it uses that connection; otherwise it connects to
    ``address`` (default: auto) and disconnects again, so a trainer can call
    it before its own ``ray.init``. Without a config, the field names no
    engine, which still shows each node's GPUs, registration and inherited
    value. ``packs`` as in ``build_runtime_env``; with a config, each node's
    fabric is read too, and a pack the job did not ask for that would
    prevent a failure there is named in the report's ``advice``. ``base``
    as in ``build_runtime_env``: the job's own runtime env, e.g.
    ``{"py_modules": [ray_megatron_env]}`` to check nodes where the package
    is not installed the way a job that ships it reaches them. Ray uploads
    local ``py_modules`` and ``working_dir`` only from ``ray.init``, so they
    go into the connection check makes itself; from a connected driver they
    are left out, as the driver's own ``ray.init`` env is what its workers
    (the probe actors too) inherit.
    """
    import ray

    # Without a config the field names no engine, in a runtime env made the
    # way a job's is, so both paths show what they see on every node.
    runtime_env = build_runtime_env(config if config is not None else Spec().to_field(),
                                    role=role if config is not None else None, packs=packs,
                                    base=base)
    asked = set(runtime_env[FIELD].get("packs", ()))
    advise = config is not None and any(p not in asked for p in OPTIONAL_PACKS)
    uploads = {key: runtime_env.pop(key) for key in JOB_LEVEL_UPLOADS if key in runtime_env}
    connected_here = not ray.is_initialized()
    if connected_here:
        _ensure_reachable(address or "auto")
        ray.init(address=address or "auto", log_to_driver=False, logging_level="WARNING",
                 runtime_env=uploads or None)
    try:
        targets = alive_nodes() if nodes is None else select_nodes(alive_nodes(), nodes)
        return observe_many([(targets, runtime_env)], timeout_s, fabric=advise)[0]
    finally:
        if connected_here:
            ray.shutdown()


def _ensure_reachable(address: str) -> None:
    """Fail in seconds, not minutes: ray.init retries an unreachable GCS for
    a long time. Ray Client addresses (ray://) are left to Ray."""
    import socket

    if address.startswith("ray://"):
        return
    try:
        from ray._private.services import canonicalize_bootstrap_address

        resolved = canonicalize_bootstrap_address(address)
    except Exception as exc:  # a private helper: if it moves, let ray.init decide
        raise ConnectionError(f"cannot resolve the Ray address {address!r}: {exc}") from None
    if resolved is None:
        raise ConnectionError("no running Ray cluster found (give --address or set RAY_ADDRESS)")
    host, _, port = resolved.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except (OSError, ValueError) as exc:
        raise ConnectionError(f"nothing answers at {resolved}: {exc}") from None
