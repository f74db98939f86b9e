"""The stack run: the embedded tiny Qwen3 on the digit-math task, on the real stack (Ray, vLLM, verl's FSDP2 actor),
for a few steps in sync and a few pipelined, then both modes trained on the SAME responses and compared.

One live session (``verl_pipe.launch.session.PipeSession``: one Ray cluster, one vLLM start-up) runs everything. On
CPU the pools are the base config's cores; with --gpu one GPU per pool (trainer 1, rollout 1) and the GPU recipes'
NCCL weight sync. One GPU is not enough: verl's resource pools take whole GPUs per rank and NCCL refuses two ranks on
one device, so both pools cannot share it here; the doctor says so and runs the torch-only checks alone.

The pipelined steps are the default mode (CGP, FGD on) with ``rolloutpipe.cgp.unit_fill=dispatch``: a unit is then
one of sync's mini-batches, so with two units per step it makes sync's optimizer steps (the default ``completion``
fill trains the groups that complete first, other optimizer steps). The exactness check replays one step's
responses in both modes from the same θ_k and optimizer state (``verl_pipe.launch.replay``) and compares old
log-probs, unit gradient norms and parameters within ``TOLERANCES``.
"""

from __future__ import annotations

import math
import tempfile
import time
import traceback
from pathlib import Path

from verl_pipe.core.variants import pipelines
from verl_pipe.doctor.report import Check

GROUP = "stack"
SEND_LOG = "stack.log from the report directory (the stack's own output) and this check's traceback"
# Both pools' overrides of the base config (conf/rolloutpipe_trainer.yaml, the digit-math task): steps driven one by
# one, the random-init base model (no SFT warm-start: minutes the check does not need), 8 prompts x 4 responses per
# step in 2 PPO mini-batches (2 units: the case where the pipelined fill decides the optimizer steps), and the partial-
# credit reward (1 right, 0.25 a wrong number, 0 none), so the random-init model's steps carry a learning signal.
TINY = [
    "trainer.total_training_steps=1000", "rolloutpipe.tiny_assets.task=digit_math",
    "rolloutpipe.tiny_assets.warm_start.steps=0", "trainer.val_before_train=false", "trainer.test_freq=-1",
    "trainer.save_freq=-1", "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4", "actor_rollout_ref.actor.optim.lr=3e-3",
    "reward.custom_reward_function.path=pkg://verl_pipe.recipes.extension_example.reward",
    "reward.custom_reward_function.name=compute_score",
]
# One GPU per pool. The trainer stays fp32 (the base config's: the exactness bounds below are float32 rounding);
# the rollout runs bf16 as the GPU recipes' does (its precision does not enter the comparison: the trainer recomputes
# the old log-probs). Weight sync over NCCL with verl_pipe's recoverable engine, as the GPU recipes.
GPU = [
    "rolloutpipe.platform=gpu", "trainer.device=cuda", "trainer.n_gpus_per_node=1",
    "actor_rollout_ref.rollout.n_gpus_per_node=1", "actor_rollout_ref.rollout.dtype=bfloat16",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.5",
    "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl",
    "actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=verl_pipe.platform.nccl_engine",
    "+actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.nccl.rebuild_group=true",
]
SYNC = {"mode": "sync"}
PIPELINED = {"mode": "cgp", "granularity": "minibatch", "unit_fill": "dispatch"}
# The same bounds as tests/e2e/test_pipeline.py's test_same_responses_same_parameters_in_every_mode (sync vs CGP
# mini-batch): the trainer is fp32 on both platforms, and the two modes compute the same rows' log-probs and gradients
# in differently grouped calls, so sums round in float32 in another order (on a GPU also atomics in the backward).
# bf16 compute would widen the gap (docs/cgp.md).
TOLERANCES = {"old_log_probs": {"atol": 1e-5, "rtol": 1e-5}, "grad_norm_rel": 1e-4,
              "parameters": {"atol": 2e-5, "rtol": 1e-4}}
TOLERANCE_WHY = ("fp32 trainer: the modes group the same rows' log-prob and gradient computations into different "
                 "calls, so sums round in float32 in another order; the bounds of tests/e2e/test_pipeline.py")
TIMING_KEYS = ("step_time_s", "rollout_end_s", "first_unit_ready_s", "trainer_busy_s", "trainer_wait_ratio",
               "weight_sync_s")


def pools(gpu: bool, gpus: int) -> tuple[list[str] | None, str]:
    """(overrides, where the pools run), or (None, why the stack cannot run on these devices)."""
    if not gpu:
        return list(TINY), "CPU: rollout and trainer on the base config's cores (rolloutpipe.cpu)"
    if gpus >= 2:
        return TINY + GPU, f"GPU: trainer on 1 GPU, rollout on 1 GPU ({gpus} visible; the others unused)"
    if gpus == 1:
        return None, ("one GPU: both pools cannot share it on this stack (verl's resource pools take a whole GPU per "
                      "rank, and the NCCL weight sync refuses two ranks on one device); the stack run needs 2 GPUs, "
                      "one per pool. The torch-only checks above ran on this GPU")
    return None, "no GPU visible to torch"


def _step_entry(index: int, rec: dict, wall_s: float) -> dict:
    knobs, tm = rec.get("knobs") or {}, rec.get("timeline") or {}
    timing = {"wall_s": wall_s, **{k: float(tm[k]) for k in TIMING_KEYS if k in tm}}
    return {"step": index, "variant": knobs.get("variant"), "unit_fill": knobs.get("unit_fill"), "timing": timing,
            "knobs": knobs, "trained_groups": list(rec.get("trained_groups") or []),
            "grad_norm": (rec.get("metrics") or {}).get("actor/grad_norm")}


def run_steps(session, knobs: dict, steps: int, first_index: int) -> tuple[list[dict], list[str]]:
    """``steps`` training steps with ``knobs``: their entries and what went wrong (each group trained once)."""
    entries, problems = [], []
    groups = int(session.config.data.train_batch_size)
    for i in range(steps):
        t0 = time.perf_counter()
        rec = session.step(**knobs)
        e = _step_entry(first_index + i, rec, time.perf_counter() - t0)
        entries.append(e)
        if sorted(e["trained_groups"]) != list(range(groups)):
            problems.append(f"step {e['step']} trained groups {e['trained_groups']}, expected each of 0..{groups - 1} once")
        norm = e["grad_norm"]
        if norm is None or not math.isfinite(norm):
            problems.append(f"step {e['step']}: grad norm {norm}")
    return entries, problems


def compare(out: dict) -> tuple[list[str], dict]:
    """What differs between the sync and pipelined runs of one step's responses beyond TOLERANCES, and the figures."""
    import torch

    from verl_pipe.launch.replay import update_deviation

    sync, pipe, theta_k = out["sync"], out["pipelined"], out["theta_k"]
    lp, base_lp = pipe["batch"].batch["old_log_probs"], sync["batch"].batch["old_log_probs"]
    tol = TOLERANCES
    problems = []
    lp_diff = float((lp - base_lp).abs().max())
    if not torch.allclose(lp, base_lp, **tol["old_log_probs"]):
        problems.append(f"old log-probs differ by up to {lp_diff:.2e}")
    norms, base_norms = list(pipe["norms"]), list(sync["norms"])
    if len(norms) != len(base_norms) or any(abs(a - b) > tol["grad_norm_rel"] * abs(b)
                                            for a, b in zip(norms, base_norms)):
        problems.append(f"unit gradient norms {norms} vs sync's {base_norms}")
    params = sync["state"]
    worst = max(float((pipe["state"][k] - params[k]).abs().max()) for k in params)
    off = [k for k in params if not torch.allclose(pipe["state"][k], params[k], **tol["parameters"])]
    if off:
        problems.append(f"{len(off)} parameter tensors differ (e.g. {off[0]}), by up to {worst:.2e}")
    moved = any(not torch.equal(params[k], theta_k[k]) for k in params)
    figures = {"old_log_prob_max_abs_diff": lp_diff, "grad_norms": {"sync": base_norms, "pipelined": norms},
               "parameter_max_abs_diff": worst, "units": len(base_norms), "groups": len(out["groups"]),
               "update_deviation": update_deviation(pipe["state"], params, theta_k) if moved else None}
    if not moved:
        problems.append("inconclusive: sync's update did not move the parameters (no learning signal in the step)")
    elif len(base_norms) < 2:
        problems.append(f"inconclusive: {len(base_norms)} unit per step; the check needs 2 (the fill decides nothing)")
    return problems, figures


def exactness(session, workdir: Path) -> tuple[list[str], dict]:
    from verl_pipe.launch.replay import prefilled_queue, train_same_responses, trainer_in

    trainer = session.trainer

    def runs(groups, version):
        return [("sync", trainer_in(trainer, "sync", "minibatch"), prefilled_queue(groups, version)),
                ("pipelined", trainer_in(trainer, PIPELINED["mode"], PIPELINED["granularity"],
                                         unit_fill=PIPELINED["unit_fill"]), prefilled_queue(groups, version))]

    return compare(train_same_responses(session, workdir, runs))


class _Stages:
    """Runs the stages in order; after a failure the rest are reported as not run."""

    def __init__(self):
        self.checks: list[Check] = []
        self.failed: str | None = None

    def run(self, name: str, fn, progress) -> object:
        if self.failed:
            self.checks.append(Check(name, GROUP, "skip", f"not run: {self.failed} failed"))
            return None
        progress(f"stack: {name} ...")
        t0 = time.perf_counter()
        try:
            status, detail, data, value = fn()
        except BaseException as e:  # noqa: BLE001 -- a failure of the stack is the finding; KeyboardInterrupt too
            if isinstance(e, KeyboardInterrupt):
                raise
            status, detail, data, value = "fail", f"{type(e).__name__}: {e}", {"traceback": traceback.format_exc()}, None
        seconds = time.perf_counter() - t0
        self.checks.append(Check(name, GROUP, status, detail, data, send_back=SEND_LOG if status == "fail" else None,
                                 seconds=seconds))
        progress(f"stack: {name}: {status} ({seconds:.1f} s)")
        if status == "fail":
            self.failed = name
        return value


def run_stack(gpu: bool, gpus: int, steps: int = 2, progress=print) -> tuple[list[Check], dict]:
    """The stack run's checks and phases (seconds)."""
    overrides, where = pools(gpu, gpus)
    if overrides is None:
        names = ("stack start-up", f"{steps} steps sync", f"{steps} steps pipelined", "exactness on the same responses")
        return [Check(n, GROUP, "skip", where) for n in names], {"pools": where}
    # The run's checkpoints (the exactness check's θ_k and optimizer state) stay out of the report directory.
    scratch = tempfile.TemporaryDirectory(prefix="verl_pipe_doctor_")
    work = Path(scratch.name)
    overrides.append(f"trainer.default_local_dir={work / 'checkpoints'}")
    phases: dict = {"pools": where, "overrides": overrides}
    stages, holder = _Stages(), {}

    def start():
        from verl_pipe.launch.session import PipeSession, compose
        from verl_pipe.launch.ray_start import select_platform

        cfg = compose(overrides)
        select_platform(cfg)  # the platform's environment before anything imports verl (also the GPU preflight)
        holder["session"] = s = PipeSession(cfg)
        phases["startup_s"] = s.startup_s
        return "pass", f"{where}; Ray, vLLM and the verl workers up in {s.startup_s:.1f} s", {}, s

    def steps_in(knobs, first):
        def fn():
            entries, problems = run_steps(holder["session"], knobs, steps, first)
            phases.setdefault("steps", []).extend(entries)
            walls = ", ".join(f"{e['timing']['wall_s']:.1f}" for e in entries)
            fill = f", unit_fill={entries[0]['unit_fill']}" if pipelines(knobs["mode"]) else ""
            detail = f"{entries[0]['variant']}{fill}: {steps} steps of {walls} s"
            return ("fail" if problems else "pass", detail + ("; " + "; ".join(problems) if problems else ""),
                    {"steps": [e["step"] for e in entries]}, None)
        return fn

    def exact():
        t0 = time.perf_counter()
        problems, figures = exactness(holder["session"], work)
        phases["exactness_s"] = time.perf_counter() - t0
        data = {**figures, "tolerances": TOLERANCES, "why_tolerances": TOLERANCE_WHY, "pipelined": dict(PIPELINED)}
        detail = (f"sync vs pipelined (cgp, unit_fill={PIPELINED['unit_fill']}) on one step's {figures['groups']} "
                  f"groups, {figures['units']} units: max |Δ old log-prob| {figures['old_log_prob_max_abs_diff']:.1e}, "
                  f"max |Δ parameter| {figures['parameter_max_abs_diff']:.1e}")
        return ("fail" if problems else "pass", detail + ("; " + "; ".join(problems) if problems else ""), data, None)

    try:
        stages.run("stack start-up", start, progress)
        stages.run(f"{steps} steps sync", steps_in(SYNC, 1), progress)
        stages.run(f"{steps} steps pipelined", steps_in(PIPELINED, steps + 1), progress)
        stages.run("exactness on the same responses", exact, progress)
    finally:
        if "session" in holder:
            t0 = time.perf_counter()
            try:
                holder["session"].close()
            except Exception as e:  # noqa: BLE001 -- reported; the checks above stand
                stages.checks.append(Check("stack teardown", GROUP, "warn", f"{type(e).__name__}: {e}"))
            phases["teardown_s"] = time.perf_counter() - t0
        scratch.cleanup()
    return stages.checks, phases
