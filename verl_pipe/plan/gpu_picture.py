"""The GPU picture: ``python -m verl_pipe.plan.gpu_picture [--update-doc docs/plan.md]``.

docs/plan.md's Qwen3-1.7B on 8 H200 projection, as a verl user would compare: padding removed on both sides
(``actor_rollout_ref.model.use_remove_padding=true``: our trainer's and verl's), verl's colocated default on all 8
GPUs beside the split-pool modes, and — instead of one "realistic" per-step orchestration cost that would decide the
answer — a sweep of each framework's orchestration cost per step (the driver's, the replay buffer's, the agent
loop's: CPU work on a step's critical path that the simulator does not price), with the break-even value where our
lead vanishes.

The orchestration cost is added to each framework's step as a whole (on the critical path: an upper bound for
ours, whose driver works while the engines decode); a cost per request is the per-step figure over the step's
requests. The table is what ``--update-doc`` writes between ``<!-- plan-gpu:begin -->`` and
``<!-- plan-gpu:end -->``; tests/test_plan_doc_blocks.py checks it is current.
"""

from __future__ import annotations

import argparse
import shlex
import time

from verl_pipe.core.variants import of_row
from verl_pipe.plan.validate import update_doc

BEGIN, END = "<!-- plan-gpu:begin -->", "<!-- plan-gpu:end -->"
# the paper's FIFO (completion fill), as the public scenarios (verl_pipe/plan/public.py FIFO)
COMMAND = ("--config-name qwen3_1p7b_gsm8k_4x4 --lengths lognormal:median=700,sigma=0.8,rho=0.7 --hardware h200 "
           "--prompt-len 200 actor_rollout_ref.model.use_remove_padding=true rolloutpipe.cgp.unit_fill=completion "
           "rolloutpipe.minibatch_order=dataloader")
OURS_S = (0.0, 1.0, 2.0, 5.0, 10.0, 20.0)  # our orchestration per step, s
VERL_S = (0.0, 2.0, 5.0, 10.0)  # verl's, s


def _row(name: str, gpus: str, step: float, base: float, note: str = "") -> str:
    return f"| {name} | {gpus} | {step:.1f} | {100 * (step / base - 1):+.1f}% | {note} |"


def render() -> str:
    from verl_pipe.plan.__main__ import run_plan
    from verl_pipe.plan.predict import LABELS

    t0 = time.perf_counter()
    got = run_plan(shlex.split(COMMAND))
    p, sh = got["plan"], got["inputs"]["shape"]
    m, c, vc, rec = p["modes"], p["colocated"], p["versus_colocated"], p["recommendation"]
    n = sh["rollout_gpus"] + sh["train_gpus"]
    split = f"{sh['rollout_gpus']} + {sh['train_gpus']}"
    base = c["step_time_s"]
    requests = sh["num_groups"] * sh["n"]
    lines = [f"Qwen3-1.7B, {sh['num_groups']} prompts x {sh['n']}, lengths log-normal (median 700, σ 0.8, ρ 0.7), "
             f"{n} H200 (`h200` profile), padding removed on both sides; step time per step, against verl's "
             "colocated default on the same GPUs:", "",
             "| configuration | GPUs | step s | vs verl colocated | |", "|---|---|---|---|---|",
             _row("verl colocated (main_ppo's default: rollout, sleep, train, weight reload on every GPU)", str(n),
                  base, base, f"rollout {c['rollout_end_s']:.1f} s on {c['replicas']} replicas, sleep "
                              f"{c['sleep_s']:.1f} s, training {c['train_s']:.1f} s, reload "
                              f"{c['update_weights_s']:.1f} s")]
    for k in ("verl_separate_async", "verl_one_step_off", "sync", "cgp", "cgp_group", "cgp_fgd"):
        row = m[k]
        name = LABELS[k] + (f" [{row['fgd_window']}, {row['granularity']}]" if of_row(k).fgd else "")
        note = "off-policy (every sample one version stale)" if of_row(k).staleness else ""
        lines.append(_row(name, split, row["step_time_s"], base, note))
    sp = rec.get("split")
    if sp:
        lines.append(_row(f"recommended: cgp ({rec['granularity']}, FGD {'on' if rec['fgd'] else 'off'}) at its "
                          "best split", f"{sp['rollout_gpus']} + {sp['train_gpus']}", sp["step_time_s"], base))
    ours = vc["step_time_s"]
    on_policy_verl = min(base, m["verl_separate_async"]["step_time_s"])
    lead_c, lead_v = base - ours, on_policy_verl - ours
    lines += ["", f"Recommendation vs colocated: {vc['decision']}: {vc['message']}.", "",
              f"**Orchestration per step.** Our best on-policy configuration ({vc['rollout_gpus']} + "
              f"{vc['train_gpus']}, {ours:.1f} s) against verl's colocated default ({base:.1f} s), each with an "
              "orchestration cost per step on its critical path (our step's time vs verl colocated's, in %; "
              "negative: ours is shorter):", "",
              "| ours \\ verl's | " + " | ".join(f"{v:g} s" for v in VERL_S) + " |",
              "|---|" + "---|" * len(VERL_S)]
    for o in OURS_S:
        lines.append(f"| {o:g} s | " + " | ".join(f"{100 * ((ours + o) / (base + v) - 1):+.1f}%" for v in VERL_S)
                     + " |")
    lines.append("| **ours at break-even** | " + " | ".join(f"**{lead_c + v:.1f} s**" for v in VERL_S) + " |")
    lines += ["", f"Break-even: our lead vanishes where our orchestration per step exceeds verl colocated's by "
                  f"**{lead_c:.1f} s** ({1e3 * lead_c / requests:.1f} ms per request of the step's {requests})"
                  + (f"; against verl's separate_async on-policy ({on_policy_verl:.1f} s, its faster on-policy "
                     f"trainer here) by **{lead_v:.1f} s**" if on_policy_verl != base else
                     f"; against verl's separate_async on-policy ({m['verl_separate_async']['step_time_s']:.1f} s) by "
                     f"{m['verl_separate_async']['step_time_s'] - ours:.1f} s")
                  + (". Our lead is negative at equal orchestration: verl colocated is ahead before any orchestration "
                     "cost" if lead_c < 0 else "") + ".",
              "", "Command: `python -m verl_pipe.plan " + COMMAND + "`", "",
              f"Regenerate: `python -m verl_pipe.plan.gpu_picture --update-doc docs/plan.md` "
              f"({time.perf_counter() - t0:.0f} s here)."]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m verl_pipe.plan.gpu_picture", description=__doc__.split("\n\n")[0])
    ap.add_argument("--update-doc", help="rewrite the GPU picture block of this markdown file")
    args = ap.parse_args(argv)
    text = render()
    print(text)
    if args.update_doc:
        update_doc(args.update_doc, text, BEGIN, END)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
