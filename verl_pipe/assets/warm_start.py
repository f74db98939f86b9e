"""Supervised warm-start of the tiny model with verl's own SFT trainer, before GRPO.

The pipeline users run on real models: a short SFT on worked solutions (here ``sft.parquet`` of the digit-math set,
questions disjoint from the RL prompts and the validation set), then RL. verl seam: ``verl.trainer.sft_trainer``'s
``SFTTrainer`` with its ``sft_trainer_engine`` config (the FSDP2 engine, ``MultiTurnSFTDataset`` over a ``messages``
column), saving the result as a Hugging Face checkpoint (``checkpoint.save_contents=[hf_model]``) that verl's actor
and vLLM load like any model directory. It runs in a subprocess: one torch.distributed process (gloo) on the CPU
platform, so the launcher's own process never initializes a process group.

The SFT teaches the answer format and the lookup tables, and leaves the model split between the right procedure and
its teacher's systematic error, which GRPO's verifiable reward then settles (verl_pipe/assets/math_data.py).
docs/learning.md has what each SFT length and teacher share left, what GRPO did from each, and why the default.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from verl_pipe.assets.progress import Progress


@dataclass(frozen=True)
class WarmStart:
    """What the SFT does; its fields name the cache entry, so a change rebuilds instead of reusing."""

    steps: int
    lr: float
    batch_size: int = 32
    seed: int = 0
    # Length-matched batches (verl_pipe/assets/length_batches.py) instead of verl's shuffled ones.
    length_batches: bool = False

    def key(self) -> str:
        return f"sft-s{self.steps}-lr{self.lr:g}-b{self.batch_size}-seed{self.seed}" + ("-lb" if self.length_batches
                                                                                       else "")


def sft_overrides(spec: WarmStart, model_dir: Path, sft_file: Path, out_dir: Path, max_length: int = 128) -> list[str]:
    """verl's sft_trainer_engine overrides of a warm-start: fp32 on CPU like the RL default, sdpa attention (no
    flash-attn on CPU), padded micro-batches of the whole batch, the final step saved as a Hugging Face checkpoint.
    ``max_length``: the longest sample verl's SFT dataset accepts (it refuses a longer one); the task's
    (``verl_pipe.assets.TASKS``). It only bounds the samples, so it does not name the cache entry."""
    return [
        f"model.path={model_dir}",
        "model.use_remove_padding=false",
        "+model.override_config.attn_implementation=sdpa",
        f"data.train_files={sft_file}",
        "data.val_files=null",
        f"data.train_batch_size={spec.batch_size}",
        f"data.micro_batch_size_per_gpu={spec.batch_size}",
        "data.use_dynamic_bsz=false",
        f"data.max_length={max_length}",
        "data.num_workers=0",
        "engine.strategy=fsdp2",
        "engine.model_dtype=fp32",
        "+engine.mixed_precision={param_dtype: fp32, reduce_dtype: fp32, buffer_dtype: fp32}",
        f"optim.lr={spec.lr}",
        f"trainer.total_training_steps={spec.steps}",
        "trainer.total_epochs=1000",  # the step count ends the run; epochs only bound it
        f"trainer.seed={spec.seed}",
        "trainer.logger=[console]",
        "trainer.device=cpu",
        f"trainer.default_local_dir={out_dir}",
        "trainer.resume_mode=disable",
        "trainer.save_freq=-1",
        "trainer.test_freq=-1",
        "checkpoint.save_contents=[hf_model]",
        "trainer.project_name=verl_pipe",
        "trainer.experiment_name=warm_start",
    ]


def hf_checkpoint(run_dir: Path, steps: int) -> Path:
    """Where verl's SFT trainer left the final Hugging Face checkpoint."""
    path = Path(run_dir) / f"global_step_{steps}" / "huggingface"
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"verl's SFT trainer left no Hugging Face checkpoint at {path}")
    return path


def run(spec: WarmStart, model_dir: Path, sft_file: Path, out_dir: Path, log=print, max_length: int = 128) -> Path:
    """Trains ``model_dir`` on ``sft_file`` in a subprocess and writes the result to ``out_dir`` (a model directory
    with its tokenizer and generation config, like ``model_dir``)."""
    out_dir = Path(out_dir)
    work = out_dir.parent / f".{out_dir.name}.run"
    shutil.rmtree(work, ignore_errors=True)
    batches = "length" if spec.length_batches else "shuffled"
    cmd = [sys.executable, "-m", "verl_pipe.assets.warm_start", str(work), batches,
           *sft_overrides(spec, model_dir, sft_file, work, max_length)]
    log(f"warm-start: {spec.steps} SFT steps with verl's SFT trainer (batch {spec.batch_size}, lr {spec.lr:g}"
        f"{', length-matched batches' if spec.length_batches else ''}); progress every 30 s in a log")
    sys.stdout.flush()
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), RANK="0", LOCAL_RANK="0",
               WORLD_SIZE="1")
    returncode, output = _run_with_progress(cmd, env, Progress("warm-start SFT", total=spec.steps))
    if returncode != 0:
        tail = "\n".join(output.splitlines()[-30:])
        raise RuntimeError(f"the warm-start SFT failed (exit {returncode}); its last lines:\n{tail}")
    ckpt = hf_checkpoint(work, spec.steps)
    shutil.copytree(ckpt, out_dir)
    (out_dir.parent / "sft.log").write_text(output)  # verl's own log of the run (its loss per step), kept
    # verl saves the model, its config and the tokenizer; the generation config (EOS, pad) comes from the base.
    for name in ("generation_config.json",):
        if (Path(model_dir) / name).is_file():
            shutil.copy(Path(model_dir) / name, out_dir / name)
    shutil.rmtree(work, ignore_errors=True)
    return out_dir


# verl's console logger writes a line per SFT step, "step:N - train/loss:... - ..." (verl.utils.logger.aggregate_logger
# concat_dict_to_str, called by SFTTrainer.fit through Tracking.log): the step count the progress line follows. In the
# captured output it often follows the unfinished line of verl's tqdm bar ("Epoch 1/1000: 6%|...| 1/16 [...]step:2 - ").
STEP_LINE = re.compile(r"(?:^|[^\w/])step:(\d+)(?: - |\s*$)")


def sft_step(line: str) -> int | None:
    """The step number of one of verl's per-step SFT log lines; None for any other line."""
    m = STEP_LINE.search(line)
    return int(m.group(1)) if m else None


def _run_with_progress(cmd: list[str], env: dict, progress: Progress) -> tuple[int, str]:
    """Runs the SFT subprocess, its output captured (kept for sft.log and an error's tail) and its steps shown as they
    come (``progress``); returns its exit status and output."""
    lines = []
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        for line in proc.stdout:
            lines.append(line)
            step = sft_step(line)
            if step is not None:
                progress.update(step)
        returncode = proc.wait()
    if returncode == 0:
        progress.finish()
    return returncode, "".join(lines)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _main(run_dir: str, batches: str, overrides: list[str]) -> None:
    """The subprocess: the CPU platform, one gloo process, verl's SFTTrainer (``batches``: shuffled, verl's own
    sampler, or length, ``LengthBatchSampler``)."""
    from verl_pipe.platform.env import cpu_env

    os.environ.update(cpu_env("0", "0"))
    # No Ray here: verl's Worker reads its device from Ray's runtime context when this is set (as it is in a CPU
    # run's environment, which this process inherits).
    os.environ.pop("RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES", None)
    from verl_pipe.platform.plugin import activate_cpu

    activate_cpu()
    import torch
    import torch.distributed as dist
    from hydra import compose, initialize_config_module

    torch.set_num_threads(1)
    # verl's initialize_global_process_group asks for "cpu:gloo,cpu:gloo" on CPU, which torch rejects; the
    # trainer only needs the default group to exist.
    dist.init_process_group("gloo")
    with initialize_config_module("verl.trainer.config", version_base=None):
        config = compose("sft_trainer_engine", overrides=overrides)
    from verl.trainer.sft_trainer import SFTTrainer

    trainer_cls = SFTTrainer if batches == "shuffled" else _length_batched(SFTTrainer)
    try:
        trainer_cls(config=config).fit()
    finally:
        dist.destroy_process_group()


def _length_batched(sft_trainer_cls):
    """verl's SFTTrainer with its train loader rebuilt on ``LengthBatchSampler`` (same dataset, batch size, collator
    and step count; one process, so the data-parallel split is the whole set)."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    from verl_pipe.assets.length_batches import LengthBatchSampler, message_lengths

    class LengthBatchedSFTTrainer(sft_trainer_cls):
        def _build_dataloader(self):
            super()._build_dataloader()
            if self.engine.get_data_parallel_size() != 1:
                raise RuntimeError("length-matched SFT batches support one process only")
            self.train_sampler = LengthBatchSampler(message_lengths(self.train_dataset.messages),
                                                    self.train_batch_size_per_dp, seed=self.config.trainer.seed)
            self.train_dataloader = StatefulDataLoader(
                dataset=self.train_dataset, batch_size=self.train_batch_size_per_dp, sampler=self.train_sampler,
                collate_fn=self.collate_fn, num_workers=self.config.data.num_workers, pin_memory=False,
                drop_last=True)

    return LengthBatchedSFTTrainer


if __name__ == "__main__":
    _main(sys.argv[1], sys.argv[2], sys.argv[3:])
