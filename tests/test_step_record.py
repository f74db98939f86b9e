"""A completed step's bookkeeping (verl_pipe/trainer/step_record.py) on a fake trainer seam with a real StepTimeline: the
metrics it adds (in order), the step's record and the run's history, the trace files and the summary line."""

import json
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from verl_pipe.core.group_queue import Group
from verl_pipe.core.timeline import StepTimeline
from verl_pipe.trainer.knobs import StepKnobs
from verl_pipe.rollout.stream import StepResult
from verl_pipe.trainer.step_record import StepHistory, record_step, summary_line

T0 = 1000.0


def timeline() -> StepTimeline:
    tl = StepTimeline(step=3, groups_per_unit=1)
    for g, d in enumerate([4.0, 6.0]):
        tl.request_submitted(f"g{g}", g, replica=0, t=T0)
        tl.response_done(f"g{g}", g, num_tokens=10, t=T0 + d)
        tl.group_done(g, True, t=T0 + d)
    tl.train_span("update", T0 + 4, T0 + 5, unit=0)
    tl.train_span("update", T0 + 6, T0 + 8, unit=1)
    tl.weight_sync(T0 + 8, T0 + 9)
    return tl


KNOBS = StepKnobs(mode="cgp", unit_fill="completion", minibatch_order="dataloader")


class Trainer:
    """The trainer as the record sees it (TrainerSeam): config, verl's metrics, verl's metric collection."""

    def __init__(self, trace_dir=None):
        self.config = OmegaConf.create({"rolloutpipe": {"trace_dir": trace_dir,
                                                        "data_check_counts": {"train": {"empty_prompt": 2}}}})
        self.global_steps, self.history = 3, StepHistory()
        self.metrics = {"training/global_step": 3, "critic/score/mean": 0.5}
        self.timing_raw = {"step": 9.5}
        self.collected = []

    def with_token_counts(self, batch):
        return ("counted", batch)

    def collect_verl_metrics(self, batch):  # verl's _fit_collect_metrics: its step metrics into self.metrics
        self.collected.append(self.with_token_counts(batch))
        self.metrics["response_length/mean"] = 10.0

    def record(self, outcome, timeline, result, data_index):
        return record_step(self, self.history, step=self.global_steps, knobs=KNOBS, outcome=outcome,
                           timeline=timeline, rollout_result=result, data_index=data_index,
                           step_s=self.timing_raw["step"])


def outcome(batch="batch"):
    return SimpleNamespace(trained=[Group(1, None, 2, 0.0), Group(0, None, 2, 0.0)], batch=batch)


def test_metrics_record_and_summary(capsys):
    t, tl = Trainer(), timeline()
    result = StepResult(failed_attempts=1, replica_restarts=1, recovery_s=[2.0, 3.5])
    record = t.record(outcome(), tl, result, [7, 8])
    assert list(t.history.timelines) == [tl] and t.collected == [("counted", "batch")]
    tm = tl.metrics()
    keys = list(t.metrics)
    assert keys[:2] == ["training/global_step", "critic/score/mean"]
    assert keys[2:2 + len(tm)] == [f"rolloutpipe/{k}" for k in tm]
    assert keys[2 + len(tm):] == [
        "rolloutpipe/failed_request_attempts", "rolloutpipe/aborted_requests", "rolloutpipe/untrainable_groups",
        "rolloutpipe/late_groups_dropped", "rolloutpipe/failed_groups_dropped", "rolloutpipe/reward_failures",
        "rolloutpipe/replica_failures",
        "rolloutpipe/replica_restarts", "rolloutpipe/requeued_requests", "rolloutpipe/replica_recovery_s",
        "rolloutpipe/trained_groups", "rolloutpipe/trainer_busy_in_rollout_s",
        "data/skipped_records/train/empty_prompt", "response_length/mean",
        "timing_s/step"]
    assert t.metrics["rolloutpipe/replica_recovery_s"] == 3.5 and t.metrics["rolloutpipe/trained_groups"] == 2
    assert t.metrics["timing_s/step"] == 9.5
    assert record == {"step": 3, "data_index": [7, 8], "trained_groups": [1, 0], "timeline": tm,
                      "knobs": KNOBS.record()} == t.history.last_record
    assert t.history.steps_run == 1 and t.history.rewards == [0.5]
    assert record["knobs"]["variant"] == "cgp" and record["knobs"]["sampling_overrides"] is False
    out = capsys.readouterr().out
    assert out == summary_line(3, "cgp, minibatch granularity, completion fill", t.metrics, tm) + "\n"
    assert out.startswith("[verl_pipe] step 3 (cgp, minibatch granularity, completion fill): reward 0.500 | "
                          "resp_len 10.0 | rollout 6.00s | train 3.00s |")


def test_no_batch_no_verl_metrics_and_no_recovery_key():
    t = Trainer()
    record = t.record(outcome(batch=None), timeline(), StepResult(), [])
    assert t.collected == [] and "rolloutpipe/replica_recovery_s" not in t.metrics
    assert "reward nan | resp_len nan" in summary_line(3, "sync", {}, record["timeline"])


def test_trace_dir_gets_the_chrome_trace_and_a_steps_line(tmp_path):
    t = Trainer(trace_dir=str(tmp_path / "trace"))
    t.metrics["text"] = "not a number"
    record = t.record(outcome(), timeline(), StepResult(), [7, 8])
    assert json.loads((tmp_path / "trace" / "step_00003.json").read_text())
    lines = (tmp_path / "trace" / "steps.jsonl").read_text().splitlines()
    rec = json.loads(lines[0])
    assert len(lines) == 1 and rec["trained_groups"] == [1, 0] and rec["data_index"] == [7, 8]
    assert "text" not in rec["metrics"] and rec["metrics"]["timing_s/step"] == pytest.approx(9.5)
    assert rec["knobs"] == KNOBS.record()
    assert "metrics" not in record  # the file's record carries them, the trainer's does not


def test_exact_lengths_overrides():
    from verl_pipe.core.workload import equal_lengths, exact_lengths

    f = exact_lengths(equal_lengths(2, 3, length=17, prompt_len=0))
    assert f(1, 2) == {"max_tokens": 17, "ignore_eos": True}


def test_replica_deaths_found_outside_the_requests_count_with_the_rollouts():
    from verl_pipe.rollout.replicas import Health
    from verl_pipe.rollout.stream import StepResult
    from verl_pipe.trainer.step_record import rollout_metrics

    health = Health(found={"weight_sync": 1}, restarts=1, recovery_s=[40.0])
    m = rollout_metrics({}, StepResult(replica_failures=1, replica_restarts=1, recovery_s=[30.0]), 8, health)
    assert m["rolloutpipe/replica_failures"] == 2 and m["rolloutpipe/replica_restarts"] == 2
    assert m["rolloutpipe/replica_recovery_s"] == 40.0 and m["rolloutpipe/replica_recovery_s/health"] == 40.0
    assert m["rolloutpipe/replica_deaths_found/weight_sync"] == 1
    assert "rolloutpipe/replica_recovery_s" not in rollout_metrics({}, StepResult(), 8, Health())


def test_learning_line_reports_val_core_before_and_after():
    from verl_pipe.trainer.step_record import learning_line, val_core

    before = {"val-core/src/acc/mean@1": 0.25, "val-aux/src/reward/mean@1": 0.25, "timing_s/x": 1.0}
    after = {"val-core/src/acc/mean@1": 0.5}
    assert val_core(before) == {"src/acc/mean@1": 0.25}
    line = learning_line(before, after, 40)
    assert "src/acc/mean@1: 0.250 before training -> 0.500 after 40 steps" in line
    assert "val-aux" not in line
    assert "not measured before training" in learning_line(None, after, 3).replace(": not measured before", " not measured before")
    assert "no validation ran" in learning_line({}, None, 3)
    rewards = [0.1] * 10 + [0.3] * 10
    assert "training reward: 0.100 over the first 2 step(s) -> 0.300 over the last 2" in learning_line(
        before, after, 20, rewards)


def test_the_run_totals_and_its_pipelining_line():
    """The fake step: rollout ends at 6, the trainer works 4-5 (during the rollout) and 6-8 (after): 1 s of its 3 s
    overlapped; rollout->train end 8 s against 6 + 3 = 9 s back to back."""
    from verl_pipe.trainer.step_record import pipeline_line

    t = Trainer()
    t.record(outcome(), timeline(), StepResult(), [])
    t.record(outcome(), timeline(), StepResult(), [])
    tot = t.history.totals
    assert tot["trainer_busy_in_rollout_s"] == pytest.approx(2.0) and tot["trainer_busy_s"] == pytest.approx(6.0)
    assert tot["rollout_to_train_end_s"] == pytest.approx(16.0) and tot["rollout_end_s"] == pytest.approx(12.0)
    assert t.history.modes == {"cgp"} and t.history.variants == {"cgp, minibatch granularity, completion fill"}
    line = pipeline_line(tot, 2, t.history.variants)
    assert line.startswith("[verl_pipe] pipelining (cgp, minibatch granularity, completion fill) over 2 steps")
    assert "trained 2.0s of its 6.0s while the rollout still ran (33%)" in line
    assert "rollout->train end 16.0s against 18.0s" in line and "2.0s (11%) saved" in line
    # the saving says what it is computed from: the run's own timelines, an estimate of sync, not a sync run
    assert "Computed from this run's step timelines" in line and "not a measured sync run" in line


def test_a_sync_run_says_how_long_its_trainer_waited():
    from verl_pipe.trainer.step_record import pipeline_line

    tot = {"rollout_end_s": 6.0, "rollout_to_train_end_s": 9.0, "trainer_busy_s": 3.0, "trainer_busy_in_rollout_s": 0.0}
    line = pipeline_line(tot, 1, {"sync"})
    assert "waited 6.0s for the rollout (67% of rollout->train end, 9.0s)" in line and "rolloutpipe.mode=cgp" in line
    assert pipeline_line({}, 0, set()) == "[verl_pipe] pipelining: no step completed"


def test_done_line_keeps_a_first_runs_asset_build_apart_from_the_run():
    """A first run builds the tiny assets (the SFT warm-start: minutes) before Ray starts: the closing line's run
    time must not include it, or a first demo reads as twice its length."""
    from verl_pipe.trainer.step_record import done_line

    line = done_line({"steps": 40, "startup_s": 54.6}, 452.3, 517.5)
    assert line == "[verl_pipe] done: 40 steps in 452.3s (start-up 54.6s; before it, the config and assets 517.5s)"
    assert done_line({"steps": 3, "startup_s": 50.0}, 90.0, 0.2) == "[verl_pipe] done: 3 steps in 90.0s (start-up 50.0s)"


@pytest.mark.parametrize("knobs, label", [
    (StepKnobs(mode="cgp", granularity="group", fgd=True, unit_fill="dispatch"),
     "cgp+fgd, group granularity, dispatch fill, length order"),  # the shipped default
    (StepKnobs(mode="cgp", granularity="minibatch", fgd=True, unit_fill="completion", minibatch_order="dataloader"),
     "cgp+fgd, minibatch granularity, completion fill"),
    (StepKnobs(mode="cgp", granularity="group", fgd=False, unit_fill="completion", minibatch_order="dataloader"),
     "cgp, group granularity, completion fill"),
    (StepKnobs(mode="sync", granularity="minibatch"), "sync, length order"),
    (StepKnobs(mode="sync", granularity="minibatch", minibatch_order="dataloader"), "sync"),
])
def test_the_step_line_and_the_summary_name_the_variant_as_configured(knobs, label, capsys):
    """Issue 61(d): the demo runs CGP + FGD at group granularity; its step lines and closing summary said ``(cgp)``.
    They name mode, FGD, granularity and unit fill now (sync has neither granularity nor fill: it trains whole
    mini-batches after the rollout)."""
    from verl_pipe.core.variants import name_of
    from verl_pipe.trainer.step_record import pipeline_line, variant_label

    assert variant_label(knobs) == label
    assert knobs.record()["variant"] == name_of(knobs.mode, knobs.granularity, knobs.fgd)  # the record's name stays
    t = Trainer()
    record_step(t, t.history, step=3, knobs=knobs, outcome=outcome(), timeline=timeline(), rollout_result=StepResult(),
                data_index=[], step_s=1.0)
    assert capsys.readouterr().out.startswith(f"[verl_pipe] step 3 ({label}): reward")
    assert t.history.variants == {label}
    assert f"({label})" in pipeline_line(t.history.totals, 1, t.history.variants)
