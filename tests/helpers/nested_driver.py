"""A driver nested in a worker, started as vLLM's Ray executor starts its
engine core, for tests/cluster/test_fallback.py: an actor reads its own
runtime env (vLLM's ``EngineArgs.create_engine_config``:
``ray.get_runtime_context().runtime_env``), spawns a process
(``multiprocessing`` spawn, as vLLM must inside a Ray actor) that calls
``ray.init(address=..., runtime_env=<that env>)`` (vLLM's
``initialize_ray_cluster``) and starts tasks on named nodes."""

import json
import multiprocessing
import os
import traceback

import ray


def seen():
    text = os.environ.get("RAY_MEGATRON_ENV_DECISION")
    d = json.loads(text) if text else {}
    return [os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS"), d.get("via"), d.get("source"),
            os.environ.get("USER_HOOK_RAN")]


def _engine_core(address, runtime_env, nodes, queue):
    try:
        ray.init(address=address, runtime_env=runtime_env, log_to_driver=False,
                 logging_level="WARNING")
        task = ray.remote(num_cpus=0)(seen)
        refs = [task.options(resources={"rme_" + n: 1}).remote() for n in nodes]
        job = json.loads(ray._private.worker.global_worker.core_worker.get_job_config()
                         .runtime_env_info.serialized_runtime_env or "{}")
        queue.put({"workers": dict(zip(nodes, ray.get(refs, timeout=150))),
                   "hook": [job.get("worker_process_setup_hook"), (job.get("env_vars") or {})
                            .get("__RAY_WORKER_PROCESS_SETUP_HOOK_ENV_VAR")]})
    except BaseException:
        queue.put({"error": traceback.format_exc()[-2000:]})
    finally:
        ray.shutdown()


@ray.remote(num_cpus=0)
class Engine:
    def start_nested_driver(self, nodes):
        runtime_env = ray.get_runtime_context().runtime_env
        context = multiprocessing.get_context("spawn")
        queue = context.Queue()
        process = context.Process(target=_engine_core, args=(
            ray.get_runtime_context().gcs_address, runtime_env, nodes, queue))
        process.start()
        try:
            return queue.get(timeout=200)
        finally:
            process.join(timeout=30)
