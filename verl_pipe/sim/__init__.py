"""Discrete-event simulator of one on-policy GRPO step at cluster scale (pure Python + numpy).

Response lengths come from verl_pipe/core/workload.py (shared with the trainer's rolloutpipe.workload).

engine.py    one vLLM-V1-like replica: continuous batching, KV pool, preemption, decode-step cost
trainer.py   trainer cost model: executes the real trainer's schedule (verl_pipe/core/schedule.py); verl_separate_async
simulate.py  the event loop: frontier.py policies admit, replicas generate, StepTimeline records
turns.py     multi-turn episodes (model turns and tool waits, as the toy environment plans them)
grid.py      the 12 cluster settings of conf/sim/cluster_grid.yaml, the T/R and FGD sweeps, text tables
"""

from verl_pipe.core.workload import Workload, equal_lengths, lognormal
from verl_pipe.sim.engine import CPU_TINY, H100_QWEN3_1P7B, EngineParams, fit_engine_params
from verl_pipe.sim.simulate import simulate_rollout, simulate_step
from verl_pipe.sim.trainer import MODES, TrainerParams

__all__ = ["CPU_TINY", "H100_QWEN3_1P7B", "EngineParams", "MODES", "TrainerParams", "Workload", "equal_lengths",
           "fit_engine_params", "lognormal", "simulate_rollout", "simulate_step"]
