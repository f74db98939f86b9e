"""Stop controls without a cluster (verl_pipe/launch/stop_request.py): run ids nobody can guess, an id that is not one
refused by name (also by the command line, which then never connects), the launcher's stop file in a private
directory created without following links, and the stop check the TaskRunner gives the trainer. A real cluster's
request (another node's TaskRunner, no shared /tmp; an unknown id refused there; the key cleared after the run) is run
in tests/e2e/test_multinode.py."""

import os
import stat

import pytest

from verl_pipe.launch import stop_request
from verl_pipe.launch.stop_request import LocalStop, StopCheck, UnknownRunError, check_private_dir


def test_run_ids_are_random_and_a_guessable_id_is_refused():
    ids = {stop_request.new_run_id() for _ in range(100)}
    assert len(ids) == 100 and all(len(i) == 32 and int(i, 16) >= 0 for i in ids)
    for bad in ("host-123", "", None, "ABC", "0" * 31):
        with pytest.raises(UnknownRunError, match="is not a run id"):
            stop_request.request(bad)
    assert stop_request.runner_name("a" * 32) == "run-" + "a" * 32


def test_outside_a_ray_cluster_nothing_is_requested():
    run_id = stop_request.new_run_id()
    assert not stop_request.requested(run_id)
    assert not stop_request.requested(None)
    stop_request.clear(run_id)  # nothing to clear, no error


def test_the_command_refuses_what_is_not_a_run_id_without_connecting(capsys):
    assert stop_request.main(["host-123"]) == 2
    assert "is not a run id" in capsys.readouterr().err


def test_the_stop_file_is_in_a_private_directory_and_never_written_through_a_link(tmp_path):
    stop = LocalStop(parent=str(tmp_path))
    st = os.lstat(stop.dir)
    assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o700
    assert stop.dir.parent == tmp_path and stop.dir.name.startswith("verl_pipe_run_")
    assert not stop.requested()
    stop.request()
    stop.request()  # twice: still one request
    assert stop.requested() and stat.S_IMODE(os.lstat(stop.file).st_mode) == 0o600
    stop.remove()
    assert not stop.dir.exists()

    # a link where the file goes (only the owner could put it there): the request does not follow it
    stop = LocalStop(parent=str(tmp_path))
    target = tmp_path / "victim"
    os.symlink(target, stop.file)
    stop.request()
    assert not target.exists()
    stop.remove()


def test_a_directory_others_could_touch_is_refused(tmp_path):
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o755)
    os.chmod(loose, 0o755)
    with pytest.raises(PermissionError, match="mode 755, not 700"):
        check_private_dir(loose)
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    os.symlink(private, tmp_path / "link")
    with pytest.raises(PermissionError, match="not a directory"):
        check_private_dir(tmp_path / "link")
    check_private_dir(private)


def test_the_stop_check_reads_the_file_or_the_cluster_key(tmp_path):
    stop = LocalStop(parent=str(tmp_path))
    check = StopCheck(str(stop.file), stop_request.new_run_id())
    assert not check()
    stop.request()
    assert check()
    assert not StopCheck(None, None)()


def test_the_trainer_does_not_import_the_launch_layer():
    """The trainer gets its stop check from whoever builds it (the TaskRunner): verl_pipe/trainer imports nothing of
    verl_pipe/launch (the layer order, tests/test_layout.py)."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "verl_pipe" / "trainer"
    offenders = [p.name for p in root.glob("*.py") if "verl_pipe.launch" in p.read_text()]
    assert not offenders, offenders
