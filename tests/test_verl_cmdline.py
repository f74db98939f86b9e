"""A verl user's command line carries over (issue 61(a)): every override of verl's own example GRPO script either works
through our config check or is refused by a message that names its key, never Hydra's raw ``not in struct``; verl's
separated trainers' pool keys (``rollout.nnodes``, ``rollout.n_gpus_per_node``) are aliases of ours, and their other
top-level ``rollout.*`` keys are refused naming the key to use.

Pure: composes configs and runs the launcher's config check (verl_pipe/launch/prepare.py check_config); no Ray, no
model, no asset build.
"""

import shlex

import pytest
from omegaconf import OmegaConf

from verl_pipe.config import ConfigError
from verl_pipe.launch.prepare import check_config
from verl_pipe.launch.session import compose

# verl's examples/grpo_trainer/run_qwen3-8b.sh (github.com/volcengine/verl, last changed in a31a8f251faa, read at
# b178a3cd56f58b2d502255daba591e92833930a7; the stored snapshot of verl's repository holds no v0.9.1 tag, and the pip
# package ships no examples): the overrides it passes to `python3 -m verl.trainer.main_ppo`, as written there.
VERL_GRPO_EXAMPLE = r"""
    algorithm.adv_estimator=grpo
    data.train_files=$HOME/data/gsm8k/train.parquet
    data.val_files=$HOME/data/gsm8k/test.parquet
    data.train_batch_size=1024
    data.max_prompt_length=512
    data.max_response_length=1024
    data.filter_overlong_prompts=True
    data.truncation='error'
    actor_rollout_ref.model.path=Qwen/Qwen3-8B
    actor_rollout_ref.actor.optim.lr=1e-6
    actor_rollout_ref.model.use_remove_padding=True
    actor_rollout_ref.actor.ppo_mini_batch_size=256
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32
    actor_rollout_ref.actor.use_kl_loss=True
    actor_rollout_ref.actor.kl_loss_coef=0.001
    actor_rollout_ref.actor.kl_loss_type=low_var_kl
    actor_rollout_ref.actor.entropy_coeff=0
    actor_rollout_ref.model.enable_gradient_checkpointing=True
    actor_rollout_ref.actor.fsdp_config.param_offload=False
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=False
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32
    actor_rollout_ref.rollout.tensor_model_parallel_size=2
    actor_rollout_ref.rollout.name=vllm
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6
    actor_rollout_ref.rollout.n=5
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=32
    actor_rollout_ref.ref.fsdp_config.param_offload=True
    algorithm.use_kl_in_reward=False
    trainer.critic_warmup=0
    trainer.logger='["console","wandb"]'
    trainer.project_name='verl_grpo_example_gsm8k'
    trainer.experiment_name='qwen3_8b_function_rm'
    trainer.n_gpus_per_node=8
    trainer.nnodes=1
    trainer.save_freq=20
    trainer.test_freq=5
    trainer.total_epochs=15
"""
# The configs a verl user starts from: the CPU base, and the GPU recipe that stands for verl's GSM8K GRPO example.
CONFIGS = ("rolloutpipe_trainer", "qwen3_1p7b_gsm8k_4x4")


def example_overrides(home) -> list[str]:
    return shlex.split(VERL_GRPO_EXAMPLE.replace("$HOME", str(home)))


@pytest.fixture
def home(tmp_path):
    """$HOME with the data files verl's GSM8K preprocessing writes (empty: only their paths are checked)."""
    (tmp_path / "data" / "gsm8k").mkdir(parents=True)
    for name in ("train.parquet", "test.parquet"):
        (tmp_path / "data" / "gsm8k" / name).write_bytes(b"")
    return tmp_path


def _base(home) -> list[str]:
    """Existing data paths and a model (a hub id: accepted by shape), so an override is judged on its own."""
    data = home / "data" / "gsm8k"
    return [f"data.train_files={data / 'train.parquet'}", f"data.val_files={data / 'test.parquet'}",
            "actor_rollout_ref.model.path=Qwen/Qwen3-8B"]


def _check(cfg) -> str | None:
    """None when the launcher's config check passes, else its message."""
    try:
        check_config(cfg, log=lambda msg: None)
    except ConfigError as e:
        return str(e)
    return None


def _outcome(config_name: str, overrides: list[str]) -> str | None:
    return _check(compose(overrides, config_name=config_name))  # Hydra's struct check: every key exists in ours


def _with(cfg, override: str):
    """``cfg`` with one more command-line override, its value parsed as Hydra parses it (one composition per config
    instead of one per override: the test_the_whole_... test composes them all through Hydra)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_override(override)
    out = cfg.copy()
    OmegaConf.update(out, parsed.key_or_group, parsed.value(), merge=False)
    return out


def test_the_embedded_list_is_verls_grpo_example():
    args = example_overrides("/home/u")
    assert len(args) == 37 and args[0] == "algorithm.adv_estimator=grpo"
    assert all("=" in a and not a.startswith("+") for a in args)
    verl = compose(args, config_name="ppo_trainer")  # verl's own config composes them (the keys are verl 0.9.1's)
    assert verl.actor_rollout_ref.rollout.n == 5 and verl.trainer.logger == ["console", "wandb"]


@pytest.mark.parametrize("config_name", CONFIGS)
def test_each_override_of_verls_grpo_example_works_or_is_refused_by_name(config_name, home):
    refused = {}
    base = compose(_base(home), config_name=config_name)
    for override in example_overrides(home):
        key = override.split("=", 1)[0]
        message = _check(_with(base, override))
        if message is not None:
            assert key in message, f"{override}: refused without naming {key}: {message}"
            refused[key] = message
    # what a verl command cannot keep as is, each with its reason (the rest works unchanged)
    if config_name == "rolloutpipe_trainer":  # the CPU base: the tiny model's engine and batch
        assert set(refused) == {"actor_rollout_ref.actor.ppo_mini_batch_size", "data.max_prompt_length",
                                "data.max_response_length",
                                "actor_rollout_ref.rollout.tensor_model_parallel_size"}, refused
        assert "must be 1 on CPU" in refused["actor_rollout_ref.rollout.tensor_model_parallel_size"]
        assert refused["data.max_prompt_length"].startswith("actor_rollout_ref.rollout.max_model_len: got 128")
    else:  # the GPU recipe: verl's mini-batch of 256 prompts against the recipe's 128 a step
        assert set(refused) == {"actor_rollout_ref.actor.ppo_mini_batch_size"}, refused
        assert "must be a multiple of ppo_mini_batch_size=256" in refused["actor_rollout_ref.actor.ppo_mini_batch_size"]


@pytest.mark.parametrize("config_name", CONFIGS)
def test_the_whole_verl_example_at_once_works_or_is_refused_by_name(config_name, home):
    keys = [o.split("=", 1)[0] for o in example_overrides(home)]
    message = _outcome(config_name, example_overrides(home))
    assert message is None or any(k in message for k in keys), message
    if config_name != "rolloutpipe_trainer":
        assert message is None  # verl's whole example passes on the GPU recipe (its own batch: 1024 / 256)


def test_verls_separated_trainer_pool_keys_are_aliases_of_ours(home):
    """verl's one_step_off / fully_async size the rollout pool with a top-level rollout:; here they set ours, and the
    launcher writes the pool's size back there (verl's create_resource_pool_manager reads it) without dropping them."""
    cfg = compose(_base(home) + ["rollout.nnodes=1", "rollout.n_gpus_per_node=4"], config_name="qwen3_1p7b_gsm8k_4x4")
    notes = []
    check_config(cfg, log=notes.append)
    assert cfg.actor_rollout_ref.rollout.n_gpus_per_node == 4 and cfg.actor_rollout_ref.rollout.nnodes == 1
    assert OmegaConf.to_container(cfg.rollout) == {"nnodes": 1, "n_gpus_per_node": 4}
    assert notes == []  # the recipe's pool is 4 GPUs already: nothing changed
    cfg = compose(_base(home) + ["rollout.n_gpus_per_node=2"], config_name="qwen3_1p7b_gsm8k_4x4")
    check_config(cfg, log=notes.append)
    assert cfg.actor_rollout_ref.rollout.n_gpus_per_node == 2 and cfg.rollout.n_gpus_per_node == 2
    assert notes == ["[verl_pipe] rollout.n_gpus_per_node=2 (verl's separated-trainer key) sets "
                     "actor_rollout_ref.rollout.n_gpus_per_node (was 4)"]
    # unset, the launcher writes ours there (what verl's separated wiring reads)
    cfg = compose(_base(home), config_name="qwen3_1p7b_gsm8k_4x4")
    check_config(cfg, log=notes.append)
    assert OmegaConf.to_container(cfg.rollout) == {"nnodes": 1, "n_gpus_per_node": 4}


@pytest.mark.parametrize("override, named, says", [
    ("rollout.n=4", "rollout.n", "actor_rollout_ref.rollout.n"),
    ("rollout.total_rollout_steps=100", "rollout.total_rollout_steps", "trainer.total_training_steps"),
    ("rollout.n_gpus_per_node=0", "rollout.n_gpus_per_node", "an integer >= 1"),
    ("+rollout.n_gpu_per_node=4", "rollout.n_gpu_per_node", "did you mean rollout.n_gpus_per_node?"),
])
def test_verls_other_separated_trainer_keys_are_refused_naming_the_key_to_use(override, named, says, home):
    message = _outcome("rolloutpipe_trainer", _base(home) + [override])
    assert message is not None and message.startswith(named + ":") and says in message, message


def test_the_base_config_checks_clean(home):
    assert _outcome("rolloutpipe_trainer", _base(home)) is None
