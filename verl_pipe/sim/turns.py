"""Multi-turn episodes for the simulator: each trajectory is a list of model turns with a tool wait between two turns,
as the toy environment (verl_pipe/assets/multiturn_env.py) plans them.

``Episodes`` holds per (group, sample) the tokens of each model turn and the seconds of each tool call after a turn;
a trailing wait (a call after the last model turn) is a trajectory that ends on its tool: a tool message that does
not fit the response budget (truncated) or a failing tool (``zero_reward``), as the agent loop ends it. Tool messages
add ``tool_tokens`` masked tokens each to the context (and to the trained response). ``from_env`` draws the episodes
with the environment's own ``plan_episode``, so the simulator and a real run with the same ``rolloutpipe.multiturn``
config get the same turns and latencies (turn lengths too, when ``turn_tokens`` forces them).

Pure Python (no numpy needed); ``verl_pipe.sim.simulate`` runs them through the same turn-aware admission policy as
the real driver.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from verl_pipe.core.workload import Workload


@dataclass(frozen=True)
class Episodes:
    turns: list[list[tuple[int, ...]]]  # [group][sample]: model tokens of each turn (>= 1 turn, each >= 1 token)
    tool_s: list[list[tuple[float, ...]]]  # [group][sample]: seconds of the tool call after each turn
    tool_tokens: int = 0  # tokens one tool message adds to the context (masked in the response)
    # The engine's prefix-cache granularity in tokens: vLLM caches whole KV blocks (16 tokens by default on GPU, 128
    # on vLLM-CPU), so a next turn finds its earlier context cached only up to the last full block. 1: all of it.
    cache_block: int = 1

    def __post_init__(self):
        if len(self.turns) != len(self.tool_s):
            raise ValueError("turns and tool_s must cover the same groups")
        for g, (ts, ws) in enumerate(zip(self.turns, self.tool_s)):
            if len(ts) != len(ws) or (ts and len(ts) != len(self.turns[0])):
                raise ValueError(f"group {g}: every group needs the same n samples in turns and tool_s")
            for i, (t, w) in enumerate(zip(ts, ws)):
                if not t or any(int(x) < 1 for x in t):
                    raise ValueError(f"episode ({g}, {i}): needs at least one turn, each of at least one token")
                if not len(t) - 1 <= len(w) <= len(t) or any(x < 0 for x in w):
                    raise ValueError(f"episode ({g}, {i}): needs one tool wait (>= 0 s) between turns, "
                                     f"at most one after the last; got {len(w)} for {len(t)} turns")
        if self.tool_tokens < 0:
            raise ValueError(f"tool_tokens must be >= 0, got {self.tool_tokens}")
        if not (isinstance(self.cache_block, int) and self.cache_block >= 1):
            raise ValueError(f"cache_block must be an integer >= 1 (tokens per KV block), got {self.cache_block!r}")

    @property
    def num_groups(self) -> int:
        return len(self.turns)

    @property
    def n(self) -> int:
        return len(self.turns[0]) if self.turns else 0

    def segments(self, group: int, index: int) -> tuple[tuple[int, ...], tuple[float, ...]]:
        return self.turns[group][index], self.tool_s[group][index]

    def context_before(self, group: int, index: int, turn: int) -> int:
        """Response tokens in the context before model turn ``turn``: earlier turns and their tool messages."""
        return sum(self.turns[group][index][:turn]) + turn * self.tool_tokens

    def cached_before(self, group: int, index: int, turn: int, prompt_len: int) -> int:
        """Tokens of model turn ``turn``'s context (``prompt_len`` + ``context_before``) found in the replica's prefix
        cache: what the trajectory's previous turn left (everything but the tool message since), in whole blocks of
        ``cache_block`` tokens; the previous turn's last sampled token was never fed to the engine, so its KV is not
        there. With ``cache_block`` 1, the whole earlier context (only the tool message is prefilled)."""
        known = prompt_len + self.context_before(group, index, turn) - self.tool_tokens
        if self.cache_block == 1:
            return known
        return (max(0, known - 1) // self.cache_block) * self.cache_block

    def response_tokens(self, group: int, index: int) -> int:
        """The trained response: every model turn and every tool message between two turns."""
        t = self.turns[group][index]
        return sum(t) + (len(t) - 1) * self.tool_tokens

    def workload(self, prompt_len: int, name: str = "multiturn") -> Workload:
        """The single-turn view the trainer's cost model reads (response lengths per group and sample)."""
        lengths = [[self.response_tokens(g, i) for i in range(self.n)] for g in range(self.num_groups)]
        return Workload(self.num_groups, self.n, lengths, prompt_len, name)


def _episode(plan, turn_tokens: int, response_length: int, tool_tokens: int) -> tuple[tuple, tuple]:
    """One planned episode as the agent loop runs it within ``response_length`` (verl_pipe/rollout/multiturn.py)."""
    turns, waits, used = [], [], 0
    for k in range(plan.turns):
        budget = response_length - used
        if budget <= 0:
            break
        tokens = min(plan.turn_tokens[k] if plan.turn_tokens else turn_tokens, budget)
        turns.append(tokens)
        used += tokens
        if k == plan.turns - 1 or used >= response_length:
            break
        waits.append(float(plan.latencies_s[k]))  # the tool runs before its message is checked
        if plan.failures[k] or used + tool_tokens >= response_length:
            break  # ends on its tool: a failure (zero_reward) or a tool message that does not fit
        used += tool_tokens
    return tuple(turns), tuple(waits)


def from_env(env, num_groups: int, n: int, *, response_length: int, tool_tokens: int,
             task: Callable[[int], str] = lambda g: f"train/{g}", cache_block: int = 1) -> Episodes:
    """The episodes of ``env`` (an ``EnvConfig``) for groups ``task(0..num_groups-1)`` (a prompt's task key, as
    ``verl_pipe.rollout.multiturn.task_key`` builds it: "<split>/<dataset index>"). A turn is ``turn_tokens`` long
    when forced, else ``env.turn_max_tokens`` (the model ending its turn earlier is not modelled). ``cache_block``:
    the engine's KV block in tokens (``Episodes.cache_block``)."""
    from verl_pipe.assets.multiturn_env import plan_episode

    if response_length < 1:
        raise ValueError(f"response_length must be >= 1, got {response_length}")
    turns, waits = [], []
    for g in range(num_groups):
        eps = [_episode(plan_episode(env, task(g), i), env.turn_max_tokens, response_length, tool_tokens)
               for i in range(n)]
        turns.append([e[0] for e in eps])
        waits.append([e[1] for e in eps])
    return Episodes(turns, waits, tool_tokens, cache_block)
