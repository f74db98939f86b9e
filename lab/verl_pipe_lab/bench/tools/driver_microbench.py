"""The rollout driver's own per-request and per-group costs, without Ray or vLLM: a microbenchmark.

    .venv/bin/python -m verl_pipe_lab.bench driver_microbench [--groups 32] [--n 8] [--slots 256] [--window adaptive]
        [--repeats 5] [--materialize] [--verl-agent-loop [--tokenizer DIR]] [--profile]

The driver runs, per request: the admission policy (verl_pipe/core/frontier.py), the step's rollout core
(verl_pipe/core/rollout_core.py: every decision about a request or a group), the step's timeline
(verl_pipe/core/timeline.py), an asyncio task and a wake-up (verl_pipe/rollout/stream.py's ``_StepRun``, which carries
the core's actions out, and ``StreamingRollout._one``, which builds the request's arguments); per group: the
materialization (verl_pipe/rollout/materialize.py: verl's DataProto repeat + union, reward extraction, GRPO advantages)
and the trainer's queue (verl_pipe/core/group_queue.py). The layers are timed one on top of the other, in a random
completion order (the same for every layer):

- ``policy``: the policy's calls alone, as the core makes them;
- ``policy + core``: the same policy driven through ``RolloutCore``, its actions handled as ``_StepRun`` handles them;
- ``+ timeline``: and the step's timeline records, as ``_StepRun`` writes them;
- ``driver (Completions)``: the real driver, ``StreamingRollout._run_step`` (``_StepRun``, ``_one``) unchanged, over
  a fake agent loop that awaits a future a fake engine resolves in a random order, one or a few per wake-up, and an
  ``on_group`` that puts the group into a ``GroupQueue``;
- ``driver (asyncio.wait)``: the same, woken by ``asyncio.wait`` over the tasks in flight (the driver's wake-up
  before ``rollout/completions.py``), for the comparison.

So only the driver's bookkeeping is timed (verl's agent loop, tokenization, HTTP and reward workers are not: they
need the live stack; ``--verl-agent-loop`` times the parts of verl's per-request work that run without a server).
Reports microseconds per request for each layer and per group for the materialization; ``--profile`` prints
cProfile's top functions of the real driver's step.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import pstats
import random
import time
from types import SimpleNamespace

import numpy as np

from verl_pipe.core.frontier import FrontierPolicy, resolve_window
from verl_pipe.core.group_queue import Group, GroupQueue
from verl_pipe.core.rollout_core import Cancel, GroupEnded, HandOver, RolloutCore, Submit, Take
from verl_pipe.core.timeline import StepTimeline
from verl_pipe.rollout import stream  # imports verl (and ray, not started): outside every timing
from verl_pipe.rollout.agent_worker import PipeAgentLoopWorker


def make_policy(a) -> FrontierPolicy:
    window = resolve_window(None if a.window == "null" else int(a.window) if a.window.isdigit() else a.window,
                            a.unit, a.n, a.slots)
    return FrontierPolicy(num_groups=a.groups, n=a.n, groups_per_unit=a.unit, target_groups=a.groups,
                          replicas=list(range(a.replicas)), window=window)


def _random_order(inflight: list, rng: random.Random):
    """Takes the requests in flight in a random order (O(1) per take); the caller may append admitted ones."""
    while inflight:
        i = rng.randrange(len(inflight))
        req = inflight[i]
        inflight[i] = inflight[-1]
        inflight.pop()
        yield req


def policy_only(a, rng: random.Random, peak: list | None = None) -> None:
    """The admission policy's calls for one step, as RolloutCore makes them, completions in a random order.
    ``peak``: a list the most requests ever in flight is appended to (an untimed run)."""
    p = make_policy(a)
    inflight = [(adm.request, adm.replica) for adm in p.admit()]
    most = len(inflight)
    done = [0] * a.groups
    for req, replica in _random_order(inflight, rng):
        p.on_response_done(req, replica)
        done[req.group] += 1
        if done[req.group] == a.n:
            p.on_group_done(req.group, True)
        inflight += [(adm.request, adm.replica) for adm in p.admit()]
        if peak is not None:
            most = max(most, len(inflight))
    if peak is not None:
        peak.append(most)


def core_loop(a, rng: random.Random, timeline: bool = False) -> None:
    """The policy driven through the step's RolloutCore, its actions handled as stream._StepRun handles them (minus
    the asyncio tasks): Submit, Take, HandOver (the group trainable), GroupEnded, Cancel once the batch is full.
    ``timeline``: also the timeline records _StepRun writes for each."""
    core = RolloutCore(make_policy(a))
    tl = StepTimeline(0, a.unit) if timeline else None
    inflight: list = []

    def rid(r) -> str:
        return f"s0-g{r.group}-r{r.index}"

    def do(actions) -> None:
        for act in actions:
            if isinstance(act, Submit):
                adm = act.admission
                if tl is not None:
                    tl.request_submitted(rid(adm.request), adm.request.group, replica=adm.replica)
                inflight.append((adm.request, adm.replica))
            elif isinstance(act, Take):
                if tl is not None:
                    tl.response_done(rid(act.request), act.request.group, 10)
            elif isinstance(act, HandOver):
                do(core.handed_over(act.group, True))
            elif isinstance(act, GroupEnded):
                if tl is not None:
                    tl.group_done(act.group, act.trainable)
            elif isinstance(act, Cancel) and tl is not None:
                for q in act.requests:
                    tl.request_aborted(rid(q), q.group)

    do(core.admit())
    for req, replica in _random_order(inflight, rng):
        do(core.response_done(req, replica))
        if core.batch_full:
            do(core.close())
            break
        do(core.admit())


# ---------------------------------------------------------------------------------------------- the real driver


class _Output:
    """An agent-loop output as far as the driver reads it: ``response_mask.sum().item()``."""

    def __init__(self, tokens: int):
        self.response_mask = self
        self._tokens = tokens
        self.reward_score, self.extra_fields = None, {}  # verl's: scored later (the driver reads and pops these)

    def sum(self):
        return self

    def item(self) -> int:
        return self._tokens


class _WaitAll:
    """``rollout.completions.Completions``' interface over ``asyncio.wait(FIRST_COMPLETED)`` on every task added and
    not yet returned: the driver's wake-up before Completions (O(in flight) per wake-up)."""

    def __init__(self):
        self._pending: set = set()

    def add(self, task):
        self._pending.add(task)
        return task

    async def wait(self) -> set:
        done, self._pending = await asyncio.wait(self._pending, return_when=asyncio.FIRST_COMPLETED)
        return done


async def real_driver(a, rng: random.Random, materialize=None, completions: bool = True) -> None:
    """One step of stream.StreamingRollout._run_step (``_StepRun``, ``_one``: the code the trainer runs), its agent
    loop replaced by a future that a fake engine resolves at random, one to ``a.burst`` per event-loop pass.
    ``completions``: wake up through rollout.completions.Completions as stream.py does; False: through
    asyncio.wait over the tasks in flight, as it did before."""
    loop = asyncio.get_running_loop()
    unresolved: list[asyncio.Future] = []  # the fake engine's in-flight requests (its own cost kept O(1) each)

    async def agent_loop(sampling_params, trajectory, trace=False, **kwargs):
        fut = loop.create_future()
        unresolved.append(fut)
        return await fut

    rollout = object.__new__(stream.StreamingRollout)  # what _run_step and _StepRun use, nothing connected
    rollout.supervisor, rollout._tasks, rollout.default_agent = None, {}, "single_turn_agent"
    rollout.sampling_params = dict(temperature=1.0, top_p=1.0, top_k=-1, repetition_penalty=1.0, logprobs=False)
    # verl's worker without its connections: the class's settings are the real ones (score_by_group, the reward's
    # bound, ...), its agent loop and post-processing stand-ins; its fake agent loop scores nothing
    rollout.worker = worker = object.__new__(PipeAgentLoopWorker)
    worker._run_agent_loop, worker._postprocess = agent_loop, lambda outputs, validate: outputs
    queue = GroupQueue(weight_version=0)

    def on_group(g: int, gen_out) -> bool:
        queue.put(Group(g, materialize(g) if materialize else gen_out, 0, time.perf_counter()))
        return True

    gen_batch = SimpleNamespace(non_tensor_batch={  # a prompt row's fields, named as verl's dataset names them
        "raw_prompt": np.array([f"What is ({g} + 3) % 10 * 2?" for g in range(a.groups)], dtype=object),
        "data_source": np.array(["digit_math"] * a.groups, dtype=object),
        "reward_model": np.array([{"ground_truth": "1"}] * a.groups, dtype=object),
        "extra_info": np.array([{"index": g} for g in range(a.groups)], dtype=object),
        "index": np.arange(a.groups), "uid": np.array([f"uid-{g}" for g in range(a.groups)], dtype=object)})
    req = stream.StepRequest(step=0, gen_batch=gen_batch, n=a.n, policy=make_policy(a),
                             timeline=StepTimeline(0, a.unit), on_group=on_group)
    stop = False

    async def engine():
        while not stop:
            for _ in range(min(len(unresolved), rng.randint(1, a.burst))):
                i = rng.randrange(len(unresolved))
                unresolved[i], unresolved[-1] = unresolved[-1], unresolved[i]
                fut = unresolved.pop()
                if not fut.done():  # its task was cancelled once the batch was full
                    fut.set_result(_Output(10))
            await asyncio.sleep(0)

    eng = asyncio.create_task(engine())
    if completions:
        result = await rollout._run_step(req)
    else:
        run = stream._StepRun(rollout, req)
        run.completions = _WaitAll()
        rollout._tasks = run.tasks
        result = await run.run()
    stop = True
    await eng
    assert result.groups_done == a.groups and len(queue) == a.groups, (result, len(queue))


# ---------------------------------------------------------------------------------------------- materialize


def materializer(n: int, prompt_len: int = 32, response_len: int = 64):
    """verl_pipe.rollout.materialize.materialize_group on a synthetic group shaped like the agent loop's output
    (left-padded prompts, right-padded responses, a reward score at each response's last token)."""
    import torch
    from omegaconf import OmegaConf

    from verl import DataProto
    from verl_pipe.rollout.materialize import materialize_group

    config = OmegaConf.create({"algorithm": {"adv_estimator": "grpo", "gamma": 1.0, "lam": 1.0,
                                             "norm_adv_by_std_in_grpo": True}})
    total = prompt_len + response_len

    def prompt_row(g: int) -> DataProto:
        return DataProto.from_dict(
            tensors={"dummy": torch.zeros(1, 1)},
            non_tensors={"uid": np.array([f"uid-{g}"], dtype=object), "data_source": np.array(["x"], dtype=object),
                         "reward_model": np.array([{"ground_truth": "1"}], dtype=object)})

    def gen_out(g: int) -> DataProto:
        lens = torch.randint(1, response_len + 1, (n,))
        response_mask = (torch.arange(response_len)[None, :] < lens[:, None]).long()
        rm = torch.zeros(n, response_len)
        rm[torch.arange(n), lens - 1] = torch.rand(n)
        attention = torch.cat([torch.ones(n, prompt_len, dtype=torch.long), response_mask], dim=1)
        return DataProto.from_dict(tensors={
            "prompts": torch.randint(0, 100, (n, prompt_len)), "responses": torch.randint(0, 100, (n, response_len)),
            "response_mask": response_mask, "input_ids": torch.randint(0, 100, (n, total)),
            "attention_mask": attention, "position_ids": torch.arange(total).repeat(n, 1), "rm_scores": rm},
            meta_info={"metrics": [{}] * n})

    def materialize(g: int):
        return materialize_group(prompt_row(g), gen_out(g), config)

    def only_inputs(g: int):  # the synthetic inputs alone, to subtract
        return prompt_row(g), gen_out(g)

    return materialize, only_inputs


# ---------------------------------------------------------------------------------------------- verl's agent loop


def verl_per_request(tokenizer_path: str | None, repeats: int) -> list[tuple[str, float]]:
    """What verl's AgentLoopWorker._run_agent_loop does per request in the driver around generation, as far as it
    runs without a server: building the registered agent loop, as verl 0.9.1 does (hydra.utils.instantiate with the
    worker's kwargs, a new object per request) and as rollout.agent_worker.PipeAgentLoopWorker does (the class
    resolved once, called with the same kwargs), and, with a tokenizer, the three tokenizer.pad calls of
    _agent_loop_postprocess. Seconds per request, best of ``repeats``."""
    import hydra
    from omegaconf import OmegaConf

    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
    from verl_pipe.rollout.agent_worker import PipeAgentLoopWorker

    class AgentLoop:
        def __init__(self, **kwargs):
            self.kwargs = kwargs

    class Dataset:
        pass

    globals()["_MicrobenchAgentLoop"] = AgentLoop
    entry = {"_target_": f"{__name__}._MicrobenchAgentLoop"}  # what verl's @register stores
    w = object.__new__(PipeAgentLoopWorker)  # the attributes verl's __init__ sets, nothing connected
    w.config = OmegaConf.create({"data": {"max_prompt_length": 64}, "actor_rollout_ref": {"rollout": {"n": 8}}})
    w.llm_client, w.processor, w.hf_model_type, w.dataset_cls, w.tools = object(), None, "qwen3", Dataset, []
    w.tokenizer = object()
    if tokenizer_path:
        from transformers import AutoTokenizer

        w.tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)

    def verl_way():
        return hydra.utils.instantiate(
            config=entry, trainer_config=DictConfigWrap(config=w.config), server_manager=w.llm_client,
            tokenizer=w.tokenizer, processor=w.processor, hf_model_type=w.hf_model_type, dataset_cls=w.dataset_cls,
            data_config=DictConfigWrap(w.config.data), tools=ToolListWrap(w.tools))

    k = 200
    out = [("agent loop built: hydra (verl)", timed(lambda: [verl_way() for _ in range(k)], repeats) / k),
           ("agent loop built: PipeAgentLoopWorker", timed(lambda: [w._agent_loop(entry) for _ in range(k)],
                                                           repeats) / k)]
    if tokenizer_path:
        tok = w.tokenizer

        def pads():
            for side, length, tokens, mask in (("left", 64, list(range(5, 40)), True),
                                               ("right", 512, list(range(5, 85)), True),
                                               ("right", 512, [1] * 80, False)):
                tok.padding_side = side
                tok.pad({"input_ids": tokens}, padding="max_length", max_length=length, return_tensors="pt",
                        return_attention_mask=mask)

        out.append(("3 x tokenizer.pad (verl)", timed(lambda: [pads() for _ in range(k)], repeats) / k))
    return out


# ---------------------------------------------------------------------------------------------- CLI


def timed(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m verl_pipe_lab.bench driver_microbench",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--groups", type=int, default=32)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--unit", type=int, default=4, help="groups per training unit")
    ap.add_argument("--replicas", type=int, default=1)
    ap.add_argument("--slots", type=int, default=256, help="max_num_seqs")
    ap.add_argument("--window", default="adaptive", help="rolloutpipe.fgd.window: adaptive, auto, null or an int")
    ap.add_argument("--burst", type=int, default=4, help="at most this many completions per engine wake-up")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--materialize", action="store_true", help="also time materialize_group per group (imports verl)")
    ap.add_argument("--profile", action="store_true", help="cProfile of the real driver's step")
    ap.add_argument("--verl-agent-loop", action="store_true",
                    help="also time verl's per-request agent-loop construction (imports verl)")
    ap.add_argument("--tokenizer", help="a tokenizer folder, for verl's per-request padding (e.g. the tiny assets')")
    a = ap.parse_args(argv)
    reqs = a.groups * a.n
    peak: list[int] = []
    policy_only(a, random.Random(0), peak)
    print(f"{a.groups} groups x {a.n} = {reqs} requests, {a.replicas} replica(s), {a.slots} slots, window "
          f"{a.window} ({peak[0]} in flight at most); best of {a.repeats}")
    rng = lambda: random.Random(0)  # noqa: E731 - every layer sees the same completion order
    for name, fn in (("policy", lambda: policy_only(a, rng())),
                     ("policy + core", lambda: core_loop(a, rng())),
                     ("+ timeline", lambda: core_loop(a, rng(), timeline=True)),
                     ("driver (asyncio.wait)", lambda: asyncio.run(real_driver(a, rng(), completions=False))),
                     ("driver (Completions)", lambda: asyncio.run(real_driver(a, rng())))):
        print(f"  {name:<24} {1e6 * timed(fn, a.repeats) / reqs:8.1f} us per request")
    if a.materialize:
        materialize, inputs = materializer(a.n)
        k = a.groups
        full = timed(lambda: [materialize(g) for g in range(k)], a.repeats)
        base = timed(lambda: [inputs(g) for g in range(k)], a.repeats)
        print(f"  {'materialize_group':<24} {1e6 * (full - base) / k:8.1f} us per group (inputs' construction "
              f"{1e6 * base / k:.1f} us subtracted)")
    if a.verl_agent_loop:
        for name, sec in verl_per_request(a.tokenizer, a.repeats):
            print(f"  {name:<38} {1e6 * sec:8.1f} us per request")
    if a.profile:
        pr = cProfile.Profile()
        pr.enable()
        asyncio.run(real_driver(a, random.Random(0)))
        pr.disable()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(18)
        print(s.getvalue())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
