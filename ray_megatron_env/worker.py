"""Inside a worker: the decision it got, and the fallback that makes it there.

``read_decision`` reads back what a worker got, whichever path decided.

``setup_hook`` is the fallback for nodes where the plugin is not registered
(docs/how-it-works.md#two-paths). ``build_runtime_env`` puts it in the job's
runtime env as Ray's ``worker_process_setup_hook``, which Ray runs in every
worker process of the job on its own node, before the worker takes its first
task, so before anything in it can create a CUDA context. There it makes the
same decision the agent would: the same field, readers, rules and precedence,
from the node's own GPUs and environment (never the worker's
``CUDA_VISIBLE_DEVICES``, which Ray rewrites per task), and writes the same
record with ``via: setup-hook``. Where the plugin ran, it does nothing.

Only the standard library, Ray and this package's pure modules load here, so
a node needs nothing beyond Ray and this package (which can travel with the
job: ``py_modules``).
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import sys
from typing import TYPE_CHECKING, Any, Callable, Dict, Mapping, MutableMapping, Optional

if TYPE_CHECKING:  # pragma: no cover
    from .decision import Decision

# decision.DECISION_VARIABLE (a test keeps them equal): named here so that a
# worker where the plugin already decided returns without importing the
# package's core, which every worker of a job env pays for otherwise.
DECISION_VARIABLE = "RAY_MEGATRON_ENV_DECISION"
SETUP_HOOK_PATH = "ray_megatron_env.worker.setup_hook"
# The field for one worker, in its env_vars: a per-role env replaces the
# job's here (Ray merges env_vars key by key), so the hook sees the field of
# the worker's own runtime env; Ray gives a setup hook no other view of it.
FIELD_VARIABLE = "RAY_MEGATRON_ENV_FIELD"
# Setup hooks the job had besides ours, run after ours, in order
# ('module.function', comma-separated: the submitted env's own, then one a
# job's driver passed to ray.init; see job_submission.complete_submitted_env).
NEXT_SETUP_HOOK_VARIABLE = "RAY_MEGATRON_ENV_NEXT_SETUP_HOOK"
# Ray's own carrier of a setup hook to a worker (ray_constants
# WORKER_PROCESS_SETUP_HOOK_ENV_VAR, the same name from Ray 2.41 to 2.60):
# set directly, it runs the hook in workers of an actor-level env too.
RAY_SETUP_HOOK_VARIABLE = "__RAY_WORKER_PROCESS_SETUP_HOOK_ENV_VAR"
LOG_NAME = "megatron_env_setup_hook"
# Ray's driver hook (ray_constants.RAY_RUNTIME_ENV_HOOK, read by ray.init),
# this package's (runtime_env.HOOK_PATH) and the one it runs next
# (hook.next_hook reads it).
DRIVER_HOOK_VARIABLE = "RAY_RUNTIME_ENV_HOOK"
DRIVER_HOOK_PATH = "ray_megatron_env.hook.runtime_env_hook"
NEXT_DRIVER_HOOK_VARIABLE = "RAY_MEGATRON_ENV_NEXT_HOOK"
# Ray's switch for its uv hook (ray_constants.RAY_ENABLE_UV_RUN_RUNTIME_ENV),
# and ours saying that the driver hook runs Ray's uv hook in its place.
UV_SWITCH_VARIABLE = "RAY_ENABLE_UV_RUN_RUNTIME_ENV"
UV_HOOK_VARIABLE = "RAY_MEGATRON_ENV_UV_HOOK"
# Set in every worker for the drivers it starts: their environment is this
# worker's, whose values the decision wrote or the job set, never a copy of
# a driver host's (runtime_env.driver_copies), so the driver hook lists none.
NESTED_VARIABLE = "RAY_MEGATRON_ENV_NESTED_DRIVER"


# What Ray writes into its own setup-hook variable for a callable hook
# (setup_hook.RUNTIME_ENV_FUNC_IDENTIFIER): a key into one job's exports.
EXPORTED_FUNCTION = "ray_runtime_env_func::"


def take_inherited_setup_hook(env_vars: Dict[str, str]) -> None:
    """Ray's own carrier of a setup hook, ``__RAY_WORKER_PROCESS_SETUP_HOOK_ENV_VAR``,
    taken out of ``env_vars`` (in place) of an env that carries the field.

    It is there when the driver runs inside a worker of a job whose env had
    a setup hook: vLLM's Ray executor passes the worker's own runtime env
    (``ray.get_runtime_context().runtime_env``, which holds the variable
    Ray wrote, beside the field and the setup hook), and a driver that
    passes its environment as ``env_vars`` (NeMo-RL) copies it. Beside a
    ``worker_process_setup_hook`` field Ray refuses it (2.41 to 2.54: an
    assertion in ``export_setup_func_module``, "reserved for the internal
    use"; from 2.55: "Conflicting worker_process_setup_hook" unless it is
    the same string). This package's own hook is dropped, since
    ``build_runtime_env`` sets the field to it again and Ray writes the
    variable anew; another hook module becomes a chained hook. A function
    another job exported cannot be called from this job's hook: refused."""
    inherited = env_vars.pop(RAY_SETUP_HOOK_VARIABLE, None)
    if not inherited or inherited == SETUP_HOOK_PATH:
        return
    if inherited.startswith(EXPORTED_FUNCTION):
        raise ValueError(
            f"ray_megatron_env: this driver's ray.init env_vars carry {RAY_SETUP_HOOK_VARIABLE}"
            f"={inherited[:60]}..., a function another job exported as its setup hook, which "
            "no setup hook of this job can call; remove that variable from the env_vars "
            "the driver passes to ray.init (it is Ray's own, reserved)")
    hooks = next_setup_hooks(env_vars)
    if inherited not in hooks:
        env_vars[NEXT_SETUP_HOOK_VARIABLE] = ",".join([inherited, *hooks])


def read_decision(environ: Optional[Mapping[str, str]] = None) -> Optional["Decision"]:
    """The decision made for this worker's node (by the plugin or by the
    setup hook: ``.via`` says which), or ``None`` when the worker was started
    without the ``megatron_env`` field or on a node where neither ran."""
    from .decision import Decision

    text = (os.environ if environ is None else environ).get(DECISION_VARIABLE)
    return Decision.from_json(text) if text else None


def setup_hook(then: Optional[Callable[[], Any]] = None) -> None:
    """Ray's ``worker_process_setup_hook``: decide here unless the plugin did,
    then run the job's own hooks: those named in RAY_MEGATRON_ENV_NEXT_SETUP_HOOK,
    in order, then ``then`` (a driver's callable hook, see ``chained``). A
    bad field raises, as it fails the worker through the plugin; a probe
    problem never does."""
    try:
        hook_nested_drivers(os.environ)
        node_environ = node_environment()
        if not plugin_decided(os.environ, node_environ):
            import ray

            worker = ray._private.worker.global_worker
            job_env = _job_runtime_env(worker)
            decide_here(os.environ, node_environ, job_env.get("megatron_env"),
                        _node_cache(worker, ray), lambda: _logger(worker),
                        job_env_vars=job_env.get("env_vars") or {})
    finally:
        for hook in _next_setup_hooks():
            hook()
        if then is not None:
            then()


def hook_nested_drivers(environ: MutableMapping[str, str]) -> None:
    """Have a driver started inside this worker (vLLM's Ray executor: a
    subprocess calling ``ray.init(address=..., runtime_env=<this worker's
    runtime env>)``) run this package's driver hook, which takes Ray's own
    setup-hook variable out of the env it passes (``take_inherited_setup_hook``):
    Ray 2.41 to 2.54 refuse that variable beside the ``worker_process_setup_hook``
    field. A driver hook the worker already has runs after ours."""
    environ[NESTED_VARIABLE] = "1"
    current = environ.get(DRIVER_HOOK_VARIABLE, "").strip()
    if current == DRIVER_HOOK_PATH:
        return
    if current:
        environ[NEXT_DRIVER_HOOK_VARIABLE] = current
    environ[DRIVER_HOOK_VARIABLE] = DRIVER_HOOK_PATH
    if uv_hook_replaces_driver_hook():
        environ[UV_SWITCH_VARIABLE] = "0"
        environ[UV_HOOK_VARIABLE] = "1"


def uv_hook_replaces_driver_hook() -> bool:
    """Ray 2.47 to 2.54: a driver with a ``uv run`` ancestor (a worker of a
    job run under ``uv run`` has one) gets Ray's uv hook instead of
    ``RAY_RUNTIME_ENV_HOOK`` (``ray/_private/worker.py``,
    ``_maybe_modify_runtime_env``), and these releases still assert on the
    setup hook's variable (2.55 checks it instead:
    ``setup_hook._check_setup_hook_consistency``). There Ray's switch goes
    off for processes this worker starts, and the driver hook runs Ray's uv
    hook itself, first (``hook.runtime_env_hook``)."""
    try:
        from ray._private import ray_constants
        from ray._private.runtime_env import setup_hook

        if not getattr(ray_constants, "RAY_ENABLE_UV_RUN_RUNTIME_ENV", False) \
                or hasattr(setup_hook, "_check_setup_hook_consistency"):
            return False
        from ray._private.runtime_env import uv_runtime_env_hook  # noqa: F401
    except Exception:
        return False
    return True


# Every variable a pack reads from a worker's or a node's environment (the
# union of packs.*.variables; a test keeps them equal). With the field and
# its process variables, they are all a decision reads besides the node's
# facts, so they key a decision made on the node once for all its workers.
PACK_VARIABLES = ("CUDA_DEVICE_MAX_CONNECTIONS", "NCCL_CUMEM_ENABLE", "NCCL_MNNVL_ENABLE",
                  "NCCL_NVLS_ENABLE", "NCCL_CUMEM_HOST_ENABLE", "NCCL_P2P_DISABLE",
                  "NCCL_SHM_DISABLE", "TORCH_CUDA_ARCH_LIST",
                  "NVTE_FP8_BLOCK_SCALING_FP32_SCALES", "FLA_TILELANG", "GLOO_SOCKET_IFNAME",
                  "NCCL_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "HCCL_SOCKET_IFNAME", "NCCL_IB_HCA",
                  "NCCL_IB_GID_INDEX")
# The kinds of node facts besides the GPUs each optional pack reads
# (packs.*.fact_kinds; a test keeps them equal): what a cached decision's key
# takes from the node's cache, without importing the core.
PACK_FACT_KINDS = {"nccl-fabric": ("fabric",), "nccl-host-mem": ("p2p",), "torch-arch": (),
                   "te-fp8-scales": (), "fla-backend": (), "net-ifaces": ("net",)}


def decide_here(environ: MutableMapping[str, str], node_environ: Optional[Mapping[str, str]],
                job_field: Any, cache: Any, logger: Callable[[], logging.Logger],
                job_env_vars: Optional[Mapping[str, str]] = None) -> None:
    """``decide_in_worker`` once per node for each set of inputs: a later
    worker with the same field, the same values of the variables a decision
    reads, and the same node facts takes the decision from the node's cache
    without importing the package's core (which costs a worker start
    several percent)."""
    job_env_vars = job_env_vars or {}
    key = _decision_key(environ, node_environ, job_field, cache, job_env_vars)
    entry = cache.decision(key) if key else None
    if entry is None:
        before = dict(environ)
        decision = decide_in_worker(environ, node_environ, job_field,
                                    cache.get if cache else lambda probe, kind: probe(), logger(),
                                    job_env_vars)
        if decision is None:
            return
        entry = {"set": {k: v for k, v in environ.items() if before.get(k) != v},
                 "unset": sorted(set(before) - set(environ)), "log": decision.log_lines()}
        # The first worker on a node probed just now: its facts key it too.
        key = key or _decision_key(before, node_environ, job_field, cache, job_env_vars)
        if key:
            cache.keep_decision(key, entry)
        return
    environ.update(entry["set"])
    for name in entry["unset"]:
        environ.pop(name, None)
    log = logger()
    for level, line in entry["log"]:
        log.log(level, "%s", line)


def _decision_key(environ: Mapping[str, str], node_environ: Optional[Mapping[str, str]],
                  job_field: Any, cache: Any, job_env_vars: Mapping[str, str]) -> Optional[str]:
    import hashlib

    if cache is None or node_environ is None:
        return None
    text = _own_field_text(environ, node_environ)
    try:
        field = json.loads(text) if text else job_field
        processes = [rule["variable"] for rule in field.get("processes", ())]
    except (ValueError, AttributeError, TypeError, KeyError):
        return None  # the full path says what is wrong with it
    if field is None:
        return None
    packs = field.get("packs") or ()
    kinds = sorted({kind for name in ([packs] if isinstance(packs, str) else packs)
                    for kind in PACK_FACT_KINDS.get(name, ())})
    facts = cache.stamp(("gpus", *kinds))
    if facts is None:
        return None
    names = sorted(set(PACK_VARIABLES) | set(processes))
    material = json.dumps([field, [environ.get(n) for n in names],
                           [node_environ.get(n) for n in names],
                           [job_env_vars.get(n) for n in names], facts], sort_keys=True)
    return hashlib.sha256(material.encode()).hexdigest()[:32]


def _own_field_text(environ: Mapping[str, str],
                    node_environ: Optional[Mapping[str, str]]) -> Optional[str]:
    text = environ.get(FIELD_VARIABLE)
    if text and node_environ is not None and node_environ.get(FIELD_VARIABLE) == text:
        return None  # the node's own, not this worker's runtime env
    return text


def plugin_decided(environ: Mapping[str, str], node_environ: Optional[Mapping[str, str]]) -> bool:
    """The worker has a decision the node did not give it: the plugin's."""
    value = environ.get(DECISION_VARIABLE)
    return bool(value) and (node_environ is None or node_environ.get(DECISION_VARIABLE) != value)


CHAINED_PREFIX = "megatron_env_then_"


def chained(then: Callable[[], Any]) -> Callable[[], None]:
    """A setup hook that runs ours, then ``then`` (a user's callable hook).
    Its name says so (Ray records a callable hook by its ``__name__``)."""
    if is_chained(then):
        return then  # already ours first

    def megatron_env_setup_hook() -> None:
        setup_hook(then)

    megatron_env_setup_hook.__name__ = f"{CHAINED_PREFIX}{getattr(then, '__name__', 'hook')}"
    return megatron_env_setup_hook


def is_chained(hook: Any) -> bool:
    """A callable made by ``chained``: it runs this package's hook first."""
    return callable(hook) and getattr(hook, "__name__", "").startswith(CHAINED_PREFIX)


def next_setup_hooks(environ: Mapping[str, str]) -> list:
    """The hooks named in RAY_MEGATRON_ENV_NEXT_SETUP_HOOK, in order."""
    text = environ.get(NEXT_SETUP_HOOK_VARIABLE, "")
    return [path.strip() for path in text.split(",") if path.strip()]


# The runtime env field Ray runs a setup hook from (the job's env only).
SETUP_HOOK_FIELD = "worker_process_setup_hook"


def add_setup_hook(env: Dict[str, Any]) -> None:
    """The worker-side fallback (worker.py): the field in env_vars for the
    hook to read, and Ray's setup hook chained in front of one the base
    already had. Ray runs the hook only from the job's env (ray.init); in an
    actor's or task's env it ignores it, and the job env's hook, which
    reaches those workers through env_vars, reads their own field."""
    from .values import FIELD, fail_type

    env_vars = env.get("env_vars")
    if env_vars is None:
        env_vars = env["env_vars"] = {}
    elif not isinstance(env_vars, dict):
        raise fail_type("base.env_vars", "a mapping of names to strings", env_vars)
    env_vars[FIELD_VARIABLE] = json.dumps(env[FIELD], separators=(",", ":"), sort_keys=True)
    theirs = env.get(SETUP_HOOK_FIELD)
    if theirs is None or theirs == SETUP_HOOK_PATH:
        env[SETUP_HOOK_FIELD] = SETUP_HOOK_PATH
    elif isinstance(theirs, str):
        # After any hook already chained (a submitted env's own, when a
        # job's driver brings another: job_submission.complete_submitted_env).
        hooks = next_setup_hooks(env_vars)
        env_vars[NEXT_SETUP_HOOK_VARIABLE] = ",".join(
            hooks if theirs in hooks else [*hooks, theirs])
        env[SETUP_HOOK_FIELD] = SETUP_HOOK_PATH
    elif callable(theirs):
        env[SETUP_HOOK_FIELD] = chained(theirs)
    else:
        raise fail_type(f"base.{SETUP_HOOK_FIELD}", "a 'module.function' string or a function",
                        theirs)


def as_actor_env(env: Mapping[str, Any]) -> Dict[str, Any]:
    """An env from ``build_runtime_env`` (a job's, or a role's that a job env
    would sit under) made to work as one actor's env, as if that actor ran in
    a job whose ray.init env came from ``build_runtime_env``: Ray honours
    ``worker_process_setup_hook`` only in the job's env, so the hook goes
    where Ray itself carries it to a worker (an env var). For actors that
    preflight a node (``check``, the demo)."""
    out = dict(env)
    hook = out.pop("worker_process_setup_hook", None)
    env_vars = out.get("env_vars") or {}
    if FIELD_VARIABLE not in env_vars:
        return dict(env)  # not from build_runtime_env: as it is
    if hook not in (None, SETUP_HOOK_PATH):
        raise ValueError("as_actor_env takes an env whose setup hook is this package's own")
    out["env_vars"] = {**env_vars, RAY_SETUP_HOOK_VARIABLE: SETUP_HOOK_PATH}
    return out


def decide_in_worker(environ: MutableMapping[str, str], node_environ: Optional[Mapping[str, str]],
                     job_field: Any, cache: Callable[[Callable[[], Any], str], Any],
                     logger: logging.Logger,
                     job_env_vars: Optional[Mapping[str, str]] = None) -> Optional[Decision]:
    """Decide for this worker process and update ``environ`` in place.

    ``node_environ`` is the node's own environment (the raylet's; None when
    it cannot be read): what differs from it in ``environ`` came from the
    runtime env's ``env_vars``, so is explicit, and so is a value the job's
    own ``env_vars`` (``job_env_vars``) gave, even where it equals the
    node's; the node's other values are the inherited ones.
    ``cache(probe, kind)`` returns the node's ``gpus``, ``fabric``, ``p2p`` or ``net`` facts,
    running ``probe`` only when no worker on the node has.
    """
    if plugin_decided(environ, node_environ):
        return None
    from .decision import VIA_SETUP_HOOK, decide_node
    from .errors import FieldValueError
    from .frameworks import parse_field
    from .node import FABRIC, NET, P2P, NodeFacts
    from .packs import fact_kinds
    from .probe import probe_fabric, probe_gpus, probe_net, probe_p2p

    text = _own_field_text(environ, node_environ)
    try:
        field = json.loads(text) if text else job_field
    except ValueError as exc:
        raise FieldValueError(f"{FIELD_VARIABLE} is not JSON ({exc}); it is written by "
                              "build_runtime_env, so give the worker an env made there") from None
    if field is None:
        return None  # a worker of this job started without the field
    spec = parse_field(field)
    # The node's environment, as the agent probes with it: never this
    # worker's CUDA_VISIBLE_DEVICES, which Ray rewrites per task.
    probe_env = node_environ if node_environ is not None else environ
    kinds = fact_kinds(spec.packs)
    facts = NodeFacts(cache(lambda: probe_gpus(probe_env), "gpus"),
                      cache(lambda: probe_fabric(probe_env), "fabric")
                      if FABRIC in kinds else None,
                      cache(lambda: probe_p2p(probe_env), "p2p") if P2P in kinds else None,
                      cache(lambda: probe_net(probe_env, _ray_node_ip()), "net")
                      if NET in kinds else None)
    if node_environ is None:
        env_vars: Dict[str, str] = dict(environ)  # nothing tells inherited from explicit
    else:
        given = job_env_vars or {}
        env_vars = {k: v for k, v in environ.items()
                    if node_environ.get(k) != v or given.get(k) == v}
    before = dict(env_vars)
    result = decide_node(spec, facts, env_vars, node_environ or {}, via=VIA_SETUP_HOOK)
    result.write_to(env_vars, logger)
    for key in set(before) | set(env_vars):
        if key in env_vars:
            environ[key] = env_vars[key]
        else:
            environ.pop(key, None)
    return result.decision


def _ray_node_ip() -> Optional[str]:
    """The address Ray uses for this worker's node (its raylet's), or None."""
    try:
        import ray

        return ray._private.worker.global_worker.node_ip_address
    except Exception:
        return None


def node_environment(pid: Optional[int] = None) -> Optional[Dict[str, str]]:
    """The environment of the raylet that started this worker: the node's own,
    as its agent sees it. Ray starts each worker as the raylet's child (the
    setup step execs the worker in place); anything else, or a /proc that
    cannot be read, gives None."""
    parent = os.getppid() if pid is None else pid
    try:
        with open(f"/proc/{parent}/cmdline", "rb") as f:
            command = f.read().split(b"\0", 1)[0]
        if os.path.basename(command) != b"raylet":
            return None
        with open(f"/proc/{parent}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    pairs = (entry.split(b"=", 1) for entry in raw.split(b"\0") if b"=" in entry)
    return {k.decode("utf-8", "replace"): v.decode("utf-8", "replace") for k, v in pairs}


def _job_runtime_env(worker: Any) -> Dict[str, Any]:
    """The job's runtime env (what ``ray.init`` was given); {} where it
    cannot be read."""
    try:
        text = worker.core_worker.get_job_config().runtime_env_info.serialized_runtime_env
        env = json.loads(text or "{}")
    except Exception:
        return {}
    return env if isinstance(env, dict) else {}


def _node_cache(worker: Any, ray: Any) -> Any:
    """The node's cache in its Ray session folder (None where it cannot be had)."""
    from .cache import NodeCache

    try:
        return NodeCache(worker.node.get_session_dir_path(),
                         ray.get_runtime_context().get_node_id())
    except Exception:
        return None


def _logger(worker: Any) -> logging.Logger:
    """The node's log for this job (``<logs>/megatron_env_setup_hook-<job>.log``,
    beside the plugin's ``runtime_env_setup-<job>.log``); warnings also go to
    the worker's own log, which Ray shows the driver."""
    logger = logging.getLogger(f"ray_megatron_env.{LOG_NAME}")
    if logger.handlers:
        return logger
    logger.setLevel(logging.INFO)
    logger.propagate = False
    form = logging.Formatter("%(asctime)s %(levelname)s pid=%(process)d %(message)s")
    try:
        path = os.path.join(worker.node.get_logs_dir_path(),
                            f"{LOG_NAME}-{worker.current_job_id.hex()}.log")
        to_file = logging.FileHandler(path)
        to_file.setFormatter(form)
        logger.addHandler(to_file)
    except Exception:
        pass
    to_worker_log = logging.StreamHandler(sys.stderr)
    to_worker_log.setLevel(logging.WARNING)
    to_worker_log.setFormatter(form)
    logger.addHandler(to_worker_log)
    return logger


def _next_setup_hooks() -> list:
    hooks = []
    for path in next_setup_hooks(os.environ):
        module, _, name = path.rpartition(".")
        hooks.append(getattr(importlib.import_module(module), name))
    return hooks
