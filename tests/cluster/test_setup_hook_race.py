"""The setup hook against the arrival of a worker's first task.

A Ray worker learns its job's config (the job's runtime env, namespace, the
driver's sys.path) only with its first task, and caches the first answer
for the rest of its life; Ray runs the setup hook after the worker has
announced itself and before its task loop, unordered with that first task
(docs/design.md). Ray's own chaos knob, RAY_testing_asio_delay_us, holds
every PushTask back 2 s in the job's workers, so that each hook surely runs
before its worker's first task: if the hook read the job's config then, it
would freeze an empty one, and these workers would lose the job's
namespace and the driver's directory on sys.path, and read the job's
explicit value as the node's.

On an A100 node whose own environment says CUDA_DEVICE_MAX_CONNECTIONS=1,
registered (the plugin decides) and not (the setup hook decides), an FSDP
job: a 1 that a runtime env gave is explicit and kept; the node's own 1 is
replaced by CUDA's default 8 (docs/rules.md: fsdp-style prefers not 1).
"""

from concurrent.futures import ThreadPoolExecutor

import pytest

from drivers import last_json, run_driver
from workers import read

# Ray's worker startup order and its job config cache are what is tested,
# and they differ between Ray releases. Slow: three jobs whose first tasks
# are held back 2 s (about 20 s); .ci/run runs it on both Rays.
pytestmark = [pytest.mark.ray_version_specific, pytest.mark.slow]

NODES = ["a100_inherit1", "a100_inherit1_unplugged"]  # registered, not registered
FSDP = {"version": 2, "engines": {"actor": {"strategy": "fsdp"}}}
DELAY_S = 2.0
# Ray's asio chaos setting (ray_config_def.h, testing_asio_delay_us: method
# name = min:max microseconds), for the core worker's PushTask handler; the
# same names on Ray 2.41 and 2.60.
PUSH_TASK_DELAY = ",".join(f"CoreWorkerService.grpc_server.PushTask{part}=2000000:2000000"
                           for part in (".HandleRequestImpl", ""))
NAMESPACE = "rme_race"

# Each driver: a module beside it (which a worker imports through the
# driver's directory on its sys.path) and a task reporting what its worker
# has: its environment, its namespace, that import.
LOOK = f"""
import time
ray.init(address=ADDRESS, namespace={NAMESPACE!r}, log_to_driver=False, runtime_env=JOB_ENV)

def report():
    try:
        import beside_the_driver
        beside = beside_the_driver.NAME
    except ImportError as exc:
        beside = repr(exc)
    return {{"env": dict(os.environ), "namespace": ray.get_runtime_context().namespace,
            "beside": beside}}

look = ray.remote(num_cpus=0)(report)

def looks(names, **options):
    refs = [look.options(resources={{"rme_" + n: 1}}, **options).remote() for n in names]
    return dict(zip(names, ray.get(refs, timeout=150)))
"""


def seen(look):
    """[value, via, source, namespace, the module beside the driver] in one worker."""
    value, decision = read(look["env"])
    decision = decision or {}
    return [value, decision.get("via"), decision.get("source"), look["namespace"], look["beside"]]


def driver(tmp_path_factory, name, env_vars, body):
    tmp = tmp_path_factory.mktemp(name)
    (tmp / "beside_the_driver.py").write_text("NAME = 'found'\n")
    job_env = f"JOB_ENV = build_runtime_env({FSDP!r}, base={{'env_vars': {env_vars!r}}})\n"
    return tmp, (job_env, LOOK, body)


def run(cluster, tmp, parts):
    result = run_driver(cluster, tmp, *parts)
    assert result.returncode == 0, result.stderr[-3000:]
    return last_json(result)


@pytest.fixture(scope="module")
def race(cluster, tmp_path_factory):
    """Three jobs at once: two with every PushTask held back, one without."""
    delayed = {"RAY_testing_asio_delay_us": PUSH_TASK_DELAY}
    jobs = {
        # The job's value equals the node's own; a per-role env under it.
        "job": driver(tmp_path_factory, "job", {"CUDA_DEVICE_MAX_CONNECTIONS": "1", **delayed}, f"""
            start = time.monotonic()
            out = {{"job": looks({NODES!r}), "first_s": time.monotonic() - start}}
            out["role"] = looks({NODES!r}, runtime_env=build_runtime_env({FSDP!r}, role="actor"))
            print(json.dumps(out))
        """),
        # An actor's own value equal to the node's, over another job value.
        "actor": driver(tmp_path_factory, "actor", {"CUDA_DEVICE_MAX_CONNECTIONS": "4", **delayed},
                        f"""
            env = {{"env_vars": {{"CUDA_DEVICE_MAX_CONNECTIONS": "1"}}}}
            print(json.dumps({{"actor": looks({NODES!r}, runtime_env=env)}}))
        """),
        # No delay: a dozen fresh worker processes on the unregistered node
        # (an actor each), where the hook raced the first task on every Ray.
        "fresh": driver(tmp_path_factory, "fresh", {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}, """
            @ray.remote(num_cpus=0)
            class Fresh:
                def look(self):
                    return report()

            actors = [Fresh.options(resources={"rme_a100_inherit1_unplugged": 1}).remote()
                      for _ in range(12)]
            print(json.dumps({"fresh": ray.get([a.look.remote() for a in actors], timeout=200)}))
        """),
    }
    with ThreadPoolExecutor(len(jobs)) as pool:
        futures = {name: pool.submit(run, cluster, tmp, parts) for name, (tmp, parts) in jobs.items()}
        return {name: future.result() for name, future in futures.items()}


def test_the_delay_held_the_first_tasks_back(race):
    # So each hook below ran before its worker's first task: the test cannot
    # pass by timing.
    assert race["job"]["first_s"] >= DELAY_S
    assert all(look["env"]["RAY_testing_asio_delay_us"] == PUSH_TASK_DELAY
               for look in race["job"]["job"].values())


JOBS_OWN = {"a100_inherit1": ["1", "plugin", "explicit", NAMESPACE, "found"],
            "a100_inherit1_unplugged": ["1", "setup-hook", "explicit", NAMESPACE, "found"]}


@pytest.mark.parametrize("part", ["job", "role"])
def test_a_job_value_equal_to_the_nodes_own_stays_explicit_under_the_race(race, part):
    assert {node: seen(look) for node, look in race["job"][part].items()} == JOBS_OWN


def test_an_actors_value_equal_to_the_nodes_own_over_the_jobs_is_explicit(race):
    assert {node: seen(look) for node, look in race["actor"]["actor"].items()} == JOBS_OWN


def test_fresh_workers_without_the_delay_keep_the_jobs_config_and_value(race):
    assert [seen(look) for look in race["fresh"]["fresh"]] == \
        [JOBS_OWN["a100_inherit1_unplugged"]] * 12
