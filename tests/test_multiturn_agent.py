"""verl_pipe/rollout/multiturn.py: the multi-turn agent loop over a fake server manager and the tiny tokenizer (no Ray,
no vLLM): turns, masks, priorities and replica per call, tool waits off the engine, versions over turns, reward,
tool failures, the response budget, and verl's padding of its output."""

import asyncio
import time

import pytest
from omegaconf import OmegaConf

from verl.experimental.agent_loop.agent_loop import DictConfigWrap, _agent_loop_registry
from verl.workers.rollout.replica import TokenOutput
from verl_pipe.assets.multiturn_env import TailSpec, ToolFailure, plan_episode
from verl_pipe.core.frontier import Admission, Request
from tests.fakes import fake_of
from verl_pipe.rollout.client import CURRENT_ADMISSION, AdmissionRoutedClient
from verl_pipe.rollout.multiturn import AGENT_NAME, MultiTurnEnvAgentLoop, env_config, task_key

RESPONSE_LEN = 160


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from verl_pipe.assets.tokenizer import build_tokenizer

    return build_tokenizer(tmp_path_factory.mktemp("tok"))


def config(response_length=RESPONSE_LEN, **env):
    spec = {"seed": 0, "turns": {"median": 3, "sigma": 0.0, "rho": 0.0, "cap": 6},
            "latency_s": {"median": 0.05, "sigma": 0.0, "rho": 0.0, "cap": 1.0}, "turn_max_tokens": 16}
    spec.update(env)
    return OmegaConf.create({
        "data": {},
        "actor_rollout_ref": {"rollout": {"prompt_length": 64, "response_length": response_length,
                                          "full_determinism": False}},
        "rolloutpipe": {"multiturn": spec},
    })


@fake_of(AdmissionRoutedClient, extra=("tok", "text", "versions", "delay_s", "calls", "in_engine"))
class FakeServer:
    """verl's server manager: answers every turn with a fixed text and EOS; records each call and when the engine
    was busy (inside generate) vs the trajectory waited on its tool."""

    def __init__(self, tokenizer, text="3 + 4 = 7. Answer: 7", versions=(5,), delay_s=0.0):
        self.tok, self.text, self.versions, self.delay_s = tokenizer, text, list(versions), delay_s
        self.calls, self.in_engine = [], 0

    async def generate(self, request_id, *, prompt_ids, sampling_params, priority=0, **kw):
        adm = CURRENT_ADMISSION.get()
        self.calls.append({"request_id": request_id, "prompt_ids": list(prompt_ids), "priority": priority,
                           "max_tokens": sampling_params.get("max_tokens"),
                           "ignore_eos": sampling_params.get("ignore_eos"),
                           "replica": adm.replica if adm is not None else None})
        self.in_engine += 1
        try:
            await asyncio.sleep(self.delay_s)
        finally:
            self.in_engine -= 1
        ids = self.tok.encode(self.text, add_special_tokens=False)[: sampling_params["max_tokens"] - 1]
        ids.append(self.tok.convert_tokens_to_ids("<|im_end|>"))
        v = self.versions[min(len(self.calls) - 1, len(self.versions) - 1)]
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids), num_preempted=0,
                           extra_fields={"global_steps": v, "min_global_steps": v, "max_global_steps": v})


def row(index=7, answer="7", split="train"):
    return {"raw_prompt": [{"role": "user", "content": "What is (3 + 4) % 10 + 0? Put the final answer after "
                                                       "'Answer:'"}],
            "index": index, "extra_info": {"index": index, "split": split},
            "reward_model": {"ground_truth": answer}, "data_source": "verl_pipe/digit_math"}


def run(cfg, server, tokenizer, admission=None, **kw):
    async def go():
        if admission is not None:
            CURRENT_ADMISSION.set(admission)
        loop = MultiTurnEnvAgentLoop(trainer_config=DictConfigWrap(cfg), server_manager=server, tokenizer=tokenizer,
                                     processor=None, dataset_cls=None, data_config=DictConfigWrap(cfg.data),
                                     hf_model_type="qwen3")
        return await loop.run({"temperature": 1.0, "logprobs": True}, **kw)

    return asyncio.run(go())


def test_registered_the_verl_way():
    # verl adds the entry's "name" once an agent-loop config has been loaded in the process (an e2e module before)
    assert _agent_loop_registry[AGENT_NAME]["_target_"] == "verl_pipe.rollout.multiturn.MultiTurnEnvAgentLoop"


def test_turns_masks_priorities_and_replica(tokenizer):
    server = FakeServer(tokenizer)
    adm = Admission(Request(group=2, index=1), replica=3, priority=2)
    out = run(config(), server, tokenizer, admission=adm, priority=adm.priority, **row())
    assert len(server.calls) == 3  # turns: median 3, no spread
    assert {c["priority"] for c in server.calls} == {2} and {c["replica"] for c in server.calls} == {3}
    assert len({c["request_id"] for c in server.calls}) == 1  # one sticky id per trajectory (verl's balancer)
    # each turn's prompt is the previous turn's prompt + its answer + the tool message
    for prev, nxt in zip(server.calls, server.calls[1:]):
        assert nxt["prompt_ids"][: len(prev["prompt_ids"])] == prev["prompt_ids"]
    assert out.prompt_ids == server.calls[0]["prompt_ids"]
    assert len(out.response_ids) == len(out.response_mask) == len(out.response_logprobs)
    full = out.prompt_ids + out.response_ids
    assert full[: len(server.calls[-1]["prompt_ids"])] == server.calls[-1]["prompt_ids"]
    # mask 1 exactly on the model's tokens (3 turns), 0 on the tool messages (2)
    answer = tokenizer.encode("3 + 4 = 7. Answer: 7", add_special_tokens=False) + [
        tokenizer.convert_tokens_to_ids("<|im_end|>")]
    assert sum(out.response_mask) == 3 * len(answer)
    model_tokens = [t for t, m in zip(out.response_ids, out.response_mask) if m]
    assert model_tokens == answer * 3
    tool_text = tokenizer.decode([t for t, m in zip(out.response_ids, out.response_mask) if not m])
    assert tool_text.count("calculator: 3 + 4 = 7.") == 2 and "tool" in tool_text
    assert "Last turn" in tool_text and "2 turns left" in tool_text
    assert all(lp == -0.5 for lp, m in zip(out.response_logprobs, out.response_mask) if m)
    assert all(lp == 0.0 for lp, m in zip(out.response_logprobs, out.response_mask) if not m)
    assert out.reward_score == 1.0 and out.num_turns == 1 + 3 + 2
    info = out.extra_fields["reward_extra_info"]
    assert info["mt_turns"] == 3 and info["mt_tool_calls"] == 2 and not info["mt_tool_failed"]
    assert not info["mt_truncated"] and info["mt_tool_wait_s"] >= 0.1


def test_the_sample_index_comes_from_the_admission(tokenizer):
    cfg = config(response_length=400, turns={"median": 2, "sigma": 1.0, "rho": 0.5, "cap": 6})
    env = env_config(cfg)
    task = task_key(row(index=11))
    want = {i: plan_episode(env, task, i).turns for i in range(8)}
    assert len(set(want.values())) > 1
    for i in range(8):
        server = FakeServer(tokenizer)
        run(cfg, server, tokenizer, admission=Admission(Request(0, i), 0, 0), **row(index=11))
        assert len(server.calls) == want[i]
    server = FakeServer(tokenizer)  # no admission (verl's validation, n=1): sample 0
    run(cfg, server, tokenizer, **row(index=11))
    assert len(server.calls) == want[0] and server.calls[0]["replica"] is None


def test_a_tool_wait_holds_no_engine_slot(tokenizer):
    """While trajectories wait on their tools, none of them is inside the server's generate."""
    cfg = config(latency_s={"median": 0.2, "sigma": 0.0, "rho": 0.0, "cap": 1.0})
    server = FakeServer(tokenizer, delay_s=0.01)
    samples = []

    async def watch(stop):
        while not stop.is_set():
            samples.append(server.in_engine)
            await asyncio.sleep(0.005)

    async def go():
        stop = asyncio.Event()
        w = asyncio.create_task(watch(stop))
        loops = [MultiTurnEnvAgentLoop(trainer_config=DictConfigWrap(cfg), server_manager=server, tokenizer=tokenizer,
                                       processor=None, dataset_cls=None, data_config=DictConfigWrap(cfg.data),
                                       hf_model_type="qwen3") for _ in range(4)]
        t0 = time.perf_counter()
        await asyncio.gather(*(lp.run({}, **row(index=i)) for i, lp in enumerate(loops)))
        stop.set()
        await w
        return time.perf_counter() - t0

    elapsed = asyncio.run(go())
    assert elapsed < 4 * 2 * 0.2  # the four trajectories' tool waits overlap
    assert samples.count(0) > 0.7 * len(samples)  # mostly nobody in the engine: all are waiting on tools


def test_weight_versions_span_every_turn(tokenizer):
    out = run(config(), FakeServer(tokenizer, versions=(4, 4, 5)), tokenizer, **row())
    assert out.extra_fields["min_global_steps"] == 4 and out.extra_fields["max_global_steps"] == 5


def test_a_wrong_final_answer_scores_zero(tokenizer):
    out = run(config(), FakeServer(tokenizer, text="2 * 3 = 6. Answer: 6"), tokenizer, **row())
    assert out.reward_score == 0.0


def test_a_failed_tool_zeroes_the_reward_or_fails_the_request(tokenizer):
    cfg = config(tool_failure_p=1.0)
    server = FakeServer(tokenizer)
    out = run(cfg, server, tokenizer, **row())
    assert len(server.calls) == 1 and out.reward_score == 0.0  # the first call failed: the episode ended there
    info = out.extra_fields["reward_extra_info"]
    assert info["mt_tool_failed"] and info["mt_tool_calls"] == 1 and out.num_turns == 2
    assert sum(out.response_mask) == len(out.response_mask)  # no tool message was appended
    with pytest.raises(ToolFailure):
        run(config(tool_failure_p=1.0, on_tool_failure="fail_request"), FakeServer(tokenizer), tokenizer, **row())


def test_the_response_budget_caps_turns_and_tokens(tokenizer):
    server = FakeServer(tokenizer)
    out = run(config(response_length=40, turns={"median": 6, "sigma": 0.0, "rho": 0.0, "cap": 6}), server, tokenizer,
              **row())
    assert len(out.response_ids) <= 40 and len(out.response_mask) == len(out.response_ids)
    assert len(server.calls) < 6 and out.extra_fields["reward_extra_info"]["mt_truncated"]
    assert all(c["max_tokens"] <= 16 for c in server.calls)


def test_one_turn_is_the_single_turn_shape(tokenizer):
    server = FakeServer(tokenizer)
    out = run(config(turns={"median": 1, "sigma": 0.0, "rho": 0.0, "cap": 1}), server, tokenizer, **row())
    assert len(server.calls) == 1 and all(out.response_mask) and out.num_turns == 2


def test_verl_pads_the_output_with_tool_tokens_masked(tokenizer):
    """verl's _agent_loop_postprocess / _postprocess (as the streaming rollout calls them): rm_scores at the last
    token, response_mask 0 on tool tokens and padding, the episode's facts per response."""
    from verl_pipe.rollout.agent_worker import PipeAgentLoopWorker

    cfg = config()
    out = run(cfg, FakeServer(tokenizer), tokenizer, **row())
    w = object.__new__(PipeAgentLoopWorker)
    w.config, w.tokenizer, w.processor, w.reward_loop_worker_handles = cfg, tokenizer, None, None
    w.rollout_config = OmegaConf.create({"prompt_length": 64, "response_length": RESPONSE_LEN})
    w.distillation_enabled = False
    w.mm_processor_kwargs = {}

    async def go():
        return await w._agent_loop_postprocess(out, False, **row())

    padded = asyncio.run(go())
    batch = w._postprocess([padded], validate=False)
    mask = batch.batch["response_mask"][0]
    assert mask.tolist()[: len(out.response_mask)] == out.response_mask and mask.sum() == sum(out.response_mask)
    assert batch.batch["rm_scores"][0].sum() == 1.0
    assert batch.non_tensor_batch["mt_turns"].tolist() == [3] and batch.meta_info["reward_extra_keys"]
    assert batch.non_tensor_batch["__num_turns__"].tolist() == [6]


def test_verls_agent_loop_file_entry_builds_the_loop(tokenizer):
    """What a verl AgentLoopWorker does with the recipe's agent-loop file: the {name, _target_} entry goes through
    Hydra's instantiate (PipeAgentLoopWorker._agent_loop, verl's own path), which passes `name` on as a keyword."""
    from verl_pipe.config import resolve_pkg_path
    from verl_pipe.rollout.agent_worker import PipeAgentLoopWorker

    (entry,) = OmegaConf.load(resolve_pkg_path("pkg://verl_pipe.recipes/lib/multiturn_agent_loops.yaml"))
    assert entry.name == AGENT_NAME
    w = object.__new__(PipeAgentLoopWorker)
    w.config, w.llm_client, w.tokenizer, w.processor = config(), FakeServer(tokenizer), tokenizer, None
    w.hf_model_type, w.dataset_cls, w.tools = "qwen3", None, []

    async def go():
        loop = w._agent_loop(entry)
        return loop, await loop.run({}, **row())

    loop, out = asyncio.run(go())
    assert type(loop) is MultiTurnEnvAgentLoop and out.reward_score == 1.0


def test_step_summary_turns_tail_and_failures():
    """The step's multi-turn metrics and stdout line, from the trained batch's per-response facts."""
    from types import SimpleNamespace

    import numpy as np

    from verl_pipe.rollout.multiturn import step_summary

    assert step_summary(SimpleNamespace(non_tensor_batch={"uid": np.array(["a"])})) is None  # single-turn
    nt = {"uid": np.array(["a", "a", "b", "b"], dtype=object), "mt_turns": np.array([1, 2, 2, 4]),
          "mt_tool_calls": np.array([0, 1, 1, 3]), "mt_tool_failed": np.array([False, False, True, False]),
          "mt_truncated": np.array([False, False, False, True]),
          "mt_tool_wait_s": np.array([0.0, 0.1, 0.2, 1.5]), "mt_gen_s": np.array([0.5, 0.9, 0.8, 2.5])}
    m, line = step_summary(SimpleNamespace(non_tensor_batch=nt))
    p = "rolloutpipe/multiturn/"
    assert m[p + "turns_mean"] == 2.25 and m[p + "turns_max"] == 4 and m[p + "tool_calls"] == 5
    assert {k: v for k, v in m.items() if "turns_hist" in k} == {p + "turns_hist/1": 1, p + "turns_hist/2": 2,
                                                                 p + "turns_hist/4": 1}
    assert m[p + "tool_wait_s_max"] == 1.5 and m[p + "trajectory_s_max"] == 4.0
    assert m[p + "trajectory_s_p50"] == pytest.approx(1.0) and m[p + "tail_ratio"] == pytest.approx(4.0)
    assert m[p + "group_s_max"] == 4.0 and m[p + "group_s_p50"] == pytest.approx((1.0 + 4.0) / 2)
    assert m[p + "tool_failures"] == 1 and m[p + "truncated"] == 1
    assert "max 4 [1:1 2:2 4:1]" in line and "tool failures 1" in line and "(tail x4.0)" in line


def test_forced_turn_lengths_reach_every_turn(tokenizer):
    """EnvConfig.turn_tokens: each turn asks the engine for exactly its planned length, EOS ignored."""
    forced = {"median": 5, "sigma": 0.8, "rho": 0.5, "cap": 12}
    cfg = config(turn_tokens=forced)
    server = FakeServer(tokenizer)
    run(cfg, server, tokenizer, priority=0, **row())
    plan = plan_episode(env_config(cfg), task_key(row()), 0)
    assert [c["max_tokens"] for c in server.calls] == list(plan.turn_tokens) and len(plan.turn_tokens) == 3
    assert all(c["ignore_eos"] for c in server.calls)
