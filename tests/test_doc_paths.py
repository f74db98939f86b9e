"""What the README and docs/*.md cite exists in this tree: every repository path (a bench JSON, a log, a chart, a
test, a module's file), every relative link, and every module named by its dotted name (``verl_pipe.x.y``, with the
function or class after it where one is named) or by its file (``core/variants.py``, ``bench/learn.py:compare``).
Paths that a command would write (after ``--out``, ``--charts`` or ``tee``, or holding a DATE / NAME / RUN / MACHINE
placeholder) are not artifacts yet and are left out. docs/bench/REMOVED.tsv names what was removed and where git
keeps it: a page that needs a removed file cites it as ``git show COMMIT:PATH``, which this test does not check.

docs/layout.md is checked against the tree: every module of the packages is named there once, by its path, and
every path it names exists. Pure: reads files only."""

import glob
import re
import subprocess
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# the packages whose modules the docs name; verl_pipe_lab is the lab's package once it moves out of verl_pipe
# each package's directory: the runtime at the top, the lab in lab/ (a distribution of its own)
PKG_DIRS = {p: ROOT / d for p, d in (("verl_pipe", "verl_pipe"), ("verl_pipe_lab", "lab/verl_pipe_lab"))
            if (ROOT / d).is_dir()}
PACKAGES = list(PKG_DIRS)
TOP = ("docs", "tests", "conf", "tools", "recipes", "constraints", "hydra_plugins", "verl_pipe", "verl_pipe_lab")
PATH = re.compile(r"(?<![\w/.:$-])((?:%s)/[\w./*{},\[\]-]*[\w/*}\]])" % "|".join(TOP))
# a module's file named relative to its package (core/variants.py, bench/peer/split.py:run)
SUBPATH = re.compile(r"(?<![\w/.$-])((?:[a-z_]+/)+[a-z_0-9]+\.py)(?::(\w+))?")
DOTTED = re.compile(r"(?<![\w.])((?:%s)(?:\.\w+)+)" % "|".join(PACKAGES or ["verl_pipe"]))
LINK = re.compile(r"\]\(([^)\s]+)\)")
OUTPUT = re.compile(r"(?:--out|--out-dir|--charts|--update-doc|tee|>)\s*$")
PLACEHOLDER = re.compile(r"DATE|DAY|NAME|RUN|MACHINE|<|COMMIT")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def _expand(p: str) -> list[str]:
    """Brace expansion (``trainer_gap_{quick,paper}_...``), one level."""
    m = re.search(r"\{([^{}]*)\}", p)
    if not m:
        return [p]
    return [x for alt in m.group(1).split(",") for x in _expand(p[:m.start()] + alt + p[m.end():])]


def _exists(p: str) -> bool:
    p = p.rstrip(".,;:")
    if any(c in p for c in "*[?"):
        return bool(glob.glob(str(ROOT / p)))
    return (ROOT / p).exists()


def cited_paths(text: str) -> list[str]:
    """The repository paths a markdown text names (outputs and placeholders left out), in order."""
    seen = {}
    for m in PATH.finditer(text):
        p = m.group(1).rstrip(".")
        if p.endswith("]") and "[" not in p:
            p = p.rstrip("]")
        line_before = text[text.rfind("\n", 0, m.start()) + 1:m.start()]
        if PLACEHOLDER.search(p) or OUTPUT.search(line_before) or "git show" in line_before:
            continue
        for q in _expand(p):
            seen.setdefault(q, None)
    return list(seen)


def missing_paths(text: str) -> list[str]:
    return [p for p in cited_paths(text) if not _exists(p)]


def _module_file(dotted: list[str]) -> tuple[Path | None, list[str]]:
    """The longest prefix of a dotted name that is a module or package of the tree, and the rest."""
    for i in range(len(dotted), 0, -1):
        base = (PKG_DIRS[dotted[0]] if dotted[0] in PKG_DIRS else ROOT / dotted[0]).joinpath(*dotted[1:i])
        if dotted[0] == "verl_pipe" and len(dotted) > 1 and dotted[1] in ("conf", "recipes"):
            base = ROOT.joinpath(dotted[1], *dotted[2:i])  # shipped from the top level (pyproject's package-dir)
        for f in (base.with_suffix(".py"), base / "__init__.py"):
            if f.is_file():
                return f, dotted[i:]
        if i == len(dotted) and base.is_dir():
            return base, []
    return None, dotted


def _defines(f: Path, name: str) -> bool:
    if f.is_dir():
        return (f / name).exists() or (f / f"{name}.py").exists()
    return re.search(rf"^\s*(?:async\s+def|def|class)\s+{name}\b|^\s*{name}\s*[:=]|\b{name}\b", f.read_text(),
                     re.M) is not None


def unknown_modules(text: str) -> list[str]:
    """Dotted module names and package-relative module files a text names that the tree does not hold."""
    bad = {}
    for m in DOTTED.finditer(text):
        name = m.group(1).rstrip(".")
        f, rest = _module_file(name.split("."))
        if f is None or len(name.split(".")) - len(rest) < 2 or (rest and not _defines(f, rest[0])):
            bad.setdefault(name, None)
    for m in SUBPATH.finditer(text):
        rel, attr = m.group(1), m.group(2)
        if rel.split("/")[0] in TOP or not any((d / rel.split("/")[0]).is_dir() for d in PKG_DIRS.values()):
            continue  # a repository path (checked by cited_paths), or another project's file (vllm/..., verl/...)
        files = [d / rel for d in PKG_DIRS.values() if (d / rel).is_file()]
        files += [ROOT / rel] if (ROOT / rel).is_file() else []
        if not files or (attr and not any(_defines(f, attr) for f in files)):
            bad.setdefault(rel + (f":{attr}" if attr else ""), None)
    stems = _stems()
    for m in STEM_ATTR.finditer(text):
        stem, attr = m.group(1), m.group(2)
        if stem in stems["gone"]:
            bad.setdefault(m.group(0).strip("`"), None)  # a module that no longer exists (trainer_seam.x)
        elif stem in stems["now"] and attr not in FILE_SUFFIXES and attr != "py" and not any(
                _defines(f, attr) for f in stems["now"][stem]):
            bad.setdefault(m.group(0).strip("`"), None)
    return list(bad)


# `module.attr` or `module.py` in backticks, the module by its bare name (step_record.done_line)
STEM_ATTR = re.compile(r"`([a-z][a-z0-9]*_[a-z0-9_]+)\.([A-Za-z_]\w*)")
FILE_SUFFIXES = {"yaml", "json", "md", "log", "txt", "sh", "png", "jsonl", "gz", "parquet", "tsv"}


@lru_cache(maxsize=None)
def _stems() -> dict:
    """The module names (file stems with an underscore) of the packages now, and those git history had that the tree
    no longer holds anywhere (a module removed or renamed: its old name in a page is stale)."""
    now = {}
    for d in PKG_DIRS.values():
        for f in d.rglob("*.py"):
            if "__pycache__" not in f.parts and "_" in f.stem.strip("_"):
                now.setdefault(f.stem, []).append(f)
    gone = set()
    if (ROOT / ".git").exists():
        log = subprocess.run(["git", "log", "--no-renames", "--diff-filter=D", "--name-only", "--format=", "--",
                              *(str(d.relative_to(ROOT)) for d in PKG_DIRS.values())],
                             cwd=ROOT, capture_output=True, text=True).stdout.split()
        gone = {Path(p).stem for p in log if p.endswith(".py")} - set(now) - {"__init__", "__main__"}
        gone = {g for g in gone if "_" in g.strip("_")}
    return {"now": now, "gone": gone}


def anchors(page: Path) -> set[str]:
    """The anchors a page's headings make (GitHub's slugs), code blocks left out."""
    text = FENCE.sub("", page.read_text())
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in re.findall(r"^#+ (.+)$", text, re.M)}


def broken_links(page: Path) -> list[str]:
    """Relative links whose file does not exist, or whose anchor no heading of that page makes."""
    out = []
    for m in LINK.finditer(page.read_text()):
        if re.match(r"[a-z]+:", m.group(1)):
            continue  # a URL
        target, _, anchor = m.group(1).partition("#")
        dest = page.parent / target if target else page
        if not dest.exists() or (anchor and dest.suffix == ".md" and anchor not in anchors(dest)):
            out.append(m.group(1))
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_path_a_page_cites_exists(page):
    assert missing_paths(page.read_text()) == [], f"{page.name} cites paths this tree does not hold " \
        "(removed files: docs/bench/REMOVED.tsv; cite them as `git show COMMIT:PATH`)"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_module_a_page_names_exists(page):
    assert unknown_modules(page.read_text()) == [], f"{page.name} names modules this tree does not hold"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves(page):
    assert broken_links(page) == []


def test_the_checks_tell_a_missing_path_and_module_apart():
    text = ("`docs/bench/bench_2026-11-30.json`, `docs/bench/nope_2026-12-02.json`, `--out docs/bench/x.json`, "
            "`docs/bench/quick_DATE.json`, `docs/bench/trainer_gap_{quick,paper}_2026-12-01.json`, "
            "`docs/bench/learn_chain_v3_*.json`")
    assert missing_paths(text) == ["docs/bench/nope_2026-12-02.json"]
    text = ("`verl_pipe.main_grpo`, `verl_pipe.config.validate`, `verl_pipe.trainer_seam`, "
            "`verl_pipe.config.no_such_function`, `core/variants.py`, `trainer/seam.py`, `trainer_seam.py`, "
            "`core/nope.py`, `verl_pipe.conf`")
    assert unknown_modules(text) == ["verl_pipe.trainer_seam", "verl_pipe.config.no_such_function", "core/nope.py",
                                     "trainer_seam.py"]


# docs/layout.md: every module once, by its path relative to the repository (verl_pipe/core/variants.py)
LAYOUT = ROOT / "docs" / "layout.md"
# the runtime's modules (the lab's are its own: lab/verl_pipe_lab)
LAYOUT_ENTRY = re.compile(r"^\s*[-*] `(verl_pipe/[\w/]+\.py)`", re.M)


def tree_modules() -> list[str]:
    """Every module file of the packages, ``__init__.py`` of a package with no code of its own left out."""
    out = []
    for pkg in ("verl_pipe",):
        for f in sorted((ROOT / pkg).rglob("*.py")):
            if "__pycache__" in f.parts:
                continue
            if f.name == "__init__.py" and not re.search(r"^\s*(def|class|import|from)\b", f.read_text(), re.M):
                continue
            out.append(str(f.relative_to(ROOT)))
    return out


def test_layout_names_every_module_once_and_nothing_else():
    named = LAYOUT_ENTRY.findall(LAYOUT.read_text())
    twice = sorted({n for n in named if named.count(n) > 1})
    assert twice == [], f"docs/layout.md names these more than once: {twice}"
    tree = set(tree_modules())
    assert sorted(tree - set(named)) == [], "modules missing from docs/layout.md"
    assert sorted(set(named) - tree) == [], "docs/layout.md names modules the tree does not hold"


MAX_PAGE_LINES = 300
MAX_TREE_BYTES = 12_000_000  # the 12 MB, as `git ls-files | xargs du -cb` counts bytes


@pytest.mark.parametrize("page", sorted((ROOT / "docs").glob("*.md")), ids=lambda p: p.name)
def test_a_page_says_how_it_works_in_at_most_300_lines(page):
    n = len(page.read_text().splitlines())
    assert n <= MAX_PAGE_LINES, (f"{page.name} has {n} lines (at most {MAX_PAGE_LINES}): condense it; dated journals and "
                                 "superseded runs belong in git history, the one-line summary in docs/results.md")


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout


@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="not a git checkout")
def test_the_tracked_tree_is_not_an_archive():
    """`git ls-files | xargs du -cb` stays at most 12 MB: results are kept as their JSONs and gzipped logs; raw
    console logs, pilots and superseded parts live in git history (docs/bench/REMOVED.tsv)."""
    total = sum((ROOT / p).stat().st_size for p in _git("ls-files", "-z").split("\0") if p and (ROOT / p).is_file())
    assert total <= MAX_TREE_BYTES, f"the tracked tree is {total / 1e6:.2f} MB (at most {MAX_TREE_BYTES / 1e6:.0f})"


def removed_rows() -> list[tuple[str, str]]:
    rows = []
    for line in (ROOT / "docs" / "bench" / "REMOVED.tsv").read_text().splitlines():
        if line and not line.startswith("#") and not line.startswith("path\t"):
            path, commit, _why = line.split("\t")
            rows.append((path, commit))
    return rows


@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="not a git checkout")
def test_every_removed_file_is_where_the_manifest_says():
    """Each row of docs/bench/REMOVED.tsv names a file git history holds at the commit given (`git show COMMIT:PATH`
    brings it back) and that the tree no longer tracks."""
    rows = removed_rows()
    assert rows
    found = subprocess.run(["git", "cat-file", "--batch-check"], cwd=ROOT, capture_output=True, text=True,
                           input="".join(f"{c}:{p}\n" for p, c in rows), check=True).stdout.splitlines()
    assert [r for r, out in zip(rows, found) if out.endswith("missing")] == []
    tracked = set(_git("ls-files", "docs").split())
    assert sorted(p for p, _ in rows if p in tracked) == []
