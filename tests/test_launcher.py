"""The launcher's entry (verl_pipe/main_grpo.py, verl_pipe/launch/): main_grpo is ``main()`` only; a bad value is
refused before any asset build (issue 61(b), on an empty cache: seconds, nothing built); ``--help`` lists the user's
recipes and config groups, not the project's internal ones (issue 61(e)).

The launches run ``python -m verl_pipe.main_grpo`` in a subprocess with an empty VERL_PIPE_CACHE: each ends at the
config check, before Ray starts or a model loads (no Ray, no vLLM here).
"""

import ast
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.checkout import ROOT

# Issue 61(b): the error comes within this many seconds on an empty cache (the asset build and the SFT warm-start it
# used to run first take minutes of CPU).
ERROR_WITHIN_S = 20.0


def _launch(args: list[str], cwd: Path, cache: Path) -> tuple[subprocess.CompletedProcess, float, float]:
    """(the finished launch, its wall seconds, its CPU seconds: user + system of the launcher and what it waited for)."""
    env = {**os.environ, "VERL_PIPE_CACHE": str(cache),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "verl_pipe.main_grpo", *args], capture_output=True, text=True,
                         timeout=600, cwd=cwd, env=env)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return out, wall, cpu


@pytest.mark.parametrize("where", ["override", "recipe file"])
def test_a_bad_value_is_refused_before_any_asset_build_on_an_empty_cache(where, tmp_path):
    """`python -m verl_pipe.main_grpo rolloutpipe.reward.timeout_s=-1` on a cold cache built the chain task's assets
    and its SFT warm-start (minutes) before the value check refused it. Now every check of the config (keys and values,
    from an override or a recipe file) runs first: the error names the key, within ERROR_WITHIN_S, nothing is built.

    The bound is on the launcher's CPU time (what the launch costs; on a machine shared with other jobs its wall time
    also counts their turns), and the wall time must stay far from the minutes an asset build takes."""
    cache = tmp_path / "cache"
    cache.mkdir()
    if where == "override":
        args = ["rolloutpipe.reward.timeout_s=-1"]
    else:
        (tmp_path / "my_recipe.yaml").write_text("defaults:\n  - tiny_cpu_chain\n  - _self_\n\n"
                                                 "rolloutpipe:\n  reward:\n    timeout_s: -1\n")
        args = ["--config-dir", str(tmp_path), "--config-name", "my_recipe"]
    out, wall, cpu = _launch(args, tmp_path, cache)
    text = out.stdout + out.stderr
    assert out.returncode == 2, text[-3000:]
    assert ("[verl_pipe] config error: rolloutpipe.reward.timeout_s: got -1; allowed: null (no deadline) or a number "
            "of seconds > 0") in out.stderr, text[-3000:]
    assert "Traceback" not in text  # the message alone, not a stack
    assert list(cache.iterdir()) == [], "the launch built into the cache before refusing the config"
    for started in ("building", "warm-start", "assets 1/3", "starting Ray", "workers init", "run id"):
        assert started not in text, started
    assert cpu < ERROR_WITHIN_S, f"the config error took {cpu:.1f}s of CPU ({wall:.1f}s wall)"
    assert wall < 6 * ERROR_WITHIN_S, f"the config error took {wall:.1f}s wall ({cpu:.1f}s of CPU)"


def test_help_lists_the_users_recipes_and_groups_not_the_internal_ones(tmp_path):
    out, _, _ = _launch(["--help"], tmp_path, tmp_path / "cache")
    assert out.returncode == 0, out.stderr[-2000:]
    text = out.stdout
    lines = text.splitlines()
    for recipe in ("tiny_cpu_chain", "qwen3_1p7b_gsm8k_4x4", "rolloutpipe_trainer"):
        assert any(line.strip().startswith(recipe + " ") for line in lines), recipe
    groups = {line.split(":", 1)[0].strip() for line in text.split("Config groups", 1)[1].split("\n\n")[0].splitlines()
              if line.startswith("  ")}
    assert {"actor", "rollout", "ref", "model_engine"} <= groups
    assert not groups & {"bench", "sim", "lib"}
    assert "default tiny_cpu_chain" in text and "--hydra-help" in text
    assert not (tmp_path / "cache").exists() and not (tmp_path / "outputs").exists()  # nothing composed or run


def test_every_recipe_file_is_in_the_help():
    from verl_pipe.launch.help import recipes

    listed = recipes()
    assert set(listed) == {f.stem for f in (ROOT / "recipes").glob("*.yaml")} | {"rolloutpipe_trainer"}
    assert all(0 < len(what) <= 80 for what in listed.values()), listed


def test_main_grpo_is_main_only_and_nothing_imports_it():
    """Issue 59(b): the entry point holds the Hydra entry and nothing else; the launcher and its state live in
    verl_pipe/launch/, which nothing below main_grpo imports it for."""
    tree = ast.parse((ROOT / "verl_pipe" / "main_grpo.py").read_text())
    defined = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
    assigned = [n for n in tree.body if isinstance(n, (ast.Assign, ast.AnnAssign))]
    assert defined == ["_run", "main"] and not assigned
    importers = []
    for f in (ROOT / "verl_pipe").rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names] \
                if isinstance(node, ast.ImportFrom) else []
            if any(n == "verl_pipe.main_grpo" or n.startswith("verl_pipe.main_grpo.") for n in names):
                importers.append(str(f.relative_to(ROOT)))
    assert not importers, importers
