"""The planner against public figures: ``python -m verl_pipe.plan.public [--update-doc docs/plan.md]``.

Two published settings, planned with every input the publication does not give written down as an assumption
(docs/plan.md lists them beside the command, each marked published / derived / assumed; the published facts are
restated with their sources in docs/sim_sources.md §7 and §10):

- ``paper``: the RolloutPipe paper's −30.7 … −42.3% rollout→train end against slime's synchronous baseline,
  Qwen3-1.7B (its batch, lengths and GPUs are not public: the grid's of docs/sim_sources.md §7);
- ``verl_v1``: verl's V1 separate_async report, Qwen3.5-35B-A3B, 150 steps: sync 22.79 h, separate_async −38.1%
  (off-policy), 4 nodes, batch 64, mini-batch 16, 32k responses: what on-policy CGP could reach there.

Each run is the planner's own command line (``COMMANDS``), run in this process; the tables it prints are what
``--update-doc`` writes between ``<!-- plan-public:begin -->`` and ``<!-- plan-public:end -->``.
"""

from __future__ import annotations

import argparse
import shlex
import time
from verl_pipe.core.variants import of_row
from verl_pipe.plan.validate import update_doc

BEGIN, END = "<!-- plan-public:begin -->", "<!-- plan-public:end -->"

# The scenarios model the paper's FIFO (completion fill): the simulator does not model the default's mini-batches in
# predicted-length order (rolloutpipe.minibatch_order=length), and dispatch fill in dataloader order is a different,
# pessimistic mode (docs/plan.md).
FIFO = "rolloutpipe.cgp.unit_fill=completion rolloutpipe.minibatch_order=dataloader "
PAPER_BASE = ("--config-name qwen3_1p7b_gsm8k_4x4 " + FIFO + "data.max_response_length=24576 "
              "actor_rollout_ref.rollout.max_model_len=25088 --hardware h100 --no-sweep")
PAPER_LENGTHS = (("D1", "D1 base-early (mean 1,000)"), ("D2", "D2 distill-8k (mean 3,500)"),
                 ("D3", "D3 long-CoT-24k (median 6,701)"), ("D4", "D4 cap-bound-8k"),
                 ("equal:3000", "equal:3000 (no tail)"))
PAPER_RANGE = (30.7, 42.3)  # the paper's saving vs slime's sync, %

# verl's V1 report: published batch 64 prompts, mini-batch 16, 32k responses, 4 nodes; the rest assumed
V1_BASE = ("--config-name qwen3_1p7b_gsm8k_4x4 " + FIFO + "actor_rollout_ref.model.path=Qwen3.5-35B-A3B "
           "data.train_batch_size=64 actor_rollout_ref.actor.ppo_mini_batch_size=16 actor_rollout_ref.rollout.n=16 "
           "data.max_prompt_length=2048 data.max_response_length=32768 actor_rollout_ref.rollout.max_model_len=34816 "
           "actor_rollout_ref.rollout.nnodes=2 actor_rollout_ref.rollout.n_gpus_per_node=8 trainer.nnodes=2 "
           "trainer.n_gpus_per_node=8 actor_rollout_ref.model.use_remove_padding=true "
           "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=65536 actor_rollout_ref.actor.use_kl_loss=false "
           "--hardware h200 --prompt-len 300")
V1_LENGTHS = (("lognormal:median=6701,sigma=0.742,rho=0.54,cap=32768", "A: D3's body at a 32k cap"),
              ("lognormal:median=16500,sigma=0.742,rho=0.54,cap=32768",
               "B: median 16,500 (fitted: the sync stand-in's step = the published 547 s)"))
V1_SYNC_S = 22.79 * 3600 / 150  # published: 22.79 h for 150 steps
V1_ASYNC_PCT = 38.1  # published: separate_async (off-policy) vs sync
ROWS = ("sync", "cgp", "cgp_group", "cgp_fgd", "verl_separate_async", "verl_one_step_off")


def _plan(cmd: str) -> dict:
    from verl_pipe.plan.__main__ import run_plan

    return run_plan(shlex.split(cmd))


def paper() -> tuple[str, list[str]]:
    cmds, rows = [], []
    for spec, label in PAPER_LENGTHS:
        cmd = f"{PAPER_BASE} --lengths {spec}"
        cmds.append(cmd)
        p = _plan(cmd)["plan"]
        m, rec = p["modes"], p["recommendation"]
        fgd = m["cgp_fgd"]["reduction_vs_sync_pct"]
        best = max(m[k]["reduction_vs_sync_pct"] for k in ("cgp", "cgp_group", "cgp_fgd") if "skipped" not in m[k])
        how = rec.get("best_pipelined", rec)
        lo, hi = PAPER_RANGE
        inside = "yes" if lo - 0.5 <= best <= hi + 0.5 else ("above" if best > hi else "no (below)")
        rows.append(f"| {label} | {p['sync_train_to_rollout_ratio']:.2f} | {-fgd:+.1f}% | {-best:+.1f}% "
                    f"({how['granularity']}, FGD {'on, ' + str(how['fgd_window']) if how['fgd'] else 'off'}) | "
                    f"{inside} |")
    table = ["| lengths | sync T/R | cgp + fgd (config window) vs sync | best pipelined vs sync | in the paper's "
             "−30.7…−42.3%? |", "|---|---|---|---|---|"] + rows
    return "\n".join(table), cmds


def verl_v1() -> tuple[str, list[str]]:
    cmds, cols = [], []
    for spec, label in V1_LENGTHS:
        sep = f"{V1_BASE} --lengths {spec}"
        coloc = f"{sep} --rollout-gpus 32 --train-gpus 32 --no-sweep"
        cmds += [sep, coloc]
        cols.append((label, _plan(sep), _plan(coloc)))

    def cell(m: dict, base: float) -> str:
        return f"{m['step_time_s']:.0f} s ({100 * (m['step_time_s'] / base - 1):+.1f}%)"

    head = "| per step (step time: rollout start to weight sync done) | " + " | ".join(c[0] for c in cols) + \
           " | published |"
    lines = [head, "|---|" + "---|" * (len(cols) + 1)]
    bases = [c[2]["plan"]["modes"]["sync"]["step_time_s"] for c in cols]
    lines.append("| sync, colocated stand-in: 32 rollout GPUs, then 32 trainer GPUs | " + " | ".join(
        f"{b:.0f} s" for b in bases) + f" | {V1_SYNC_S:.0f} s (22.79 h / 150) |")
    lines.append("| verl colocated, modelled (32 GPUs take turns: rollout, sleep, training, weight reload) | "
                 + " | ".join(
        cell(sep["plan"]["colocated"], b) + f" [reload {sep['plan']['colocated']['update_weights_s']:.0f} s]"
        for (_, sep, _), b in zip(cols, bases)) + " | – |")
    from verl_pipe.plan.predict import LABELS

    for k in ROWS:
        cells = []
        for (_, sep, _), b in zip(cols, bases):
            m = sep["plan"]["modes"][k]
            extra = f" [{m['fgd_window']}, {m['granularity']}]" if of_row(k).fgd else ""
            cells.append(cell(m, b) + extra)
        lines.append(f"| {LABELS[k]}, 16 + 16 | " + " | ".join(cells) + " | – |")
    cells = []
    for (_, sep, _), b in zip(cols, bases):
        rec = sep["plan"]["recommendation"]
        sp = rec.get("split")
        cells.append(f"{sp['step_time_s']:.0f} s ({100 * (sp['step_time_s'] / b - 1):+.1f}%) at "
                     f"{sp['rollout_gpus']} + {sp['train_gpus']}" if sp else "–")
    lines.append("| recommended on-policy mode at its best split | " + " | ".join(cells) + " | – |")
    lines.append("| verl separate_async, off-policy (max_off_policy_threshold 8, partial rollout) | " +
                 " | ".join("not modelled" for _ in cols) +
                 f" | {V1_SYNC_S * (1 - V1_ASYNC_PCT / 100):.0f} s (−{V1_ASYNC_PCT}%) |")
    tr = [f"{c[1]['plan']['sync_train_to_rollout_ratio']:.2f}" for c in cols]
    verdicts = [c[1]["plan"]["verdict"]["message"] for c in cols]
    lines += ["", "Sync T/R (16 + 16): " + ", ".join(f"{c[0].split(':')[0]} {t}" for c, t in zip(cols, tr)) + ".",
              ""] + [f"- {c[0].split(':')[0]}: {v}" for c, v in zip(cols, verdicts)]
    lines += [f"- {c[0].split(':')[0]}, against the colocated model: {c[1]['plan']['versus_colocated']['decision']}: "
              f"{c[1]['plan']['versus_colocated']['message']}" for c in cols]
    return "\n".join(lines), cmds


def render() -> str:
    t0 = time.perf_counter()
    p_table, p_cmds = paper()
    v_table, v_cmds = verl_v1()
    out = ["The RolloutPipe paper's setting (Qwen3-1.7B, 4 + 4 H100, the grid's batch and lengths):", "", p_table,
           "", "verl's V1 separate_async report's setting (Qwen3.5-35B-A3B, 32 GPUs, 32k responses), as 16 rollout + "
               "16 trainer H200 (percentages against the colocated sync stand-in of the same column):", "", v_table,
           "", "Commands (each a `python -m verl_pipe.plan` line):", "", "```"]
    out += [f"python -m verl_pipe.plan {c}" for c in p_cmds + v_cmds]
    out += ["```", "", f"Regenerate: `python -m verl_pipe.plan.public --update-doc docs/plan.md` "
                       f"({time.perf_counter() - t0:.0f} s here)."]
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m verl_pipe.plan.public", description=__doc__.split("\n\n")[0])
    ap.add_argument("--update-doc", help="rewrite the public-figures block of this markdown file")
    args = ap.parse_args(argv)
    text = render()
    print(text)
    if args.update_doc:
        update_doc(args.update_doc, text, BEGIN, END)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
