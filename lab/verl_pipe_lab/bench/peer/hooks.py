"""Subclasses of verl's V1 separate_async classes that record events and impose our response lengths.

Nothing of verl's logic is copied: every override calls super() and only records times around it.
verl seams (verl 0.9.1):
- ``PPOTrainerSeparateAsync._init_resource_pool_mgr``: swap DetachActorWorker for our PipeActorWorker
  (the same worker pinned to the trainer cores, as in our modes);
- ``PPOTrainer._submit_batch_to_rollout``: the batch is submitted here; we attach per-group response lengths;
- ``_compute_old_log_prob`` / ``_compute_ref_log_prob`` / ``_update_actor``: the trainer calls of one mini-step
  (``local_trigger_step`` = its index), timed as our trainer spans;
- ``on_step_begin`` / ``on_step_end`` (the weight sync to the standalone rollout) and ``_compute_metrics``
  (called once per step with the trained batch's TransferQueue tags and ``timing_raw``);
- ``AgentLoopWorkerTQ._run_prompt`` (one group), ``AgentLoopWorker._run_agent_loop`` (one request, its output
  put into TransferQueue at the end) and ``AgentLoopManagerTQ.agent_loop_workers_class``.
"""

from __future__ import annotations

import time

import ray
import torch

from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ, AgentLoopWorkerTQ
from verl.trainer.ppo.v1.trainer_separate_async import PPOTrainerSeparateAsync
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.workers.engine_workers import ActorRolloutRefWorker
from verl.trainer.ppo.utils import Role

from verl_pipe_lab.bench.peer.metrics import SPAN_KINDS, step_record
from verl_pipe.platform.patches import patch_separate_async_logger

patch_separate_async_logger()  # verl 0.9.1's logger.info(..., flush=True) in _setup (patches.py)

# Per-prompt tensor of the n response lengths, carried in the batch from the trainer to the agent-loop worker.
LENGTHS_KEY = "verl_pipe_response_lengths"
# Per-prompt multi-turn episode seed (the bench round's), carried the same way; the worker pops it (it never reaches
# TransferQueue) and sets it in the prompt's asyncio task context for verl_pipe's multi-turn agent loop.
EPISODE_SEED_KEY = "verl_pipe_episode_seed"


class PinnedActorRolloutRefWorker(ActorRolloutRefWorker):
    """verl's hybrid actor-rollout worker (colocated: the trainer's side of it), pinned to VERL_PIPE_TRAINER_CORES
    with one intra-op thread per core, as our PipeActorWorker pins the trainer (verl_pipe/trainer/workers.py)."""

    def __init__(self, *args, **kwargs):
        import os

        from verl_pipe.platform.env import pin_current_process

        cores = pin_current_process("VERL_PIPE_TRAINER_CORES")
        if cores:
            torch.set_num_threads(len(cores))
            os.environ["OMP_NUM_THREADS"] = str(len(cores))
        super().__init__(*args, **kwargs)


class PeerAgentLoopWorkerImpl(AgentLoopWorkerTQ.__ray_actor_class__):
    """AgentLoopWorkerTQ that sets max_tokens/ignore_eos per request and keeps per-group event times."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._peer_lengths: dict[str, list[int]] = {}
        self._peer_events: dict[str, dict] = {}

    async def _run_prompt(self, prompt: dict, sampling_params: dict, trajectory: dict, trace: bool = False):
        """One group. A multi-turn episode seed rides in this task's context (copied into the n session tasks verl
        creates here); each session's sample index is verl's own ``session_id`` kwarg (``sample_index``)."""
        from verl_pipe.rollout.multiturn import EPISODE_SEED, task_key

        uid = prompt["uid"]
        lengths = prompt.pop(LENGTHS_KEY, None)
        if lengths is not None:
            self._peer_lengths[uid] = [int(x) for x in lengths.tolist()]
        seed = prompt.pop(EPISODE_SEED_KEY, None)
        if seed is not None:
            EPISODE_SEED.set(int(seed))  # this task's context only (a task per prompt: verl's generate_sequences)
        ev = self._peer_events.setdefault(uid, {"requests": {}, "done": None, "received": time.time()})
        if "index" in prompt:
            ev["task"] = task_key(prompt)
        try:
            return await super()._run_prompt(prompt, sampling_params, trajectory, trace)
        finally:
            ev["done"] = time.time()  # after verl put the group's terminal status
            self._peer_lengths.pop(uid, None)

    async def _run_agent_loop(self, sampling_params, trajectory, *, agent_name, trace=True, **kwargs):
        uid, session = kwargs.get("uid"), kwargs.get("session_id")
        lengths = self._peer_lengths.get(uid)
        if lengths is not None and session is not None:
            sampling_params = {**sampling_params, "max_tokens": lengths[int(session)], "ignore_eos": True}
        req = {"start": time.time(), "end": None, "tokens": None}
        if uid is not None:
            self._peer_events.setdefault(uid, {"requests": {}, "done": None})["requests"][session] = req
        try:
            return await super()._run_agent_loop(sampling_params, trajectory, agent_name=agent_name, trace=trace,
                                                 **kwargs)
        finally:
            req["end"] = time.time()  # the output is in TransferQueue (or the request failed)

    async def _agent_loop_postprocess(self, output, validate, **kwargs):
        outputs = output if isinstance(output, list) else [output]
        ev = self._peer_events.get(kwargs.get("uid"))
        if ev is not None and outputs:
            req = ev["requests"].get(kwargs.get("session_id"))
            if req is not None:
                req["tokens"] = sum(len(o.response_ids) for o in outputs)
        return await super()._agent_loop_postprocess(output, validate, **kwargs)

    def take_peer_events(self, uids: list[str]) -> dict:
        return {u: self._peer_events.pop(u) for u in uids if u in self._peer_events}


PeerAgentLoopWorker = ray.remote(PeerAgentLoopWorkerImpl)


class PeerAgentLoopManager(AgentLoopManagerTQ):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.agent_loop_workers_class = PeerAgentLoopWorker  # read by create() -> _init_agent_loop_workers

    def take_peer_events(self, uids: list[str]) -> dict:
        out: dict = {}
        for part in ray.get([w.take_peer_events.remote(uids) for w in self.agent_loop_workers]):
            out.update(part)
        return out


class PeerTrainerMixin:
    """What the peers of verl's V1 trainers record (mixed in before verl's class): imposed lengths, the trainer's
    calls, the weight sync and the step's record; ``poll_interval_s``: the replay buffer's poll (None: verl's)."""

    def __init__(self, config, lengths_fn=None, on_record=None, episode_seed_fn=None, poll_interval_s=None):
        """lengths_fn(submission_index, num_prompts, n) -> lengths[prompt][session] or None (model decides);
        on_record(record): called with each step's record (metrics.step_record) as it completes;
        episode_seed_fn(submission_index) -> the multi-turn episode seed of that batch's prompts (None: the config's
        ``rolloutpipe.multiturn.seed``); poll_interval_s: ReplayBuffer.poll_interval (verl: 2.0 s, a constructor
        argument; a verl user sets it through ``trainer.v1.sampler.custom_sampler``, a ReplayBuffer subclass)."""
        self._poll_interval_s = poll_interval_s  # read by _build_replay_buffer, which verl's __init__ calls
        self._phases: list[dict] = []
        super().__init__(config)
        self._lengths_fn = lengths_fn
        self._episode_seed_fn = episode_seed_fn
        self._on_record = on_record
        self.peer_records: list[dict] = []
        self._submissions = 0
        self._uid_group: dict[str, tuple[int, float]] = {}  # uid -> (group id, submission time)
        self._spans: list[dict] = []
        self._sync: tuple[float, float] | None = None
        self._step_start = None
        self._step_t0 = None
        self.groups_per_unit = int(config.actor_rollout_ref.actor.ppo_mini_batch_size)

    def _poll_for(self, step_index: int) -> float | None:
        """The poll interval of the step_index-th step (0-based, warm-up included): a list cycles over the steps (a
        within-stack A/B of the poll interval, docs/peer.md), a number is every step's, None verl's."""
        p = self._poll_interval_s
        if isinstance(p, (list, tuple)):
            return float(p[step_index % len(p)])
        return None if p is None else float(p)

    def _build_replay_buffer(self):
        rb = super()._build_replay_buffer()
        poll = self._poll_for(0)
        if poll is not None:
            rb.poll_interval = poll
        return rb

    def _init_resource_pool_mgr(self):
        super()._init_resource_pool_mgr()
        from verl_pipe.trainer.workers import PipeActorWorker

        for role in (Role.Actor, Role.RefPolicy):
            if role in self.role_worker_mapping:
                self.role_worker_mapping[role] = ray.remote(PipeActorWorker)
        for role in (Role.ActorRollout, Role.ActorRolloutRef):  # colocated (hybrid engine): verl's worker, pinned
            if role in self.role_worker_mapping:
                self.role_worker_mapping[role] = ray.remote(PinnedActorRolloutRefWorker)

    def _phase(self, name: str, start: float) -> None:
        self._phases.append({"phase": name, "start": start, "end": time.time()})

    def _submit_batch_to_rollout(self, batch):
        n = int(self.config.actor_rollout_ref.rollout.n)
        if self._lengths_fn is not None:
            lengths = self._lengths_fn(self._submissions, len(batch), n)
            if lengths is not None:
                batch[LENGTHS_KEY] = torch.tensor(lengths, dtype=torch.int64)
        if self._episode_seed_fn is not None:
            batch[EPISODE_SEED_KEY] = torch.full((len(batch),), int(self._episode_seed_fn(self._submissions)),
                                                 dtype=torch.int64)
        now = time.time()
        if self._step_start is not None and self._step_t0 is None:
            self._step_t0 = now  # the step's own submission (prepare_step): t0 of its metrics
        for i, uid in enumerate(batch["uid"]):
            self._uid_group[str(uid)] = (self._submissions * 100_000 + i, now)
        self._submissions += 1
        return super()._submit_batch_to_rollout(batch)

    def _timed(self, name, batch, metrics):
        start = time.time()
        try:
            return getattr(super(), name)(batch, metrics)
        finally:
            self._spans.append({"kind": SPAN_KINDS[name], "start": start, "end": time.time(),
                                "unit": int(self.local_trigger_step)})

    def _compute_old_log_prob(self, batch, metrics):
        return self._timed("_compute_old_log_prob", batch, metrics)

    def _compute_ref_log_prob(self, batch, metrics):
        return self._timed("_compute_ref_log_prob", batch, metrics)

    def _update_actor(self, batch, metrics):
        return self._timed("_update_actor", batch, metrics)

    def on_step_begin(self):
        self._step_start = time.time()
        self._step_t0 = None
        self._spans, self._sync, self._phases = [], None, []
        poll = self._poll_for(len(self.peer_records))
        if poll is not None:
            self.replay_buffer.poll_interval = poll
        return super().on_step_begin()

    def on_step_end(self):
        start = time.time()
        try:
            return super().on_step_end()
        finally:
            self._sync = (start, time.time())

    def _compute_metrics(self, batch, metrics, timing_raw, global_steps, epoch):
        step_end = self._sync[1] if self._sync else time.time()
        out = super()._compute_metrics(batch, metrics, timing_raw, global_steps=global_steps, epoch=epoch)
        uids = sorted({k.split("_")[0] for k in batch.keys})
        events = self.agent_loop_manager.take_peer_events(uids)
        groups = {}
        for u in uids:
            if u in events:
                gid, submitted = self._uid_group.pop(u, (-1, None))
                groups[u] = dict(events[u], group=gid, **({"submitted": submitted} if submitted else {}))
        record = step_record(int(global_steps), self.groups_per_unit, groups, list(self._spans), self._sync,
                             self._step_start, step_end, dict(timing_raw), list(batch.tags), self._step_t0)
        record["tasks"] = [g.get("task") for g in sorted(groups.values(), key=lambda g: g["group"])]
        t0 = self._step_t0 or self._step_start
        record["phases"] = [{"phase": p["phase"], "start": p["start"] - t0, "end": p["end"] - t0}
                            for p in self._phases]
        record["poll_interval_s"] = float(self.replay_buffer.poll_interval)
        record["verl_metrics"] = {k: float(v) for k, v in metrics.items()
                                  if isinstance(v, (int, float)) and not isinstance(v, bool)}
        self.peer_records.append(record)
        if self._on_record is not None:
            self._on_record(record)
        return out


class PeerSeparateAsyncTrainer(PeerTrainerMixin, PPOTrainerSeparateAsync):
    """verl's separate_async trainer, pinned like our modes, with imposed lengths and recorded events."""


class PeerColocatedSyncTrainer(PeerTrainerMixin, PPOTrainerSync):
    """verl's V1 sync trainer (main_ppo's default), colocated: actor and vLLM share one pool that holds every core and
    take turns; records, besides the mixin's, the replicas' sleep after the rollout (``on_sample_end``) and the
    in-process weight reload with its wake-up (``on_step_end``: CheckpointEngineManager.update_weights, naive)."""

    def on_sample_end(self):
        start = time.time()
        try:
            return super().on_sample_end()
        finally:
            self._phase("sleep", start)

    def on_step_end(self):
        start = time.time()
        try:
            return super().on_step_end()
        finally:
            self._phase("weight_reload", start)
