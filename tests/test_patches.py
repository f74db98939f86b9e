"""verl patches (verl_pipe/platform/patches.py) that can be checked without Ray."""

import logging
import types

import pytest

from verl_pipe.platform.patches import patch_separate_async_logger


def _module_with_stdlib_logger():
    logger = logging.getLogger("verl.trainer.ppo.v1.trainer_separate_async")
    logger.setLevel(logging.INFO)  # as verl sets it (VERL_LOGGING_LEVEL, default INFO): info() reaches _log()
    return types.SimpleNamespace(logger=logger)


def test_stdlib_logger_rejects_flush_which_is_what_verl_separate_async_calls():
    # The bug the patch works around: PPOTrainerSeparateAsync._setup (hybrid_engine=False) calls this.
    mod = _module_with_stdlib_logger()
    with pytest.raises(TypeError):
        mod.logger.info("rollout served by standalone replicas only", flush=True)


def test_patched_logger_accepts_flush_and_still_logs(caplog):
    mod = _module_with_stdlib_logger()
    patch_separate_async_logger(mod)
    patch_separate_async_logger(mod)  # idempotent: no adapter around an adapter
    assert isinstance(mod.logger, logging.LoggerAdapter) and not isinstance(mod.logger.logger, logging.LoggerAdapter)
    with caplog.at_level(logging.INFO, logger="verl.trainer.ppo.v1.trainer_separate_async"):
        mod.logger.info("hybrid replicas disabled", flush=True)
    assert "hybrid replicas disabled" in caplog.text


def test_verl_separate_async_still_passes_flush_to_its_logger():
    # If verl stops doing it, the patch can go: this test then tells.
    import importlib.util

    spec = importlib.util.find_spec("verl.trainer.ppo.v1.trainer_separate_async")
    src = open(spec.origin).read()
    setup = src[src.index("def _setup(self):"):src.index("def _compute_old_log_prob")]
    assert "flush=True" in setup and "logger.info(" in setup
