"""The calibrated simulator on a bench config's settings, per FGD admission window: where does FGD cost, where pay?

    python -m verl_pipe_lab.bench.sim_windows --config lab/verl_pipe_lab/bench/conf/paper_tiny.yaml \
        --calibration docs/bench/bench_paper_tiny_2026-12-01.json [--calibrate-as queue_tiny=paper_tiny] \
        [--windows adaptive,null,auto] [--client-s 0,0.004] [--out FILE.json]

Pure Python (Hydra's compose for the stacks' shapes, the simulator; no Ray, no vLLM). Each setting's stack gives
the step's shape (prompts, n, unit size, max_num_seqs, the KV pool); a bench JSON's ``sim_validation.calibration``
gives the engine (alone for sync, beside a busy trainer for the pipelined modes) and trainer costs fitted on real
runs of that model size. Every mode runs on the same workloads (the setting's, seeds ``seed + round``): sync, cgp,
and cgp_fgd once per window, all at minibatch granularity so that only the admission differs. ``--client-s`` adds
a driver that costs that much per request (``sim.simulate.simulate_rollout``): the calibrated engines were fitted
with the driver's delays inside them, this shows what a window does when refills go through a busy driver.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from verl_pipe.core.timeline import summarize
from verl_pipe.core.variants import PIPELINED_BASE
from verl_pipe.sim.calib import StepShape, simulate_like
from verl_pipe.sim.records import CPU_BLOCK_TOKENS, engine_from_summary, kv_override_tokens, trainer_from_summary

FIGURES = ("rollout_to_train_end_s", "rollout_end_s", "first_unit_ready_s", "trainer_wait_ratio")


def stack_shape(cfg: dict, stack: str, kv_tokens_per_gib: int) -> tuple[StepShape, int]:
    """The step's shape on a bench stack and its number of prompts, from the Hydra config its overrides compose to."""
    from verl_pipe_lab.bench.settings import stack_overrides
    from verl_pipe.launch.session import compose

    c = compose(stack_overrides(cfg, stack))
    roll = c.actor_rollout_ref.rollout
    capped = kv_override_tokens(roll)
    kv = capped or int(c.rolloutpipe.cpu.kv_cache_gib) * kv_tokens_per_gib
    workers = int(roll.agent.num_workers)  # the trainer's stock order (trainer._verl_dispatch_order)
    order = c.rolloutpipe.dispatch.order or (f"interleave:{workers}" if workers > 1 else "group_major")
    shape = StepShape(n=int(roll.n), groups_per_unit=int(c.actor_rollout_ref.actor.ppo_mini_batch_size),
                      micro_rows=int(c.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu),
                      max_num_seqs=int(roll.max_num_seqs), max_num_batched_tokens=int(roll.max_num_batched_tokens),
                      kv_capacity_tokens=kv, baseline_order=str(order), baseline_window=c.rolloutpipe.dispatch.window,
                      fgd_window=c.rolloutpipe.fgd.get("window"), kv_block_tokens=CPU_BLOCK_TOKENS if capped else 1)
    return shape, int(c.data.train_batch_size)


def _window(name: str):
    return None if name in ("null", "none") else int(name) if name.isdigit() else name


def simulate_setting(setting: dict, shape: StepShape, num_groups: int, calibration: dict, windows: list[str],
                     rounds: int, seed: int, prompt_len: float, client_s: float = 0.0) -> dict:
    """Mean figures per mode over ``rounds`` workloads: sync, cgp, ``cgp_fgd[<window>]`` per window."""
    from verl_pipe_lab.bench.settings import workload_for
    from verl_pipe.core.frontier import resolve_window

    alone = engine_from_summary(calibration["engine_alone"], shape)
    overlapped = engine_from_summary(calibration["engine_overlapped"], shape)
    trainer = trainer_from_summary(calibration["trainer"])
    runs: dict[str, list[dict]] = {}
    for r in range(rounds):
        wl = workload_for(setting["workload"], num_groups, shape.n, seed=seed + r)
        step = {"lengths": wl.lengths, "prompt_len": prompt_len, "weight_sync_s": 0.0}
        for mode, engine in (("sync", alone), ("cgp", overlapped)):
            runs.setdefault(mode, []).append(simulate_like(step, mode, "minibatch", engine, trainer, shape,
                                                           client_s_per_request=client_s))
        for w in windows:
            win = _window(w)
            # null is max_num_seqs, as the trainer resolves it (the simulator's None would be "no window")
            win = resolve_window(None, shape.groups_per_unit, shape.n, shape.max_num_seqs) if win is None else win
            runs.setdefault(f"cgp_fgd[{w}]", []).append(simulate_like(
                dict(step, fgd_window=win), "cgp_fgd", "minibatch", overlapped, trainer, shape,
                client_s_per_request=client_s))
    modes = {m: {k: summarize(ms)[k] for k in FIGURES} for m, ms in runs.items()}
    cgp = modes["cgp"]["rollout_to_train_end_s"]
    for e in modes.values():
        e["vs_cgp_pct"] = 100.0 * (e["rollout_to_train_end_s"] / cgp - 1.0)  # positive: slower than cgp
    return modes


def study(cfg: dict, calibrations: dict, calibrate_as: dict[str, str], windows: list[str], client_costs: list[float],
          prompt_len: float, kv_tokens_per_gib: dict[str, int]) -> list[dict]:
    from verl_pipe_lab.bench.settings import stack_of

    rows = []
    for s in cfg["settings"]:
        stack = stack_of(s, cfg)
        size = calibrate_as.get(stack, stack)
        if size not in calibrations:
            raise ValueError(f"setting {s['name']}: no calibration for {size!r} (have {sorted(calibrations)}); "
                             f"borrow one with --calibrate-as {stack}=<size>")
        if s.get("fgd_window") is not None:  # a window sweep's setting: the study sweeps the windows itself
            continue
        shape, num_groups = stack_shape(cfg, stack, kv_tokens_per_gib[size])
        rounds = min(int(cfg.get("repeats", 1)), int(s.get("repeats", cfg.get("repeats", 1)))) or 1
        for c in client_costs:
            modes = simulate_setting(s, shape, num_groups, calibrations[size], windows, max(rounds, 3),
                                     int(cfg.get("seed", 0)), prompt_len, c)
            rows.append({"setting": s["name"], "stack": stack, "calibration": size, "client_s_per_request": c,
                         "max_num_seqs": shape.max_num_seqs, "kv_capacity_tokens": shape.kv_capacity_tokens,
                         "baseline_order": shape.baseline_order,
                         "requests": num_groups * shape.n, "modes": modes})
    return rows


def format_rows(rows: list[dict]) -> str:
    lines = ["== simulated (calibrated): rollout→train end s (vs cgp), rollout end s, first unit ready s"]
    for r in rows:
        lines.append(f"{r['setting']} [{r['stack']}: {r['requests']} requests, max_num_seqs {r['max_num_seqs']}, "
                     f"KV {r['kv_capacity_tokens']} tokens, stock order {r['baseline_order']}; driver "
                     f"{1000 * r['client_s_per_request']:g} ms/request]")
        for m, e in r["modes"].items():
            vs = "" if m == PIPELINED_BASE else f" ({e['vs_cgp_pct']:+.1f}%)"
            lines.append(f"  {m:<22} r2t {e['rollout_to_train_end_s']:7.2f}{vs:<10} rollout {e['rollout_end_s']:6.2f}"
                         f"  1st unit {e['first_unit_ready_s']:6.2f}")
    return "\n".join(lines)


def load_calibrations(paths: list[str]) -> tuple[dict, dict, float]:
    """{size: calibration summary}, {size: KV tokens per GiB of kv_cache_gib}, mean measured prompt length."""
    cals, per_gib, prompts = {}, {}, []
    for p in paths:
        with open(p) as f:
            d = json.load(f)
        for size, cal in d["sim_validation"]["calibration"].items():
            cals[size] = cal
            # the bench ran with the default kv_cache_gib (1): its shape's KV tokens are one GiB's worth
            per_gib[size] = int(d["config"]["shapes"][size]["kv_capacity_tokens"])
        prompts += [s["prompt_len_mean"] for s in d["settings"] if s.get("prompt_len_mean")]
    return cals, per_gib, (sum(prompts) / len(prompts) if prompts else 32.0)


def main(argv=None) -> int:
    from verl_pipe_lab.bench.settings import load_config

    ap = argparse.ArgumentParser(prog="python -m verl_pipe_lab.bench.sim_windows", description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True, help="a bench YAML (lab/verl_pipe_lab/bench/conf/*.yaml)")
    ap.add_argument("--calibration", required=True, action="append", help="a bench results JSON (docs/bench/*.json)")
    ap.add_argument("--calibrate-as", action="append", default=[], metavar="STACK=SIZE",
                    help="simulate STACK with the calibration of SIZE (a stack the JSONs did not measure)")
    ap.add_argument("--windows", default="adaptive,null,auto", help="FGD windows, comma-separated")
    ap.add_argument("--client-s", default="0", help="driver seconds per request, comma-separated")
    ap.add_argument("--out", help="write the rows as JSON here")
    args = ap.parse_args(argv)
    cals, per_gib, prompt_len = load_calibrations(args.calibration)
    rows = study(load_config(args.config), cals, dict(a.split("=", 1) for a in args.calibrate_as),
                 [w.strip() for w in args.windows.split(",") if w.strip()],
                 [float(x) for x in args.client_s.split(",")], prompt_len, per_gib)
    print(format_rows(rows))
    if args.out:
        write_rows(args.out, args.config, args.calibration, prompt_len, rows)
    return 0


def write_rows(path: str, config: str, calibrations: list[str], prompt_len: float, rows: list[dict]) -> None:
    """A study's rows as JSON with the config and calibrations they came from (NaN as null)."""
    with open(path, "w") as f:
        json.dump({"config": config, "calibrations": calibrations, "prompt_len": prompt_len, "rows": rows}, f,
                  indent=1, default=lambda x: None if isinstance(x, float) and math.isnan(x) else str(x))


if __name__ == "__main__":
    raise SystemExit(main())
