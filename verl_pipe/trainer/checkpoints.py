"""Which checkpoints are complete: a record written after verl's save, checked before a resume; a save that fails
(a full disk) ends in a clear error and leaves the previous checkpoint as it was.

One job: the completeness of ``trainer.default_local_dir/global_step_<k>`` (docs/reliability.md, "A disk that fills
during a checkpoint" and "A truncated latest checkpoint").

verl 0.9.1 writes a checkpoint's files (the actor's shards through its workers, ``data.pt``) and then
``latest_checkpointed_iteration.txt``; its resume trusts that tracker. A save cut short by a full disk raised from the
worker's ``torch.save`` (on a full disk torch's zip writer says only "file write failed") and left a partial
``global_step_<k>``; a file truncated later (a crash of the host's page cache, a copy cut short) was loaded as it was.
Here every completed save gets a completion record, ``COMPLETE`` in the step's folder: each file's size, written
last. A resume (``resume_mode=auto``) takes the newest step folder, at or below the tracker's step, whose files match
their record; a folder without a record or with a file of another size is named in a log line and passed over; with
none complete it refuses, naming the folders. A directory with no record at all (checkpoints of an earlier verl_pipe)
is left to verl's own choice.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
from collections.abc import Callable

COMPLETE = "verl_pipe_complete.json"  # the completion record in a step's folder
TRACKER = "latest_checkpointed_iteration.txt"  # verl's
_STEP = re.compile(r"global_step_(\d+)$")
DISK_FULL_FREE_BYTES = 16 << 20  # after a failed save, less free space than this on its file system: a full disk


class CheckpointError(RuntimeError):
    """No complete checkpoint to resume from, or a save that failed; the message names the folders."""


class CheckpointSaveError(CheckpointError):
    """Saving a checkpoint failed (e.g. the disk is full); the previous checkpoint is left as it was."""


def step_dir(root: str, step: int) -> str:
    return os.path.join(os.path.abspath(str(root)), f"global_step_{step}")


def _files(folder: str) -> dict[str, int]:
    out = {}
    for base, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(base, name)
            rel = os.path.relpath(path, folder)
            if not rel.startswith(COMPLETE) and not os.path.islink(path):
                out[rel] = os.path.getsize(path)
    return out


def record_complete(folder: str) -> None:
    """Writes the completion record of a step folder whose save has just returned: every file and its size."""
    files = _files(folder)
    tmp = os.path.join(folder, COMPLETE + ".tmp")
    with open(tmp, "w") as f:
        json.dump({"files": files}, f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(folder, COMPLETE))


def problem(folder: str) -> str | None:
    """Why ``folder`` is not a complete checkpoint (None: it is)."""
    path = os.path.join(folder, COMPLETE)
    if not os.path.isdir(folder):
        return "no such folder"
    try:
        with open(path) as f:
            recorded = json.load(f)["files"]
    except FileNotFoundError:
        return f"no completion record ({COMPLETE}): its save did not finish"
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"unreadable completion record ({type(e).__name__}: {e})"
    if not recorded:
        return "its completion record lists no file"
    for rel, size in sorted(recorded.items()):
        full = os.path.join(folder, rel)
        if not os.path.isfile(full):
            return f"{rel} is missing"
        actual = os.path.getsize(full)
        if actual != size:
            return f"{rel} has {actual} bytes, {size} when it was written"
    return None


def _tracked_step(root: str) -> int | None:
    try:
        with open(os.path.join(root, TRACKER)) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def step_folders(root: str) -> list[tuple[int, str]]:
    """(step, folder) of every ``global_step_<k>`` under ``root``, newest first."""
    if not os.path.isdir(root):
        return []
    found = [(int(m.group(1)), os.path.join(root, name)) for name in os.listdir(root)
             if (m := _STEP.match(name)) and os.path.isdir(os.path.join(root, name))]
    return sorted(found, reverse=True)


def resume_folder(root: str) -> tuple[str | None, list[tuple[str, str]]]:
    """The folder a ``resume_mode=auto`` run resumes from and the newer ones passed over, with why.

    (None, []) when verl decides: no checkpoint at all, or none with a completion record (written before these
    records existed). Raises CheckpointError when there are checkpoints but none is complete, naming each."""
    root = os.path.abspath(str(root))
    folders = step_folders(root)
    if not any(os.path.exists(os.path.join(f, COMPLETE)) for _, f in folders):
        return None, []
    tracked = _tracked_step(root)
    skipped = []
    for step, folder in folders:
        if tracked is not None and step > tracked:
            continue  # a save after the tracker's: verl never resumes past it either
        why = problem(folder)
        if why is None:
            return folder, skipped
        skipped.append((folder, why))
    listed = "; ".join(f"{f}: {why}" for f, why in skipped) or f"no global_step_<k> at or below {tracked}"
    raise CheckpointError(f"no complete checkpoint to resume from in {root} ({listed}). Restore the files, or "
                          "start afresh with trainer.resume_mode=disable (or another trainer.default_local_dir)")


def disk_full(exc: BaseException, folder: str) -> bool:
    """Whether a failed save ran out of disk: ENOSPC / EDQUOT anywhere in the error's chain or text (a Ray error
    carries the worker's as text), or, since torch's zip writer says only "file write failed", less than
    DISK_FULL_FREE_BYTES left on the folder's file system."""
    seen, e = set(), exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        text = str(e)
        if "No space left on device" in text or "Disk quota exceeded" in text or "[Errno 28]" in text:
            return True
        e = getattr(e, "cause", None) or e.__cause__ or e.__context__
    try:
        probe = folder
        while not os.path.exists(probe):
            probe = os.path.dirname(probe)
        return shutil.disk_usage(probe).free < DISK_FULL_FREE_BYTES
    except OSError:
        return False


def guarded_save(save: Callable[[], None], root: str, step: int) -> None:
    """Runs ``save`` (verl's ``_save_checkpoint`` of ``step`` under ``root``) and records the folder complete.

    A save that raises: a folder this save created is removed (it holds part of a checkpoint), one that existed
    before is left (its completion record, if any, still checks its files at a resume), and CheckpointSaveError names
    the folder, the cause (a full disk said so) and the newest complete checkpoint left."""
    folder = step_dir(root, step)
    existed = os.path.exists(folder)
    try:
        save()
        record_complete(folder)
    except Exception as e:
        full = disk_full(e, folder)
        removed = ""
        if not existed and os.path.isdir(folder):
            shutil.rmtree(folder, ignore_errors=True)
            removed = "; its partial folder was removed"
        left = next((f for _, f in step_folders(os.path.abspath(str(root))) if problem(f) is None), None)
        cause = "the disk is full (No space left on device)" if full else "it raised"
        raise CheckpointSaveError(
            f"saving the checkpoint of step {step} to {folder} failed: {cause}: {type(e).__name__}: "
            f"{_last_line(e)}{removed}. The latest complete checkpoint is "
            f"{left or 'none'}{' (left as it was)' if left else ''}; "
            + ("free space on that file system (or set trainer.default_local_dir elsewhere) and "
               if full else "") + "resume with trainer.resume_mode=auto") from e


def _last_line(exc: BaseException) -> str:
    lines = [ln for ln in str(exc).splitlines() if ln.strip()]
    return lines[-1].strip() if lines else ""
