"""``python -m verl_pipe_lab.bench NAME``: the registry of the bench's named commands (lab/verl_pipe_lab/bench/commands.py).

Pure: parses files and runs ``--help`` in a subprocess (no Ray, no model)."""

import ast
import os
import subprocess
import sys

import pytest

from tests.checkout import ROOT
from verl_pipe_lab.bench import commands
from verl_pipe_lab.bench.commands import COMMANDS, chosen_command, register_command

TOOLS = ROOT / "lab" / "verl_pipe_lab" / "bench" / "tools"


def test_every_measurement_script_is_a_command_whose_main_takes_argv():
    scripts = {f.stem for f in TOOLS.glob("*.py") if f.stem != "__init__"}
    targets = {c.target.partition(":")[0].rpartition(".")[2]: c for c in COMMANDS.values()
               if c.target.startswith("verl_pipe_lab.bench.tools.")}
    assert set(targets) == scripts
    for name, cmd in targets.items():
        assert cmd.name == name
        tree = ast.parse((TOOLS / f"{name}.py").read_text())
        main = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main")
        assert len(main.args.args) == 1 and main.args.defaults, f"{name}.main(argv=None)"


def test_a_name_first_or_a_flag_anywhere_chooses_a_command():
    cmd, argv = chosen_command(["paired_rounds", "x.json", "--a", "sync"])
    assert cmd.name == "paired_rounds" and argv == ["x.json", "--a", "sync"]
    cmd, argv = chosen_command(["--out", "s.json", "--soak", "200"])
    assert cmd.name == "soak" and argv == ["--out", "s.json", "--soak", "200"]  # the whole line, as before
    assert chosen_command(["--soak=40", "--out", "s.json"])[0].name == "soak"
    assert chosen_command(["--learn", "--out", "l.json"])[0].name == "learn"
    assert chosen_command(["--quick", "--out", "q.json"]) is None  # the bench
    assert chosen_command(["--out", "paired_rounds"]) is None  # a name counts only first
    assert chosen_command([]) is None


def test_registering_takes_a_new_name_and_refuses_a_taken_one(monkeypatch):
    monkeypatch.setattr(commands, "COMMANDS", dict(COMMANDS))
    register_command("my_probe", "my_pkg.probe:main", "a probe of mine")
    assert commands.COMMANDS["my_probe"].target == "my_pkg.probe:main"
    register_command("my_probe", "my_pkg.probe:main", "a probe of mine")  # the same again: no-op
    with pytest.raises(ValueError, match="already registered"):
        register_command("pad_bench", "my_pkg.pad:main", "another")
    with pytest.raises(ValueError, match="not a flag"):
        register_command("--x", "my_pkg.x:main", "x")
    assert commands.run_command(commands.Command("t", "tests.test_bench_commands:_echo", ""), ["a"]) == 3


def _echo(argv):
    return len(argv) + 2


def test_help_lists_every_command_and_a_command_has_its_own_help():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    run = lambda *a: subprocess.run([sys.executable, "-m", "verl_pipe_lab.bench", *a], cwd=ROOT, env=env,  # noqa: E731
                                    capture_output=True, text=True, timeout=120)
    out = run("--help")
    assert out.returncode == 0, out.stderr
    for c in COMMANDS.values():
        assert f"  {c.flag or c.name}  " in out.stdout
    out = run("paired_rounds", "--help")
    assert out.returncode == 0 and "usage: python -m verl_pipe_lab.bench paired_rounds" in out.stdout


def test_a_command_runs_without_the_benchs_imports():
    """The command dispatches before run.py's imports: paired_rounds needs no verl, Ray, vLLM, YAML or Hydra."""
    code = ("import runpy, sys\n"
            "for m in ('verl', 'ray', 'vllm', 'yaml', 'omegaconf', 'hydra'): sys.modules[m] = None\n"
            "sys.argv = ['python -m verl_pipe_lab.bench', 'paired_rounds', '--help']\n"
            "runpy.run_module('verl_pipe_lab.bench', run_name='__main__')\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "usage: python -m verl_pipe_lab.bench paired_rounds" in out.stdout
