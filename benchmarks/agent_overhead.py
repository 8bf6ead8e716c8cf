"""Inside the agent: the plugin's own cost, and the GPU probe per backend.

- cold: the first worker start with the field in a fresh agent process
  (import of the package's core, the probe, the decision), in a fresh
  interpreter that has imported Ray's plugin base as the agent has;
- warm: every later start on that node (probe cached): validate + create +
  modify_context, on real Ray RuntimeEnv / RuntimeEnvContext objects;
- the probe alone: fake, NVML (nvidia-ml-py), nvidia-smi; and, where torch
  with CUDA is installed, torch.cuda.get_device_capability for comparison.
Also checks that the plugin never imports torch nor creates a CUDA context.

    python benchmarks/agent_overhead.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from common import machine, ms, spread, table, us

ROOT = Path(__file__).resolve().parent.parent
FAKE_SMI = ROOT / "tests" / "fakes" / "nvidia-smi"

COLD = r"""
import json, logging, os, sys, time, asyncio
from ray._private.runtime_env.plugin import RuntimeEnvPlugin  # the agent has this
from ray._private.runtime_env.context import RuntimeEnvContext
from ray.runtime_env import RuntimeEnv
field = json.loads(sys.argv[1])
started = time.perf_counter()
from ray_megatron_env.plugin import MegatronEnvPlugin
plugin = MegatronEnvPlugin()
env = RuntimeEnv(megatron_env=field)
plugin.validate(env)
context = RuntimeEnvContext()
asyncio.run(plugin.create(None, env, context, logging.getLogger("x")))
plugin.modify_context([], env, context, logging.getLogger("x"))
print(time.perf_counter() - started)
"""


def field() -> dict:
    from ray_megatron_env import build_runtime_env
    from ray_megatron_env.demo import load_example

    return build_runtime_env(load_example("verl_megatron.yaml"))["megatron_env"]


def cold(samples: int, environ: dict) -> list:
    out = []
    for _ in range(samples):
        result = subprocess.run([sys.executable, "-c", COLD, json.dumps(field())],
                                capture_output=True, text=True, check=True, env=environ)
        out.append(float(result.stdout.strip().splitlines()[-1]))
    return out


def warm(calls: int, raw_config: str = "") -> list:
    import logging

    from ray._private.runtime_env.context import RuntimeEnvContext
    from ray.runtime_env import RuntimeEnv

    from ray_megatron_env.plugin import MegatronEnvPlugin

    value = field()
    if raw_config:  # a whole resolved config as the field, instead of the compact form
        from omegaconf import OmegaConf

        from ray_megatron_env.demo import load_example
        config = load_example(Path(raw_config).resolve() if Path(raw_config).exists()
                              else raw_config)
        if OmegaConf.select(config, "actor_rollout_ref.rollout.name",
                            throw_on_missing=False) is None:
            OmegaConf.update(config, "actor_rollout_ref.rollout.name", "vllm", force_add=True)
        value = OmegaConf.to_container(config, resolve=True)
    logger = logging.getLogger("bench")
    logger.addHandler(logging.NullHandler())
    logger.propagate = False
    plugin = MegatronEnvPlugin()
    env = RuntimeEnv(megatron_env=value)
    loop = asyncio.new_event_loop()
    loop.run_until_complete(plugin.create(None, env, RuntimeEnvContext(), logger))  # probe
    times = []
    for _ in range(calls):
        context = RuntimeEnvContext()
        started = time.perf_counter()
        plugin.validate(env)
        loop.run_until_complete(plugin.create(None, env, context, logger))
        plugin.modify_context([], env, context, logger)
        times.append(time.perf_counter() - started)
    loop.close()
    return times


def probe_times(environ: dict, samples: int, smi: str) -> list:
    from ray_megatron_env.probe import probe_gpus

    times, result = [], None
    for _ in range(samples):
        started = time.perf_counter()
        result = probe_gpus(environ, smi_command=[smi])
        times.append(time.perf_counter() - started)
    return times, result


def torch_capability(samples: int):
    code = ("import time; t=time.perf_counter(); import torch; "
            "n=torch.cuda.device_count(); [torch.cuda.get_device_capability(i) for i in range(n)]; "
            "print(time.perf_counter()-t, n)")
    times = []
    for _ in range(samples):
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        if result.returncode != 0:
            return None, "torch is not installed"
        took, count = result.stdout.split()
        if int(count) == 0:
            return None, "torch sees no CUDA device"
        times.append(float(took))
    return times, None


def cuda_contexts_of(pid: int):
    """PIDs with a CUDA context per NVML, or None where NVML is unavailable."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        pids = set()
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            pids |= {p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}
        return pid in pids
    finally:
        pynvml.nvmlShutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--cold", type=int, default=10)
    parser.add_argument("--probes", type=int, default=20)
    parser.add_argument("--config", default="verl_megatron.yaml",
                        help="config whose raw form is timed as the field (default: the "
                             "package's trimmed example; try verl's _generated_ppo_*.yaml)")
    args = parser.parse_args()

    base = {k: v for k, v in os.environ.items() if not k.startswith("RAY_MEGATRON_ENV_")}
    fake = {**base, "RAY_MEGATRON_ENV_FAKE_GPUS": "9.0,9.0"}
    rows = []
    cold_fake = spread(cold(args.cold, fake))
    rows.append(["cold: first start in a fresh agent (imports + fake probe + decision)",
                 ms(cold_fake["median"]), f"{ms(cold_fake['q1'])} .. {ms(cold_fake['q3'])}"])
    os.environ.update({"RAY_MEGATRON_ENV_FAKE_GPUS": "9.0,9.0"})
    for raw in ("", args.config):
        w = spread(warm(args.calls, raw))
        what = f"raw {Path(raw).name} as the field" if raw else "compact field"
        rows.append([f"warm: validate + create + modify_context, {what}", us(w["median"]),
                     f"{us(w['q1'])} .. {us(w['q3'])}"])
    os.environ.pop("RAY_MEGATRON_ENV_FAKE_GPUS")

    smi = shutil.which("nvidia-smi")
    backends = {
        "fake (RAY_MEGATRON_ENV_FAKE_GPUS)": fake,
        "NVML (nvidia-ml-py)": {**base, "RAY_MEGATRON_ENV_PROBE": "nvml"},
        "nvidia-smi" + ("" if smi else " (none on PATH: the test suite's fake script)"):
            {**base, "RAY_MEGATRON_ENV_PROBE": "nvidia-smi"},
    }
    for name, environ in backends.items():
        times, result = probe_times(environ, args.probes, smi or str(FAKE_SMI))
        s = spread(times)
        seen = result.labels() if result.is_known else f"failed: {result.error}"
        unit = us if s["q3"] < 1e-3 else ms
        rows.append([f"probe: {name} -> {seen}", unit(s["median"]),
                     f"{unit(s['q1'])} .. {unit(s['q3'])}"])
    torch_times, why = torch_capability(3)
    if torch_times:
        s = spread(torch_times)
        rows.append(["for comparison: torch.cuda.get_device_capability (fresh process)",
                     ms(s["median"]), f"{ms(s['q1'])} .. {ms(s['q3'])}"])
    print(f"machine: {machine()}\n")
    print(table(["what", "median", "q1 .. q3"], rows))
    if not torch_times:
        print(f"\ntorch comparison skipped: {why}")
    print(f"\nplugin imported torch: {'torch' in sys.modules}")
    in_use = cuda_contexts_of(os.getpid())
    print("plugin created a CUDA context: " + (
        "unknown (no NVML here: no NVIDIA driver)" if in_use is None else str(in_use)))


if __name__ == "__main__":
    main()
