"""rollout.agent_worker.PipeAgentLoopWorker: verl's per-request agent loop, built like Hydra builds it, without
Hydra where Hydra only calls the class; pure (no Ray, no server)."""

import asyncio
import hashlib
import inspect

import hydra
import pytest
import torch
from omegaconf import OmegaConf

from verl.experimental.agent_loop.agent_loop import AgentLoopWorker, DictConfigWrap, ToolListWrap, _agent_loop_registry
from verl_pipe.rollout.agent_worker import VERL_RUN_AGENT_LOOP_SHA256, PipeAgentLoopWorker


class RecordingLoop:
    """An agent loop that keeps what it was built with and echoes its run's arguments."""

    def __init__(self, **kwargs):
        self.kwargs = kwargs

    async def run(self, sampling_params, **kwargs):
        return {"sampling_params": sampling_params, "kwargs": kwargs, "built_with": self.kwargs}


class Dataset:  # stands for verl's RLHFDataset class
    pass


def worker() -> PipeAgentLoopWorker:
    w = object.__new__(PipeAgentLoopWorker)  # its attributes as verl's __init__ sets them, nothing connected
    w.config = OmegaConf.create({"data": {"max_prompt_length": 8}})
    w.llm_client, w.tokenizer, w.processor = object(), object(), None
    w.hf_model_type, w.dataset_cls, w.tools = "qwen3", Dataset, ["a-tool"]

    async def postprocess(output, validate, **kwargs):
        return dict(output, validate=validate)

    w._agent_loop_postprocess = postprocess
    return w


@pytest.fixture
def registered():
    name = "verl_pipe_test_recording_loop"
    _agent_loop_registry[name] = {"_target_": f"{__name__}.RecordingLoop"}  # what verl's @register stores
    yield name
    del _agent_loop_registry[name]


def _same_kwargs(a: dict, b: dict) -> None:
    assert set(a) == set(b)
    for k in a:
        if isinstance(a[k], (DictConfigWrap, ToolListWrap)):
            assert type(a[k]) is type(b[k]) and vars(a[k]).keys() == vars(b[k]).keys()
            assert all(x is y for x, y in zip(vars(a[k]).values(), vars(b[k]).values())), k
        else:
            assert a[k] is b[k], k


def test_a_registered_loop_is_built_with_what_hydra_would_pass_it(registered):
    w = worker()
    fast = w._agent_loop(_agent_loop_registry[registered])
    kwargs = dict(trainer_config=DictConfigWrap(config=w.config), server_manager=w.llm_client, tokenizer=w.tokenizer,
                  processor=w.processor, hf_model_type=w.hf_model_type, dataset_cls=w.dataset_cls,
                  data_config=DictConfigWrap(w.config.data), tools=ToolListWrap(w.tools))
    slow = hydra.utils.instantiate(config=_agent_loop_registry[registered], **kwargs)  # verl's way
    assert type(fast) is type(slow) is RecordingLoop
    _same_kwargs(fast.kwargs, slow.kwargs)


def test_a_configured_loop_still_goes_through_hydra(monkeypatch):
    calls = []
    monkeypatch.setattr(hydra.utils, "instantiate", lambda config, **kw: calls.append(config) or "built")
    cfg = OmegaConf.create({"name": "x", "_target_": f"{__name__}.RecordingLoop", "max_turns": 3})
    assert worker()._agent_loop(cfg) == "built" and calls == [cfg]
    params = {"_target_": f"{__name__}.RecordingLoop", "max_turns": 3}
    assert worker()._agent_loop(params) == "built" and calls[-1] == params


def test_run_agent_loop_runs_the_loop_and_postprocesses(registered):
    out = asyncio.run(worker()._run_agent_loop({"temperature": 1.0}, {"step": 1, "sample_index": 0, "rollout_n": 2,
                                                                       "validate": False},
                                               agent_name=registered, trace=False, raw_prompt=["p"], priority=3))
    from vllm.sampling_params import RequestOutputKind

    # vLLM detokenizes nothing and sends the final output only
    assert out["sampling_params"] == {"temperature": 1.0, "detokenize": False,
                                      "output_kind": RequestOutputKind.FINAL_ONLY}
    assert out["kwargs"] == {"raw_prompt": ["p"], "priority": 3} and out["validate"] is False
    assert out["built_with"]["hf_model_type"] == "qwen3"
    with pytest.raises(AssertionError, match="not registered"):
        asyncio.run(worker()._run_agent_loop({}, {"step": 1, "sample_index": 0, "rollout_n": 0, "validate": False},
                                             agent_name="no-such-loop", trace=False))


def test_the_copied_method_matches_the_installed_verl():
    """_run_agent_loop is verl's method with two lines changed: a verl whose method differs needs a look."""
    src = inspect.getsource(AgentLoopWorker._run_agent_loop)
    assert hashlib.sha256(src.encode()).hexdigest() == VERL_RUN_AGENT_LOOP_SHA256, (
        "verl's AgentLoopWorker._run_agent_loop changed: compare it with "
        "verl_pipe/rollout/agent_worker.py's copy, then update VERL_RUN_AGENT_LOOP_SHA256")


@pytest.mark.parametrize("tokens", [[5], [7, 8, 9], list(range(3, 19)), list(range(3, 25))])
@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("mask", [True, False])
def test_pad_token_ids_equals_verls_tokenizer_pad(tokens, side, mask):
    """The torch padding gives exactly what verl's tokenizer.pad path gives (values, dtype, shape, keys), also when
    the list is longer than max_length (no truncation), with the project's tokenizer."""
    from transformers import AutoTokenizer

    from verl_pipe.assets import ensure_assets

    tok = AutoTokenizer.from_pretrained(str(ensure_assets().tokenizer_dir))
    assert tok.pad_token_id is not None
    w = worker()
    w.tokenizer = tok
    ours = w._pad_token_ids(tokens, max_length=16, padding_side=side, return_attention_mask=mask)
    theirs = AgentLoopWorker._pad_token_ids(w, tokens, max_length=16, padding_side=side, return_attention_mask=mask)
    assert set(ours) == set(theirs)
    for k in theirs:
        assert ours[k].dtype == theirs[k].dtype and ours[k].shape == theirs[k].shape and torch.equal(ours[k], theirs[k])
    assert tok.padding_side == side


def test_pad_token_ids_without_pad_token_is_verls():
    class NoPad:
        pad_token_id = None

    w = worker()
    w.tokenizer = NoPad()
    empty = w._pad_token_ids([], max_length=4, padding_side="left", return_attention_mask=True)
    assert torch.equal(empty["input_ids"], torch.zeros((1, 4), dtype=torch.long))
    with pytest.raises(AttributeError):  # verl's path: tokenizer.pad, which this stand-in lacks
        w._pad_token_ids([1, 2], max_length=4, padding_side="left", return_attention_mask=True)


def test_detokenization_off_unless_chosen_or_needed():
    from verl_pipe.rollout.agent_worker import without_detokenization

    sp = {"temperature": 1.0, "max_tokens": 5}
    assert without_detokenization(sp) == {"temperature": 1.0, "max_tokens": 5, "detokenize": False}
    assert sp == {"temperature": 1.0, "max_tokens": 5}  # the caller's dict (maybe shared by a batch) untouched
    assert without_detokenization({"detokenize": True}) == {"detokenize": True}
    assert "detokenize" not in without_detokenization({"stop": ["\n\n"]})
    assert without_detokenization({"stop": []}) == {"stop": [], "detokenize": False}


def test_final_output_only_unless_chosen():
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    from verl_pipe.rollout.agent_worker import final_output_only, rollout_sampling_params

    sp = {"temperature": 1.0}
    assert final_output_only(sp) == {"temperature": 1.0, "output_kind": RequestOutputKind.FINAL_ONLY}
    assert sp == {"temperature": 1.0}
    mine = {"output_kind": RequestOutputKind.CUMULATIVE}
    assert final_output_only(mine) == mine
    # what verl's server builds from them: vLLM's own SamplingParams takes both keys
    built = SamplingParams(max_tokens=4, **rollout_sampling_params({"temperature": 1.0, "logprobs": 0}))
    assert built.output_kind == RequestOutputKind.FINAL_ONLY and built.detokenize is False
