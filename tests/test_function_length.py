"""Functions stay short: none in the project's code is longer than ``MAX_LINES`` lines unless its docstring says why.

Counted from the ``def`` line to the function's last line (decorators left out, docstring and comments included),
for every function and method, nested ones too (a nested function counts inside its parent as well). The project's
code is what the wheel ships (verl_pipe/, hydra_plugins/, conf/ and recipes/ as pyproject maps them), the lab beside
it (lab/) and tools/.

A function that is long for a reason says so in its docstring, on a line of its own that starts ``Long because:``
followed by the reason (e.g. ``Long because: one linear protocol whose steps share a dozen locals``). An empty
reason is not one.

Pure: parses files, imports nothing of the project.
"""

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 60
REASON = "Long because:"
_PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
DIRS = sorted({ROOT / "verl_pipe", ROOT / "hydra_plugins", ROOT / "tools", ROOT / "lab",
               *(ROOT / d for d in _PYPROJECT["package-dir"].values())})

# Over the limit, without a stated reason yet, each to be split (or given its reason) by whoever works on that code
# next. The list only shrinks: an entry that is no longer over the limit, or no longer exists, fails the test.
NOT_YET_SPLIT: set[str] = set()


def _has_reason(node) -> bool:
    doc = ast.get_docstring(node) or ""
    return any(line.strip().startswith(REASON) and line.strip()[len(REASON):].strip() for line in doc.splitlines())


def long_functions(source: str, filename: str = "<source>") -> dict[str, int]:
    """``{qualified name: lines}`` of the functions in ``source`` over ``MAX_LINES`` lines without a stated reason."""
    found = {}

    def visit(node, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    lines = child.end_lineno - child.lineno + 1
                    if lines > MAX_LINES and not _has_reason(child):
                        found[name] = lines
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(source, filename), "")
    return found


def _tree_long_functions() -> dict[str, int]:
    found = {}
    for d in DIRS:
        for f in sorted(d.rglob("*.py")):
            if "__pycache__" in f.parts:
                continue
            rel = f.relative_to(ROOT).as_posix()
            for name, lines in long_functions(f.read_text(), rel).items():
                found[f"{rel}:{name}"] = lines
    return found


def test_no_function_is_longer_than_the_limit_without_a_reason():
    found = _tree_long_functions()
    new = {k: v for k, v in found.items() if k not in NOT_YET_SPLIT}
    assert not new, (f"functions over {MAX_LINES} lines: {new}; split them into named helpers, or state why not "
                     f"on a docstring line starting '{REASON}'")
    stale = sorted(NOT_YET_SPLIT - set(found))
    assert not stale, f"no longer over {MAX_LINES} lines (or gone), remove from NOT_YET_SPLIT: {stale}"


def _function(body_lines: int, doc: str = "") -> str:
    head = f'def f():\n    """{doc}"""\n' if doc else "def f():\n"
    return head + "".join(f"    x{i} = {i}\n" for i in range(body_lines))


def test_the_check_counts_lines_and_reads_the_reason():
    assert long_functions(_function(MAX_LINES - 1)) == {}  # def line + body = MAX_LINES
    assert long_functions(_function(MAX_LINES)) == {"f": MAX_LINES + 1}
    assert long_functions(_function(MAX_LINES, "Short doc.\n\n    Long because: one protocol, a dozen locals")) == {}
    assert long_functions(_function(MAX_LINES, "Long because:   ")) == {"f": MAX_LINES + 2}  # no reason given
    assert long_functions(_function(MAX_LINES, "Not long because: x")) == {"f": MAX_LINES + 2}
    nested = "class C:\n    def m(self):\n        def inner():\n" + "".join(
        f"            y{i} = {i}\n" for i in range(MAX_LINES)) + "        return inner\n"
    assert long_functions(nested) == {"C.m": MAX_LINES + 3, "C.m.inner": MAX_LINES + 1}
    assert long_functions("async " + _function(MAX_LINES)) == {"f": MAX_LINES + 1}
