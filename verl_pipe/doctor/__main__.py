"""python -m verl_pipe.doctor [--gpu] [--out DIR]: check this machine for verl_pipe and write one report.

In order: torch and its CUDA build, the NVIDIA driver, the pinned versions, the packages the stack imports
(flash-attn optional), the torch-only device checks (a child process; they need no vLLM, Ray or verl), then the stack
run: the tiny model for --steps steps in sync and as many pipelined, and both modes' exactness on the same responses
(verl_pipe/doctor/stack.py). The stack's own output goes to DIR/stack.log; the report is DIR/doctor.json and
DIR/doctor.md. Exit status 0 when every check passed (or was skipped as not applying), 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import sys
from contextlib import contextmanager
from pathlib import Path

from verl_pipe.doctor import checks, device, versions
from verl_pipe.doctor.report import Check, Report

# What the stack run imports, as the package checks name them (cupy: the GPU stack's NCCL weight sync).
STACK_IMPORTS = ("import torch", "import transformers", "import ray", "import omegaconf", "import hydra", "import vllm",
                 "import verl")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m verl_pipe.doctor", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu", action="store_true", help="check the GPU stack (CUDA, NCCL, one GPU per pool); without "
                                                       "it the CPU stack runs and the GPU checks say 'no GPU'")
    ap.add_argument("--out", default="doctor-report", help="the report's directory (default: ./doctor-report)")
    ap.add_argument("--steps", type=int, default=2, help="training steps per mode in the stack run (default 2)")
    ap.add_argument("--no-stack", action="store_true", help="the environment and device checks only")
    return ap


@contextmanager
def output_to(path: Path):
    """File descriptors 1 and 2 (ours, Ray's forwarded worker logs, vLLM's) into ``path``; yields a writer to the
    terminal the doctor started on."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "ab") as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
    terminal = os.fdopen(os.dup(saved[0]), "w", buffering=1)
    try:
        yield terminal
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)
        terminal.close()


def _stack_blockers(report: Report, gpu: bool) -> list[str]:
    needed = STACK_IMPORTS + (("import cupy",) if gpu else ())
    return [c.name.split(" ", 1)[1] for c in report.checks if c.name in needed and c.status == "fail"]


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if args.steps < 1:
        _parser().error(f"--steps: got {args.steps}; allowed: an integer >= 1")
    out = Path(args.out).expanduser().resolve()
    out.mkdir(parents=True, exist_ok=True)
    report = Report(argv=["python -m verl_pipe.doctor", *(argv if argv is not None else sys.argv[1:])], gpu=args.gpu)

    def say(msg: str, to=None) -> None:
        print(f"[doctor] {msg}", file=to or sys.stdout, flush=True)

    say(f"checking this machine for verl_pipe ({'GPU' if args.gpu else 'CPU'} stack); report in {out}")
    torch_check, cuda = checks.torch_check(args.gpu)
    report.add(torch_check)
    report.add(checks.driver_check(args.gpu, cuda))
    report.add(versions.check_versions(args.gpu, cuda))
    say("importing the stack's packages ...")
    report.extend(checks.package_checks(args.gpu))
    say("device checks (torch only) ...")
    report.extend(device.in_subprocess(args.gpu))
    blockers = _stack_blockers(report, args.gpu)
    if args.no_stack:
        report.add(Check("stack run", "stack", "skip", "--no-stack", needed=False))
    elif blockers:
        report.add(Check("stack run", "stack", "skip", f"not run: {', '.join(blockers)} failed above"))
    else:
        from verl_pipe.doctor.stack import run_stack

        log = out / "stack.log"
        say(f"stack run: {args.steps} steps sync, {args.steps} pipelined, then both on the same responses; its output "
            f"goes to {log}")
        with output_to(log) as terminal:
            stack_checks, report.phases = run_stack(args.gpu, int(torch_check.data.get("device_count", 0)), args.steps,
                                                    progress=lambda m: say(m, terminal))
        report.extend(stack_checks)
    js, md = report.write(out)
    for c in report.checks:
        print(f"  {c.status.upper():4}  {c.name}: {c.detail[:160]}")
    say(f"{report.verdict.upper()}: {js} and {md}" + (f"; send them back with {sum(c.status == 'fail' for c in report.checks)} "
        "failure(s), as the summary says" if report.verdict == "fail" else ""))
    return 0 if report.verdict == "pass" else 1


if __name__ == "__main__":
    sys.exit(main())
