"""What the value buys on a GPU: how much two CUDA streams overlap with
CUDA_DEVICE_MAX_CONNECTIONS = 1, unset (CUDA's default, 8) and 32.

Each setting runs in a fresh process (the variable is read when the CUDA
context is created). Two workloads, each timed alone on one stream and then
together on two streams, launched depth-first (all of stream A, then all of
stream B), which is how a framework issues a compute phase and an
independent communication/copy phase:

- spin: many one-block spin kernels (torch.cuda._sleep) per stream, so both
  streams fit on the GPU at once and only the hardware queues limit overlap;
- gemm+copy: matrix multiplies on stream A, device-to-host copies of a
  pinned buffer on stream B.

overlap = (t_A + t_B - t_together) / min(t_A, t_B): 1 means stream B ran
entirely under stream A, 0 means the two ran one after the other.

    python benchmarks/stream_overlap.py     # needs torch with CUDA (pip install '.[torch]')
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

SETTINGS = {"1": "1", "unset (8)": None, "32": "32"}

CHILD = r"""
import json, statistics, time, torch

def timed(fn, repeats=7):
    out = []
    for _ in range(repeats):
        torch.cuda.synchronize(); t = time.perf_counter(); fn(); torch.cuda.synchronize()
        out.append(time.perf_counter() - t)
    return statistics.median(out[1:])

a, b = torch.cuda.Stream(), torch.cuda.Stream()
cycles = 200_000  # a few tens of microseconds per spin kernel
count = 200

def spin(stream):
    with torch.cuda.stream(stream):
        for _ in range(count):
            torch.cuda._sleep(cycles)

x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
src = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
dst = torch.empty(64 << 20, dtype=torch.uint8, pin_memory=True)

def gemm(stream):
    with torch.cuda.stream(stream):
        for _ in range(20):
            x @ x

def copy(stream):
    with torch.cuda.stream(stream):
        for _ in range(10):
            dst.copy_(src, non_blocking=True)

result = {}
for name, first, second in (("spin", spin, spin), ("gemm+copy", gemm, copy)):
    first(a); second(b); torch.cuda.synchronize()  # warm-up
    alone_a, alone_b = timed(lambda: first(a)), timed(lambda: second(b))
    together = timed(lambda: (first(a), second(b)))
    result[name] = {"alone_a_ms": alone_a * 1e3, "alone_b_ms": alone_b * 1e3,
                    "together_ms": together * 1e3,
                    "overlap": (alone_a + alone_b - together) / min(alone_a, alone_b)}
result["gpu"] = torch.cuda.get_device_name(0)
result["torch"] = torch.__version__
print(json.dumps(result))
"""


def gpu_available() -> str:
    """'' when a CUDA GPU can be used, else why not."""
    check = subprocess.run([sys.executable, "-c",
                            "import torch; print(torch.cuda.is_available())"],
                           capture_output=True, text=True)
    if check.returncode != 0:
        return "torch is not installed (pip install 'ray-megatron-env[torch]')"
    if check.stdout.strip() != "True":
        return "torch sees no CUDA GPU on this machine"
    return ""


def main() -> int:
    why = gpu_available()
    if why:
        print(f"skipped: {why}. This benchmark needs an NVIDIA GPU; nothing was measured.")
        return 0
    results = {}
    for label, value in SETTINGS.items():
        env = {k: v for k, v in os.environ.items() if k != "CUDA_DEVICE_MAX_CONNECTIONS"}
        if value is not None:
            env["CUDA_DEVICE_MAX_CONNECTIONS"] = value
        out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True,
                             text=True, check=True)
        results[label] = json.loads(out.stdout.strip().splitlines()[-1])
    first = next(iter(results.values()))
    print(f"GPU: {first['gpu']}; torch {first['torch']}\n")
    print(f"{'CUDA_DEVICE_MAX_CONNECTIONS':<28}{'workload':<11}{'A alone':>10}{'B alone':>10}"
          f"{'together':>10}{'overlap':>9}")
    for label, result in results.items():
        for workload in ("spin", "gemm+copy"):
            r = result[workload]
            print(f"{label:<28}{workload:<11}{r['alone_a_ms']:>8.2f}ms{r['alone_b_ms']:>8.2f}ms"
                  f"{r['together_ms']:>8.2f}ms{r['overlap']:>9.2f}")
    if "--json" in sys.argv:
        print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
