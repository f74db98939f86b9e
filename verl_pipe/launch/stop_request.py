"""Asking a run to stop before its next step: a file on the launcher's node, and a key in the Ray cluster's GCS
key-value store that reaches the training loop wherever it runs.

The launcher makes a private directory for its stop file (``LocalStop``: created by ``mkdtemp``, 0700 and owned by
the user, refused otherwise) and creates the file there without following links (``O_CREAT | O_EXCL | O_NOFOLLOW``),
so another local user can neither make the run stop nor have the launcher write through a link of theirs. On a
multi-node cluster the TaskRunner, which runs the training loop, may be on another machine and never see that file;
the GCS is the one store every node reads, so the same request also goes there as ``stop/<run id>``. The TaskRunner
gives the trainer a ``StopCheck`` of both, read before every step: the step in progress completes (and is
checkpointed when ``trainer.save_freq`` says so), no new one starts.

The run id is 128 random bits (``new_run_id``), printed by the launcher at start; the TaskRunner is a named actor
under it (``runner_name``), so a request for an id no running run has is refused (``UnknownRunError``: a typo, or a
run that ended), and a key can never be meant for a later run. The launcher clears the key on every way out
(``clear``); a key left by a launcher that was killed names an id no later run gets. From any machine that reaches
the cluster:

    python -m verl_pipe.launch.stop_request <run id> [--address <head>:6379]    # default: RAY_ADDRESS, else auto

Ray private APIs: ``ray.experimental.internal_kv._internal_kv_put / _exists / _del`` (the GCS key-value store of the
connected cluster; listed and checked in tests/test_ray_private_api.py).
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import shutil
import stat
import sys
import tempfile
from pathlib import Path

NAMESPACE = "verl_pipe"
_RUN_ID = re.compile(r"[0-9a-f]{32}")


class UnknownRunError(ValueError):
    """No running run has this id on the cluster."""


def new_run_id() -> str:
    """128 random bits, hex: nobody else can guess a run's id."""
    return secrets.token_hex(16)


def _check_id(run_id) -> str:
    if not isinstance(run_id, str) or not _RUN_ID.fullmatch(run_id):
        raise UnknownRunError(f"stop request: {run_id!r} is not a run id (32 hex digits, as the launcher prints it: "
                              "'[verl_pipe] run id <id>')")
    return run_id


def _key(run_id: str) -> bytes:
    return f"stop/{_check_id(run_id)}".encode()


def runner_name(run_id: str) -> str:
    """The run's TaskRunner actor's name (namespace ``NAMESPACE``): it lives as long as the run."""
    return f"run-{_check_id(run_id)}"


def running(run_id: str) -> bool:
    """Whether a run with this id runs on the connected cluster (its TaskRunner is alive)."""
    import ray

    name = runner_name(run_id)
    try:
        ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        return False
    return True


def request(run_id: str, known: bool = False) -> None:
    """Asks run ``run_id`` to stop before its next step; UnknownRunError if no such run is running on the cluster
    (``known``: the run's own launcher asks, no look-up). Ray must be initialized (connected to the run's cluster)."""
    from ray.experimental import internal_kv

    _check_id(run_id)
    if not known and not running(run_id):
        raise UnknownRunError(f"no run with id {run_id} is running on this cluster (mistyped, or it has ended); "
                              "nothing was asked")
    internal_kv._internal_kv_put(_key(run_id), b"1", overwrite=True, namespace=NAMESPACE)


def requested(run_id: str | None) -> bool:
    """Whether a stop of run ``run_id`` was asked for; False without a run id or outside a Ray cluster."""
    import ray

    if not run_id or not ray.is_initialized():
        return False
    from ray.experimental import internal_kv

    return bool(internal_kv._internal_kv_exists(_key(run_id), namespace=NAMESPACE))


def clear(run_id: str | None) -> None:
    """Drops run ``run_id``'s request (the run saw it, or ended), where Ray is initialized."""
    import ray

    if run_id and ray.is_initialized():
        from ray.experimental import internal_kv

        internal_kv._internal_kv_del(_key(run_id), namespace=NAMESPACE)


class LocalStop:
    """The launcher's stop file, in a directory of its own: ``mkdtemp`` creates it atomically, 0700, owned by the
    user, under the temp directory (TMPDIR); it is checked to be just that (a directory, not a link, owned by us,
    no access for others). ``request`` creates the file without following links; ``remove`` deletes the directory
    (every way out of the launcher)."""

    def __init__(self, parent: str | None = None):
        self.dir = Path(tempfile.mkdtemp(prefix="verl_pipe_run_", dir=parent))
        check_private_dir(self.dir)
        self.file = self.dir / "stop"

    def request(self) -> None:
        try:
            fd = os.open(self.file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            return  # asked already
        os.close(fd)

    def requested(self) -> bool:
        return self.file.exists()

    def remove(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)  # rmtree does not follow links


def check_private_dir(path: Path) -> None:
    """Refuses a directory that another user could write to or swap: it must be a real directory (not a link),
    owned by this user, with no group or other permissions."""
    st = os.lstat(path)
    problem = (None if stat.S_ISDIR(st.st_mode) else "not a directory (a link?)") \
        or (None if st.st_uid == os.geteuid() else f"owned by uid {st.st_uid}, not {os.geteuid()}") \
        or (None if not st.st_mode & 0o077 else f"mode {stat.S_IMODE(st.st_mode):o}, not 700")
    if problem:
        raise PermissionError(f"the run's stop directory {path} is {problem}: refused")


class StopCheck:
    """What the TaskRunner gives the trainer as its stop check: the launcher's stop file exists, or the run's key is
    in the cluster's GCS (then cleared: the run saw it)."""

    def __init__(self, stop_file: str | None, run_id: str | None):
        self.stop_file, self.run_id = stop_file, run_id

    def __call__(self) -> bool:
        if self.stop_file and os.path.exists(self.stop_file):
            return True
        if self.run_id and requested(self.run_id):
            clear(self.run_id)
            return True
        return False


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_id", help="the run id the launcher printed ('[verl_pipe] run id ...')")
    ap.add_argument("--address", default=None, help="the cluster's head, host:port (default: RAY_ADDRESS, else auto)")
    args = ap.parse_args(argv)
    try:
        _check_id(args.run_id)
    except UnknownRunError as e:
        print(f"[verl_pipe] {e}", file=sys.stderr, flush=True)
        return 2
    import ray

    ray.init(address=args.address or os.environ.get("RAY_ADDRESS") or "auto", logging_level="ERROR",
             log_to_driver=False)
    try:
        request(args.run_id)
    except UnknownRunError as e:
        print(f"[verl_pipe] {e}", file=sys.stderr, flush=True)
        return 2
    finally:
        ray.shutdown()
    print(f"[verl_pipe] stop requested for run {args.run_id}: it starts no new step", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
