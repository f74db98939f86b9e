"""Run one step's requests through verl's agent loop, one response at a time.

verl's ``AgentLoopManager.generate_sequences`` returns only when the whole batch is
done. Pipelining needs every response the moment it finishes, so this module
drives verl's own ``AgentLoopWorker`` per request instead (``agent_worker.PipeAgentLoopWorker``: the same, its
per-request agent-loop object built without Hydra's overhead): the same agent loop,
tokenization, padding and streamed reward (``RewardLoopWorker``) as verl's path,
but each request is admitted by an admission policy (``verl_pipe.core.frontier``) and
handed back as soon as it is done. When all n responses of a group are in, the
caller's ``on_group`` callback materializes it.

What happens to a request or a group (retries, dropped groups, dead replicas, late groups, the
leftovers once the batch is full) is decided by ``verl_pipe.core.rollout_core.RolloutCore``, the same
code the simulator drives; ``_StepRun`` here only awaits the tasks and carries out its actions.

The driver runs an asyncio loop in a background thread, so the trainer's main
thread can train while the rollout continues.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import logging
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from verl import DataProto

from verl_pipe.core.frontier import Admission, AdmissionPolicy, Request
from verl_pipe.core.rollout_core import (Cancel, FailStep, GiveUp, GroupEnded, HandOver, NextTurn, Restart, Retire,
                                         Retry, RolloutCore, Submit, Take, ZeroReward)
from verl_pipe.core.timeline import StepTimeline
from verl_pipe.rollout.agent_worker import PipeAgentLoopWorker
from verl_pipe.rollout.client import CURRENT_ADMISSION, AdmissionRoutedClient
from verl_pipe.rollout.completions import Completions
from verl_pipe.rollout.group_scores import REWARD_ERROR, extra_keys, score_group, zero_scores
from verl_pipe.rollout.replicas import ReplicaLostError, is_replica_death  # noqa: F401 (re-exported)
from verl_pipe.rollout.turns import CURRENT_TURN_GATE, TurnGate

logger = logging.getLogger(__name__)


@dataclass
class StepRequest:
    """What the trainer asks the rollout for in one step."""

    step: int
    gen_batch: DataProto  # one row per prompt (group), in dispatch order
    n: int
    policy: AdmissionPolicy
    timeline: StepTimeline
    # Called in the rollout thread with (group index, its n padded agent-loop outputs).
    on_group: Callable[[int, DataProto], bool]
    # Optional per-request sampling overrides (e.g. the benchmark's fixed lengths).
    sampling_overrides: Callable[[int, int], dict] | None = None
    max_retries: int = 2
    request_timeout_s: float | None = None
    # After max_retries: "fail" the step, or "drop_group" (the next group, e.g. an oversampled one, replaces it).
    on_request_failure: str = "fail"
    weight_version: int = 0  # θ_k: what a restarted replica must be loaded with
    # Called in the rollout thread with (group index, how it ended: rollout_core.GROUP_ENDS) once the rollout has
    # settled a group, after on_group for a handed-over one (the dispatch-order unit fill, verl_pipe/core/release.py).
    on_group_ended: Callable[[int, str], None] | None = None
    # A reward call's bound (per group with rolloutpipe.reward.score_by_group, else per response; None: no limit) and
    # what a reward that raised or timed out does: "fail" the step naming the record, "zero_reward", "drop_group".
    reward_timeout_s: float | None = None
    on_reward_failure: str = "fail"


@dataclass
class StepResult:
    responses: int = 0
    failed_attempts: int = 0
    aborted: int = 0
    groups_done: int = 0
    untrainable: int = 0
    late_groups: int = 0  # completed after the batch was full: dropped, never trained
    dropped_groups: int = 0  # a request failed past max_retries, or its reward failed (on_*_failure=drop_group)
    reward_failures: int = 0  # a response's or a group's reward raised or timed out
    replica_failures: int = 0  # replicas found dead during the step
    replica_restarts: int = 0
    requeued_requests: int = 0  # in flight on a dead replica, resubmitted
    recovery_s: list[float] = field(default_factory=list)  # death noticed -> replica back, per restart
    elapsed_s: float = 0.0
    errors: list[str] = field(default_factory=list)


class StreamingRollout:
    reward_keys: tuple[str, ...] | None = None  # the reward's extra-info keys, once a response is scored

    def __init__(self, config, servers: list[tuple[str, Any]], reward_loop_worker_handles=None,
                 load_balancer_handle=None, supervisor=None):
        self.config = config
        self.supervisor = supervisor  # ReplicaSupervisor (restarts or retires dead replicas), or None
        self._tasks: dict = {}  # the running step's request tasks
        self._scoring: dict = {}  # ... and its groups' reward calls
        self.client = AdmissionRoutedClient(config, load_balancer_handle=load_balancer_handle, servers=servers)
        self.worker = PipeAgentLoopWorker(config, self.client, None, reward_loop_worker_handles)
        reward_cfg = config.rolloutpipe.get("reward") or {}
        self.worker.score_by_group = bool(reward_cfg.get("score_by_group", False))
        self.worker.catch_reward_errors = True  # a reward failure is the rollout core's to decide on
        rollout_cfg = config.actor_rollout_ref.rollout
        self.sampling_params = dict(
            temperature=rollout_cfg.temperature,
            top_p=rollout_cfg.top_p,
            top_k=rollout_cfg.top_k,
            repetition_penalty=1.0,
            logprobs=rollout_cfg.calculate_log_probs,
        )
        self.default_agent = rollout_cfg.agent.default_agent_loop
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="verl-pipe-rollout", daemon=True)
        self._thread.start()

    @property
    def num_replicas(self) -> int:
        return len(self.client._servers)

    def live_replicas(self) -> list[int]:
        """The replicas a step may admit to (a retired one is gone for good)."""
        return self.supervisor.live() if self.supervisor is not None else list(range(self.num_replicas))

    def start(self, request: StepRequest) -> Future:
        """Starts the step's rollout in the background; the future resolves to a StepResult."""
        return asyncio.run_coroutine_threadsafe(self._run_step_or_clean_up(request), self._loop)

    async def _run_step_or_clean_up(self, req: StepRequest) -> StepResult:
        try:
            return await self._run_step(req)
        except BaseException:
            # The step failed: none of its requests may outlive it (their results would go nowhere). The
            # ones still inside vLLM are aborted by the next weight sync, like a full batch's leftovers.
            tasks = [*self._tasks, *self._scoring]  # requests and groups' reward calls
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
            raise

    def shutdown(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    # ------------------------------------------------------------------ internals

    def _row_kwargs(self, gen_batch: DataProto, group: int) -> dict:
        kwargs = {k: v[group] for k, v in gen_batch.non_tensor_batch.items()}
        kwargs.setdefault("agent_name", self.default_agent)
        return kwargs

    async def _one(self, req: StepRequest, adm, attempt: int):
        group, index = adm.request.group, adm.request.index
        CURRENT_ADMISSION.set(adm)  # this task's context only: routes the request to adm.replica
        kwargs = self._row_kwargs(req.gen_batch, group)
        kwargs["priority"] = adm.priority
        sampling_params = dict(self.sampling_params)
        if req.sampling_overrides is not None:
            sampling_params.update(req.sampling_overrides(group, index))
        sample_index = kwargs.get("index", group)
        trajectory = {"step": req.step, "sample_index": sample_index, "rollout_n": index, "validate": False}
        coro = self.worker._run_agent_loop(sampling_params, trajectory, trace=False, **kwargs)
        if req.request_timeout_s:
            return await asyncio.wait_for(coro, timeout=req.request_timeout_s)
        return await coro

    async def _run_step(self, req: StepRequest) -> StepResult:
        """One step: the step's ``RolloutCore`` decides, ``_StepRun`` awaits and carries its actions out."""
        run = _StepRun(self, req)
        self.worker.reward_timeout_s = req.reward_timeout_s
        self._tasks, self._scoring = run.tasks, run.scoring  # for the clean-up of a failed step
        return await run.run()


class _StepRun:
    """One step's I/O around its ``RolloutCore`` (verl_pipe/core/rollout_core.py): an asyncio task per submitted
    request, one per replica restart, the responses of incomplete groups, the timeline. Every decision is the core's.

    Seams on the ``StreamingRollout`` it runs for: ``_one(req, admission, attempt)`` (one request through verl's
    agent loop; a timeout or error raises), ``worker._postprocess`` (pads a group's n outputs), ``supervisor``
    (``restart_enabled``, ``restart(replica, weight_version)``, ``retire(replica)``, run in threads), and
    ``_tasks``, which is ``self.tasks``: the request tasks in flight (cancelled when the step fails)."""

    def __init__(self, rollout: StreamingRollout, req: StepRequest):
        self.rollout, self.req, self.timeline = rollout, req, req.timeline
        self.core = RolloutCore(req.policy, max_retries=req.max_retries, on_request_failure=req.on_request_failure,
                                on_reward_failure=req.on_reward_failure)
        self.tasks: dict[asyncio.Task, Admission] = {}
        self.task_of: dict[Request, asyncio.Task] = {}
        self.restarting: dict[asyncio.Task, tuple[int, float]] = {}  # restart task -> (replica, when death noticed)
        self.scoring: dict[asyncio.Task, int] = {}  # a group's reward call -> group
        self.handing: dict[int, tuple[list, asyncio.Task]] = {}  # completed, scoring: group -> (outputs, its call)
        self.completions = Completions()  # every task above and in `restarting` is added here when created
        self.outputs: dict[int, dict[int, Any]] = {}  # group -> index -> agent-loop output, until the group ends
        self.turn_reports: dict[asyncio.Future, TurnGate] = {}  # multi-turn: a trajectory reported turn events
        self.next_turns: dict[Request, asyncio.Future] = {}  # multi-turn: waiting for NextTurn
        self.errors: list[str] = []
        self.recovery_s: list[float] = []

    def rid(self, r: Request) -> str:
        return f"s{self.req.step}-g{r.group}-r{r.index}"

    def record(self, group: int) -> str:
        """The dataset record of ``group`` as a user finds it: its index (verl's ``extra_info.index``) and source."""
        nt = self.req.gen_batch.non_tensor_batch
        parts = [f"group {group}"]
        for key, name in (("index", "record index"), ("data_source", "data_source")):
            if nt.get(key) is not None and group < len(nt[key]):
                parts.append(f"{name} {nt[key][group]}")
        return ", ".join(parts)

    def reward_failed(self, group: int, error: str, request: Request | None = None,
                      replica: int | None = None) -> tuple[list, str]:
        """A reward that raised or timed out: the core's decision and the log line naming the record."""
        what = f"response {self.rid(request)}" if request is not None else "group"
        msg = (f"step {self.req.step}: the reward of the {what} of {self.record(group)} failed "
               f"(rolloutpipe.reward.on_failure={self.req.on_reward_failure}): {error}")
        logger.warning(msg)
        keys = self.rollout.reward_keys
        return self.core.reward_failed(group, request, replica, can_zero=keys is not None), msg

    def learn_reward_keys(self, outs: list) -> None:
        if self.rollout.reward_keys is None:
            self.rollout.reward_keys = extra_keys(outs)

    async def run(self) -> StepResult:
        start = time.perf_counter()
        core = self.core
        await self.do(core.admit())
        while (self.tasks or self.restarting or self.scoring) and not core.all_done:
            for task in await self.completions.wait():
                await self.finished(task)
            if core.batch_full:  # after every response of this wake-up: the ones that completed a group were late
                await self.do(self.scored_too_late())
                await self.do(core.close())
                break
            await self.do(core.admit())
        # the batch filled on the other replicas: a restart still finishes, for the next step
        for task, info in list(self.restarting.items()):
            await asyncio.wait([task])
            await self.restarted(task, info)
        return StepResult(**dataclasses.asdict(core.counts), recovery_s=self.recovery_s,
                          elapsed_s=time.perf_counter() - start, errors=self.errors)

    async def finished(self, task: asyncio.Task) -> None:
        """A task finished: a restart, or a request (its response, its failure, or its replica's death)."""
        if task in self.restarting:
            await self.restarted(task, self.restarting.pop(task))
            return
        if task in self.scoring:
            await self.scored(task)
            return
        gate = self.turn_reports.pop(task, None)
        if gate is not None:
            self.turn_events(gate)
            return
        adm = self.tasks.pop(task, None)
        if adm is None:  # cancelled in this wake-up (its replica died or its group was dropped)
            if not task.cancelled():
                task.exception()  # it had already failed (its replica's death): retrieved, not logged at exit
            return
        del self.task_of[adm.request]
        try:
            out = task.result()
        except Exception as e:
            if is_replica_death(e):
                await self.replica_died(adm.replica, e)
            else:
                await self.request_failed(adm, e)
            return
        r = adm.request
        error = out.extra_fields.pop(REWARD_ERROR, None)  # its own reward call failed (verl's per-response path)
        if error is not None:
            actions, msg = self.reward_failed(r.group, error, r, adm.replica)
            if not (actions and isinstance(actions[0], ZeroReward)):
                await self.do(actions, RuntimeError(error), msg)
                return
            zero_scores([out], self.rollout.reward_keys)
        else:
            self.learn_reward_keys([out])
        tokens = int(out.response_mask.sum().item())
        for act in self.core.response_done(r, adm.replica, tokens):
            if isinstance(act, Take):
                self.timeline.response_done(self.rid(r), r.group, tokens)
                self.outputs.setdefault(r.group, {})[r.index] = out
            elif isinstance(act, HandOver):
                outs = self.outputs.pop(r.group)
                group_outs = [outs[i] for i in range(self.core.n)]
                worker = self.rollout.worker
                if worker.score_by_group:  # one reward call for the group, while the loop goes on admitting
                    scoring = self.completions.add(asyncio.create_task(
                        score_group(group_outs, worker.reward_loop_worker_handles, self.req.reward_timeout_s)))
                    self.scoring[scoring] = r.group
                    self.handing[r.group] = (group_outs, scoring)
                else:
                    await self.hand_over(r.group, group_outs)
            else:
                await self.do([act])

    async def scored(self, task: asyncio.Task) -> None:
        """A group's rewards came back (``rolloutpipe.reward.score_by_group``). Groups are handed over in the order
        they completed, as without it (the first trainable groups to complete fill the batch): this one and the
        scored ones after it, up to the first still scoring. A reward call that raised or timed out is a reward
        failure (``RolloutCore.reward_failed``): the step fails naming the record, the group scores 0, or it is
        dropped."""
        group = self.scoring.pop(task)
        outs = self.handing[group][0]  # still there: a group is handed over only once its call is processed here
        try:
            task.result()
        except Exception as e:
            actions, msg = self.reward_failed(group, _brief(e))
            if not (actions and isinstance(actions[0], ZeroReward)):
                del self.handing[group]
                await self.do(actions, e, msg)
            else:
                zero_scores(outs, self.rollout.reward_keys)
        else:
            self.learn_reward_keys(outs)
        while self.handing and not self.core.batch_full:
            first, (group_outs, scoring) = next(iter(self.handing.items()))
            if scoring in self.scoring:  # its call still runs, or it is done but its outcome not yet seen here
                break
            del self.handing[first]
            await self.hand_over(first, group_outs)

    def scored_too_late(self) -> list:
        """The batch filled while groups that completed after the last one it took were still scoring: they end
        late, as a group completing after the batch filled does."""
        actions = []
        for group, (_, scoring) in list(self.handing.items()):
            if scoring.done() and not scoring.cancelled():
                scoring.exception()  # a reward that already failed: the group ends late all the same
            scoring.cancel()
            self.scoring.pop(scoring, None)
            actions += self.core.too_late(group)
        self.handing.clear()
        return actions

    async def hand_over(self, group: int, group_outs: list) -> None:
        gen_out = self.rollout.worker._postprocess(group_outs, validate=False)
        await self.do(self.core.handed_over(group, self.req.on_group(group, gen_out)))

    def report_turn(self, gate: TurnGate) -> None:
        """A trajectory's turn event (verl_pipe/rollout/turns.py): wakes the loop, which calls ``turn_events``."""
        done = asyncio.get_running_loop().create_future()
        done.set_result(None)
        self.turn_reports[self.completions.add(done)] = gate

    def turn_events(self, gate: TurnGate) -> None:
        """Multi-turn: a trajectory's model turn ended (its slot is freed) or its tool returned (its next turn waits
        for a NextTurn); a report from a task no longer in flight (cancelled, requeued) is ignored."""
        r = gate.request
        for kind, fut in gate.drain():
            if self.task_of.get(r) is not gate.task:
                if fut is not None:
                    fut.cancel()
                continue
            if kind == "turn_done":
                self.core.turn_done(r, gate.replica)
            else:
                self.next_turns[r] = fut
                self.core.tool_done(r, gate.replica)

    async def request_failed(self, adm: Admission, e: Exception) -> None:
        """A failed or timed-out request: retried, or given up on (the step fails or its group is dropped)."""
        r = adm.request
        actions = self.core.request_failed(r, adm.replica)
        msg = f"request {self.rid(r)} failed (attempt {self.core.failures(r)}): {_brief(e)}"
        logger.warning(msg)
        await self.do(actions, e, msg)

    async def replica_died(self, replica: int, e: Exception) -> None:
        sup = self.rollout.supervisor
        actions = self.core.replica_died(replica, restart=sup is not None and sup.restart_enabled)
        if actions:  # the first of its requests to notice
            logger.error("step %d: rollout replica %d died (%s: %s)", self.req.step, replica, type(e).__name__,
                         _brief(e))
        await self.do(actions, e)

    async def restarted(self, task: asyncio.Task, info: tuple[int, float]) -> None:
        replica, t_dead = info
        try:
            task.result()
        except Exception as e:
            actions = self.core.replica_back(replica, ok=False)
            if not actions:
                logger.error("rollout replica %d could not be restarted (%s); going on without it", replica, e)
            await self.do(actions, e)
            return
        self.recovery_s.append(time.perf_counter() - t_dead)
        await self.do(self.core.replica_back(replica, ok=True))

    async def do(self, actions: list, error: BaseException | None = None, msg: str = "") -> None:
        """Carries out the core's actions in order; ``error`` (and ``msg``, its log line) is what a failure
        event was about."""
        for act in actions:
            if isinstance(act, Submit):
                adm = act.admission
                self.timeline.request_submitted(self.rid(adm.request), adm.request.group, replica=adm.replica)
                gate = TurnGate(adm.request, adm.replica, self.report_turn)
                ctx = contextvars.copy_context()
                ctx.run(CURRENT_TURN_GATE.set, gate)  # this task's context: its agent loop's turn events
                coro = self.rollout._one(self.req, adm, act.attempt)
                task = gate.task = self.completions.add(asyncio.create_task(coro, context=ctx))
                self.tasks[task] = adm
                self.task_of[adm.request] = task
            elif isinstance(act, NextTurn):
                fut = self.next_turns.pop(act.admission.request, None)
                if fut is not None and not fut.done():
                    fut.set_result(None)
            elif isinstance(act, Cancel):
                await self.cancel(act)
            elif isinstance(act, GroupEnded):
                self.outputs.pop(act.group, None)
                if act.how == "dropped":
                    logger.warning("dropping group %d of step %d: its next group takes its place", act.group,
                                   self.req.step)
                self.timeline.group_done(act.group, act.trainable)
                if self.req.on_group_ended is not None:
                    self.req.on_group_ended(act.group, act.how)
            elif isinstance(act, Restart):
                restart = asyncio.to_thread(self.rollout.supervisor.restart, act.replica, self.req.weight_version)
                self.restarting[self.completions.add(asyncio.create_task(restart))] = (act.replica, time.perf_counter())
            elif isinstance(act, Retire):
                if self.rollout.supervisor is not None:
                    await asyncio.to_thread(self.rollout.supervisor.retire, act.replica)
            elif isinstance(act, GiveUp):
                self.errors.append(msg)
            elif isinstance(act, FailStep):
                raise self.failure(act, error, msg) from error
            elif not isinstance(act, Retry):  # a retry is resubmitted by a later admit()
                raise TypeError(f"unexpected rollout action {act!r}")

    async def cancel(self, act: Cancel) -> None:
        """Cancels the tasks of ``act.requests`` still running. The batch is full: also waits for them to stop.

        Our tasks stop waiting now; the requests still running inside vLLM are aborted by the weight sync that ends
        the step (verl's CheckpointEngineManager aborts every replica's in-flight requests before loading new
        weights), so none of them outlives the step."""
        cancelled = []
        for q in act.requests:
            self.next_turns.pop(q, None)
            task = self.task_of.pop(q, None)
            if task is None:  # its task already finished (the request that found its replica dead)
                continue
            task.cancel()
            del self.tasks[task]
            self.timeline.request_aborted(self.rid(q), q.group)
            cancelled.append(task)
        if act.why == "batch_full" and cancelled:
            await asyncio.gather(*cancelled, return_exceptions=True)

    def failure(self, act: FailStep, error: BaseException | None, msg: str) -> Exception:
        if act.why == "reward_failed":
            return RewardFailedError(
                f"{msg}. Not retried: re-running the step (trainer.resume_mode=auto) scores the same record again; "
                "fix the reward, or set rolloutpipe.reward.on_failure=drop_group (or zero_reward) to go on without it")
        if act.why == "request_failed":
            return RuntimeError(f"{msg}; giving up after rolloutpipe.fault.max_request_retries="
                                f"{self.req.max_retries} (rolloutpipe.fault.on_request_failure=fail)")
        if act.why == "no_replica_left":
            return ReplicaLostError(f"step {self.req.step}: rollout replica {act.replica} died and no replica is "
                                    f"left (rolloutpipe.fault.replica_restart=false): {_brief(error)}")
        return ReplicaLostError(f"rollout replica {act.replica} died and could not be restarted "
                                f"({type(error).__name__}: {error}); no replica is left")


class RewardFailedError(RuntimeError):
    """A reward raised or timed out with rolloutpipe.reward.on_failure=fail; the message names the record."""


def _brief(exc: BaseException) -> str:
    """One line for an error; a Ray task error's text is the remote traceback, its last line the error."""
    lines = [ln for ln in str(exc).splitlines() if ln.strip()]
    return f"{type(exc).__name__}: {lines[-1].strip() if lines else ''}"


def group_rows(gen_batch: DataProto, group: int) -> DataProto:
    """The prompt row of one group, as a 1-row DataProto."""
    return gen_batch.select_idxs(np.array([group]))
