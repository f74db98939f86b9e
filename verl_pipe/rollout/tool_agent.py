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
"""

from __future__ import annotations

import ast
import operator
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


@register(AGENT_NAME)
class PipeToolAgentLoop(ToolAgentLoop):
    def __init__(self, *args, tool_config: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        for tool in load_tools(tool_config):
            if tool.name in self.tools:
                raise ValueError(f"tool {tool.name!r} of {tool_config} is also in multi_turn.tool_config_path")
            self.tools[tool.name] = tool
            self.tool_schemas.append(tool.tool_schema.model_dump(exclude_unset=True, exclude_none=True))

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


def evaluate(expression: str) -> float | int:
    """An arithmetic expression (numbers, + - * / // % **, parentheses), without Python's eval."""
    if not isinstance(expression, str) or not expression.strip():
        raise ValueError("expression must be a non-empty string")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.operand))
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
                raise ValueError(f"exponent above {MAX_EXPONENT}")
            return _OPS[type(node.op)](left, right)
        raise ValueError(f"unsupported syntax: {type(node).__name__}")

    return ev(ast.parse(expression.replace("^", "**"), mode="eval"))


class CalculatorTool(BaseTool):
    """verl tool: ``calculator(expression)`` -> the value, or an error text the model sees. Stateless; reward 0 (the
    task's reward scores the final answer)."""

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        expression = parameters.get("expression", "")
        try:
            value = evaluate(expression)
        except (ValueError, SyntaxError, ZeroDivisionError, OverflowError) as e:
            return ToolResponse(text=f"error: {e}"), 0.0, {"ok": False}
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        return ToolResponse(text=f"{expression} = {value}"), 0.0, {"ok": True}
