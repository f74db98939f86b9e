"""verl's own synchronous trainer on separate pools, as a measured peer: the legacy ``SeparateRayPPOTrainer``'s
``fit`` / ``fit_step`` (generate the whole batch, then reward, old log-probs, advantage, update, weight sync) on
``OneStepOffRayTrainer``'s separate-pool wiring (actor on the trainer pool, standalone vLLM replicas on their own pool,
a checkpoint engine between them: the wiring our RolloutPipeTrainer also builds on).

Nothing of verl's logic is copied: every override calls super() and only records times around it or attaches the
bench's response lengths. verl seams (verl 0.9.1):
- ``OneStepOffRayTrainer`` with ``fit`` / ``fit_step`` taken from ``SeparateRayPPOTrainer`` (OneStepOff's own overlap
  the next batch's rollout with this step's training: one step off-policy);
- ``_get_gen_batch``: the step's batch before verl repeats it n times; we attach per-prompt response lengths;
- ``_compute_old_log_prob`` / ``_compute_ref_log_prob`` / ``_update_actor`` (RayPPOTrainer): the trainer's calls;
  ``_fit_generate`` (the rollout, timed), ``_fit_update_weights`` (the weight sync), ``_fit_postprocess_step``;
- ``actor_rollout_ref.rollout.agent.agent_loop_manager_class`` (OneStepOff loads it by FQN): verl's AgentLoopManager
  with a worker whose ``_run_agent_loop`` sets each request's max_tokens / ignore_eos and keeps its event times.
"""

from __future__ import annotations

import time

import numpy as np
import ray

from verl.experimental.agent_loop.agent_loop import AgentLoopManager, AgentLoopWorker
from verl.experimental.one_step_off_policy.ray_trainer import OneStepOffRayTrainer
from verl.experimental.separation.ray_trainer import SeparateRayPPOTrainer

from verl_pipe_lab.bench.peer.metrics import step_record

# Per-prompt list of the n response lengths, carried from the trainer to the agent-loop worker (popped there).
LENGTHS_KEY = "verl_pipe_response_lengths"


class PeerLegacyAgentLoopWorkerImpl(AgentLoopWorker):
    """verl's AgentLoopWorker that sets max_tokens / ignore_eos per request and keeps per-group event times."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._plan: dict[str, list[int]] = {}
        self._peer_events: dict[str, dict] = {}

    async def generate_sequences(self, batch):
        lengths = batch.non_tensor_batch.pop(LENGTHS_KEY, None)
        if lengths is not None:
            for uid, ls in zip(batch.non_tensor_batch["uid"], lengths):
                self._plan[str(uid)] = [int(x) for x in ls]
        received = time.time()
        for uid in {str(u) for u in batch.non_tensor_batch["uid"]}:
            self._peer_events.setdefault(uid, {"requests": {}, "done": None, "received": received})
        try:
            return await super().generate_sequences(batch)
        finally:
            for uid in {str(u) for u in batch.non_tensor_batch["uid"]}:
                self._plan.pop(uid, None)

    async def _run_agent_loop(self, sampling_params, trajectory, *, agent_name, trace=True, **kwargs):
        uid, session = str(kwargs.get("uid")), int(trajectory["rollout_n"])  # rank within its group (verl's count)
        plan = self._plan.get(uid)
        if plan is not None:
            sampling_params = {**sampling_params, "max_tokens": plan[session], "ignore_eos": True}
        ev = self._peer_events.setdefault(uid, {"requests": {}, "done": None})
        req = ev["requests"][session] = {"start": time.time(), "end": None, "tokens": None}
        try:
            out = await super()._run_agent_loop(sampling_params, trajectory, agent_name=agent_name, trace=trace,
                                                **kwargs)
            req["tokens"] = int(out.response_mask.sum())
            return out
        finally:
            req["end"] = time.time()
            ev["done"] = max(ev["done"] or 0.0, req["end"])  # the group's last response (no streaming here)

    def take_peer_events(self, uids: list[str]) -> dict:
        return {u: self._peer_events.pop(u) for u in uids if u in self._peer_events}


class PeerLegacyAgentLoopManager(AgentLoopManager):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.agent_loop_workers_class = ray.remote(PeerLegacyAgentLoopWorkerImpl)  # read by create()

    def take_peer_events(self, uids: list[str]) -> dict:
        out: dict = {}
        for part in ray.get([w.take_peer_events.remote(uids) for w in self.agent_loop_workers]):
            out.update(part)
        return out


SPAN = {"_compute_old_log_prob": "old_log_prob", "_compute_ref_log_prob": "ref_log_prob", "_update_actor": "update"}


class PeerSeparateSyncTrainer(OneStepOffRayTrainer):
    """verl's synchronous separate-pool step (SeparateRayPPOTrainer.fit_step) on OneStepOffRayTrainer's wiring, with
    imposed lengths and recorded events; every call goes to verl's code."""

    fit = SeparateRayPPOTrainer.fit
    fit_step = SeparateRayPPOTrainer.fit_step
    _fit_generate = SeparateRayPPOTrainer._fit_generate

    def __init__(self, *args, lengths_fn=None, on_record=None, **kwargs):
        super().__init__(*args, **kwargs)
        self._lengths_fn = lengths_fn
        self._on_record = on_record
        self.peer_records: list[dict] = []
        self._submissions = 0
        self._uid_group: dict[str, tuple[int, float]] = {}
        self._spans: list[dict] = []
        self._sync = None
        self._step_start = self._step_t0 = None
        self.groups_per_unit = int(self.config.actor_rollout_ref.actor.ppo_mini_batch_size)

    def _fit_prepare_step(self):
        self._step_start, self._step_t0, self._spans, self._sync = time.time(), None, [], None
        return super()._fit_prepare_step()

    def _get_gen_batch(self, batch):
        gen = super()._get_gen_batch(batch)
        n = int(self.config.actor_rollout_ref.rollout.n)
        uids = [str(u) for u in gen.non_tensor_batch["uid"]]
        if self._lengths_fn is not None:
            lengths = self._lengths_fn(self._submissions, len(uids), n)
            if lengths is not None:
                col = np.empty(len(uids), dtype=object)
                col[:] = [list(map(int, ls)) for ls in lengths]
                gen.non_tensor_batch[LENGTHS_KEY] = col
        now = time.time()
        self._step_t0 = now  # the batch goes to the rollout next (SeparateRayPPOTrainer._fit_generate)
        for i, uid in enumerate(uids):
            self._uid_group[uid] = (self._submissions * 100_000 + i, now)
        self._submissions += 1
        return gen

    def _timed(self, name, batch):
        start = time.time()
        try:
            return getattr(super(), name)(batch)
        finally:
            self._spans.append({"kind": SPAN[name], "start": start, "end": time.time(), "unit": 0})

    def _compute_old_log_prob(self, batch):
        return self._timed("_compute_old_log_prob", batch)

    def _compute_ref_log_prob(self, batch):
        return self._timed("_compute_ref_log_prob", batch)

    def _update_actor(self, batch):
        return self._timed("_update_actor", batch)

    def _fit_update_weights(self):
        start = time.time()
        try:
            return super()._fit_update_weights()
        finally:
            if self._step_start is not None:  # not the initial sync in fit()
                self._sync = (start, time.time())

    def _fit_postprocess_step(self):
        step = int(self.global_steps)
        uids = list(self._uid_group)
        events = self.async_rollout_manager.take_peer_events(uids)
        groups = {}
        for u in uids:
            gid, submitted = self._uid_group.pop(u)
            if u in events:
                groups[u] = dict(events[u], group=gid, submitted=submitted)
        step_end = self._sync[1] if self._sync else time.time()
        # every trained trajectory was generated with the weights synced after the previous step (a synchronous step)
        tags = [{"min_global_steps": step - 1, "max_global_steps": step - 1, "global_steps": step}
                for g in groups.values() for _ in g["requests"]]
        record = step_record(step, self.groups_per_unit, groups, list(self._spans), self._sync, self._step_start,
                             step_end, dict(self.timing_raw), tags, self._step_t0)
        record["weight_versions"]["source"] = "synchronous step (not tagged by verl's legacy agent loop)"
        record["verl_metrics"] = {k: float(v) for k, v in self.metrics.items()
                                  if isinstance(v, (int, float)) and not isinstance(v, bool)}
        self.peer_records.append(record)
        if self._on_record is not None:
            self._on_record(record)
        return super()._fit_postprocess_step()
