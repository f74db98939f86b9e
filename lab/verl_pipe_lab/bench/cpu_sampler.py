"""Where the cores go while trainer and rollout overlap: a /proc sampler of a process tree, per process kind.

On a small machine the run's own orchestration (the driver with the rollout client and the group materialization,
vLLM's HTTP server, reward and agent-loop workers, Ray's daemons) competes with the two things that should have the
cores, the trainer and the vLLM engine. This samples utime + stime of every descendant of a root process (the bench
driver) once a second, labels each by ``soak.process_kind`` (Ray's ``ray::<Actor>`` and vLLM's ``VLLM::<Proc>``
titles), and reports per kind the cores used during the intervals where both the trainer and the engine were busy.

"Both busy" is read from the samples themselves: an interval counts when the trainer kinds together used at least
``busy_cores`` and so did the engine kinds (the defaults: half a core each; a pinned side that works uses ~1). No
timeline is needed, and idle moments inside a step (the trainer waiting for a unit, the engine between waves) do
not dilute the figure.

Run as its own process (``python -m verl_pipe_lab.bench.cpu_sampler --pid PID --out FILE``), so that sampling takes
no GIL from the driver it measures; one JSON line per sample. Pure functions below take a ``/proc`` root, so tests
feed them synthetic snapshots.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

from verl_pipe_lab.bench.soak import process_kind

# verl's fused trainer worker (the actor pool's ranks) and vLLM's engine processes (scheduler and model executor),
# as process_kind labels them (docs/bench/soak_2026-12-01.json lists the kinds of a live CPU run)
TRAINER_KINDS = ("ray::WorkerDict",)
ENGINE_KINDS = ("VLLM::EngineCore", "VLLM::Worker")
BUSY_CORES = 0.5
DRIVER = "driver"  # the root process itself (the bench: rollout client, materialization, the trainer's loop)


# ---------------------------------------------------------------------------------------------- /proc


def parse_stat(text: str) -> tuple[int, int, int, str]:
    """(ppid, start time in ticks, utime + stime in ticks, comm) from a /proc/<pid>/stat line. comm is in
    parentheses and may itself hold spaces and parentheses, so the fields are counted from the last ')'."""
    head, _, rest = text.rpartition(")")
    comm = head.split("(", 1)[1] if "(" in head else head
    f = rest.split()
    # after comm: state(0) ppid(1) ... utime(11) stime(12) ... starttime(19)
    return int(f[1]), int(f[19]), int(f[11]) + int(f[12]), comm


def read_procs(root: str | Path = "/proc") -> dict[int, tuple[int, int, int, str]]:
    """Every process under ``root``: pid -> (ppid, start, ticks, comm); a process gone while reading is skipped."""
    out = {}
    for d in Path(root).iterdir():
        if not d.name.isdigit():
            continue
        try:
            out[int(d.name)] = parse_stat((d / "stat").read_text())
        except (OSError, ValueError, IndexError):
            continue
    return out


def descendants(procs: dict[int, tuple], root_pid: int) -> list[int]:
    """``root_pid`` and every process below it (by ppid), root first."""
    children: dict[int, list[int]] = {}
    for pid, p in procs.items():
        children.setdefault(p[0], []).append(pid)
    out, todo = [], [root_pid] if root_pid in procs else []
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def _cmdline(root: Path, pid: int) -> list[str]:
    try:
        raw = (root / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    # Ray and vLLM rewrite argv into a title padded with NULs or spaces; keep the non-empty parts
    return [p for p in raw.decode(errors="replace").split("\0") if p.strip()]


def snapshot(root_pid: int, root: str | Path = "/proc", exclude: tuple[int, ...] = ()) -> list[list]:
    """[[pid, start, kind, ticks], ...] of ``root_pid``'s tree now (``root_pid`` is the ``DRIVER`` kind)."""
    root = Path(root)
    procs = read_procs(root)
    out = []
    for pid in descendants(procs, root_pid):
        if pid in exclude:
            continue
        _, start, ticks, comm = procs[pid]
        kind = DRIVER if pid == root_pid else process_kind(comm, _cmdline(root, pid))
        out.append([pid, start, kind, ticks])
    return out


# ---------------------------------------------------------------------------------------------- analysis


def interval_cores(a: dict, b: dict, clk_tck: float) -> dict[str, float]:
    """Cores used per kind between two samples ({"t": seconds, "procs": snapshot()}): each process's tick
    difference (one that started in between counts from zero; one that ended in between is lost) over the
    interval, summed per kind, with the kind it has at the later sample."""
    dt = b["t"] - a["t"]
    if dt <= 0:
        return {}
    before = {(p[0], p[1]): p[3] for p in a["procs"]}
    out: dict[str, float] = {}
    for pid, start, kind, ticks in b["procs"]:
        used = ticks - before.get((pid, start), 0)
        if used > 0:
            out[kind] = out.get(kind, 0.0) + used / clk_tck / dt
    return out


def overlap_cores(samples: list[dict], windows: list[tuple[float, float]] | None = None,
                  clk_tck: float | None = None, trainer_kinds=TRAINER_KINDS, engine_kinds=ENGINE_KINDS,
                  busy_cores: float = BUSY_CORES) -> dict:
    """Mean cores per kind over the intervals where trainer and engine were both busy, among the intervals that lie
    inside one of ``windows`` ([start, end] seconds, e.g. one mode's steps; None: all). Returns {"intervals",
    "seconds", "cores": {kind: cores}, "orchestration_cores": everything but trainer and engine kinds}; empty
    cores when no interval qualifies."""
    clk_tck = clk_tck or os.sysconf("SC_CLK_TCK")
    total: dict[str, float] = {}
    seconds, n = 0.0, 0
    for a, b in zip(samples, samples[1:]):
        if windows is not None and not any(s <= a["t"] and b["t"] <= e for s, e in windows):
            continue
        cores = interval_cores(a, b, clk_tck)
        trainer = sum(v for k, v in cores.items() if k in trainer_kinds)
        engine = sum(v for k, v in cores.items() if k in engine_kinds)
        if trainer < busy_cores or engine < busy_cores:
            continue
        dt = b["t"] - a["t"]
        for k, v in cores.items():
            total[k] = total.get(k, 0.0) + v * dt
        seconds += dt
        n += 1
    mean = {k: v / seconds for k, v in sorted(total.items(), key=lambda kv: -kv[1])} if seconds else {}
    side = set(trainer_kinds) | set(engine_kinds)
    out = {"intervals": n, "seconds": seconds, "cores": mean,
           "orchestration_cores": sum(v for k, v in mean.items() if k not in side)}
    if windows:
        per_step = step_cpu_seconds(samples, windows, clk_tck)
        out["cpu_s_per_step"] = per_step
        out["orchestration_cpu_s_per_step"] = sum(v for k, v in per_step.items() if k not in side)
    return out


def step_cpu_seconds(samples: list[dict], windows: list[tuple[float, float]], clk_tck: float | None = None
                     ) -> dict[str, float]:
    """CPU-seconds per kind per window (e.g. per step), over the whole windows, busy or not: each interval's CPU
    counts by the share of it that lies inside a window. Unlike cores during the overlap, this does not depend on
    what else runs on the host: it is the work each kind does for a step."""
    clk_tck = clk_tck or os.sysconf("SC_CLK_TCK")
    total: dict[str, float] = {}
    for a, b in zip(samples, samples[1:]):
        dt = b["t"] - a["t"]
        inside = sum(max(0.0, min(e, b["t"]) - max(s, a["t"])) for s, e in windows)
        if dt <= 0 or inside <= 0:
            continue
        for k, v in interval_cores(a, b, clk_tck).items():
            total[k] = total.get(k, 0.0) + v * inside
    return {k: v / len(windows) for k, v in sorted(total.items(), key=lambda kv: -kv[1])}


def format_overlap(per_mode: dict[str, dict], top: int = 8) -> str:
    """A table: a row per process kind (the ``top`` busiest, the rest summed), a column per mode, cores used while
    trainer and engine were both busy."""
    modes = [m for m, r in per_mode.items() if r.get("cores")]
    if not modes:
        return ""
    kinds: dict[str, float] = {}
    for m in modes:
        for k, v in per_mode[m]["cores"].items():
            kinds[k] = max(kinds.get(k, 0.0), v)
    shown = [k for k, _ in sorted(kinds.items(), key=lambda kv: -kv[1])[:top]]
    lines = ["== cores per process kind while trainer and vLLM engine are both busy (/proc, 1 s samples)",
             f"{'process kind':<32}" + "".join(f"{m:>12}" for m in modes)]
    for k in shown:
        lines.append(f"{k:<32}" + "".join(f"{per_mode[m]['cores'].get(k, 0.0):>12.2f}" for m in modes))
    rest = [sum(v for k, v in per_mode[m]["cores"].items() if k not in shown) for m in modes]
    if any(rest):
        lines.append(f"{'(other kinds)':<32}" + "".join(f"{v:>12.2f}" for v in rest))
    lines.append(f"{'orchestration (not trainer/engine)':<32}"
                 + "".join(f"{per_mode[m]['orchestration_cores']:>12.2f}" for m in modes))
    lines.append(f"{'seconds of overlap sampled':<32}" + "".join(f"{per_mode[m]['seconds']:>12.0f}" for m in modes))
    if all("orchestration_cpu_s_per_step" in per_mode[m] for m in modes):
        lines.append(f"{'orchestration CPU-s per step':<32}"
                     + "".join(f"{per_mode[m]['orchestration_cpu_s_per_step']:>12.2f}" for m in modes))
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- the process


class SamplerProcess:
    """The sampler as a child process of the bench (start/stop), its samples read back from its output file."""

    def __init__(self, root_pid: int, out: str | Path, interval_s: float = 1.0):
        self.root_pid, self.out, self.interval_s = root_pid, Path(out), interval_s
        self._proc = None

    def start(self) -> None:
        import subprocess

        self._proc = subprocess.Popen([sys.executable, "-m", "verl_pipe_lab.bench.cpu_sampler", "--pid",
                                       str(self.root_pid), "--out", str(self.out), "--interval", str(self.interval_s)])

    def stop(self) -> list[dict]:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except Exception:
                self._proc.kill()
            self._proc = None
        return load_samples(self.out)


def load_samples(path: str | Path) -> list[dict]:
    """The samples a sampler wrote (one JSON object per line; a line cut short by the stop is dropped)."""
    out = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
    except OSError:
        return []
    return out


def run(root_pid: int, out: str, interval_s: float, proc_root: str = "/proc") -> None:
    me = os.getpid()
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    with open(out, "a") as f:
        while not stop and Path(proc_root, str(root_pid)).exists():
            t0 = time.time()
            f.write(json.dumps({"t": t0, "procs": snapshot(root_pid, proc_root, exclude=(me,))}) + "\n")
            f.flush()
            time.sleep(max(0.0, interval_s - (time.time() - t0)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m verl_pipe_lab.bench.cpu_sampler", description=__doc__.split("\n\n")[0])
    ap.add_argument("--pid", type=int, required=True, help="the root of the process tree to sample")
    ap.add_argument("--out", required=True, help="append one JSON line per sample here")
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between samples")
    args = ap.parse_args(argv)
    run(args.pid, args.out, args.interval)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
