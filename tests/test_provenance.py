"""Provenance that survives: every committed bench or learning JSON names code that can be checked out.

A run records HEAD and the tree it ran (lab/verl_pipe_lab/bench/provenance.py ``git_state``): a commit amended or rebased
after its run leaves main's history, and then only the tree hash (content-addressed, the same in every clone) says
what ran. A JSON that cites a commit absent from main's history must carry that tree hash beside it, or a
``provenance_note`` saying what is known of that commit's tree.
"""

import gzip
import json
import subprocess
from pathlib import Path

import pytest

from verl_pipe_lab.bench import provenance

ROOT = Path(__file__).resolve().parent.parent


def _git(*args, cwd=ROOT) -> str:
    return subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True, check=True).stdout.strip()


def _commits(obj, out: list, where: dict | None = None):
    """(commit, the dict that holds it) for every value of a key named "commit"."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k == "commit" and isinstance(v, str) and v:
                out.append((v, obj))
            else:
                _commits(v, out, obj)
    elif isinstance(obj, list):
        for v in obj:
            _commits(v, out, where)
    return out


def _tracked_jsons() -> list[str]:
    return [p for p in _git("ls-files", "--", "docs/bench").splitlines() if p.endswith((".json", ".json.gz"))]


def _load(path: str):
    raw = (ROOT / path).read_bytes()
    return json.loads(gzip.decompress(raw) if path.endswith(".gz") else raw)


@pytest.mark.skipif(subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--is-shallow-repository"],
                                   capture_output=True, text=True).stdout.strip() != "false",
                    reason="needs the whole history (a shallow clone lacks the commits the JSONs cite)")
def test_every_committed_json_cites_code_that_can_be_checked_out():
    bad = []
    for path in _tracked_jsons():
        data = _load(path)
        notes = data.get("provenance_note", {}) if isinstance(data, dict) else {}
        for commit, holder in _commits(data, []):
            known = subprocess.run(["git", "-C", str(ROOT), "merge-base", "--is-ancestor", commit, "HEAD"],
                                   capture_output=True).returncode == 0
            if not (known or holder.get("index_tree") or commit in notes or commit[:8] in notes):
                bad.append(f"{path}: {commit[:10]}")
    assert not bad, f"commits absent from main's history, with no tree hash or provenance_note: {sorted(set(bad))}"


def test_git_state_records_the_tree_that_ran(tmp_path, monkeypatch):
    """Clean: the index's tree is HEAD's. An unstaged change: dirty, its diff hashed. Staged: another tree hash."""
    repo = tmp_path / "repo"
    repo.mkdir()
    for args in (["init", "-q"], ["config", "user.email", "t@t"], ["config", "user.name", "t"]):
        _git(*args, cwd=repo)
    (repo / "a.py").write_text("x = 1\n")
    _git("add", "a.py", cwd=repo)
    _git("commit", "-qm", "a", cwd=repo)
    monkeypatch.setattr(provenance, "ROOT", repo)
    clean = provenance.git_state()
    assert clean["commit"] == _git("rev-parse", "HEAD", cwd=repo)
    assert clean["index_tree"] == _git("rev-parse", "HEAD^{tree}", cwd=repo)
    assert (clean["dirty"], clean["diff_sha256"], clean["untracked"]) == (False, None, [])
    (repo / "a.py").write_text("x = 2\n")
    (repo / "new.py").write_text("")
    changed = provenance.git_state()
    assert changed["dirty"] and changed["diff_sha256"] and changed["untracked"] == ["new.py"]
    assert changed["index_tree"] == clean["index_tree"]  # nothing staged yet
    _git("add", "a.py", cwd=repo)
    staged = provenance.git_state()
    assert staged["dirty"] and staged["diff_sha256"] is None and staged["index_tree"] != clean["index_tree"]
