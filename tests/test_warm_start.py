"""The SFT warm-start's pure parts: its overrides compose with verl's own SFT config, its cache key, its errors.

The SFT itself runs in the e2e learning test and in every run of the tiny default (built once, cached)."""

from pathlib import Path

import pytest

from verl_pipe.assets.warm_start import WarmStart, hf_checkpoint, sft_overrides


def _compose(overrides):
    from hydra import compose, initialize_config_module

    with initialize_config_module("verl.trainer.config", version_base=None):
        return compose("sft_trainer_engine", overrides=overrides)


def test_overrides_compose_with_verls_sft_trainer_config(tmp_path):
    spec = WarmStart(steps=7, lr=2e-3, batch_size=16, seed=3)
    cfg = _compose(sft_overrides(spec, tmp_path / "base", tmp_path / "sft.parquet", tmp_path / "run"))
    assert cfg.model.path == str(tmp_path / "base") and cfg.data.train_files == str(tmp_path / "sft.parquet")
    assert (cfg.trainer.total_training_steps, cfg.optim.lr, cfg.data.train_batch_size) == (7, 2e-3, 16)
    assert cfg.trainer.seed == 3 and cfg.trainer.device == "cpu" and cfg.engine.strategy == "fsdp2"
    assert list(cfg.checkpoint.save_contents) == ["hf_model"]  # what verl's actor and vLLM load
    assert cfg.model.override_config.attn_implementation == "sdpa"  # no flash-attn on CPU
    assert cfg.engine.mixed_precision.param_dtype == "fp32"  # like the RL default on CPU


def test_cache_key_names_every_field():
    keys = {WarmStart(320, 3e-3).key(), WarmStart(321, 3e-3).key(), WarmStart(320, 1e-3).key(),
            WarmStart(320, 3e-3, batch_size=16).key(), WarmStart(320, 3e-3, seed=1).key(),
            WarmStart(320, 3e-3, length_batches=True).key()}
    assert len(keys) == 6
    # Shuffled batches (verl's own) keep the key they had before length-matched batches existed.
    assert WarmStart(720, 3e-3).key() == "sft-s720-lr0.003-b32-seed0"


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="global_step_5"):
        hf_checkpoint(tmp_path, 5)
    (tmp_path / "global_step_5" / "huggingface").mkdir(parents=True)
    (tmp_path / "global_step_5" / "huggingface" / "config.json").write_text("{}")
    assert hf_checkpoint(tmp_path, 5) == Path(tmp_path / "global_step_5" / "huggingface")
