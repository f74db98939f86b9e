"""A multi-turn, tool-using agent loop, registered the verl way, that runs the toy calculator environment
(``verl_pipe/assets/multiturn_env.py``, configured by ``rolloutpipe.multiturn``). Design: docs/multiturn.md.

Select it with ``actor_rollout_ref.rollout.agent.default_agent_loop=verl_pipe_multiturn`` (the recipe
``tiny_cpu_multiturn_cgp_fgd`` does, and lists the class in ``agent_loop_config_path`` so that verl's own
AgentLoopWorker actors, which run validation, find it too).

One trajectory, as verl's ToolAgentLoop builds one:

- every model turn is one ``server_manager.generate`` call, the path SingleTurnAgentLoop uses, with the trajectory's
  priority (FGD's group rank) on every call; in the streaming rollout the server manager is the
  ``AdmissionRoutedClient``, which sends each call to the replica the trajectory was admitted to (the admission
  rides in the asyncio task's context), so all turns of a trajectory, and all trajectories of a group, stay on the
  group's replica with the group's priority;
- the model's tokens are appended with response_mask 1 (and their log-probs), the environment's ``tool`` messages
  through verl's Continuous Token builder with response_mask 0, so the loss covers model tokens only;
- between turns the tool's latency is an ``asyncio.sleep``: a trajectory waiting on its tool has no request in
  vLLM and holds no engine slot; in the streaming rollout it also gives its admission window slot back
  (``verl_pipe.rollout.turns``: ``turn_done`` when the tool starts, ``next_turn`` before the next model turn, which
  waits until the admission policy admits that turn on the same replica with the same priority);
- the reward is the environment's (``AgentLoopOutput.reward_score``; verl's reward loop is then skipped for it, as
  for an agent loop that computes its own score), with the episode's facts in ``reward_extra_info``
  (``mt_turns``, ``mt_tool_calls``, ``mt_tool_failed``, ``mt_truncated``, ``mt_tool_wait_s``, ``mt_gen_s``);
- ``min_global_steps`` / ``max_global_steps`` span every turn, so the trainer's weight-version check of a group
  covers all turns of all its trajectories.

What the admission policy calls a request is the whole trajectory: it is admitted once for its first turn, holds a
window slot during each model turn only (turn-aware admission: docs/multiturn.md), stays on its replica throughout,
and is resubmitted from its first turn when it fails or its replica dies.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, register
from verl.utils.rollout_trace import rollout_trace_op

from verl_pipe.assets.multiturn_env import EnvConfig, ToolFailure, observation, plan_episode, reward
from verl_pipe.data_check import dataset_row
from verl_pipe.rollout import turns as turn_gate
from verl_pipe.rollout.client import CURRENT_ADMISSION


AGENT_NAME = "verl_pipe_multiturn"


def env_config(config) -> EnvConfig:
    """The run's ``rolloutpipe.multiturn`` (the whole trainer config, or None for the defaults)."""
    from omegaconf import OmegaConf

    node = OmegaConf.select(config, "rolloutpipe.multiturn") if config is not None else None
    spec = OmegaConf.to_container(node, resolve=True) if node is not None else None
    return EnvConfig.from_dict(spec)


def task_key(kwargs: dict) -> str:
    """A prompt's stable id, the key of its group latent: its split and dataset index."""
    extra = kwargs.get("extra_info") or {}
    index = dataset_row(kwargs)
    if index is None:
        raise ValueError("a multi-turn episode needs the prompt's dataset index (the row's index or extra_info.index)")
    return f"{extra.get('split', '')}/{index}"


# The episode seed of the trajectories run in this asyncio task's context, when a driver other than ours runs rounds
# with different seeds on one long-lived agent-loop worker (the bench's verl peer: verl's AgentLoopWorkerTQ actors
# hold the run's config from their start). None: ``rolloutpipe.multiturn.seed`` of the worker's config.
EPISODE_SEED: ContextVar[int | None] = ContextVar("verl_pipe_episode_seed", default=None)


def sample_index(kwargs: dict | None = None) -> int:
    """The trajectory's index within its group: the admission's in the streaming rollout; in verl's TransferQueue
    agent-loop worker (``AgentLoopWorkerTQ._run_prompt``, verl's V1 trainers: the bench's separate_async peer) the
    ``session_id`` it passes into the agent loop's kwargs, i.e. verl's own seam: it runs a prompt's n samples as
    ``session_id`` 0..n-1; 0 elsewhere (verl's legacy worker, as its validation with n=1)."""
    adm = CURRENT_ADMISSION.get()
    if adm is not None:
        return int(adm.request.index)
    session = (kwargs or {}).get("session_id")
    return int(session) if session is not None else 0


@dataclass
class _Episode:
    """One trajectory's state as its turns build it: the tokens so far, their response mask and log-probs, the
    messages, and the episode's facts for ``reward_extra_info``."""

    messages: list
    runtime_ids: list[int]
    prompt_len: int
    response_mask: list[int] = field(default_factory=list)
    logprobs: list[float] | None = None
    extra_fields: dict[str, Any] = field(default_factory=dict)
    gen_s: float = 0.0
    tool_s: float = 0.0
    preempted: int | None = None
    last_text: str = ""
    turns_done: int = 0
    tool_calls: int = 0
    tool_messages: int = 0
    tool_failed: bool = False
    truncated: bool = False


@register(AGENT_NAME)
class MultiTurnEnvAgentLoop(AgentLoopBase):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.env = env_config(self.config)
        self.response_length = int(self.rollout_config.response_length)

    @rollout_trace_op
    async def run(self, sampling_params: dict[str, Any], priority: int = 0, **kwargs) -> AgentLoopOutput:
        priority = int(priority)  # may arrive as np.int64 from non_tensor_batch
        seed = EPISODE_SEED.get()
        env = self.env if seed is None else dataclasses.replace(self.env, seed=int(seed))
        plan = plan_episode(env, task_key(kwargs), sample_index(kwargs))
        ground_truth = (kwargs.get("reward_model") or {}).get("ground_truth")
        messages = list(kwargs["raw_prompt"])
        request_id = f"det-{priority}" if getattr(self.rollout_config, "full_determinism", False) else uuid4().hex

        runtime_ids = await self.ct_build_initial_tokens(messages)
        ep = _Episode(messages=messages, runtime_ids=runtime_ids, prompt_len=len(runtime_ids))
        for turn in range(plan.turns):
            budget = self.response_length - len(ep.response_mask)
            if budget <= 0:
                ep.truncated = True
                break
            await self._model_turn(ep, turn, self._turn_params(sampling_params, plan, turn, budget), request_id,
                                   priority)
            if turn == plan.turns - 1:
                break
            if len(ep.response_mask) >= self.response_length:
                ep.truncated = True
                break
            if not await self._tool_turn(ep, turn, plan, kwargs):
                break
        return self._output(ep, ground_truth)

    def _turn_params(self, sampling_params: dict[str, Any], plan, turn: int, budget: int) -> dict[str, Any]:
        """A model turn's sampling parameters: its max_tokens capped by the environment's turn limit and the
        response budget left; forced turn lengths (EnvConfig.turn_tokens) give the same work in every mode."""
        env = self.env
        params = dict(sampling_params)
        params["max_tokens"] = min(int(params.get("max_tokens", env.turn_max_tokens)), env.turn_max_tokens, budget)
        if plan.turn_tokens:
            params["max_tokens"] = min(plan.turn_tokens[turn], budget)
            params["ignore_eos"] = True
        return params

    async def _model_turn(self, ep: _Episode, turn: int, params: dict[str, Any], request_id: str,
                          priority: int) -> None:
        """One ``generate`` call (after the turn's admission, for every turn but the first), its tokens appended
        with response_mask 1 and their log-probs."""
        t0 = time.perf_counter()
        if turn:  # its next turn's admission (a window slot on its replica): queueing, as inside vLLM
            await turn_gate.next_turn()
        out = await self.server_manager.generate(request_id=request_id, prompt_ids=ep.runtime_ids,
                                                 sampling_params=params, priority=priority)
        ep.gen_s += time.perf_counter() - t0
        ep.turns_done += 1
        if out.num_preempted is not None:
            ep.preempted = (ep.preempted or 0) + int(out.num_preempted)
        _merge_versions(ep.extra_fields, out.extra_fields)
        if out.log_probs and ep.logprobs is None:
            ep.logprobs = [0.0] * len(ep.response_mask)
        merge, ep.response_mask, ep.logprobs = await self.ct_merge_assistant_token(
            ep.runtime_ids, out.token_ids, ep.response_mask, ep.logprobs,
            assistant_logprobs=out.log_probs if out.log_probs else None)
        ep.runtime_ids = merge.token_ids
        ep.last_text = self.tokenizer.decode(out.token_ids, skip_special_tokens=True)

    async def _tool_turn(self, ep: _Episode, turn: int, plan, kwargs: dict) -> bool:
        """The tool after model turn ``turn``: no request in vLLM while it runs and no admission slot held; its
        ``tool`` message appended with response_mask 0. False when the episode ends here (the tool failed, or its
        context does not fit); raises ToolFailure when a failed tool fails the request."""
        turn_gate.turn_done()
        t0 = time.perf_counter()
        await asyncio.sleep(plan.latencies_s[turn])
        ep.tool_s += time.perf_counter() - t0
        ep.tool_calls += 1
        if plan.failures[turn]:
            if self.env.on_tool_failure == "fail_request":
                raise ToolFailure(f"tool call {turn} of task {task_key(kwargs)} sample {sample_index(kwargs)} failed")
            ep.tool_failed = True
            return False
        ep.messages.append({"role": "assistant", "content": ep.last_text})
        previous = list(ep.messages)
        ep.messages.append({"role": "tool", "content": observation(ep.last_text, plan.turns - 1 - turn)})
        merge, mask, lp = await self.ct_merge_context_msg(previous, ep.messages, ep.runtime_ids, ep.response_mask,
                                                          ep.logprobs)
        if len(mask) >= self.response_length:  # as verl's ToolAgentLoop: a context that does not fit ends it
            ep.truncated = True
            return False
        ep.runtime_ids, ep.response_mask, ep.logprobs = merge.token_ids, mask, lp
        ep.tool_messages += 1
        return True

    def _output(self, ep: _Episode, ground_truth) -> AgentLoopOutput:
        """The trajectory as verl's AgentLoopOutput: the environment's reward and the episode's facts."""
        prompt_len = ep.prompt_len
        response_ids = ep.runtime_ids[prompt_len:]
        assert len(response_ids) == len(ep.response_mask), (len(response_ids), len(ep.response_mask))
        ep.extra_fields.update({
            "turn_scores": [], "tool_rewards": [],
            "reward_extra_info": {"mt_turns": ep.turns_done, "mt_tool_calls": ep.tool_calls,
                                  "mt_tool_failed": ep.tool_failed, "mt_truncated": ep.truncated,
                                  "mt_tool_wait_s": round(ep.tool_s, 6), "mt_gen_s": round(ep.gen_s, 6)},
        })
        logprobs = ep.logprobs
        return AgentLoopOutput(
            prompt_ids=ep.runtime_ids[:prompt_len],
            response_ids=response_ids[: self.response_length],
            response_mask=ep.response_mask[: self.response_length],
            response_logprobs=logprobs[: self.response_length] if logprobs else None,
            reward_score=reward(ep.last_text, ground_truth, ep.tool_failed),
            num_turns=1 + ep.turns_done + ep.tool_messages,  # user + assistant + tool messages, as verl counts
            metrics={"generate_sequences": ep.gen_s, "tool_calls": ep.tool_s,
                     "num_preempted": ep.preempted if ep.preempted is not None else -1},
            extra_fields=ep.extra_fields,
        )


def _merge_versions(acc: dict, turn: dict) -> None:
    """The first turn's extra fields, with min_global_steps / max_global_steps over all turns."""
    if not acc:
        acc.update(turn)
        return
    for key, pick in (("min_global_steps", min), ("max_global_steps", max)):
        new = turn.get(key)
        if new is None:
            continue
        old = acc.get(key)
        acc[key] = new if old is None else pick(old, new)


# ---------------------------------------------------------------------------------------------- a step's summary

MT_KEYS = ("mt_turns", "mt_tool_calls", "mt_tool_failed", "mt_truncated", "mt_tool_wait_s", "mt_gen_s")


def step_summary(batch) -> tuple[dict, str] | None:
    """The step's multi-turn metrics and its line for stdout, from the trained batch's per-response episode facts
    (None for a batch without them: single-turn). Covers the trained trajectories only (a late or aborted group's
    are not in the batch).

    ``rolloutpipe/multiturn/``: ``turns_mean``, ``turns_p50``, ``turns_max`` (model turns per trajectory),
    ``turns_hist/<t>`` (trajectories with t turns), ``tool_calls``, ``tool_wait_s_mean`` / ``_max`` (seconds a
    trajectory waited on its tool, summed over its calls), ``trajectory_s_p50`` / ``_p90`` / ``_max`` (its model turns'
    ``generate`` time, engine queueing included, plus its tool waits), ``tail_ratio`` (max / p50 of that), the same
    per group: ``group_s_max`` / ``group_s_p50`` (a group is as long as its longest trajectory), ``tool_failures``,
    ``truncated``."""
    import numpy as np

    nt = batch.non_tensor_batch
    if "mt_turns" not in nt:
        return None
    turns = np.asarray(nt["mt_turns"], dtype=np.int64)
    wait = np.asarray(nt["mt_tool_wait_s"], dtype=np.float64)
    gen = np.asarray(nt["mt_gen_s"], dtype=np.float64) if "mt_gen_s" in nt else np.zeros_like(wait)
    traj = gen + wait
    failed = int(np.asarray(nt["mt_tool_failed"], dtype=bool).sum())
    truncated = int(np.asarray(nt["mt_truncated"], dtype=bool).sum())
    uids = nt.get("uid")
    group_s = (np.array([traj[uids == u].max() for u in dict.fromkeys(uids.tolist())]) if uids is not None
               else traj)
    p50 = float(np.percentile(traj, 50))
    hist = {int(t): int(c) for t, c in zip(*np.unique(turns, return_counts=True))}
    pre = "rolloutpipe/multiturn/"
    m = {f"{pre}turns_mean": float(turns.mean()), f"{pre}turns_p50": float(np.percentile(turns, 50)),
         f"{pre}turns_max": int(turns.max()), f"{pre}tool_calls": int(np.asarray(nt["mt_tool_calls"]).sum()),
         f"{pre}tool_wait_s_mean": float(wait.mean()), f"{pre}tool_wait_s_max": float(wait.max()),
         f"{pre}trajectory_s_p50": p50, f"{pre}trajectory_s_p90": float(np.percentile(traj, 90)),
         f"{pre}trajectory_s_max": float(traj.max()), f"{pre}tail_ratio": float(traj.max() / p50) if p50 > 0 else 0.0,
         f"{pre}group_s_p50": float(np.percentile(group_s, 50)), f"{pre}group_s_max": float(group_s.max()),
         f"{pre}tool_failures": failed, f"{pre}truncated": truncated}
    m.update({f"{pre}turns_hist/{t}": c for t, c in hist.items()})
    line = (f"turns/trajectory mean {m[pre + 'turns_mean']:.2f} max {m[pre + 'turns_max']} "
            f"[{' '.join(f'{t}:{c}' for t, c in hist.items())}] | tool calls {m[pre + 'tool_calls']}, "
            f"wait/trajectory mean {m[pre + 'tool_wait_s_mean']:.3f}s max {m[pre + 'tool_wait_s_max']:.3f}s | "
            f"trajectory p50 {p50:.2f}s p90 {m[pre + 'trajectory_s_p90']:.2f}s max {m[pre + 'trajectory_s_max']:.2f}s "
            f"(tail x{m[pre + 'tail_ratio']:.1f}) | group p50 {m[pre + 'group_s_p50']:.2f}s "
            f"max {m[pre + 'group_s_max']:.2f}s | tool failures {failed} | truncated {truncated}")
    return m, line
