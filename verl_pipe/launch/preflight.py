"""Start-up checks of the environment a run starts in (``validate`` in config.py checks the config alone).

- ``check_environment``: on ``rolloutpipe.platform=gpu``, the launcher's environment must not carry what
  selects our CPU platform (``VERL_PLATFORM=cpu``, ``VLLM_TARGET_DEVICE=cpu``) or pins pools to cores
  (``VERL_PIPE_*_CORES``): left over from a CPU run, they would silently put a GPU run on CPU paths.
  ``gpu_runtime_env`` overrides ``VERL_PLATFORM`` and the core lists for every process Ray starts for the
  run, so a raylet that inherited them (``ray start`` from such a shell) cannot pass them on either.
- ``check_gpu_driver``: on ``rolloutpipe.platform=gpu``, this node's NVIDIA driver can run the CUDA build of the
  installed torch (CUDA 13, PyPI's torch 2.13.0: driver >= 580 and Turing or newer GPUs; ``gpu_driver.py``).
- ``check_runtime``, in the process that builds the workers, before any is created: the configured
  checkpoint-engine backend is registered in verl's ``CheckpointEngineRegistry`` (verl imports its engines
  optionally and only records a failed import, e.g. cupy missing for ``nccl``), and flash-attn is importable
  when the model asks for ``flash_attention_2``.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping

from omegaconf import DictConfig, OmegaConf

from verl_pipe.config import CHECKPOINT_BACKEND_KEY, ConfigError

# Set by verl_pipe.platform.env.cpu_env for a CPU run; each one alone changes what a GPU run does.
CPU_PLATFORM_VARS = ("VERL_PLATFORM", "VLLM_TARGET_DEVICE")
CORE_VARS = ("VERL_PIPE_ALL_CORES", "VERL_PIPE_ROLLOUT_CORES", "VERL_PIPE_TRAINER_CORES")


def cpu_leftovers(environ: Mapping[str, str]) -> list[str]:
    """``NAME=value`` of each CPU-run variable set in ``environ`` that would change a GPU run."""
    found = [f"{k}={environ[k]}" for k in CPU_PLATFORM_VARS if environ.get(k, "").strip().lower() == "cpu"]
    cores = sorted(k for k in environ if k.startswith("VERL_PIPE_") and k.endswith("_CORES") and environ[k].strip())
    return found + [f"{k}={environ[k]}" for k in cores]


def check_environment(config: DictConfig, environ: Mapping[str, str] | None = None) -> None:
    if config.rolloutpipe.platform != "gpu":
        return
    leftovers = cpu_leftovers(os.environ if environ is None else environ)
    if leftovers:
        raise ConfigError(
            f"rolloutpipe.platform: 'gpu', but the environment carries CPU-run settings: {', '.join(leftovers)}. "
            "They select verl_pipe's CPU platform or pin the pools to cores; unset them (e.g. `unset "
            f"{' '.join(v.split('=', 1)[0] for v in leftovers)}`), also in the shell that ran `ray start`")


def check_gpu_driver(config: DictConfig, **probe) -> None:
    """``probe``: gpu_driver.check_gpu_driver's injectables (torch's build, nvidia-smi, /proc, /dev), for tests."""
    if config.rolloutpipe.platform != "gpu":
        return
    from verl_pipe.launch.gpu_driver import check_gpu_driver as check

    check(**probe)


def gpu_runtime_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Ray runtime_env variables of a GPU run: the launcher's own VERL_PLATFORM (an explicit GPU platform such
    as ``nvidia``, or empty: verl and our plugin read an empty value as unset) and the core lists blanked (an
    empty core list pins nothing). Call after ``check_environment``."""
    environ = os.environ if environ is None else environ
    return {"VERL_PLATFORM": environ.get("VERL_PLATFORM", "").strip(), **{k: "" for k in CORE_VARS}}


def check_runtime(config: DictConfig) -> None:
    check_checkpoint_backend(config)
    check_attention(config)


def check_checkpoint_backend(config: DictConfig) -> None:
    """The backend resolves the way verl's workers resolve it (CheckpointEngineWorker and the actor worker:
    import ``custom_backend_module``, then ``CheckpointEngineRegistry``), with verl's recorded import errors."""
    from verl.checkpoint_engine import CheckpointEngineRegistry
    from verl.utils.import_utils import import_external_libs

    engine = config.actor_rollout_ref.rollout.checkpoint_engine
    backend = engine.backend
    module = engine.get("custom_backend_module")
    if module:
        try:
            import_external_libs(module)
        except Exception as e:
            raise ConfigError(f"actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module: cannot import "
                              f"{module!r} ({type(e).__name__}: {e})") from e
    try:
        CheckpointEngineRegistry.get(backend)
    except ValueError as e:
        hint = (" For nccl install cupy (pip install \"verl-pipe[gpu]\" brings verl[cupy-cu130], i.e. "
                "cupy-cuda13x), or pick another backend." if backend == "nccl" else "")
        raise ConfigError(f"{CHECKPOINT_BACKEND_KEY}: {backend!r} is not usable here: {e}.{hint}") from e


def check_attention(config: DictConfig) -> None:
    impl = OmegaConf.select(config, "actor_rollout_ref.model.override_config.attn_implementation", default=None)
    if impl == "flash_attention_2" and importlib.util.find_spec("flash_attn") is None:
        raise ConfigError(
            "actor_rollout_ref.model.override_config.attn_implementation: 'flash_attention_2' but flash-attn is not "
            "installed (the gpu extra does not bring it: PyPI has no wheel). Use sdpa (with "
            "actor_rollout_ref.model.use_remove_padding=false), or install a flash-attn wheel built for this torch")
