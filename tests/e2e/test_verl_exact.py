"""Our sync step against verl 0.9.1's own default synchronous trainer, on the same batch: bit for bit.

"CGP = sync" is tested against our own sync schedule (test_pipeline.py, test_learning.py). This chains sync to verl:
one real sync step of ours (vLLM generates, verl's FSDP2 actor trains, on our separate pools), then verl's V1 ``sync``
trainer (what ``python -m verl.trainer.main_ppo`` runs by default: ``trainer.use_v1``, colocated actor and vLLM)
driven through its own ``fit`` from verl's own ``ppo_trainer`` defaults with our experiment's settings
(lab/verl_pipe_lab/bench/peer/v1_sync.py: SHARED_KEYS), in its own Ray cluster, its rollout replaced at verl's agent-loop
seam by a replay of our step's responses (lab/verl_pipe_lab/bench/peer/replay.py). Same model, same first batch of the same
data loader (same seed), same reward function. verl's trainer is started first and waits in its rollout for our
responses, so its start-up overlaps our stack's.

Compared, and asserted equal bit for bit (no tolerance): the actor's parameters before the step, each response's
prompt, response, score, advantages and old log-probs, the update's loss terms (pg_loss, clip fractions, ppo_kl, as
both actors report them), the step's gradient norm, and the parameters after the step. Both trainers call
the same engine worker code (verl's FSDP2 engine) on the same rows: one PPO mini-batch (verl's V1 trainer forms
mini-batches from its rows in completion order), micro-batches of the same rows in the same order (the replay
completes the rows in the order our update trains them: rolloutpipe.micro_batch_order=length), hence the same padded
shapes, the same kernels and the same float summation order; each actor process runs one intra-op thread (ours:
one trainer core; verl's: Ray's OMP_NUM_THREADS=1 for an actor without num_cpus). docs/cgp.md has the measured run.
"""

import pytest
import torch

pytestmark = pytest.mark.e2e

GROUPS, N = 8, 4
# The whole configuration, pinned (not the default task's learning settings, which change): the digit-math task on the
# tiny random-init base model (no SFT warm-start), 8 prompts x 4 responses, the partial-credit reward (the random model gets some reward
# variance in most groups, so the step has a gradient), one PPO mini-batch (verl's V1 trainer forms mini-batches from
# its rows in completion order: with one, both trainers step on the same rows), micro-batches of 4 rows, the old
# log-probs of the whole batch in one micro-batch (verl's rows come in our update's order, not in dispatch order: in one
# micro-batch both pad to the batch's longest row), one trainer core.
PINNED = [
    "rolloutpipe.mode=sync",
    "rolloutpipe.cpu.rollout_cores=0",
    "rolloutpipe.cpu.trainer_cores=1",
    "rolloutpipe.tiny_assets.task=digit_math",
    "rolloutpipe.tiny_assets.warm_start.steps=0",
    "rolloutpipe.micro_batch_order=length",
    # verl's trainer keeps the dataloader's order of prompts in its mini-batches (our default orders them by predicted
    # length, in every mode; a one-step run knows no lengths, so it is the same here, but pinned all the same)
    "rolloutpipe.minibatch_order=dataloader",
    "trainer.val_before_train=false",
    "trainer.test_freq=-1",
    "trainer.total_training_steps=1",
    f"data.train_batch_size={GROUPS}",
    "data.max_prompt_length=64",
    "data.max_response_length=32",
    "actor_rollout_ref.rollout.max_model_len=128",
    f"actor_rollout_ref.rollout.n={N}",
    f"actor_rollout_ref.actor.ppo_mini_batch_size={GROUPS}",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={GROUPS * N}",
    "actor_rollout_ref.actor.optim.lr=3e-3",
    "algorithm.adv_estimator=grpo",
    "actor_rollout_ref.actor.use_kl_loss=false",
    "reward.custom_reward_function.path=pkg://verl_pipe.recipes.extension_example.reward",
    "reward.custom_reward_function.name=compute_score",
]


# the loss terms of the update that both trainers report (verl's actor metrics), compared where both have them
LOSS_KEYS = ("actor/pg_loss", "actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl")


def _our_rows(batch, order: list[int]) -> list[dict]:
    """Each trained response of our step: its dataset index, session (rank within its group), prompt and response
    tokens, vLLM's log-probs, weight version, old log-probs, advantage and score; ``position``: where our update
    trains it (``order``)."""
    prompts, responses, attn = batch.batch["prompts"], batch.batch["responses"], batch.batch["attention_mask"]
    p_len = prompts.shape[1]
    seen: dict = {}
    rows = []
    position = {row: p for p, row in enumerate(order)}
    for r in range(len(batch)):
        uid = batch.non_tensor_batch["uid"][r]
        session = seen[uid] = seen.get(uid, -1) + 1
        n_resp = int(attn[r, p_len:].sum())
        rows.append({
            # the dataset row's index as verl's RLHFDataset gives it to the agent loop (extra_info.index)
            "index": (batch.non_tensor_batch["extra_info"][r] or {}).get("index", 0), "session": session,
            "prompt_ids": prompts[r][attn[r, :p_len].bool()].tolist(),
            "response_ids": responses[r, :n_resp].tolist(),
            "rollout_log_probs": batch.batch["rollout_log_probs"][r, :n_resp].tolist(),
            "version": int(batch.non_tensor_batch["min_global_steps"][r]),
            "old_log_probs": batch.batch["old_log_probs"][r, :n_resp].clone(),
            "advantages": batch.batch["advantages"][r, :n_resp].clone(),
            "score": float(batch.batch["token_level_scores"][r].sum()),
            "position": position[r],
        })
    return rows


def _max_abs(a: dict, b: dict) -> tuple[float, float]:
    """max |a - b| over all parameters, and the largest relative difference |a - b| / |b| where b != 0."""
    worst = rel = 0.0
    for k in b:
        d = (a[k] - b[k]).abs()
        worst = max(worst, float(d.max()))
        nz = b[k] != 0
        if nz.any():
            rel = max(rel, float((d[nz] / b[k][nz].abs()).max()))
    return worst, rel


def test_sync_step_equals_verls_own_v1_sync_trainer(tmp_path):
    import copy
    import time

    from verl_pipe_lab.bench.peer.replay import cancel_replay, replay_agent_loop, replay_overrides, write_rows
    from verl_pipe_lab.bench.peer.v1_sync import V1SyncRun, shared_differences, v1_sync_config
    from verl_pipe.core.micro_batches import length_order
    from verl_pipe.launch.session import PipeSession, compose
    from verl_pipe.launch.prepare import prepare_config

    t0 = time.perf_counter()
    ours = prepare_config(compose(PINNED + [f"trainer.default_local_dir={tmp_path / 'ckpt'}"]))
    replay_dir = tmp_path / "replay"
    replay_dir.mkdir()
    with_replay = {**replay_overrides(replay_agent_loop(replay_dir)), "trainer.default_local_dir": str(tmp_path / "v1")}
    verl_cfg = v1_sync_config(ours, steps=1, overrides=with_replay)
    assert not shared_differences(ours, verl_cfg)
    # verl's trainer starts first, in its own Ray cluster, and waits in its rollout for our responses (replay.py):
    # its start-up overlaps ours; neither touches the other's processes, and each actor keeps its one thread.
    with V1SyncRun(verl_cfg, log_path=str(tmp_path / "verl_v1_sync.log")) as verl_run:
        ran = copy.deepcopy(ours)  # our trainer writes its bookkeeping into the config it runs with
        try:
            session = PipeSession(ran)
            try:
                theta0 = session.actor_state()
                rec = session.step(mode="sync", workload=None)
                outcome = session.trainer.last_outcome
                batch = outcome.batch
                norms = [m["actor/grad_norm"] for m in outcome.unit_metrics]
                losses = outcome.unit_metrics[0]
                theta1 = session.actor_state()
            finally:
                session.close()
            t_ours = time.perf_counter() - t0
            assert len(batch) == GROUPS * N and len(norms) == 1
            assert batch.batch["advantages"].abs().sum() > 0, "the step has no learning signal: no group's rewards differ"
            # the rows in the order our update trains them (verl_pipe/trainer/actor_backend.py:
            # rolloutpipe.micro_batch_order)
            order = length_order(batch.batch["attention_mask"].sum(-1).tolist())
            rows = _our_rows(batch, order)
            write_rows(rows, replay_dir)
        except BaseException:
            cancel_replay(replay_dir)
            raise
        print(f"[verl-exact] shared keys our trainer changed while it ran: {shared_differences(ran, verl_cfg)}")
        verl = verl_run.result()
    t_all = time.perf_counter() - t0
    (step,) = verl["steps"]
    by_position = sorted(rows, key=lambda r: r["position"])
    assert len(step["rows"]) == len(rows)

    lp = adv = 0.0
    for p, (mine, theirs) in enumerate(zip(by_position, step["rows"])):
        assert theirs["prompts"].tolist() == mine["prompt_ids"], f"row {p}: another prompt"
        assert theirs["responses"].tolist() == mine["response_ids"], f"row {p}: another response"
        assert float(theirs["rm_scores"].sum()) == mine["score"], f"row {p}: another reward"
        lp = max(lp, float((theirs["old_log_probs"] - mine["old_log_probs"]).abs().max()))
        adv = max(adv, float((theirs["advantages"] - mine["advantages"]).abs().max()))
    theta0_abs, _ = _max_abs(verl["initial_params"], theta0)
    theta1_abs, theta1_rel = _max_abs(step["params"], theta1)
    norm_verl = step["metrics"]["actor/grad_norm"]
    # the update's loss terms as both trainers' actor reports them (the same engine worker's metric names)
    loss_keys = [k for k in LOSS_KEYS if k in losses and k in step["metrics"]]
    loss_pairs = {k: (float(losses[k]), step["metrics"][k]) for k in loss_keys}
    print(f"[verl-exact] our stack and step {t_ours:.1f}s, both {t_all:.1f}s (verl's V1 sync trainer from the start, "
          f"in parallel); reward "
          f"{rec['metrics']['critic/score/mean']:.3f} vs {step['metrics'].get('critic/score/mean')}; old log-probs "
          f"max |Δ| {lp:.3e}; advantages max |Δ| {adv:.3e}; grad norm {norms[0]!r} vs {norm_verl!r}; θ before max |Δ| "
          f"{theta0_abs:.3e}; θ after max |Δ| {theta1_abs:.3e} (rel {theta1_rel:.3e}); loss terms (ours, verl) "
          f"{loss_pairs}")
    assert theta0_abs == 0.0
    assert lp == 0.0 and adv == 0.0
    assert norm_verl == norms[0]
    assert "actor/pg_loss" in loss_keys
    assert all(a == b for a, b in loss_pairs.values()), loss_pairs
    assert theta1_abs == 0.0
