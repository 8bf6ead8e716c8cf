"""``ray-megatron-env``: demo, check, explain, register, runtime-env.

Exit codes: 0 success; 1 ``check --strict`` found a problem, or ``explain``'s
value breaks a required rule; 2 bad usage or a bad config (the message names
the key); 3 the cluster is unreachable.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import textwrap
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from ._version import __version__
from .errors import MegatronEnvError

OK, PROBLEM, BAD_INPUT, UNREACHABLE = 0, 1, 2, 3


def _roles(values: Optional[List[str]]) -> Any:
    """--role actor --role ref, or --role actor,ref -> None | str | list."""
    if not values:
        return None
    roles = [r.strip() for value in values for r in value.split(",") if r.strip()]
    return roles[0] if len(roles) == 1 else roles


def _worker_env(pairs: Optional[List[str]], option: str = "--worker-env") -> dict:
    """--worker-env WG_PREFIX=rollout_standalone_0 (repeatable) -> a dict."""
    env = {}
    for pair in pairs or ():
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise MegatronEnvError(f"{option} takes NAME=VALUE, got {pair!r}")
        env[name] = value
    return env


def _packs(values: Optional[List[str]]) -> Optional[List[str]]:
    """--packs nccl-fabric (repeatable or comma-separated) -> a list, or None."""
    if not values:
        return None
    return [p.strip() for value in values for p in value.split(",") if p.strip()]


def pack_lines(decision: Any) -> List[str]:
    """One line per pack variable of a decision: value, action, strength, reason."""
    lines = []
    for variable, entry in decision.packs.items():
        lines.append(f"{variable}={_shown(entry['value'])} [{entry['pack']}: {entry['action']}, "
                     f"{entry['strength']}, source {entry['source']}]: {entry['reason']}")
    return lines


def _shown(value: Optional[str]) -> str:
    return "unset" if value is None else value


def short_id(node_id: str) -> str:
    """A node id as a table shows it: its first 8 hex digits, which tell the
    nodes of one cluster apart (``--json`` carries the full id)."""
    return node_id[:8]


def format_reports(reports: Iterable[Any], labelled: bool = False) -> str:
    """A table per node; the reason (and any problem) on the lines below.

    PLUGIN says whether the node's agent has the plugin, VIA which path
    decided (the plugin, or the worker-side setup hook where it is not
    registered). When every worker was classified the same way, the reasons
    leave that out (``--json`` keeps it, as ``decision.process``)."""
    reports = list(reports)
    head = (["NODE"] if labelled else []) + ["NODE ID", "IP", "PLUGIN", "VIA", "GPUS", "VALUE",
                                             "SOURCE"]
    processes = {r.decision.process for r in reports if r.decision is not None}
    shared = processes.pop() if len(processes) == 1 else None
    rows, notes = [], []
    for r in reports:
        d = r.decision
        gpus = "?" if d is None else ("unknown" if d.gpus is None else ",".join(d.gpus) or "none")
        rows.append(([r.label or "-"] if labelled else []) + [
            short_id(r.node_id), r.ip, {True: "yes", False: "no", None: "?"}[r.registered],
            r.via or "-", gpus, _shown(r.value), d.source if d else "-"])
        reason = d.reason if d else None
        if reason and shared and reason.startswith(f"{shared}: "):
            reason = reason[len(shared) + 2:]
        lines = ([reason] if reason else []) + (pack_lines(d) if d else [])
        lines += [f"warning: {w}" for w in (d.warnings if d else ())]
        problem = r.problem()
        if problem:
            lines.append(f"PROBLEM: {problem}")
        notes.append(lines)
    widths = [max(len(str(row[i])) for row in [head] + rows) for i in range(len(head))]
    out = ["  ".join(h.ljust(w) for h, w in zip(head, widths)).rstrip()]
    for row, lines in zip(rows, notes):
        out.append("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip())
        for line in lines:
            out.extend(textwrap.wrap(line, 100, initial_indent="    ", subsequent_indent="      ",
                                     break_on_hyphens=False))
    return "\n".join(out)


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import DEMO_NODES, format_glance, format_reasons, run_demo

    if args.role and not args.config:
        raise MegatronEnvError("--role applies to --config; the examples set their own roles")
    nodes = ", ".join(f"{n.name} ({n.fake_gpus}{'' if n.plugin else ', no plugin'})"
                      for n in DEMO_NODES)
    print(f"Starting a local simulated Ray cluster: {nodes} ...", file=sys.stderr)
    with ray_messages_to_stderr():
        results = run_demo(args.config, roles=[_roles(args.role)], packs=_packs(args.packs))
    if args.json:
        print(json.dumps([{"scenario": r.title, "role": r.role, "short": r.short,
                           "nodes": [n.to_dict() for n in r.reports]} for r in results], indent=2))
        return OK
    print(format_glance(results))
    print()
    if args.verbose:
        print(format_reasons(results))
        print()
        print("The simulated cluster is shut down.")
    else:
        print("The simulated cluster is shut down. --verbose shows why each node got each value.")
    return OK


def cmd_check(args: argparse.Namespace) -> int:
    from .check import check_cluster

    try:
        with ray_messages_to_stderr():
            reports = check_cluster(args.config, role=_roles(args.role), address=args.address,
                                    timeout_s=args.timeout, packs=_packs(args.packs),
                                    base=_shipped_package() if args.ship_package else None,
                                    nodes=_nodes(args.node))
    except ConnectionError as exc:
        print(f"ray-megatron-env check: cannot reach the cluster: {exc}", file=sys.stderr)
        return UNREACHABLE
    if args.json:
        print(json.dumps([r.to_dict() for r in reports], indent=2))
    else:
        print(format_check(reports))
    return PROBLEM if args.strict and any(not r.ok for r in reports) else OK


def _nodes(option: Optional[List[str]]) -> Optional[List[str]]:
    """--node, repeatable or comma-separated; None (every node) without it."""
    return None if option is None else [n for value in option for n in value.split(",")]


def ray_messages_to_stderr() -> "contextlib.AbstractContextManager[Any]":
    """While the verb's driver is connected: Ray's driver prints what the
    cluster reports (a worker that died, "(raylet) A worker died ...") to
    sys.stdout from a thread of its own (ray/_private/worker.py,
    listen_error_messages), which would corrupt --json output. The verb's
    own output follows, on the real stdout."""
    return contextlib.redirect_stdout(sys.stderr)


def _shipped_package(base: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """``base`` (a runtime env) with this package's folder added to its
    ``py_modules``: Ray uploads it with the job (from ray.init, or from
    ray job submit), for the driver and the workers on nodes without it."""
    env = dict(base or {})
    folder = os.path.dirname(os.path.abspath(__file__))  # the package's folder
    modules = list(env.get("py_modules") or [])
    env["py_modules"] = modules if folder in modules else [*modules, folder]
    return env


def format_check(reports: List[Any]) -> str:
    """``check``'s text: the table, a count, and each node's problem."""
    bad = [r for r in reports if not r.ok]
    lines = [format_reports(reports), "",
             f"{len(reports)} node(s) checked, {len(bad)} with a problem."]
    for r in reports:
        lines += textwrap.wrap(f"advice: {r.advice}", 100, subsequent_indent="      ",
                               break_on_hyphens=False) if r.advice else []
    from .check import fp8_scales_disagree

    disagree = fp8_scales_disagree(reports)
    if disagree:
        lines += textwrap.wrap(f"warning: {disagree}", 100, subsequent_indent="      ",
                               break_on_hyphens=False)
    driver = driver_arch_list(reports)
    if driver:
        lines += textwrap.wrap(
            f"driver: export TORCH_CUDA_ARCH_LIST='{driver}' where a driver-side check wants it "
            "(NeMo-RL's Megatron backend only checks that it is set): every node's value "
            "together; each worker gets its own node's value from the torch-arch pack",
            100, subsequent_indent="      ", break_on_hyphens=False)
    for r in bad:
        lines += textwrap.wrap(f"{short_id(r.node_id)} ({r.ip}): {r.problem()}", 100,
                               initial_indent="  ", subsequent_indent="      ",
                               break_on_hyphens=False)
    return "\n".join(lines)


def driver_arch_list(reports: Iterable[Any]) -> Optional[str]:
    """Every node's TORCH_CUDA_ARCH_LIST (as the torch-arch pack left it on
    the node's workers) in one list, ascending; None where no node has one."""
    from .packs.torch_arch import ARCH_LIST_VARIABLE

    entries = set()
    for r in reports:
        entry = r.decision.variables.get(ARCH_LIST_VARIABLE) if r.decision is not None else None
        if entry is not None and entry.value:
            entries.update(e for e in entry.value.replace(";", " ").split() if e)

    def order(entry: str) -> Tuple[int, int, str]:
        major, _, rest = entry.partition(".")
        minor = "".join(c for c in rest if c.isdigit())
        try:
            return int(major), int(minor or 0), rest
        except ValueError:
            return 999, 0, entry
    return " ".join(sorted(entries, key=order)) or None


def cmd_explain(args: argparse.Namespace) -> int:
    from .explanation import explain_node
    from .packs.connections import RULES

    result = explain_node(args.config, args.gpus, node=args.node, role=_roles(args.role),
                          explicit=args.explicit, node_value=args.node_value,
                          worker_env=_worker_env(args.worker_env),
                          packs=_packs(args.packs),
                          job_env=_worker_env(args.job_env, "--job-env"),
                          node_env=_worker_env(args.node_env, "--node-env"))
    decision = result.decision
    # A required rule that the value breaks fails here as it would on the node.
    code = OK if decision.satisfied else PROBLEM
    if args.json:
        print(json.dumps({**decision.to_dict(), "env": result.env(),
                          "removed": list(result.remove)}, indent=2))
        return code
    print(f"CUDA_DEVICE_MAX_CONNECTIONS: {_shown(decision.value)}  "
          f"(source: {decision.source}; requirement: {decision.requirement})")
    print(textwrap.fill(f"reason: {decision.reason}", 100, subsequent_indent="  ",
                        break_on_hyphens=False))
    by_id = {rule.id: rule for rule in RULES}
    if decision.engines:
        print("engines and the rules that decided them:")
    for role, engine in decision.engines.items():
        # An engine may take more than one row ('a+b'): a table row and an
        # assert that holds beside it (Megatron-Core's UCC check).
        for rule in (by_id[rule_id] for rule_id in decision.rules[role].split("+")):
            print(f"  {role}: {engine} -> {rule.id} ({rule.requirement.label}): {rule.why}")
            print(f"      source: {rule.source}")
        print(f"      {decision.because[role]}")
    for line in pack_lines(decision):
        print(textwrap.fill(line, 100, subsequent_indent="  ", break_on_hyphens=False))
    for warning in decision.warnings:
        print(f"warning: {warning}")
    if not decision.satisfied:
        print("PROBLEM: the value breaks a required rule on these GPUs (see the warnings)")
    return code


def cmd_register(args: argparse.Namespace) -> int:
    from .register import PLUGINS_VARIABLE, merged_plugins, render

    plugins = merged_plugins(os.environ.get(PLUGINS_VARIABLE), args.priority)
    print(render(plugins, args.format))
    return OK


def cmd_runtime_env(args: argparse.Namespace) -> int:
    from .frameworks.loading import load_yaml, to_plain
    from .job_submission import submission_env

    if (args.config is None) == (args.command is None):
        raise MegatronEnvError("give the training config, or the training command's arguments "
                               "after -- (slime: ray-megatron-env runtime-env --json -- "
                               "--tensor-model-parallel-size 2 ...), not both")
    base = load_yaml(args.base) if args.base else _json_object(args.base_json)
    if args.ship_package and (base is None or isinstance(base, dict)):
        base = _shipped_package(base)  # any other base: build_runtime_env says what is wrong
    config = to_plain(args.config if args.config is not None else args.command)
    env, notes = submission_env(config, role=_roles(args.role), base=base,
                                take_over=args.take_over, packs=_packs(args.packs))
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    if args.json:
        print(json.dumps(env))
    else:
        import yaml

        print(yaml.safe_dump(env, sort_keys=False).rstrip())
    return OK


def _json_object(text: Optional[str]) -> Optional[dict]:
    """--base-json: a runtime env as ``ray job submit --runtime-env-json`` takes it."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise MegatronEnvError(f"--base-json is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise MegatronEnvError("--base-json must be a JSON object (a runtime env)")
    return value


def _split_command(argv: List[str]) -> Tuple[List[str], Optional[List[str]]]:
    """``runtime-env ... -- ARG...``: the training command's arguments are
    everything after the first ``--``, verbatim (argparse would read a
    leading ``--tensor-model-parallel-size`` there as the positional)."""
    if argv[:1] != ["runtime-env"] or "--" not in argv:
        return argv, None
    at = argv.index("--")
    return argv[:at], argv[at + 1:]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ray-megatron-env",
        description="The right CUDA_DEVICE_MAX_CONNECTIONS on every node of a Ray cluster.",
        epilog="Exit codes: 0 ok; 1 check --strict found a problem, or explain's value breaks "
               "a required rule; 2 bad usage or config; 3 cluster unreachable.")
    parser.add_argument("--version", action="version",
                        version=f"%(prog)s {__version__}")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")

    def role_option(p: argparse.ArgumentParser) -> None:
        p.add_argument("--role", action="append", metavar="ROLE",
                       help="narrow to a role's engine (the config's role names, e.g. verl's actor, "
                            "ref, critic, rollout; NeMo-RL's policy, generation); repeat or "
                            "comma-separate for several")
        p.add_argument("--packs", action="append", metavar="PACK",
                       help="rule packs to decide besides cuda-connections (always on), e.g. "
                            "nccl-fabric (docs/packs.md); repeat or comma-separate")

    demo = verbs.add_parser("demo", help="run the decision on a local simulated mixed-GPU cluster",
                            description="Start a local simulated cluster (no GPU, V100, A100, "
                                        "2xH100, a GB200 tray, H100+B200, 4xL40S), start an "
                                        "actor per node for each example config, print what "
                                        "each got (a node x scenario matrix, then what the "
                                        "packs set) and, with --verbose, why.")
    demo.add_argument("--config", help="your config (a framework's YAML or the compact form) instead of the "
                                       "examples; --role then narrows it")
    role_option(demo)
    demo.add_argument("--verbose", action="store_true",
                      help="after the matrix, each node's reason per scenario (and its ID and IP)")
    demo.add_argument("--json", action="store_true", help="machine-readable output")
    demo.set_defaults(run=cmd_demo)

    check = verbs.add_parser("check", help="preflight every node of a live cluster",
                             description="Start a short-lived actor with the megatron_env field "
                                         "on every alive node and report what it got.")
    check.add_argument("--address", help="cluster address (default: auto, RAY_ADDRESS)")
    check.add_argument("--config", help="training config (a framework's YAML or the compact form); "
                                        "without it only GPUs and registration are checked")
    role_option(check)
    check.add_argument("--strict", action="store_true",
                       help="exit 1 if any node does not answer, gets no decision (neither "
                            "the plugin nor the job env's setup hook decided there), has a "
                            "failed GPU probe, or breaks a hard requirement")
    check.add_argument("--timeout", type=float, default=60.0,
                       help="seconds to wait for all nodes to answer (60)")
    check.add_argument("--ship-package", action="store_true",
                       help="ship this package to the probe actors in py_modules, as a job "
                            "that ships it does (for nodes where it is not installed)")
    check.add_argument("--node", action="append", metavar="NODE",
                       help="check only this node: its id, an id prefix (as the table shows "
                            "it) or its IP; repeatable or comma-separated (default: every "
                            "alive node)")
    check.add_argument("--json", action="store_true", help="a JSON array, one object per node")
    check.set_defaults(run=cmd_check)

    explain = verbs.add_parser("explain", help="what a config gives on given GPUs (offline)",
                               description="Decide offline, without a cluster, exactly as a node "
                                           "with these GPUs would.")
    explain.add_argument("config", help="training config: a verl, NeMo-RL, AReaL or ROLL YAML, a file with "
                              "slime's (or miles') argument list, or the compact form")
    explain.add_argument("--gpus",
                         help="compute capabilities, e.g. 9.0 or 9.0,9.0,10.0; 'none' for no GPU; "
                              "'amd' for an AMD (ROCm) node, 'npu' for a Huawei Ascend node, "
                              "'musa' for a Moore Threads node (or give them in --node)")
    explain.add_argument("--node", metavar="FACTS",
                         help="the node's facts as RAY_MEGATRON_ENV_FAKE_NODE takes them, inline "
                              "JSON or a file: {\"gpus\": \"10.0\", \"fabric\": {\"state\": "
                              "\"completed\", \"cluster_uuid\": \"...\"}, \"imex_channel\": "
                              "\"absent\", \"p2p\": \"none\", \"cuda_driver\": \"12.8\", "
                              "\"kernel_driver\": \"570.172.08\"} (docs/packs.md)")
    explain.add_argument("--job-env", action="append", metavar="NAME=VALUE",
                         help="a variable the job's env_vars set (any variable, e.g. "
                              "NCCL_CUMEM_ENABLE=0); repeatable")
    role_option(explain)
    explain.add_argument("--explicit", metavar="N", help="an env_vars value in the runtime env")
    explain.add_argument("--node-value", metavar="N",
                         help="a CUDA_DEVICE_MAX_CONNECTIONS value inherited from the node's "
                              "environment")
    explain.add_argument("--node-env", action="append", metavar="NAME=VALUE",
                         help="a variable a worker would inherit from the node's environment "
                              "(any variable of any pack, e.g. an image's "
                              "TORCH_CUDA_ARCH_LIST=\"9.0 10.0\"); repeatable")
    explain.add_argument("--worker-env", action="append", metavar="NAME=VALUE",
                         help="a variable in the worker's own env_vars, by which the framework's "
                              "process kinds are told apart (e.g. WG_PREFIX=rollout_standalone_0 "
                              "for verl); repeatable. Without it: a trainer worker")
    explain.add_argument("--json", action="store_true", help="one JSON object")
    explain.set_defaults(run=cmd_explain)

    register = verbs.add_parser("register", help="print the RAY_RUNTIME_ENV_PLUGINS value",
                                description="Print RAY_RUNTIME_ENV_PLUGINS with this plugin, "
                                            "merged with the plugins already in the environment.")
    register.add_argument("--priority", type=int, help="plugin priority 0..100 "
                                                       "(default: the class's, 90)")
    register.add_argument("--format", choices=("shell", "json", "kuberay", "kuberay-operator"),
                          default="shell",
                          help="shell: an export line; json: the list; kuberay: a RayCluster "
                               "container env stanza; kuberay-operator: helm values for the "
                               "kuberay-operator chart (KubeRay 1.5+), for every RayCluster")
    register.set_defaults(run=cmd_register)

    runtime_env = verbs.add_parser(
        "runtime-env", help="print a runtime env for `ray job submit --runtime-env`",
        usage="%(prog)s [-h] [options] (CONFIG | -- ARG...)",
        description="Print a job runtime env (YAML, or JSON for --runtime-env-json) with the "
                    "compact megatron_env field. The config is a file, or, for a framework "
                    "configured on its command line (slime), the arguments of its training "
                    "command after --.",
        epilog="slime: ray-megatron-env runtime-env --take-over --json --base-json "
               "\"$RUNTIME_ENV_JSON\" -- \"${PERF_ARGS[@]}\" ... gives the JSON for "
               "ray job submit --runtime-env-json, without the hard-coded value.")
    runtime_env.add_argument("config", nargs="?",
                             help="training config file (verl YAML, a JSON/YAML list of slime's "
                                  "arguments, or the compact form)")
    role_option(runtime_env)
    base = runtime_env.add_mutually_exclusive_group()
    base.add_argument("--base", help="a runtime env YAML (or JSON) file to start from, e.g. "
                                     "verl/trainer/runtime_env.yaml")
    base.add_argument("--base-json", metavar="JSON",
                      help="a runtime env to start from, as JSON text (what a launch script "
                           "passes to ray job submit --runtime-env-json)")
    runtime_env.add_argument("--take-over", action="store_true",
                             help="remove a hard-coded CUDA_DEVICE_MAX_CONNECTIONS (from the "
                                  "base and, through the driver hook, from the job's driver)")
    runtime_env.add_argument("--ship-package", action="store_true",
                             help="add this package's folder to py_modules: ray job submit "
                                  "uploads it, for nodes (and a head) where it is not installed")
    runtime_env.add_argument("--json", action="store_true", help="JSON instead of YAML")
    runtime_env.set_defaults(run=cmd_runtime_env)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    try:
        argv, command = _split_command(list(sys.argv[1:] if argv is None else argv))
        args = build_parser().parse_args(argv)
        args.command = command
        try:
            return args.run(args)
        except MegatronEnvError as exc:
            print(f"ray-megatron-env {args.verb}: {exc}", file=sys.stderr)
            return BAD_INPUT
        finally:
            sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
    except BrokenPipeError:
        # The reader went away (| head): nothing left to say to it, and
        # Python's own final flush must not report it either.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
