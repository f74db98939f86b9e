"""Bench records read back as simulator inputs: a fitted engine or trainer rebuilt from its summary, the KV pool and
row order a stack ran with (from its recorded overrides), and which stack's engine fit a KV-capped stack borrows.

Shared by the planner's calibration and validation (verl_pipe/plan/) and the bench's window table
(lab/verl_pipe_lab/bench/sim_windows.py); pure (no Ray, vLLM or verl).
"""

from __future__ import annotations

import dataclasses

from verl_pipe.sim.calib import StepShape
from verl_pipe.sim.engine import CPU_TINY, EngineParams
from verl_pipe.sim.trainer import TrainerParams

CPU_BLOCK_TOKENS = 128  # vLLM-CPU's default KV block size (vllm/platforms/cpu.py): num_gpu_blocks_override's unit


def engine_from_summary(e: dict, shape: StepShape) -> EngineParams:
    """The engine ``calib.fit_engine`` fitted, rebuilt from its summary (``calib._engine_summary``), on ``shape``."""
    p = float(e["prefill_s_per_token"])
    return CPU_TINY.with_(max_num_seqs=shape.max_num_seqs, max_num_batched_tokens=shape.max_num_batched_tokens,
                          kv_capacity_tokens=shape.kv_capacity_tokens, kv_block_tokens=shape.kv_block_tokens,
                          t0_s=float(e["t0_s"]),
                          per_seq_s=float(e["per_seq_s"]), weight_bytes=0.0,
                          prefill_flops_per_token=1.0 if p > 0 else 0.0, prefill_flops_per_s=1.0 / p if p > 0 else 1.0)


def trainer_from_summary(t: dict) -> TrainerParams:
    """The trainer ``calib.fit_trainer`` fitted (θ_k store on CPU: a pointer swap), from its summary."""
    swap = float(t["theta_k_snapshot_s"])
    return TrainerParams().with_(
        num_gpus=1, flops_per_s_per_gpu=1.0 / max(float(t["update_s_per_padded_token"]), 1e-12), efficiency=1.0,
        linear_flops_per_token=1.0, attn_flops_coef=0.0, call_overhead_s=float(t["per_call_overhead_s"]),
        microbatch_overhead_s=0.0, max_tokens_per_microbatch=1 << 40, logprob_ratio=float(t["logprob_ratio"]),
        use_ref=False, optimizer_step_s=float(t["optimizer_step_s"]), time_scale=1.0, swap_save_s=swap,
        swap_restore_s=swap, swap_cycle_s=0.0, opt_snapshot_s=0.0, pad_rows=int(t.get("pad_rows", 0)),
        update_order=str(t.get("update_order", "arrival")))


def kv_override_tokens(rollout_cfg) -> int | None:
    """The KV pool a replica gets when the config caps its blocks (``engine_kwargs.vllm.num_gpu_blocks_override``,
    which verl forwards to vLLM as is), in tokens; None when it does not."""
    blocks = ((rollout_cfg.get("engine_kwargs") or {}).get("vllm") or {}).get("num_gpu_blocks_override")
    return int(blocks) * CPU_BLOCK_TOKENS if blocks else None


def capped_kv_tokens(overrides: list[str]) -> int | None:
    """The capped KV pool, in tokens, of a stack whose recorded overrides set vLLM's
    ``num_gpu_blocks_override`` (``kv_override_tokens`` of the composed config, from the record)."""
    for o in overrides:
        key, _, value = o.lstrip("+").partition("=")
        if key == "actor_rollout_ref.rollout.engine_kwargs.vllm.num_gpu_blocks_override" and value.strip().isdigit():
            return int(value) * CPU_BLOCK_TOKENS
    return None


def recorded_shape(shape: StepShape, record: dict | None) -> StepShape:
    """``shape`` as its stack ran, from the stack's record (``provenance.stack_record``): a KV pool capped in blocks
    (vLLM's ``num_gpu_blocks_override``: that many tokens, allocated in ``CPU_BLOCK_TOKENS`` blocks) and the update's
    row order (rolloutpipe.micro_batch_order; a record without it predates the knob: arrival, as the trainer was)."""
    record = record or {}
    capped = capped_kv_tokens(record.get("overrides") or [])
    if capped:
        shape = dataclasses.replace(shape, kv_capacity_tokens=capped, kv_block_tokens=CPU_BLOCK_TOKENS)
    order = str((record.get("rolloutpipe") or {}).get("micro_batch_order", "arrival"))
    return dataclasses.replace(shape, update_order=order)


def engine_donors(shapes: dict, stacks: dict | None) -> dict[str, str]:
    """Stack -> the stack whose engine fit it borrows: a stack whose KV pool is capped (vLLM's
    ``num_gpu_blocks_override`` in its recorded overrides) takes the engine of an uncapped stack with the same model
    (``rolloutpipe.tiny_assets.size``) and row shape, when the run has one; the KV-bound runs' own request timings
    cannot calibrate an engine (how many requests run is vLLM's, by free blocks)."""
    def model(stack):
        ovs = (stacks or {}).get(stack, {}).get("overrides") or []
        return next((o.split("=", 1)[1] for o in ovs if o.startswith("rolloutpipe.tiny_assets.size=")), None)

    donors = {}
    for stack, shape in shapes.items():
        if not capped_kv_tokens((stacks or {}).get(stack, {}).get("overrides") or []):
            continue
        for other, osh in shapes.items():
            if (other != stack and model(other) is not None and model(other) == model(stack)
                    and not capped_kv_tokens((stacks or {}).get(other, {}).get("overrides") or [])
                    and (osh.n, osh.micro_rows) == (shape.n, shape.micro_rows)):
                donors[stack] = other
                break
    return donors
