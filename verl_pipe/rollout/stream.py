"""Run one step's requests through verl's agent loop, one response at a time.

verl's ``AgentLoopManager.generate_sequences`` returns only when the whole batch is
done. Pipelining needs every response the moment it finishes, so this module
drives verl's own ``AgentLoopWorker`` per request instead (``agent_worker.PipeAgentLoopWorker``: the same, its
per-request agent-loop object built without Hydra's overhead): the same agent loop,
tokenization, padding and streamed reward (``RewardLoopWorker``) as verl's path,
but each request is admitted by an admission policy (``verl_pipe.frontier``) and
handed back as soon as it is done. When all n responses of a group are in, the
caller's ``on_group`` callback materializes it.

The driver runs an asyncio loop in a background thread, so the trainer's main
thread can train while the rollout continues.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from verl import DataProto

from verl_pipe.frontier import AdmissionPolicy, Request
from verl_pipe.rollout.agent_worker import PipeAgentLoopWorker
from verl_pipe.rollout.client import CURRENT_ADMISSION, AdmissionRoutedClient
from verl_pipe.rollout.completions import Completions
from verl_pipe.rollout.replicas import ReplicaLostError, is_replica_death  # noqa: F401 (re-exported)
from verl_pipe.timeline import StepTimeline

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


@dataclass
class StepResult:
    responses: int = 0
    failed_attempts: int = 0
    aborted: int = 0
    groups_done: int = 0
    untrainable: int = 0
    late_groups: int = 0  # completed after the batch was full: dropped, never trained
    dropped_groups: int = 0  # a request failed past max_retries (on_request_failure=drop_group)
    replica_failures: int = 0  # replicas found dead during the step
    replica_restarts: int = 0
    requeued_requests: int = 0  # in flight on a dead replica, resubmitted
    recovery_s: list[float] = field(default_factory=list)  # death noticed -> replica back, per restart
    elapsed_s: float = 0.0
    errors: list[str] = field(default_factory=list)


class StreamingRollout:
    def __init__(self, config, servers: list[tuple[str, Any]], reward_loop_worker_handles=None,
                 load_balancer_handle=None, supervisor=None):
        self.config = config
        self.supervisor = supervisor  # ReplicaSupervisor (restarts or retires dead replicas), or None
        self._tasks: dict = {}  # the running step's request tasks
        self.client = AdmissionRoutedClient(config, load_balancer_handle=load_balancer_handle, servers=servers)
        self.worker = PipeAgentLoopWorker(config, self.client, None, reward_loop_worker_handles)
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
            for task in self._tasks:
                task.cancel()
            if self._tasks:
                await asyncio.gather(*self._tasks, return_exceptions=True)
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
        policy, timeline = req.policy, req.timeline
        result = StepResult()
        start = time.perf_counter()
        tasks: dict[asyncio.Task, tuple[Any, int]] = {}
        self._tasks = tasks  # for the clean-up of a failed step
        restarting: dict[asyncio.Task, tuple[int, float]] = {}  # restart task -> (replica, when death noticed)
        completions = Completions()  # every task above and in `restarting` is added here when created
        attempts: dict[Request, int] = {}
        outputs: dict[int, dict[int, Any]] = {}

        def rid(r: Request) -> str:
            return f"s{req.step}-g{r.group}-r{r.index}"

        def admit() -> None:
            for adm in policy.admit():
                n_try = attempts.get(adm.request, 0)
                timeline.request_submitted(rid(adm.request), adm.request.group, replica=adm.replica)
                task = completions.add(asyncio.create_task(self._one(req, adm, n_try)))
                tasks[task] = (adm, n_try)

        def cancel(pred) -> None:
            for task, (adm, _) in list(tasks.items()):
                if pred(adm):
                    task.cancel()
                    del tasks[task]
                    timeline.request_aborted(rid(adm.request), adm.request.group)

        admit()
        while (tasks or restarting) and not policy.all_done:
            done = await completions.wait()
            for task in done:
                if task in restarting:
                    self._replica_back(task, restarting.pop(task), policy, result)
                    continue
                if task not in tasks:  # cancelled in this wake-up (its replica died or its group was dropped)
                    continue
                adm, n_try = tasks.pop(task)
                r = adm.request
                try:
                    out = task.result()
                except Exception as e:
                    if is_replica_death(e):
                        if adm.replica in policy.replicas:  # the first of its requests to notice
                            restart = await self._replica_died(req, adm.replica, e, policy, result)
                            for t in restart:
                                completions.add(t)
                            restarting.update(restart)
                            cancel(lambda a, dead=adm.replica: a.replica == dead)
                        continue  # not the request's fault: no retry is used up
                    # A failed or timed-out request: retry, then give up on it (fail the step or drop its group).
                    result.failed_attempts += 1
                    attempts[r] = n_try + 1
                    msg = f"request {rid(r)} failed (attempt {n_try + 1}): {_brief(e)}"
                    logger.warning(msg)
                    if n_try + 1 <= req.max_retries:
                        policy.on_request_failed(r, adm.replica)
                        continue
                    result.errors.append(msg)
                    if req.on_request_failure != "drop_group":
                        raise RuntimeError(f"{msg}; giving up after rolloutpipe.fault.max_request_retries="
                                           f"{req.max_retries} (rolloutpipe.fault.on_request_failure=fail)") from e
                    logger.warning("dropping group %d of step %d: its next group takes its place", r.group, req.step)
                    closed = set(policy.drop_group(r.group))
                    cancel(lambda a, closed=closed: a.request in closed)
                    outputs.pop(r.group, None)
                    timeline.group_done(r.group, False)
                    result.dropped_groups += 1
                    continue
                if not policy.on_response_done(r, adm.replica):
                    continue  # stale: its request was resubmitted elsewhere or closed
                n_tokens = int(out.response_mask.sum().item())
                timeline.response_done(rid(r), r.group, n_tokens)
                result.responses += 1
                outputs.setdefault(r.group, {})[r.index] = out
                if len(outputs[r.group]) == req.n:
                    group_outputs = [outputs[r.group][i] for i in range(req.n)]
                    del outputs[r.group]
                    if policy.batch_full:  # completed in the same wake-up as the batch's last group
                        timeline.group_done(r.group, False)
                        policy.on_group_done(r.group, False)
                        result.late_groups += 1
                        continue
                    gen_out = self.worker._postprocess(group_outputs, validate=False)
                    trainable = req.on_group(r.group, gen_out)
                    timeline.group_done(r.group, trainable)
                    policy.on_group_done(r.group, trainable)
                    result.groups_done += 1
                    result.untrainable += 0 if trainable else 1
            if policy.batch_full:
                await self._abort(policy, tasks, timeline, rid, result)
                break
            admit()
        if restarting:  # the batch filled on the other replicas: the restart still finishes, for the next step
            for task, info in list(restarting.items()):
                await asyncio.wait([task])
                self._replica_back(task, info, policy, result)
        result.elapsed_s = time.perf_counter() - start
        return result

    async def _replica_died(self, req: StepRequest, replica: int, exc: BaseException, policy, result) -> dict:
        """Takes the replica out of admission (its in-flight requests go back to pending, to the other
        replicas or to the restarted one) and starts its restart, or retires it; returns {restart task:
        (replica, t)} (empty when it is not restarted)."""
        result.replica_failures += 1
        logger.error("step %d: rollout replica %d died (%s: %s)", req.step, replica, type(exc).__name__, _brief(exc))
        if self.supervisor is None or not self.supervisor.restart_enabled:
            if len(policy.replicas) == 1:
                raise ReplicaLostError(
                    f"step {req.step}: rollout replica {replica} died and no replica is left "
                    f"(rolloutpipe.fault.replica_restart=false): {_brief(exc)}") from exc
            result.requeued_requests += len(policy.remove_replica(replica))
            if self.supervisor is not None:
                await asyncio.to_thread(self.supervisor.retire, replica)
            return {}
        result.requeued_requests += len(policy.remove_replica(replica, allow_none_left=True))
        task = asyncio.create_task(asyncio.to_thread(self.supervisor.restart, replica, req.weight_version))
        return {task: (replica, time.perf_counter())}

    def _replica_back(self, task: asyncio.Task, info: tuple[int, float], policy, result) -> None:
        replica, t_dead = info
        try:
            task.result()
        except Exception as e:
            if not policy.replicas:
                raise ReplicaLostError(f"rollout replica {replica} died and could not be restarted "
                                       f"({type(e).__name__}: {e}); no replica is left") from e
            logger.error("rollout replica %d could not be restarted (%s); going on without it", replica, e)
            return
        result.replica_restarts += 1
        result.recovery_s.append(time.perf_counter() - t_dead)
        policy.add_replica(replica)

    async def _abort(self, policy, tasks, timeline, rid, result) -> None:
        """The batch is full: cancel what is left of this step (never carried into the next).

        Our tasks stop waiting now; the requests still running inside vLLM are aborted by the
        weight sync that ends the step (verl's CheckpointEngineManager aborts every replica's
        in-flight requests before loading new weights), so none of them outlives the step.
        """
        for task, (adm, _) in list(tasks.items()):
            task.cancel()
            timeline.request_aborted(rid(adm.request), adm.request.group)
            result.aborted += 1
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        tasks.clear()


def _brief(exc: BaseException) -> str:
    """One line for an error; a Ray task error's text is the remote traceback, its last line the error."""
    lines = [ln for ln in str(exc).splitlines() if ln.strip()]
    return f"{type(exc).__name__}: {lines[-1].strip() if lines else ''}"


def group_rows(gen_batch: DataProto, group: int) -> DataProto:
    """The prompt row of one group, as a 1-row DataProto."""
    return gen_batch.select_idxs(np.array([group]))
