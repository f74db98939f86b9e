"""What this CPU can do for the trainer: model, ISA flags, and a one-second matmul probe.

The same x86-64 machine kind comes with different CPUs. With AVX512_BF16 or AMX, torch's bf16 matmul is
native (oneDNN); with AVX2 only it is emulated, far slower than fp32 (docs/cpu.md, "Precision: fp32 on CPU",
has this probe's figures). ``probe_matmul`` tells which path a process gets
(oneDNN's ``ONEDNN_MAX_CPU_ISA=AVX2`` reproduces the slow path on a CPU that has AMX). The bench records
both in its JSON ``env``; ``.ci/run`` prints them first so a slow run explains itself; the start-up check
warns when the trainer is asked for bf16 on a CPU without native bf16 (``bf16_problem``).

``python -m verl_pipe.platform.cpu_info`` prints the report as JSON.
"""

from __future__ import annotations

import json
import platform
import time

# The flags that decide the trainer's speed on CPU.
FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")
NATIVE_BF16 = ("avx512_bf16", "amx_bf16")


def cpu_flags(cpuinfo: str | None = None) -> dict:
    """Model name and the ISA flags in FLAGS from /proc/cpuinfo (or the given text)."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            cpuinfo = ""
    model, flags = platform.processor() or platform.machine(), set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and value.strip():
            model = value.strip()
        elif key == "flags" and not flags:
            flags = set(value.split())
    return {"model": model, "flags": {f: f in flags for f in FLAGS},
            "native_bf16": any(f in flags for f in NATIVE_BF16)}


def probe_matmul(seconds: float = 1.0, n: int = 512) -> dict:
    """Single-thread GFLOP/s of an n x n matmul in fp32 and bf16, about ``seconds`` in all."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = {}
        for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
            a @ b  # warm-up (kernel selection)
            t0, k = time.perf_counter(), 0
            while time.perf_counter() - t0 < seconds / 2:
                a @ b
                k += 1
            out[f"{name}_gflops"] = round(2 * n ** 3 * k / (time.perf_counter() - t0) / 1e9, 2)
        out["bf16_over_fp32"] = round(out["bf16_gflops"] / out["fp32_gflops"], 3)
        out["torch_cpu_capability"] = torch.backends.cpu.get_cpu_capability()
        return out
    finally:
        torch.set_num_threads(threads)


def report(probe_seconds: float = 1.0) -> dict:
    """cpu_flags() plus the matmul probe (what the bench stores in its JSON env)."""
    info = cpu_flags()
    info["matmul_1thread"] = probe_matmul(probe_seconds)
    return info


# Where a run asks for bf16 compute on the trainer (verl's FSDP engine reads only mixed_precision.param_dtype).
BF16_KEYS = ("actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype",
             "actor_rollout_ref.ref.fsdp_config.mixed_precision.param_dtype")


def _is_bf16(value) -> bool:
    return str(value).lower() in ("bf16", "bfloat16", "torch.bfloat16")


def bf16_problem(config, info: dict | None = None) -> str | None:
    """A warning when a CPU run computes in bf16 on a CPU without native bf16, naming the keys; else None."""
    from omegaconf import OmegaConf

    info = info or cpu_flags()
    if info["native_bf16"]:
        return None
    asked = []
    for key in BF16_KEYS:
        fsdp = OmegaConf.select(config, key.rsplit(".mixed_precision", 1)[0])
        if fsdp is None:
            continue
        mp = fsdp.get("mixed_precision")
        # verl's FSDP engine: no mixed_precision means bf16 compute.
        if mp is None or _is_bf16(mp.get("param_dtype", "bf16")):
            asked.append(key)
    rollout_dtype = OmegaConf.select(config, "actor_rollout_ref.rollout.dtype")
    if _is_bf16(rollout_dtype):
        asked.append("actor_rollout_ref.rollout.dtype")
    if not asked:
        return None
    return (f"{', '.join(asked)} ask for bf16 compute, but this CPU ({info['model']}) has neither AVX512_BF16 nor "
            "AMX_BF16: bf16 is emulated there, about 10x slower end to end than fp32. Set them to fp32 (the CPU "
            "default: conf/rolloutpipe_trainer.yaml) unless the point is to measure bf16.")


if __name__ == "__main__":
    print(json.dumps(report(), indent=1))
