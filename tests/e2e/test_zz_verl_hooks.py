"""verl's trainer hooks that RolloutPipeTrainer.fit_step calls (verl's own _fit_* pieces): the rollout-data
dump (trainer.rollout_data_dir), verl's step metrics (_fit_collect_metrics) and profiling
(global_profiler.steps, _fit_start_profile/_fit_stop_profile), on the real stack."""

import json

import pytest

from tests.e2e.conftest import E2E_OVERRIDES, PARTIAL_CREDIT_REWARD

pytestmark = pytest.mark.e2e

BATCH, N = 8, 4  # E2E_OVERRIDES


@pytest.fixture(scope="module")
def hooks_pipe(tmp_path_factory):
    from verl_pipe.session import PipeSession, compose

    dump = tmp_path_factory.mktemp("rollout_data")
    cfg = compose(E2E_OVERRIDES + [*PARTIAL_CREDIT_REWARD, f"trainer.default_local_dir={tmp_path_factory.mktemp('c')}",
                                   f"trainer.rollout_data_dir={dump}", "global_profiler.steps=[2]",
                                   "trainer.balance_batch=true"])
    session = PipeSession(cfg)
    yield session, dump
    session.close()


def test_step_dumps_rollout_data_and_logs_verls_metrics(hooks_pipe):
    session, dump = hooks_pipe
    step = session.trainer.global_steps
    assert session.trainer.curr_step_profile is False  # profiling is asked for step 2 only
    rec = session.step(mode="cgp")
    session.trainer._shutdown_dump_executor()  # wait for verl's asynchronous write
    session.trainer._init_dump_executor()
    lines = (dump / f"{step}.jsonl").read_text().splitlines()
    assert len(lines) == BATCH * N  # every trained response, once
    row = json.loads(lines[0])
    assert {"input", "output", "score", "step"} <= set(row) and row["step"] == step
    m = rec["metrics"]
    for key in ("perf/throughput", "perf/total_num_tokens", "timing_s/step", "critic/score/mean",
                "response_length/mean"):
        assert key in m, key
    assert session.trainer.curr_step_profile is True  # the next step is the profiled one


def test_profiled_step_runs_and_profiling_stops(hooks_pipe):
    session, _ = hooks_pipe
    assert session.trainer.global_steps == 2
    session.step(mode="cgp")  # verl's _start_profiling / _stop_profiling on our trainer pool's workers
    assert session.trainer.curr_step_profile is False and session.trainer.prev_step_profile is True
