"""The embedded demo: a simulated mixed-GPU cluster and a few verl configs.

``ray-megatron-env demo`` starts a local cluster whose nodes fake no GPU,
V100, A100 (in an image that pins another arch list), 2xH100, a GB200 tray
(no IMEX channel in its container), H100+B200 and 4xL40S (no peer access,
CUDA driver 12.8), registers the plugin on five of them and not on the V100
and H100+B200 nodes (as on a cluster the user cannot reconfigure; the job
env's setup hook decides there), starts one actor per node for each example
config (per role where the example uses per-role envs; the last asks for the
nccl-fabric, nccl-host-mem and torch-arch packs; ``--packs`` adds the others,
which act where ``NODE_IMAGES`` says), and reports what each
actor got, which path decided, and why: first at a glance (``format_glance``:
one node x scenario matrix, then what the packs set), the reasons on demand
(``format_reasons``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .check import NodeReport, alive_nodes, observe_many
from .frameworks.loading import ConfigLike
from .names import ALWAYS_ON, FAKE_NODE_VARIABLE
from .packs.pack import LEAVE, REMOVE, SET
from .runtime_env import build_runtime_env
from .simulation import MIXED_NODES, TRAY_WITHOUT_IMEX, SimulatedCluster, SimulatedNode

EXAMPLES = Path(__file__).parent / "examples"
UNREGISTERED = ("v100", "h100_b200")


# Where the te-fp8-scales, fla-backend and net-ifaces packs act (``demo
# --packs``; no scenario asks for them, so the glance keeps to one screen):
# the GB200 tray's image sets FP32 FP8 scales and TileLang (as slime and
# SkyRL do for every node), the H100 node's turns TileLang off (SkyRL's
# advice for Blackwell), and the L40S node's names eth0 for NCCL where its
# interface (faked, beside Ray's node IP) is ens5.
NODE_IMAGES = {"b200": {"NVTE_FP8_BLOCK_SCALING_FP32_SCALES": "1", "FLA_TILELANG": "1"},
               "h100": {"FLA_TILELANG": "0"}, "l40s": {"NCCL_SOCKET_IFNAME": "eth0"}}
L40S_NET = {"node_ip": "10.0.0.7", "ifaces": {"ens5": ["10.0.0.7"], "lo": ["127.0.0.1"]}}


def _demo_node(node: SimulatedNode) -> SimulatedNode:
    node = replace(node, plugin=node.name not in UNREGISTERED,
                   env={**node.env, **NODE_IMAGES.get(node.name, {})})
    if node.name == "b200":  # the demo's Blackwell node is a tray where nccl-fabric acts
        node = replace(node, name="gb200", env={**node.env, FAKE_NODE_VARIABLE: TRAY_WITHOUT_IMEX})
    if node.name == "l40s":
        facts = {**json.loads(node.env[FAKE_NODE_VARIABLE]), "net": L40S_NET}
        node = replace(node, env={**node.env, FAKE_NODE_VARIABLE: json.dumps(facts)})
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
    short: str  # the matrix's column (with '/ROLE' per role)
    title: str
    example: str
    overrides: Tuple[str, ...] = ()
    roles: Tuple[Optional[str], ...] = (None,)  # one runtime env per entry
    packs: Tuple[str, ...] = ()  # optional packs this scenario asks for

    def config(self) -> Any:
        return load_example(self.example, *self.overrides)


SCENARIOS = (
    Scenario("tp2", "verl, Megatron actor/ref with TP=2, vLLM rollout", "verl_megatron.yaml"),
    Scenario("tp1", "verl, Megatron with TP=1 and CP=1", "verl_megatron.yaml", (f"{TP}=1",)),
    Scenario("fsdp", "verl, FSDP engines", "verl_fsdp.yaml"),
    Scenario("mix", "verl, Megatron TP=2 actor and FSDP critic, one runtime env per role",
             "verl_megatron.yaml", ("critic.strategy=fsdp",), ("actor", "critic")),
    # The GB200 tray's container has no IMEX channel; the A100 node's image
    # pins TORCH_CUDA_ARCH_LIST="9.0 10.0"; the L40S node's GPUs lack peer
    # access on a CUDA driver before 13.0.
    Scenario("packs", "verl, Megatron TP=2 with packs nccl-fabric, nccl-host-mem and torch-arch",
             "verl_megatron.yaml", packs=("nccl-fabric", "nccl-host-mem", "torch-arch")),
)


@dataclass(frozen=True)
class DemoResult:
    title: str
    role: Any  # None, a role, or a list of roles: what the runtime env was narrowed to
    reports: List[NodeReport]
    short: str = "config"  # the scenario's short name, the matrix's column with the role

    @property
    def column(self) -> str:
        roles = [self.role] if isinstance(self.role, str) else list(self.role or ())
        return "/".join([self.short, "+".join(roles)]) if roles else self.short


def run_demo(config: Optional[ConfigLike] = None, roles: Sequence[Optional[str]] = (None,),
             nodes: Sequence[SimulatedNode] = DEMO_NODES,
             packs: Optional[Sequence[str]] = None) -> List[DemoResult]:
    """Run the example scenarios (or ``config``) on a fresh simulated cluster.

    Configs are checked before the cluster starts, so a bad one fails fast.
    ``packs`` asks every scenario for those rule packs too (docs/packs.md).
    """
    if config is not None:
        plans = [(f"your config: {config}", role, "config",
                  build_runtime_env(config, role=role, packs=packs)) for role in roles]
    else:
        plans = [(s.title, role, s.short, build_runtime_env(
                     s.config(), role=role,
                     packs=sorted({*s.packs, *(packs or ())}) or None))
                 for s in SCENARIOS for role in s.roles]
    with SimulatedCluster(nodes) as cluster:
        order = {node_id: i for i, node_id in enumerate(cluster.node_ids.values())}
        targets = sorted(alive_nodes(), key=lambda node: order.get(node[0], len(order)))
        labels = {node_id: name for name, node_id in cluster.node_ids.items()}
        observed = observe_many([(targets, env) for *_, env in plans], labels=labels)
        results = [DemoResult(title, role, reports, short)
                   for (title, role, short, _), reports in zip(plans, observed)]
    return results


# --- the demo at a glance ---------------------------------------------------------------------

WIDTH = 100  # what the text output keeps within
PATHS = {"plugin": "plugin", "setup-hook": "hook"}  # a matrix cell's path, by Decision.via
MATRIX_TITLE = ("CUDA_DEVICE_MAX_CONNECTIONS per node and scenario: the value (- unset), then the "
                "path that decided")
CUDA_LEGEND = ("Paths: plugin (the node's registered plugin), hook (the job env's setup hook), "
               "none; ! a problem")


def _node_key(report: NodeReport) -> str:
    return report.label or report.node_id[:8]


def _gpus(report: NodeReport) -> str:
    """A node's GPUs as the matrix shows them: '9.0x2', '9.0,10.0', 'none'."""
    d = report.decision
    if d is None or d.gpus is None:
        return "?"
    if not d.gpus:
        return "none"
    if len(set(d.gpus)) == 1 and len(d.gpus) > 1:
        return f"{d.gpus[0]}x{len(d.gpus)}"
    return ",".join(d.gpus)


def matrix_cell(report: NodeReport) -> str:
    """The value and the path: '1 plugin', '- hook', '! none' where no path
    decided; a trailing '!' marks any other problem."""
    if report.via is None:
        return "! none"
    value = "-" if report.value is None else report.value
    return f"{value} {PATHS.get(report.via, report.via)}" + ("!" if report.problem() else "")


def _table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> List[str]:
    widths = [max(len(row[i]) for row in [head, *rows]) for i in range(len(head))]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in [head, *rows]]


def _wrap(text: str, indent: str = "") -> List[str]:
    import textwrap

    return textwrap.wrap(text, WIDTH, initial_indent=indent, subsequent_indent=indent + "  ",
                         break_on_hyphens=False)


def _by_node(results: Sequence[DemoResult]) -> Dict[str, List[Optional[NodeReport]]]:
    """Each node (in the order the runs list them) -> its report in each run."""
    keys: Dict[str, None] = {}
    for result in results:
        keys.update(dict.fromkeys(_node_key(r) for r in result.reports))
    found = [{_node_key(r): r for r in result.reports} for result in results]
    return {key: [reports.get(key) for reports in found] for key in keys}


def format_matrix(results: Sequence[DemoResult]) -> List[str]:
    """One row per node, one column per run: CUDA_DEVICE_MAX_CONNECTIONS and
    the path that decided, then the legend, the scenarios, any problem."""
    rows, problems = [], []
    for key, reports in _by_node(results).items():
        seen = next((r for r in reports if r is not None and r.decision is not None), None)
        rows.append([key, "?" if seen is None else _gpus(seen),
                     *("?" if r is None else matrix_cell(r) for r in reports)])
        problems += [f"! {key} in {result.column}: {r.problem()}"
                     for result, r in zip(results, reports) if r is not None and r.problem()]
    lines = [MATRIX_TITLE, *_table(["NODE", "GPUS", *(r.column for r in results)], rows),
             *_wrap(CUDA_LEGEND)]
    titles: Dict[str, str] = {}
    for result in results:
        titles.setdefault(result.short, result.title)
    # The examples' titles all start 'verl, ': say it once.
    heads = {title.partition(", ")[0] for title in titles.values()}
    common = heads.pop() if len(heads) == 1 and all(", " in t for t in titles.values()) else None
    lines += _wrap(f"Scenarios{f' ({common})' if common else ''}: " + "; ".join(
        f"{short} = {title.partition(', ')[2] if common else title}"
        for short, title in titles.items()) + ".")
    return lines + [line for problem in problems for line in _wrap(problem)]


def _acts(entry: Any) -> bool:
    return entry.pack not in ALWAYS_ON and entry.action in (SET, REMOVE)


def _decided(entry: Any) -> bool:
    """An optional pack's variable the pack did something about (set,
    removed, or kept a value on purpose), rather than leave to its default."""
    return entry.pack not in ALWAYS_ON and entry.action != LEAVE


def pack_cell(entry: Any) -> str:
    """What a pack that acted left the worker: its value, '(removed)', and
    the node's own value where it replaced one."""
    shown = "(removed)" if entry.value is None else entry.value
    if entry.node_value is not None and entry.node_value != entry.value:
        shown += f" (node had {entry.node_value})"
    return shown


def format_packs(result: DemoResult) -> List[str]:
    """The nodes where an optional pack set or removed a variable: one
    column per such variable (by pack, then name: a record read back from
    JSON lists its variables sorted by name), headed by its pack; '.' where
    it left it."""
    acted = {(e.pack, name) for r in result.reports if r.decision
             for name, e in r.decision.variables.items() if _acts(e)}
    columns = {name: pack for pack, name in sorted(acted)}  # variable -> pack, by pack
    asked = sorted({e.pack for r in result.reports if r.decision
                    for e in r.decision.variables.values() if e.pack not in ALWAYS_ON})
    named = ", ".join(asked[:-1]) + " and " + asked[-1] if len(asked) > 1 else asked[0]
    if not columns:
        return _wrap(f"In {result.column}, {named} set nothing on any node.")
    rows = []
    for r in result.reports:
        entries = r.decision.variables if r.decision else {}
        if any(_acts(entries[name]) for name in columns if name in entries):
            rows.append([_node_key(r), *(pack_cell(entries[name]) if name in entries
                                         and _acts(entries[name]) else "." for name in columns)])
    table = _table(["", *columns.values()], [["NODE", *columns], *rows])
    return [*_wrap(f"In {result.column}, what {named} set where they act (.: left as it was):"),
            *table]


def format_glance(results: Sequence[DemoResult]) -> str:
    """The demo's first screen: the matrix, then what the packs set."""
    lines = format_matrix(results)
    for result in results:
        if any(e.pack not in ALWAYS_ON for r in result.reports if r.decision
               for e in r.decision.variables.values()):
            lines += ["", *format_packs(result)]
    return "\n".join(lines)


def format_reasons(results: Sequence[DemoResult]) -> str:
    """Why, for who wants it: the node legend (ID and IP, once), then per
    run one line per node (its reason), and one per variable an optional
    pack decided (not the ones it left to their default), warning and
    problem."""
    nodes = _by_node(results)
    width = max(len(key) for key in nodes)
    lines = ["Nodes (ID, IP, plugin):"]
    for key, reports in nodes.items():
        present = [r for r in reports if r is not None]
        r = next((r for r in present if r.registered is not None), present[0])
        plugin = {True: "registered", False: "not registered", None: "?"}[r.registered]
        lines.append(f"  {key.ljust(width)}  {r.node_id[:8]}  {r.ip}  {plugin}")
    for result in results:
        processes = {r.decision.process for r in result.reports if r.decision is not None}
        shared = processes.pop() if len(processes) == 1 else None
        lines += ["", f"== {result.column}: {result.title}"
                  + (f" (every worker: {shared})" if shared else "")]
        for r in result.reports:
            d = r.decision
            reason = d.reason if d else "no decision record"
            if shared and reason.startswith(f"{shared}: "):
                reason = reason[len(shared) + 2:]
            lines.append(f"{_node_key(r).ljust(width)}  {reason}")
            decided = sorted(((e.pack, name, e) for name, e in (d.variables.items() if d else ())
                              if _decided(e)), key=lambda item: item[:2])
            more = [f"{name}={'unset' if e.value is None else e.value} [{pack}: {e.action}, "
                    f"{e.rule}]: {e.reason}" for pack, name, e in decided]
            more += [f"warning: {w}" for w in (d.warnings if d else ())]
            more += [f"PROBLEM: {r.problem()}"] if r.problem() else []
            lines += [f"{'':{width}}    {line}" for line in more]
    return "\n".join(lines)
