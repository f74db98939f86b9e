"""Check and time the θ_k store (verl_pipe/theta_store.py) under FSDP2 on one device: torch + transformers only.

    python tools/gpu_check.py [--json out.json]          # Qwen3-1.7B shape on the GPU (nccl), fp32 master
                                                         # weights, bf16 compute, gradient checkpointing
    python tools/gpu_check.py --tiny [--json out.json]   # a tiny Qwen3 on CPU (gloo), fp32: seconds

World size 1: ``fully_shard`` on every decoder layer and the root (FSDP2's default reshard_after_forward, so a
forward-only pass leaves the root's parameters unsharded: the case the store must handle). Per placement
(device, pinned; auto is reported with its choice) it saves θ_k, runs a few AdamW steps, and asserts:

- the old log-probs computed through the store equal those computed at θ_k before the updates (bitwise on
  CPU; on an accelerator max |Δ| <= 1e-4 nats, the figure is printed and ``bitwise`` tells whether it was 0),
  and differ from the live weights' (the swap did something);
- the live weights are bitwise untouched by a swap;
- ``restore()`` brings θ_k back (same log-probs), and the optimizer snapshot restores Adam's state (m, v,
  step) and the learning rate bitwise.

It prints save / refresh / swap / restore times and memory per placement, the optimizer snapshot's cost, the
old pageable path (``.cpu()`` per call: verl's save_model_to_cpu, and the trainer's copy of the optimizer state
before the store) for comparison, and on CUDA whether a host snapshot issued on a side stream overlaps a training
step.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # verl_pipe without installing it

from verl_pipe.theta_store import OptimizerSnapshot, ThetaStore, reshard  # noqa: E402

FULL = dict(hidden_size=2048, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
            intermediate_size=6144, vocab_size=151936, head_dim=128, tie_word_embeddings=True)
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=128, vocab_size=512, head_dim=16, tie_word_embeddings=True)
MIB = float(1 << 20)
GPU_TOL = 1e-4  # nats, max |Δ| of old log-probs on an accelerator (bf16 compute); 0 on CPU


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(device, fn):
    _sync(device)
    t = time.perf_counter()
    out = fn()
    _sync(device)
    return time.perf_counter() - t, out


def _allocated(device) -> int:
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else 0


def build(args, device: torch.device):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(**(TINY if args.tiny else FULL), max_position_embeddings=max(4096, args.seq_len))
    config._attn_implementation = "sdpa"
    with torch.device(device):
        model = Qwen3ForCausalLM(config).to(torch.float32)
    if args.recompute:
        model.gradient_checkpointing_enable()
    mesh = init_device_mesh(device.type, (1,))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if device.type == "cuda" \
        else MixedPrecisionPolicy()
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    return model, optimizer


def log_probs(model, ids: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=ids).logits[:, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)


def train_step(model, optimizer, ids, before_step=None) -> None:
    loss = -log_probs(model, ids).mean()
    loss.backward()
    if before_step is not None:
        before_step()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _clone_params(model) -> dict[str, torch.Tensor]:
    reshard(model)  # a forward-only pass can leave the root unsharded (plain parameters registered)
    return {n: p.to_local().detach().clone() for n, p in model.named_parameters()}


def _params_equal(model, ref: dict[str, torch.Tensor]) -> bool:
    reshard(model)
    return all(torch.equal(p.to_local(), ref[n]) for n, p in model.named_parameters())


def _clone_state(optimizer) -> list[dict]:
    out = []
    for g in optimizer.param_groups:
        for p in g["params"]:
            st = optimizer.state.get(p, {})
            out.append({k: (v.to_local() if hasattr(v, "to_local") else v).detach().clone() if torch.is_tensor(v)
                        else v for k, v in st.items()})
    return out


def _state_equal(optimizer, ref: list[dict]) -> bool:
    cur = _clone_state(optimizer)
    return len(cur) == len(ref) and all(
        a.keys() == b.keys() and all(torch.equal(a[k], b[k]) if torch.is_tensor(a[k]) else a[k] == b[k] for k in a)
        for a, b in zip(cur, ref))


def check_placement(args, device, model, optimizer, batch, eval_ids, placement: str) -> dict:
    reshard(model)
    lp_k = log_probs_nograd(model, eval_ids)  # the old log-probs at θ_k, before any update
    at_k = _clone_params(model)
    mem0 = _allocated(device)
    store = ThetaStore(model, placement)
    t_save, _ = _timed(device, store.save)  # allocates the buffers
    mem_store = _allocated(device) - mem0
    t_refresh = statistics.median(_timed(device, store.save)[0] for _ in range(3))
    opt = OptimizerSnapshot(optimizer, placement)
    t_opt_first, _ = _timed(device, opt.save)
    t_opt_refresh = statistics.median(_timed(device, opt.save)[0] for _ in range(3))
    opt_ref = _clone_state(optimizer)
    lr_ref = [g["lr"] for g in optimizer.param_groups]
    for _ in range(args.steps):
        train_step(model, optimizer, batch)
    for g in optimizer.param_groups:
        g["lr"] *= 0.5  # the snapshot must bring the hyperparameters back too
    live = _clone_params(model)
    # Forward-only passes below leave the root's parameters unsharded (gathered from the weights of that
    # moment) between the store's swaps, as the old-log-prob pass does in the trainer.
    lp_live = log_probs_nograd(model, eval_ids)
    swaps_in, swaps_out, lp_store = [], [], None
    for _ in range(3):
        t_in, _ = _timed(device, store.swap_in)
        lp_store = log_probs_nograd(model, eval_ids)
        t_out, _ = _timed(device, store.swap_out)
        swaps_in.append(t_in)
        swaps_out.append(t_out)
    lp_after = log_probs_nograd(model, eval_ids)
    live_untouched = _params_equal(model, live)
    theta_by_name = all(torch.equal(t.to(at_k[n].device), at_k[n]) for n, t in store.named_tensors())
    t_restore, _ = _timed(device, store.restore)
    restored = _params_equal(model, at_k)
    lp_restored = log_probs_nograd(model, eval_ids)
    t_opt_restore, _ = _timed(device, opt.restore)
    opt_exact = _state_equal(optimizer, opt_ref) and [g["lr"] for g in optimizer.param_groups] == lr_ref
    tol = 0.0 if device.type == "cpu" else GPU_TOL
    diff = float((lp_store - lp_k).abs().max())
    r = {
        "requested": placement, "placement": store.placement, "swap": store.stats.swap,
        "theta_bytes": store.nbytes, "theta_device_bytes": mem_store,
        "theta_save_first_s": t_save, "theta_refresh_s": t_refresh,
        "swap_in_s": statistics.median(swaps_in), "swap_out_s": statistics.median(swaps_out),
        "theta_restore_s": t_restore,
        "opt_placement": opt.placement, "opt_bytes": opt.stats.nbytes,
        "opt_save_first_s": t_opt_first, "opt_refresh_s": t_opt_refresh, "opt_restore_s": t_opt_restore,
        "old_logprob_max_abs_diff": diff, "tolerance": tol, "bitwise": diff == 0.0,
        "store_vs_live_max_abs_diff": float((lp_store - lp_live).abs().max()),
        "live_untouched": live_untouched and torch.equal(lp_after, lp_live),
        "theta_by_name_exact": theta_by_name,
        "restore_exact": restored and float((lp_restored - lp_k).abs().max()) <= tol,
        "optimizer_restore_exact": opt_exact,
    }
    failures = [k for k in ("live_untouched", "theta_by_name_exact", "restore_exact", "optimizer_restore_exact")
                if not r[k]]
    if diff > tol:
        failures.append(f"old log-probs through the store differ from those at θ_k by {diff:g} > {tol:g}")
    if r["store_vs_live_max_abs_diff"] == 0.0:
        failures.append("the updates did not change the log-probs: the check proves nothing")
    r["failures"] = failures
    del store, opt
    return r


@torch.no_grad()
def log_probs_nograd(model, ids):
    return log_probs(model, ids)


@torch.no_grad()
def pageable_baseline(device, model, optimizer) -> dict:
    """What the code did before the store: a fresh pageable host copy per call (``.cpu()``)."""
    reshard(model)
    locals_ = [p._local_tensor for p in model.parameters()]  # as verl's fsdp2_sharded_save_to_cpu reads them
    t_save, saved = _timed(device, lambda: [t.detach().to("cpu", copy=True) for t in locals_])
    t_restore, _ = _timed(device, lambda: [d.copy_(s.to(d.device)) for d, s in zip(locals_, saved)])
    states = [v.to_local() if hasattr(v, "to_local") else v for st in optimizer.state.values() for v in st.values()
              if torch.is_tensor(v)]
    t_opt, _ = _timed(device, lambda: [v.detach().to("cpu", copy=True) for v in states])
    return {"theta_save_s": t_save, "theta_restore_s": t_restore, "swap_s": t_save + 2 * t_restore,
            "opt_save_s": t_opt, "theta_bytes": sum(t.numel() * t.element_size() for t in locals_),
            "opt_bytes": sum(v.numel() * v.element_size() for v in states)}


def overlap_check(args, device, model, optimizer, batch) -> dict:
    """Is a host snapshot (θ + optimizer state to pinned buffers) issued on a side stream hidden under a
    training step? The copy starts with the step's forward and the optimizer step waits for it (fence)."""
    if device.type != "cuda":
        return {"skipped": f"no side streams on {device.type}: the overlap check needs CUDA"}
    theta = ThetaStore(model, "pinned")
    opt = OptimizerSnapshot(optimizer, "pinned")
    theta.save()
    opt.save()  # allocate
    side = torch.cuda.Stream(device)
    n = 3

    def step_alone():
        train_step(model, optimizer, batch)

    def snap_alone():
        theta.save()
        opt.save()

    def step_with_snapshot():
        main = torch.cuda.current_stream(device)
        side.wait_stream(main)  # the weights and state as the main stream left them
        with torch.cuda.stream(side):
            theta.save()
            opt.save()
            done = torch.cuda.Event()
            done.record(side)
        # the forward and backward run beside the copies; the optimizer step waits for them
        train_step(model, optimizer, batch, before_step=lambda: main.wait_event(done))

    a = statistics.median(_timed(device, step_alone)[0] for _ in range(n))
    s = statistics.median(_timed(device, snap_alone)[0] for _ in range(n))
    c = statistics.median(_timed(device, step_with_snapshot)[0] for _ in range(n))
    x = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)

    def matmuls():
        for _ in range(40):
            x @ x

    m = statistics.median(_timed(device, matmuls)[0] for _ in range(n))

    def matmuls_with_snapshot():
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            theta.save()
            opt.save()
        matmuls()

    mc = statistics.median(_timed(device, matmuls_with_snapshot)[0] for _ in range(n))
    return {"step_s": a, "snapshot_s": s, "step_with_side_snapshot_s": c,
            "step_overlap_fraction": (a + s - c) / s if s > 0 else None,
            "matmuls_s": m, "matmuls_with_side_snapshot_s": mc,
            "matmul_overlap_fraction": (m + s - mc) / s if s > 0 else None}


def table(results: dict) -> str:
    rows = [("placement", "swap", "θ MiB", "θ dev MiB", "save1 s", "refresh s", "swap in+out s", "restore s",
             "opt MiB", "opt save s", "opt restore s", "max|Δlp|", "ok")]
    for r in results["placements"]:
        rows.append((f"{r['requested']}->{r['placement']}", r["swap"], f"{r['theta_bytes'] / MIB:.1f}",
                     f"{r['theta_device_bytes'] / MIB:.1f}", f"{r['theta_save_first_s']:.4f}",
                     f"{r['theta_refresh_s']:.4f}", f"{r['swap_in_s'] + r['swap_out_s']:.4f}",
                     f"{r['theta_restore_s']:.4f}", f"{r['opt_bytes'] / MIB:.1f}", f"{r['opt_refresh_s']:.4f}",
                     f"{r['opt_restore_s']:.4f}", f"{r['old_logprob_max_abs_diff']:.2g}",
                     "yes" if not r["failures"] else "NO"))
    p = results["pageable"]
    rows.append(("pageable (old)", "copy", f"{p['theta_bytes'] / MIB:.1f}", "0", f"{p['theta_save_s']:.4f}",
                 f"{p['theta_save_s']:.4f}", f"{p['swap_s']:.4f}", f"{p['theta_restore_s']:.4f}",
                 f"{p['opt_bytes'] / MIB:.1f}", f"{p['opt_save_s']:.4f}", "-", "-", "-"))
    w = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.rjust(w[i]) if i else c.ljust(w[i]) for i, c in enumerate(r)) for r in rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="tiny Qwen3 shape on CPU")
    ap.add_argument("--device", default=None, help="default: cuda if available (cpu with --tiny)")
    ap.add_argument("--steps", type=int, default=3, help="AdamW steps between θ_k and the check")
    ap.add_argument("--batch", type=int, default=None, help="sequences per step (default 9; 2 with --tiny)")
    ap.add_argument("--seq-len", type=int, default=None, help="tokens per sequence (default 1024; 16 with --tiny)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--placements", default="device,pinned,auto")
    ap.add_argument("--no-recompute", dest="recompute", action="store_false", help="no gradient checkpointing")
    ap.add_argument("--no-overlap", dest="overlap", action="store_false", help="skip the side-stream check")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    args.batch = args.batch or (2 if args.tiny else 9)
    args.seq_len = args.seq_len or (16 if args.tiny else 1024)
    if args.tiny:
        args.recompute = False
    device = torch.device(args.device or ("cpu" if args.tiny or not torch.cuda.is_available() else "cuda"))
    if device.type == "cpu":
        torch.set_num_threads(int(os.environ.get("GPU_CHECK_THREADS", "1")))
    else:
        torch.cuda.set_device(device)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    import torch.distributed as dist

    dist.init_process_group("gloo" if device.type == "cpu" else "nccl", rank=0, world_size=1)
    t0 = time.perf_counter()
    try:
        model, optimizer = build(args, device)
        g = torch.Generator().manual_seed(1)
        vocab = model.config.vocab_size
        batch = torch.randint(0, vocab, (args.batch, args.seq_len), generator=g).to(device)
        eval_ids = torch.randint(0, vocab, (min(args.batch, 4), args.seq_len), generator=g).to(device)
        train_step(model, optimizer, batch)  # lazy init and Adam state exist before the first snapshot
        results = {"device": str(torch.cuda.get_device_name(device)) if device.type == "cuda" else "cpu",
                   "torch": torch.__version__, "tiny": args.tiny,
                   "params": sum(p.numel() for p in model.parameters()),
                   "tokens_per_step": args.batch * args.seq_len, "steps": args.steps, "recompute": args.recompute,
                   "placements": []}
        for placement in args.placements.split(","):
            results["placements"].append(check_placement(args, device, model, optimizer, batch, eval_ids, placement))
        results["pageable"] = pageable_baseline(device, model, optimizer)
        results["overlap"] = overlap_check(args, device, model, optimizer, batch) if args.overlap else {
            "skipped": "--no-overlap"}
        results["wall_s"] = time.perf_counter() - t0
    finally:
        dist.destroy_process_group()
    print(table(results))
    ov = results["overlap"]
    print("side-stream snapshot:", ov.get("skipped") or
          f"step {ov['step_s']:.3f} s alone, snapshot {ov['snapshot_s']:.3f} s alone, together "
          f"{ov['step_with_side_snapshot_s']:.3f} s (overlap {ov['step_overlap_fraction']:.0%}); beside matmuls "
          f"overlap {ov['matmul_overlap_fraction']:.0%}")
    failures = [f"{r['requested']}: {f}" for r in results["placements"] for f in r["failures"]]
    results["ok"] = not failures
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    for f in failures:
        print("FAIL", f)
    print(f"gpu_check: {'ok' if not failures else 'FAILED'} in {results['wall_s']:.1f} s")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
