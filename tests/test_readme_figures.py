"""The README's and docs' prose figures (docs/results.md: one line per registered study) quoted from
a bench JSON in docs/bench match that JSON (the tables are
checked by tests/test_readme_tables.py). Each entry below is a short phrase of the document with its figures
computed from the JSON it cites, rounded as the text rounds them; a figure that drifts from its JSON, or a phrase
reworded without updating this list, fails here. Whitespace (line wrapping) is ignored."""

import json
import re
from functools import lru_cache
from pathlib import Path

import pytest

from verl_pipe_lab.bench.readme_tables import MINUS, change

ROOT = Path(__file__).resolve().parents[1]


@lru_cache(maxsize=None)
def bench(name: str) -> dict:
    with open(ROOT / "docs" / "bench" / name) as f:
        return json.load(f)


@lru_cache(maxsize=None)
def text(doc: str) -> str:
    return re.sub(r"\s+", " ", (ROOT / doc).read_text())


def setting(name: str, json_name: str) -> dict:
    (s,) = [s for s in bench(json_name)["settings"] if s["name"] == name]
    return s


def mode(json_name: str, setting_name: str, m: str) -> dict:
    return setting(setting_name, json_name)["modes"][m]


def pct0(reduction: float) -> str:
    """A reduction as the text writes it with no decimals: −62%."""
    return f"{MINUS}{reduction:.0f}%" if reduction > 0 else f"+{-reduction:.0f}%"


B30, PAPER = "bench_2026-11-30.json", "longtail-paper-lognormal-m40-s0.8-c128"
TINY = "longtail-paper-tiny-lognormal-m48-s1.0-c512"
COAL, SYSR, PERCALL = ("bench_paper_tiny_coalesced_2026-12-01.json", "ab_paper_tiny_system_cores_rollout_2026-12-01.json",
                       "ab_paper_tiny_percall_2026-12-01.json")
QUICK, AB = "trainer_gap_quick_2026-12-01.json", "ab_paper_2026-12-01.json"


def _fgd(suffix: str) -> dict:
    return mode(B30, PAPER + suffix, "cgp_fgd")


def _vs_verl_quick(setting_name: str, m: str) -> float:
    """How much shorter than verl's on-policy peer (of the length-sorted setting) a mode's step was, in %."""
    verl = mode(QUICK, "longtail-quick", "verl_separate_async")["rollout_to_train_end_s"]
    return 100 * (1 - mode(QUICK, setting_name, m)["rollout_to_train_end_s"] / verl)


def _per_run(m: str) -> str:
    runs = mode(AB, PAPER, m)["per_run"]
    return " / ".join(f"{r['rollout_to_train_end_s']:.1f}" for r in runs)


def _ours_max_sim_error(json_name: str) -> float:
    per = bench(json_name)["sim_validation"]["per_mode"]
    return 100 * max(v["max_rel_error"] for k, v in per.items() if not k.startswith("verl"))


def _cost(json_name: str, m: str, kind: str, phase: str) -> str:
    return f"{mode(json_name, TINY, m)['trainer_s_per_1k_padded_tokens'][kind][phase]:.3f}"


def _span(setting_name: str, m: str, kind: str) -> dict:
    (row,) = [r for r in bench("trainer_gap_paper_spans_2026-12-01.json")["rows"]
              if r["setting"] == setting_name and r["mode"] == m]
    return row[kind]


def _padding(setting_name: str, m: str, kind: str) -> float:
    """Padded tokens over real tokens, in % above 100."""
    span = _span(setting_name, m, kind)
    return 100 * (span["padded_tokens"] / span["tokens"] - 1)


def _less_padding(kind: str) -> float:
    """How many fewer padded tokens verl's peer computed than cgp for the same rows, in %."""
    ours = _span("longtail-paper", "cgp", kind)["padded_tokens"]
    return 100 * (1 - _span("longtail-paper", "verl_separate_async", kind)["padded_tokens"] / ours)


def _eff_range(key: str) -> str:
    """The pipelined modes' range of an efficiency on the quick shape, length-sorted, as the text writes it."""
    got = [mode(QUICK, "longtail-quick", m)[key] for m in ("cgp", "cgp_group", "cgp_fgd")]
    lo, hi = f"{min(got):.2f}", f"{max(got):.2f}"
    return lo if lo == hi else f"{lo}–{hi}"


SIM, BASE44 = "sim_cluster_grid_2026-12-02.json", "longtail-D1-base-early-4R4T"
PLACE = "sim_cluster_placements_2026-12-02.json"


def _sim(name: str) -> dict:
    (s,) = [s for s in bench(SIM)["settings"] if s["name"] == name]
    return s


def _sim_at_tr1(s: dict) -> dict:
    (tr,) = [t for t in s["tr_sweep"] if t["target_train_to_rollout"] == 1.0]
    return tr["modes"]


def _wait_cut(modes: dict, m: str) -> float:
    """How much less the trainer waited than in sync, in %."""
    return 100 * (1 - modes[m]["trainer_wait_ratio"] / modes["sync"]["trainer_wait_ratio"])


def _placed(name: str, m: str, placement: str) -> float:
    (s,) = [s for s in bench(PLACE)["settings"] if s["name"] == name]
    return s["placements"][placement][m]["reduction_vs_sync_pct"]


def _placement_spread(a: str, b: str) -> float:
    """The most points any pipelined mode on any setting gains from placement ``b`` over ``a``."""
    return max(s["placements"][b][m]["reduction_vs_sync_pct"] - s["placements"][a][m]["reduction_vs_sync_pct"]
               for s in bench(PLACE)["settings"] for m in s["placements"][a] if m.startswith("cgp"))


def _cluster_tr1() -> str:
    """CGP+FGD's range at T/R = 1 over the grid's settings, as docs/results.md writes it."""
    ss = bench(SIM)["settings"]
    notail = [_sim_at_tr1(s)["cgp_fgd"]["reduction_vs_sync_pct"] for s in ss if s["name"].startswith("notail")]
    tail = [_sim_at_tr1(s)["cgp_fgd"]["reduction_vs_sync_pct"] for s in ss if s["name"].startswith("longtail")]
    waits = [_wait_cut(_sim_at_tr1(s), "cgp_fgd") for s in ss]
    return (f"from {MINUS}{notail[0]:.1f}% (no tail) and {MINUS}{min(tail):.1f}% to {MINUS}{max(tail):.1f}% with "
            f"{MINUS}{min(waits):.0f}% to {MINUS}{max(waits):.0f}% wait")


# the README chart's two panels (python -m verl_pipe_lab.bench.learn_charts): v3 (sync vs CGP+FGD, the arms' order
# balanced) and v2, the last comparison that ran verl's peer beside them
LEARN = "learn_chain_v3_2026-12-07.json"
LEARN_PEER = "learn_chain_v2_7b_2026-12-06.json"


def _signed(x: float, fmt: str) -> str:
    return (MINUS if x < 0 else "+") + format(abs(x), fmt)


def _ends_where_sync_does(t: dict) -> str:
    """The final-accuracy verdict in words, from the equivalence test's record."""
    tost = t["tost"]
    fig = f"final accuracy {_signed(tost['mean'], '.3f')} ± {tost['se']:.3f}"
    if tost["equivalent"]:
        return f"ends where sync does ({fig}, equivalent within ±{tost['margin']}"
    lo, hi = tost["ci"]
    return (f"is not shown to end where sync does ({fig}, 90% CI [{_signed(lo, '.3f')}, {_signed(hi, '.3f')}] "
            f"not within ±{tost['margin']}")


def _per_step(d: dict) -> str:
    more = "less" if d["relative"] < 0 else "more"
    return f"{abs(100 * d['relative']):.1f}% ± {100 * d['relative_se']:.1f}% {more} training time per step"


def _sooner(t: dict) -> str:
    tt = t["time_to_target"]
    if tt["relative"] >= 0:
        return f"{100 * tt['relative']:.1f}% ± {100 * tt['relative_se']:.1f}% later"
    shown = "shown" if t["sooner_shown"] else "not significant"
    return f"{-100 * tt['relative']:.1f}% ± {100 * tt['relative_se']:.1f}% sooner ({shown})"


def _learning_caption() -> str:
    """README's caption under the learning chart, every verdict worded from the merged comparisons."""
    c = bench(LEARN)["comparison"]
    t, aa = c["tests"]["cgp_fgd"], c["aa"]
    n = {len(v["seeds"]) for v in c["summary"].values()}
    assert len(n) == 1, f"{LEARN}: the modes ran different numbers of seeds {n}"
    aa_tt = aa["time_to_target"]
    peer = bench(LEARN_PEER)["comparison"]
    pn = {len(v["seeds"]) for v in peer["summary"].values()}
    assert len(pn) == 1, f"{LEARN_PEER}: the modes ran different numbers of seeds {pn}"
    pt = peer["tests"]["verl_separate_async_tuned"]
    return (f"{n.pop()} seeds a mode paired by seed, {bench(LEARN)['val_size']} held-out questions, the arms' "
            f"order balanced, pre-registered): CGP+FGD {_ends_where_sync_does(t)}; the A/A "
            f"{'passes' if aa['passes'] else 'fails'}) with {_per_step(t['step_time'])} and reaches sync's final "
            f"accuracy less that margin {_sooner(t)}; the A/A's two sync arms differ by "
            f"{abs(100 * aa_tt['relative']):.1f}% ± {100 * aa_tt['relative_se']:.1f}% there "
            f"({'shown' if aa['sooner_shown'] else 'not shown'}). Right ({pn.pop()} seeds, another VM): verl's peer "
            f"{'is equivalent too' if pt['tost']['equivalent'] else 'is not shown equivalent'} "
            f"({_signed(pt['tost']['mean'], '.3f')} ± {pt['tost']['se']:.3f}) with {_per_step(pt['step_time'])}")


POOLED = "learn_pooled_chain_2026-12-07.json"


def _pooled_caption() -> str:
    """README's headline: every registered attempt pooled (python -m verl_pipe_lab.bench.learn_pool), the error between
    attempts, end to end beside training-only, the A/A through the same arithmetic."""
    r = bench(POOLED)
    p, aa = r["pooled"], r["aa_pooled"]

    def pct(fig, pool=p, key="se_between"):
        return f"{abs(100 * pool[fig]['estimate']):.1f}% ± {100 * pool[fig][key]:.1f}%"

    per = ", ".join(f"{_signed(100 * a['time_to_target']['relative'], '.1f')}%" for a in r["per_attempt"])
    equivalent = all(bench(Path(a["name"]).name)["comparison"]["tests"][r["mode"]]["tost"]["equivalent"]
                     for a in r["per_attempt"])
    return (f"Pooled over the {p['pairs']} pairs, CGP+FGD reached sync's final accuracy less 0.05 {pct('time_to_target')} "
            f"sooner (per attempt {per}), with {pct('step_time')} less training time per step and {pct('end_to_end')} "
            f"less end to end (start-up and validation included); "
            f"{'each' if equivalent else 'not every'} attempt's final accuracy was equivalent to sync's (±0.05). The A/A's two sync arms differ by {pct('time_to_target', aa, 'se')} in time to that "
            f"accuracy, so that figure is noisy.")


FIGURES = {
    # docs/results.md: the paper regime's FGD window sweep and its targets (bench_2026-11-30.json)
    "results window sweep": ("docs/results.md", lambda: (
        f"window 32 (one unit) {change(_fgd('-w32')['reduction_vs_sync_pct'])} vs its sync, 64 "
        f"(`auto`) {change(_fgd('')['reduction_vs_sync_pct'])}, 256 (everything) "
        f"{change(_fgd('-w256')['reduction_vs_sync_pct'])} (slower than its sync); the rollout takes "
        + " / ".join(f"{_fgd(x)['rollout_end_s']:.1f}" for x in ("-w32", "", "-w256")) + " s")),
    "results window sweep, first unit": ("docs/results.md", lambda: (
        "first unit ready " + " / ".join(f"{_fgd(x)['first_unit_ready_s']:.1f}" for x in ("-w32", "", "-w256")) + " s")),
    "results no-tail control": ("docs/results.md", lambda: (
        "(`notail-paper-equal-L48`): " + " to ".join(
            change(r) for r in sorted(mode(B30, "notail-paper-equal-L48", m)["reduction_vs_sync_pct"]
                                      for m in ("cgp", "cgp_group", "cgp_fgd"))[::2]) + ", no cost")),
    "results paper regime T/R": ("docs/results.md", lambda: f"(sync T/R = {setting(PAPER, B30)['sync_train_to_rollout_ratio']:.1f}, "),
    "results balanced T/R": ("docs/results.md", lambda: (
        f"sync T/R = {setting('longtail-lognormal-m160-s0.4-c256', B30)['sync_train_to_rollout_ratio']:.2f}")),
    "results paper regime targets": ("docs/results.md", lambda: (
        f"`targets`: {change(bench(B30)['targets']['reduction_vs_sync_pct']['value'])} vs the "
        f"{MINUS}{bench(B30)['targets']['reduction_vs_sync_pct']['target']}% target for cgp_fgd, wait "
        f"{pct0(bench(B30)['targets']['wait_reduction_vs_sync_pct']['value'])} vs "
        f"{MINUS}{bench(B30)['targets']['wait_reduction_vs_sync_pct']['target']:.0f}%")),
    # docs/results.md: the trainer gap on the quick long tail (trainer_gap_quick_2026-12-01.json)
    "results trainer gap, quick": ("docs/results.md", lambda: (
        f"the best mode is {max(_vs_verl_quick('longtail-quick', m) for m in ('cgp', 'cgp_group', 'cgp_fgd')):.1f}% "
        f"ahead of verl's on-policy trainer (cgp {_vs_verl_quick('longtail-quick', 'cgp'):.1f}%), where in the old "
        f"order cgp led by {_vs_verl_quick('longtail-quick-arrival', 'cgp'):.1f}% and sync trailed by "
        f"{-_vs_verl_quick('longtail-quick-arrival', 'sync'):.1f}%")),
    # docs/results.md: the trainer gap's padding on the paper shape (trainer_gap_paper_spans_2026-12-01.json: sync's arrival-order
    # update against verl's peer, and the old log-probs, still in arrival order)
    "results trainer gap, padding": ("docs/results.md", lambda: (
        f"response (+{_padding('longtail-paper-arrival', 'sync', 'update'):.0f}% over the real tokens on the paper "
        f"shape), while verl's rows come out of TransferQueue in completion order, close to length order "
        f"(+{_padding('longtail-paper', 'verl_separate_async', 'update'):.0f}%)")),
    "results trainer gap, old log-probs": ("docs/results.md", lambda: (
        f"(verl's pad {_less_padding('old_log_prob'):.0f}% less there)")),
    # docs/results.md: the quick shape's efficiencies, own bound against uncontended (trainer_gap_quick_2026-12-01.json)
    "results uncontended efficiency": ("docs/results.md", lambda: (
        f"the pipelined modes' {_eff_range('pipeline_efficiency')} falls to {_eff_range('uncontended_efficiency')} "
        f"uncontended")),
    # docs/results.md: the span-by-span A/B (ab_paper_2026-12-01.json, per round)
    "results A/B rounds": ("docs/results.md", lambda: (
        f"sync {_per_run('sync')} s, cgp {_per_run('cgp')} s, verl on-policy {_per_run('verl_separate_async')} s")),
    "results A/B trainer busy": ("docs/results.md", lambda: (
        "The trainers were busy " + ", ".join(
            f"{label} {mode(AB, PAPER, m)['trainer_busy_s']:.1f} s"
            for label, m in (("sync", "sync"), ("cgp", "cgp"), ("verl", "verl_separate_async")))
        + f" per step (`trainer_busy_s`, the two rounds' mean): ours "
        f"{100 * (mode(AB, PAPER, 'cgp')['trainer_busy_s'] / mode(AB, PAPER, 'verl_separate_async')['trainer_busy_s'] - 1):.0f}% "
        "more than verl's")),
    "results A/B rollout": ("docs/results.md", lambda: "sync rollout " + "–".join(
        f"{f(r['rollout_end_s'] for r in mode(AB, PAPER, 'sync')['per_run']):.1f}" for f in (min, max)) + " s"),
    # docs/results.md: paper_tiny (bench_paper_tiny_2026-12-01.json and the coalesced rerun)
    "results paper_tiny time": ("docs/results.md", lambda: (
        f"~6 min: {bench('bench_paper_tiny_2026-12-01.json')['elapsed_s']['total']:.0f} s")),
    "results paper_tiny T/R": ("docs/results.md", lambda: f"Sync T/R {setting(TINY, COAL)['sync_train_to_rollout_ratio']:.2f}"),
    "results paper_tiny targets": ("docs/results.md", lambda: (
        f"**met** ({change(bench(COAL)['targets']['reduction_vs_verl_separate_async_pct']['value'])} for cgp+fgd); "
        f"efficiency ≥ 0.95: met (against the mode's own trainer time; the uncontended efficiency needs the per-step "
        f"file, which was not kept); {MINUS}{bench(COAL)['targets']['reduction_vs_sync_pct']['target']}% vs sync and "
        f"{MINUS}{bench(COAL)['targets']['wait_reduction_vs_sync_pct']['target']:.0f}% wait: **not met** "
        f"({change(bench(COAL)['targets']['reduction_vs_sync_pct']['value'])}, "
        f"{pct0(bench(COAL)['targets']['wait_reduction_vs_sync_pct']['value'])})")),
    "results paper_tiny first unit": ("docs/results.md", lambda: (
        f"ready earlier ({mode(COAL, TINY, 'cgp_fgd')['first_unit_ready_s']:.2f} s vs "
        f"{mode(COAL, TINY, 'cgp')['first_unit_ready_s']:.2f} s for cgp)")),
    "results paper_tiny simulator": ("docs/results.md", lambda: (
        f"reproduces every mode within {_ours_max_sim_error(COAL):.1f}%, verl's peer within "
        f"{100 * bench(COAL)['sim_validation']['per_mode']['verl_separate_async']['max_rel_error']:.1f}%")),
    # docs/results.md: system_cores=rollout (ab_paper_tiny_system_cores_rollout_2026-12-01.json) against `all` (coalesced run)
    "results system_cores costs": ("docs/results.md", lambda: (
        f"(update {_cost(SYSR, 'cgp', 'update', 'during_rollout')} / {_cost(SYSR, 'cgp', 'update', 'after_rollout')} s, "
        f"log-prob {_cost(SYSR, 'cgp', 'old_log_prob', 'during_rollout')} / "
        f"{_cost(SYSR, 'cgp', 'old_log_prob', 'after_rollout')} s per 1k padded tokens")),
    "results system_cores result": ("docs/results.md", lambda: (
        f"cgp gains {change(mode(SYSR, TINY, 'cgp')['reduction_vs_sync_pct'])} vs sync, but the rollout itself takes "
        f"twice as long ({mode(SYSR, TINY, 'sync')['rollout_end_s']:.1f} s vs {mode(COAL, TINY, 'sync')['rollout_end_s']:.1f} s), "
        f"so every mode is slower in absolute terms (sync {mode(SYSR, TINY, 'sync')['rollout_to_train_end_s']:.1f} s, "
        f"cgp {mode(SYSR, TINY, 'cgp')['rollout_to_train_end_s']:.1f} s)")),
    "results paper_tiny trainer busy": ("docs/results.md", lambda: (
        "the pipelined trainer is busy " + "–".join(
            f"{f(mode(COAL, TINY, m)['trainer_busy_s'] for m in ('cgp', 'cgp_group', 'cgp_fgd')):.1f}" for f in (min, max))
        + f" s per step where sync's is busy {mode(COAL, TINY, 'sync')['trainer_busy_s']:.1f} s")),
    "results per-call A/B trainer busy": ("docs/results.md", lambda: (
        f"with the trainer about as busy (cgp {mode(PERCALL, TINY, 'cgp')['trainer_busy_s']:.2f} s vs "
        f"{mode(COAL, TINY, 'cgp')['trainer_busy_s']:.2f} s)")),
    "results per-call A/B": ("docs/results.md", lambda: (
        f"(cgp {mode(PERCALL, TINY, 'cgp')['rollout_to_train_end_s']:.2f} s vs "
        f"{mode(COAL, TINY, 'cgp')['rollout_to_train_end_s']:.2f} s)")),
    # README.md: the headline table's setting (bench_paper_tiny_coalesced_2026-12-01.json; the table is marked)
    "README headline": ("README.md", lambda: (
        f"{ {3: 'three'}[len(mode(COAL, TINY, 'sync')['per_run'])]} rounds on 2026-12-01, "
        f"Sync T/R {setting(TINY, COAL)['sync_train_to_rollout_ratio']:.2f}")),
    # README.md: the chart's caption, the powered learning comparison (v2, seven blocks; issue 39)
    "README learning chart": ("README.md", _pooled_caption),
    # docs/results.md: the cluster-scale simulation (sim_cluster_grid_2026-12-02.json, python -m verl_pipe.sim --grid cluster_grid)
    "results cluster grid, 4+4": ("docs/results.md", lambda: (
        f"{MINUS}{_sim(BASE44)['modes']['cgp_fgd']['reduction_vs_sync_pct']:.1f}% and "
        f"{MINUS}{_wait_cut(_sim(BASE44)['modes'], 'cgp_fgd'):.0f}% trainer wait on the 4+4 split of the base long-tail "
        f"distribution (T/R {_sim(BASE44)['sync_train_to_rollout_ratio']:.2f})")),
    "results cluster grid, T/R 1": ("docs/results.md", _cluster_tr1),
    "results cluster placements": ("docs/results.md", lambda: (
        f"CGP loses up to {_placement_spread('pageable', 'pinned'):.0f} points (cgp on the 6+2 split of the base "
        f"distribution {MINUS}{_placed('longtail-D1-base-early-6R2T', 'cgp', 'pageable'):.1f}% instead of "
        f"{MINUS}{_placed('longtail-D1-base-early-6R2T', 'cgp', 'pinned'):.1f}%, group granularity on the no-tail control "
        f"{MINUS}{_placed('notail-equal1000-4R4T', 'cgp_group', 'pageable'):.1f}% instead of "
        f"{MINUS}{_placed('notail-equal1000-4R4T', 'cgp_group', 'pinned'):.1f}%); `device` adds at most "
        f"{_placement_spread('pinned', 'device'):.1f} points over `pinned`")),
    "results cluster grid, vs verl": ("docs/results.md", lambda: (
        f"e.g. {MINUS}{_sim(BASE44)['modes']['cgp_fgd']['reduction_vs_sync_pct']:.1f}% vs "
        f"{MINUS}{_sim(BASE44)['modes']['verl_separate_async']['reduction_vs_sync_pct']:.1f}% on that split")),
    # docs/cpu.md: the same system_cores A/B
    "cpu.md system_cores": ("docs/cpu.md", lambda: (
        f"(cgp's updates {_cost(SYSR, 'cgp', 'update', 'during_rollout')} s per 1,000 padded tokens during the rollout "
        f"vs {_cost(SYSR, 'cgp', 'update', 'after_rollout')} s after it, against "
        f"{_cost(COAL, 'cgp', 'update', 'during_rollout')} vs {_cost(COAL, 'cgp', 'update', 'after_rollout')} s with "
        f"`all`), so cgp gained {change(mode(SYSR, TINY, 'cgp')['reduction_vs_sync_pct'])} vs sync instead of "
        f"{change(mode(COAL, TINY, 'cgp')['reduction_vs_sync_pct'])}; but the rollout took twice as long (sync "
        f"{mode(SYSR, TINY, 'sync')['rollout_end_s']:.2f} s vs {mode(COAL, TINY, 'sync')['rollout_end_s']:.2f} s) and "
        f"every mode got slower (rollout→train end sync {mode(SYSR, TINY, 'sync')['rollout_to_train_end_s']:.1f} s vs "
        f"{mode(COAL, TINY, 'sync')['rollout_to_train_end_s']:.1f} s, cgp "
        f"{mode(SYSR, TINY, 'cgp')['rollout_to_train_end_s']:.1f} s vs {mode(COAL, TINY, 'cgp')['rollout_to_train_end_s']:.1f} s)")),
    # docs/fgd.md: the window sweep's rollout times
    "fgd.md window sweep": ("docs/fgd.md", lambda: (
        f"the rollout took {_fgd('-w32')['rollout_end_s']:.1f} s with a window of 32 (one unit), "
        f"{_fgd('')['rollout_end_s']:.1f} s with `auto` (64) and {_fgd('-w256')['rollout_end_s']:.1f} s with 256 "
        f"(everything), while the first unit was ready at "
        + " / ".join(f"{_fgd(x)['first_unit_ready_s']:.1f}" for x in ("-w32", "", "-w256")) + " s")),
}


@pytest.mark.parametrize("name", sorted(FIGURES))
def test_a_quoted_figure_matches_its_json(name):
    doc, phrase = FIGURES[name]
    expected = re.sub(r"\s+", " ", phrase())
    assert expected in text(doc), f"{doc}: expected the phrase (figures from the JSON)\n  {expected}"


def test_a_drifted_figure_fails():
    doc, phrase = FIGURES["results window sweep"]
    assert phrase() in text(doc)
    assert phrase().replace("+0.2%", "+0.3%") not in text(doc)


def test_simulated_cgp_fgd_beats_verls_peer_on_every_cluster_setting():
    """docs/results.md's "beats verl's separate_async (simulated) on every setting", as is and at T/R = 1."""
    assert "beats verl's separate_async (simulated) on every setting" in text("docs/results.md")
    for s in bench(SIM)["settings"]:
        for modes in (s["modes"], _sim_at_tr1(s)):
            assert modes["cgp_fgd"]["reduction_vs_sync_pct"] > modes["verl_separate_async"]["reduction_vs_sync_pct"], s["name"]


FAULT_LOG = ROOT / "docs" / "bench" / "logs" / "faults_e2e_2026-12-02.log.gz"


def fault_figures(log: str) -> dict:
    """The figures docs/reliability.md quotes from the fault and signal tests' printed lines and pytest's durations."""
    def one(pattern: str) -> str:
        (got,) = re.findall(pattern, log)
        return got

    deaths = re.findall(r"'died [^']+': ([\d.]+)", one(r"engine deaths by phase: recovery \{([^}]*)\}"))
    gaps = [float(g) for g in re.findall(r": ([\d.e-]+)", one(r"log-prob gap \{([^}]*)\}"))]
    return {"replica": one(r"recovered in ([\d.]+)s"), "deaths": deaths, "gap": f"{max(gaps):.1e}",
            "sigterm": one(r"SIGTERM to the group → exit 143 in ([\d.]+)s"),
            "sigint": one(r"SIGINT then SIGTERM to the group → exit 130 in ([\d.]+)s"),
            "setup": one(r"([\d.]+)s setup +tests/e2e/test_faults.py"),
            "signals_call": one(r"([\d.]+)s call +tests/e2e/test_zz_signals.py")}


def test_the_reliability_page_fault_times_are_the_logs():
    import gzip

    with gzip.open(FAULT_LOG, "rt", errors="replace") as fh:
        f = fault_figures(fh.read())
    readme = text("docs/reliability.md")
    for phrase in (f"comes back with θ_k ({f['replica']} s here)",
                   f"θ_k at a step's start; {', '.join(f['deaths'][:-1])} and {f['deaths'][-1]} s)",
                   f"log-prob gap of its samples {f['gap']})", f"mid-step stops it in {f['sigterm']} s",
                   f"stops that one in {f['sigint']} s", f"stack was up in {f['setup']} s",
                   f"passed in {f['signals_call']} s in the fault run above"):
        assert phrase in readme, f"docs/reliability.md: expected (from {FAULT_LOG.name}) {phrase!r}"


def test_fault_figures_are_read_from_the_printed_lines():
    log = ("[fault] replica killed when unit 0 was in, 24 requests in flight; recovered in 41.1s, step 45.5s\n"
           "[fault] engine deaths by phase: recovery {'died while training': 37.0, 'died between steps': 35.1} s; "
           "max |vLLM - θ_k| log-prob gap {'restarted (1)': 9.5367431640625e-07, 'restarted (3)': 2e-06}\n"
           "[signals] SIGTERM to the group → exit 143 in 10.5s; 25 processes\n"
           "[signals] SIGINT then SIGTERM to the group → exit 130 in 4.5s; checkpoints\n"
           "58.50s setup    tests/e2e/test_faults.py::test_a\n159.62s call     tests/e2e/test_zz_signals.py::test_b\n")
    assert fault_figures(log) == {"replica": "41.1", "deaths": ["37.0", "35.1"], "gap": "2.0e-06", "sigterm": "10.5",
                                  "sigint": "4.5", "setup": "58.50", "signals_call": "159.62"}
