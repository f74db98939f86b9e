"""tools/check.py (``make check``): a change's files mapped to the e2e modules that run their code."""

import importlib.util
import subprocess
import sys

from tests.checkout import ROOT

spec = importlib.util.spec_from_file_location("check_tool", ROOT / "tools" / "check.py")
check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check)


def test_every_module_a_rule_names_exists_and_every_module_is_reachable():
    modules = set(check.e2e_modules())
    named = {m for _, ms in check.RULES for m in ms}
    assert named <= modules, named - modules
    assert modules - named <= {"test_zz_dapo", "test_learning", "test_bench_smoke"} | named, modules - named


def test_files_map_to_the_modules_that_run_them():
    m = check.modules_for
    assert m("docs/reliability.md") == () and m("tests/test_config.py") == ()
    assert m("tests/e2e/test_faults.py") == ("test_faults",)
    assert set(m("tests/e2e/conftest.py")) == set(check.e2e_modules())
    assert "test_faults" in m("verl_pipe/rollout/group_scores.py")
    assert m("verl_pipe/rollout/tool_agent.py") == (), "the GPU tool recipe's loop: no CPU e2e runs it"
    assert "test_multinode" in m("verl_pipe/launch/stop_request.py")
    assert "test_zz_signals" in m("verl_pipe/main_grpo.py")
    assert m("lab/verl_pipe_lab/bench/peer/runner.py") == ("test_bench_smoke",)
    assert m("lab/verl_pipe_lab/bench/tools/pad_bench.py") == (), "measurement scripts: no e2e module runs them"
    assert m("verl_pipe/some_new_module.py") == check.CORE_E2E, "code no rule names: the step's modules"
    assert check.plan(["docs/x.md", "verl_pipe/trainer/checkpoints.py"]) == {
        "test_faults": ["verl_pipe/trainer/checkpoints.py"], "test_pipeline": ["verl_pipe/trainer/checkpoints.py"],
        "test_zz_kl_loss": ["verl_pipe/trainer/checkpoints.py"]}


def test_the_make_target_runs_the_tool_and_a_dry_run_lists_the_plan():
    assert "check:" in (ROOT / "Makefile").read_text() and "tools/check.py" in (ROOT / "Makefile").read_text()
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "check.py"), "--dry-run", "--base", "HEAD"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "[check]" in out.stdout and '-m not e2e tests' in out.stdout


def test_burn_runs_the_unit_suite_beside_busy_processes_and_stops_them():
    import psutil

    with check.burning(2) as procs:
        assert len(procs) == 2 and all(psutil.Process(p.pid).is_running() for p in procs)
        assert all(p.poll() is None for p in procs), "they burn until the block ends"
    assert all(p.poll() is not None for p in procs), "gone when the block ends"
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "check.py"), "--dry-run", "--base", "HEAD", "--burn",
                          "2"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "-m not e2e tests (beside 2 burning process(es))" in out.stdout
    bad = subprocess.run([sys.executable, str(ROOT / "tools" / "check.py"), "--dry-run", "--burn", "-1"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert bad.returncode != 0 and "--burn -1" in bad.stderr
