"""Real tool calls for GPU models: verl's ``ToolAgentLoop`` (the model emits tool calls, parsed by verl's ``hermes``
parser for Qwen3), made turn-aware for FGD, and a calculator tool registered the verl way.

``PipeToolAgentLoop`` (``@register("verl_pipe_tool_agent")``) is verl's ToolAgentLoop unchanged but for its server
manager, wrapped per trajectory (``_TurnAwareServer``) so that

- every turn is sent with the trajectory's priority (FGD: its group's rank): verl's ToolAgentLoop takes ``priority``
  but does not pass it to ``generate``;
- each model turn's end frees the trajectory's admission window slot while its tools run, and its next turn waits for
  the admission policy (same replica, same priority) (``verl_pipe.rollout.turns``; no-ops outside the streaming
  driver, e.g. in verl's own validation workers).

Its tools are verl's (``actor_rollout_ref.rollout.multi_turn.tool_config_path``) plus those of the agent-loop entry's
``tool_config`` (a ``pkg://`` path resolves to the installed package's file): the GPU recipe
``qwen3_1p7b_tool_calc_4x4`` names ``pkg://verl_pipe.recipes/lib/calculator_tool.yaml`` there, a verl tool config
whose ``class_name`` is ``CalculatorTool`` below.

No tool runs on the agent worker's event loop, which carries every trajectory of the step (and, in the streaming
driver, the step's admission and hand-over): each of the loop's ``BaseTool`` tools is wrapped (``OffLoopTool``) so that
its calls run on a thread of their own (``TOOL_LOOP``, one event loop for every tool of the process), a tool call
bounded by ``TOOL_TIMEOUT_S`` (past it the model sees an error text, as for any tool error, and the trajectory goes
on). The calculator bounds its numbers (``MAX_INT_BITS``) before it computes them and evaluates in a worker thread.
"""

from __future__ import annotations

import ast
import asyncio
import math
import operator
import threading
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, register
from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import ToolResponse

from verl_pipe.rollout import turns

AGENT_NAME = "verl_pipe_tool_agent"


class _TurnAwareServer:
    """The agent loop's server manager for one trajectory: sticky priority, turn events around each generate."""

    def __init__(self, server, priority: int):
        self._server, self._priority, self._calls = server, int(priority), 0

    async def generate(self, **kwargs):
        if self._calls:
            await turns.next_turn()
        kwargs.setdefault("priority", self._priority)
        out = await self._server.generate(**kwargs)
        self._calls += 1
        turns.turn_done()  # the turn ended: tools (or the trajectory's end) next, no slot held meanwhile
        return out

    def __getattr__(self, name):
        return getattr(self._server, name)


def load_tools(path: str | None) -> list:
    """verl's tools of a tool config file (``pkg://package/rel/path`` or a file path); [] for None."""
    if not path:
        return []
    from verl.tools.tool_registry import initialize_tools_from_config

    if str(path).startswith("pkg://"):
        from verl_pipe.config import resolve_pkg_path

        path = resolve_pkg_path(path)
    return initialize_tools_from_config(path)


TOOL_TIMEOUT_S = 60.0  # a tool call (create, execute, reward, release) that takes longer is an error the model sees


class _ToolLoop:
    """One event loop on a daemon thread of its own, for every tool call of the process (started on first use)."""

    def __init__(self):
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                threading.Thread(target=self._loop.run_forever, name="verl-pipe-tools", daemon=True).start()
            return self._loop

    async def run(self, coro, timeout_s: float | None, what: str):
        """``coro`` on the tool thread's loop, awaited from the caller's loop; cancelled there past ``timeout_s``."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop())
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), timeout=timeout_s)
        except asyncio.TimeoutError:
            future.cancel()
            raise TimeoutError(f"{what} took longer than {timeout_s:g}s") from None


TOOL_LOOP = _ToolLoop()


class OffLoopTool(BaseTool):
    """A verl ``BaseTool`` whose calls run on ``TOOL_LOOP``'s thread, not on the agent worker's loop; ``execute``,
    ``calc_reward`` and ``create`` bounded by ``timeout_s``. Everything else is the wrapped tool's."""

    def __init__(self, tool: BaseTool, timeout_s: float | None = TOOL_TIMEOUT_S):  # noqa: D107 -- no BaseTool init
        self.tool, self.timeout_s = tool, timeout_s

    def __getattr__(self, name):
        if name in ("tool", "timeout_s"):
            raise AttributeError(name)
        return getattr(self.tool, name)

    async def create(self, instance_id: str | None = None, **kwargs):
        return await TOOL_LOOP.run(self.tool.create(instance_id, **kwargs), self.timeout_s, f"tool {self.name} create")

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs):
        return await TOOL_LOOP.run(self.tool.execute(instance_id, parameters, **kwargs), self.timeout_s,
                                   f"tool {self.name}")

    async def calc_reward(self, instance_id: str, **kwargs):
        return await TOOL_LOOP.run(self.tool.calc_reward(instance_id, **kwargs), self.timeout_s,
                                   f"tool {self.name} reward")

    async def release(self, instance_id: str, **kwargs):
        return await TOOL_LOOP.run(self.tool.release(instance_id, **kwargs), self.timeout_s,
                                   f"tool {self.name} release")


def off_loop(tool):
    """``tool`` wrapped to run off the agent worker's loop (verl's function tools, called as functions, stay)."""
    return tool if isinstance(tool, OffLoopTool) or not isinstance(tool, BaseTool) else OffLoopTool(tool)


@register(AGENT_NAME)
class PipeToolAgentLoop(ToolAgentLoop):
    def __init__(self, *args, tool_config: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        for tool in load_tools(tool_config):
            if tool.name in self.tools:
                raise ValueError(f"tool {tool.name!r} of {tool_config} is also in multi_turn.tool_config_path")
            self.tools[tool.name] = tool
            self.tool_schemas.append(tool.tool_schema.model_dump(exclude_unset=True, exclude_none=True))
        self.tools = {name: off_loop(tool) for name, tool in self.tools.items()}

    async def run(self, sampling_params: dict[str, Any], priority: int = 0, **kwargs) -> AgentLoopOutput:
        base = self.server_manager
        self.server_manager = _TurnAwareServer(base, priority)
        try:
            return await super().run(sampling_params, priority=priority, **kwargs)
        finally:
            self.server_manager = base


# ---------------------------------------------------------------------------------------------- the tool

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow, ast.USub: operator.neg,
        ast.UAdd: operator.pos}
MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 64
# Every integer the calculator makes, the result and each intermediate, stays within this many bits (~300 digits),
# checked before it is computed: 9**64 is 203 bits, but a nesting of powers under 200 characters, ((9**64)**64)**2,
# would be 26,000 bits, and a few more levels a multi-gigabit integer built on the caller's thread.
MAX_INT_BITS = 1024
CALCULATOR_TIMEOUT_S = 2.0  # one evaluation, in a worker thread


def _bits(x) -> int:
    return abs(int(x)).bit_length() if isinstance(x, int) else 0


def _check_size(op, left, right) -> None:
    """Refuses an integer operation whose result would exceed MAX_INT_BITS, before computing it."""
    if not (isinstance(left, int) and isinstance(right, int)):
        return  # floats overflow to OverflowError or inf on their own
    if isinstance(op, ast.Pow):
        if right > 0 and abs(left) > 1 and _bits(left) * right > MAX_INT_BITS + _bits(left):
            raise ValueError(f"result larger than {MAX_INT_BITS} bits")
    elif isinstance(op, ast.Mult):
        if _bits(left) + _bits(right) > MAX_INT_BITS + 1:
            raise ValueError(f"result larger than {MAX_INT_BITS} bits")


def evaluate(expression: str) -> float | int:
    """An arithmetic expression (numbers, + - * / // % **, parentheses), without Python's eval; every integer of it
    within MAX_INT_BITS, exponents within MAX_EXPONENT."""
    if not isinstance(expression, str) or not expression.strip():
        raise ValueError("expression must be a non-empty string")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            value = node.value
        elif isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            value = _OPS[type(node.op)](ev(node.operand))
        elif isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
                raise ValueError(f"exponent above {MAX_EXPONENT}")
            _check_size(node.op, left, right)
            value = _OPS[type(node.op)](left, right)
        else:
            raise ValueError(f"unsupported syntax: {type(node).__name__}")
        if isinstance(value, complex):  # a negative number to a fractional power
            raise ValueError("complex result")
        if _bits(value) > MAX_INT_BITS:
            raise ValueError(f"number larger than {MAX_INT_BITS} bits")
        return value

    try:
        return ev(ast.parse(expression.replace("^", "**"), mode="eval"))
    except (RecursionError, MemoryError) as e:
        raise ValueError(f"expression too deeply nested or too large ({type(e).__name__})") from None


def calculate(expression) -> str:
    """The calculator's answer text: ``<expression> = <value>``, or ``error: ...`` (every error is the model's to
    see; nothing raises)."""
    try:
        value = evaluate(expression)
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            value = int(value)
        return f"{expression} = {value}"
    except (ValueError, SyntaxError, ZeroDivisionError, OverflowError, TypeError) as e:
        return f"error: {e}"


class CalculatorTool(BaseTool):
    """verl tool: ``calculator(expression)`` -> the value, or an error text the model sees. Stateless; reward 0 (the
    task's reward scores the final answer). Evaluated in a worker thread within CALCULATOR_TIMEOUT_S."""

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        expression = parameters.get("expression", "")
        try:
            text = await asyncio.wait_for(asyncio.to_thread(calculate, expression), timeout=CALCULATOR_TIMEOUT_S)
        except asyncio.TimeoutError:
            text = f"error: took longer than {CALCULATOR_TIMEOUT_S:g}s"
        return ToolResponse(text=text), 0.0, {"ok": not text.startswith("error:")}
