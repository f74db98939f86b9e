"""The /proc sampler (lab/verl_pipe_lab/bench/cpu_sampler.py) on synthetic /proc trees, and once on the real one."""

import json
import os
import time

import pytest

from verl_pipe_lab.bench.cpu_sampler import (DRIVER, SamplerProcess, descendants, format_overlap, interval_cores,
                                         load_samples, overlap_cores, parse_stat, read_procs, snapshot,
                                         step_cpu_seconds)


def stat_line(pid, comm, ppid, utime, stime, start):
    # fields after comm: state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime cutime
    # cstime priority nice threads itrealvalue starttime ...
    rest = ["S", ppid, 1, 1, 0, -1, 0, 0, 0, 0, 0, utime, stime, 0, 0, 20, 0, 1, 0, start, 0, 0]
    return f"{pid} ({comm}) " + " ".join(str(x) for x in rest) + "\n"


def fake_proc(root, procs):
    """procs: pid -> (comm, ppid, ticks, start, argv)"""
    for pid, (comm, ppid, ticks, start, argv) in procs.items():
        d = root / str(pid)
        d.mkdir(parents=True, exist_ok=True)
        (d / "stat").write_text(stat_line(pid, comm, ppid, ticks, 0, start))
        (d / "cmdline").write_bytes("\0".join(argv).encode() + b"\0")
    (root / "self").mkdir(exist_ok=True)  # non-numeric entries are skipped


TREE = {
    100: ("python", 1, 500, 10, ["python", "-m", "verl_pipe_lab.bench"]),
    101: ("raylet", 100, 50, 11, ["/venv/bin/raylet", "--foo"]),
    102: ("ray::WorkerDic", 101, 1000, 12, ["ray::WorkerDict.update_actor"]),
    103: ("ray::vLLMHttpSe", 101, 300, 13, ["ray::vLLMHttpServer"]),
    104: ("VLLM::EngineCor", 103, 200, 14, ["VLLM::EngineCore"]),
    105: ("VLLM::Worker", 104, 900, 15, ["VLLM::Worker"]),
    200: ("bash", 1, 7777, 3, ["bash"]),  # not in the tree
}


def test_parse_stat_counts_fields_after_the_last_parenthesis():
    line = stat_line(7, "ray::A (b) c", 3, 11, 22, 99)
    assert parse_stat(line) == (3, 99, 33, "ray::A (b) c")


def test_snapshot_walks_the_tree_and_labels_kinds(tmp_path):
    fake_proc(tmp_path, TREE)
    procs = read_procs(tmp_path)
    assert set(procs) == set(TREE)
    assert sorted(descendants(procs, 101)) == [101, 102, 103, 104, 105]
    snap = {p[0]: (p[2], p[3]) for p in snapshot(100, tmp_path, exclude=(103,))}
    assert snap == {100: (DRIVER, 500), 101: ("raylet", 50), 102: ("ray::WorkerDict", 1000),
                    104: ("VLLM::EngineCore", 200), 105: ("VLLM::Worker", 900)}
    assert snapshot(999, tmp_path) == []  # the root is gone


def test_interval_cores_per_kind_with_new_and_restarted_processes():
    a = {"t": 0.0, "procs": [[1, 5, DRIVER, 100], [2, 6, "ray::WorkerDict", 1000], [3, 7, "VLLM::Worker", 50]]}
    b = {"t": 2.0, "procs": [[1, 5, DRIVER, 150],  # 50 ticks in 2 s = 0.25 cores
                             [2, 6, "ray::WorkerDict", 1200],  # 1.0
                             [3, 99, "VLLM::Worker", 40],  # pid reused: a new process, counted from 0 -> 0.2
                             [4, 100, "VLLM::Worker", 120]]}  # started in between: 0.6
    assert interval_cores(a, b, clk_tck=100) == pytest.approx({DRIVER: 0.25, "ray::WorkerDict": 1.0,
                                                               "VLLM::Worker": 0.8})
    assert interval_cores(b, a, clk_tck=100) == {}


def samples_from(cores_per_interval, dt=1.0):
    """Samples whose intervals used the given {kind: cores} (ticks at clk_tck=100)."""
    ticks: dict[str, int] = {}  # one process per kind, its pid the order the kind first appears in
    out = [{"t": 0.0, "procs": []}]
    for i, cores in enumerate(cores_per_interval):
        for k, c in cores.items():
            ticks[k] = ticks.get(k, 0) + round(c * 100 * dt)
        out.append({"t": (i + 1) * dt, "procs": [[n, 1, k, v] for n, (k, v) in enumerate(ticks.items())]})
    return out


def test_overlap_counts_only_intervals_where_trainer_and_engine_are_both_busy():
    s = samples_from([
        {"VLLM::Worker": 1.0, DRIVER: 0.5},  # rollout alone
        {"VLLM::Worker": 0.9, "ray::WorkerDict": 0.8, DRIVER: 0.3, "raylet": 0.1},  # both busy
        {"VLLM::Worker": 0.7, "VLLM::EngineCore": 0.2, "ray::WorkerDict": 0.6, DRIVER: 0.5},  # both busy
        {"ray::WorkerDict": 1.0, "VLLM::Worker": 0.2},  # trainer alone (engine under the threshold)
    ])
    r = overlap_cores(s, clk_tck=100)
    assert r["intervals"] == 2 and r["seconds"] == 2.0
    assert r["cores"] == pytest.approx({"VLLM::Worker": 0.8, "ray::WorkerDict": 0.7, DRIVER: 0.4,
                                        "VLLM::EngineCore": 0.1, "raylet": 0.05})
    assert r["orchestration_cores"] == pytest.approx(0.45)
    only_third = overlap_cores(s, windows=[(2.0, 3.5)], clk_tck=100)
    assert only_third["intervals"] == 1 and only_third["cores"][DRIVER] == pytest.approx(0.5)
    assert overlap_cores(s, clk_tck=100, busy_cores=0.95)["cores"] == {}
    # CPU-s per window over the whole window, busy or not; an interval counts by its share inside the window
    assert only_third["cpu_s_per_step"] == pytest.approx({"VLLM::Worker": 0.8, "ray::WorkerDict": 1.1,
                                                          DRIVER: 0.5, "VLLM::EngineCore": 0.2})
    assert only_third["orchestration_cpu_s_per_step"] == pytest.approx(0.5)
    two = step_cpu_seconds(s, [(0.0, 1.0), (1.0, 2.0)], clk_tck=100)
    assert two == pytest.approx({"VLLM::Worker": 0.95, DRIVER: 0.4, "ray::WorkerDict": 0.4, "raylet": 0.05})
    table = format_overlap({"cgp": r, "sync": overlap_cores(s[:2], clk_tck=100)})
    assert "VLLM::Worker" in table and "cgp" in table and "sync" not in table.splitlines()[1]
    assert "orchestration" in table


def test_load_samples_drops_a_line_cut_short(tmp_path):
    p = tmp_path / "s.jsonl"
    p.write_text(json.dumps({"t": 1.0, "procs": []}) + "\n" + '{"t": 2.0, "pro')
    assert load_samples(p) == [{"t": 1.0, "procs": []}]
    assert load_samples(tmp_path / "missing.jsonl") == []


def test_the_sampler_process_sees_this_process_work(tmp_path):
    sampler = SamplerProcess(os.getpid(), tmp_path / "s.jsonl", interval_s=0.2)
    sampler.start()
    t0, cpu0 = time.time(), time.process_time()
    deadline = t0 + 1.5
    x = 0
    while time.time() < deadline:  # keep a core busy in the root process
        x += 1
    got = (time.process_time() - cpu0) / (time.time() - t0)  # the cores this process got: all of one when idle
    samples = sampler.stop()
    assert len(samples) >= 3
    kinds = {p[2] for s in samples for p in s["procs"]}
    assert DRIVER in kinds
    used = interval_cores(samples[0], samples[-1], os.sysconf("SC_CLK_TCK"))
    # what the sampler saw against what the process got (a loaded machine gives it less than a core); the window of
    # the samples is a little wider than the busy loop's, and ticks are 10 ms
    assert used.get(DRIVER, 0.0) > 0.5 * got > 0, (used, got)


def test_bench_results_carry_cores_during_overlap_per_mode():
    from verl_pipe_lab.bench import run as bench
    from verl_pipe_lab.bench.report import check_schema
    from tests.test_bench import SHAPE, simulated_steps

    steps = [s for s in simulated_steps(("sync", "cgp")) if s["setting"] == "longtail-a"]
    t = 1000.0
    busy = []
    for st in steps:  # steps back to back, 4 s each; the engine and the trainer overlap in cgp only
        st["wall_window"] = [t, t + 4.0]
        both = st["mode"] == "cgp"
        busy += [{"VLLM::Worker": 1.0, "ray::WorkerDict": 0.9 if both else 0.0, DRIVER: 0.4 if both else 0.2}] * 4
        t += 4.0
    samples = samples_from(busy)
    for smp in samples:
        smp["t"] += 1000.0
    settings = [{"name": "longtail-a", "workload": {"kind": "lognormal"}}]
    res = bench.build_result({"modes": ["sync", "cgp"]}, settings, steps, {}, {}, {"bench": SHAPE},
                             bench.env_info(), "n/a", None, samples)
    assert check_schema(res) == []
    cgp = res["settings"][0]["modes"]["cgp"]["cpu_cores_during_overlap"]
    assert cgp["cores"][DRIVER] == pytest.approx(0.4) and cgp["seconds"] == pytest.approx(8.0)
    assert res["settings"][0]["modes"]["sync"]["cpu_cores_during_overlap"]["cores"] == {}
    assert res["cpu_overlap"]["cgp"]["orchestration_cores"] == pytest.approx(0.4)
    assert "cgp" in format_overlap(res["cpu_overlap"])
    json.dumps(res, default=bench._json_default)
