"""Check and time the θ_k store (verl_pipe/trainer/theta_store.py) under FSDP2: torch + transformers only.

    python -m verl_pipe_lab.bench gpu_check [--json out.json]            # Qwen3-1.7B shape on one GPU (nccl), fp32
                                                                     # master weights, bf16 compute, gradient
                                                                     # checkpointing
    torchrun --nproc-per-node 4 -m verl_pipe_lab.bench gpu_check         # the same sharded over 4 GPUs (FSDP2 over
                                                                     # all ranks)
    python -m verl_pipe_lab.bench gpu_check --tiny [--json out.json]     # a tiny Qwen3 on CPU (gloo), fp32: seconds
    torchrun --nproc-per-node 2 -m verl_pipe_lab.bench gpu_check --tiny  # the sharded path on CPU

``fully_shard`` on every decoder layer and the root over all ranks (FSDP2's default reshard_after_forward, so a
forward-only pass leaves the root's parameters unsharded: the case the store must handle); each rank trains on
its own batch (data parallel), as the trainer's ranks do. Per placement (device, pinned; auto is reported with
its choice) it saves θ_k, runs a few AdamW steps, and asserts on every rank:

- the old log-probs computed through the store equal those computed at θ_k before the updates (bitwise on
  CPU; on an accelerator max |Δ| <= 1e-4 nats, the figure is printed and ``bitwise`` tells whether it was 0),
  and differ from the live weights' (the swap did something);
- the live weights are bitwise untouched by a swap;
- ``restore()`` brings θ_k back (same log-probs), and the optimizer snapshot restores Adam's state (m, v,
  step) and the learning rate bitwise.

Then it times the snapshot the trainer takes once per step, the way it takes it (``save_step_state``, as
``PipeActorWorker.save_train_state`` calls it: θ_k and the optimizer state, synchronous on the training
stream), against a measured training step of the same model (forward, backward and AdamW on this rank's
batch), and reports each placement's cost as a percentage of that step, both the snapshot alone and the step
with the snapshot in front of it; these times are the slowest rank's (the other table's are rank 0's). Also
printed: save / refresh / swap / restore times and memory per placement, and the old pageable path (``.cpu()``
per call, what verl's save_model_to_cpu did) for comparison. Only rank 0 prints and writes ``--json``.

Memory: the check's reference copies live in host memory, and without ``--batch`` the sequences per step are
sized to the device: one- and two-sequence steps are measured, and the batch is the largest (at most
``DEFAULT_BATCH``) whose step fits beside a device copy of θ_k and the optimizer state in ``HEADROOM`` of the
memory (the smallest over ranks). An 80 GB card runs the defaults.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from verl_pipe.trainer.theta_store import OptimizerSnapshot, ThetaStore, reshard, save_step_state

FULL = dict(hidden_size=2048, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
            intermediate_size=6144, vocab_size=151936, head_dim=128, tie_word_embeddings=True)
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=128, vocab_size=512, head_dim=16, tie_word_embeddings=True)
MIB = float(1 << 20)
GIB = float(1 << 30)
GPU_TOL = 1e-4  # nats, max |Δ| of old log-probs on an accelerator (bf16 compute); 0 on CPU
DEFAULT_BATCH = 8  # sequences per rank and step on a GPU, when they fit
HEADROOM = 0.90  # share of the device memory the plan may fill (the allocator's fragmentation, NCCL buffers)


# ---------------------------------------------------------------- ranks


@dataclass
class Ranks:
    rank: int
    world: int
    device: torch.device

    @property
    def main(self) -> bool:
        return self.rank == 0

    def _reduce(self, values: list[float], op) -> list[float]:
        if self.world == 1:
            return list(values)
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=op)
        return t.tolist()

    def max(self, values: dict) -> dict:
        """Each figure's largest value over the ranks (a step is as slow as its slowest rank)."""
        keys = list(values)
        return dict(zip(keys, self._reduce([float(values[k]) for k in keys], dist.ReduceOp.MAX)))

    def min_int(self, value: int) -> int:
        return int(self._reduce([float(value)], dist.ReduceOp.MIN)[0])

    def gather(self, items: list) -> list:
        """Every rank's items, each tagged with its rank when there are several."""
        if self.world == 1:
            return list(items)
        out = [None] * self.world
        dist.all_gather_object(out, items)
        return [f"rank {r}: {x}" for r, xs in enumerate(out) for x in xs]

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_ranks(args) -> Ranks:
    """One process, or one of torchrun's (WORLD_SIZE > 1: RANK, LOCAL_RANK, MASTER_ADDR/PORT from torchrun)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if args.device:
        device = torch.device(args.device)
    else:
        device = torch.device("cpu" if args.tiny or not torch.cuda.is_available() else "cuda")
    if device.type == "cuda":
        if device.index is None:
            device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(int(os.environ.get("GPU_CHECK_THREADS", "1")))
    if world == 1:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
    dist.init_process_group("gloo" if device.type == "cpu" else "nccl", rank=rank, world_size=world)
    return Ranks(rank, world, device)


# ---------------------------------------------------------------- the model and a step


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


def build(args, ranks: Ranks):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from transformers import Qwen3Config, Qwen3ForCausalLM

    device = ranks.device
    torch.manual_seed(0)  # the same initial weights on every rank, then sharded
    config = Qwen3Config(**(TINY if args.tiny else FULL), max_position_embeddings=max(4096, args.seq_len))
    config._attn_implementation = "sdpa"
    with torch.device(device):
        model = Qwen3ForCausalLM(config).to(torch.float32)
    if args.recompute:
        model.gradient_checkpointing_enable()
    mesh = init_device_mesh(device.type, (ranks.world,))
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


@torch.no_grad()
def log_probs_nograd(model, ids):
    return log_probs(model, ids)


def train_step(model, optimizer, ids) -> None:
    """One training step: forward, backward, AdamW (FSDP2 reduce-scatters the gradients over the ranks)."""
    loss = -log_probs(model, ids).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def token_batch(vocab: int, rows: int, seq_len: int, seed: int, device) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (rows, seq_len), generator=g).to(device)


# ---------------------------------------------------------------- sizing the step to the device


def plan_batch(requested: int | None, default: int, fixed_bytes: int, per_seq_bytes: int, snapshot_bytes: int,
               capacity_bytes: int | None, headroom: float = HEADROOM) -> tuple[int, str]:
    """Sequences per step: ``requested`` as given; else the largest up to ``default`` whose step (``fixed_bytes``
    plus ``per_seq_bytes`` a sequence) fits beside a device snapshot of ``snapshot_bytes`` in ``headroom`` of
    ``capacity_bytes`` (None: no figure, e.g. CPU: ``default``). Raises ValueError naming the option when not
    even one sequence fits."""
    if requested is not None:
        if requested < 1:
            raise ValueError(f"--batch: got {requested}; allowed: an integer >= 1")
        return requested, "--batch"
    if capacity_bytes is None:
        return default, "default (no device memory figure)"
    room = int(headroom * capacity_bytes) - fixed_bytes - snapshot_bytes
    fit = room // max(per_seq_bytes, 1)
    if fit < 1:
        raise ValueError(
            f"--seq-len: one sequence needs {per_seq_bytes / GIB:.2f} GiB on top of {fixed_bytes / GIB:.2f} GiB for "
            f"the model and optimizer and {snapshot_bytes / GIB:.2f} GiB for a device snapshot, more than "
            f"{headroom:.0%} of {capacity_bytes / GIB:.1f} GiB: lower --seq-len, or run over more GPUs (torchrun)")
    return min(default, int(fit)), (f"sized to the device: {fit} sequence(s) fit in {headroom:.0%} of "
                                    f"{capacity_bytes / GIB:.1f} GiB beside a {snapshot_bytes / GIB:.1f} GiB snapshot")


def measure_step_memory(ranks: Ranks, model, optimizer, vocab: int, seq_len: int) -> tuple[int, int]:
    """(fixed, per sequence) peak bytes of a training step, from one- and two-sequence steps."""
    peaks = []
    for rows in (1, 2):
        ids = token_batch(vocab, rows, seq_len, 100 + ranks.rank, ranks.device)
        torch.cuda.reset_peak_memory_stats(ranks.device)
        train_step(model, optimizer, ids)
        _sync(ranks.device)
        peaks.append(torch.cuda.max_memory_allocated(ranks.device))
    per_seq = max(peaks[1] - peaks[0], 1 << 20)
    return peaks[0] - per_seq, per_seq


def size_batch(args, ranks: Ranks, model, optimizer, vocab: int) -> dict:
    """The sequences per step on every rank (the smallest plan over the ranks) and why."""
    device = ranks.device
    if args.batch is not None or device.type != "cuda":
        batch, why = plan_batch(args.batch, 2 if args.tiny else DEFAULT_BATCH, 0, 1, 0, None)
        return {"batch": batch, "why": why}
    fixed, per_seq = measure_step_memory(ranks, model, optimizer, vocab, args.seq_len)
    snapshot = ThetaStore(model, "pinned").need_bytes() + OptimizerSnapshot(optimizer, "pinned").need_bytes()
    free, total = torch.cuda.mem_get_info(device)
    capacity = free + torch.cuda.memory_reserved(device)  # what this process can still get, its own cache included
    batch, why = plan_batch(None, DEFAULT_BATCH, fixed, per_seq, snapshot, capacity)
    batch = ranks.min_int(batch)
    return {"batch": batch, "why": why, "fixed_gib": fixed / GIB, "per_sequence_gib": per_seq / GIB,
            "snapshot_gib": snapshot / GIB, "capacity_gib": capacity / GIB, "total_gib": total / GIB}


# ---------------------------------------------------------------- correctness per placement


def _host(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", copy=True)


def _clone_params(model) -> dict[str, torch.Tensor]:
    """This rank's shards, on the host: references on the device would cost the memory the check measures."""
    reshard(model)  # a forward-only pass can leave the root unsharded (plain parameters registered)
    return {n: _host(p.to_local()) for n, p in model.named_parameters()}


def _params_equal(model, ref: dict[str, torch.Tensor]) -> bool:
    reshard(model)
    return all(torch.equal(_host(p.to_local()), ref[n]) for n, p in model.named_parameters())


def _state_items(optimizer):
    for g in optimizer.param_groups:
        for p in g["params"]:
            yield optimizer.state.get(p, {})


def _clone_state(optimizer) -> list[dict]:
    return [{k: _host(v.to_local() if hasattr(v, "to_local") else v) if torch.is_tensor(v) else v
             for k, v in st.items()} for st in _state_items(optimizer)]


def _state_equal(optimizer, ref: list[dict]) -> bool:
    """Tensor by tensor, each brought to the host alone."""
    cur = list(_state_items(optimizer))
    if len(cur) != len(ref):
        return False
    for a, b in zip(cur, ref):
        if a.keys() != b.keys():
            return False
        for k, v in a.items():
            if torch.is_tensor(v):
                if not torch.equal(_host(v.to_local() if hasattr(v, "to_local") else v), b[k]):
                    return False
            elif v != b[k]:
                return False
    return True


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
    swaps_in, swaps_out, lp_store = _swap_round_trips(device, store, model, eval_ids)
    lp_after = log_probs_nograd(model, eval_ids)
    live_untouched = _params_equal(model, live)
    theta_by_name = all(torch.equal(_host(t), at_k[n]) for n, t in store.named_tensors())
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
    r["failures"] = _placement_failures(r)
    del store, opt
    return r


def _swap_round_trips(device, store, model, eval_ids, rounds: int = 3):
    """θ_k swapped in, the old log-probs computed through it, swapped out, ``rounds`` times: (swap-in seconds,
    swap-out seconds, the last round's log-probs)."""
    swaps_in, swaps_out, lp_store = [], [], None
    for _ in range(rounds):
        t_in, _ = _timed(device, store.swap_in)
        lp_store = log_probs_nograd(model, eval_ids)
        t_out, _ = _timed(device, store.swap_out)
        swaps_in.append(t_in)
        swaps_out.append(t_out)
    return swaps_in, swaps_out, lp_store


def _placement_failures(r: dict) -> list[str]:
    """What ``check_placement``'s result ``r`` shows wrong, in words (none: the placement passed)."""
    diff, tol = r["old_logprob_max_abs_diff"], r["tolerance"]
    failures = [k for k in ("live_untouched", "theta_by_name_exact", "restore_exact", "optimizer_restore_exact")
                if not r[k]]
    if diff > tol:
        failures.append(f"old log-probs through the store differ from those at θ_k by {diff:g} > {tol:g}")
    if r["store_vs_live_max_abs_diff"] == 0.0:
        failures.append("the updates did not change the log-probs: the check proves nothing")
    return failures


# ---------------------------------------------------------------- cost per step


def snapshot_cost(args, ranks: Ranks, model, optimizer, batch, placement: str) -> dict:
    """The trainer's per-step snapshot (save_step_state) against a training step, interleaved: the step alone,
    the snapshot alone, the snapshot then the step (what the trainer's first unit pays)."""
    device = ranks.device
    theta, opt = ThetaStore(model, placement), OptimizerSnapshot(optimizer, placement)
    save_step_state(theta, opt)  # allocates the buffers once per run, like the worker's stores
    step_s, snap_s, both_s = [], [], []

    def both():
        save_step_state(theta, opt)
        train_step(model, optimizer, batch)

    for _ in range(args.repeats):
        ranks.barrier()
        step_s.append(_timed(device, lambda: train_step(model, optimizer, batch))[0])
        ranks.barrier()
        snap_s.append(_timed(device, lambda: save_step_state(theta, opt))[0])
        ranks.barrier()
        both_s.append(_timed(device, both)[0])
    t = ranks.max({"step_s": statistics.median(step_s), "snapshot_s": statistics.median(snap_s),
                   "step_with_snapshot_s": statistics.median(both_s)})
    r = {"requested": placement, "placement": theta.placement, "bytes": theta.nbytes + opt.stats.nbytes, **t,
         "snapshot_pct_of_step": 100.0 * t["snapshot_s"] / t["step_s"],
         "overhead_pct_of_step": 100.0 * (t["step_with_snapshot_s"] - t["step_s"]) / t["step_s"]}
    del theta, opt
    return r


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


# ---------------------------------------------------------------- report


def _columns(rows) -> str:
    w = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.rjust(w[i]) if i else c.ljust(w[i]) for i, c in enumerate(r)) for r in rows)


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
    return _columns(rows)


def cost_table(results: dict) -> str:
    rows = [("snapshot", "MiB/rank", "step s", "snapshot s", "% of step", "step+snapshot s", "overhead %")]
    for r in results["snapshot_cost"]:
        rows.append((f"{r['requested']}->{r['placement']}", f"{r['bytes'] / MIB:.1f}", f"{r['step_s']:.4f}",
                     f"{r['snapshot_s']:.4f}", f"{r['snapshot_pct_of_step']:.1f}",
                     f"{r['step_with_snapshot_s']:.4f}", f"{r['overhead_pct_of_step']:+.1f}"))
    return _columns(rows)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m verl_pipe_lab.bench gpu_check", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="tiny Qwen3 shape on CPU")
    ap.add_argument("--device", default=None, help="default: cuda (cuda:LOCAL_RANK under torchrun) if available, "
                                                   "cpu with --tiny")
    ap.add_argument("--steps", type=int, default=3, help="AdamW steps between θ_k and the check")
    ap.add_argument("--batch", type=int, default=None, help=f"sequences per rank and step (default: up to "
                                                            f"{DEFAULT_BATCH}, sized to the device; 2 with --tiny)")
    ap.add_argument("--seq-len", type=int, default=None, help="tokens per sequence (default 1024; 16 with --tiny)")
    ap.add_argument("--repeats", type=int, default=None, help="timed steps per placement (default 5; 2 with --tiny)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--placements", default="device,pinned,auto")
    ap.add_argument("--no-recompute", dest="recompute", action="store_false", help="no gradient checkpointing")
    ap.add_argument("--json", help="write the results here (rank 0)")
    return ap


def _parse_args(ap: argparse.ArgumentParser, argv):
    """The arguments with --tiny's defaults filled in; a count below 1 is refused naming its flag."""
    args = ap.parse_args(argv)
    args.seq_len = args.seq_len or (16 if args.tiny else 1024)
    args.repeats = args.repeats or (2 if args.tiny else 5)
    for name in ("steps", "seq_len", "repeats"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')}: got {getattr(args, name)}; allowed: an integer >= 1")
    if args.tiny:
        args.recompute = False
    return args


def _run_checks(args, ap, ranks: Ranks) -> tuple[dict, dict]:
    """Every placement's check and snapshot cost and the pageable baseline on one model: (results, batch plan)."""
    device = ranks.device
    t0 = time.perf_counter()
    model, optimizer = build(args, ranks)
    vocab = model.config.vocab_size
    train_step(model, optimizer, token_batch(vocab, 1, args.seq_len, 50 + ranks.rank, device))  # lazy init, Adam
    try:
        plan = size_batch(args, ranks, model, optimizer, vocab)
    except ValueError as e:
        ap.error(str(e))
    batch = token_batch(vocab, plan["batch"], args.seq_len, 1 + ranks.rank, device)  # each rank its own data
    eval_ids = token_batch(vocab, min(plan["batch"], 4), args.seq_len, 7, device)  # the same on every rank
    results = {"device": str(torch.cuda.get_device_name(device)) if device.type == "cuda" else "cpu",
               "torch": torch.__version__, "tiny": args.tiny, "world_size": ranks.world,
               "params": sum(p.numel() for p in model.parameters()), "batch_plan": plan,
               "tokens_per_step": plan["batch"] * args.seq_len * ranks.world, "steps": args.steps,
               "recompute": args.recompute, "placements": [], "snapshot_cost": []}
    placements = args.placements.split(",")
    for placement in placements:
        r = check_placement(args, device, model, optimizer, batch, eval_ids, placement)
        r["failures"] = ranks.gather(r["failures"])
        results["placements"].append(r)
    for placement in placements:
        results["snapshot_cost"].append(snapshot_cost(args, ranks, model, optimizer, batch, placement))
    results["pageable"] = pageable_baseline(device, model, optimizer)
    results["wall_s"] = time.perf_counter() - t0
    return results, plan


def _report(args, ranks: Ranks, results: dict, plan: dict, failures: list[str]) -> None:
    print(table(results))
    print(f"\nper-step snapshot (θ_k + optimizer state, save_step_state as the trainer calls it) vs one training step "
          f"(forward, backward, AdamW) of {plan['batch']} x {args.seq_len} tokens per rank on {ranks.world} "
          f"rank(s), the slowest rank's times; batch: {plan['why']}")
    print(cost_table(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    for f in failures:
        print("FAIL", f)
    print(f"gpu_check: {'ok' if not failures else 'FAILED'} in {results['wall_s']:.1f} s")


def main(argv=None) -> int:
    ap = _parser()
    args = _parse_args(ap, argv)
    ranks = init_ranks(args)
    try:
        results, plan = _run_checks(args, ap, ranks)
        # Every rank done before any tears the group down: a rank that destroyed its gloo group while a peer still
        # used it aborted at exit ("terminate called without an active exception", seen once under a loaded CI).
        ranks.barrier()
    finally:
        dist.destroy_process_group()
    failures = [f"{r['requested']}: {f}" for r in results["placements"] for f in r["failures"]]
    results["ok"] = not failures
    if not ranks.main:
        return 0 if not failures else 1
    _report(args, ranks, results, plan, failures)
    return 0 if not failures else 1

if __name__ == "__main__":
    sys.exit(main())
