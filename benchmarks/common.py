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
