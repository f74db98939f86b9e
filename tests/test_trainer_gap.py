"""The span-by-span table of the trainer's calls (lab/verl_pipe_lab/bench/trainer_gap.py) on a hand-made run."""

from verl_pipe_lab.bench.readme_tables import trainer_spans
from verl_pipe_lab.bench.trainer_gap import table


def _rec(call, start, end, lengths, pid):
    return {"call": call, "pid": pid, "start": start, "end": end, "lengths": lengths, "micro_batch_size": 2}


def test_driver_spans_against_worker_calls_ours_by_window_peer_by_order():
    ours = {"setting": "s", "mode": "cgp", "wall_window": [100.0, 110.0],
            "metrics": {"trainer_busy_s": 3.0, "rollout_to_train_end_s": 9.0},
            "timeline": {"train_spans": [{"kind": "old_log_prob", "start": 1.0, "end": 1.5},
                                         {"kind": "update", "start": 2.0, "end": 4.0}]}}
    peer = {"setting": "s", "mode": "verl_separate_async", "peer": True,
            "metrics": {"trainer_busy_s": 4.0, "rollout_to_train_end_s": 10.0},
            "train_spans": [{"kind": "old_log_prob", "start": 0.0, "end": 1.0},
                            {"kind": "update", "start": 1.0, "end": 3.5}]}
    records = [
        _rec("compute_log_prob", 101.0, 101.4, [5, 3], pid=1),
        _rec("update_actor", 102.1, 103.6, [5, 3, 2, 2], pid=1),
        _rec("update_actor", 200.0, 201.0, [9, 9], pid=1),  # outside the step's window: another step's
        # the peer: a warm-up step's calls first, then the measured step's
        _rec("compute_log_prob", 300.0, 300.5, [1, 1], pid=2),
        _rec("update_actor", 301.0, 302.0, [1, 1], pid=2),
        _rec("compute_log_prob", 310.0, 310.8, [4, 1], pid=2),
        _rec("update_actor", 311.0, 313.0, [4, 1, 6, 1], pid=2),
    ]
    rows = {r["mode"]: r for r in table({"steps": [ours, peer]}, records, warmup=1)}
    u = rows["cgp"]["update"]
    assert (u["driver_s"], u["calls"], u["tokens"], u["padded_tokens"]) == (2.0, 1, 12, 2 * 5 + 2 * 2)
    assert abs(u["worker_s"] - 1.5) < 1e-9 and abs(u["overhead_s"] - 0.5) < 1e-9
    assert abs(rows["cgp"]["old_log_prob"]["worker_s"] - 0.4) < 1e-9
    p = rows["verl_separate_async"]["update"]
    assert (p["calls"], p["padded_tokens"], p["worker_s"]) == (1, 2 * 4 + 2 * 6, 2.0)
    assert abs(rows["verl_separate_async"]["old_log_prob"]["worker_s"] - 0.8) < 1e-9
    lines = trainer_spans({"rows": list(rows.values())})
    assert len(lines) == 4 and "2.00 / 1.50 / 0.50 s" in lines[2]
