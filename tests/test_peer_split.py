"""docs/peer.md's gain split (lab/verl_pipe_lab/bench/peer/split.py): per-round pairing, gains in points, the target's line and
the table readme_tables renders from a results JSON. Pure."""

import math

import pytest

from verl_pipe_lab.bench import readme_tables as rt
from verl_pipe_lab.bench.peer import split


def _setting(**per_mode):
    return {"name": "longtail-x", "modes": {m: {"per_run": [{"rollout_to_train_end_s": v} for v in vals]}
                                            for m, vals in per_mode.items()}}


RUNS = dict(sync=[10.0, 11.0, 12.0], cgp=[8.0, 9.0, 9.0], cgp_fgd=[7.0, 8.5, 9.0],
            verl_separate_sync=[12.0, 12.0, 13.0], verl_separate_async_tuned=[11.0, 10.5, 12.0],
            verl_colocated=[9.0, 9.5, 10.0])


def test_rows_pair_rounds_and_skip_modes_that_did_not_run():
    sp = split.gain_split(_setting(**RUNS))
    stack = next(r for r in sp["rows"] if r["group"] == "stack")
    assert stack["a"] == "verl_separate_sync" and stack["b"] == "sync"
    assert stack["diffs"] == [-2.0, -1.0, -1.0] and stack["diff_mean"] == pytest.approx(-4 / 3)
    assert stack["diff_se"] == pytest.approx(math.sqrt(1 / 3) / math.sqrt(3))  # stdev of (-2,-1,-1) / sqrt(3)
    assert stack["change_pct"] == pytest.approx(100 * ((10 / 12 - 1) + (11 / 12 - 1) + (12 / 13 - 1)) / 3)
    # a mode that did not run leaves out only its rows
    runs = dict(RUNS)
    del runs["verl_colocated"]
    groups = {r["group"] for r in split.gain_split(_setting(**runs))["rows"]}
    assert "split vs colocated" not in groups and "stack" in groups


def test_pipelining_points_and_absolute_targets():
    sp = split.gain_split(_setting(**RUNS))
    pp = sp["pipelining_points"]
    ours = [100 * (1 - f / s) for f, s in zip(RUNS["cgp_fgd"], RUNS["sync"])]
    verl = [100 * (1 - t / s) for t, s in zip(RUNS["verl_separate_async_tuned"], RUNS["verl_separate_sync"])]
    assert pp["ours"][0] == pytest.approx(sum(ours) / 3) and pp["verl"][0] == pytest.approx(sum(verl) / 3)
    assert pp["difference"][0] == pytest.approx(sum(o - v for o, v in zip(ours, verl)) / 3)
    assert pp["met"] is (pp["difference"][0] >= split.TARGET_POINTS)
    assert sp["absolute"]["verl_separate_async_tuned"]["met"] is True  # cgp+fgd shorter in the mean
    assert sp["absolute"]["verl_colocated"]["diff_mean"] == pytest.approx((-2.0 - 1.0 - 1.0) / 3)


def test_table_renders_a_row_per_comparison_and_the_target_line():
    lines = split.split_table({"settings": [_setting(**RUNS)]})
    assert lines[0] == "`longtail-x` (3 rounds, rollout→train end)"
    rows = [ln for ln in lines if ln.startswith("| ") and not ln.startswith("| source")]
    assert len(rows) == len(split.COMPARISONS) - 1  # no verl_separate_async (untuned) in RUNS
    assert "| stack | our sync vs verl's separate sync | 12.33 s | 11.00 s | \u22121.33 ± 0.33 s |" in lines[4]
    assert lines[-3].startswith("Pipelining gain over its own sync: ours (cgp + fgd) ")
    assert lines[-1].startswith("Our lead over verl's tuned separate_async")
    assert "gain_split" in rt.KINDS  # docs/peer.md's marked tables render through readme_tables


def test_colocated_phases_from_a_steps_file(tmp_path):
    import gzip
    import json

    from verl_pipe_lab.bench.peer import phases

    def step(r, gen):
        return {"setting": "longtail-x", "mode": "verl_colocated", "round": r, "model_size": "tiny",
                "lengths": [[3, 4], [5, 6]],
                "metrics": {"rollout_end_s": gen, "rollout_to_train_end_s": gen + 3.0, "step_wall_s": gen + 3.5,
                            "weight_sync_s": 0.4},
                "verl_timing_s": {"gen": gen + 0.2},
                "train_spans": [{"kind": "old_log_prob", "start": gen + 0.3, "end": gen + 1.0},
                                {"kind": "update", "start": gen + 1.0, "end": gen + 3.0}],
                "phases": [{"phase": "sleep", "start": gen + 0.1, "end": gen + 0.2},
                           {"phase": "weight_reload", "start": gen + 3.0, "end": gen + 3.4}]}

    sync = {"setting": "longtail-x", "mode": "sync", "round": 0,
            "metrics": {"rollout_end_s": 4.0, "trainer_busy_s": 3.0, "rollout_to_train_end_s": 7.5,
                        "weight_sync_s": 0.2}}
    path = tmp_path / "steps.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"steps": [step(1, 6.0), step(0, 5.0), sync]}, f)
    out = phases.colocated_phases(phases.load_steps(str(path)), "steps.json.gz")["longtail-x"]
    ph = out["phases"]
    assert out["rounds"] == 2 and ph["generate"]["rounds"] == [5.0, 6.0]  # in round order
    assert ph["wake"]["mean"] == 0.0 and ph["sleep"]["mean"] == pytest.approx(0.1)
    assert ph["old_log_prob"]["mean"] == pytest.approx(0.7) and ph["update"]["mean"] == pytest.approx(2.0)
    assert ph["weight_reload"]["mean"] == pytest.approx(0.4) and ph["gen_wait"]["mean"] == pytest.approx(5.7)
    assert ph["generate"]["se"] == pytest.approx(0.5) and out["response_tokens_per_round"] == [18, 18]
    assert out["split_sync"]["trainer_busy_s"] == 3.0
    assert phases.main([str(path), "--out", str(tmp_path / "p.json")]) == 0
    assert json.loads((tmp_path / "p.json").read_text())["sleep_available"] is False


def test_windows_combine_rounds_and_the_aa_pairs_each_mode_with_itself(tmp_path, capsys):
    import json

    w1 = {"settings": [_setting(sync=[10.0, 11.0, 12.0], cgp_fgd=[7.0, 8.0, 9.0])]}
    w2 = {"settings": [_setting(sync=[10.5, 11.0, 12.5], cgp_fgd=[7.0, 8.5, 8.0], verl_colocated=[9.0, 9.0, 9.0])]}
    c = split.combine([w1, w2], ["a.json", "b.json"])
    modes = c["settings"][0]["modes"]
    assert set(modes) == {"sync", "cgp_fgd"}  # a mode missing from one window is left out
    assert split.per_round(c["settings"][0], "sync") == [10.0, 11.0, 12.0, 10.5, 11.0, 12.5]
    aa = c["aa"]["longtail-x"]["sync"]
    assert aa["diffs"] == [0.5, 0.0, 0.5] and aa["diff_mean"] == pytest.approx(1 / 3)
    lines = split.aa_table(c)
    assert lines[0].startswith("`longtail-x`: A/A") and "a.json → b.json" in lines[0]
    assert any(ln.startswith("| sync | 11.00 s | 11.33 s | +0.33 ± ") for ln in lines)
    assert "gain_split_aa" in rt.KINDS
    with pytest.raises(ValueError, match="at least two windows"):
        split.combine([w1])
    p1, p2, out = tmp_path / "w1.json", tmp_path / "w2.json", tmp_path / "c.json"
    p1.write_text(json.dumps(w1))
    p2.write_text(json.dumps(w2))
    assert split.main(["--combine", str(p1), str(p2), "--out", str(out)]) == 0
    assert json.loads(out.read_text())["windows"] == [str(p1), str(p2)]
    assert "A/A" in capsys.readouterr().out


def test_the_lead_splits_exactly_into_plumbing_and_pipelining():
    ld = split.gain_split(_setting(**RUNS))["lead"]
    lead = [t - f for t, f in zip(RUNS["verl_separate_async_tuned"], RUNS["cgp_fgd"])]
    plumbing = [v - s for v, s in zip(RUNS["verl_separate_sync"], RUNS["sync"])]
    assert ld["lead"][0] == pytest.approx(sum(lead) / 3) and ld["plumbing"][0] == pytest.approx(sum(plumbing) / 3)
    assert ld["lead"][0] == pytest.approx(ld["plumbing"][0] + ld["pipelining"][0])
    assert ld["plumbing_share"] == pytest.approx(sum(plumbing) / sum(lead))
    runs = dict(RUNS)
    del runs["verl_separate_sync"]
    assert "lead" not in split.gain_split(_setting(**runs))
    assert any(ln.startswith("Our lead over verl's tuned separate_async") for ln in split.split_table(
        {"settings": [_setting(**RUNS)]}))
