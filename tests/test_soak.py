"""The soak benchmark's pure parts (lab/verl_pipe_lab/bench/soak.py): the per-step slope fit and its verdict, the grouping of
processes by kind. The run itself is a benchmark (`python -m verl_pipe_lab.bench --soak 60`), not a test."""

import random

import pytest

from verl_pipe_lab.bench.soak import analyze, fit, format_report, process_kind


def test_fit_recovers_a_known_slope_and_calls_a_leak_a_leak():
    rng = random.Random(0)
    xs = list(range(6, 46))
    leak = fit(xs, [1000 + 2.0 * x + rng.gauss(0, 1) for x in xs])
    assert leak["slope"] == pytest.approx(2.0, abs=0.1) and not leak["flat"]
    assert leak["growth_over_run"] == pytest.approx(2.0 * 39, rel=0.05)


def test_noise_without_a_trend_is_flat():
    rng = random.Random(1)
    xs = list(range(6, 46))
    f = fit(xs, [1000 + rng.gauss(0, 5) for x in xs])
    assert f["flat"] and abs(f["slope"]) < 3 * f["slope_se"] + 1e-9


def test_a_tiny_trend_under_one_percent_of_the_mean_is_flat():
    xs = list(range(40))
    assert fit(xs, [5000 + 0.05 * x for x in xs])["flat"]  # 2 MiB over 40 steps of 5 GB


def test_fit_refuses_too_few_points():
    with pytest.raises(ValueError, match="at least 3 points"):
        fit([1, 2], [1, 2])


def test_analyze_skips_the_warm_up_and_fits_every_kind():
    samples = [{"step": s, "step_time_s": 10.0 + (5.0 if s < 3 else 0.0),
                "rss_mib": {"driver": 500.0 + (300 if s < 3 else 0), "ray::WorkerDict": 800.0 + 1.5 * s}}
               for s in range(1, 31)]
    a = analyze(samples, skip=3)
    assert a["fitted_steps"] == 27
    assert a["rss_mib_by_kind"]["driver"]["flat"] and a["step_time_s"]["flat"]
    assert not a["rss_mib_by_kind"]["ray::WorkerDict"]["flat"] and not a["memory_flat"]
    text = format_report({"steps": 30, "save_freq": 10, "analysis": a})
    assert "ray::WorkerDict" in text and "memory flat within noise: NO" in text
    with pytest.raises(ValueError, match="run more steps"):
        analyze(samples[:4], skip=3)


@pytest.mark.parametrize("name,cmdline,kind", [
    ("ray::WorkerDict", ["ray::WorkerDict.actor_state"], "ray::WorkerDict"),
    ("VLLM::EngineCor", ["VLLM::EngineCore"], "VLLM::EngineCore"),
    ("raylet", ["/x/site-packages/ray/core/src/ray/raylet/raylet", "--flag"], "raylet"),
    ("python", ["/venv/bin/python", "/x/ray/dashboard/agent.py", "--a"], "agent.py"),
])
def test_process_kind(name, cmdline, kind):
    assert process_kind(name, cmdline) == kind


def test_a_soak_result_records_its_composed_config_and_the_machine(tmp_path, monkeypatch):
    # Every bench JSON keeps every rolloutpipe.* value as composed and the host it ran on. The live session is
    # a stand-in here (no Ray, no vLLM); the config is composed for real.
    import json

    import verl_pipe.launch.session as session_mod
    from verl_pipe_lab.bench import soak

    class FakeSession:
        startup_s = 0.0

        def __init__(self, cfg):
            self.n = 0

        def step(self):
            self.n += 1
            return {"step": self.n, "metrics": {}}

        def close(self):
            pass

    monkeypatch.setattr(session_mod, "PipeSession", FakeSession)
    monkeypatch.setattr(soak.tempfile, "tempdir", str(tmp_path))  # run_soak's work directory
    out = tmp_path / "soak.json"
    assert soak.main(8, str(out), skip=2) == 0
    d = json.loads(out.read_text())
    stack = d["config"]
    assert stack["rolloutpipe"]["mode"] == "cgp" and stack["rolloutpipe"]["fgd"]["enable"] is True
    assert "window" in stack["rolloutpipe"]["fgd"]  # a default the overrides never named is recorded too
    assert "rolloutpipe.mode=cgp" in stack["overrides"]
    assert {"arch", "os", "kernel", "usable_cores"} <= set(d["env"]["machine"])
    assert d["env"]["versions"]["verl"] and len(d["samples"]) == 8
