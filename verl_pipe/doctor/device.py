"""The GPU checks that need torch alone (no vLLM, Ray, verl, transformers or omegaconf): the device torch sees, a bf16
matmul, a small forward and backward, the pinned host copy's bandwidth, NCCL on one rank, and the θ_k store under
FSDP2 over that NCCL group (verl_pipe/doctor/theta.py).

Without a GPU each reports ``skip`` ("no GPU visible to torch"), or ``fail`` when the run asked for one (--gpu). A
check that raises is a ``fail`` naming the exception, never a traceback out of the doctor.
"""

from __future__ import annotations

import math
import os
import socket
import time
import traceback

from verl_pipe.doctor.report import Check

GROUP = "device"
SMI = "the output of `nvidia-smi` and of `python -c \"import torch; print(torch.__version__, torch.version.cuda)\"`"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(name: str, fn, send_back: str = SMI) -> Check:
    """``fn()`` -> (status, detail, data); an exception is a failure naming it (its traceback in the data)."""
    t0 = time.perf_counter()
    try:
        status, detail, data = fn()
    except Exception as e:  # noqa: BLE001 -- any failure of the device is a finding, reported
        status, detail, data = "fail", f"{type(e).__name__}: {e}", {"traceback": traceback.format_exc()}
    return Check(name, GROUP, status, detail, data, send_back=send_back if status == "fail" else None,
                 seconds=time.perf_counter() - t0)


def _sync(torch):
    torch.cuda.synchronize()


def visible(torch) -> tuple:
    n = torch.cuda.device_count()
    gpus = []
    for i in range(n):
        p = torch.cuda.get_device_properties(i)
        gpus.append({"index": i, "name": p.name, "capability": f"{p.major}.{p.minor}",
                     "memory_gib": round(p.total_memory / 2**30, 1)})
    free, total = torch.cuda.mem_get_info(0)
    detail = f"{n} GPU(s): " + "; ".join(f"{g['name']} (sm {g['capability']}, {g['memory_gib']} GiB)" for g in gpus)
    return "pass", detail + f"; GPU 0 has {free / 2**30:.1f} GiB free", {"gpus": gpus, "cuda": torch.version.cuda}


def bf16_matmul(torch) -> tuple:
    dev = torch.device("cuda", 0)
    g = torch.Generator(device="cpu").manual_seed(0)
    a, b = (torch.randn(2048, 2048, generator=g).to(dev) for _ in range(2))
    ref = a @ b  # fp32
    got = (a.bfloat16() @ b.bfloat16()).float()
    rel = float((got - ref).norm() / ref.norm())
    _sync(torch)
    t0 = time.perf_counter()
    for _ in range(10):
        a.bfloat16() @ b.bfloat16()
    _sync(torch)
    tflops = 10 * 2 * 2048**3 / (time.perf_counter() - t0) / 1e12
    ok = rel < 1e-2  # bf16 keeps 8 mantissa bits: ~4e-3 relative error on a 2048-long dot product
    return ("pass" if ok else "fail", f"relative error vs fp32 {rel:.1e} (bound 1e-2), ~{tflops:.0f} TFLOP/s "
            "(incl. casts)", {"relative_error": rel, "tflops": tflops})


def forward_backward(torch) -> tuple:
    dev = torch.device("cuda", 0)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(64, 256, device=dev)
    losses = []
    for _ in range(3):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = (model(x).float() - x).pow(2).mean()
        loss.backward()
        grads_ok = all(p.grad is not None and bool(torch.isfinite(p.grad).all()) for p in model.parameters())
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    ok = grads_ok and all(math.isfinite(v) for v in losses) and losses[-1] < losses[0]
    return ("pass" if ok else "fail", f"bf16 autocast MLP, 3 AdamW steps: loss {losses[0]:.4f} -> {losses[-1]:.4f}"
            + ("" if ok else " (expected finite gradients and a falling loss)"), {"losses": losses})


def pinned_copy(torch) -> tuple:
    dev = torch.device("cuda", 0)
    nbytes = 256 << 20
    host = torch.empty(nbytes // 4, dtype=torch.float32).pin_memory()
    gpu = torch.empty_like(host, device=dev)
    rates = {}
    for name, dst, src in (("host_to_device", gpu, host), ("device_to_host", host, gpu)):
        dst.copy_(src, non_blocking=True)  # warm-up
        _sync(torch)
        t0 = time.perf_counter()
        for _ in range(5):
            dst.copy_(src, non_blocking=True)
        _sync(torch)
        rates[name] = 5 * nbytes / (time.perf_counter() - t0) / 2**30
    return ("pass", f"pinned 256 MiB: host->device {rates['host_to_device']:.1f} GiB/s, device->host "
            f"{rates['device_to_host']:.1f} GiB/s (the θ_k store's pinned placement moves weights this way)", rates)


def nccl_and_theta(torch) -> list[Check]:
    """NCCL on one rank (init, all_reduce, teardown), and the θ_k store under FSDP2 over that group."""
    import torch.distributed as dist

    dev = torch.device("cuda", 0)

    def nccl():
        torch.cuda.set_device(dev)
        v = torch.cuda.nccl.version()  # (major, minor, patch); an int in older torch releases
        version = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1,
                                device_id=dev)
        t = torch.full((1024,), 2.0, device=dev)
        dist.all_reduce(t)
        _sync(torch)
        ok = bool((t == 2.0).all())
        return ("pass" if ok else "fail", f"NCCL {version}: init, all_reduce and barrier on 1 rank"
                + ("" if ok else ": all_reduce over one rank changed the values"), {"nccl": version})

    checks = [_run("NCCL on 1 rank", nccl, send_back=SMI + ", and the same command with NCCL_DEBUG=INFO set")]
    if checks[0].status != "pass":
        checks.append(Check("θ_k store under FSDP2", GROUP, "skip", "needs the NCCL group (failed above)"))
        return checks

    def theta():
        from verl_pipe.doctor.theta import check_theta_store

        rounds = check_theta_store(dev)
        failures = [f"{r['requested']}: {f}" for r in rounds for f in r["failures"]]
        detail = "; ".join(f"{r['requested']}->{r['placement']} ({r['swap']} swap) max|Δlp| "
                           f"{r['old_logprob_max_abs_diff']:.1e}" for r in rounds)
        return ("fail" if failures else "pass", detail + ("; " + "; ".join(failures) if failures else ""),
                {"placements": rounds})

    try:
        checks.append(_run("θ_k store under FSDP2", theta, send_back="the report's data of this check"))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return checks


def device_checks(want_gpu: bool) -> list[Check]:
    """The torch-only checks; without a GPU one line each says so (a failure when ``want_gpu``)."""
    names = ["torch sees the GPUs", "bf16 matmul", "forward and backward", "pinned host copy", "NCCL on 1 rank",
             "θ_k store under FSDP2"]
    try:
        import torch
    except Exception as e:  # noqa: BLE001 -- torch missing or broken: every device check says so
        return [Check(n, GROUP, "fail", f"torch does not import ({type(e).__name__}: {e})",
                      send_back="the output of `pip freeze`") for n in names]
    if not torch.cuda.is_available():
        why = f"no GPU visible to torch (torch {torch.__version__}, CUDA build: {torch.version.cuda or 'none'}"
        why += f", CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']!r})" \
            if "CUDA_VISIBLE_DEVICES" in os.environ else ")"
        if want_gpu:
            return [Check(names[0], GROUP, "fail", why + "; --gpu asks for one", send_back=SMI)] + \
                [Check(n, GROUP, "skip", "no GPU") for n in names[1:]]
        return [Check(n, GROUP, "skip", why if i == 0 else "no GPU", needed=False) for i, n in enumerate(names)]
    checks = [_run(names[0], lambda: visible(torch))]
    if checks[0].status == "fail":
        return checks + [Check(n, GROUP, "skip", "the GPU is not usable (above)") for n in names[1:]]
    checks += [_run(names[1], lambda: bf16_matmul(torch)), _run(names[2], lambda: forward_backward(torch)),
               _run(names[3], lambda: pinned_copy(torch))]
    return checks + nccl_and_theta(torch)


def in_subprocess(want_gpu: bool, timeout_s: float = 600) -> list[Check]:
    """``device_checks`` in a child process: the doctor's own process never holds a CUDA context (the stack's vLLM
    sizes its cache by the free memory), and a crash or hang of the driver is a reported failure."""
    import json
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "verl_pipe.doctor.device"] + (["--gpu"] if want_gpu else [])
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return [Check("device checks", GROUP, "fail", f"did not finish in {timeout_s:.0f} s (a hung driver or NCCL)",
                      send_back=SMI + ", and `python -m verl_pipe.doctor.device --gpu` run by hand")]
    lines = [x for x in out.stdout.splitlines() if x.startswith(_MARK)]
    if out.returncode != 0 or not lines:
        tail = (out.stderr or out.stdout).strip()[-2000:]
        return [Check("device checks", GROUP, "fail", f"the check process ended with exit code {out.returncode}",
                      {"output_tail": tail}, send_back=SMI + ", and `python -m verl_pipe.doctor.device --gpu`'s output")]
    return [Check(**d) for d in json.loads(lines[-1][len(_MARK):])]


_MARK = "DOCTOR-DEVICE-CHECKS "

if __name__ == "__main__":
    import json
    import sys
    from dataclasses import asdict

    print(_MARK + json.dumps([asdict(c) for c in device_checks("--gpu" in sys.argv[1:])], default=str), flush=True)
