"""The checkout as a fresh clone holds it: the files git tracks, copied without the checkout's build leftovers."""

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def has_git_checkout() -> bool:
    return shutil.which("git") is not None and (ROOT / ".git").exists()


def copy_tracked(dest: Path) -> Path:
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True).stdout
    for rel in filter(None, files.decode().split("\0")):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest
