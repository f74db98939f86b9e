"""python -m verl_pipe.plan: what pipelining will save on your cluster, before you buy the GPU hours.

    python -m verl_pipe.plan --config-name qwen3_1p7b_gsm8k_4x4 [overrides...] \\
        --lengths lognormal:median=700,sigma=0.8,rho=0.7 --hardware h200 [--out plan.json] [--chart plan.png]
    python -m verl_pipe.plan --config-name ... --lengths RUN_DIR --calibrate RUN_DIR [--calibrate-verl PEER.json]
    python -m verl_pipe.plan ... --calibrate docs/bench/trainer_gap_quick_steps_2026-12-01.json.gz:bench
    python -m verl_pipe.plan --config-name ... --lengths SPEC --calibrate VERL_LOG --hardware h200  # verl's own log
    python -m verl_pipe.plan --validate [--update-doc docs/plan.md]   # predictions vs every bench JSON

The config is composed as ``python -m verl_pipe.main_grpo --config-name NAME overrides...`` composes it. Lengths:
a spec, verl's rollout dump, our steps.jsonl / Chrome traces, or ``FILE.parquet:COLUMN`` (verl_pipe/plan/lengths.py).
Costs: a hardware profile (h200 measured, h100/a100 from public figures) or ``--calibrate RUN`` (a short real
run's rolloutpipe.trace_dir, or a bench steps file; verl's trainer fitted on verl's own steps where they are there;
or a plain verl run's console / file-logger log: the profile's costs scaled to its timing_s/* figures,
verl_pipe/plan/verl_log.py).
docs/plan.md explains the output.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

VALIDATION = Path(__file__).resolve().parent / "validation.json"  # written by --validate


def expected_errors() -> dict:
    """Per mode, the largest relative error of the planner's rollout→train end against measured runs."""
    if not VALIDATION.is_file():
        return {}
    return json.loads(VALIDATION.read_text()).get("expected_error", {})


def build(args) -> tuple:
    """The planner's inputs from the command line: (``PlanInputs``, the inputs as the output JSON records them). The
    costs come from ``--calibrate`` (``_calibrated_costs``) or a hardware profile (``_profile_costs``). A verl log
    (``--calibrate-verl-log LOG``, or ``--calibrate LOG`` autodetected) also gives what a flag or override does not:
    the lengths (``--lengths``), the prompt length (``--prompt-len``), the responses per step
    (``data.train_batch_size``) and the GPU count (the pools' sizes, ``--rollout-gpus`` / ``--train-gpus``)."""
    from verl_pipe.plan import lengths as L
    from verl_pipe.plan.predict import PlanInputs
    from verl_pipe.plan.runconfig import compose_run, shape_of

    cfg = compose_run(args.config_name, args.overrides)
    shape = shape_of(cfg)
    notes = []
    run = _verl_run(args)
    if run is not None:
        shape = _shape_from_log(run, shape, args, notes)
    elif args.rollout_gpus or args.train_gpus:
        shape = shape.with_split(args.rollout_gpus or shape.rollout_gpus, args.train_gpus or shape.train_gpus)
    if args.lengths:
        lengths = L.load(args.lengths, n=shape.n, tokenizer=args.tokenizer, chars_per_token=args.chars_per_token,
                         group_column=args.group_column, cap=shape.max_response_length)
    else:  # the log's own (its response_length/*: read_run refused a log without them)
        lengths = L.load(run.source, n=shape.n, cap=shape.max_response_length, flag=run.flag)
    if (lengths.spec or {}).get("rho_assumed"):
        notes.append("rho (within-group correlation of log-lengths) not given: 0.7 assumed (sim_sources.md §1b)")
    if args.prompt_len:
        prompt_len, src = args.prompt_len, "--prompt-len"
    elif run is not None and run.prompt_len:
        prompt_len, src = int(round(run.prompt_len)), "the verl log's prompt_length/mean"
    elif lengths.prompt_len:
        prompt_len, src = int(round(lengths.prompt_len)), "the lengths source"
    else:
        prompt_len, src = min(300, shape.max_prompt_length), "assumed; set --prompt-len"
    if shape.rollout_name != "vllm":
        notes.append(_rollout_note(shape, run is not None))
    errors = expected_errors()
    if args.calibrate or args.calibrate_verl_log:
        costs, hw_info, label = _calibrated_costs(args, shape, errors, notes, run,
                                                  lengths if args.lengths else None)
    else:
        costs, hw_info, label = _profile_costs(args, shape, notes)
    seeds = tuple(range(args.seeds))
    inp = PlanInputs(shape, costs, lengths, int(prompt_len), seeds=seeds, sweep_seeds=seeds[:2],
                     sweep_splits=not args.no_sweep, expected_error=errors, length_error=args.length_error)
    cap = shape.max_response_length
    inputs = {"config": " ".join([args.config_name or "rolloutpipe_trainer"] + args.overrides),
              "shape": asdict(shape), "costs": label, "hardware": hw_info,
              "lengths": {"source": lengths.source, "spec": lengths.spec, "stats": lengths.stats(cap, shape.n)},
              "prompt_len": int(prompt_len), "prompt_len_src": src, "notes": notes}
    return inp, inputs


def _verl_run(args):
    """The verl log of ``--calibrate-verl-log LOG`` (or ``--calibrate LOG``, when it is one) read as a run
    (``verl_log.read_run``), or None. Its refusals name each missing key and the flag that supplies it."""
    from verl_pipe.plan import verl_log

    if args.calibrate and args.calibrate_verl_log:
        raise ValueError("--calibrate and --calibrate-verl-log: give one (--calibrate takes a verl log too)")
    if args.calibrate_verl_log:
        path, flag = args.calibrate_verl_log, "--calibrate-verl-log"
    elif args.calibrate and verl_log.is_verl_log(args.calibrate):
        path, flag = args.calibrate, "--calibrate"
    else:
        if not args.lengths:
            raise ValueError("--lengths is required (a spec like lognormal:median=700,sigma=0.8,rho=0.7, a file, "
                             "or a verl log), unless --calibrate-verl-log LOG gives the lengths")
        return None
    return verl_log.read_run(path, flag, need_lengths=not args.lengths, need_prompt=not args.prompt_len)


_POOL_KEYS = ("actor_rollout_ref.rollout.n_gpus_per_node=", "actor_rollout_ref.rollout.nnodes=",
              "trainer.n_gpus_per_node=", "trainer.nnodes=")


def _shape_from_log(run, shape, args, notes: list[str]):
    """The planned shape with what the verl log says where no flag or override says otherwise: the batch (its
    responses per step over the config's n) and the GPU count (split as the config splits its pools)."""
    from dataclasses import replace

    from verl_pipe.plan.runconfig import CannotModel

    given = " ".join(args.overrides)
    if run.rows and "data.train_batch_size=" not in given:
        groups = max(1, int(round(run.rows / shape.n)))
        if groups != shape.num_groups:
            if groups % shape.groups_per_unit:
                raise CannotModel(
                    f"{run.flag} {run.source}: {run.rows} responses per step (perf/total_num_tokens) are "
                    f"{groups} prompts x n={shape.n}, which actor_rollout_ref.actor.ppo_mini_batch_size="
                    f"{shape.groups_per_unit} does not divide; pass the run's mini-batch "
                    "(actor_rollout_ref.actor.ppo_mini_batch_size=...) and n (actor_rollout_ref.rollout.n=...), or "
                    "the batch to plan (data.train_batch_size=...)")
            notes.append(f"batch from the verl log: {run.rows} responses per step = {groups} prompts x n={shape.n} "
                         f"(the config's n; the config had {shape.num_groups} prompts; data.train_batch_size=... "
                         "overrides)")
            shape = replace(shape, num_groups=groups)
    if args.rollout_gpus or args.train_gpus:
        return shape.with_split(args.rollout_gpus or shape.rollout_gpus, args.train_gpus or shape.train_gpus)
    if run.gpus and not any(k in given for k in _POOL_KEYS):
        total = shape.rollout_gpus + shape.train_gpus
        if run.gpus != total:
            r = max(shape.tp, min(run.gpus - 1, round(run.gpus * shape.rollout_gpus / total / shape.tp) * shape.tp))
            if run.gpus < 2 or r < shape.tp or r >= run.gpus:
                raise CannotModel(f"{run.flag} {run.source}: the run's {run.gpus} GPU(s) ({run.gpus_from}) cannot be "
                                  f"split into a rollout pool of whole TP-{shape.tp} replicas and a trainer pool; pass "
                                  "--rollout-gpus and --train-gpus")
            notes.append(f"GPUs from the verl log: {run.gpus} ({run.gpus_from}), planned as {r} rollout + "
                         f"{run.gpus - r} trainer (the config's {shape.rollout_gpus}:{shape.train_gpus} ratio; "
                         "--rollout-gpus / --train-gpus override) and as verl's colocated default on all of them")
            shape = shape.with_split(r, run.gpus - r)
    return shape


def _rollout_note(shape, calibrated: bool) -> str:
    name = shape.rollout_name
    if calibrated:
        return (f"actor_rollout_ref.rollout.name={name}: the engine's speed is fitted on the log ({name}'s own "
                "timing_s/gen); its scheduling is modelled as vLLM's (continuous batching, max_num_seqs slots). Our "
                f"pipelined modes run on vLLM: their rows assume vLLM at the {name}-fitted speed")
    return (f"actor_rollout_ref.rollout.name={name}: no {name} figure in the profile; the decode model is the "
            f"profile's (derived for vLLM) with vLLM's scheduling. Calibrate on the {name} run's log "
            "(--calibrate-verl-log LOG) to fit its speed")


def _calibrated_costs(args, shape, errors: dict, notes: list[str], run=None, user_lengths=None) -> tuple:
    """(costs, hardware record, label) fitted on ``args.calibrate`` (and verl's steps, ``--calibrate-verl``), or on
    the verl log ``run`` (``_verl_run``). Raises each mode's expected error in ``errors`` to the run's own fit error
    where larger; says in ``notes`` how verl's modes are costed."""
    from verl_pipe.plan.calibrate import calibrate_run
    from verl_pipe.plan.predict import CalibratedCosts

    if run is not None:  # a plain verl run's metrics log
        from verl_pipe.plan.log_costs import calibrated_costs

        return calibrated_costs(run.source, args, shape, notes, run=run, user_lengths=user_lengths)
    rc = calibrate_run(args.calibrate, micro_rows=shape.micro_rows, max_num_seqs=shape.max_num_seqs,
                       max_num_batched_tokens=shape.max_num_batched_tokens,
                       train_gpus=args.calibrated_train_gpus or shape.train_gpus,
                       prompt_len=args.prompt_len, verl_source=args.calibrate_verl)
    hw_info = {"calibrated_from": str(args.calibrate), **rc.summary()}
    for mode, e in rc.self_check["per_mode"].items():  # the run's own fit error, where it measured the mode
        prior = errors.get(mode, {})
        errors[mode] = {**prior, "max_rel_error": max(e["max_rel_error"], prior.get("max_rel_error", 0.0)),
                        "basis": "bench validation and this run's own fit"}
    if rc.verl is not None:
        v = rc.verl.summary(rc.cal.trainer)
        notes.append(f"verl's modes are costed with verl's own trainer, fitted on {v['steps']} verl steps of "
                     f"{v['source']}: update {v['update_s_per_1k_padded_tokens']:.3g} s per 1k padded tokens "
                     f"(ours {v['ours_update_s_per_1k_padded_tokens']:.3g}), old log-prob "
                     f"{v['logprob_s_per_1k_padded_tokens']:.3g} "
                     f"(ours {v['ours_logprob_s_per_1k_padded_tokens']:.3g})"
                     + ("; per-call costs ours (one mini-batch count: not separable)"
                        if v["intercepts"] == "ours" else ""))
    else:
        notes.append("no verl steps in this calibration: verl's modes are costed with our trainer's fit (the same "
                     "worker and cost per padded token, docs/trainer_gap.md; verl's rows arrive in completion "
                     "order, ours sorted by length); give verl's own steps with --calibrate-verl FILE")
    return CalibratedCosts(rc), hw_info, f"calibrated on {args.calibrate}"


def _profile_costs(args, shape, notes: list[str]) -> tuple:
    """(costs, hardware record, label) from the ``--hardware`` profile and the config's model; the profile's notes
    go into ``notes``. A CPU config has no profile: CannotModel."""
    from verl_pipe.plan.hardware import model_shape, profile
    from verl_pipe.plan.predict import ProfileCosts
    from verl_pipe.plan.runconfig import CannotModel

    if shape.cpu:
        raise CannotModel("rolloutpipe.platform=cpu / trainer.device=cpu: the hardware profiles are GPUs; plan "
                          "a GPU config (e.g. --config-name qwen3_1p7b_gsm8k_4x4), or fit this CPU run's costs "
                          "with --calibrate RUN_DIR")
    hw = profile(args.hardware)
    model = model_shape(shape.model_path)
    hw.check_tp(model, shape.tp, shape.rollout_gpus)
    hw_info = {"profile": hw.name, "figures": hw.figures(), "notes": list(hw.notes), "model": asdict(model)}
    notes += list(hw.notes)
    return ProfileCosts(hw, model), hw_info, f"{hw.name} profile, {model.name}"


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m verl_pipe.plan", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("overrides", nargs="*", help="Hydra overrides, as main_grpo takes them")
    ap.add_argument("--config-name", help="a recipe or config name (as main_grpo's --config-name)")
    ap.add_argument("--lengths", help="a length spec, a verl rollout dump, a verl console / file-logger log "
                                      "(its response_length/*), steps.jsonl / run dir, a Chrome trace, or "
                                      "FILE.parquet:COLUMN (default with --calibrate-verl-log: that log)")
    ap.add_argument("--hardware", default="h200", help="h200 (measured), h100, a100, gh200, gh200-144g, b200 (public "
                                                       "figures; docs/plan.md)")
    ap.add_argument("--calibrate", metavar="RUN",
                    help="fit the costs on a real run: its trace_dir (steps.jsonl + traces) or a bench steps file "
                         "(FILE[:SIZE], verl's peer in it), or a plain verl run's log (console or "
                         "trainer.logger=['file'] JSONL, or its folder): autodetected")
    ap.add_argument("--calibrate-verl-log", metavar="LOG",
                    help="fit on a plain verl run's metrics log (timing_s/*, response_length/*: console output or "
                         "the file logger's JSONL): the --hardware profile's costs scaled to what it measured; the "
                         "log also gives the lengths, prompt length, batch and GPU count where no flag does, and a "
                         "colocated run's weight reload (timing_s/update_weights)")
    ap.add_argument("--calibrated-rollout-gpus", type=int,
                    help="verl log: rollout GPUs of the logged run (default: its GPU count from perf/*, colocated)")
    ap.add_argument("--calibrate-verl", metavar="FILE",
                    help="fit verl's trainer on verl's own steps (a bench steps file or a verl_pipe_lab.bench.peer --out "
                         "JSON) when --calibrate's run has none")
    ap.add_argument("--calibrated-train-gpus", type=int, help="trainer GPUs of the calibration run (default: config's; "
                                                              "a verl log: its GPU count from perf/*)")
    ap.add_argument("--prompt-len", type=int, help="mean prompt tokens (default: from the lengths source, else 300)")
    ap.add_argument("--tokenizer", help="tokenizer to count tokens of a verl rollout dump's text")
    ap.add_argument("--chars-per-token", type=float, help="estimate a verl dump's tokens as characters / this")
    ap.add_argument("--group-column", help="parquet: the column that names a response's prompt")
    ap.add_argument("--rollout-gpus", type=int, help="plan this many rollout GPUs instead of the config's")
    ap.add_argument("--train-gpus", type=int, help="plan this many trainer GPUs instead of the config's")
    ap.add_argument("--seeds", type=int, default=3, help="length draws per figure (default 3)")
    ap.add_argument("--no-sweep", action="store_true", help="skip the rollout/trainer split sweep")
    ap.add_argument("--length-error", type=float, default=None, metavar="SIGMA",
                    help="FGD orders by the groups' lengths known up to a log-normal error SIGMA (0: perfectly; "
                         "docs/fgd.md); default: FGD's rank order")
    ap.add_argument("--out", help="write the plan as JSON here")
    ap.add_argument("--chart", help="write a chart (PNG) here")
    ap.add_argument("--validate", action="store_true", help="predict every bench JSON in docs/bench and compare")
    ap.add_argument("--bench-dir", default="docs/bench", help="--validate: where the bench JSONs are")
    ap.add_argument("--update-doc", help="--validate: rewrite the validation table in this markdown file")
    return ap


def run_plan(argv: list[str]) -> dict:
    """The plan a command line would print, as its JSON (``--out``) dict: for callers that plan several configs
    in one process (``verl_pipe.plan.public``)."""
    from verl_pipe.plan.predict import plan

    t0 = time.perf_counter()
    inp, inputs = build(parser().parse_args(argv))
    return {"inputs": inputs, "plan": plan(inp), "elapsed_s": time.perf_counter() - t0}


def main(argv=None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    try:
        if args.validate:
            from verl_pipe.plan.validate import main_validate

            return main_validate(args.bench_dir, args.update_doc, VALIDATION, args.out)
        from verl_pipe.plan.predict import plan
        from verl_pipe.plan.report import format_plan, write_chart, write_json

        inp, inputs = build(args)
        result = {"inputs": inputs, "plan": plan(inp)}
    except ValueError as e:  # CannotModel and bad input: one clear line, no traceback
        print(f"python -m verl_pipe.plan: {e}", file=sys.stderr)
        return 2
    result["elapsed_s"] = time.perf_counter() - t0
    print(format_plan(result))
    if args.out:
        write_json(result, args.out)
    if args.chart:
        write_chart(result, args.chart)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
