"""``--calibrate`` on a plain verl run's metrics log (verl_pipe/plan/verl_log.py): pure tests, no Ray, no vLLM.

The fixture logs are written by verl's own formatting code — ``concat_dict_to_str`` (the console logger) and
``FileLogger`` (``trainer.logger=['file']``) — taken from the installed verl's source (without importing verl, which
pulls in torch), with metric values the simulator made:

- parsing both formats, numpy scalars, a Ray actor's prefix, ANSI colours and verl's separate validation line;
- round trip: a synthetic run simulated with known scales on the h200 profile (engine x1.6, trainer x1.4, old
  log-prob ratio 0.35) is logged; the fit recovers the scales within a few percent;
- the refusals: missing keys (named with the file), an asynchronous trainer's log;
- the CLI: ``--calibrate LOG`` autodetects the log, and the plan says which costs came from the log.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import numbers
import os
import pprint
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from verl_pipe.core.workload import lognormal
from verl_pipe.plan import verl_log as V
from verl_pipe.plan.hardware import MODELS, profile
from verl_pipe.sim.simulate import rollout_for_mode, timeline_for

VERL_LOGGER = Path(importlib.util.find_spec("verl").submodule_search_locations[0]) / "utils/logger/aggregate_logger.py"
VERL_TRACKING = VERL_LOGGER.parents[1] / "tracking.py"


def _verl_def(path: Path, name: str, namespace: dict):
    """A function or class of verl's source, compiled alone (verl's modules import torch at the top)."""
    tree = ast.parse(path.read_text())
    node = next(n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == name)
    exec(compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec"), namespace)
    return namespace[name]


concat_dict_to_str = _verl_def(VERL_LOGGER, "concat_dict_to_str", {"numbers": numbers, "pprint": pprint})


def _file_logger(path: Path):
    import orjson

    os.environ["VERL_FILE_LOGGER_PATH"] = str(path)
    try:
        cls = _verl_def(VERL_TRACKING, "FileLogger", {"os": os, "orjson": orjson})
        return cls("proj", "exp")
    finally:
        del os.environ["VERL_FILE_LOGGER_PATH"]


def test_the_fixture_formatting_is_verls():
    line = concat_dict_to_str({"timing_s/gen": np.float64(2.5), "a": 1, "b": float("nan")}, step=3)
    assert line == "step:3 - timing_s/gen:np.float64(2.5) - a:1 - b:nan"


# ----------------------------------------------------------------------------------- a simulated verl run

ENGINE_X, TRAINER_X, LOGPROB_RATIO = 1.6, 1.4, 0.35
GPUS = 2


def _shape():
    from tests.test_plan import SHAPE as S

    return replace(S, rollout_gpus=GPUS, train_gpus=GPUS, max_response_length=4096)


def _run_metrics(steps: int = 6) -> list[dict]:
    """verl's per-step metrics of a colocated sync run on 2 GPUs, simulated with the h200 profile scaled by known
    factors: lengths log-normal (median 900, sigma 0.7, rho 0.7, cap 4096), prompt 250 tokens."""
    shape = _shape()
    hw, model = profile("h200"), MODELS["qwen3-1.7b"]
    eng = V.scale_engine(hw.engine(model, max_num_seqs=shape.max_num_seqs,
                                   max_num_batched_tokens=shape.max_num_batched_tokens,
                                   gpu_memory_utilization=shape.gpu_memory_utilization), ENGINE_X)
    tr = hw.trainer(model, gpus=GPUS, recompute=shape.recompute,
                    max_tokens_per_microbatch=shape.max_tokens_per_microbatch, use_ref=shape.use_ref,
                    placement="device")
    tr = tr.with_(time_scale=TRAINER_X, logprob_ratio=LOGPROB_RATIO)
    out = []
    for step in range(1, steps + 1):
        wl = lognormal(shape.num_groups, shape.n, median=900, sigma=0.7, rho=0.7, cap=4096, prompt_len=250,
                       seed=50 + step)
        ro = rollout_for_mode("sync", wl, eng, GPUS, shape.groups_per_unit, shape.dispatch_window,
                              shape.dispatch_order)
        spans = timeline_for(ro, wl, tr, "sync", shape.groups_per_unit, 0.0).to_dict()["train_spans"]
        tot = {k: sum(s["end"] - s["start"] for s in spans if s["kind"] in ks)
               for k, ks in (("upd", ("update", "optimizer_step")), ("lp", ("old_log_prob",)),
                             ("ref", ("ref_log_prob",)))}
        x = np.asarray(wl.lengths, dtype=float)
        tokens = int(x.sum() + x.size * 250)
        gen = ro.rollout_end * (3.0 if step == 1 else 1.0)  # the first step's warm-up: left out by the fit
        t_step = gen + tot["upd"] + tot["lp"] + tot["ref"] + 1.5
        out.append({
            "training/global_step": step, "training/epoch": 0, "actor/entropy": 0.61, "actor/pg_loss": -0.01,
            "critic/score/mean": 0.4,
            "response_length/mean": float(x.mean()), "response_length/max": float(x.max()),
            "response_length/min": float(x.min()), "response_length/clip_ratio": float((x >= 4096).mean()),
            "prompt_length/mean": 250.0, "prompt_length/max": 250.0, "prompt_length/min": 250.0,
            "timing_s/gen": gen, "timing_s/reward": 0.2, "timing_s/old_log_prob": tot["lp"], "timing_s/ref": tot["ref"],
            "timing_s/adv": 0.05, "timing_s/update_actor": tot["upd"], "timing_s/update_weights": 1.2,
            "timing_s/step": t_step, "timing_per_token_ms/gen": 1000 * gen / x.sum(),
            "perf/total_num_tokens": tokens, "perf/time_per_step": t_step,
            "perf/throughput": tokens / (t_step * GPUS),
            # the agent loop's timing: numpy scalars, which the console logger prints as np.float64(...)
            "agent_loop/generate_sequences/max": np.float64(gen * 0.97),
            "agent_loop/num_preempted/mean": np.float64(0.0),
        })
    return out


def _console_log(path: Path, metrics: list[dict], prefix: str = "\x1b[36m(TaskRunner pid=4242)\x1b[0m ") -> Path:
    lines = ["Training Progress:   0%|          | 0/6", f"{prefix}step:0 - val-core/gsm8k/acc/mean@1:0.12"]
    for i, m in enumerate(metrics, 1):
        lines.append(prefix + concat_dict_to_str(m, step=i))
        lines.append(f"{prefix}INFO some other line with step:{i} in it but not a metric line")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_parse_console_log(tmp_path):
    m = _run_metrics(2)
    steps, kind, f = V.read_log(_console_log(tmp_path / "run.log", m))
    assert kind == "console" and f.name == "run.log"
    assert sorted(steps) == [0, 1, 2]
    assert steps[0] == {"val-core/gsm8k/acc/mean@1": 0.12}
    s = steps[2]
    assert s["timing_s/gen"] == pytest.approx(m[1]["timing_s/gen"], rel=1e-12)  # repr round-trips a float
    assert s["agent_loop/generate_sequences/max"] == pytest.approx(float(m[1]["agent_loop/generate_sequences/max"]))
    assert s["actor/pg_loss"] == -0.01 and s["perf/total_num_tokens"] == m[1]["perf/total_num_tokens"]
    assert V.is_verl_log(tmp_path / "run.log") and V.is_verl_log(tmp_path)


def test_parse_file_logger(tmp_path):
    m = _run_metrics(2)
    fl = _file_logger(tmp_path / "exp.jsonl")
    for i, d in enumerate(m, 1):
        fl.log(dict(d, nan_metric=float("nan")), step=i)
    fl.finish()
    steps, kind, _ = V.read_log(tmp_path)
    assert kind == "file logger" and sorted(steps) == [1, 2]
    assert steps[1]["timing_s/update_actor"] == m[0]["timing_s/update_actor"]
    assert "nan_metric" not in steps[1]  # orjson writes NaN as null
    bench = Path(__file__).resolve().parents[1] / "docs/bench/trainer_gap_quick_steps_2026-12-01.json.gz"
    assert not V.is_verl_log(bench)  # a bench steps file is ours, not a verl log


def test_round_trip_recovers_the_simulated_scales(tmp_path):
    log = _console_log(tmp_path / "run.log", _run_metrics(6))
    fit = V.fit_log(log, _shape(), profile("h200"), MODELS["qwen3-1.7b"])
    assert fit.steps == [2, 3, 4, 5, 6] and fit.steps_in_log == 7  # step 1 (warm-up) left out; step 0: validation
    assert (fit.rows, fit.num_groups, fit.rollout_gpus, fit.train_gpus) == (128, 16, GPUS, GPUS)
    assert fit.engine_scale == pytest.approx(ENGINE_X, rel=0.03)
    assert fit.trainer_scale == pytest.approx(TRAINER_X, rel=0.02)
    assert fit.logprob_ratio == pytest.approx(LOGPROB_RATIO, rel=0.02)
    assert 0.5 < fit.lengths["sigma"] < 0.9  # the drawn lengths' 0.7, from their mean and max
    for k, e in fit.self_check.items():
        assert e["max_abs_rel_error"] < 0.1, k
    s = fit.summary()
    assert "engine decode speed (timing_s/gen)" in s["from_log"] and "weight sync" in s["from_profile"]


def test_refusals_name_the_file_and_the_missing_keys(tmp_path):
    m = [{k: v for k, v in d.items() if k not in ("response_length/max", "timing_s/update_actor")}
         for d in _run_metrics(2)]
    log = _console_log(tmp_path / "partial.log", m, prefix="")
    with pytest.raises(ValueError, match=r"--calibrate .*partial\.log: verl's console log has 3 step record\(s\), "
                                         r"2 with timing_s/\* keys, but none with timing_s/update_actor \(no flag "
                                         r"supplies it: the log must have it\), response_length/max \(--lengths SPEC "
                                         r"supplies the lengths\); the fit needs"):
        V.fit_log(log, _shape(), profile("h200"), MODELS["qwen3-1.7b"])
    one_off = _console_log(tmp_path / "one_off.log", [dict(d, **{"timing_s/sync_rollout_weights": 0.5})
                                                      for d in _run_metrics(2)])
    with pytest.raises(ValueError, match="asynchronous trainer .*timing_s/sync_rollout_weights"):
        V.fit_log(one_off, _shape(), profile("h200"), MODELS["qwen3-1.7b"])
    empty = tmp_path / "empty.log"
    empty.write_text("nothing here\n")
    with pytest.raises(ValueError, match="no verl metric lines"):
        V.read_log(empty)


def test_cli_calibrates_on_a_verl_log(tmp_path, capsys):
    from verl_pipe.plan.__main__ import main

    log = _console_log(tmp_path / "run.log", _run_metrics(4))
    args = ["--config-name", "qwen3_1p7b_gsm8k_4x4", "--lengths", "lognormal:median=900,sigma=0.7,rho=0.7,cap=4096",
            "--no-sweep", "--seeds", "1", "--prompt-len", "250", "--out", str(tmp_path / "plan.json"),
            "data.train_batch_size=16", "actor_rollout_ref.rollout.n=8",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4"]
    assert main(["--calibrate", str(log)] + args) == 0
    out = capsys.readouterr().out
    assert "costs from verl's console log" in out and "costs from the h200 profile, not in verl's log" in out
    assert "lengths ASSUMED for the fit" in out
    assert "2 rollout replicas and 2 trainer GPUs (perf/throughput; colocated" in out
    hw = json.loads((tmp_path / "plan.json").read_text())["inputs"]["hardware"]
    assert hw["source"] == "verl log" and hw["verl_log"]["engine_scale"] == pytest.approx(ENGINE_X, rel=0.05)
    assert main(["--calibrate-verl-log", str(tmp_path / "nope.log")] + args) == 2
    assert "nope.log: no such file or folder" in capsys.readouterr().err
