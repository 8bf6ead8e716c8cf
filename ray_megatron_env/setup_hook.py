"""Ray's ``worker_process_setup_hook``, both ends: the job env that carries
it (the driver end), and the decision it makes inside each Python worker
where the plugin is not registered (the worker end).

Driver end: ``add_setup_hook`` (called by ``build_runtime_env``) puts the
hook in the job's env, chained in front of a hook the job already had, with
the field in ``env_vars`` (RAY_MEGATRON_ENV_FIELD) and a mark beside each
pack variable the env sets (``mark_given``); ``as_actor_env`` carries the
same to one actor.

Worker end: Ray runs ``setup_hook`` in every worker process of the job on
its own node, before the worker runs its first task, so before anything in
it can create a CUDA context. There it makes the decision the agent would:
the same field, readers, rules and precedence, from the node's own GPUs and
environment (never the worker's ``CUDA_VISIBLE_DEVICES``, which Ray
rewrites per task), and writes the same record with ``via: setup-hook``.
Where the plugin ran, it does nothing. It reads only the worker's own
environment and what Ray fixed when it started the process: a worker's job
config arrives with its first task, maybe after the hook, and Ray keeps the
first answer for good (docs/design.md).

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

from .names import (
    DECISION_VARIABLE, DRIVER_HOOK_PATH, DRIVER_HOOK_VARIABLE, EXPORTED_FUNCTION, FIELD,
    FIELD_VARIABLE, GIVEN_PREFIX, NESTED_VARIABLE, NEXT_DRIVER_HOOK_VARIABLE,
    NEXT_SETUP_HOOK_VARIABLE, PACK_VARIABLES, RAY_SETUP_HOOK_VARIABLE, SETUP_HOOK_FIELD,
    SETUP_HOOK_PATH, UV_HOOK_VARIABLE, UV_SWITCH_VARIABLE,
)

if TYPE_CHECKING:  # pragma: no cover
    from .record import Decision

LOG_NAME = "megatron_env_setup_hook"


# --- the driver end: the env that carries the hook -------------------------------------

def add_setup_hook(env: Dict[str, Any]) -> None:
    """The worker-side fallback: the field in env_vars for the
    hook to read, and Ray's setup hook chained in front of one the base
    already had. Ray runs the hook only from the job's env (ray.init); in an
    actor's or task's env it ignores it, and the job env's hook, which
    reaches those workers through env_vars, reads their own field."""
    from .values import fail_type

    env_vars = env.get("env_vars")
    if env_vars is None:
        env_vars = env["env_vars"] = {}
    elif not isinstance(env_vars, dict):
        raise fail_type("base.env_vars", "a mapping of names to strings", env_vars)
    env_vars[FIELD_VARIABLE] = json.dumps(env[FIELD], separators=(",", ":"), sort_keys=True)
    mark_given(env_vars)
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


def mark_given(env_vars: Dict[str, Any]) -> None:
    """Mark, in place, each pack variable ``env_vars`` sets, and drop marks
    of those it no longer sets (a value taken over)."""
    for key in [k for k in env_vars if k.startswith(GIVEN_PREFIX)]:
        del env_vars[key]
    for name in PACK_VARIABLES:
        if name in env_vars:
            env_vars[GIVEN_PREFIX + name] = "1"


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
    mark_given(out["env_vars"])
    return out


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


# --- the worker end: the decision in each worker ----------------------------------------

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

            # Only what Ray fixed when it started this process: the job's
            # config and the task's runtime env reach a worker with its
            # first task, which may come after this hook, and Ray caches the
            # first answer for the process's life (docs/design.md).
            worker = ray._private.worker.global_worker
            decide_here(os.environ, node_environ, _node_cache(worker), lambda: _logger(worker))
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
    from .uv_hook import uv_hook_replaces_driver_hook

    if uv_hook_replaces_driver_hook():
        environ[UV_SWITCH_VARIABLE] = "0"
        environ[UV_HOOK_VARIABLE] = "1"


def given_names(environ: Mapping[str, str], node_environ: Mapping[str, str]) -> set:
    """The pack variables a runtime env gave this worker, by their marks;
    a mark the node itself exports is the node's, not a runtime env's."""
    return {name for name in PACK_VARIABLES
            if (mark := environ.get(GIVEN_PREFIX + name)) is not None
            and node_environ.get(GIVEN_PREFIX + name) != mark}


def plugin_decided(environ: Mapping[str, str], node_environ: Optional[Mapping[str, str]]) -> bool:
    """The worker has a decision the node did not give it: the plugin's."""
    value = environ.get(DECISION_VARIABLE)
    return bool(value) and (node_environ is None or node_environ.get(DECISION_VARIABLE) != value)


def decide_here(environ: MutableMapping[str, str], node_environ: Optional[Mapping[str, str]],
                cache: Any, logger: Callable[[], logging.Logger]) -> None:
    """``decide_in_worker`` once per node for each set of inputs: a later
    worker with the same field, the same values of the variables a decision
    reads, the same of them given by its runtime env, and the same node
    facts takes the decision from the node's cache without importing the
    package's core (which costs a worker start several percent)."""
    key = _decision_key(environ, node_environ, cache)
    entry = cache.decision(key) if key else None
    if entry is None:
        before = dict(environ)
        decision = decide_in_worker(environ, node_environ,
                                    cache.get if cache else lambda probe, kind: probe(), logger())
        if decision is None:
            return
        entry = {"set": {k: v for k, v in environ.items() if before.get(k) != v},
                 "unset": sorted(set(before) - set(environ)), "log": decision.log_lines()}
        # The first worker on a node probed just now: its facts key it too.
        key = key or _decision_key(before, node_environ, cache)
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
                  cache: Any) -> Optional[str]:
    if cache is None or node_environ is None:
        return None
    text = _own_field_text(environ, node_environ)
    if not text:
        return None
    try:
        field = json.loads(text)
    except ValueError:
        return None  # the full path says what is wrong with it
    return cache.decision_key(field, environ, node_environ, given_names(environ, node_environ))


def _own_field_text(environ: Mapping[str, str],
                    node_environ: Optional[Mapping[str, str]]) -> Optional[str]:
    text = environ.get(FIELD_VARIABLE)
    if text and node_environ is not None and node_environ.get(FIELD_VARIABLE) == text:
        return None  # the node's own, not this worker's runtime env
    return text


def decide_in_worker(environ: MutableMapping[str, str], node_environ: Optional[Mapping[str, str]],
                     cache: Callable[[Callable[[], Any], str], Any],
                     logger: logging.Logger) -> Optional[Decision]:
    """Decide for this worker process from its own field (RAY_MEGATRON_ENV_FIELD)
    and update ``environ`` in place; None where it has no field or the
    plugin decided.

    ``node_environ`` is the node's own environment (the raylet's; None when
    it cannot be read): what differs from it in ``environ`` came from the
    runtime env's ``env_vars``, so is explicit, and so is a pack variable
    whose mark says a runtime env gave it (``given_names``), even where it
    equals the node's; the node's other values are the inherited ones.
    ``cache(probe, kind)`` returns the node's ``gpus``, ``fabric``, ``p2p`` or ``net`` facts,
    running ``probe`` only when no worker on the node has.
    """
    if plugin_decided(environ, node_environ):
        return None
    from .decision import decide_node
    from .record import VIA_SETUP_HOOK
    from .errors import FieldValueError
    from .frameworks import parse_field
    from .packs import fact_kinds
    from .probe import node_facts, probes

    text = _own_field_text(environ, node_environ)
    if not text:
        # Every env that carries this hook carries the field beside it
        # (add_setup_hook); a worker without one has nothing to decide from.
        logger.warning("%s: this worker's environment has no %s (the env that set the setup "
                       "hook did not come from build_runtime_env or 'ray-megatron-env "
                       "runtime-env'): nothing decided here", SETUP_HOOK_PATH, FIELD_VARIABLE)
        return None
    try:
        field = json.loads(text)
    except ValueError as exc:
        raise FieldValueError(f"{FIELD_VARIABLE} is not JSON ({exc}); it is written by "
                              "build_runtime_env, so give the worker an env made there") from None
    spec = parse_field(field)
    # The node's environment, as the agent probes with it: never this
    # worker's CUDA_VISIBLE_DEVICES, which Ray rewrites per task.
    probe_env = node_environ if node_environ is not None else environ
    bound = probes(probe_env, _ray_node_ip())
    facts = node_facts(fact_kinds(spec.packs), lambda kind: cache(bound[kind], kind))
    if node_environ is None:
        env_vars: Dict[str, str] = dict(environ)  # nothing tells inherited from explicit
    else:
        given = given_names(environ, node_environ)
        env_vars = {k: v for k, v in environ.items() if node_environ.get(k) != v or k in given}
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


def _node_cache(worker: Any) -> Any:
    """The node's cache in its Ray session folder (None where it cannot be had)."""
    from .cache import NodeCache

    try:
        return NodeCache(worker.node.get_session_dir_path(), worker.current_node_id.hex())
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
