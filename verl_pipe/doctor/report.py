"""The doctor's report: one verdict per check, the stack run's phases, written as JSON and as a readable summary.

Pure standard library (a torch-only machine writes it too). A check is ``pass``, ``fail``, ``warn`` (works, with
something to know) or ``skip`` (not run here, and why: no GPU, a package missing that another check reports). A
failed check carries ``send_back``: what to send with the report when asking for help. The verdict is ``fail``
with any failure, ``incomplete`` when a check that the requested run needs was skipped, else ``pass``.
"""

from __future__ import annotations

import json
import platform
import socket
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

STATUSES = ("pass", "fail", "warn", "skip")
JSON_NAME = "doctor.json"
SUMMARY_NAME = "doctor.md"
# Sent back with every failure: the report itself, and the stack run's own output when it ran.
ALWAYS_SEND = f"the report directory ({JSON_NAME}, {SUMMARY_NAME}, stack.log when present)"


@dataclass
class Check:
    name: str
    group: str  # environment, versions, device, stack
    status: str
    detail: str = ""
    data: dict = field(default_factory=dict)
    send_back: str | None = None  # for a failure: what to send besides the report
    needed: bool = True  # a skip of a needed check makes the verdict incomplete
    seconds: float | None = None

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"check {self.name!r}: status {self.status!r}; allowed: {', '.join(STATUSES)}")
        if self.status == "fail" and not self.send_back:
            self.send_back = ALWAYS_SEND


@dataclass
class Report:
    argv: list[str]
    gpu: bool
    checks: list[Check] = field(default_factory=list)
    phases: dict = field(default_factory=dict)  # the stack run's timings (seconds)
    started: float = field(default_factory=time.time)

    def add(self, check: Check) -> Check:
        self.checks.append(check)
        return check

    def extend(self, checks) -> None:
        for c in checks:
            self.add(c)

    @property
    def verdict(self) -> str:
        if any(c.status == "fail" for c in self.checks):
            return "fail"
        if any(c.status == "skip" and c.needed for c in self.checks):
            return "incomplete"
        return "pass"

    def to_dict(self) -> dict:
        return {"tool": "python -m verl_pipe.doctor", "argv": self.argv, "gpu": self.gpu, "verdict": self.verdict,
                "host": socket.gethostname(), "python": sys.version.split()[0], "platform": platform.platform(),
                "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(self.started)),
                "wall_s": round(time.time() - self.started, 3),
                "counts": {s: sum(c.status == s for c in self.checks) for s in STATUSES},
                "checks": [asdict(c) for c in self.checks], "phases": self.phases}

    def write(self, out_dir: Path) -> tuple[Path, Path]:
        out_dir.mkdir(parents=True, exist_ok=True)
        data = self.to_dict()
        js, md = out_dir / JSON_NAME, out_dir / SUMMARY_NAME
        js.write_text(json.dumps(data, indent=1, default=str) + "\n")
        md.write_text(summary(data))
        return js, md


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def summary(data: dict) -> str:
    """The readable report (Markdown): the verdict, a table of the checks, the phases, what to send back."""
    mark = {"pass": "ok", "fail": "FAIL", "warn": "warn", "skip": "skip"}
    lines = [f"# verl_pipe doctor: {data['verdict'].upper()}", "",
             f"`{' '.join(data['argv'])}` on {data['host']} ({data['platform']}, Python {data['python']}), "
             f"{data['started']}, {data['wall_s']:.0f} s. "
             + ", ".join(f"{n} {s}" for s, n in data["counts"].items() if n), "",
             "| check | group | result | detail |", "|---|---|---|---|"]
    for c in data["checks"]:
        took = f" ({c['seconds']:.1f} s)" if c.get("seconds") else ""
        lines.append(f"| {c['name']} | {c['group']} | {mark[c['status']]} | {_cell(c['detail'])}{took} |")
    phases = data.get("phases") or {}
    if phases:
        lines += ["", "## Phases of the stack run (seconds)", ""]
        for key, value in phases.items():
            if key == "steps":
                for s in value:
                    lines.append(f"- step {s['step']} ({s['variant']}, unit_fill={s['unit_fill']}): "
                                 + ", ".join(f"{k} {v:.2f}" for k, v in s["timing"].items()))
            elif isinstance(value, (int, float)):
                lines.append(f"- {key}: {value:.2f}")
            elif isinstance(value, str):
                lines.append(f"- {key}: {value}")  # lists (the overrides) are in the JSON only
    failed = [c for c in data["checks"] if c["status"] == "fail"]
    if failed:
        lines += ["", "## What to send back", "",
                  f"Open an issue with {ALWAYS_SEND} attached, and for each failure:", ""]
        lines += [f"- **{c['name']}**: {c['send_back']}" for c in failed]
    return "\n".join(lines) + "\n"
