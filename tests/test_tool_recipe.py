"""The GPU tool-use recipe (recipes/qwen3_1p7b_tool_calc_4x4.yaml) and its pieces (verl_pipe/rollout/tool_agent.py,
recipes/lib/calculator_tool.yaml, recipes/lib/tool_agent_loops.yaml): it composes WITHOUT the CPU test environment
and passes our checks and the launcher's environment check (as tests/test_gpu_recipes.py does for the other GPU
recipes), verl loads its tool config and agent-loop file, the calculator evaluates safely, and the agent loop sends
every turn with the trajectory's priority and reports its turns. It cannot run here (GPUs, Qwen3-1.7B)."""

import asyncio
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from tests.checkout import ROOT
from tests.fakes import fake_of
from verl_pipe.rollout.client import AdmissionRoutedClient
from tests.test_gpu_recipes import CPU_ENV_PREFIXES, PROBE

RECIPE = "qwen3_1p7b_tool_calc_4x4"


@pytest.fixture(scope="module")
def resolved() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(CPU_ENV_PREFIXES)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(ROOT), os.environ.get("PYTHONPATH", "")] if p)
    out = subprocess.run([sys.executable, "-c", PROBE, RECIPE], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (line,) = [x for x in out.stdout.splitlines() if x.startswith("RESULT")]
    return json.loads(line[len("RESULT"):])[RECIPE]


@pytest.fixture(scope="module")
def cfg():
    from verl_pipe.launch.session import compose

    return compose([], config_name=RECIPE)


def test_tool_recipe_composes_with_gpu_defaults(resolved):
    assert resolved["rolloutpipe.platform"] == "gpu" and resolved["trainer.device"] == "cuda"
    assert resolved["actor_rollout_ref.rollout.checkpoint_engine.backend"] == "nccl"
    assert resolved["actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.nccl.rebuild_group"] is True
    assert resolved["actor_rollout_ref.rollout.agent.num_workers"] == 8
    assert resolved["rolloutpipe.cgp.granularity"] == "minibatch" and resolved["trainer.balance_batch"] is True


def test_tool_recipe_selects_verls_tool_loop_hermes_and_separate_pools(cfg):
    from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop

    from verl_pipe.config import resolve_pkg_path
    from verl_pipe.rollout.tool_agent import AGENT_NAME, PipeToolAgentLoop

    rp, r, t = cfg.rolloutpipe, cfg.actor_rollout_ref.rollout, cfg.trainer
    assert rp.mode == "cgp" and rp.fgd.enable and r.scheduling_policy == "priority"
    assert rp.multiturn is None and rp.workload is None  # real tool calls, the model decides every length
    assert r.multi_turn.enable and r.multi_turn.format == "hermes"
    assert r.agent.default_agent_loop == AGENT_NAME and issubclass(PipeToolAgentLoop, ToolAgentLoop)
    assert t.nnodes * t.n_gpus_per_node + r.nnodes * r.n_gpus_per_node == 8  # one 8-GPU node, 4 + 4
    assert r.max_model_len >= cfg.data.max_prompt_length + cfg.data.max_response_length
    entries = OmegaConf.load(resolve_pkg_path(r.agent.agent_loop_config_path))
    assert [e.name for e in entries] == [AGENT_NAME]
    assert entries[0]["_target_"] == f"{PipeToolAgentLoop.__module__}.{PipeToolAgentLoop.__qualname__}"
    assert entries[0].tool_config == "pkg://verl_pipe.recipes/lib/calculator_tool.yaml"


def test_calculator_tool_loads_through_verls_registry_and_answers():
    from verl_pipe.rollout.tool_agent import CalculatorTool, load_tools

    (tool,) = load_tools("pkg://verl_pipe.recipes/lib/calculator_tool.yaml")
    assert isinstance(tool, CalculatorTool) and tool.name == "calculator"
    assert tool.tool_schema.function.parameters.required == ["expression"]

    def call(expr):
        resp, reward, metrics = asyncio.run(tool.execute("i", {"expression": expr}))
        return resp.text, reward, metrics["ok"]

    assert call("(48 / 2) * 3 + 7") == ("(48 / 2) * 3 + 7 = 79", 0.0, True)
    assert call("2 ^ 10") == ("2 ^ 10 = 1024", 0.0, True)
    for bad in ("__import__('os')", "1 / 0", "9 ** 999", "x + 1", "", "1" * 300):
        text, _, ok = call(bad)
        assert not ok and text.startswith("error:"), bad


def test_the_calculator_is_bounded_in_size_and_time():
    """Nestings of powers under 200 characters that built multi-gigabit integers (or raised outside the tool's
    error handling when printed: Python refuses str() of an int over 4,300 digits) are refused before they are
    computed; every answer is text, within the time bound."""
    import time

    from verl_pipe.rollout.tool_agent import MAX_INT_BITS, calculate, evaluate

    for expr in ("((9**64)**64)**2", "(((9**64)**64)**64)**64", "((2**64)**64)*((2**64)**64)", "(10**64)**64",
                 "-((9**64)**64)", "(-8) ** 0.5", "(" * 150 + "1" + ")" * 49, "1e308 * 10 ** 5"):
        t = time.perf_counter()
        text = calculate(expr)
        assert time.perf_counter() - t < 0.5, expr
        assert isinstance(text, str), expr
        if not text.startswith("error:"):
            assert len(text) < 400, (expr, len(text))
    assert calculate("((9**64)**64)**2").startswith("error: result larger than")
    assert evaluate("2 ** 64 * 2 ** 64") == 2 ** 128
    assert evaluate("(2 ** 32) ** 31") == 2 ** 992  # within MAX_INT_BITS
    assert MAX_INT_BITS == 1024 and calculate("(2 ** 32) ** 32").startswith("error:")  # 1025 bits
    assert calculate("2 ** -3") == "2 ** -3 = 0.125"


def test_tool_calls_run_off_the_agent_workers_loop_within_a_bound():
    """The tool agent loop's tools run on a thread of their own (TOOL_LOOP): a tool that blocks its thread for a
    while leaves the caller's loop free; one that never answers is cut at the bound and the trajectory goes on."""
    import threading
    import time

    from verl_pipe.rollout.tool_agent import CalculatorTool, OffLoopTool, load_tools, off_loop

    (calc,) = load_tools("pkg://verl_pipe.recipes/lib/calculator_tool.yaml")
    wrapped = off_loop(calc)
    assert isinstance(wrapped, OffLoopTool) and off_loop(wrapped) is wrapped and wrapped.name == "calculator"
    assert isinstance(wrapped.tool, CalculatorTool)

    class Blocking(type(calc)):
        async def execute(self, instance_id, parameters, **kwargs):
            self.thread = threading.current_thread().name
            if parameters.get("expression") == "forever":
                await asyncio.sleep(3600)
            time.sleep(0.3)  # sync work in an async tool: it blocks whatever loop runs it
            return await super().execute(instance_id, parameters, **kwargs)

    blocking = Blocking(calc.config, calc.tool_schema)
    tool = OffLoopTool(blocking, timeout_s=1.0)

    async def main():
        ticks = 0

        async def tick():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticker = asyncio.create_task(tick())
        resp, _, _ = await tool.execute("i", {"expression": "6 * 7"})
        ticked = ticks
        with pytest.raises(TimeoutError, match="tool calculator took longer than 1s"):
            await tool.execute("i", {"expression": "forever"})
        ticker.cancel()
        return resp.text, ticked

    text, ticked = asyncio.run(main())
    assert text == "6 * 7 = 42" and blocking.thread == "verl-pipe-tools"
    assert ticked >= 10, "the caller's loop ran while the tool worked"


def test_hermes_parser_reads_a_calculator_call(tmp_path):
    from verl.experimental.agent_loop.tool_parser import ToolParser

    from verl_pipe.assets.tokenizer import build_tokenizer

    tok = build_tokenizer(tmp_path / "tok")  # the tiny tokenizer: hermes parses the decoded text
    parser = ToolParser.get_tool_parser("hermes", tok)
    text = 'I will compute it.<tool_call>\n{"name": "calculator", "arguments": {"expression": "3 * 7"}}\n</tool_call>'
    content, calls = asyncio.run(parser.extract_tool_calls(tok.encode(text), None))
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("calculator", {"expression": "3 * 7"})]


@fake_of(AdmissionRoutedClient, extra=("calls",))
class _FakeServer:
    def __init__(self):
        self.calls = []

    async def generate(self, **kwargs):
        self.calls.append(kwargs)
        return SimpleNamespace(token_ids=[1])


def test_turn_aware_server_sends_the_priority_on_every_turn_and_reports_turns():
    from verl_pipe.rollout import turns
    from verl_pipe.rollout.tool_agent import _TurnAwareServer

    events = []

    class Gate:
        def turn_done(self):
            events.append("turn_done")

        async def next_turn(self):
            events.append("next_turn")

    async def trajectory():
        turns.CURRENT_TURN_GATE.set(Gate())
        server = _FakeServer()
        wrapped = _TurnAwareServer(server, priority=7)
        for _ in range(3):
            await wrapped.generate(request_id="r", prompt_ids=[0], sampling_params={})
        return server

    server = asyncio.run(trajectory())
    assert [c["priority"] for c in server.calls] == [7, 7, 7]
    assert events == ["turn_done", "next_turn", "turn_done", "next_turn", "turn_done"]
