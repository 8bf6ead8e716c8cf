"""`ray job submit` end to end, as a user who cannot touch the cluster runs it.

A head started with `ray start --head` and its dashboard (Ray's job server),
worker nodes started with `ray start`, none of them with this package
installed (tests/fakes/not_installed hides it) or the plugin registered;
GPUs faked per node. A job is submitted with
`ray job submit --runtime-env FILE --working-dir DIR -- python drivers.py SHAPE...`,
FILE written by `ray-megatron-env runtime-env CONFIG --ship-package`, once
without and once with RAY_OVERRIDE_JOB_RUNTIME_ENV=1 in the job env, the two
submitted at once. Each entrypoint runs one driver process per shape, one
after another: each is a Ray job of its own (its own `ray.init`, which merges
the submitted env read from RAY_JOB_CONFIG_JSON_ENV_VAR, as every submitted
driver does), so the two submissions run thirteen jobs on the same nodes, two
at a time. The drivers are of the shapes the frameworks have (verl: its own
env_vars; NeMo-RL: its whole environment; a driver with its own setup hook, a
string and a callable; a driver whose env_vars clash with the job env's; in
the first submission, a driver that starts another inside an actor, as vLLM's
Ray executor does).

Expected values are the rule table's (docs/rules.md), not the package's:
the actor and ref of verl's Megatron TP=2 example
(ray_megatron_env/examples/verl_megatron.yaml) ask 1 before Blackwell
(megatron-model-parallel), nothing on B200 (megatron-blackwell) or on a
node without a GPU (no-gpu).

One cluster for the module, one task per node per driver. Marked slow: the
README's command leaves it to .ci/run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import pytest

from configs import MEGATRON_YAML
from drivers import driver_environment
from paths import TESTS
from ray_megatron_env.simulation import NODE_RAY_SETTINGS

# ray_version_specific: job submission, the job config and the runtime env merge
# (RAY_OVERRIDE_JOB_RUNTIME_ENV, the setup-hook consistency check of 2.60) are
# Ray machinery that changes between versions: .ci/run runs this on 2.41 too.
pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.ray_version_specific]

BIN = Path(sys.executable).parent
# name -> RAY_MEGATRON_ENV_FAKE_GPUS; the first is the head.
NODES = {"head": "none", "h100": "9.0", "b200": "10.0"}
# From the rule table, for a verl Megatron TP=2 job: value, per node.
EXPECTED = {"head": None, "h100": "1", "b200": None}
# Every port a node listens on that Ray would otherwise take from a fixed
# default (52365 for the dashboard agent, 10001 for the client server) or
# pick in Python (2.41), where two nodes on one host can collide.
NODE_PORTS = ("--node-manager-port", "--object-manager-port", "--runtime-env-agent-port",
              "--dashboard-agent-grpc-port", "--dashboard-agent-listen-port",
              "--metrics-export-port")
HEAD_PORTS = ("--port", "--dashboard-port", "--ray-client-server-port")
# In the environment of every process this module's cluster starts (beside
# RAY_TMPDIR): what its stop looks for.
MARKER = "RME_JOB_CLUSTER"
HEALTH_CHECK = '{"health_check_period_ms": 3000, "health_check_failure_threshold": 40}'

DRIVER = r'''
import json, os, sys, ray

shape = sys.argv[1]

def mark():
    os.environ["USER_HOOK_RAN"] = "callable:" + (
        "after" if "RAY_MEGATRON_ENV_DECISION" in os.environ else "before")

env_vars = {"TOKENIZERS_PARALLELISM": "true", "NCCL_DEBUG": "WARN"}
if shape == "verl":          # its own env_vars (verl's get_ppo_ray_runtime_env)
    ray.init(runtime_env={"env_vars": env_vars})
elif shape == "nemo-rl":     # its whole environment (NeMo-RL's init_ray)
    ray.init(address="auto", runtime_env={"env_vars": dict(os.environ)})
elif shape == "hook-string":
    ray.init(runtime_env={"env_vars": env_vars, "worker_process_setup_hook": "userhook.mark"})
elif shape == "hook-callable":
    ray.init(runtime_env={"env_vars": env_vars, "worker_process_setup_hook": mark})
elif shape == "nemo-rl-hook":
    ray.init(address="auto", runtime_env={"env_vars": dict(os.environ),
                                          "worker_process_setup_hook": "userhook.mark"})
elif shape == "nested":      # verl's env_vars; then vLLM's Ray executor in an actor
    ray.init(runtime_env={"env_vars": env_vars})
elif shape == "clash":       # a key the job env also sets, to another value
    ray.init(runtime_env={"env_vars": {"NCCL_DEBUG": "INFO"}})
print("CONNECTED", flush=True)

@ray.remote(num_cpus=0)
def seen():
    import ray_megatron_env
    d = ray_megatron_env.read_decision()
    return {"value": os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS"),
            "via": d.via if d else None, "decided": d is not None,
            "hook": os.environ.get("USER_HOOK_RAN"), "pid": os.getpid()}

names = sys.argv[2].split(",")
if shape == "nested":  # tests/helpers/nested_driver.py, on the H100 node
    from nested_driver import Engine

    engine = Engine.options(resources={"rme_h100": 1}).remote()
    print("NESTED " + json.dumps(ray.get(engine.start_nested_driver.remote(names), timeout=240)))
refs = [seen.options(resources={"rme_" + n: 1}).remote() for n in names]
print("RESULT " + json.dumps(dict(zip(names, ray.get(refs, timeout=120)))), flush=True)
'''

# The entrypoint: each shape's driver in a process of its own, in a row,
# each framed by lines that tell its output from the next one's. The drivers
# run from a copy of the working dir: when a driver's job ends, Ray may
# remove the node's copy of the job's working_dir, the entrypoint's cwd (seen
# on Ray 2.60 with several drivers in one entrypoint).
DRIVERS = r'''
import shutil, subprocess, sys, tempfile

nodes, shapes = sys.argv[1], sys.argv[2:]
here = shutil.copytree(".", tempfile.mkdtemp() + "/job")
for shape in shapes:
    print("=== BEGIN " + shape, flush=True)
    code = subprocess.run([sys.executable, "driver.py", shape, nodes], cwd=here).returncode
    print("=== END %s %d" % (shape, code), flush=True)
shutil.rmtree(here, ignore_errors=True)
'''

USER_HOOK = '''
import os


def mark():
    os.environ["USER_HOOK_RAN"] = "string:" + (
        "after" if "RAY_MEGATRON_ENV_DECISION" in os.environ else "before")
'''


def _free_ports(count):
    with ExitStack() as held:  # held open until all are picked: all differ
        socks = [held.enter_context(socket.socket()) for _ in range(count)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


class JobCluster:
    """A head with the dashboard and worker nodes, each started with `ray start`
    in its own environment; stopped by killing exactly the processes that
    carry this cluster's RAY_TMPDIR (never `ray stop`, which stops every Ray
    on the machine)."""

    def __init__(self) -> None:
        self.tmpdir = tempfile.mkdtemp(prefix="rme-js-", dir="/tmp")
        self.gcs_port = self.dashboard_port = None

    def environment(self, gpus):
        from conftest import NOT_INSTALLED, SESSION_VARIABLE

        env = driver_environment()
        for name in ("RAY_ADDRESS", "RAY_RUNTIME_ENV_PLUGINS", "RAY_OVERRIDE_JOB_RUNTIME_ENV"):
            env.pop(name, None)
        env.update(NOT_INSTALLED)
        # The entrypoint's `python` is this venv's, as on a node whose image has Ray.
        env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
        env.update({"RAY_MEGATRON_ENV_FAKE_GPUS": gpus, **NODE_RAY_SETTINGS,
                    "RAY_USAGE_STATS_ENABLED": "0"})
        # Last: the variables that find this cluster's processes again.
        for name, value in ((SESSION_VARIABLE, os.environ.get(SESSION_VARIABLE, "")),
                            ("RAY_TMPDIR", self.tmpdir), (MARKER, self.tmpdir)):
            env.pop(name, None)
            env[name] = value
        return env

    def start(self):
        try:
            for i, (name, gpus) in enumerate(NODES.items()):
                ports = _free_ports(len(NODE_PORTS) + (len(HEAD_PORTS) if i == 0 else 0))
                args = [str(BIN / "ray"), "start", "--num-cpus=1", "--disable-usage-stats",
                        f"--resources={json.dumps({'rme_' + name: 100})}",
                        "--object-store-memory=80000000"]
                args += [f"{flag}={port}" for flag, port in zip(NODE_PORTS, ports)]
                if i == 0:
                    self.gcs_port, self.dashboard_port, client = ports[len(NODE_PORTS):]
                    args += ["--head", f"--port={self.gcs_port}",
                             f"--dashboard-port={self.dashboard_port}",
                             f"--ray-client-server-port={client}", "--include-dashboard=true",
                             "--dashboard-host=127.0.0.1", f"--temp-dir={self.tmpdir}/ray",
                             f"--system-config={HEALTH_CHECK}"]
                else:
                    args += [f"--address=127.0.0.1:{self.gcs_port}"]
                done = subprocess.run(args, env=self.environment(gpus), capture_output=True,
                                      text=True, timeout=120)
                assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
            self._wait_for_nodes()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_for_nodes(self):
        deadline = time.monotonic() + 60
        while True:
            out = subprocess.run([str(BIN / "ray"), "list", "nodes", "--format=json",
                                  f"--address=http://127.0.0.1:{self.dashboard_port}"],
                                 capture_output=True, text=True, env=self.environment("none"))
            try:
                alive = [n for n in json.loads(out.stdout) if n.get("state") == "ALIVE"]
            except ValueError:
                alive = []
            if len(alive) == len(NODES):
                return
            assert time.monotonic() < deadline, out.stdout[-2000:] + out.stderr[-2000:]
            time.sleep(1)

    def submit(self, jobs, nodes=tuple(NODES)):
        """Submit every (job env, working dir, shapes) of ``jobs`` at once,
        each a job whose entrypoint runs its shapes' drivers in a row;
        [(exit code, everything the job printed)], in the order of ``jobs``.
        The jobs share the nodes and the job server, as several users' jobs
        do."""
        env = self.environment("none")
        address = f"--address=http://127.0.0.1:{self.dashboard_port}"
        submitted = [subprocess.Popen(
            [str(BIN / "ray"), "job", "submit", address, f"--runtime-env={job_env}",
             f"--working-dir={workdir}", "--", "python", "drivers.py", ",".join(nodes), *shapes],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for job_env, workdir, shapes in jobs]
        finished = []
        try:
            for job in submitted:
                output = job.communicate(timeout=300)[0]
                # The submit command's log tail can stop before the driver's
                # last lines reach it (seen on Ray 2.41): read the finished
                # job's log whole.
                found = re.search(r"Job '(raysubmit_\w+)' submitted", output)
                if found:
                    logs = subprocess.run([str(BIN / "ray"), "job", "logs", address, found.group(1)],
                                          env=env, capture_output=True, text=True, timeout=60)
                    output += logs.stdout
                finished.append((job.returncode, output))
        finally:
            for job in submitted:
                if job.poll() is None:
                    job.kill()
                    job.wait()
        return finished

    def stop(self):
        """SIGKILL every process of this cluster (it is thrown away with its
        temp dir; SIGTERM left every one running for over 6 s here), until
        none has been seen for three scans in a row (a raylet may start an
        agent again while it is being stopped)."""
        from ray_megatron_env.simulation import ray_processes

        started = time.monotonic()
        quiet = 0
        while quiet < 3 and time.monotonic() - started < 60:
            left = {**ray_processes(f"RAY_TMPDIR={self.tmpdir}"),
                    **ray_processes(f"{MARKER}={self.tmpdir}")}
            left = descendants(left)
            quiet = 0 if left else quiet + 1
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.2)
        shutil.rmtree(self.tmpdir, ignore_errors=True)


def descendants(pids):
    """``pids`` and every live process below them: the agents a raylet
    starts are its children, and a Ray process that sets its title
    (ray::DashboardAgent) blanks what /proc/PID/environ shows of it."""
    parents = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                state, parent = f.read().rsplit(")", 1)[1].split()[:2]
        except (OSError, ValueError, IndexError):
            continue
        if state != "Z":
            parents[int(entry)] = int(parent)
    found, grew = set(pids), True
    while grew:
        more = {pid for pid, parent in parents.items() if parent in found} - found
        found |= more
        grew = bool(more)
    return found


@pytest.fixture(scope="module")
def job_cluster(no_cluster):
    cluster = JobCluster().start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def workdirs(tmp_path_factory):
    """override -> a working dir: one per submission, told apart by a file,
    so that each is a package of its own. Two jobs with the same working_dir
    share its copy on a node, which Ray removes when either's drivers end."""
    folders = {}
    for override in (False, True):
        folder = folders[override] = tmp_path_factory.mktemp("job")
        (folder / "driver.py").write_text(DRIVER)
        (folder / "drivers.py").write_text(DRIVERS)
        (folder / "userhook.py").write_text(USER_HOOK)
        (folder / "submission.txt").write_text(f"override={override}\n")
        shutil.copy(TESTS / "helpers" / "nested_driver.py", folder)
    return folders


def job_env(tmp_path_factory, override):
    """`ray-megatron-env runtime-env CONFIG --ship-package`, with a base
    that sets RAY_OVERRIDE_JOB_RUNTIME_ENV=1 (NeMo-RL's default_runtime_env.yaml
    does) or a base that sets another variable only."""
    folder = tmp_path_factory.mktemp("env")
    base = folder / "base.yaml"
    env_vars = {"NCCL_DEBUG": "WARN", **({"RAY_OVERRIDE_JOB_RUNTIME_ENV": "1"} if override else {})}
    base.write_text(json.dumps({"env_vars": env_vars}))
    # --role: no process rules. verl's would read a NeMo-RL-style driver's
    # workers as rollout workers: the whole environment it passes holds the
    # job supervisor's RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES=1, one of
    # verl's rollout markers.
    made = subprocess.run([str(BIN / "ray-megatron-env"), "runtime-env", str(MEGATRON_YAML),
                           "--role", "actor,ref", "--base", str(base), "--ship-package"],
                          capture_output=True, text=True, env=driver_environment())
    assert made.returncode == 0, made.stderr
    path = folder / "runtime_env.yaml"
    path.write_text(made.stdout)
    return path


@pytest.fixture(scope="module")
def job_envs(tmp_path_factory):
    return {override: job_env(tmp_path_factory, override) for override in (False, True)}


def result(output):
    lines = [line for line in output.splitlines() if line.startswith("RESULT ")]
    assert lines, output[-4000:]
    return json.loads(lines[-1][len("RESULT "):])


def by_shape(output):
    """Each driver's (exit code, output), from the entrypoint's frames."""
    found = {}
    for shape, body, code in re.findall(r"^=== BEGIN (\S+)\n(.*?)^=== END \1 (-?\d+)$",
                                         output, re.S | re.M):
        found[shape] = (int(code), body)
    return found


SHAPES = {  # shape -> what the driver's own hook leaves in each worker
    "verl": None, "nemo-rl": None, "hook-string": "string:after",
    "hook-callable": "callable:after", "nemo-rl-hook": "string:after"}


@pytest.fixture(scope="module")
def drivers(job_cluster, workdirs, job_envs):
    """override -> shape -> (exit code, output): one submission for each
    job env, both at once, every shape's driver in each, the clashing one
    after those of SHAPES."""
    overrides = (False, True)
    shapes = {override: [*SHAPES, "clash", *(() if override else ("nested",))]
              for override in overrides}
    done = job_cluster.submit([(job_envs[o], workdirs[o], shapes[o]) for o in overrides])
    runs = {}
    for override, (code, output) in zip(overrides, done):
        # The entrypoint ends well even when a driver fails: each driver's
        # own exit code is in its frame.
        assert code == 0, output[-4000:]
        runs[override] = by_shape(output)
        assert list(runs[override]) == shapes[override], output[-4000:]
    return runs


@pytest.mark.parametrize("override", (False, True), ids=("job-env", "override-in-job-env"))
def test_drivers_in_a_row_get_every_nodes_value_and_the_drivers_own_hook(drivers, override):
    for shape, hook in SHAPES.items():
        code, output = drivers[override][shape]
        assert code == 0, (shape, override, output[-4000:])
        # Every worker decided (no plugin anywhere: the setup hook), its
        # node's value, and the driver's own hook ran after ours.
        assert {n: (w["value"], w["via"], w["hook"]) for n, w in result(output).items()} == {
            n: (EXPECTED[n], "setup-hook", hook) for n in NODES}, (shape, override)


def test_a_real_conflict_fails_before_any_worker_starts_and_names_the_fix(drivers):
    # The job env sets NCCL_DEBUG=WARN, the driver NCCL_DEBUG=INFO: Ray itself
    # would refuse that merge, and so does the job env, naming the key and
    # the line that lets the driver's value win.
    code, output = drivers[False]["clash"]
    assert code != 0
    assert "env_vars.NCCL_DEBUG" in output and "RAY_MEGATRON_ENV_MERGE: override" in output
    assert "CONNECTED" not in output and "RESULT " not in output
    # With Ray's override asked for in the job env, the driver's value wins.
    code, output = drivers[True]["clash"]
    assert code == 0, output[-4000:]
    assert {n: w["value"] for n, w in result(output).items()} == EXPECTED


def test_a_driver_nested_in_a_worker_of_a_submitted_job_starts_and_decides(drivers):
    # The env of `runtime-env --ship-package`, nodes without the package or
    # the plugin: a driver started in a worker as vLLM's Ray executor starts
    # one (tests/helpers/nested_driver.py) passes that worker's env to ray.init,
    # which Ray 2.41 to 2.54 refused ("reserved for the internal use").
    code, output = drivers[False]["nested"]
    assert code == 0, output[-4000:]
    lines = [line for line in output.splitlines() if line.startswith("NESTED ")]
    assert lines, output[-4000:]
    hook = "ray_megatron_env.setup_hook.setup_hook"
    assert json.loads(lines[-1][len("NESTED "):]) == {
        "workers": {"head": [None, "setup-hook", "none", None],
                    "h100": ["1", "setup-hook", "policy", None],
                    "b200": [None, "setup-hook", "none", None]},
        "hook": [hook, hook]}
