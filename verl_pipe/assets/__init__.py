"""Tiny embedded assets (tokenizer, Qwen3 model, a task's data, the SFT warm-start), built locally once and cached.

There is no model or dataset hub on our machines, so everything a run needs is generated here. Two tasks
(``TASKS``, ``rolloutpipe.tiny_assets.task``): ``chain`` (verl_pipe/assets/chain_data.py, worked digit chains whose
response lengths have a long tail) and ``digit_math`` (verl_pipe/assets/math_data.py, one fixed-length question).
"""

from __future__ import annotations

import fcntl
import importlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

# Bump when anything a digit_math build produces changes, so stale caches are never reused.
ASSET_VERSION = 4


@dataclass(frozen=True)
class Task:
    """A tiny task: its data module (``build_dataset(out_dir)``, ``sample_corpus(n, seed)`` for the tokenizer), the
    version of its cache entry (bump it when anything its build produces changes), the SFT warm-start's
    ``data.max_length`` (its longest worked solution, chat markup included, fits) and its reward module (verl's
    ``custom_reward_function`` with ``compute_score``, the run's reward when ``reward.custom_reward_function.path``
    is unset)."""

    data_module: str
    version: int
    sft_max_length: int
    reward_module: str = "verl_pipe.assets.reward"

    def cache_name(self, task: str, size: str) -> str:
        # digit_math keeps the name it had before there were tasks, so its caches stay valid.
        return f"{size}-v{self.version}" if task == "digit_math" else f"{size}-{task}-v{self.version}"


TASKS: dict[str, Task] = {
    "digit_math": Task("verl_pipe.assets.math_data", ASSET_VERSION, 128),
    # The chain task trains on per-step partial credit; its validation metric (``acc``) is the exact answer.
    "chain": Task("verl_pipe.assets.chain_data", 4, 448, reward_module="verl_pipe.assets.chain_reward"),
}


@dataclass(frozen=True)
class AssetPaths:
    model_dir: Path
    train_file: Path
    val_file: Path
    tokenizer_dir: Path
    sft_file: Path  # worked solutions of other questions, for the warm-start (verl's multi-turn SFT format)
    sft_max_length: int = 128  # the warm-start's data.max_length: the task's longest SFT sample fits


def default_cache_dir() -> Path:
    return Path(os.environ.get("VERL_PIPE_CACHE") or Path.home() / ".cache" / "verl_pipe")


def _paths(root: Path, task: str = "digit_math") -> AssetPaths:
    return AssetPaths(
        model_dir=root / "model",
        train_file=root / "data" / "train.parquet",
        val_file=root / "data" / "val.parquet",
        tokenizer_dir=root / "tokenizer",
        sft_file=root / "data" / "sft.parquet",
        sft_max_length=TASKS[task].sft_max_length,
    )


def _build(root: Path, size: str, task: str = "digit_math") -> None:
    # Imported here: building pulls in torch/transformers, which callers that only need paths should not pay for.
    from verl_pipe.assets.model import build_model
    from verl_pipe.assets.progress import waiting
    from verl_pipe.assets.tokenizer import build_tokenizer

    data = importlib.import_module(TASKS[task].data_module)
    paths = _paths(root, task)
    # Each part says it started, its elapsed time every 30 s in a log (a live line on a terminal), and what it took.
    with waiting(f"assets 1/3: the tokenizer ({task})"):
        tokenizer = build_tokenizer(paths.tokenizer_dir, sample_corpus=data.sample_corpus)
    with waiting(f"assets 2/3: the {size} model"):
        build_model(paths.model_dir, tokenizer, size=size)
    with waiting(f"assets 3/3: the {task} data"):
        data.build_dataset(paths.train_file.parent)


def _cached(cache_dir: Path, name: str, build) -> Path:
    """``cache_dir/name``, built by ``build(tmp_dir)`` once. The final dir only ever appears by atomic rename of a
    finished build, so its existence means complete; concurrent callers wait on a lock and reuse it."""
    root = cache_dir / name
    if root.is_dir():
        return root
    cache_dir.mkdir(parents=True, exist_ok=True)
    with open(cache_dir / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if root.is_dir():  # another process built it while we waited
            return root
        # Only the lock holder builds, so any leftover temp dir is from a crashed build.
        for stale in cache_dir.glob(f".{name}.building-*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.building-", dir=cache_dir))
        try:
            build(tmp)
            tmp.chmod(0o755)
            os.rename(tmp, root)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return root


def ensure_assets(cache_dir: Path | None = None, size: str = "tiny", task: str = "digit_math") -> AssetPaths:
    """The ``size`` model, its tokenizer and ``task``'s data (``TASKS``), built once under ``cache_dir``."""
    if task not in TASKS:
        raise ValueError(f"unknown tiny task {task!r}; choose from {sorted(TASKS)}")
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    name = TASKS[task].cache_name(task, size)
    if not (cache_dir / name).is_dir():
        from verl_pipe.assets.model_sizes import MODEL_SIZES

        if size not in MODEL_SIZES:
            raise ValueError(f"unknown model size {size!r}; choose from {sorted(MODEL_SIZES)}")

    def build(tmp: Path) -> None:
        print(f"building {size} assets of the {task} task in {cache_dir / name}", flush=True)
        _build(tmp, size, task)

    return _paths(_cached(cache_dir, name, build), task)


def ensure_warm_start(assets: AssetPaths, spec) -> Path:
    """The model directory of ``assets``' base model after the warm-start ``spec`` (verl_pipe.assets.warm_start),
    trained once and cached beside the assets it came from."""
    from verl_pipe.assets import warm_start

    root = assets.model_dir.parent
    def build(tmp: Path) -> None:
        warm_start.run(spec, assets.model_dir, assets.sft_file, tmp / "model", max_length=assets.sft_max_length)

    return _cached(root, spec.key(), build) / "model"
