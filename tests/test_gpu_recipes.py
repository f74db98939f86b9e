"""The GPU recipes, composed WITHOUT the CPU test environment (tests/conftest.py sets VERL_PLATFORM=cpu,
VERL_PIPE_*_CORES, VLLM_TARGET_DEVICE=cpu, ... for the CPU stack): a subprocess with those variables removed
composes each recipe, validates it, runs the launcher's environment check and builds Ray's init arguments
(no Ray is started), and reports the resolved values these tests check.
"""

import json
import os
import subprocess
import sys

import pytest

from tests.checkout import ROOT

GPU_RECIPES = ["qwen3_1p7b_gsm8k_4x4", "qwen3_1p7b_dapo_math_4x4", "multinode_ray_cluster"]
CPU_ENV_PREFIXES = ("VERL_", "VLLM_", "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES", "TOKENIZERS_PARALLELISM")

PROBE = r"""
import json, os, sys
from omegaconf import OmegaConf
from verl_pipe.config import validate
from verl_pipe.launch.ray_start import ray_init_kwargs
from verl_pipe.launch.preflight import check_environment
from verl_pipe.launch.session import compose

out = {}
for name in sys.argv[1:]:
    cfg = compose([], config_name=name)
    validate(cfg, check_paths=False)
    check_environment(cfg)
    kwargs = ray_init_kwargs(cfg)
    sel = lambda key: OmegaConf.select(cfg, key)
    out[name] = {key: sel(key) for key in (
        "rolloutpipe.platform", "trainer.device", "rolloutpipe.allow_ray_store_on_gpu",
        "actor_rollout_ref.actor.use_torch_compile", "actor_rollout_ref.actor.fsdp_config.use_torch_compile",
        "actor_rollout_ref.ref.use_torch_compile", "actor_rollout_ref.ref.fsdp_config.use_torch_compile",
        "actor_rollout_ref.rollout.agent.num_workers", "trainer.balance_batch",
        "actor_rollout_ref.rollout.checkpoint_engine.backend",
        "actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.nccl.rebuild_group",
        "rolloutpipe.fault.replica_restart", "actor_rollout_ref.model.override_config.attn_implementation",
        "actor_rollout_ref.model.use_remove_padding", "rolloutpipe.cgp.granularity")}
    out[name]["ray_env"] = kwargs["runtime_env"]["env_vars"]
    out[name]["ray_num_gpus"] = kwargs.get("num_gpus")
    out[name]["process_env"] = {k: v for k, v in os.environ.items() if k.startswith(("VERL_PLATFORM", "VERL_PIPE_"))}
print("RESULT" + json.dumps(out))
"""


@pytest.fixture(scope="module")
def resolved() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(CPU_ENV_PREFIXES)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(ROOT), os.environ.get("PYTHONPATH", "")] if p)
    out = subprocess.run([sys.executable, "-c", PROBE, *GPU_RECIPES], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (line,) = [x for x in out.stdout.splitlines() if x.startswith("RESULT")]
    return json.loads(line[len("RESULT"):])


@pytest.mark.parametrize("name", GPU_RECIPES)
def test_gpu_recipe_has_gpu_defaults(resolved, name):
    r = resolved[name]
    assert r["rolloutpipe.platform"] == "gpu" and r["trainer.device"] == "cuda"
    # torch.compile on (verl's default; the CPU base turns it off)
    for key in ("actor_rollout_ref.actor.use_torch_compile", "actor_rollout_ref.actor.fsdp_config.use_torch_compile",
                "actor_rollout_ref.ref.use_torch_compile", "actor_rollout_ref.ref.fsdp_config.use_torch_compile"):
        assert r[key] is True, key
    assert r["actor_rollout_ref.rollout.agent.num_workers"] == 8  # verl's default (CPU base: 1)
    # verl's DP balancing, applied per unit (exact): only at mini-batch granularity
    assert r["trainer.balance_batch"] is True and r["rolloutpipe.cgp.granularity"] == "minibatch"
    # NCCL weight sync that survives a replica restart/retirement (restart is on)
    assert r["actor_rollout_ref.rollout.checkpoint_engine.backend"] == "nccl"
    assert r["rolloutpipe.fault.replica_restart"] is True
    assert r["actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.nccl.rebuild_group"] is True
    assert r["rolloutpipe.allow_ray_store_on_gpu"] is False
    # what the gpu extra installs: no flash-attn, so sdpa on padded batches
    assert r["actor_rollout_ref.model.override_config.attn_implementation"] == "sdpa"
    assert r["actor_rollout_ref.model.use_remove_padding"] is False


@pytest.mark.parametrize("name", GPU_RECIPES)
def test_gpu_launch_keeps_cpu_settings_out(resolved, name):
    r = resolved[name]
    assert r["ray_num_gpus"] is None  # Ray counts the real GPUs (the CPU platform fakes logical ones)
    assert r["ray_env"]["VERL_PLATFORM"] == ""  # a raylet's leftover VERL_PLATFORM=cpu is blanked
    assert all(r["ray_env"][k] == "" for k in ("VERL_PIPE_ALL_CORES", "VERL_PIPE_ROLLOUT_CORES",
                                                "VERL_PIPE_TRAINER_CORES"))
    assert "VLLM_TARGET_DEVICE" not in r["ray_env"] and "VLLM_CPU_KVCACHE_SPACE" not in r["ray_env"]
    assert r["process_env"] == {}  # the launcher set none of the CPU platform's variables
