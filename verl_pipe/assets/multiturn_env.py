"""A deterministic multi-turn, tool-using toy environment for CPU runs: a calculator the environment calls between
the model's turns, with a heavy-tailed number of turns and tool latency that is correlated within a group.

Pure Python (no torch, no verl): the agent loop (``verl_pipe/rollout/multiturn.py``) drives it, the tests check it
alone. The tiny model cannot emit tool calls, so the protocol is scripted by the environment, not parsed from the
model: an episode has ``turns`` model turns; after each model turn but the last, the environment runs its
calculator on the model's text (the first ``a + b``, ``a * b`` or ``a % b`` it finds) and appends the result as a
``tool`` message, after a simulated latency. The reward is verifiable: 1.0 when the last model turn's answer (the
digit-math reward's ``extract_answer``) equals the record's ground truth, else 0.0; 0.0 for an episode whose tool
failed (``on_tool_failure: zero_reward``).

The tails. Like ``verl_pipe/core/workload.py``'s lengths, the number of turns and each call's latency are log-normal
with a shared per-group latent Z_g (one per task, i.e. per prompt, so the n samples of a group share it)::

    log X = log(median) + sigma * (sqrt(rho) * Z_g + sqrt(1 - rho) * E),   then clipped to [1, max] / [0, cap]

with E drawn per sample for turns and per (sample, call) for latencies. One Z_g drives both: a task that needs many
tool calls also gets slow ones, so a few *groups* are much longer than the rest, which is what CGP and FGD exploit.
Every draw is a function of (seed, task, sample, what): the same episode comes back in every process, on a retry and
after a replica restart (``random.Random`` seeded with a string hashes it with SHA-512, independent of
PYTHONHASHSEED).
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass, field, fields

from verl_pipe.assets.reward import _ground_truth_int, extract_answer

ON_TOOL_FAILURE = ("zero_reward", "fail_request")
_EXPR = re.compile(r"(-?\d+)\s*([+*%])\s*(-?\d+)")


@dataclass(frozen=True)
class TailSpec:
    """A log-normal with a per-group latent: median, sigma (log-scale spread), rho (within-group correlation of the
    log), and its upper bound (``cap``)."""

    median: float
    sigma: float
    rho: float
    cap: float

    def __post_init__(self):
        if not self.median > 0:
            raise ValueError(f"median must be > 0, got {self.median!r}")
        if not self.sigma >= 0:
            raise ValueError(f"sigma must be >= 0, got {self.sigma!r}")
        if not 0.0 <= self.rho <= 1.0:
            raise ValueError(f"rho must be in [0, 1], got {self.rho!r}")
        if not self.cap >= self.median:
            raise ValueError(f"cap must be >= median, got cap {self.cap!r} < median {self.median!r}")

    def draw(self, z_group: float, e: float) -> float:
        x = math.exp(math.log(self.median) + self.sigma * (math.sqrt(self.rho) * z_group
                                                            + math.sqrt(1.0 - self.rho) * e))
        return min(x, self.cap)


@dataclass(frozen=True)
class EnvConfig:
    """``rolloutpipe.multiturn`` of a run's config (``from_dict``)."""

    seed: int = 0
    # Model turns per episode (an integer in [1, cap]); the tool is called turns - 1 times.
    turns: TailSpec = field(default_factory=lambda: TailSpec(median=2, sigma=0.8, rho=0.7, cap=6))
    # Seconds per tool call (asyncio.sleep in the agent loop: a waiting trajectory holds no engine slot).
    latency_s: TailSpec = field(default_factory=lambda: TailSpec(median=0.05, sigma=1.0, rho=0.7, cap=2.0))
    # Most tokens the model may generate in one turn (also bounded by what is left of data.max_response_length).
    turn_max_tokens: int = 16
    # null: the model ends its turn (EOS or turn_max_tokens). Set: each turn's length is forced (ignore_eos), drawn
    # log-normal from the same group latent, per (sample, turn), clipped to [1, cap] and to turn_max_tokens: the
    # same work in every mode, for benchmarks (turns x tool latency x length).
    turn_tokens: TailSpec | None = None
    # Probability that a tool call fails, drawn per (task, sample, call).
    tool_failure_p: float = 0.0
    # zero_reward: the episode ends at the failure with reward 0 (counted per response, mt_tool_failed);
    # fail_request: the trajectory raises ToolFailure and the rollout's request-failure handling applies
    # (rolloutpipe.fault: retried, then the step fails or, with on_request_failure=drop_group, the group is dropped).
    on_tool_failure: str = "zero_reward"

    def __post_init__(self):
        if not (isinstance(self.seed, int) and self.seed >= 0):
            raise ValueError(f"seed must be an integer >= 0, got {self.seed!r}")
        if self.turns.median < 1:
            raise ValueError(f"turns.median must be >= 1, got {self.turns.median!r}")
        if self.turn_tokens is not None and self.turn_tokens.median < 1:
            raise ValueError(f"turn_tokens.median must be >= 1, got {self.turn_tokens.median!r}")
        if not (isinstance(self.turn_max_tokens, int) and self.turn_max_tokens >= 1):
            raise ValueError(f"turn_max_tokens must be an integer >= 1, got {self.turn_max_tokens!r}")
        if not 0.0 <= self.tool_failure_p <= 1.0:
            raise ValueError(f"tool_failure_p must be in [0, 1], got {self.tool_failure_p!r}")
        if self.on_tool_failure not in ON_TOOL_FAILURE:
            raise ValueError(f"on_tool_failure must be one of {', '.join(ON_TOOL_FAILURE)}, "
                             f"got {self.on_tool_failure!r}")

    @classmethod
    def from_dict(cls, spec: dict | None) -> "EnvConfig":
        """From a plain mapping (the config node as a container); unknown keys raise ValueError naming them."""
        spec = dict(spec or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(spec) - known)
        if unknown:
            raise ValueError(f"unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(known))}")
        defaults = cls()
        for name in ("turns", "latency_s", "turn_tokens"):
            if name in spec and not (name == "turn_tokens" and spec[name] is None):
                sub = dict(spec[name] or {})
                tail_keys = {f.name for f in fields(TailSpec)}
                bad = sorted(set(sub) - tail_keys)
                if bad:
                    raise ValueError(f"{name}: unknown key(s) {', '.join(bad)}; "
                                     f"allowed: {', '.join(sorted(tail_keys))}")
                base = getattr(defaults, name)
                if base is None:  # turn_tokens: no defaults, every key given
                    missing = sorted(tail_keys - set(sub))
                    if missing:
                        raise ValueError(f"{name}: missing key(s) {', '.join(missing)}")
                spec[name] = TailSpec(**{k: float(sub[k] if k in sub else getattr(base, k)) for k in tail_keys})
        if "tool_failure_p" in spec:
            spec["tool_failure_p"] = float(spec["tool_failure_p"])
        return cls(**spec)


class ToolFailure(RuntimeError):
    """A tool call failed and ``on_tool_failure`` is ``fail_request``: the trajectory fails as a request."""


def _rng(seed: int, task, sample, what: str) -> random.Random:
    return random.Random(f"verl_pipe.multiturn:{seed}:{task}:{sample}:{what}")


def group_latent(seed: int, task) -> float:
    """Z_g: the task's standard-normal latent, shared by every sample of its group."""
    return _rng(seed, task, "*", "group").gauss(0.0, 1.0)


@dataclass(frozen=True)
class EpisodePlan:
    """Everything random about one episode, fixed before it starts."""

    turns: int  # model turns
    latencies_s: tuple[float, ...]  # one per tool call (turns - 1)
    failures: tuple[bool, ...]  # one per tool call
    turn_tokens: tuple[int, ...] = ()  # one per model turn when EnvConfig.turn_tokens is set (forced lengths)

    @property
    def first_failure(self) -> int | None:
        return next((i for i, f in enumerate(self.failures) if f), None)

    @property
    def tool_wait_s(self) -> float:
        """Seconds the episode waits on its tool if nothing fails."""
        return sum(self.latencies_s)


def plan_episode(cfg: EnvConfig, task, sample: int) -> EpisodePlan:
    """The episode of sample ``sample`` of task ``task`` (a prompt's stable id, e.g. its dataset index)."""
    z = group_latent(cfg.seed, task)
    rng = _rng(cfg.seed, task, sample, "episode")
    turns = int(min(max(1, round(cfg.turns.draw(z, rng.gauss(0.0, 1.0)))), int(cfg.turns.cap)))
    latencies, failures = [], []
    for call in range(turns - 1):
        call_rng = _rng(cfg.seed, task, sample, f"call{call}")
        latencies.append(cfg.latency_s.draw(z, call_rng.gauss(0.0, 1.0)))
        failures.append(call_rng.random() < cfg.tool_failure_p)
    lengths = ()
    if cfg.turn_tokens is not None:  # own streams: the turns, latencies and failures above are unchanged by it
        lengths = tuple(int(min(max(1, round(cfg.turn_tokens.draw(z, _rng(cfg.seed, task, sample, f"turn{t}")
                                                                     .gauss(0.0, 1.0)))),
                                int(cfg.turn_tokens.cap), cfg.turn_max_tokens)) for t in range(turns))
    return EpisodePlan(turns, tuple(latencies), tuple(failures), lengths)


def calculator(text: str) -> str:
    """The tool: evaluates the first ``a + b``, ``a * b`` or ``a % b`` in ``text``."""
    m = _EXPR.search(text or "")
    if m is None:
        return "no expression found"
    a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
    if op == "+":
        value = a + b
    elif op == "*":
        value = a * b
    else:
        if b == 0:
            return f"{a} % 0 is undefined"
        value = a % b
    return f"{a} {op} {b} = {value}"


def observation(model_text: str, turns_left: int) -> str:
    """The tool message after a model turn; ``turns_left`` model turns follow it (>= 1)."""
    head = f"calculator: {calculator(model_text)}."
    if turns_left == 1:
        return f"{head} Last turn: put the final answer after 'Answer:'"
    return f"{head} {turns_left} turns left."


def reward(final_text: str, ground_truth, tool_failed: bool = False) -> float:
    """1.0 when the last model turn's answer equals the ground truth (and no tool failed), else 0.0."""
    if tool_failed:
        return 0.0
    return 1.0 if extract_answer(final_text) == _ground_truth_int(ground_truth) else 0.0
