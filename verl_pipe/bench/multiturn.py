"""The multi-turn bench: sync, CGP and CGP+FGD on the same multi-turn work (turns x tool latency x length), on one
live stack of the multi-turn recipe, and the simulator's prediction of each measured step.

    python -m verl_pipe.bench.multiturn --out mt.json [--config conf/bench/multiturn.yaml] [--repeats R]

The setting (``conf/bench/multiturn.yaml``) carries its work in ``rolloutpipe.multiturn`` with ``turn_tokens`` set:
the toy environment's episodes are a function of (seed, task, sample), so every mode given the same prompts gets the
same turns, tool latencies and forced turn lengths (``rolloutpipe.workload``, the single-turn bench's lengths, cannot
be combined with the multi-turn loop). Round r draws one batch of prompts, sets ``rolloutpipe.multiturn.seed`` to
``seed + r`` and runs every mode on that batch, interleaved on the same workers. verl's separate_async peer is not run:
its agent loop does not know a trajectory's sample index (``verl_pipe.rollout.multiturn.sample_index`` is 0 without
our admission), so its n samples of a prompt would all replay sample 0's episode: other work than ours.

The simulator (``verl_pipe.sim``, episodes from the same environment config and the round's task keys, the engine's
``cpu_tiny`` calibration, prompt and tool-message lengths as measured) predicts each step's rollout end and first unit
ready; the JSON has its error per step and mode. It does not predict the trainer side here (no trainer calibration for
this stack), so ``rollout_to_train_end_s`` is measured only.

The live part needs Ray, vLLM and the tiny assets; ``load``, ``compose_config`` and ``summarize`` are pure.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import yaml

from verl_pipe.conf import ROOT as _CONF_ROOT

CONFIG = _CONF_ROOT / "bench" / "multiturn.yaml"
MODES = ("sync", "cgp", "cgp_fgd")
KEYS = {"recipe", "overrides", "multiturn", "modes", "repeats", "warmup_steps", "seed", "peers"}
FIGURES = ("rollout_to_train_end_s", "first_unit_ready_s", "rollout_end_s", "trainer_busy_s", "trainer_wait_ratio",
           "step_time_s", "pipeline_efficiency")


def load(path: str | Path = CONFIG) -> dict:
    """The bench YAML, checked: its keys, its modes, forced turn lengths (the same work in every mode)."""
    from verl_pipe.assets.multiturn_env import EnvConfig

    with open(path) as f:
        cfg = yaml.safe_load(f)
    unknown = set(cfg) - KEYS
    if unknown:
        raise ValueError(f"{path}: unknown keys {sorted(unknown)} (allowed: {sorted(KEYS)})")
    bad = set(cfg.get("modes") or []) - set(MODES)
    if bad or not cfg.get("modes"):
        raise ValueError(f"{path}: modes must be a non-empty subset of {list(MODES)}, got {cfg.get('modes')}")
    if "sync" not in cfg["modes"]:
        raise ValueError(f"{path}: modes must include sync (the baseline every figure is compared with)")
    if cfg.get("peers"):
        raise ValueError(f"{path}: peers {cfg['peers']}: verl's separate_async cannot run the same multi-turn work "
                         "(its agent loop has no sample index: every sample would replay sample 0's episode)")
    env = EnvConfig.from_dict(cfg.get("multiturn"))
    if env.turn_tokens is None:
        raise ValueError(f"{path}: multiturn.turn_tokens must be set (forced turn lengths: the same work in every "
                         "mode)")
    for key in ("repeats", "warmup_steps", "seed"):
        if not isinstance(cfg.get(key, 0), int) or cfg.get(key, 0) < 0:
            raise ValueError(f"{path}: {key} must be an int >= 0, got {cfg.get(key)!r}")
    return cfg


def compose_config(cfg: dict, extra: list[str] = ()):
    """The live stack's config: the recipe with the bench's overrides and its ``multiturn`` node."""
    from omegaconf import OmegaConf, open_dict

    from verl_pipe.session import compose

    c = compose(list(cfg.get("overrides") or []) + list(extra), config_name=cfg["recipe"])
    with open_dict(c):
        c.rolloutpipe.multiturn = OmegaConf.create(cfg["multiturn"])
    return c


# ---------------------------------------------------------------------------------------------- live


def _set_seed(session, seed: int) -> None:
    from omegaconf import open_dict

    with open_dict(session.trainer.config):  # the agent loop reads it per trajectory
        session.trainer.config.rolloutpipe.multiturn.seed = seed


def _tasks(batch_dict) -> list[str]:
    from verl_pipe.rollout.multiturn import task_key

    return [task_key({"index": batch_dict["index"][g], "extra_info": batch_dict["extra_info"][g]})
            for g in range(len(batch_dict["index"]))]


def _tool_tokens(batch) -> float:
    """Mean tokens of a tool message in the trained batch: the masked tokens between two model runs."""
    mask = batch.batch["response_mask"].long()
    resp_len = batch.batch["attention_mask"][:, -mask.shape[1]:].sum(-1)
    masked = (resp_len - mask.sum(-1)).sum().item()
    starts = ((mask[:, 1:] == 1) & (mask[:, :-1] == 0)).sum().item()  # a model run after a tool message
    return float(masked / starts) if starts else 0.0


def _step(session, mode: str, batch_dict, r: int) -> dict:
    from verl_pipe.bench.run import mode_kwargs

    t = time.perf_counter()
    rec = session.step(**mode_kwargs(mode), batch_dict=copy.deepcopy(batch_dict))
    wall = time.perf_counter() - t
    batch = session.trainer.last_outcome.batch
    mt = {k.split("/", 2)[2]: v for k, v in rec["metrics"].items() if k.startswith("rolloutpipe/multiturn/")}
    return {"round": r, "mode": mode, "wall_s": wall, "timeline": {k: rec["timeline"][k] for k in FIGURES},
            "multiturn": mt, "prompt_len": float(rec["metrics"].get("prompt_length/mean", 0.0)),
            "tool_tokens": _tool_tokens(batch), "fgd_window": rec.get("knobs", {}).get("fgd_window"),
            "trained_groups": len(rec.get("trained_groups", []))}


def run_live(cfg: dict, repeats: int, log=print) -> dict:
    import tempfile

    from verl_pipe.session import PipeSession

    ckpt = tempfile.mkdtemp(prefix="verl_pipe_mt_bench_")
    t0 = time.perf_counter()
    session = PipeSession(compose_config(cfg, [f"trainer.default_local_dir={ckpt}"]))
    startup = time.perf_counter() - t0
    log(f"[mt-bench] stack up in {startup:.1f}s")
    steps, rounds = [], []
    try:
        for _ in range(int(cfg.get("warmup_steps", 1))):
            _set_seed(session, 10_000)
            w = _step(session, "sync", next(session._batches), -1)
            log(f"[mt-bench] warm-up step (discarded): {w['wall_s']:.1f}s")
        shape = _shape(session)
        for r in range(repeats):
            batch_dict = next(session._batches)
            seed = int(cfg.get("seed", 0)) + r
            _set_seed(session, seed)
            rounds.append({"round": r, "seed": seed, "tasks": _tasks(batch_dict)})
            for mode in cfg["modes"]:
                st = _step(session, mode, batch_dict, r)
                steps.append(st)
                tl = st["timeline"]
                log(f"[mt-bench] round {r} {mode:<8} rollout→train_end {tl['rollout_to_train_end_s']:6.2f}s "
                    f"first unit {tl['first_unit_ready_s']:5.2f}s rollout {tl['rollout_end_s']:5.2f}s "
                    f"train {tl['trainer_busy_s']:5.2f}s turns {st['multiturn'].get('turns_mean', 0):.2f}")
    finally:
        session.close()
    return {"startup_s": startup, "shape": shape, "rounds": rounds, "steps": steps}


def _shape(session) -> dict:
    c = session.config
    roll = c.actor_rollout_ref.rollout
    return {"n": int(roll.n), "prompts": int(c.data.train_batch_size),
            "groups_per_unit": int(c.actor_rollout_ref.actor.ppo_mini_batch_size),
            "max_num_seqs": int(roll.max_num_seqs), "max_response_length": int(c.data.max_response_length),
            "replicas": max(1, int(roll.nnodes) * int(roll.n_gpus_per_node) // int(roll.tensor_model_parallel_size)),
            **{k: v for k, v in session.trainer.configured_knobs.record().items()
               if k in ("baseline_order", "baseline_window", "fgd_window")}}


# ---------------------------------------------------------------------------------------------- analysis


def simulate_steps(cfg: dict, live: dict) -> list[dict]:
    """The simulator's rollout end and first unit ready for each measured step (its round's tasks and seed)."""
    from verl_pipe.assets.multiturn_env import EnvConfig
    from verl_pipe.sim.engine import CPU_TINY
    from verl_pipe.sim.simulate import rollout_for_mode
    from verl_pipe.sim.turns import from_env

    shape = live["shape"]
    engine = CPU_TINY.with_(max_num_seqs=shape["max_num_seqs"])
    out = []
    for st in live["steps"]:
        rnd = live["rounds"][st["round"]]
        env = EnvConfig.from_dict({**cfg["multiturn"], "seed": rnd["seed"]})
        eps = from_env(env, len(rnd["tasks"]), shape["n"], response_length=shape["max_response_length"],
                       tool_tokens=round(st["tool_tokens"]), task=lambda g: rnd["tasks"][g])
        wl = eps.workload(prompt_len=round(st["prompt_len"]))
        fgd = st["mode"] == "cgp_fgd"
        window = shape.get("fgd_window" if fgd else "baseline_window")
        res = rollout_for_mode(st["mode"], wl, engine, shape["replicas"], shape["groups_per_unit"], window,
                               order=shape.get("baseline_order") or "group_major", episodes=eps)
        gpu = shape["groups_per_unit"]
        sim = {"rollout_end_s": res.rollout_end,
               "first_unit_ready_s": res.completions[gpu - 1][0] if len(res.completions) >= gpu else None}
        err = {k: (v - st["timeline"][k]) / st["timeline"][k] for k, v in sim.items()
               if v is not None and st["timeline"][k] > 0}
        out.append({"round": st["round"], "mode": st["mode"], "sim": sim, "rel_error": err})
    return out


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def summarize(steps: list[dict], sims: list[dict] | None = None) -> dict:
    """Per mode: the mean of each figure over rounds; per pipelined mode its change vs sync (relative, same rounds);
    FGD's effect (cgp_fgd vs cgp) on first unit ready and rollout→train end; the simulator's mean and max |error|."""
    modes = list(dict.fromkeys(st["mode"] for st in steps))
    by = {(st["mode"], st["round"]): st["timeline"] for st in steps}
    rounds = sorted({st["round"] for st in steps})
    per_mode = {m: {k: _mean([by[(m, r)][k] for r in rounds if (m, r) in by]) for k in FIGURES} for m in modes}

    def change(a: str, b: str, key: str):
        pairs = [(by[(a, r)][key], by[(b, r)][key]) for r in rounds if (a, r) in by and (b, r) in by]
        return _mean([(x - y) / y for x, y in pairs if y > 0]) if pairs else None

    out = {"modes": per_mode,
           "vs_sync": {m: {k: change(m, "sync", k) for k in ("rollout_to_train_end_s", "first_unit_ready_s",
                                                               "trainer_wait_ratio")} for m in modes if m != "sync"}}
    if "cgp" in modes and "cgp_fgd" in modes:
        out["fgd_vs_cgp"] = {k: change("cgp_fgd", "cgp", k) for k in ("first_unit_ready_s", "rollout_to_train_end_s",
                                                                       "rollout_end_s")}
    if sims:
        errs = {}
        for s in sims:
            for k, e in s["rel_error"].items():
                errs.setdefault(s["mode"], {}).setdefault(k, []).append(abs(e))
        out["sim_abs_rel_error"] = {m: {k: {"mean": _mean(v), "max": max(v)} for k, v in d.items()}
                                    for m, d in errs.items()}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m verl_pipe.bench.multiturn", description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(CONFIG))
    ap.add_argument("--repeats", type=int, help="rounds (default: the config's)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    cfg = load(args.config)
    repeats = args.repeats if args.repeats is not None else int(cfg.get("repeats", 1))
    t0 = time.perf_counter()
    live = run_live(cfg, repeats)
    sims = simulate_steps(cfg, live)
    result = {"config": cfg, "config_file": str(args.config),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "total_s": time.perf_counter() - t0, **live, "sim": sims, "summary": summarize(live["steps"], sims),
              "peer": "not run: verl's separate_async agent loop has no sample index, so it cannot replay our "
                      "episodes (every sample would get sample 0's)"}
    Path(args.out).write_text(json.dumps(result, indent=1, default=str))
    print(json.dumps(result["summary"], indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
