"""The embedded demo: a simulated mixed-GPU cluster and a few verl configs.

``ray-megatron-env demo`` starts a local cluster whose nodes fake no GPU,
V100, A100 (in an image that pins another arch list), 2xH100, a GB200 tray
(no IMEX channel in its container), H100+B200 and 4xL40S (no peer access,
CUDA driver 12.8), registers the plugin on five of them and not on the V100
and H100+B200 nodes (as on a cluster the user cannot reconfigure; the job
env's setup hook decides there), starts one actor per node for each example
config (per role where the example uses per-role envs; the last asks for the
nccl-fabric, nccl-host-mem and torch-arch packs), and reports what each
actor got, why, and which path decided.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, List, Optional, Sequence, Tuple

from .check import NodeReport, alive_nodes, observe_many
from .frameworks.loading import ConfigLike
from .node import FAKE_NODE_VARIABLE
from .runtime_env import build_runtime_env
from .simulation import MIXED_NODES, TRAY_WITHOUT_IMEX, SimulatedCluster, SimulatedNode

EXAMPLES = Path(__file__).parent / "examples"
UNREGISTERED = ("v100", "h100_b200")


def _demo_node(node: SimulatedNode) -> SimulatedNode:
    node = replace(node, plugin=node.name not in UNREGISTERED)
    if node.name == "b200":  # the demo's Blackwell node is a tray where nccl-fabric acts
        node = replace(node, name="gb200", env={**node.env, FAKE_NODE_VARIABLE: TRAY_WITHOUT_IMEX})
    return node


DEMO_NODES = tuple(_demo_node(n) for n in MIXED_NODES)
TP = "actor_rollout_ref.actor.megatron.tensor_model_parallel_size"


def load_example(name: "str | Path", *overrides: str) -> Any:
    """An example config (a name in ``examples/`` or any path) as a DictConfig,
    with Hydra-style ``key=value`` overrides (values parsed as YAML; a
    leading '+' is accepted)."""
    import yaml
    from omegaconf import OmegaConf

    config = OmegaConf.load(EXAMPLES / name)
    for override in overrides:
        key, _, value = override.lstrip("+").partition("=")
        OmegaConf.update(config, key, yaml.safe_load(value), merge=False, force_add=True)
    return config


@dataclass(frozen=True)
class Scenario:
    title: str
    example: str
    overrides: Tuple[str, ...] = ()
    roles: Tuple[Optional[str], ...] = (None,)  # one runtime env per entry
    packs: Tuple[str, ...] = ()  # optional packs this scenario asks for

    def config(self) -> Any:
        return load_example(self.example, *self.overrides)


SCENARIOS = (
    Scenario("verl, Megatron actor/ref with TP=2, vLLM rollout", "verl_megatron.yaml"),
    Scenario("verl, Megatron with TP=1 and CP=1", "verl_megatron.yaml", (f"{TP}=1",)),
    Scenario("verl, FSDP engines", "verl_fsdp.yaml"),
    Scenario("verl, Megatron TP=2 actor and FSDP critic, one runtime env per role",
             "verl_megatron.yaml", ("critic.strategy=fsdp",), ("actor", "critic")),
    # The GB200 tray's container has no IMEX channel; the A100 node's image
    # pins TORCH_CUDA_ARCH_LIST="9.0 10.0"; the L40S node's GPUs lack peer
    # access on a CUDA driver before 13.0.
    Scenario("verl, Megatron TP=2 with packs nccl-fabric, nccl-host-mem and torch-arch",
             "verl_megatron.yaml", packs=("nccl-fabric", "nccl-host-mem", "torch-arch")),
)


@dataclass(frozen=True)
class DemoResult:
    title: str
    role: Optional[str]
    reports: List[NodeReport]


def run_demo(config: Optional[ConfigLike] = None, roles: Sequence[Optional[str]] = (None,),
             nodes: Sequence[SimulatedNode] = DEMO_NODES,
             packs: Optional[Sequence[str]] = None) -> List[DemoResult]:
    """Run the example scenarios (or ``config``) on a fresh simulated cluster.

    Configs are checked before the cluster starts, so a bad one fails fast.
    ``packs`` asks every scenario for those rule packs too (docs/packs.md).
    """
    if config is not None:
        plans = [(f"your config: {config}", role, build_runtime_env(config, role=role, packs=packs))
                 for role in roles]
    else:
        plans = [(s.title, role, build_runtime_env(
                     s.config(), role=role,
                     packs=sorted({*s.packs, *(packs or ())}) or None))
                 for s in SCENARIOS for role in s.roles]
    with SimulatedCluster(nodes) as cluster:
        order = {node_id: i for i, node_id in enumerate(cluster.node_ids.values())}
        targets = sorted(alive_nodes(), key=lambda node: order.get(node[0], len(order)))
        labels = {node_id: name for name, node_id in cluster.node_ids.items()}
        observed = observe_many([(targets, env) for _, _, env in plans], labels=labels)
        results = [DemoResult(title, role, reports)
                   for (title, role, _), reports in zip(plans, observed)]
    return results
