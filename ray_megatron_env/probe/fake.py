"""A node described instead of probed (tests, the demo, a dry run):
``RAY_MEGATRON_ENV_FAKE_NODE`` (the whole node, ``node.parse_fake_node``'s
JSON) and ``RAY_MEGATRON_ENV_FAKE_GPUS`` (a GPU list, ``node.parse_gpu_list``).
The node's own ``gpus`` win over the GPU list; without a fabric or
peer-access record, fake GPUs are PCIe GPUs with peer access everywhere."""

from __future__ import annotations

from typing import Mapping, Optional

from ..node import FakeNode, parse_fake_node, parse_gpu_list
from ..names import FAKE_GPUS_VARIABLE as FAKE_VARIABLE, FAKE_NODE_VARIABLE


def read(environ: Mapping[str, str]) -> Optional[FakeNode]:
    """The faked node, or ``None`` when nothing is faked. Raises
    ``node.FakeNodeError`` naming the variable and what is wrong."""
    node = environ.get(FAKE_NODE_VARIABLE, "").strip()
    gpus = environ.get(FAKE_VARIABLE, "").strip() or None
    if node:
        return parse_fake_node(node, default_gpus=gpus)
    if gpus is None:
        return None
    listed = parse_gpu_list(gpus, "fake", where=FAKE_VARIABLE, detail=f"{FAKE_VARIABLE}={gpus}")
    return parse_fake_node("{}", FAKE_VARIABLE, default_gpus=gpus)._replace(gpus=listed)
