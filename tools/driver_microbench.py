"""The rollout driver's own per-request and per-group costs, without Ray or vLLM: a microbenchmark.

    .venv/bin/python tools/driver_microbench.py [--groups 32] [--n 8] [--slots 256] [--window adaptive]
        [--repeats 5] [--materialize] [--verl-agent-loop [--tokenizer DIR]] [--profile]

The driver (verl_pipe/rollout/stream.py) runs, per request: the admission policy (verl_pipe/frontier.py), the step's
timeline (verl_pipe/timeline.py), an asyncio task and ``asyncio.wait`` over the tasks in flight; per group: the
policy's group completion, the materialization (verl_pipe/rollout/materialize.py: verl's DataProto repeat + union,
reward extraction, GRPO advantages) and the trainer's queue (verl_pipe/group_queue.py). Here the same loop runs
against a fake engine that finishes the in-flight requests in a random order, one or a few per wake-up, so only
the driver's bookkeeping is timed (the agent loop, tokenization, HTTP and reward workers are not: they need the
live stack). Reports microseconds per request for each layer (policy alone; + timeline; the whole async loop, woken
by asyncio.wait as the driver was and by rollout.completions as it is) and per group for the materialization;
``--profile`` prints cProfile's top functions of the async loop.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import pstats
import random
import time

from verl_pipe.frontier import FrontierPolicy, Request, resolve_window
from verl_pipe.group_queue import Group, GroupQueue
from verl_pipe.rollout.completions import Completions
from verl_pipe.timeline import StepTimeline


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


def policy_only(a, rng: random.Random) -> None:
    """The admission policy's calls for one step, completions in a random order."""
    p = make_policy(a)
    inflight = [adm.request for adm in p.admit()]
    done = [0] * a.groups
    for req in _random_order(inflight, rng):
        p.on_response_done(req)
        done[req.group] += 1
        if done[req.group] == a.n:
            p.on_group_done(req.group, True)
        inflight += [adm.request for adm in p.admit()]


def policy_and_timeline(a, rng: random.Random) -> None:
    p = make_policy(a)
    tl = StepTimeline(0, a.unit)
    rid = {}

    def admit():
        out = []
        for adm in p.admit():
            r = adm.request
            rid[r] = f"s0-g{r.group}-r{r.index}"
            tl.request_submitted(rid[r], r.group, replica=adm.replica)
            out.append(r)
        return out

    inflight = admit()
    done = [0] * a.groups
    for req in _random_order(inflight, rng):
        p.on_response_done(req)
        tl.response_done(rid[req], req.group, 10)
        done[req.group] += 1
        if done[req.group] == a.n:
            tl.group_done(req.group, True)
            p.on_group_done(req.group, True)
        inflight += admit()


async def async_driver(a, rng: random.Random, materialize=None, completions: bool = True) -> None:
    """stream.py's _run_step loop, its engine replaced by futures this coroutine resolves at random.
    ``completions``: wake up through rollout.completions.Completions as stream.py does; False: through
    asyncio.wait over the tasks in flight, as it did before."""
    p = make_policy(a)
    cq = Completions()
    tl = StepTimeline(0, a.unit)
    queue = GroupQueue(weight_version=0)
    loop = asyncio.get_running_loop()
    futures: dict[Request, asyncio.Future] = {}
    unresolved: list[asyncio.Future] = []  # the fake engine's in-flight requests (its own cost kept O(1) each)
    tasks: dict[asyncio.Task, object] = {}
    outputs: dict[int, dict[int, object]] = {}

    def rid(r: Request) -> str:
        return f"s0-g{r.group}-r{r.index}"

    async def one(adm):
        return await futures[adm.request]

    def admit() -> None:
        for adm in p.admit():
            tl.request_submitted(rid(adm.request), adm.request.group, replica=adm.replica)
            futures[adm.request] = fut = loop.create_future()
            unresolved.append(fut)
            task = asyncio.create_task(one(adm))
            tasks[cq.add(task) if completions else task] = adm

    async def engine():
        while not p.all_done:
            for _ in range(min(len(unresolved), rng.randint(1, a.burst))):
                i = rng.randrange(len(unresolved))
                unresolved[i], unresolved[-1] = unresolved[-1], unresolved[i]
                unresolved.pop().set_result(10)
            await asyncio.sleep(0)

    admit()
    eng = asyncio.create_task(engine())
    while tasks and not p.all_done:
        if completions:
            done = await cq.wait()
        else:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            adm = tasks.pop(task)
            r = adm.request
            out = task.result()
            if not p.on_response_done(r, adm.replica):
                continue
            tl.response_done(rid(r), r.group, int(out))
            outputs.setdefault(r.group, {})[r.index] = out
            if len(outputs[r.group]) == a.n:
                del outputs[r.group]
                data = materialize(r.group) if materialize else None
                queue.put(Group(r.group, data, 0, time.perf_counter()))
                tl.group_done(r.group, True)
                p.on_group_done(r.group, True)
        admit()
    await eng


# ---------------------------------------------------------------------------------------------- materialize


def materializer(n: int, prompt_len: int = 32, response_len: int = 64):
    """verl_pipe.rollout.materialize.materialize_group on a synthetic group shaped like the agent loop's output
    (left-padded prompts, right-padded responses, a reward score at each response's last token)."""
    import numpy as np
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
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--groups", type=int, default=32)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--unit", type=int, default=4, help="groups per training unit")
    ap.add_argument("--replicas", type=int, default=1)
    ap.add_argument("--slots", type=int, default=256, help="max_num_seqs")
    ap.add_argument("--window", default="adaptive", help="rolloutpipe.fgd.window: adaptive, auto, null or an int")
    ap.add_argument("--burst", type=int, default=4, help="at most this many completions per engine wake-up")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--materialize", action="store_true", help="also time materialize_group per group (imports verl)")
    ap.add_argument("--profile", action="store_true", help="cProfile of the async loop")
    ap.add_argument("--verl-agent-loop", action="store_true",
                    help="also time verl's per-request agent-loop construction (imports verl)")
    ap.add_argument("--tokenizer", help="a tokenizer folder, for verl's per-request padding (e.g. the tiny assets')")
    a = ap.parse_args(argv)
    reqs = a.groups * a.n
    print(f"{a.groups} groups x {a.n} = {reqs} requests, {a.replicas} replica(s), {a.slots} slots, window "
          f"{a.window}; best of {a.repeats}")
    for name, fn in (("policy", lambda: policy_only(a, random.Random(0))),
                     ("policy + timeline", lambda: policy_and_timeline(a, random.Random(0))),
                     ("loop, asyncio.wait", lambda: asyncio.run(async_driver(a, random.Random(0), completions=False))),
                     ("loop, Completions", lambda: asyncio.run(async_driver(a, random.Random(0))))):
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
        asyncio.run(async_driver(a, random.Random(0)))
        pr.disable()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(18)
        print(s.getvalue())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
