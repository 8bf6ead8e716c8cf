"""Small shared helpers for the benchmark scripts (statistics, tables)."""

from __future__ import annotations

import platform
import statistics
from typing import Dict, Iterable, List, Sequence


def spread(samples: Sequence[float]) -> Dict[str, float]:
    """Median and interquartile range."""
    q1, median, q3 = statistics.quantiles(samples, n=4) if len(samples) > 1 else [samples[0]] * 3
    return {"median": median, "q1": q1, "q3": q3, "n": len(samples)}


def table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    rows = [[str(c) for c in row] for row in rows]
    widths = [max(len(str(h)), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    lines = ["  ".join(str(h).ljust(w) for h, w in zip(header, widths))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows]
    return "\n".join(lines)


def machine() -> str:
    import os

    import ray

    return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
            f"Python {platform.python_version()}, Ray {ray.__version__}")


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def us(seconds: float) -> str:
    return f"{seconds * 1e6:.1f} us"


def interleaved(variants: List[str], repetitions: int, seed: int = 7) -> List[str]:
    """Each repetition runs every variant once, in a shuffled order, so drift
    on a noisy machine lands on all variants alike."""
    import random

    rng = random.Random(seed)
    order = []
    for _ in range(repetitions):
        block = list(variants)
        rng.shuffle(block)
        order += block
    return order


def time_actor_starts(cluster, actor_class, variants, workers: Sequence[str], warmup: int,
                      repetitions: int, a: str, b: str, check=None) -> Dict[str, object]:
    """Actor creation to first reply, one fresh runtime env per start
    (``variants[name](tag)``), variants interleaved over ``workers`` nodes;
    ``check(name, node, reply)`` may refuse a reply. Returns the stats per
    variant and the ratios of variant ``a`` over ``b``."""
    import time

    import ray

    samples = {name: [] for name in variants}
    paired: List[float] = []
    order = interleaved(list(variants), warmup + repetitions)
    last: Dict[str, float] = {}
    for i, name in enumerate(order):
        rep = i // len(variants)
        node = workers[rep % len(workers)]
        started = time.perf_counter()
        actor = actor_class.options(runtime_env=variants[name](f"{rep}-{name}"),
                                    **cluster.pin(node)).remote()
        reply = ray.get(actor.ping.remote(), timeout=120)
        took = time.perf_counter() - started
        if check is not None:
            check(name, node, reply)
        ray.kill(actor)
        if rep >= warmup:
            samples[name].append(took)
            last[name] = took
        if len(last) == len(variants) and i % len(variants) == len(variants) - 1:
            paired.append(last[a] / last[b])
            last = {}
    stats = {name: spread(values) for name, values in samples.items()}
    return {"stats": stats, "ratio_of_medians_a_over_b": stats[a]["median"] / stats[b]["median"],
            "median_paired_ratio_a_over_b": statistics.median(paired)}


def start_arguments(doc: str, repetitions: int = 40):
    """The command line of a start-up benchmark: repetitions, warm-up, --json."""
    import argparse

    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--repetitions", type=int, default=repetitions)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    return parser.parse_args()


def report_starts(args, result: Dict[str, object], target: float, where: str = "") -> None:
    """``time_actor_starts``'s result as JSON (``--json``) or as a table."""
    import json

    result = {"machine": machine(), "repetitions": args.repetitions, **result}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    stats = result["stats"]
    print(f"machine: {result['machine']}; {args.repetitions} repetitions per variant, "
          f"interleaved, after {args.warmup} warm-up rounds{where}\n")
    print(table(["variant", "median", "q1", "q3"],
                [[name, ms(s["median"]), ms(s["q1"]), ms(s["q3"])] for name, s in stats.items()]))
    print(f"\n(a)/(b) ratio of medians: {result['ratio_of_medians_a_over_b']:.3f}   "
          f"median of paired ratios: {result['median_paired_ratio_a_over_b']:.3f}   "
          f"(target <= {target:.2f})")
