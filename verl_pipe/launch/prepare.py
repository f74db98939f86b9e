"""A run's config made ready before anything starts: checked first, then completed with what the launcher derives.

``check_config`` runs every check of the config alone (keys and values, recipe files and overrides alike, the paths
the user set), in seconds: a bad value is refused before the tiny assets are built (minutes on a cold cache), before
Ray starts and before any model loads. ``prepare_config`` then fills the asset paths (building the embedded tiny
assets and the SFT warm-start where they are unset), checks those paths and cleans the datasets.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, open_dict

# The base config is the subpackage verl_pipe.conf (conf/ at the top of the checkout, mapped there by pyproject's
# package-dir; verl_pipe/conf in a wheel), found by module name, so an installed verl_pipe runs outside a checkout;
# recipes and verl's ppo_trainer come from the search-path plugin (hydra_plugins/).
CONF_MODULE = "verl_pipe.conf"
# What ``python -m verl_pipe.main_grpo`` runs with no --config-name: the chain recipe (recipes/tiny_cpu_chain.yaml,
# the embedded task whose response lengths have a natural long tail, pipelined: what `make demo` trains). The base
# config it extends (conf/rolloutpipe_trainer.yaml, the digit-math task) is what every test composes; name it with
# --config-name rolloutpipe_trainer.
DEFAULT_RECIPE = "tiny_cpu_chain"


def check_config(config: DictConfig, log=None) -> DictConfig:
    """Every check of the config alone, before anything is built or started: verl's separated-trainer pool keys
    resolved (``rollout.nnodes`` / ``rollout.n_gpus_per_node``, verl_pipe/config_keys.py), what the launcher derives
    without the assets filled in, then ``validate`` (keys and values) and the paths the user set. Raises
    verl_pipe.config.ConfigError naming the key."""
    from verl_pipe.config import ConfigError, resolve_pkg_path, validate, validate_paths
    from verl_pipe.config_keys import UnknownKeyError, apply_pool_aliases

    log = log or (lambda msg: print(msg, flush=True))
    rp = config.rolloutpipe
    with open_dict(config):
        try:
            for note in apply_pool_aliases(config):
                log(f"[verl_pipe] {note}")
        except UnknownKeyError as e:
            raise ConfigError(str(e)) from None
        # Oversampling (with the zero-variance filter): the loader yields the extra prompts too;
        # the step trains the first train_batch_size trainable groups and aborts the rest.
        if int(rp.oversample) > 0:
            config.data.gen_batch_size = int(config.data.train_batch_size) + int(rp.oversample)
        # verl finds an agent-loop file only by an absolute or working-directory-relative path: a pkg:// one (the
        # multi-turn recipe's) becomes the installed file's absolute path, so every process finds it.
        agent = config.actor_rollout_ref.rollout.agent
        if str(agent.get("agent_loop_config_path") or "").startswith("pkg://"):
            try:
                agent.agent_loop_config_path = resolve_pkg_path(agent.agent_loop_config_path)
            except FileNotFoundError as e:
                raise ConfigError(f"actor_rollout_ref.rollout.agent.agent_loop_config_path: {e}") from None
    validate(config, check_paths=False)
    validate_paths(config, unset_ok=_fills_assets(config))
    return config


def _fills_assets(config: DictConfig) -> bool:
    """Whether the launcher fills the model and data paths with the embedded tiny assets."""
    rp = config.rolloutpipe
    return bool(rp.tiny_assets.enable) and not (config.actor_rollout_ref.model.path and config.data.train_files)


def prepare_config(config: DictConfig) -> DictConfig:
    """``check_config``, then the asset paths filled (the tiny assets built on a first run: minutes), those paths
    checked and the datasets cleaned (verl_pipe/data_check.py); before Ray starts."""
    from verl_pipe.config import validate_paths

    config = check_config(config)
    rp = config.rolloutpipe
    with open_dict(config):
        if _fills_assets(config):
            from verl_pipe.assets import ensure_assets

            cache = Path(rp.tiny_assets.cache_dir).expanduser() if rp.tiny_assets.cache_dir else None
            assets = ensure_assets(cache, size=rp.tiny_assets.size, task=rp.tiny_assets.task)
            config.actor_rollout_ref.model.path = config.actor_rollout_ref.model.path or str(_tiny_model(assets, rp))
            config.data.train_files = config.data.train_files or str(assets.train_file)
            config.data.val_files = config.data.val_files or str(assets.val_file)
            if not config.reward.custom_reward_function.path:
                import importlib

                from verl_pipe.assets import TASKS

                reward_mod = importlib.import_module(TASKS[rp.tiny_assets.task].reward_module)  # the task's reward
                config.reward.custom_reward_function.path = reward_mod.__file__
                config.reward.custom_reward_function.name = "compute_score"
    validate_paths(config)
    from verl_pipe.data_check import clean_datasets

    clean_datasets(config)
    return config


def _tiny_model(assets, rp) -> Path:
    """The tiny default's model: the random-init base, or its SFT warm-start (rolloutpipe.tiny_assets.warm_start)."""
    ws = rp.tiny_assets.warm_start
    if int(ws.steps) == 0:
        return assets.model_dir
    from verl_pipe.assets import ensure_warm_start
    from verl_pipe.assets.warm_start import WarmStart

    return ensure_warm_start(assets, WarmStart(steps=int(ws.steps), lr=float(ws.lr), batch_size=int(ws.batch_size),
                                               length_batches=bool(ws.get("length_batches", False))))
