"""verl's AgentLoopWorker for the rollout driver, its per-request agent loop built without Hydra where Hydra adds
nothing.

verl 0.9.1 builds a new agent-loop object for every request with ``hydra.utils.instantiate(config=<registry
entry>, **kwargs)``. For an agent loop registered with verl's ``@register`` the entry is just ``{"_target_":
"<module.Class>"}`` and the kwargs are objects verl wraps so that Hydra leaves them alone (``DictConfigWrap``,
``ToolListWrap``); Hydra then only calls the class, after turning the kwargs into an OmegaConf config and back: far
more of the driver's CPU per request than the call, in the process the trainer's loop shares (docs/cpu.md, "The
driver alone, without Ray or vLLM": ``python -m verl_pipe_lab.bench driver_microbench --verl-agent-loop``). Here such
an entry's class is resolved once, as Hydra resolves it (``hydra.utils.get_class``), and called with the same kwargs;
any other entry (one from ``rollout.agent.agent_loop_config_path``, with parameters of its own) still goes through
Hydra. ``_run_agent_loop`` is verl's own method otherwise unchanged, but for the sampling params it hands on (vLLM's
detokenization off, its final output only: ``rollout_sampling_params``); ``VERL_RUN_AGENT_LOOP_SHA256`` pins the
verl source it was copied from, and a test fails when verl's changes. Post-processing pads through torch instead of ``tokenizer.pad``
(``_pad_token_ids``, the same tensors).
"""

from __future__ import annotations

from typing import Any

import hydra
import torch
from verl.experimental.agent_loop.agent_loop import (AgentLoopWorker, DictConfigWrap, ToolListWrap,
                                                     _agent_loop_registry)
from verl.utils.rollout_trace import rollout_trace_attr

from verl_pipe.rollout.group_scores import DEFERRED_ROW, REWARD_ERROR, CaptureHandle, bounded

# sha256 of inspect.getsource(verl 0.9.1's AgentLoopWorker._run_agent_loop)
VERL_RUN_AGENT_LOOP_SHA256 = "32c3d607c5d4c9fa124c9d53a476689b63aeb2662f28c9cc1933fc6ec3e9e989"


class PipeAgentLoopWorker(AgentLoopWorker):
    _classes: dict[str, type] = {}  # "_target_" -> class, resolved once per process
    # rolloutpipe.reward.score_by_group: keep each response's reward row for one call per group
    # (verl_pipe/rollout/group_scores.py); the driver scores the group when it completes
    score_by_group = False
    # The streaming driver's reward failures (group_scores.py): verl's own call bounded by reward_timeout_s (None: no
    # limit) and, with catch_reward_errors, its error kept on the response (REWARD_ERROR) for the driver to decide
    # on (RolloutCore.reward_failed) instead of failing the request. Off: verl's behaviour (its validation workers).
    reward_timeout_s: float | None = None
    catch_reward_errors = False

    async def _compute_score(self, outputs: list, kwargs: dict) -> None:
        """verl's method; with ``score_by_group``, the reward row it builds is kept on the response
        (``DEFERRED_ROW``) instead of being sent: verl's own code builds it, against a ``CaptureHandle`` in place
        of the reward workers' handles (swapped and restored with no await between: nothing else runs meanwhile).
        A trajectory of several outputs (one score for all its rows) is sent as verl sends it, bounded by
        ``reward_timeout_s``; with ``catch_reward_errors`` a failure is kept on the last output (``REWARD_ERROR``)."""
        handles = self.reward_loop_worker_handles
        if not self.score_by_group or handles is None or len(outputs) != 1:
            if not self.catch_reward_errors:
                return await super()._compute_score(outputs, kwargs)
            try:
                await bounded(super()._compute_score(outputs, kwargs), self.reward_timeout_s, "the response's reward")
            except Exception as e:  # noqa: BLE001 -- any reward error is the core's to decide on
                outputs[-1].reward_score = None
                outputs[-1].extra_fields[REWARD_ERROR] = f"{type(e).__name__}: {_last_line(e)}"
            return
        capture = CaptureHandle()
        self.reward_loop_worker_handles = [capture]
        try:
            await super()._compute_score(outputs, kwargs)
        finally:
            self.reward_loop_worker_handles = handles
        if capture.data is not None:
            outputs[-1].extra_fields[DEFERRED_ROW] = capture.data

    def _agent_loop(self, agent_loop_config) -> Any:
        """What ``hydra.utils.instantiate(config=agent_loop_config, **kwargs)`` builds in verl's method."""
        kwargs = dict(trainer_config=DictConfigWrap(config=self.config), server_manager=self.llm_client,
                      tokenizer=self.tokenizer, processor=self.processor, hf_model_type=self.hf_model_type,
                      dataset_cls=self.dataset_cls, data_config=DictConfigWrap(self.config.data),
                      tools=ToolListWrap(self.tools))
        if isinstance(agent_loop_config, dict) and set(agent_loop_config) == {"_target_"}:
            target = agent_loop_config["_target_"]
            cls = self._classes.get(target)
            if cls is None:
                cls = self._classes[target] = hydra.utils.get_class(target)
            return cls(**kwargs)
        return hydra.utils.instantiate(config=agent_loop_config, **kwargs)

    def _pad_token_ids(self, tokens: list[int], *, max_length: int, padding_side: str,
                       return_attention_mask: bool) -> dict[str, torch.Tensor]:
        """What verl's method returns (``tokenizer.pad`` of one flat list to ``(1, max_length)``, pad token id,
        int64, no truncation), built with torch: 3 calls per response in verl's post-processing, each cheaper here
        than through ``tokenizer.pad`` (its BatchEncoding and checks; docs/cpu.md, "The cuts", 2: ``python -m
        verl_pipe_lab.bench pad_bench``). verl's own method stays
        for a tokenizer without a pad token id (tokenizer.pad refuses it) and for empty input."""
        pad_id = getattr(self.tokenizer, "pad_token_id", None)
        if not tokens or pad_id is None:
            return super()._pad_token_ids(tokens, max_length=max_length, padding_side=padding_side,
                                          return_attention_mask=return_attention_mask)
        self.tokenizer.padding_side = padding_side  # as tokenizer.pad leaves it
        ids = torch.tensor(tokens, dtype=torch.long)
        pad = max(0, max_length - len(tokens))
        fill = torch.full((pad,), pad_id, dtype=torch.long)
        left = padding_side == "left"
        out = {"input_ids": torch.cat([fill, ids] if left else [ids, fill]).unsqueeze(0)}
        if return_attention_mask:
            ones, zeros = torch.ones(len(tokens), dtype=torch.long), torch.zeros(pad, dtype=torch.long)
            out["attention_mask"] = torch.cat([zeros, ones] if left else [ones, zeros]).unsqueeze(0)
        return out

    async def _run_agent_loop(self, sampling_params: dict[str, Any], trajectory: dict[str, Any], *, agent_name: str,
                              trace: bool = True, **kwargs):
        with rollout_trace_attr(
            step=trajectory["step"],
            sample_index=trajectory["sample_index"],
            rollout_n=trajectory["rollout_n"],
            validate=trajectory["validate"],
            name="agent_loop",
            trace=trace,
        ):
            assert agent_name in _agent_loop_registry, (
                f"Agent loop {agent_name} not registered, registered agent loops: {_agent_loop_registry.keys()}"
            )
            sampling_params = rollout_sampling_params(sampling_params)
            agent_loop = self._agent_loop(_agent_loop_registry[agent_name])
            output = await agent_loop.run(sampling_params, **kwargs)
            return await self._agent_loop_postprocess(output, trajectory["validate"], **kwargs)


def _last_line(exc: BaseException) -> str:
    """A Ray task error's text is the remote traceback: its last line is the error."""
    lines = [ln for ln in str(exc).splitlines() if ln.strip()]
    return lines[-1].strip() if lines else ""


def without_detokenization(sampling_params: dict[str, Any]) -> dict[str, Any]:
    """The request's sampling params with vLLM's detokenization off, unless they choose (``detokenize``) or need it
    (``stop`` strings, which vLLM matches on the text). verl's vLLM server passes the sampling params through to
    vLLM's ``SamplingParams`` (the seam used here) and keeps only the token ids of vLLM's output, so the
    incremental detokenization of every generated token in the server actor's output processor is work nobody
    reads; token ids, log-probs and the stop on EOS or ``max_tokens`` are the engine's and do not change."""
    if "detokenize" in sampling_params or sampling_params.get("stop"):
        return sampling_params
    return {**sampling_params, "detokenize": False}


def final_output_only(sampling_params: dict[str, Any]) -> dict[str, Any]:
    """The request's sampling params asking vLLM for its final output only (``RequestOutputKind.FINAL_ONLY``), unless
    they choose an ``output_kind``. verl's server loops over vLLM's outputs and keeps only the last one, the whole
    response (seam: verl passes the sampling params through to vLLM's ``SamplingParams``); by default vLLM makes a
    cumulative output for every running request at every engine step and wakes the request's coroutine for it, in
    the server actor's output handler. The final output carries the same token ids and log-probs. A request whose
    task is cancelled is aborted in vLLM at once (``client.CancellingServer``): verl's weight-sync abort waits for
    every request still without an output, which with final outputs only is every request still running."""
    if "output_kind" in sampling_params:
        return sampling_params
    from vllm.sampling_params import RequestOutputKind

    return {**sampling_params, "output_kind": RequestOutputKind.FINAL_ONLY}


def rollout_sampling_params(sampling_params: dict[str, Any]) -> dict[str, Any]:
    """What the rollout sends vLLM: no detokenization, the final output only (same tokens, log-probs, stops)."""
    return final_output_only(without_detokenization(sampling_params))
