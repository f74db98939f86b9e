"""Start-up checks (verl_pipe/launch/preflight.py): they fail before any worker starts, naming what to change."""

import pytest

from verl_pipe.config import ConfigError
from verl_pipe.launch.preflight import (check_attention, check_checkpoint_backend, check_environment, cpu_leftovers,
                                 gpu_runtime_env)
from verl_pipe.launch.session import compose

GPU = ["rolloutpipe.platform=gpu", "trainer.device=cuda"]
BACKEND = "actor_rollout_ref.rollout.checkpoint_engine.backend"


def test_cpu_leftovers_are_named():
    env = {"VERL_PLATFORM": "cpu", "VLLM_TARGET_DEVICE": "CPU", "VERL_PIPE_ROLLOUT_CORES": "0",
           "VERL_PIPE_TRAINER_CORES": "", "VERL_PIPE_CACHE": "/x", "PATH": "/bin"}
    assert cpu_leftovers(env) == ["VERL_PLATFORM=cpu", "VLLM_TARGET_DEVICE=CPU", "VERL_PIPE_ROLLOUT_CORES=0"]
    assert cpu_leftovers({"VERL_PLATFORM": "nvidia", "VERL_PIPE_CACHE": "/x"}) == []


def test_gpu_run_refuses_a_cpu_environment():
    cfg = compose(GPU)
    with pytest.raises(ConfigError) as err:
        check_environment(cfg, {"VERL_PLATFORM": "cpu", "VERL_PIPE_ALL_CORES": "0-1"})
    msg = str(err.value)
    assert msg.startswith("rolloutpipe.platform:") and "VERL_PLATFORM=cpu" in msg and "VERL_PIPE_ALL_CORES" in msg
    assert "ray start" in msg
    check_environment(cfg, {"VERL_PLATFORM": "", "PATH": "/bin"})  # a clean GPU environment passes
    check_environment(compose([]), {"VERL_PLATFORM": "cpu"})  # the CPU platform sets these itself


def test_gpu_launcher_checks_its_environment_and_blanks_the_workers(monkeypatch):
    """ray_start.select_platform on GPU: refuses leftovers here, and the runtime_env blanks them for Ray's
    processes (verl and our plugin read an empty VERL_PLATFORM as unset)."""
    from verl_pipe.launch.ray_start import select_platform

    cfg = compose(GPU)
    monkeypatch.setenv("VERL_PLATFORM", "cpu")  # tests/conftest.py sets the CPU environment
    with pytest.raises(ConfigError, match="VERL_PLATFORM=cpu"):
        select_platform(cfg)
    for key in ("VERL_PLATFORM", "VLLM_TARGET_DEVICE", "VERL_PIPE_ALL_CORES", "VERL_PIPE_ROLLOUT_CORES",
                "VERL_PIPE_TRAINER_CORES"):
        monkeypatch.delenv(key, raising=False)
    env = select_platform(cfg)
    assert env == gpu_runtime_env()
    assert env["VERL_PLATFORM"] == "" and env["VERL_PIPE_ROLLOUT_CORES"] == "" and env["VERL_PIPE_TRAINER_CORES"] == ""
    monkeypatch.setenv("VERL_PLATFORM", "nvidia")  # an explicit GPU platform is passed on, not blanked
    assert select_platform(cfg)["VERL_PLATFORM"] == "nvidia"


def test_registered_backend_passes():
    check_checkpoint_backend(compose([]))  # ray_store, registered by its custom_backend_module


def test_unimportable_backend_fails_fast_naming_the_key(monkeypatch):
    """verl imports its engines optionally and only records a failed import (cupy for nccl): the check turns
    that into a start-up error naming the key, verl's recorded import error and the install that fixes it."""
    from verl.checkpoint_engine import CheckpointEngineRegistry

    monkeypatch.setattr(CheckpointEngineRegistry, "_registry",
                        {k: v for k, v in CheckpointEngineRegistry._registry.items() if k != "nccl"})
    monkeypatch.setattr(CheckpointEngineRegistry, "_import_errors",
                        {"nccl_checkpoint_engine": ImportError("No module named 'cupy'")})
    cfg = compose([*GPU, f"{BACKEND}=nccl",
                   "++actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.nccl.rebuild_group=true"])
    with pytest.raises(ConfigError) as err:
        check_checkpoint_backend(cfg)
    msg = str(err.value)
    assert msg.startswith(BACKEND + ":") and "'nccl'" in msg and "cupy" in msg and "[gpu]" in msg


def test_unknown_backend_lists_the_registered_ones():
    with pytest.raises(ConfigError, match="registered backends") as err:
        check_checkpoint_backend(compose([f"{BACKEND}=bogus"]))
    assert str(err.value).startswith(BACKEND + ":") and "ray_store" in str(err.value)


def test_unimportable_custom_backend_module_is_named():
    cfg = compose(["actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=no_such_pkg.engine"])
    with pytest.raises(ConfigError, match="custom_backend_module: cannot import 'no_such_pkg.engine'"):
        check_checkpoint_backend(cfg)


def test_flash_attention_needs_flash_attn(monkeypatch):
    import importlib.util

    key = "actor_rollout_ref.model.override_config.attn_implementation"
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "flash_attn" else real(name, *a))
    with pytest.raises(ConfigError) as err:
        check_attention(compose([f"{key}=flash_attention_2"]))
    assert str(err.value).startswith(key + ":") and "use_remove_padding=false" in str(err.value)
    check_attention(compose([]))  # sdpa
