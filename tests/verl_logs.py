"""verl logs for the planner's tests, written by verl's own formatting code with figures the simulator made.

verl 0.9.1's console logger prints each step's metrics with ``concat_dict_to_str``
(``verl/utils/logger/aggregate_logger.py``, ``LocalLogger.log``) and its file logger writes ``{"step": N, "data":
{...}}`` lines (``FileLogger`` in ``verl/utils/tracking.py``). Both are taken from the installed verl's source and
compiled alone (verl's modules import torch at the top). The metrics are those verl's V1 synchronous trainer
(``main_ppo``'s default, colocated) logs per step: ``timing_s/{gen,reward,old_log_prob,ref,adv,update_actor,
update_weights,step}`` (``trainer_base.py`` ``_step_once``, ``trainer_sync.py`` ``on_step_end``),
``response_length/*`` and ``prompt_length/*`` (``metric_utils.compute_data_metrics``), ``perf/*``
(``compute_throughout_metrics``: tokens / (step seconds x GPUs)) and ``global_seqlen/*`` (``_balance_batch``'s
``log_seqlen_unbalance``: per data-parallel rank), with values from ``verl_pipe.sim.colocated`` on a hardware
profile scaled by known factors, so a fit can be checked against them.
"""

from __future__ import annotations

import ast
import importlib.util
import numbers
import os
import pprint
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

VERL = Path(importlib.util.find_spec("verl").submodule_search_locations[0])
VERL_LOGGER = VERL / "utils/logger/aggregate_logger.py"
VERL_TRACKING = VERL / "utils/tracking.py"


def verl_def(path: Path, name: str, namespace: dict):
    """A function or class of verl's source, compiled alone."""
    tree = ast.parse(path.read_text())
    node = next(n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == name)
    exec(compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec"), namespace)
    return namespace[name]


concat_dict_to_str = verl_def(VERL_LOGGER, "concat_dict_to_str", {"numbers": numbers, "pprint": pprint})


def file_logger(path: Path):
    """verl's FileLogger writing to ``path`` (``VERL_FILE_LOGGER_PATH``)."""
    import orjson

    os.environ["VERL_FILE_LOGGER_PATH"] = str(path)
    try:
        cls = verl_def(VERL_TRACKING, "FileLogger", {"os": os, "orjson": orjson})
        return cls("proj", "exp")
    finally:
        del os.environ["VERL_FILE_LOGGER_PATH"]


@dataclass(frozen=True)
class ColocatedRun:
    """A colocated verl run to log: its shape, the profile's costs scaled by known factors, the true colocated
    costs per step and the lengths its steps draw."""

    model: str = "qwen3-1.7b"
    profile: str = "h200"
    gpus: int = 8
    num_groups: int = 32
    n: int = 8
    groups_per_unit: int = 8
    prompt_len: int = 220
    median: float = 900.0
    sigma: float = 0.8
    rho: float = 0.7
    cap: int = 4096
    engine_x: float = 1.4
    trainer_x: float = 1.25
    logprob_ratio: float = 0.3
    sleep_s: float = 0.5  # the profile's (the fit takes it out of timing_s/gen)
    update_weights_s: float = 3.2
    use_ref: bool = False  # a KL loss: verl computes the reference log-prob (timing_s/ref)


def _shape(run: ColocatedRun):
    from tests.test_plan import SHAPE

    return replace(SHAPE, num_groups=run.num_groups, n=run.n, groups_per_unit=run.groups_per_unit,
                   rollout_gpus=run.gpus, train_gpus=run.gpus, max_response_length=run.cap, max_num_seqs=256,
                   gpu_memory_utilization=0.5, use_ref=False, padded=False, dispatch_order="group_major")


def colocated_metrics(run: ColocatedRun = ColocatedRun(), steps: int = 5, *, drop=(), extra=None) -> list[dict]:
    """verl's per-step metrics of a colocated V1 sync run, simulated (``sim.colocated``) on ``run.profile`` scaled by
    ``run.engine_x`` / ``run.trainer_x`` and with its colocated costs. ``drop``: keys left out (a log without them);
    ``extra``: keys added to every step. Step 1 pays a warm-up (its rollout x3), as a real run's does."""
    from verl_pipe.core.workload import lognormal
    from verl_pipe.plan.hardware import MODELS, profile
    from verl_pipe.plan.verl_log import scale_engine
    from verl_pipe.sim.colocated import ColocatedParams, colocated_step
    from verl_pipe.sim.simulate import rollout_for_mode

    shape = _shape(run)
    hw, model = profile(run.profile), MODELS[run.model]
    eng = scale_engine(hw.engine(model, max_num_seqs=shape.max_num_seqs,
                                 max_num_batched_tokens=shape.max_num_batched_tokens,
                                 gpu_memory_utilization=shape.gpu_memory_utilization,
                                 resident_bytes=hw.colocated_resident_bytes(model, run.gpus)), run.engine_x)
    tr = hw.trainer(model, gpus=run.gpus, recompute=shape.recompute,
                    max_tokens_per_microbatch=shape.max_tokens_per_microbatch, use_ref=run.use_ref,
                    placement="device")
    tr = tr.with_(time_scale=run.trainer_x, logprob_ratio=run.logprob_ratio)
    params = ColocatedParams(sleep_s=run.sleep_s, update_weights_s=run.update_weights_s)
    out = []
    for step in range(1, steps + 1):
        wl = lognormal(run.num_groups, run.n, median=run.median, sigma=run.sigma, rho=run.rho, cap=run.cap,
                       prompt_len=run.prompt_len, seed=70 + step)
        ro = rollout_for_mode("sync", wl, eng, run.gpus, run.groups_per_unit, None, "group_major")
        m = colocated_step(ro, wl, tr, run.groups_per_unit, params)
        lp = tr.logprob_s([L for g in range(wl.num_groups) for L in wl.seq_lens(g)])
        ref = lp if run.use_ref else 0.0
        upd = m["train_s"] - lp - ref
        x = np.asarray(wl.lengths, dtype=float)
        tokens = int(x.sum() + x.size * run.prompt_len)
        gen = (m["rollout_end_s"] * (3.0 if step == 1 else 1.0)) + run.sleep_s
        t_step = gen + 0.3 + lp + ref + 0.05 + upd + run.update_weights_s
        per_rank = tokens / run.gpus
        d = {
            "training/global_step": step, "training/epoch": 0, "actor/entropy": 0.58, "actor/pg_loss": -0.004,
            "actor/grad_norm": 0.21, "critic/score/mean": 0.62,
            "response_length/mean": float(x.mean()), "response_length/max": float(x.max()),
            "response_length/min": float(x.min()), "response_length/clip_ratio": float((x >= run.cap).mean()),
            "prompt_length/mean": float(run.prompt_len), "prompt_length/max": float(run.prompt_len),
            "prompt_length/min": float(run.prompt_len), "prompt_length/clip_ratio": 0.0,
            "global_seqlen/min": int(per_rank * 0.99), "global_seqlen/max": int(per_rank * 1.01),
            "global_seqlen/minmax_diff": int(per_rank * 0.02), "global_seqlen/balanced_min": int(per_rank),
            "global_seqlen/balanced_max": int(per_rank) + 1, "global_seqlen/mean": per_rank,
            "timing_s/gen": gen, "timing_s/reward": 0.3, "timing_s/old_log_prob": lp, "timing_s/adv": 0.05,
            **({"timing_s/ref": ref} if run.use_ref else {}),
            "timing_s/update_actor": upd, "timing_s/update_weights": run.update_weights_s, "timing_s/step": t_step,
            "timing_per_token_ms/gen": 1000 * gen / x.sum(),
            "timing_per_token_ms/update_actor": 1000 * upd / tokens,
            "perf/total_num_tokens": tokens, "perf/time_per_step": t_step,
            "perf/throughput": tokens / (t_step * run.gpus),
            "training/num_turns/mean": np.float64(2.0), "training/num_turns/max": np.int64(2),
        }
        for k in drop:
            d.pop(k, None)
        d.update(extra or {})
        out.append(d)
    return out


def console_log(path: Path, metrics: list[dict], prefix: str = "\x1b[36m(TaskRunner pid=4242)\x1b[0m ") -> Path:
    """What ``python -m verl.trainer.main_ppo ... 2>&1 | tee LOG`` leaves: verl's console lines (from a Ray actor,
    coloured) among other output, a validation line at step 0."""
    lines = [f"{prefix}Training Progress:   0%|          | 0/{len(metrics)}",
             f"{prefix}step:0 - val-core/openai/gsm8k/acc/mean@1:np.float64(0.41)"]
    for i, m in enumerate(metrics, 1):
        lines.append(prefix + concat_dict_to_str(m, step=i))
        lines.append(f"{prefix}INFO a line that mentions step:{i} but is not a metric line")
    path.write_text("\n".join(lines) + "\n")
    return path


def file_log(path: Path, metrics: list[dict]) -> Path:
    fl = file_logger(path)
    for i, d in enumerate(metrics, 1):
        fl.log(d, step=i)
    fl.finish()
    return path
