"""The named commands of ``python -m verl_pipe_lab.bench`` beside the side-by-side bench (run.py).

``python -m verl_pipe_lab.bench NAME [ARGS...]`` runs the command registered under ``NAME`` with ``ARGS`` (its own
command line: ``python -m verl_pipe_lab.bench NAME --help``); a command registered with a ``flag`` is chosen by that flag
anywhere on the bench's command line instead and gets the whole line (``--learn``, ``--soak STEPS``). Anything else
is the bench itself. ``python -m verl_pipe_lab.bench --help`` lists them all.

A command is registered by name with the ``module:function`` that runs it (``register_command``), imported only when
it runs: a command needs only its own imports (``paired_rounds``: the standard library, no verl). The function takes the
list of its arguments and returns an exit status (None counts as 0). Another package adds a command the same way,
from a module imported before ``main`` runs.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    name: str
    target: str  # "module:function", imported when the command runs
    help: str
    flag: str | None = None  # chosen by this flag on the bench's command line (whole line passed) instead of by name

    def load(self):
        module, _, func = self.target.partition(":")
        return getattr(importlib.import_module(module), func)

    def chosen_by(self, argv: list[str]) -> bool:
        if self.flag is None:
            return bool(argv) and argv[0] == self.name
        return any(a == self.flag or a.startswith(self.flag + "=") for a in argv)


COMMANDS: dict[str, Command] = {}


def register_command(name: str, target: str, help: str, flag: str | None = None) -> Command:
    """Registers ``target`` (``"module:function"``) as the command ``name``; a name taken by another target is
    refused (registering the same one again is a no-op)."""
    if not name or name.startswith("-"):
        raise ValueError(f"command name {name!r}: a word, not a flag (flags go in ``flag``)")
    cmd = Command(name, target, help, flag)
    if COMMANDS.get(name, cmd) != cmd:
        raise ValueError(f"command {name!r} is already registered as {COMMANDS[name].target}")
    COMMANDS[name] = cmd
    return cmd


def chosen_command(argv: list[str]) -> tuple[Command, list[str]] | None:
    """The command ``argv`` asks for and the arguments it gets, or None for the bench. A name comes first; a flag may
    come anywhere (and gets the whole line)."""
    for cmd in COMMANDS.values():
        if cmd.flag is None and cmd.chosen_by(argv):
            return cmd, argv[1:]
    for cmd in COMMANDS.values():
        if cmd.flag is not None and cmd.chosen_by(argv):
            return cmd, argv
    return None


def run_command(cmd: Command, argv: list[str]) -> int:
    return int(cmd.load()(argv) or 0)


def listing() -> str:
    """The commands as ``--help`` lists them (argparse's epilog)."""
    width = max(len(c.flag or c.name) for c in COMMANDS.values())
    lines = ["other benchmarks and measurements (python -m verl_pipe_lab.bench NAME --help for each):"]
    lines += [f"  {c.flag or c.name:<{width}}  {c.help}" for c in COMMANDS.values()]
    return "\n".join(lines)


_TOOLS = "verl_pipe_lab.bench.tools."
# (name, help): the measurement scripts, each a module of lab/verl_pipe_lab/bench/tools/ whose main(argv) is the command
for _name, _help in (
        ("dataproto_pickle_bench", "pickling one reward call's DataProto, verl's two serialization methods"),
        ("driver_microbench", "the rollout driver's own per-request and per-group costs, no Ray or vLLM"),
        ("dtype_ab", "the quick bench's sync step with the trainer in fp32 and in bf16, side by side"),
        ("eval_warm_start", "a model's accuracy on the digit-math validation questions, and its procedure"),
        ("logprob_gap_check", "vLLM's against the trainer's log-probs at theta_k, a step per mode named"),
        ("orchestration_profile", "where the run's orchestration spends its CPU, and what the rollout's cuts save"),
        ("overlap_probe", "the real stack's rollout beside a pinned stand-in load on the trainer's core"),
        ("pad_bench", "one padding call of verl's agent-loop post-processing: tokenizer.pad against ours"),
        ("paired_rounds", "per-round paired differences between two modes of a bench run, from its steps file"),
        ("to_tensordict_bench", "verl's DataProto -> TensorDict conversion and its pickling, per unit")):
    register_command(_name, f"{_TOOLS}{_name}:main", _help)
register_command("learn", "verl_pipe_lab.bench.learn:cli", "the learning curves (lab/verl_pipe_lab/bench/learn.py)", flag="--learn")
register_command("soak", "verl_pipe_lab.bench.soak:cli", "memory and step time over a long CGP+FGD run (soak.py)",
                 flag="--soak")
