"""The multi-turn bench: sync, CGP and CGP+FGD on the same multi-turn work (turns x tool latency x length), on one
live stack of the multi-turn recipe, verl's own separate_async trainer on the same work (``peers``), and the
simulator's prediction of each measured step.

    python -m verl_pipe_lab.bench.multiturn --out mt.json [--config lab/verl_pipe_lab/bench/conf/multiturn.yaml] [--repeats R]
    python -m verl_pipe_lab.bench.multiturn --reanalyze mt_steps.json.gz --out mt.json   # the analysis only

The setting (``lab/verl_pipe_lab/bench/conf/multiturn.yaml``) carries its work in ``rolloutpipe.multiturn`` with ``turn_tokens`` set:
the toy environment's episodes are a function of (seed, task, sample), so every mode given the same prompts gets the
same turns, tool latencies and forced turn lengths (``rolloutpipe.workload``, the single-turn bench's lengths, cannot
be combined with the multi-turn loop). Round r draws one batch of prompts, sets ``rolloutpipe.multiturn.seed`` to
``seed + r`` and runs every mode on that batch, interleaved on the same workers.

Before the rounds, ``calibration_steps`` sync steps run single-turn episodes of the setting's turn lengths (the
engine's calibration for the simulator: ``verl_pipe_lab.bench.multiturn_sim``). After them, our stack is shut down and
each configuration in ``peers`` (``verl_pipe_lab.bench.peer``: verl's V1 separate_async trainer, run for real in its own
Ray cluster) runs the same rounds: its dataloader yields the same prompts in the same order (verl's seeded sampler),
its warm-up submissions cover our warm-up and calibration steps, each measured submission carries its round's
episode seed, and its agent-loop worker gives each of a prompt's n trajectories its own sample index (verl's
``session_id``), so it runs our episodes; the JSON says whether its tasks matched ours round by round.

The JSON keeps the figures; the steps file beside it (``NAME_steps_DATE.json.gz``) keeps every step's timeline
events, from which ``--reanalyze`` rebuilds the JSON's analysis. The live part needs Ray, vLLM and the tiny assets;
``load``, ``compose_config``, the analysis and ``reanalyze`` are pure.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import yaml

from verl_pipe.core.variants import BASE

CONFIG = Path(__file__).resolve().parent / "conf" / "multiturn.yaml"
MODES = ("sync", "cgp", "cgp_fgd")
KEYS = {"recipe", "overrides", "multiturn", "modes", "repeats", "warmup_steps", "calibration_steps", "seed",
        "peers", "cache_block"}
FIGURES = ("rollout_to_train_end_s", "first_unit_ready_s", "rollout_end_s", "trainer_busy_s", "trainer_wait_ratio",
           "step_time_s", "pipeline_efficiency")
CALIBRATION_SEED = 20_000  # calibration step k: episodes of seed 20_000 + k (never a round's)


def load(path: str | Path = CONFIG) -> dict:
    """The bench YAML, checked: its keys, its modes and peers, forced turn lengths (the same work in every mode)."""
    from verl_pipe.assets.multiturn_env import EnvConfig
    from verl_pipe_lab.bench.peer.configs import CONFIGS

    with open(path) as f:
        cfg = yaml.safe_load(f)
    unknown = set(cfg) - KEYS
    if unknown:
        raise ValueError(f"{path}: unknown keys {sorted(unknown)} (allowed: {sorted(KEYS)})")
    bad = set(cfg.get("modes") or []) - set(MODES)
    if bad or not cfg.get("modes"):
        raise ValueError(f"{path}: modes must be a non-empty subset of {list(MODES)}, got {cfg.get('modes')}")
    if BASE not in cfg["modes"]:
        raise ValueError(f"{path}: modes must include sync (the baseline every figure is compared with)")
    if set(cfg.get("peers") or []) - {"onpolicy"}:
        raise ValueError(f"{path}: peers {cfg['peers']}: only onpolicy (verl's separate_async with nothing generated "
                         f"ahead) trains each round's own batch; of {sorted(CONFIGS)}, 'default' trains the batch "
                         "generated a step earlier, other work than the round's")
    env = EnvConfig.from_dict(cfg.get("multiturn"))
    if env.turn_tokens is None:
        raise ValueError(f"{path}: multiturn.turn_tokens must be set (forced turn lengths: the same work in every "
                         "mode)")
    for key in ("repeats", "warmup_steps", "calibration_steps", "seed"):
        if not isinstance(cfg.get(key, 0), int) or cfg.get(key, 0) < 0:
            raise ValueError(f"{path}: {key} must be an int >= 0, got {cfg.get(key)!r}")
    if not isinstance(cfg.get("cache_block", 1), int) or cfg.get("cache_block", 1) < 1:
        raise ValueError(f"{path}: cache_block must be an int >= 1 (the engine's KV block in tokens), "
                         f"got {cfg.get('cache_block')!r}")
    return cfg


def calibration_env(cfg: dict, k: int) -> dict:
    """The ``rolloutpipe.multiturn`` node of calibration step k: one model turn per episode, of the setting's turn
    lengths, no tool call."""
    return {**cfg["multiturn"], "seed": CALIBRATION_SEED + k, "turns": {"median": 1, "sigma": 0.0, "rho": 0.0,
                                                                          "cap": 1}}


def compose_config(cfg: dict, extra: list[str] = ()):
    """The live stack's config: the recipe with the bench's overrides and its ``multiturn`` node."""
    from omegaconf import OmegaConf, open_dict

    from verl_pipe.launch.session import compose

    c = compose(list(cfg.get("overrides") or []) + list(extra), config_name=cfg["recipe"])
    with open_dict(c):
        c.rolloutpipe.multiturn = OmegaConf.create(cfg["multiturn"])
    return c


def peer_spec(cfg: dict, config: str, repeats: int, extra: list[str] = ()) -> dict:
    """The peer runner's spec (``verl_pipe_lab.bench.peer.runner``) for the rounds of this setting: the recipe, the
    bench's overrides and ``multiturn`` node; its warm-up submissions take the batches of our warm-up and
    calibration steps, so its measured submission r gets round r's prompts, with round r's episode seed."""
    warm = int(cfg.get("warmup_steps", 1)) + int(cfg.get("calibration_steps", 0))
    return {"config": config, "steps": int(repeats) + warm, "warmup_steps": warm,
            "overrides": list(cfg.get("overrides") or []) + list(extra), "seed": int(cfg.get("seed", 0)),
            "workload": None, "config_name": cfg["recipe"], "multiturn": dict(cfg["multiturn"]),
            "setting": "multiturn"}


# ---------------------------------------------------------------------------------------------- live


def _set_env(session, node: dict) -> None:
    from omegaconf import OmegaConf, open_dict

    mt = session.trainer.config.rolloutpipe.multiturn
    with open_dict(mt):  # in place: the agent loop reads this node per trajectory
        for key, value in node.items():
            mt[key] = OmegaConf.create(value) if isinstance(value, dict) else value


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


def _trajectories(batch) -> dict:
    """Per trained response: its group's uid and the episode's facts (turns, tool wait, generate time)."""
    nt = batch.non_tensor_batch
    keys = [k for k in ("uid", "mt_turns", "mt_tool_wait_s", "mt_gen_s") if k in nt]
    return {k: [v.item() if hasattr(v, "item") else v for v in nt[k].tolist()] for k in keys}


def _step(session, mode: str, batch_dict, r: int) -> dict:
    from verl_pipe_lab.bench.run import mode_kwargs

    t = time.perf_counter()
    rec = session.step(**mode_kwargs(mode), batch_dict=copy.deepcopy(batch_dict))
    wall = time.perf_counter() - t
    batch = session.trainer.last_outcome.batch
    mt = {k.split("/", 2)[2]: v for k, v in rec["metrics"].items() if k.startswith("rolloutpipe/multiturn/")}
    return {"round": r, "mode": mode, "wall_s": wall, "timeline": {k: rec["timeline"][k] for k in FIGURES},
            "multiturn": mt, "prompt_len": float(rec["metrics"].get("prompt_length/mean", 0.0)),
            "tool_tokens": _tool_tokens(batch), "fgd_window": rec.get("knobs", {}).get("fgd_window"),
            "trained_groups": len(rec.get("trained_groups", [])),
            "events": session.trainer.timelines[-1].to_dict(), "trajectories": _trajectories(batch)}


def _calibrate(session, cfg: dict, log) -> list[dict]:
    """The engine's calibration steps: sync, single-turn episodes of the setting's turn lengths."""
    out = []
    for k in range(int(cfg.get("calibration_steps", 0))):
        _set_env(session, calibration_env(cfg, k))
        st = _step(session, "sync", next(session._batches), -1)
        out.append({"seed": CALIBRATION_SEED + k, **{key: st[key] for key in ("wall_s", "timeline", "multiturn",
                                                                               "prompt_len", "events")}})
        log(f"[mt-bench] calibration step {k} (single-turn, sync): rollout {st['timeline']['rollout_end_s']:.2f}s "
            f"turns {st['multiturn'].get('turns_mean', 0):.2f}")
    return out


def _rounds(session, cfg: dict, repeats: int, log) -> tuple[list[dict], list[dict]]:
    steps, rounds = [], []
    for r in range(repeats):
        batch_dict = next(session._batches)
        seed = int(cfg.get("seed", 0)) + r
        _set_env(session, {**cfg["multiturn"], "seed": seed})
        rounds.append({"round": r, "seed": seed, "tasks": _tasks(batch_dict)})
        for mode in cfg["modes"]:
            st = _step(session, mode, batch_dict, r)
            steps.append(st)
            tl = st["timeline"]
            log(f"[mt-bench] round {r} {mode:<8} rollout→train_end {tl['rollout_to_train_end_s']:6.2f}s "
                f"first unit {tl['first_unit_ready_s']:5.2f}s rollout {tl['rollout_end_s']:5.2f}s "
                f"train {tl['trainer_busy_s']:5.2f}s turns {st['multiturn'].get('turns_mean', 0):.2f}")
    return steps, rounds


def run_live(cfg: dict, repeats: int, log=print) -> dict:
    import tempfile

    from verl_pipe.launch.session import PipeSession

    ckpt = tempfile.mkdtemp(prefix="verl_pipe_mt_bench_")
    t0 = time.perf_counter()
    session = PipeSession(compose_config(cfg, [f"trainer.default_local_dir={ckpt}"]))
    startup = time.perf_counter() - t0
    log(f"[mt-bench] stack up in {startup:.1f}s")
    try:
        for _ in range(int(cfg.get("warmup_steps", 1))):
            _set_env(session, {**cfg["multiturn"], "seed": 10_000})
            w = _step(session, "sync", next(session._batches), -1)
            log(f"[mt-bench] warm-up step (discarded): {w['wall_s']:.1f}s")
        shape = _shape(session, cfg)
        calibration = _calibrate(session, cfg, log)
        steps, rounds = _rounds(session, cfg, repeats, log)
    finally:
        session.close()
    return {"startup_s": startup, "shape": shape, "rounds": rounds, "calibration": calibration, "steps": steps}


def _shape(session, cfg: dict) -> dict:
    c = session.config
    roll = c.actor_rollout_ref.rollout
    return {"n": int(roll.n), "prompts": int(c.data.train_batch_size),
            "groups_per_unit": int(c.actor_rollout_ref.actor.ppo_mini_batch_size),
            "micro_rows": int(c.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu),
            "max_num_seqs": int(roll.max_num_seqs), "max_response_length": int(c.data.max_response_length),
            "replicas": max(1, int(roll.nnodes) * int(roll.n_gpus_per_node) // int(roll.tensor_model_parallel_size)),
            "cache_block": int(cfg.get("cache_block", 1)),
            **{k: v for k, v in session.trainer.configured_knobs.record().items()
               if k in ("baseline_order", "baseline_window", "fgd_window")}}


def run_peers(cfg: dict, repeats: int, rounds: list[dict], log=print, log_path: str | None = None) -> tuple:
    """Each configuration in ``peers`` on the rounds: its entry (verl_pipe_lab.bench.peer.run_peer) and its measured
    steps as this bench's steps (mode ``verl_separate_async``; ``same_tasks``: its prompts were the round's)."""
    import tempfile

    from verl_pipe_lab.bench.multiturn_sim import PEER_MODE
    from verl_pipe_lab.bench.peer import run_peer

    entries, steps = [], []
    for name in cfg.get("peers") or []:
        ckpt = tempfile.mkdtemp(prefix="verl_pipe_mt_peer_")
        try:
            entry = run_peer(peer_spec(cfg, name, repeats, [f"trainer.default_local_dir={ckpt}"]), log=log,
                             log_path=log_path)
        except RuntimeError as e:  # the peer's failure is reported; our modes' figures stay
            log(f"[mt-bench] peer {name} failed: {str(e)[-400:]}")
            entries.append({"config": name, "error": str(e)[-4000:]})
            continue
        entries.append(entry)
        measured = [rec for rec in entry["steps"] if not rec.get("warmup")]
        for r, rec in enumerate(measured[:len(rounds)]):
            tl = {k: rec["metrics"].get(k) for k in FIGURES}
            steps.append({"round": r, "mode": PEER_MODE, "timeline": tl, "weight_versions": rec["weight_versions"],
                          "tasks": rec.get("tasks"), "same_tasks": rec.get("tasks") == rounds[r]["tasks"]})
    return entries, steps


# ---------------------------------------------------------------------------------------------- analysis


def with_peer_inputs(steps: list[dict]) -> list[dict]:
    """The peer's steps get their round's prompt and tool-message lengths from its sync step (the simulator's
    inputs; the peer's trained batch is not read back)."""
    from verl_pipe_lab.bench.multiturn_sim import PEER_MODE

    sync = {st["round"]: st for st in steps if st["mode"] == BASE}
    return [dict(st, prompt_len=sync[st["round"]]["prompt_len"], tool_tokens=sync[st["round"]]["tool_tokens"])
            if st["mode"] == PEER_MODE and st["round"] in sync else st for st in steps]


def analysis(cfg: dict, live: dict) -> dict:
    """The JSON's analysis of the recorded run: the simulator's section and the summary."""
    from verl_pipe_lab.bench.multiturn_sim import analyze, summarize

    live = dict(live, steps=with_peer_inputs(live["steps"]))
    sim = analyze(cfg, live)
    return {"sim": sim, "summary": summarize(live["steps"], FIGURES, sim["steps"])}


def figures_only(live: dict) -> dict:
    """The JSON's copy of the run: every step without its timeline events and trajectories (in the steps file)."""
    drop = ("events", "trajectories")
    return dict(live, steps=[{k: v for k, v in st.items() if k not in drop} for st in live["steps"]],
                calibration=[{k: v for k, v in c.items() if k not in drop} for c in live.get("calibration", [])])


def steps_path(out: str | Path) -> Path:
    """``NAME_steps_DATE.json.gz`` beside ``NAME_DATE.json`` (docs/bench's convention)."""
    out = Path(out)
    name, _, date = out.stem.rpartition("_")
    return out.with_name(f"{name}_steps_{date}.json.gz" if name else f"{out.stem}_steps.json.gz")


def reanalyze(path: str | Path) -> dict:
    """The JSON rebuilt from a steps file: its recorded run, with the analysis of this code."""
    import gzip

    with (gzip.open if str(path).endswith(".gz") else open)(path, "rt") as f:
        live = json.load(f)
    cfg = live.pop("config")
    return {"config": cfg, **figures_only(live), **analysis(cfg, live), "steps_file": str(path)}


def main(argv=None) -> int:
    import gzip

    ap = argparse.ArgumentParser(prog="python -m verl_pipe_lab.bench.multiturn", description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(CONFIG))
    ap.add_argument("--repeats", type=int, help="rounds (default: the config's)")
    ap.add_argument("--reanalyze", help="a steps file this bench wrote: rebuild the analysis, run nothing")
    ap.add_argument("--peer-log", help="write the peer runner's whole output here")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if args.reanalyze:
        result = reanalyze(args.reanalyze)
    else:
        cfg = load(args.config)
        repeats = args.repeats if args.repeats is not None else int(cfg.get("repeats", 1))
        t0 = time.perf_counter()
        live = run_live(cfg, repeats)
        peer_entries, peer_steps = run_peers(cfg, repeats, live["rounds"], log_path=args.peer_log)
        live = dict(live, steps=live["steps"] + peer_steps, peer=peer_entries, config_file=str(args.config),
                    date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), total_s=time.perf_counter() - t0)
        sp = steps_path(args.out)
        with gzip.open(sp, "wt") as f:
            json.dump({"config": cfg, **live}, f, default=str)
        result = {"config": cfg, **figures_only(live), **analysis(cfg, live), "steps_file": str(sp)}
    Path(args.out).write_text(json.dumps(result, indent=1, default=str))
    print(json.dumps(result["summary"], indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
