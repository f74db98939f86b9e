"""``make check``: what to run before a commit. The non-e2e suite, then the end-to-end modules the change touches.

    python tools/check.py [--base REF] [--dry-run] [--no-unit] [--burn N]

The change: the files that differ from the merge base with ``--base`` (default: origin/main if it exists, else main),
committed or not, and untracked files git does not ignore. Each changed file is mapped to the e2e modules that run
its code (``RULES``, first match wins; a test module under tests/e2e/ maps to itself, the e2e conftest to every module).
e2e modules run one at a time, each under the machine's Ray lock when ``flock`` exists (COORDINATION.md:
``/tmp/verl_pipe_ray.lock``, or VERL_PIPE_RAY_LOCK). Exit status: the first failing run's.

``--burn N``: the non-e2e suite runs beside N processes that each keep a core busy (a CI machine shared with
other jobs): a test that only passes on an idle machine fails here, not on CI. The burners stop when the suite ends;
the e2e modules after it run without them.
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
E2E = ROOT / "tests" / "e2e"
CORE_E2E = ("test_pipeline", "test_faults")  # the step on the real stack: the default for code not named below

# (glob over the repository's paths, e2e modules). First match wins; () runs no e2e module.
RULES: list[tuple[str, tuple[str, ...]]] = [
    ("docs/*", ()), ("*.md", ()), ("tests/test_*.py", ()), ("tests/fakes.py", ()), ("tests/checkout.py", ()),
    ("tests/conftest.py", ()), ("verl_pipe/plan/*", ()), ("verl_pipe/sim/*", ()), ("conf/sim/*", ()),
    ("tools/check.py", ()),
    ("tests/e2e/faulty_reward.py", ("test_faults",)),
    ("lab/verl_pipe_lab/bench/peer/v1_sync.py", ("test_verl_exact",)),
    ("lab/verl_pipe_lab/bench/peer/replay.py", ("test_verl_exact",)),
    ("verl_pipe/trainer/actor_backend.py", (*CORE_E2E, "test_zz_kl_loss", "test_verl_exact")),
    # the measurement scripts (python -m verl_pipe_lab.bench NAME): run by hand on a live stack; their unit tests only
    ("lab/verl_pipe_lab/bench/tools/*", ()),
    ("lab/*", ("test_bench_smoke",)),  # the lab's package: its bench, peer, configs and pyproject
    ("verl_pipe/platform/node_roles.py", ("test_multinode",)), ("verl_pipe/rollout/placement.py", ("test_multinode",)),
    ("tools/local_ray_cluster.py", ("test_multinode",)), ("recipes/multinode*", ("test_multinode",)),
    ("verl_pipe/launch/stop_request.py", ("test_multinode", "test_zz_signals")),
    ("verl_pipe/launch/teardown.py", ("test_zz_signals", "test_multinode")),
    ("verl_pipe/main_grpo.py", ("test_zz_signals", "test_multinode")),
    ("verl_pipe/launch/launcher.py", ("test_zz_signals", "test_multinode")),
    ("verl_pipe/launch/ray_start.py", ("test_zz_signals", "test_multinode", *CORE_E2E)),
    ("verl_pipe/launch/prepare.py", ("test_zz_signals", *CORE_E2E)),
    ("verl_pipe/launch/task_runner.py", ("test_zz_signals", "test_multinode", "test_faults")),
    ("verl_pipe/launch/session.py", CORE_E2E),
    ("verl_pipe/launch/replay.py", ("test_doctor", "test_pipeline", "test_multiturn", "test_learning")),
    ("verl_pipe/doctor/*", ("test_doctor",)),
    ("verl_pipe/rollout/multiturn.py", ("test_multiturn",)), ("verl_pipe/rollout/turns.py", ("test_multiturn",)),
    ("verl_pipe/rollout/tool_agent.py", ()),  # the GPU tool recipe's agent loop: unit-tested only (no CPU e2e runs it)
    ("verl_pipe/assets/multiturn_env.py", ("test_multiturn",)),
    ("recipes/*multiturn*", ("test_multiturn",)), ("recipes/lib/*", ("test_multiturn",)),
    ("recipes/extension_example/*", ("test_zz_dapo",)), ("recipes/tiny_cpu_extension_example.yaml", ("test_zz_dapo",)),
    ("verl_pipe/rollout/replicas.py", ("test_faults", "test_replicas", "test_multinode")),
    # the shipped default's exactness: its mini-batch order, its fill, the trainer that applies them, its config
    ("verl_pipe/core/minibatch_order.py", ("test_default_exact", "test_verl_exact")),
    ("verl_pipe/core/release.py", ("test_default_exact", "test_pipeline")),
    ("verl_pipe/trainer/pipe_trainer.py", (*CORE_E2E, "test_zz_kl_loss", "test_default_exact")),
    ("verl_pipe/trainer/knobs.py", (*CORE_E2E, "test_default_exact")),
    ("conf/rolloutpipe_trainer.yaml", (*CORE_E2E, "test_default_exact")),
    ("recipes/tiny_cpu_chain.yaml", ("test_default_exact",)),
    ("verl_pipe/core/frontier.py", ("test_pipeline", "test_replicas", "test_multiturn")),
    ("verl_pipe/core/*", (*CORE_E2E, "test_replicas")), ("verl_pipe/rollout/*", (*CORE_E2E, "test_replicas")),
    ("verl_pipe/trainer/whitening.py", ("test_pipeline", "test_zz_kl_loss")),
    ("verl_pipe/trainer/*", (*CORE_E2E, "test_zz_kl_loss")), ("verl_pipe/estimators.py", ("test_pipeline",)),
    ("verl_pipe/assets/*", ("test_learning", "test_pipeline")),
    ("verl_pipe/platform/*", (*CORE_E2E, "test_replicas")),
    ("verl_pipe/*", CORE_E2E), ("conf/*", CORE_E2E), ("recipes/*", CORE_E2E), ("hydra_plugins/*", CORE_E2E),
    ("pyproject.toml", (*CORE_E2E, "test_bench_smoke")), ("constraints/*", (*CORE_E2E, "test_bench_smoke")),
    ("Makefile", ()), ("tools/*", ()),
]


def e2e_modules() -> list[str]:
    return sorted(p.stem for p in E2E.glob("test_*.py"))


def modules_for(path: str) -> tuple[str, ...]:
    """The e2e modules a change to ``path`` (relative to the repository) touches."""
    if path == "tests/e2e/conftest.py":
        return tuple(e2e_modules())
    if path.startswith("tests/e2e/test_") and path.endswith(".py"):
        return (Path(path).stem,)
    for pattern, modules in RULES:
        if fnmatch.fnmatch(path, pattern):
            return modules
    return ()


def _git(*args: str) -> list[str]:
    out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    return [line for line in out.stdout.splitlines() if line.strip()] if out.returncode == 0 else []


def default_base() -> str:
    return "origin/main" if _git("rev-parse", "--verify", "-q", "origin/main") else "main"


def changed_files(base: str) -> list[str]:
    merge_base = (_git("merge-base", "HEAD", base) or [base])[0]
    files = set(_git("diff", "--name-only", merge_base)) | set(_git("ls-files", "--others", "--exclude-standard"))
    return sorted(files)


def plan(files: list[str]) -> dict[str, list[str]]:
    """{e2e module: the changed files that bring it in}, modules that exist only."""
    existing = set(e2e_modules())
    out: dict[str, list[str]] = {}
    for f in files:
        for m in modules_for(f):
            if m in existing:
                out.setdefault(m, []).append(f)
    return dict(sorted(out.items()))


def _locked(cmd: list[str]) -> list[str]:
    lock = os.environ.get("VERL_PIPE_RAY_LOCK", "/tmp/verl_pipe_ray.lock")
    return ["flock", lock, *cmd] if shutil.which("flock") else cmd


BURN = "while True: pass"  # one busy core, as long as it lives


@contextlib.contextmanager
def burning(n: int):
    """``n`` processes that each burn a core while the block runs; all gone when it ends, however it ends."""
    procs = [subprocess.Popen([sys.executable, "-c", BURN]) for _ in range(n)]
    try:
        yield procs
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", default=None, help="the branch the change is against (default: origin/main, else main)")
    ap.add_argument("--dry-run", action="store_true", help="print what would run")
    ap.add_argument("--no-unit", action="store_true", help="skip the non-e2e suite")
    ap.add_argument("--burn", type=int, default=0, metavar="N",
                    help="run the non-e2e suite beside N processes that each burn a core (default 0)")
    args = ap.parse_args(argv)
    if args.burn < 0:
        ap.error(f"--burn {args.burn}: the number of burning processes must be >= 0")
    base = args.base or default_base()
    files = changed_files(base)
    todo = plan(files)
    print(f"[check] {len(files)} file(s) changed against {base}; e2e modules: "
          + (", ".join(f"{m} ({len(fs)} file(s), e.g. {fs[0]})" for m, fs in todo.items()) or "none"), flush=True)
    py = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    runs = [] if args.no_unit else [(py + ["-m", "not e2e", "tests"], args.burn)]
    runs += [(_locked(py + [f"tests/e2e/{m}.py"]), 0) for m in todo]
    for cmd, burn in runs:
        print(f"[check] {' '.join(cmd)}" + (f" (beside {burn} burning process(es))" if burn else ""), flush=True)
        if args.dry_run:
            continue
        with burning(burn):
            rc = subprocess.run(cmd, cwd=ROOT).returncode
        if rc != 0:
            print(f"[check] failed (exit {rc}): {' '.join(cmd)}", flush=True)
            return rc
    return 0


if __name__ == "__main__":
    sys.exit(main())
