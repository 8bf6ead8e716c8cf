"""Offline: what a config gives on a given GPU set, without any cluster.

The same parser, policy and precedence as the plugin, with the GPUs given
instead of probed, so ``explain`` and a node with those GPUs agree.
"""

from __future__ import annotations

import os
from typing import Mapping, Optional, Sequence, Tuple, Union

from .decision import Decision, NodeDecision, decide_node
from .errors import FieldValueError
from .gpus import VENDOR_TOKENS, NodeGpus, parse_capability
from .node import ABSENT, FakeNodeError, NodeFabric, NodeFacts, parse_fake_node
from .packs import get_pack
from .engines import VARIABLE
from .frameworks.loading import ConfigLike, load_spec
from .runtime_env import with_packs
from .spec import Roles
from .values import FIELD


def parse_gpu_list(gpus: Union[str, Sequence[str]]) -> NodeGpus:
    """'9.0,9.0,10.0' (or a list of such) -> NodeGpus; 'none' or '' -> no GPU;
    'amd' (ROCm), 'npu' or 'ascend' (Huawei Ascend), 'musa' (Moore Threads):
    a node with that vendor's accelerators."""
    items = gpus.split(",") if isinstance(gpus, str) else list(gpus)
    items = [item.strip() for item in items if item.strip()]
    if [item.lower() for item in items] in ([], ["none"]):
        return NodeGpus.known((), "given")
    if len(items) == 1 and items[0].lower() in VENDOR_TOKENS:
        return NodeGpus.other(VENDOR_TOKENS[items[0].lower()], "given")
    try:
        return NodeGpus.known([parse_capability(item) for item in items], "given")
    except ValueError as exc:
        raise FieldValueError(f"{FIELD}: --gpus: {exc}; or one of none, "
                              f"{', '.join(VENDOR_TOKENS)}") from None


def read_node(text: str, gpus: Optional[str] = None) -> Tuple[Optional[str], NodeFabric]:
    """``--node FACTS``: the fake-node JSON (``RAY_MEGATRON_ENV_FAKE_NODE``'s
    form), inline or in a file -> its GPU list (``None`` if not given) and
    fabric; the fabric record stands for each of ``gpus`` when FACTS lists none."""
    source = text.strip()
    if not source.startswith("{"):
        if not os.path.isfile(source):
            raise FieldValueError(f"{FIELD}: --node {source!r} is neither a JSON object nor a "
                                  "file; give e.g. '{\"gpus\": \"10.0\", \"imex_channel\": "
                                  "\"absent\"}' or a path to such a file")
        with open(source, encoding="utf-8") as handle:
            source = handle.read()
    try:
        return parse_fake_node(source, "--node", default_gpus=gpus)
    except FakeNodeError as exc:
        raise FieldValueError(f"{FIELD}: {exc}") from None


def node_facts(gpus: Union[str, Sequence[str], None], node: Optional[str]) -> NodeFacts:
    """The facts of a node given by ``--gpus`` and/or ``--node`` (the GPUs
    once: in either, or the same in both)."""
    if gpus is not None and not isinstance(gpus, str):
        gpus = ",".join(gpus)
    if node is None:
        if gpus is None:
            raise FieldValueError(f"{FIELD}: give the node's GPUs with --gpus or --node")
        return NodeFacts(parse_gpu_list(gpus))
    listed, fabric = read_node(node, gpus)
    if listed is not None and gpus is not None and \
            parse_gpu_list(listed).capabilities != parse_gpu_list(gpus).capabilities:
        raise FieldValueError(f"{FIELD}: --gpus {gpus!r} and the gpus in --node ({listed!r}) "
                              "disagree; give the GPUs once")
    listed = listed if listed is not None else gpus
    if listed is None:
        raise FieldValueError(f"{FIELD}: --node has no \"gpus\"; add it, or give --gpus")
    return NodeFacts(parse_gpu_list(listed), fabric)


def explain_node(config: ConfigLike, gpus: Union[str, Sequence[str], None] = None, *,
                 node: Optional[str] = None, role: Roles = None,
                 explicit: Optional[str] = None, node_value: Optional[str] = None,
                 worker_env: Optional[Mapping[str, str]] = None,
                 packs: Optional[Sequence[str]] = None,
                 job_env: Optional[Mapping[str, str]] = None,
                 tp_spans_nodes: Optional[Sequence[str]] = None) -> NodeDecision:
    """What a node would write and remove for a worker of ``config``: the
    decision and every variable, exactly as ``decision.decide_node`` does on
    the node. ``node`` is the fake-node JSON (inline or a file) with the
    fabric facts; ``job_env`` variables in the job's ``env_vars`` (any
    variable, e.g. ``NCCL_NVLS_ENABLE``); ``packs`` as in build_runtime_env."""
    spec, known_roles = load_spec(config)
    spec = with_packs(spec.narrow(role, known_roles), packs, tp_spans_nodes)
    env_vars = {**(job_env or {}), **(worker_env or {})}
    if explicit is not None:
        env_vars[VARIABLE] = explicit
    environ = {VARIABLE: node_value} if node_value is not None else {}
    facts = node_facts(gpus, node)
    if any(get_pack(name).needs_fabric for name in spec.packs) and facts.fabric is None:
        facts = NodeFacts(facts.gpus, NodeFabric(None, ABSENT, "given",
                                                 "no --node given with the fabric facts"))
    return decide_node(spec, facts, env_vars, environ)


def explain(config: ConfigLike, gpus: Union[str, Sequence[str], None] = None, *,
            role: Roles = None, explicit: Optional[str] = None,
            node_value: Optional[str] = None,
            worker_env: Optional[Mapping[str, str]] = None, node: Optional[str] = None,
            packs: Optional[Sequence[str]] = None,
            job_env: Optional[Mapping[str, str]] = None,
            tp_spans_nodes: Optional[Sequence[str]] = None) -> Decision:
    """The decision a node with ``gpus`` would make for a worker of ``config``.

    ``explicit`` is an ``env_vars`` value in the runtime env; ``node_value``
    one inherited from the node's environment; ``worker_env`` the worker's
    own ``env_vars`` (``{"WG_PREFIX": "rollout_standalone_0"}``), by which a
    framework's process kinds are told apart. Without it, the worker is one
    no process rule matches, as a trainer's own workers are. ``node``,
    ``packs``, ``job_env`` and ``tp_spans_nodes`` as in ``explain_node``.
    """
    return explain_node(config, gpus, node=node, role=role, explicit=explicit,
                        node_value=node_value, worker_env=worker_env, packs=packs,
                        job_env=job_env, tp_spans_nodes=tp_spans_nodes).decision
