"""The colocated model (``verl_pipe.sim.colocated``) against measured colocated steps: verl's V1 sync trainer run
colocated by the bench's peer (``python -m verl_pipe_lab.bench.peer``, configuration ``colocated``: verl's main_ppo
default on every core), each step recorded with its lengths, its trainer spans, its phases (the engines' ``sleep``
after the rollout, the in-process ``weight_reload`` at the step's end) and its measured step time.

The model is fitted as verl's separate_async peer is (docs/plan.md, Calibrating on a real run): verl's trainer on
its own spans (``calibrate.fit_verl_trainer``), the engine's speed as one scale on a base engine so that the
simulated rollouts of the steps' own lengths end when the measured ones did, the sleep and the reload as measured.
Each step is then predicted by a fit on the *other* steps (``check``: held out by round where the records carry one,
else leave-one-out), and its step time compared with the measured one.

    python -m verl_pipe.plan.colocated_check docs/bench/FILE_steps_DATE.json.gz [--replicas 1]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from verl_pipe.core.workload import Workload
from verl_pipe.sim.colocated import ColocatedParams, colocated_step
from verl_pipe.sim.engine import CPU_TINY, EngineParams
from verl_pipe.sim.trainer import TrainerParams

MODE = "verl_colocated"
KV_UNBOUNDED = 1 << 40


def colocated_records(path) -> list[dict]:
    """The measured colocated steps of a bench steps file or a peer ``--out`` JSON (warm-up steps left out)."""
    from verl_pipe.plan.calibrate import read_json

    d = read_json(Path(path))
    steps = d.get("steps") if isinstance(d, dict) else None
    if not isinstance(steps, list):
        raise ValueError(f"{path}: not a bench steps file or a peer output (no 'steps' list)")
    shapes = d.get("shapes") or {}
    return [dict(r, stack_shape=shapes.get(r.get("model_size"), {})) for r in steps
            if r.get("mode", d.get("mode")) == MODE and not r.get("warmup")]


def _phase(rec: dict, name: str) -> float:
    return float(sum(p["end"] - p["start"] for p in rec.get("phases", []) if p["phase"] == name))


def _prompt(rec: dict) -> float:
    p = rec.get("prompt_len") or (rec.get("verl_metrics") or {}).get("prompt_length/mean")
    if not p:
        raise ValueError(f"colocated step {rec.get('step')}: no prompt_len / verl_metrics prompt_length/mean")
    return float(p)


def measured_step_s(rec: dict) -> float:
    """The step as verl's loop runs it: its batch's submission to the end of the weight reload (``step_time_s``
    of the step's timeline), else verl's own wall time of the step."""
    m = rec["metrics"]
    return float(m.get("step_time_s") or m["step_wall_s"])


def _workload(rec: dict, n: int | None = None) -> Workload:
    from verl_pipe.sim.calib import PaddedWorkload

    g = [list(map(int, x)) for x in rec["lengths"] if x]
    return PaddedWorkload(len(g), n or max(len(x) for x in g), g, int(round(_prompt(rec))))


@dataclass
class ColocatedFit:
    engine: EngineParams
    trainer: TrainerParams
    params: ColocatedParams
    replicas: int
    groups_per_unit: int
    engine_scale: float
    steps: int

    def predict(self, rec: dict) -> dict:
        from verl_pipe.sim.simulate import rollout_for_mode

        wl = _workload(rec)
        ro = rollout_for_mode("sync", wl, self.engine, self.replicas, self.groups_per_unit, None)
        return colocated_step(ro, wl, self.trainer, self.groups_per_unit, self.params)


def fit(records: list[dict], *, replicas: int = 1, groups_per_unit: int | None = None,
        base: EngineParams | None = None, max_num_seqs: int | None = None) -> ColocatedFit:
    """The colocated model fitted on ``records`` (verl's trainer on their spans, one engine scale on ``base``, the
    measured sleep and reload)."""
    from verl_pipe.plan.calibrate import fit_verl_trainer
    from verl_pipe.plan.verl_log import scale_engine
    from verl_pipe.sim.simulate import rollout_for_mode

    if not records:
        raise ValueError("no colocated steps to fit")
    stack = records[0].get("stack_shape") or {}  # a bench steps file's shape of the stack (its engine slots, units)
    gpu = groups_per_unit or int(records[0].get("groups_per_unit") or stack.get("groups_per_unit")
                                 or max(1, len(records[0]["lengths"])))
    max_num_seqs = max_num_seqs or stack.get("max_num_seqs")
    peer = [{"train_spans": r["train_spans"], "lengths": r["lengths"], "prompt_len": _prompt(r),
             "metrics": r["metrics"], "step": r.get("step")} for r in records]
    trainer = fit_verl_trainer(peer).params
    base = base or CPU_TINY
    base = base.with_(kv_capacity_tokens=KV_UNBOUNDED, max_num_seqs=max_num_seqs or base.max_num_seqs)
    sim = [rollout_for_mode("sync", _workload(r), base, replicas, gpu, None).rollout_end for r in records]
    meas = [float(r["metrics"]["rollout_end_s"]) for r in records]
    scale = float(np.sum(meas) / np.sum(sim))
    params = ColocatedParams(sleep_s=float(np.mean([_phase(r, "sleep") for r in records])),
                             update_weights_s=float(np.mean([_phase(r, "weight_reload") for r in records])))
    return ColocatedFit(scale_engine(base, scale), trainer, params, replicas, gpu, scale, len(records))


def check(records: list[dict], **kw) -> dict:
    """Each step predicted by a fit on the others of its setting (held out by ``round`` where the records carry
    rounds, else one step at a time): measured vs predicted step time, per step and the largest relative error, and
    the run's step time (the mean over its steps, what the planner predicts) as ``run_rel_error`` per setting
    (the largest)."""
    settings = sorted({str(r.get("setting")) for r in records})
    if len(settings) > 1:
        parts = [check([r for r in records if str(r.get("setting")) == k], **kw) for k in settings]
        rows = [x for p in parts for x in p["rows"]]
        errs = [abs(x["rel_error"]) for x in rows]
        return {"rows": rows, "max_abs_rel_error": max(errs), "mean_abs_rel_error": float(np.mean(errs)),
                "run_rel_error": max((p["run_rel_error"] for p in parts), key=abs),
                "held_out": ", ".join(sorted({p["held_out"] for p in parts})) + " (per setting)"}
    rounds = sorted({r.get("round") for r in records if r.get("round") is not None})
    groups = ([[r for r in records if r.get("round") == k] for k in rounds] if len(rounds) > 1
              else [[r] for r in records])
    rows = []
    for held in groups:
        rest = [r for r in records if not any(r is h for h in held)]
        f = fit(rest or records, **kw)
        for r in held:
            pred = f.predict(r)["step_time_s"]
            meas = measured_step_s(r)
            rows.append({"step": r.get("step"), "round": r.get("round"), "setting": r.get("setting"),
                         "measured_s": meas, "predicted_s": pred, "rel_error": pred / meas - 1})
    errs = [abs(x["rel_error"]) for x in rows]
    how = "round" if len(rounds) > 1 else "step" if len(records) > 1 else "in-sample (one step: fitted on itself)"
    run = sum(x["predicted_s"] for x in rows) / sum(x["measured_s"] for x in rows) - 1
    return {"rows": rows, "max_abs_rel_error": max(errs), "mean_abs_rel_error": float(np.mean(errs)),
            "run_rel_error": run, "held_out": how}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m verl_pipe.plan.colocated_check", description=__doc__.split("\n\n")[0])
    ap.add_argument("file", help="a bench steps file or a peer --out JSON with verl_colocated steps")
    ap.add_argument("--replicas", type=int, default=1, help="the colocated run's engine replicas (default 1)")
    args = ap.parse_args(argv)
    recs = colocated_records(args.file)
    if not recs:
        print(f"{args.file}: no {MODE} steps")
        return 2
    got = check(recs, replicas=args.replicas)
    print(json.dumps(got, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


# verl's fully_async_policy README (verl-project/verl, verl/experimental/fully_async_policy/README_zh.md, the 7B
# table; source data wandb.ai/hou-zg-meituan/fully-async-policy-colocate_async): colocate sync, Qwen2.5-Math-7B,
# H20, DAPO, 512 prompts x 16, 28k responses, vLLM + FSDP2; mean seconds per step over 400 steps.
PUBLIC_COLOCATED = (  # GPUs, step, gen, old_log_prob, update_actor
    (32, 790.10, 357.41, 107.71, 313.81),
    (64, 365.28, 150.72, 70.26, 133.41),
    (128, 356.30, 177.85, 53.92, 113.81),
)


def public_check(update_weights_s: float) -> list[dict]:
    """The colocated model's step from each published row's own phases (``gen`` holds the rollout and the sleep,
    verl's timer) and the model's weight reload: what it checks is the size of the transition outside the phases
    (the published residual also holds the reward and advantages) and that it does not grow with the GPU count."""
    rows = []
    for gpus, step, gen, lp, upd in PUBLIC_COLOCATED:
        pred = gen + lp + upd + update_weights_s
        rows.append({"gpus": gpus, "published_step_s": step, "residual_s": step - gen - lp - upd,
                     "predicted_step_s": pred, "rel_error": pred / step - 1})
    return rows
