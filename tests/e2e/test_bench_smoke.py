"""The quick benchmark, for real: its own stack (Ray, vLLM, the verl trainer) in a subprocess.

A subprocess because the bench builds its own PipeSession (the `bench` model size) and must not share Ray with
the session-scoped ``pipe`` fixture of the other end-to-end tests. Checks the output's shape and sanity, never
its speed.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from verl_pipe.bench_report import MODES, REPORTED, check_schema

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.e2e
@pytest.mark.timeout(1200)
def test_quick_bench_runs_and_writes_schema_and_charts(tmp_path):
    out, charts = tmp_path / "quick.json", tmp_path / "charts"
    env = dict(os.environ)
    env.setdefault("VERL_PIPE_CACHE", str(REPO / ".cache" / "verl_pipe"))
    proc = subprocess.run([sys.executable, "-m", "verl_pipe.bench", "--quick", "--out", str(out),
                           "--charts", str(charts)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=1100)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    result = json.loads(out.read_text())
    assert check_schema(result) == []

    for s in result["settings"]:
        assert set(MODES) <= set(s["modes"])
        assert s["sync_train_to_rollout_ratio"] > 0
        measured = {m: e for m, e in s["modes"].items() if "skipped" not in e}
        assert {"sync", "cgp", "cgp_fgd"} <= set(measured)  # cgp_group may be skipped, with a reason
        for mode, e in measured.items():
            assert 0.0 <= e["trainer_wait_ratio"] <= 1.0, (s["name"], mode)
            for k in REPORTED:
                if k.endswith("_s"):
                    assert e[k] > 0, (s["name"], mode, k)
            assert e["pipeline_efficiency"] > 0
            assert e["rollout_to_train_end_s"] >= e["first_unit_start_s"]
            assert e["runs"] >= 1
        for mode, e in s["modes"].items():
            if "skipped" in e:
                assert e["skipped"].strip(), mode
    assert result["sim_validation"]["max_rel_error"] >= 0
    assert result["env"]["versions"]["vllm"]

    pngs = sorted(charts.glob("*.png"))
    names = [p.name for p in pngs]
    assert any(n.startswith("group_cdf_") for n in names), names
    assert any(n.startswith("timeline_") for n in names), names
    assert all(p.stat().st_size > 1000 for p in pngs)
    assert Path(result["steps_file"]).exists()
