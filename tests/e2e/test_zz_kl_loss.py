"""GRPO with a KL loss against a reference policy: the ref worker on the trainer pool, ref log-probs computed per
unit inside the CGP pipeline. Its own stack (a ref worker changes the workers), after the shared one is torn down.

The same stack also runs verl's trainer hooks that RolloutPipeTrainer.fit_step calls (verl's own _fit_* pieces): the
rollout-data dump (trainer.rollout_data_dir), verl's step metrics (_fit_collect_metrics), batch balancing
(trainer.balance_batch) and profiling (global_profiler.steps, _fit_start_profile/_fit_stop_profile): one stack
start-up fewer for the suite. Every test reads the step it starts from off the trainer (no file-order dependence).
"""

import json

import pytest
import torch
from omegaconf import open_dict

from tests.e2e.conftest import (E2E_OVERRIDES, LONGTAIL, PARTIAL_CREDIT_REWARD, check_whitened_equivalence,
                                whitened_estimator_equivalence)

pytestmark = pytest.mark.e2e

BATCH, N = 8, 4  # E2E_OVERRIDES

# The tiny CPU default trains in fp32 (conf/rolloutpipe_trainer.yaml: fsdp_config.mixed_precision, actor and
# ref): the whitened-estimator check below compares two ways of computing the same gradient, which bf16
# rounding would blur to ~1e-3.


@pytest.fixture(scope="module")
def kl_pipe(tmp_path_factory):
    from verl_pipe.launch.session import PipeSession, compose

    ckpt = tmp_path_factory.mktemp("ckpt_kl")
    dump = tmp_path_factory.mktemp("rollout_data")
    cfg = compose(E2E_OVERRIDES + [f"trainer.default_local_dir={ckpt}", "actor_rollout_ref.actor.use_kl_loss=true",
                                   "actor_rollout_ref.actor.kl_loss_coef=0.1", "rolloutpipe.mode=cgp",
                                   "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
                                   *PARTIAL_CREDIT_REWARD,
                                   # verl's hooks: a profiler configured (the step to profile is set per test)
                                   f"trainer.rollout_data_dir={dump}", "global_profiler.steps=[100000]",
                                   "trainer.balance_batch=true"])
    session = PipeSession(cfg)
    session.dump_dir = dump
    yield session
    session.close()


def test_cgp_with_kl_loss_against_the_reference(kl_pipe):
    trainer = kl_pipe.trainer
    rec = kl_pipe.step(mode="cgp", granularity="minibatch", fgd=True, workload=LONGTAIL)
    batch = trainer.last_outcome.batch
    assert "ref_log_prob" in batch.batch.keys()
    # the reference's log-probs, computed per unit inside the pipeline, equal the ref worker's over the whole batch
    from verl import DataProto

    fresh = DataProto(batch=batch.batch.exclude("ref_log_prob").clone(), non_tensor_batch=dict(batch.non_tensor_batch),
                      meta_info=dict(batch.meta_info))
    expected = trainer._compute_ref_log_prob(trainer.actor_seam.with_token_counts(fresh)).batch["ref_log_prob"]
    mask = batch.batch["response_mask"].bool()
    torch.testing.assert_close(batch.batch["ref_log_prob"][mask], expected[mask], atol=1e-5, rtol=1e-5)
    if rec["step"] == 1:  # the actor still is the reference model: θ_k's old log-probs equal the reference's
        torch.testing.assert_close(batch.batch["old_log_probs"][mask], expected[mask], atol=1e-4, rtol=1e-4)
    kinds = {s["kind"] for s in trainer.timelines[-1].to_dict()["train_spans"]}
    assert "ref_log_prob" in kinds
    assert any(k.startswith("actor/kl_loss") for k in rec["metrics"]), sorted(rec["metrics"])[:20]
    assert sorted(rec["trained_groups"]) == list(range(8))


def test_whitened_estimator_with_kl_loss_in_cgp_equals_sync(kl_pipe, tmp_path):
    """With a KL loss the gradient has a part that does not depend on the advantages (the third
    buffer, A = 0): still the gradient of the final advantages."""
    out = whitened_estimator_equivalence(kl_pipe, tmp_path)
    # fp32: the three runs agree to float32 rounding (measured: grad norms to 1e-7, update to 1e-6)
    check_whitened_equivalence(out, 8, kl_pipe.trainer.groups_per_unit, rel=1e-5, max_update_deviation=1e-4)


def test_step_dumps_rollout_data_logs_verls_metrics_and_profiles_the_asked_step(kl_pipe):
    trainer, dump = kl_pipe.trainer, kl_pipe.dump_dir
    step = trainer.global_steps
    with open_dict(trainer.config.global_profiler):
        trainer.config.global_profiler.steps = [step + 1]  # verl's _fit_stop_profile reads it at every step's end
    try:
        assert trainer.curr_step_profile is False
        rec = kl_pipe.step(mode="cgp")
        trainer._shutdown_dump_executor()  # wait for verl's asynchronous write
        trainer._init_dump_executor()
        lines = (dump / f"{step}.jsonl").read_text().splitlines()
        assert len(lines) == BATCH * N  # every trained response, once
        row = json.loads(lines[0])
        assert {"input", "output", "score", "step"} <= set(row) and row["step"] == step
        m = rec["metrics"]
        for key in ("perf/throughput", "perf/total_num_tokens", "timing_s/step", "critic/score/mean",
                    "response_length/mean"):
            assert key in m, key
        assert trainer.curr_step_profile is True  # the next step is the profiled one
        kl_pipe.step(mode="cgp")  # verl's _start_profiling / _stop_profiling on our trainer pool's workers
        assert trainer.curr_step_profile is False and trainer.prev_step_profile is True
    finally:
        with open_dict(trainer.config.global_profiler):
            trainer.config.global_profiler.steps = [100000]
