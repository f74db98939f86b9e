"""GRPO with a KL loss against a reference policy: the ref worker on the trainer pool, ref log-probs
computed per unit inside the CGP pipeline. Its own stack (a ref worker changes the workers), after
the shared one is torn down."""

import pytest
import torch

from tests.e2e.conftest import (E2E_OVERRIDES, LONGTAIL, PARTIAL_CREDIT_REWARD, check_whitened_equivalence,
                                whitened_estimator_equivalence)

pytestmark = pytest.mark.e2e


# The tiny CPU default trains in fp32 (verl_pipe/conf/rolloutpipe_trainer.yaml: fsdp_config.mixed_precision, actor and
# ref): the whitened-estimator check below compares two ways of computing the same gradient, which bf16
# rounding would blur to ~1e-3.


@pytest.fixture(scope="module")
def kl_pipe(tmp_path_factory):
    from verl_pipe.session import PipeSession, compose

    ckpt = tmp_path_factory.mktemp("ckpt_kl")
    cfg = compose(E2E_OVERRIDES + [f"trainer.default_local_dir={ckpt}", "actor_rollout_ref.actor.use_kl_loss=true",
                                   "actor_rollout_ref.actor.kl_loss_coef=0.1", "rolloutpipe.mode=cgp",
                                   "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
                                   *PARTIAL_CREDIT_REWARD])
    session = PipeSession(cfg)
    yield session
    session.close()


def test_cgp_with_kl_loss_against_the_reference(kl_pipe):
    rec = kl_pipe.step(mode="cgp", granularity="minibatch", fgd=True, workload=LONGTAIL)
    batch = kl_pipe.trainer.last_outcome.batch
    assert "ref_log_prob" in batch.batch.keys()
    mask = batch.batch["response_mask"].bool()
    # step 1: the actor still is the reference model, so the first unit's old log-probs equal the
    # reference's; every unit (unit 1 via the θ_k snapshot) too.
    torch.testing.assert_close(batch.batch["old_log_probs"][mask], batch.batch["ref_log_prob"][mask],
                               atol=1e-4, rtol=1e-4)
    kinds = {s["kind"] for s in kl_pipe.trainer.timelines[-1].to_dict()["train_spans"]}
    assert "ref_log_prob" in kinds
    assert any(k.startswith("actor/kl_loss") for k in rec["metrics"]), sorted(rec["metrics"])[:20]
    assert sorted(rec["trained_groups"]) == list(range(8))


def test_whitened_estimator_with_kl_loss_in_cgp_equals_sync(kl_pipe, tmp_path):
    """With a KL loss the gradient has a part that does not depend on the advantages (the third
    buffer, A = 0): still the gradient of the final advantages."""
    out = whitened_estimator_equivalence(kl_pipe, tmp_path)
    # fp32: the three runs agree to float32 rounding (measured: grad norms to 1e-7, update to 1e-6)
    check_whitened_equivalence(out, 8, kl_pipe.trainer.groups_per_unit, rel=1e-5, max_update_deviation=1e-4)
