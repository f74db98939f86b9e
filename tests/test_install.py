"""A non-editable install works outside a checkout: the wheel carries the configs and the recipes.

Builds the wheel from a copy of the tracked sources (offline: no build isolation, the environment's own
setuptools), installs it with ``--no-deps`` into a fresh virtual environment that reuses this environment's
already-installed stack (nothing is downloaded), and runs ``python -m verl_pipe.main_grpo --cfg job`` there
from a directory outside the checkout. No Ray: ``--cfg job`` prints the composed config and exits.

``venv --system-site-packages`` would expose the *base* interpreter's site-packages, not this environment's
(which is itself a venv), so the stack is reached through a ``.pth`` file naming this environment's
site-packages instead. Lines of a ``.pth`` file are appended after the venv's own site-packages, and the
``.pth`` files inside the named directory (among them the editable install's finder for the checkout) are not
processed, so ``verl_pipe`` resolves to the installed wheel; the subprocess checks ``verl_pipe.__file__``.
"""

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.checkout import ROOT, copy_tracked, has_git_checkout


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The python of a fresh venv with the verl_pipe wheel installed over this environment's stack."""
    if not has_git_checkout():
        pytest.skip("needs a git checkout to know the tracked sources")
    try:
        import setuptools
    except ImportError:
        pytest.skip("setuptools is not installed: cannot build the wheel without build isolation (network)")
    major = int(setuptools.__version__.split(".")[0])
    if major < 77:
        pytest.skip(f"setuptools {setuptools.__version__} < 77 (pyproject's build requirement); `make setup` installs it")
    tmp = tmp_path_factory.mktemp("install")
    src, wheels, venv = tmp / "src", tmp / "wheels", tmp / "venv"
    copy_tracked(src)
    env = {**os.environ, "PIP_NO_INDEX": "1"}  # offline: nothing may be downloaded
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(wheels), str(src)], check=True, env=env, timeout=600)
    (wheel,) = wheels.glob("verl_pipe-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for data in ("verl_pipe/conf/rolloutpipe_trainer.yaml",
                 "verl_pipe/conf/sim/cluster_grid.yaml", "verl_pipe/recipes/qwen3_1p7b_gsm8k_4x4.yaml",
                 "verl_pipe/recipes/run_qwen3_1p7b_gsm8k_4x4.sh", "verl_pipe/recipes/lib/fetch_model.sh",
                 "verl_pipe/recipes/lib/multiturn_agent_loops.yaml",
                 "verl_pipe/recipes/tiny_cpu_multiturn_cgp_fgd.yaml",
                 "hydra_plugins/verl_pipe_searchpath/verl_pipe_searchpath.py"):
        assert data in names, f"the wheel lacks {data}"
    # The runtime's wheel ships no lab (lab/, its own distribution): no module of it, no bench config, no bench.
    lab = [n for n in names if n.startswith(("verl_pipe_lab/", "verl_pipe/bench/", "verl_pipe/conf/bench/", "lab/"))
           or "/bench/" in n]
    assert not lab, f"the runtime's wheel carries the lab: {lab[:10]}"
    assert any(n.startswith("verl_pipe/core/") for n in names)  # (the listing is the runtime's)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    vpy = venv / "bin" / "python"
    site = subprocess.run([str(vpy), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    (Path(site) / "_verl_pipe_stack.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(vpy), "install", "--no-deps", "-q", str(wheel)],
                   check=True, env=env, timeout=600)
    return vpy


def _run(vpy: Path, args: list[str], cwd: Path) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the checkout must not be importable
    out = subprocess.run([str(vpy), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout


def test_the_installed_package_is_the_wheel(installed, tmp_path):
    where = _run(installed, ["-c", "import verl_pipe, hydra_plugins.verl_pipe_searchpath as p; "
                                   "print(verl_pipe.__file__); print(p.__file__)"], tmp_path)
    venv = installed.parent.parent
    for line in where.split():
        assert Path(line).resolve().is_relative_to(venv.resolve()), f"{line} is not in the fresh venv {venv}"
        assert not Path(line).resolve().is_relative_to(ROOT), f"{line} comes from the checkout"


def test_main_grpo_composes_its_default_outside_a_checkout(installed, tmp_path):
    out = _run(installed, ["-m", "verl_pipe.main_grpo", "--cfg", "job"], tmp_path)
    assert "task: chain" in out and "max_response_length: 320" in out  # the chain recipe (main_grpo.DEFAULT_RECIPE)
    out = _run(installed, ["-m", "verl_pipe.main_grpo", "--config-name", "rolloutpipe_trainer", "--cfg", "job"],
               tmp_path)
    assert "task: digit_math" in out
    assert "rolloutpipe:" in out and "mode: sync" in out and "platform: cpu" in out
    assert "ppo_mini_batch_size: 8" in out  # ours, over verl's ppo_trainer (found through pkg://verl.trainer.config)
    assert "checkpoint_engine:" in out and "backend: ray_store" in out


@pytest.mark.parametrize("recipe,expect", [
    ("qwen3_1p7b_gsm8k_4x4", ["experiment_name: qwen3_1p7b_gsm8k_4x4", "platform: gpu", "backend: nccl"]),
    ("tiny_cpu_extension_example", ["trainer_class: verl_pipe.recipes.extension_example.trainer.ExampleTrainer"]),
])
def test_main_grpo_finds_a_recipe_outside_a_checkout(installed, tmp_path, recipe, expect):
    out = _run(installed, ["-m", "verl_pipe.main_grpo", "--config-name", recipe, "--cfg", "job"], tmp_path)
    for text in expect:
        assert text in out, f"{recipe}: {text!r} not in the composed config"
    # The recipe's trainer class imports from the installed package too.
    if recipe == "tiny_cpu_extension_example":
        _run(installed, ["-c", "import verl_pipe.recipes.extension_example.reward as r; print(r.__file__)"], tmp_path)
