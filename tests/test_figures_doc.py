"""docs/figures.md lists every figure of the README and docs/ with the JSON or log it comes from: every repository
path it names exists (a renamed or deleted artifact, or a mistyped path, fails here). Paths in its commands that a
rerun would write (a DATE, NAME, RUN or MACHINE placeholder) are not artifacts yet and are left out, and so are files
removed from the tree that a page cites from git history (`git show COMMIT:PATH`, listed in docs/bench/REMOVED.tsv)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ROOT / "docs" / "figures.md"
PATH = re.compile(r"(?<![\w/.:-])((?:docs|tests|conf|tools|verl_pipe|recipes)/[\w./*-]*[\w/*])")  # `git show C:PATH`: left out
PLACEHOLDER = re.compile(r"DATE|NAME|RUN|MACHINE")


def named_paths(text: str) -> list[str]:
    """The repository paths a markdown text names, placeholders left out, in order of first appearance."""
    seen = {}
    for m in PATH.finditer(text):
        if not PLACEHOLDER.search(m.group(1)):
            seen.setdefault(m.group(1), None)
    return list(seen)


def missing(paths: list[str]) -> list[str]:
    out = []
    for p in paths:
        found = any(ROOT.glob(p)) if "*" in p else (ROOT / p).exists()
        if not found:
            out.append(p)
    return out


def test_every_path_named_in_figures_md_exists():
    paths = named_paths(FIGURES.read_text())
    # the page names the bench JSONs, the logs and the tests that check the figures
    assert "docs/bench/bench_2026-11-30.json" in paths and "tests/test_readme_figures.py" in paths
    assert any(p.startswith("docs/bench/logs/") for p in paths)
    assert missing(paths) == [], "docs/figures.md names paths that do not exist in the repository"


def test_a_missing_or_placeholder_path_is_told_apart():
    text = ("`docs/bench/bench_2026-11-30.json` → `targets`; `docs/bench/logs/nope_2026-12-02.log`; "
            "`--out docs/bench/quick_DATE.json`; `docs/bench/trainer_gap_*_steps_2026-12-01.json.gz`; "
            "`git show 3ab4b35:docs/bench/logs/pyspy_2026-12-02/`")
    paths = named_paths(text)
    assert "docs/bench/quick_DATE.json" not in paths and not any("pyspy" in p for p in paths)
    assert missing(paths) == ["docs/bench/logs/nope_2026-12-02.log"]


def test_the_readme_and_metrics_point_to_figures_md():
    assert "docs/figures.md" in (ROOT / "README.md").read_text()
    assert "figures.md" in (ROOT / "docs" / "metrics.md").read_text()


def test_every_artifact_the_docs_name_is_committed_not_just_on_disk():
    """A log or JSON present here but ignored by git (``*.log`` is ignored; bench logs are force-added) exists in
    this tree and not in a clean checkout: CI's figures test fails there. Every docs/bench path the README or a
    docs page names must be tracked (or not ignored, i.e. about to be committed)."""
    import subprocess

    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    texts = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    named = sorted({p for f in texts for p in named_paths(f.read_text()) if p.startswith("docs/bench/")
                    and "*" not in p and (ROOT / p).is_file()})
    ignored = subprocess.run(["git", "check-ignore", "--no-index", "--stdin"], cwd=ROOT, input="\n".join(named),
                             capture_output=True, text=True).stdout.split()
    tracked = set(subprocess.run(["git", "ls-files", "--", *ignored], cwd=ROOT, capture_output=True,
                                 text=True).stdout.split()) if ignored else set()
    assert [p for p in ignored if p not in tracked] == [], "ignored by git, so missing from a clean checkout: git add -f"
