"""The repository's layout: conf/ and recipes/ at the top level ship as verl_pipe.conf and verl_pipe.recipes
(pyproject's package-dir), pyproject lists every package of the tree, and verl_pipe's modules import no circle.
Two packages: the runtime (verl_pipe, pyproject.toml) and the lab beside it (verl_pipe_lab, lab/pyproject.toml), which
imports the runtime; the runtime never imports the lab.

Pure: reads files and imports verl_pipe.conf / verl_pipe.recipes (no Ray, no model). The wheel itself is built and
run outside the checkout in tests/test_install.py.
"""

import ast
import tomllib
from pathlib import Path

import verl_pipe
import verl_pipe.conf
import verl_pipe.recipes

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
LAB = ROOT / "lab"  # the lab's distribution (verl-pipe-lab): its pyproject and its one package
LAB_PYPROJECT = tomllib.loads((LAB / "pyproject.toml").read_text())["tool"]["setuptools"]
# Where each package's directory is: the mapped ones (package-dir) and, for the rest, their own name's path.
ROOTS = {"verl_pipe": ROOT / "verl_pipe", "hydra_plugins": ROOT / "hydra_plugins",
         **{pkg: ROOT / path for pkg, path in PYPROJECT["package-dir"].items()}}
LAB_ROOTS = {"verl_pipe_lab": LAB / "verl_pipe_lab"}


def _tree_packages(roots: dict[str, Path] = ROOTS) -> set[str]:
    """Each root (hydra_plugins is a namespace package) and every directory under one that holds a file (not
    bytecode): each is a package of the wheel."""
    found = set()
    for pkg, d in roots.items():
        for sub in [d, *d.rglob("*")]:
            if sub == d or sub.is_dir() and "__pycache__" not in sub.parts and any(
                    f.is_file() and f.suffix != ".pyc" for f in sub.iterdir()):
                found.add(".".join([pkg, *sub.relative_to(d).parts]))
    return found


def test_conf_and_recipes_live_at_the_top_level():
    assert PYPROJECT["package-dir"] == {"verl_pipe.conf": "conf", "verl_pipe.recipes": "recipes"}
    for name in ("conf", "recipes"):
        assert (ROOT / name / "__init__.py").is_file()
        # A leftover verl_pipe/conf (even holding only __pycache__) would be found first, as a namespace package.
        assert not (ROOT / "verl_pipe" / name).exists(), f"verl_pipe/{name} shadows the top-level {name}/"


def test_pyproject_lists_every_package_of_the_tree():
    assert set(PYPROJECT["packages"]) == _tree_packages()
    assert set(LAB_PYPROJECT["packages"]) == _tree_packages(LAB_ROOTS)
    assert "package-dir" not in LAB_PYPROJECT  # the lab's packages sit under lab/ by their own names


def test_the_lab_is_a_package_apart():
    """The runtime's wheel lists no lab package and no bench config; the lab's lists only its own. A leftover
    verl_pipe/bench or conf/bench (even holding only __pycache__) would be found as a namespace package."""
    assert not [p for p in PYPROJECT["packages"] if p.startswith("verl_pipe_lab") or ".bench" in p]
    assert not any("bench" in glob for globs in PYPROJECT["package-data"].values() for glob in globs)
    assert all(p == "verl_pipe_lab" or p.startswith("verl_pipe_lab.") for p in LAB_PYPROJECT["packages"])
    for leftover in (ROOT / "verl_pipe" / "bench", ROOT / "conf" / "bench"):
        assert not leftover.exists(), f"{leftover.relative_to(ROOT)} is left from before the lab moved to lab/"
    lab = tomllib.loads((LAB / "pyproject.toml").read_text())["project"]
    runtime = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert lab["name"] == "verl-pipe-lab" and runtime["name"] in lab["dependencies"]


def _files(d: Path) -> dict[str, bytes]:
    return {str(f.relative_to(d)): f.read_bytes() for f in sorted(d.rglob("*"))
            if f.is_file() and "__pycache__" not in f.parts}


def test_conf_and_recipes_come_from_the_same_tree_as_verl_pipe():
    """In a checkout (editable install) verl_pipe.conf is this checkout's conf/; installed, it sits in the package.

    A checkout imported through PYTHONPATH beside another checkout's editable install (e.g. a git worktree run with
    the main checkout's .venv) gets verl_pipe from itself but verl_pipe.conf / verl_pipe.recipes from the installed
    checkout (the editable finder maps them; a worktree's verl_pipe/ has no conf/): allowed while the two trees'
    files are the same, refused once they differ (its runs would use the other tree's configs)."""
    pkg = Path(verl_pipe.__file__).resolve().parent
    for mod, name in ((verl_pipe.conf, "conf"), (verl_pipe.recipes, "recipes")):
        where = Path(mod.__file__).resolve().parent
        if pkg != ROOT / "verl_pipe":
            assert where == pkg / name
        elif where != ROOT / name:
            assert _files(where) == _files(ROOT / name), (
                f"verl_pipe comes from this checkout ({ROOT}) but {mod.__name__} from {where}, whose files differ "
                f"from this checkout's {name}/: the editable install maps it to another tree "
                "(`pip install --no-deps -e .` in this checkout, or a venv of its own)")
    assert verl_pipe.conf.ROOT == Path(verl_pipe.conf.__file__).resolve().parent
    assert (verl_pipe.conf.ROOT / "rolloutpipe_trainer.yaml").is_file()


def _modules() -> dict[str, Path]:
    """Every module of the runtime (verl_pipe) and of the lab (verl_pipe_lab): name -> file."""
    mods = {}
    for pkg, d in {**ROOTS, **LAB_ROOTS}.items():
        if not pkg.startswith("verl_pipe"):
            continue
        for f in d.rglob("*.py"):
            parts = list(f.relative_to(d).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            mods[".".join([pkg, *parts])] = f
    return mods


def test_no_import_circles():
    """No module of verl_pipe or verl_pipe_lab imports, at any level (function-level imports included), one that
    imports it back (e.g. bench/run.py <-> bench/peer: both take the bench YAML's helpers from bench/settings.py). Importing a
    submodule imports its parent packages first; that is not counted."""
    mods = _modules()
    edges = {m: set() for m in mods}
    for m, f in mods.items():
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            for n in names:
                parts = n.split(".")
                for i in range(1, len(parts) + 1):
                    t = ".".join(parts[:i])
                    if t in mods and t != m and not m.startswith(t + "."):
                        edges[m].add(t)
    circles = []
    for start in mods:  # a path back to start through its imports (small graph: a search per module is enough)
        seen, stack = set(), [(start, [start])]
        while stack:
            node, path = stack.pop()
            for nxt in edges[node]:
                if nxt == start:
                    circles.append(path)
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, [*path, nxt]))
    assert not circles, f"import circles: {sorted({' -> '.join(c) for c in circles})}"


def test_peer_configurations_are_the_variant_tables():
    """bench/settings.py checks a setting's ``peers`` against the lab's variant columns (verl_pipe_lab.bench.variants),
    not bench/peer (no circle)."""
    from verl_pipe_lab.bench.peer.configs import CONFIGS
    from verl_pipe_lab.bench.variants import PEER_MODE_NAMES

    assert set(CONFIGS) == set(PEER_MODE_NAMES)


def test_core_is_pure():
    """verl_pipe/core holds the pure cores: each of its modules imports, at any level, only the standard library
    (asyncio excepted), numpy and the other modules of verl_pipe.core; no verl, vLLM, Ray, torch or omegaconf."""
    import sys

    allowed = (set(sys.stdlib_module_names) - {"asyncio"}) | {"numpy", "__future__"}
    core = ROOT / "verl_pipe" / "core"
    files = sorted(core.glob("*.py"))
    assert len(files) > 1, f"{core} holds no modules"
    bad = []
    for f in files:
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = ["verl_pipe.core"] if node.level == 1 else [node.module or "."]
            else:
                continue
            for n in names:
                if not (n.split(".")[0] in allowed or n == "verl_pipe.core" or n.startswith("verl_pipe.core.")):
                    bad.append(f"{f.name}:{node.lineno} imports {n}")
    assert not bad, bad


# The declared layers, lowest first: a module may import its own layer and those below it, never one above.
# Within a layer, no circles (test_no_import_circles). Entry points (``pkg/__main__.py``, run as python -m pkg) sit in
# their package's layer or, when that is below the launcher's, in the launcher's: like main_grpo they compose a run's
# config, and nothing imports them (test_nothing_imports_an_entry_point), so they are roots, not a layer's library.
# main_grpo (``main()`` only) sits above the launcher it calls; nothing imports it.
LAYERS = (
    ("verl_pipe.core", "verl_pipe.errors"),
    ("verl_pipe.platform", "verl_pipe.assets"),
    ("verl_pipe.rollout", "verl_pipe.trainer", "verl_pipe.config", "verl_pipe.config_keys", "verl_pipe.estimators",
     "verl_pipe.data_check"),
    ("verl_pipe.launch",),
    ("verl_pipe.main_grpo",),
    ("verl_pipe.doctor",),
    ("verl_pipe.sim", "verl_pipe.plan"),
    ("verl_pipe_lab",),  # the lab (lab/, a package of its own): above the whole runtime
)
# Imports against the layers still being mended, each with where it goes: (importer, imported). Only shrinks.
PENDING: set[tuple[str, str]] = set()
# The package root holds only these modules; everything else lives in a subpackage with one job.
# config_keys is the config's check of unknown keys against verl's schema (its own job, beside config).
# errors holds ConfigError without omegaconf (the GPU driver check imports it on a torch-only machine).
LOOSE = {"__init__", "main_grpo", "config", "config_keys", "estimators", "data_check", "errors"}


LAUNCH_LAYER = next(i for i, layer in enumerate(LAYERS) if "verl_pipe.launch" in layer)


def _layer(module: str) -> int | None:
    for i, layer in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in layer):
            return max(i, LAUNCH_LAYER) if module.endswith(".__main__") else i
    return None


def _imports(f: Path, module: str) -> list[tuple[int, str]]:
    """(line, imported verl_pipe module) of every import in ``f``, at any level, relative ones resolved."""
    out = []
    pkg = module if f.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(f.read_text())):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = pkg.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            out += [(node.lineno, f"{base}.{a.name}") for a in node.names] + [(node.lineno, base)]
    return [(line, n) for line, n in out if n.split(".")[0] in ("verl_pipe", "verl_pipe_lab")]


def test_every_module_has_a_layer_and_the_root_few():
    mods = _modules()
    assert not [m for m in mods if m.startswith("verl_pipe") and not m.startswith(("verl_pipe.conf", "verl_pipe.recipes"))
                and m != "verl_pipe" and _layer(m) is None], "a package outside LAYERS"
    assert any(m.startswith("verl_pipe_lab.bench.peer.") for m in mods)  # the lab's modules are scanned too
    loose = {f.stem for f in (ROOT / "verl_pipe").glob("*.py")}
    assert loose <= LOOSE, f"modules loose at the package root beyond {sorted(LOOSE)}: {sorted(loose - LOOSE)}"
    assert len(LOOSE - {"__init__"}) <= 6


def test_imports_only_go_down_the_layers():
    """core (+ errors) -> platform, assets -> rollout, trainer (with config, config_keys, estimators, data_check) ->
    launch -> main_grpo -> doctor -> sim, plan -> the lab: a module imports, at any level (function-level included),
    only modules of its own layer or below. The lab (verl_pipe_lab) is the top layer: the runtime never imports it
    (test_the_runtime_never_imports_the_lab)."""
    bad = []
    for m, f in _modules().items():
        mine = _layer(m)
        if mine is None:
            continue
        for line, name in _imports(f, m):
            theirs = _layer(name)
            if theirs is not None and theirs > mine and not any(
                    m == a and (name == b or name.startswith(b + ".") or b.startswith(name + ".")) for a, b in PENDING):
                bad.append(f"{f.relative_to(ROOT)}:{line} ({m}, layer {mine}) imports {name} (layer {theirs})")
    assert not bad, "imports against the layers:\n" + "\n".join(sorted(set(bad)))


def test_the_runtime_never_imports_the_lab():
    """No module of verl_pipe imports verl_pipe_lab, at any level, nor names one of its modules in a string (an
    ``importlib`` target, a ``module:function`` or a dotted class path): the runtime runs with the lab not installed."""
    bad = []
    for m, f in _modules().items():
        if m.split(".")[0] != "verl_pipe":
            continue
        bad += [f"{f.relative_to(ROOT)}:{line} imports {name}" for line, name in _imports(f, m)
                if name.split(".")[0] == "verl_pipe_lab"]
        bad += [f"{f.relative_to(ROOT)}:{node.lineno} names {node.value!r}" for node in ast.walk(ast.parse(f.read_text()))
                if isinstance(node, ast.Constant) and isinstance(node.value, str)
                and node.value.split(".")[0].split(":")[0] == "verl_pipe_lab"]
    assert not bad, "the runtime reaches into the lab:\n" + "\n".join(bad)
    runtime = [_layer(m) for m in _modules() if m.split(".")[0] == "verl_pipe" and _layer(m) is not None]
    assert _layer("verl_pipe_lab.bench.run") > max(runtime)


def test_the_layer_scan_sees_an_import_of_the_lab(tmp_path):
    """The scan above flags a function-level import of the lab in a runtime module (so an empty result means
    something)."""
    f = tmp_path / "x.py"
    f.write_text("def f():\n    from verl_pipe_lab.bench import run\n    import verl_pipe_lab\n")
    assert sorted(n for _, n in _imports(f, "verl_pipe.trainer.x")) == [
        "verl_pipe_lab", "verl_pipe_lab.bench", "verl_pipe_lab.bench.run"]


def test_nothing_imports_an_entry_point():
    """An entry point (``__main__``) may sit above its package's layer (``_layer``) only because it is a root: no
    module imports one that is lifted so (the planner's own modules share plan/__main__'s run_plan, in one layer)."""
    lifted = {m for m in _modules() if m.endswith(".__main__") and _layer(m) != _layer(m.rpartition(".")[0])}
    assert "verl_pipe.assets.__main__" in lifted
    bad = [f"{f.relative_to(ROOT)}:{line} imports {name}" for m, f in _modules().items()
           for line, name in _imports(f, m) if any(name == e or name.startswith(e + ".") for e in lifted)]
    assert not bad, bad
    assert _layer("verl_pipe.assets.__main__") == LAUNCH_LAYER and _layer("verl_pipe.assets") < LAUNCH_LAYER
    assert _layer("verl_pipe_lab.bench.__main__") == _layer("verl_pipe_lab.bench")


def _name_literals(node: ast.AST, names: set[str]) -> list[str]:
    """The mode names ``node`` spells out: a str constant, or a tuple / list / set of them."""
    elts = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return [e.value for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str) and e.value in names]


def _dict_dispatch(node: ast.AST, names: set[str]) -> list[str]:
    """A dict literal keyed by mode names looked up at once (``{...}[x]``, ``{...}.get(x)``): its name keys."""
    if isinstance(node, ast.Subscript):
        d = node.value
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
        d = node.func.value
    else:
        return []
    return [k.value for k in d.keys if isinstance(k, ast.Constant) and k.value in names] if isinstance(d, ast.Dict) \
        else []


def _branched_names(node: ast.AST, names: set[str]) -> list[str]:
    """The mode names ``node`` branches on: a comparison with one, or a dict literal keyed by them looked up."""
    if isinstance(node, ast.Compare):
        return [n for x in (node.left, *node.comparators) for n in _name_literals(x, names)]
    return _dict_dispatch(node, names)


def test_no_branch_on_a_mode_name_outside_variants():
    """One vocabulary: every branch on a mode or variant name (``==``, ``!=``, ``in``, a dict literal keyed by names
    and looked up at once) happens in verl_pipe/core/variants.py; elsewhere (the lab too) code asks the variant table
    (``pipelines(mode)``, ``Variant.fgd``, ``of_row(row).colocated``, ``BASE``, ...). Names as JSON keys, as
    arguments, or in a tuple of rows to lay out are not branches."""
    from verl_pipe.core.variants import PLAN_ROWS, TRAINER_MODES, VARIANTS

    names = set(VARIANTS) | set(TRAINER_MODES) | set(PLAN_ROWS)
    assert "verl_one_step_off" in names  # the planner's own row name for verl_separate_async_1off
    table = ROOT / "verl_pipe" / "core" / "variants.py"
    bad = []
    for f in sorted([*(ROOT / "verl_pipe").rglob("*.py"), *LAB.rglob("*.py")]):
        if f == table:
            continue
        for node in ast.walk(ast.parse(f.read_text())):
            found = _branched_names(node, names)
            if found:
                bad.append(f"{f.relative_to(ROOT)}:{node.lineno} branches on {sorted(set(found))}")
    assert not bad, "mode names decoded outside verl_pipe/core/variants.py:\n" + "\n".join(bad)


def test_the_name_scan_sees_each_kind_of_branch():
    """The scan above flags what it should (so an empty result means something)."""
    names = {"sync", "cgp"}

    def hits(src: str) -> list[str]:
        return _branched_names(ast.parse(src, mode="eval").body, names)

    for src, want in (('m == "sync"', ["sync"]), ('m != "cgp"', ["cgp"]), ('"cgp" in modes', ["cgp"]),
                      ('m in ("sync", "x")', ["sync"]), ('{"sync": 1, "y": 2}[m]', ["sync"]),
                      ('{"cgp": 1}.get(m)', ["cgp"])):
        assert hits(src) == want, src
    for src in ('m == BASE', 'f(m, "sync")', 'rows["sync"]', '{"sync": 1}', 'm == "other"'):
        assert not hits(src), src
