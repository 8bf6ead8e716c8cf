"""Offline: what a config gives on a given GPU set, without any cluster.

The same parser, policy and precedence as the plugin, with the GPUs given
instead of probed, so ``explain`` and a node with those GPUs agree.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Mapping, Optional, Sequence, Union

from .decision import NodeDecision, decide_node
from .record import Decision
from .errors import FieldValueError
from .names import CONNECTIONS_VARIABLE, FABRIC, FIELD, NET, P2P
from .node import (
    ABSENT, FakeNodeError, NodeFabric, NodeFacts, NodeNet, NodeP2P, parse_gpu_list,
)
from .probe.fake import parse_fake_node
from .packs import get_pack
from .frameworks.loading import ConfigLike, load_spec
from .runtime_env import with_packs
from .spec import Roles


def _given(parse, *args, **kw):
    """A node fact given on the command line, read by node.py's parsers; a
    bad one is the user's FieldValueError."""
    try:
        return parse(*args, **kw)
    except FakeNodeError as exc:
        raise FieldValueError(f"{FIELD}: {exc}") from None


def _node_text(text: str) -> str:
    source = text.strip()
    if not source.startswith("{"):
        if not os.path.isfile(source):
            raise FieldValueError(f"{FIELD}: --node {source!r} is neither a JSON object nor a "
                                  "file; give e.g. '{\"gpus\": \"10.0\", \"imex_channel\": "
                                  "\"absent\"}' or a path to such a file")
        with open(source, encoding="utf-8") as handle:
            source = handle.read()
    return source


def node_facts(gpus: Union[str, Sequence[str], None], node: Optional[str]) -> NodeFacts:
    """The facts of a node given by ``--gpus`` and/or ``--node`` (the GPUs
    once: in either, or the same in both)."""
    given = None if gpus is None else _given(parse_gpu_list, gpus, where="--gpus")
    if node is None:
        if given is None:
            raise FieldValueError(f"{FIELD}: give the node's GPUs with --gpus or --node")
        return NodeFacts(given)
    text = gpus if gpus is None or isinstance(gpus, str) else ",".join(gpus)
    fake = _given(parse_fake_node, _node_text(node), "--node", default_gpus=text,
                  method="given")
    if fake.gpus is None:
        raise FieldValueError(f"{FIELD}: --node has no \"gpus\"; add it, or give --gpus")
    if given is not None and (fake.gpus.capabilities, fake.gpus.vendor) != \
            (given.capabilities, given.vendor):
        raise FieldValueError(f"{FIELD}: --gpus {text!r} and the gpus in --node disagree; "
                              "give the GPUs once")
    return NodeFacts(fake.gpus, fake.fabric, fake.p2p, fake.net)


def explain_node(config: ConfigLike, gpus: Union[str, Sequence[str], None] = None, *,
                 node: Optional[str] = None, role: Roles = None,
                 explicit: Optional[str] = None, node_value: Optional[str] = None,
                 worker_env: Optional[Mapping[str, str]] = None,
                 packs: Optional[Sequence[str]] = None,
                 job_env: Optional[Mapping[str, str]] = None,
                 tp_spans_nodes: Optional[Sequence[str]] = None,
                 node_env: Optional[Mapping[str, str]] = None) -> NodeDecision:
    """What a node would write and remove for a worker of ``config``: the
    decision and every variable, exactly as ``decision.decide_node`` does on
    the node. ``node`` is the fake-node JSON (inline or a file) with the
    fabric and peer-access facts; ``job_env`` variables in the job's
    ``env_vars`` (any variable, e.g. ``NCCL_NVLS_ENABLE``); ``node_env``
    variables the worker would inherit from the node's environment (any
    variable, e.g. an image's ``TORCH_CUDA_ARCH_LIST``; ``node_value`` is
    ``CUDA_DEVICE_MAX_CONNECTIONS``'s); ``packs`` as in build_runtime_env."""
    spec, known_roles = load_spec(config)
    spec = with_packs(spec.narrow(role, known_roles), packs, tp_spans_nodes)
    env_vars = {**(job_env or {}), **(worker_env or {})}
    if explicit is not None:
        env_vars[CONNECTIONS_VARIABLE] = explicit
    environ = dict(node_env or {})
    if node_value is not None:
        environ[CONNECTIONS_VARIABLE] = node_value
    facts = node_facts(gpus, node)
    kinds = {kind for name in spec.packs for kind in get_pack(name).fact_kinds}
    if FABRIC in kinds and facts.fabric is None:
        facts = replace(facts, fabric=NodeFabric(None, ABSENT, "given",
                                                 "no --node given with the fabric facts"))
    if P2P in kinds and facts.p2p is None:
        facts = replace(facts, p2p=NodeP2P(None, method="given",
                                           error="no --node given with the peer-access facts"))
    if NET in kinds and facts.net is None:
        facts = replace(facts, net=NodeNet(None, method="given",
                                           error="no --node given with a \"net\" key"))
    return decide_node(spec, facts, env_vars, environ)


def explain(config: ConfigLike, gpus: Union[str, Sequence[str], None] = None, *,
            role: Roles = None, explicit: Optional[str] = None,
            node_value: Optional[str] = None,
            worker_env: Optional[Mapping[str, str]] = None, node: Optional[str] = None,
            packs: Optional[Sequence[str]] = None,
            job_env: Optional[Mapping[str, str]] = None,
            tp_spans_nodes: Optional[Sequence[str]] = None,
            node_env: Optional[Mapping[str, str]] = None) -> Decision:
    """The decision a node with ``gpus`` would make for a worker of ``config``.

    ``explicit`` is an ``env_vars`` value in the runtime env; ``node_value``
    one inherited from the node's environment; ``worker_env`` the worker's
    own ``env_vars`` (``{"WG_PREFIX": "rollout_standalone_0"}``), by which a
    framework's process kinds are told apart. Without it, the worker is one
    no process rule matches, as a trainer's own workers are. ``node``,
    ``packs``, ``job_env``, ``tp_spans_nodes`` and ``node_env`` as in
    ``explain_node``.
    """
    return explain_node(config, gpus, node=node, role=role, explicit=explicit,
                        node_value=node_value, worker_env=worker_env, packs=packs,
                        job_env=job_env, tp_spans_nodes=tp_spans_nodes,
                        node_env=node_env).decision
