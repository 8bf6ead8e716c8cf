"""The per-node caches (cache.py): ``fresh``, the workers' ``NodeCache`` files
in the session folder (one per kind of fact, the decisions and their key),
and several workers starting at once sharing one probe; ``ProbeCache``, the
agent's in-process cache (one probe per process, off the event loop, a failure
retried after a while). File names are docs/operators.md's and docs/performance.md's."""

import asyncio
import json
import multiprocessing
import os
import threading
import time
from typing import List

import pytest

from cache_race import probe_in_process
from ray_megatron_env.cache import NodeCache, ProbeCache, fresh
from ray_megatron_env.node import NodeGpus
from ray_megatron_env.probe.fake import parse_fake_node


def test_workers_starting_together_share_one_probe(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=probe_in_process, args=(str(tmp_path), out)) for _ in range(4)]
    for p in procs:
        p.start()
    results = {out.get(timeout=60) for _ in procs}
    for p in procs:
        p.join(timeout=60)
    assert len(results) == 1  # one prober, read by the other three


def test_a_failed_probe_is_retried_after_a_while(tmp_path):
    now = [1000.0]
    cache = NodeCache(str(tmp_path), "n", retry_failed_after_s=60, clock=lambda: now[0])
    calls = []

    def failing():
        calls.append(1)
        return NodeGpus.unknown("nvml", "boom")

    cache.get(failing)
    cache.get(failing)
    now[0] += 61
    cache.get(failing)
    assert len(calls) == 2


def test_fabric_facts_have_their_own_file(tmp_path):
    from ray_megatron_env.node import COMPLETED, GpuFabric, NodeFabric

    cache = NodeCache(str(tmp_path), "n")
    fabric = NodeFabric((GpuFabric(COMPLETED, "success", "1234-5678", 7, "ok"),), "absent", "fake")
    cache.get(lambda: NodeGpus.known([(10, 0)], "fake"), "gpus")
    got = cache.get(lambda: fabric, "fabric")
    again = cache.get(lambda: None, "fabric")  # read back from the file
    assert again.gpus == fabric.gpus and again.imex_channel == "absent" and again == got


def test_a_damaged_cache_file_means_a_new_probe(tmp_path):
    cache = NodeCache(str(tmp_path), "n")
    os.makedirs(cache.folder, exist_ok=True)
    with open(cache.path(), "w") as f:
        f.write("{not json")
    assert cache.get(lambda: NodeGpus.known([(8, 0)], "fake")).capabilities == ((8, 0),)


# --- freshness ------------------------------------------------------------------------

@pytest.mark.parametrize("facts,age_s,expected", [
    (NodeGpus.known([(9, 0)], "nvml"), 10 ** 9, True),  # read facts never go stale
    (NodeGpus.unknown("nvml", "boom"), 59.9, True),      # a failure stands for a while
    (NodeGpus.unknown("nvml", "boom"), 60.0, False),     # then the probe runs again
])
def test_read_facts_stay_and_a_failure_is_retried_after_the_wait(facts, age_s, expected):
    assert fresh(facts, age_s, retry_failed_after_s=60.0) is expected


# --- the files ------------------------------------------------------------------------

def test_each_kind_of_fact_has_its_own_file_named_after_the_node(tmp_path):
    cache = NodeCache(str(tmp_path), "node-1")
    assert cache.folder == str(tmp_path / "megatron_env")
    assert cache.path() == str(tmp_path / "megatron_env" / "gpus-node-1.json")
    assert cache.path("p2p") == str(tmp_path / "megatron_env" / "p2p-node-1.json")


def test_the_first_get_probes_and_stamps_and_the_next_reads_the_file(tmp_path):
    calls = []

    def probe():
        calls.append(1)
        return NodeGpus.known([(8, 0), (8, 0)], "fake")

    first = NodeCache(str(tmp_path), "n", clock=lambda: 1234.5).get(probe)
    assert (first.capabilities, first.probed_at, first.probe_pid) == (
        ((8, 0), (8, 0)), 1234.5, os.getpid())
    with open(tmp_path / "megatron_env" / "gpus-n.json") as f:
        assert json.load(f)["capabilities"] == [[8, 0], [8, 0]]
    # Another worker of the node (a cache object of its own) reads the file.
    assert NodeCache(str(tmp_path), "n").get(probe) == first
    assert len(calls) == 1


def test_a_session_folder_that_cannot_be_written_means_probing_in_process(tmp_path):
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")
    cache = NodeCache(str(blocked), "n", clock=lambda: 7.0)
    got = cache.get(lambda: NodeGpus.known([(9, 0)], "fake"))
    assert (got.capabilities, got.probed_at) == (((9, 0),), 7.0)


def test_the_stamp_is_the_files_text_only_when_every_kind_is_known(tmp_path):
    cache = NodeCache(str(tmp_path), "n")
    assert cache.stamp(("gpus",)) is None  # nothing cached yet
    cache.get(lambda: NodeGpus.known([(9, 0)], "fake"))
    with open(cache.path()) as f:
        assert cache.stamp(("gpus",)) == f.read()
    assert cache.stamp(("gpus", "fabric")) is None  # the fabric is not cached
    failed = NodeCache(str(tmp_path), "m")
    failed.get(lambda: NodeGpus.unknown("nvml", "boom"))
    assert failed.stamp(("gpus",)) is None  # retried later: may change


# --- the decisions: their key and their files ----------------------------------------

TP2 = {"version": 2, "engines": {"actor": {"strategy": "megatron", "tensor_parallel": 2}}}


@pytest.fixture
def cached(tmp_path):
    """A node cache whose GPUs are cached (and known)."""
    cache = NodeCache(str(tmp_path), "n")
    cache.get(lambda: NodeGpus.known([(9, 0)], "fake"))
    return cache


def test_no_key_before_the_nodes_gpus_are_cached(tmp_path):
    assert NodeCache(str(tmp_path), "n").decision_key(TP2, {}, {}, ()) is None


def test_the_same_inputs_give_the_same_key(cached):
    key = cached.decision_key(TP2, {"CUDA_DEVICE_MAX_CONNECTIONS": "4"}, {}, ())
    assert key == cached.decision_key(TP2, {"CUDA_DEVICE_MAX_CONNECTIONS": "4"}, {}, ())
    assert len(key) == 32 and int(key, 16) >= 0  # hex


@pytest.mark.parametrize("change", [
    "another field", "a pack variable in the worker", "a pack variable on the node",
    "a variable a runtime env gave", "a process rule's variable",
])
def test_every_input_a_decision_reads_changes_the_key(cached, change):
    rule = {"variable": "WG_PREFIX", "prefix": "rollout", "role": "rollout"}
    field = {**TP2, "processes": [rule]}
    base = dict(field=field, environ={"WG_PREFIX": "actor"}, node_environ={}, given=())
    other = dict(base)
    if change == "another field":
        other["field"] = {**field, "engines": {"actor": {"strategy": "fsdp"}}}
    elif change == "a pack variable in the worker":
        other["environ"] = {**base["environ"], "NCCL_NVLS_ENABLE": "0"}
    elif change == "a pack variable on the node":
        other["node_environ"] = {"TORCH_CUDA_ARCH_LIST": "9.0"}
    elif change == "a variable a runtime env gave":
        other["given"] = ("CUDA_DEVICE_MAX_CONNECTIONS",)
    else:
        other["environ"] = {"WG_PREFIX": "rollout_0"}
    assert cached.decision_key(**base) != cached.decision_key(**other)


def test_a_variable_no_decision_reads_leaves_the_key_alone(cached):
    assert cached.decision_key(TP2, {"PATH": "/usr/bin"}, {"HOME": "/root"}, ()) == \
        cached.decision_key(TP2, {}, {}, ())


def test_a_pack_that_reads_the_fabric_waits_for_the_fabric_file(cached):
    from ray_megatron_env.node import NodeFabric

    field = {**TP2, "packs": ["nccl-fabric"]}  # docs/packs.md: reads the NVLink fabric
    assert cached.decision_key(field, {}, {}, ()) is None
    cached.get(lambda: NodeFabric((), "absent", "fake"), "fabric")
    assert cached.decision_key(field, {}, {}, ()) is not None
    assert cached.decision_key({**TP2, "packs": ["torch-arch"]}, {}, {}, ()) is not None


@pytest.mark.parametrize("field", [["not", "a", "field"], {"processes": [{"no": "variable"}]}])
def test_a_field_that_cannot_be_read_has_no_key(cached, field):
    assert cached.decision_key(field, {}, {}, ()) is None


def test_a_kept_decision_is_read_back_by_its_key(cached, tmp_path):
    entry = {"write": {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}, "remove": []}
    assert cached.decision("0" * 32) is None
    cached.keep_decision("0" * 32, entry)
    assert cached.decision("0" * 32) == entry
    assert (tmp_path / "megatron_env" / f"decision-n-{'0' * 32}.json").is_file()


# --- the peer-access facts ------------------------------------------------------------

# 8xL40S on two PCIe root complexes, CUDA driver 12.8 (tests/unit/packs/test_nccl_host_mem.py).
L40S_OLD = json.dumps({"gpus": "8.9,8.9,8.9,8.9,8.9,8.9,8.9,8.9",
                       "p2p": [[i, j] for i in range(4) for j in range(4, 8)],
                       "cuda_driver": "12.8"})


def test_the_node_caches_round_trip_the_facts(tmp_path):
    from ray_megatron_env.cache import NodeCache

    cache = NodeCache(str(tmp_path), "node1")
    first = cache.get(lambda: parse_fake_node(L40S_OLD).p2p, "p2p")
    again = cache.get(lambda: pytest.fail("probed twice"), "p2p")
    assert (again.count, again.without, again.cuda_driver) == \
        (first.count, first.without, first.cuda_driver) == (8, first.without, (12, 8))
    assert cache.stamp(("p2p",)) is not None


# --- ProbeCache, the agent's in-process cache ------------------------------------------

class CountingProbe:
    def __init__(self, *results: NodeGpus, delay: float = 0.0):
        self.results = list(results) or [NodeGpus.known([(9, 0)], "fake")]
        self.delay = delay
        self.threads: List[int] = []
        self._lock = threading.Lock()

    @property
    def calls(self) -> int:
        return len(self.threads)

    def __call__(self) -> NodeGpus:
        with self._lock:
            self.threads.append(threading.get_ident())
            result = self.results[min(len(self.threads), len(self.results)) - 1]
        time.sleep(self.delay)
        return result


def test_cache_probes_once():
    probe_ = CountingProbe()
    cache = ProbeCache(probe_)
    results = [cache.get() for _ in range(50)]
    assert probe_.calls == 1 and cache.runs == 1
    assert all(r is results[0] for r in results)
    assert results[0].capabilities == ((9, 0),)


def test_cache_probes_once_across_threads():
    probe_ = CountingProbe(delay=0.05)
    cache = ProbeCache(probe_)
    barrier = threading.Barrier(16)
    results = []

    def worker():
        barrier.wait()
        results.append(cache.get())

    threads = [threading.Thread(target=worker) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert len(results) == 16
    assert probe_.calls == 1 and cache.runs == 1
    assert all(r is results[0] for r in results)


def test_cache_get_async_probes_once_off_the_event_loop():
    probe_ = CountingProbe(delay=0.3)
    cache = ProbeCache(probe_)

    async def main():
        ticks = 0
        done = asyncio.Event()

        async def ticker():
            nonlocal ticks
            while not done.is_set():
                await asyncio.sleep(0.01)
                ticks += 1

        ticking = asyncio.create_task(ticker())
        results = await asyncio.gather(*(cache.get_async() for _ in range(20)))
        done.set()
        await ticking
        again = await cache.get_async()
        return results, again, ticks, threading.get_ident()

    results, again, ticks, loop_thread = asyncio.run(main())
    assert probe_.calls == 1 and cache.runs == 1
    assert probe_.threads[0] != loop_thread
    assert ticks >= 10, f"the event loop was blocked: {ticks} ticks in 0.3 s"
    assert all(r is results[0] for r in results) and again is results[0]
    assert results[0].capabilities == ((9, 0),)


def test_failed_result_is_retried_after_the_delay_and_success_is_kept():
    now = [1000.0]
    probe_ = CountingProbe(NodeGpus.unknown("nvml", "first"), NodeGpus.unknown("nvml", "second"),
                           NodeGpus.known([(8, 0)], "nvml"), NodeGpus.unknown("nvml", "never"))
    cache = ProbeCache(probe_, retry_failed_after_s=60.0, clock=lambda: now[0])

    assert cache.get().error == "first"
    now[0] += 59.9
    assert cache.get().error == "first" and probe_.calls == 1
    now[0] += 0.1
    assert cache.get().error == "second" and probe_.calls == 2
    now[0] += 30
    assert cache.get().error == "second" and probe_.calls == 2
    now[0] += 30
    assert cache.get().capabilities == ((8, 0),) and probe_.calls == 3
    now[0] += 1e9
    assert cache.get().capabilities == ((8, 0),) and probe_.calls == 3
    assert cache.runs == 3


def test_failed_result_is_retried_by_get_async_too():
    now = [0.0]
    probe_ = CountingProbe(NodeGpus.unknown("nvml", "first"), NodeGpus.known([(8, 0)], "nvml"))
    cache = ProbeCache(probe_, retry_failed_after_s=10.0, clock=lambda: now[0])

    async def main():
        first = await cache.get_async()
        now[0] = 9.0
        cached = await cache.get_async()
        now[0] = 10.0
        return first, cached, await cache.get_async()

    first, cached, retried = asyncio.run(main())
    assert first.error == "first" and cached is first
    assert retried.capabilities == ((8, 0),)
    assert probe_.calls == 2


@pytest.mark.parametrize("outcome", [NodeGpus.known([(9, 0)], "fake"),
                                     NodeGpus.unknown("nvml", "broken")])
def test_cached_result_carries_time_and_pid(outcome):
    assert outcome.probed_at is None and outcome.probe_pid is None
    cache = ProbeCache(CountingProbe(outcome))
    before = time.time()
    result = cache.get()
    after = time.time()
    assert before <= result.probed_at <= after
    assert result.probe_pid == os.getpid()
    assert (result.capabilities, result.method, result.error) == \
        (outcome.capabilities, outcome.method, outcome.error)
