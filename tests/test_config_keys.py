"""Unknown keys anywhere in the composed config are refused at launch, with a did-you-mean, against verl 0.9.1's own
keys (its ppo_trainer YAML and the dataclasses its sections instantiate: verl_pipe/config_keys.py); Hugging Face hub
ids are accepted as model paths (by shape, nothing fetched); the GPU run scripts pin verl's release tag."""

import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from verl_pipe.config import ConfigError, validate
from verl_pipe.config_keys import CALLEE_KWARGS, READ_BY_VERL, unknown_keys, verl_reference
from verl_pipe.launch.session import compose

ROOT = Path(__file__).resolve().parent.parent
RECIPES = sorted(p.stem for p in (ROOT / "recipes").glob("*.yaml"))


@pytest.mark.parametrize("name", ["rolloutpipe_trainer", *RECIPES])
def test_every_shipped_config_has_only_known_keys(name):
    assert unknown_keys(compose([], config_name=name)) == []


@pytest.mark.parametrize("override, key, hint", [
    ("+data.train_batchsize=4", "data.train_batchsize", "did you mean data.train_batch_size?"),
    ("+trainer.totl_epochs=2", "trainer.totl_epochs", "did you mean trainer.total_epochs?"),
    # verl's dataclass sections: a misspelt field used to end in Hydra's instantiation traceback
    ("+actor_rollout_ref.actor.ppo_mini_batchsize=4", "actor_rollout_ref.actor.ppo_mini_batchsize",
     "did you mean actor_rollout_ref.actor.ppo_mini_batch_size?"),
    ("+actor_rollout_ref.actor.fsdp_config.param_ofload=true", "actor_rollout_ref.actor.fsdp_config.param_ofload",
     "did you mean actor_rollout_ref.actor.fsdp_config.param_offload?"),
    ("+actor_rollout_ref.rollout.max_num_seq=8", "actor_rollout_ref.rollout.max_num_seq",
     "did you mean actor_rollout_ref.rollout.max_num_seqs?"),
    # a mapping verl hands to ray.init: ray.init's parameters
    ("+ray_kwargs.ray_init.adress=auto", "ray_kwargs.ray_init.adress", "did you mean ray_kwargs.ray_init.address?"),
    ("+ppo_mini_batch_size=4", "ppo_mini_batch_size", "did you mean actor_rollout_ref.actor.ppo_mini_batch_size"),
])
def test_an_unknown_key_is_refused_naming_it_with_a_did_you_mean(override, key, hint):
    with pytest.raises(ConfigError) as err:
        validate(compose([override]), check_paths=False)
    msg = str(err.value)
    assert msg.startswith(f"{key}: unknown key") and hint in msg, msg


@pytest.mark.parametrize("override", [
    "+ray_kwargs.ray_init.address=auto",  # ray.init's own parameter
    "+actor_rollout_ref.model.override_config.rope_theta=10000",  # verl's open mappings: the model's config
    "+reward.custom_reward_function.reward_kwargs.scale=2",  # read by verl's code, not in its YAML (READ_BY_VERL)
    "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bf16",  # a dataclass field (FSDPEngineConfig)
])
def test_keys_verl_takes_pass(override):
    assert unknown_keys(compose([override])) == []


def test_the_keys_read_by_verls_code_are_read_there():
    """READ_BY_VERL is not a list to grow by hand: each key is read by the verl function it names (its source)."""
    import importlib

    for path, fn in READ_BY_VERL.items():
        module, _, name = fn.rpartition(".")
        source = inspect.getsource(getattr(importlib.import_module(module), name))
        assert f'"{path.rsplit(".", 1)[-1]}"' in source, (path, fn)
    for path, callee in CALLEE_KWARGS.items():
        assert path in {p for p in _paths(verl_reference())}, path


def _paths(node, prefix=""):
    from omegaconf import DictConfig

    for k in node.keys():
        p = f"{prefix}.{k}" if prefix else str(k)
        yield p
        child = node._get_node(k)
        if isinstance(child, DictConfig):
            yield from _paths(child, p)


def test_a_users_recipe_with_a_misspelt_key_is_refused_at_launch(tmp_path):
    """The issue's case, through the launcher: a recipe file in a --config-dir extending ours, `data: {train_batchsize:
    4}`, used to train a step and exit 0; now the launch stops before Ray starts, naming the key."""
    (tmp_path / "my_recipe.yaml").write_text("defaults:\n  - rolloutpipe_trainer\n  - _self_\n\n"
                                             "data:\n  train_batchsize: 4\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-m", "verl_pipe.main_grpo", "--config-dir", str(tmp_path),
                          "--config-name", "my_recipe", "rolloutpipe.tiny_assets.warm_start.steps=0"],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert out.returncode != 0
    text = out.stdout + out.stderr
    assert "data.train_batchsize: unknown key (did you mean data.train_batch_size?)" in text, text[-3000:]
    assert "workers ready" not in text and "ray.init" not in text.lower()


@pytest.mark.parametrize("model", ["Qwen/Qwen3-1.7B", "meta-llama/Llama-3.1-8B-Instruct"])
def test_a_hub_id_is_accepted_as_the_model_path_without_fetching(model, tmp_path):
    data = tmp_path / "train.parquet"
    data.write_bytes(b"")
    cfg = compose([f"actor_rollout_ref.model.path={model}", f"data.train_files={data}", f"data.val_files={data}"])
    validate(cfg)  # shape only: no network here


@pytest.mark.parametrize("model", ["/no/such/model", "./models/missing", "Qwen/Qwen3 1.7B", "Qwen/Qwen3/extra"])
def test_a_model_path_that_is_neither_is_refused(model, tmp_path):
    data = tmp_path / "train.parquet"
    data.write_bytes(b"")
    cfg = compose([f"actor_rollout_ref.model.path={model}", f"data.train_files={data}", f"data.val_files={data}"])
    with pytest.raises(ConfigError, match=r"actor_rollout_ref.model.path: .* does not exist, and it is not a Hugging "
                                          r"Face hub id"):
        validate(cfg)


def test_the_cpu_default_stays_local():
    cfg = compose([])
    assert cfg.actor_rollout_ref.model.path is None and cfg.rolloutpipe.tiny_assets.enable  # built locally


@pytest.mark.parametrize("script", sorted((ROOT / "recipes").glob("*.sh")), ids=lambda p: p.name)
def test_gpu_scripts_clone_verls_release_tag(script):
    text = script.read_text()
    for clone in re.findall(r"git clone[^\n]*", text):
        assert "verl" not in clone or re.search(r"--branch \"?\$VERL_TAG\"?|--branch v0\.9\.1", clone), clone
    if "git clone" in text:
        assert re.search(r"VERL_TAG=v0\.9\.1\b", text)
        assert 'rev-parse "$VERL_TAG^{commit}"' in text, "an existing checkout at another commit is refused"
