"""Offline: what a config gives on a given GPU set, without any cluster.

The same parser, policy and precedence as the plugin, with the GPUs given
instead of probed, so ``explain`` and a node with those GPUs agree.
"""

from __future__ import annotations

from typing import Mapping, Optional, Sequence, Union

from .decision import Decision, decide_for_worker
from .errors import FieldValueError
from .gpus import VENDOR_TOKENS, NodeGpus, parse_capability
from .rules import VARIABLE
from .runtime_env import ConfigLike, load_spec
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


def explain(config: ConfigLike, gpus: Union[str, Sequence[str]], *, role: Roles = None,
            explicit: Optional[str] = None, node_value: Optional[str] = None,
            worker_env: Optional[Mapping[str, str]] = None) -> Decision:
    """The decision a node with ``gpus`` would make for a worker of ``config``.

    ``explicit`` is an ``env_vars`` value in the runtime env; ``node_value``
    one inherited from the node's environment; ``worker_env`` the worker's
    own ``env_vars`` (``{"WG_PREFIX": "rollout_standalone_0"}``), by which a
    framework's process kinds are told apart. Without it, the worker is one
    no process rule matches, as a trainer's own workers are.
    """
    spec, known_roles = load_spec(config)
    env_vars = dict(worker_env or {})
    if explicit is not None:
        env_vars[VARIABLE] = explicit
    return decide_for_worker(spec.narrow(role, known_roles), parse_gpu_list(gpus), env_vars,
                             inherited=node_value)
