"""verl's separate_async peer on the multi-turn setting (lab/verl_pipe_lab/bench/peer/hooks.py, runner.py): the peer's
agent-loop worker runs verl's own ``AgentLoopWorkerTQ._run_prompt`` (n sessions per prompt), and each session's
trajectory gets its own sample index (verl's ``session_id``) and the bench round's episode seed, so a group gets the
same episodes as in our modes. verl's worker code runs for real over a fake server manager, the tiny tokenizer and a
stand-in for TransferQueue's put (no Ray, no vLLM)."""

import asyncio

import pytest
import torch

from tests.test_multiturn_agent import FakeServer, config, row
from verl_pipe.assets.multiturn_env import plan_episode
from verl_pipe.core.frontier import Admission, Request
from verl_pipe.rollout.multiturn import AGENT_NAME, EPISODE_SEED, env_config, task_key

N = 6
TURNS = {"median": 2, "sigma": 1.0, "rho": 0.3, "cap": 5}
LATENCY = {"median": 0.001, "sigma": 0.0, "rho": 0.0, "cap": 0.01}


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from verl_pipe.assets.tokenizer import build_tokenizer

    return build_tokenizer(tmp_path_factory.mktemp("tok"))


class _Recorder:
    """What the worker would put into TransferQueue: each session's output and kwargs, and the group's status."""

    def __init__(self):
        self.outputs, self.status = {}, []

    async def postprocess(self, output, validate, **kwargs):  # bound: stands in for the class attribute
        self.outputs[int(kwargs["session_id"])] = (output, kwargs)

    async def kv_put(self, key, partition_id, tag):
        self.status.append(tag["status"])


def _peer_worker(monkeypatch, cfg, server, tokenizer, recorder):
    from omegaconf import OmegaConf, open_dict

    import verl.trainer.ppo.v1.agent_loop_tq as tq_mod
    from verl_pipe_lab.bench.peer.hooks import PeerAgentLoopWorkerImpl

    monkeypatch.setattr(tq_mod.tq, "async_kv_put", recorder.kv_put)
    monkeypatch.setattr(tq_mod.AgentLoopWorkerTQ.__ray_actor_class__, "_agent_loop_postprocess",
                        recorder.postprocess)
    with open_dict(cfg):
        cfg.actor_rollout_ref.rollout.n = N
    worker = object.__new__(PeerAgentLoopWorkerImpl)  # the actor's state that these calls read, without Ray
    worker.config, worker.llm_client, worker.tokenizer = cfg, server, tokenizer
    worker.processor, worker.dataset_cls, worker.hf_model_type, worker.tools = None, None, "qwen3", []
    worker._peer_lengths, worker._peer_events = {}, {}
    assert OmegaConf.select(cfg, "rolloutpipe.multiturn") is not None
    return worker


def _prompt(seed=None, index=11):
    p = {**row(index=index), "uid": "u0", "agent_name": AGENT_NAME, "global_steps": 1}
    if seed is not None:
        from verl_pipe_lab.bench.peer.hooks import EPISODE_SEED_KEY

        p[EPISODE_SEED_KEY] = torch.tensor(seed)
    return p


def _run_group(worker, prompt):
    trajectory = {"step": 1, "sample_index": 0, "rollout_n": 0, "validate": False}
    asyncio.run(worker._run_prompt(prompt, {"temperature": 1.0, "logprobs": True}, trajectory))


def _ours(cfg, tokenizer, seed, index=11):
    """Our modes' trajectories of the same group: the admission's sample index, the round's seed."""
    from tests.test_multiturn_agent import run

    out = {}
    for i in range(N):
        server = FakeServer(tokenizer)
        token = EPISODE_SEED.set(seed)
        try:
            res = run(cfg, server, tokenizer, admission=Admission(Request(0, i), 0, 0), **row(index=index))
        finally:
            EPISODE_SEED.reset(token)
        out[i] = (res.extra_fields["reward_extra_info"]["mt_turns"], len(server.calls))
    return out


def test_the_peers_sessions_get_distinct_sample_indices_and_our_episodes(monkeypatch, tokenizer):
    cfg = config(response_length=400, turns=TURNS, latency_s=LATENCY)
    seed = 7
    env = env_config(cfg)
    task = task_key(row(index=11))
    import dataclasses

    planned = {i: plan_episode(dataclasses.replace(env, seed=seed), task, i).turns for i in range(N)}
    assert len(set(planned.values())) > 1  # the samples' episodes differ: sample 0's for all would show
    assert planned != {i: plan_episode(env, task, i).turns for i in range(N)}  # and the seed matters

    rec, server = _Recorder(), FakeServer(tokenizer)
    worker = _peer_worker(monkeypatch, cfg, server, tokenizer, rec)
    _run_group(worker, _prompt(seed=seed))

    assert rec.status == ["running", "finished"]
    assert sorted(rec.outputs) == list(range(N))
    got = {i: out.extra_fields["reward_extra_info"]["mt_turns"] for i, (out, _) in rec.outputs.items()}
    assert got == planned  # each session replays its own sample's episode under the round's seed
    assert all("verl_pipe_episode_seed" not in kw for _, kw in rec.outputs.values())  # never reaches TQ
    assert sum(planned.values()) == len(server.calls)
    assert worker._peer_events["u0"]["task"] == task
    # the same trajectories as our modes' (admission index, same seed): turns and generate calls per sample
    assert _ours(cfg, tokenizer, seed) == {i: (planned[i], planned[i]) for i in range(N)}


def test_without_a_seed_the_peer_uses_the_configs(monkeypatch, tokenizer):
    cfg = config(response_length=400, turns=TURNS, latency_s=LATENCY)
    env, task = env_config(cfg), task_key(row(index=11))
    rec = _Recorder()
    worker = _peer_worker(monkeypatch, cfg, FakeServer(tokenizer), tokenizer, rec)
    _run_group(worker, _prompt())
    got = {i: out.extra_fields["reward_extra_info"]["mt_turns"] for i, (out, _) in rec.outputs.items()}
    assert got == {i: plan_episode(env, task, i).turns for i in range(N)}
    assert EPISODE_SEED.get() is None  # the worker's seed stayed in the group's task


def test_the_trainer_attaches_the_rounds_seed_per_prompt():
    from verl_pipe_lab.bench.peer.runner import workload_seed

    # the seed of each submission follows the bench: warm-up submissions 10_000 + k, round r seed + r
    assert [workload_seed(k, 3, 2) for k in range(5)] == [10_000, 10_001, 3, 4, 5]
