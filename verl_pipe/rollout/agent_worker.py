"""verl's AgentLoopWorker for the rollout driver, its per-request agent loop built without Hydra where Hydra adds
nothing.

verl 0.9.1 builds a new agent-loop object for every request with ``hydra.utils.instantiate(config=<registry
entry>, **kwargs)``. For an agent loop registered with verl's ``@register`` the entry is just ``{"_target_":
"<module.Class>"}`` and the kwargs are objects verl wraps so that Hydra leaves them alone (``DictConfigWrap``,
``ToolListWrap``); Hydra then only calls the class, after turning the kwargs into an OmegaConf config and back:
1.09 ms of the driver's CPU per request against 0.4 us for the call (tools/driver_microbench.py
``--verl-agent-loop``), in the process the trainer's loop shares, 0.28 s of a 256-request step. Here such an entry's
class is resolved once, as Hydra resolves it (``hydra.utils.get_class``), and called with the same kwargs; any
other entry (one from ``rollout.agent.agent_loop_config_path``, with parameters of its own) still goes through
Hydra. ``_run_agent_loop`` is verl's own method otherwise unchanged; ``VERL_RUN_AGENT_LOOP_SHA256`` pins the verl
source it was copied from, and a test fails when verl's changes.
"""

from __future__ import annotations

from typing import Any

import hydra
from verl.experimental.agent_loop.agent_loop import (AgentLoopWorker, DictConfigWrap, ToolListWrap,
                                                     _agent_loop_registry)
from verl.utils.rollout_trace import rollout_trace_attr

# sha256 of inspect.getsource(verl 0.9.1's AgentLoopWorker._run_agent_loop)
VERL_RUN_AGENT_LOOP_SHA256 = "32c3d607c5d4c9fa124c9d53a476689b63aeb2662f28c9cc1933fc6ec3e9e989"


class PipeAgentLoopWorker(AgentLoopWorker):
    _classes: dict[str, type] = {}  # "_target_" -> class, resolved once per process

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
            agent_loop = self._agent_loop(_agent_loop_registry[agent_name])
            output = await agent_loop.run(sampling_params, **kwargs)
            return await self._agent_loop_postprocess(output, trajectory["validate"], **kwargs)
