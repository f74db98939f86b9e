"""What an admission order could cut from FIFO's step on the chain task, from the FGD study's own step records
(docs/fgd.md, "What an order could cut on the chain task").

Per step, the ideal pipeline bound (`ideal_lower_bound_s`, core/timeline.py) is max(rollout end + the last unit's
training, the trainer's first possible work + its busy time), where at group granularity the first possible work is
the first trainable group's completion (not recorded on its own: `ideal - busy` where that term binds). An admission
order moves the first group's completion and the rollout's end; it does not remove training work. Holding the busy
time and the last unit's cost as measured, the bound with the first group complete at 0 s and the rollout ending a
fraction `c` earlier is max((1 - c) * rollout end + last, busy); its cut against the measured rollout->train end is
the most such an order could save (the step's own gap to its bound, orchestration, is not an order's to remove).
"""
import json, statistics as st, sys

r = json.load(open(sys.argv[1]))
runs = {(x["mode"], x["seed"]): x for x in r["runs"]}
seeds = sorted({s for (_, s) in runs})
mode = sys.argv[2] if len(sys.argv) > 2 else "cgp_group"

for lo, hi in ((1, 16), (9, 16)):
    steps_of = {s: [x for x in runs[mode, s]["steps"] if lo <= x["step"] <= hi] for s in seeds}
    allsteps = [x for s in seeds for x in steps_of[s]]
    rollout_side = sum(1 for x in allsteps if x["rollout_end_s"] + x["last_unit_cost_s"] >= x["ideal_lower_bound_s"] - 1e-9)
    first_work = [x["ideal_lower_bound_s"] - x["trainer_busy_s"] for x in allsteps
                  if x["rollout_end_s"] + x["last_unit_cost_s"] < x["ideal_lower_bound_s"] - 1e-9]
    gap = [100 * (1 - st.mean(x["ideal_lower_bound_s"] for x in steps_of[s]) / st.mean(x["rollout_to_train_end_s"] for x in steps_of[s])) for s in seeds]
    print(f"{mode}, steps {lo}-{hi}: {len(allsteps)} steps; the rollout side binds in {rollout_side}; where the trainer "
          f"side binds, the first group completes at {st.mean(first_work):.2f} s (mean of {len(first_work)}); "
          f"the step's gap to its bound {st.mean(gap):.1f}% +- {st.stdev(gap) / len(gap) ** 0.5:.1f}%")
    for c in (0.0, 0.05, 0.10, 0.20):
        cuts = []
        for s in seeds:
            xs = steps_of[s]
            bound = st.mean(max((1 - c) * x["rollout_end_s"] + x["last_unit_cost_s"], x["trainer_busy_s"]) for x in xs)
            ideal = st.mean(x["ideal_lower_bound_s"] for x in xs)
            cuts.append(100 * (bound - ideal) / st.mean(x["rollout_to_train_end_s"] for x in xs))
        print(f"  first group at 0 s, rollout end {100 * c:.0f}% earlier: the most an order cuts "
              f"{st.mean(cuts):+.1f}% +- {st.stdev(cuts) / len(cuts) ** 0.5:.1f}% (per seed {', '.join(f'{v:+.1f}' for v in cuts)})")
