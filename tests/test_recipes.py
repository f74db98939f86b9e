"""recipes/: every recipe composes through the Hydra search path (plugin in hydra_plugins/), passes our
validation and verl's own config checks, and sets only keys that verl's config already has.

No Ray, no model, no data: the recipes' files are for other machines (GPU clusters), so paths are not checked.
"""

import re
import subprocess
from pathlib import Path

import pytest
from omegaconf import DictConfig, OmegaConf, open_dict

from verl_pipe.config import validate
from verl_pipe.config_keys import apply_pool_aliases
from verl_pipe.launch.session import compose

ROOT = Path(__file__).resolve().parent.parent
RECIPE_DIR = ROOT / "recipes"
RECIPES = sorted(p.stem for p in RECIPE_DIR.glob("*.yaml"))
# The cluster each GPU recipe is written for: (nodes, GPUs per node), from the recipe's header.
GPU_CLUSTERS = {
    "qwen3_1p7b_gsm8k_4x4": (1, 8),
    "qwen3_1p7b_dapo_math_4x4": (1, 8),
    "multinode_ray_cluster": (2, 8),
}
TINY = ["tiny_cpu", "tiny_cpu_cgp_fgd", "tiny_cpu_chain", "tiny_cpu_digit_math", "tiny_cpu_extension_example",
        "tiny_cpu_multiturn_cgp_fgd", "tiny_cpu_reinforce_pp_baseline"]
# Plain-dict nodes whose keys are free (passed on as keyword arguments), not verl dataclass fields.
FREE_KEYS = ("ray_kwargs.ray_init.", "actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.")


@pytest.fixture(scope="module")
def configs() -> dict[str, DictConfig]:
    return {name: compose([], config_name=name) for name in RECIPES}


@pytest.fixture(scope="module")
def base() -> DictConfig:
    return compose([])


def test_expected_recipes_exist():
    assert set(GPU_CLUSTERS) | set(TINY) <= set(RECIPES)


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_composes_and_validates(configs, name):
    cfg = configs[name].copy()
    validate(cfg, check_paths=False)
    OmegaConf.resolve(cfg)  # every interpolation (${oc.env:HOME}, ${oc.select:...}) resolves


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_passes_verl_checks(configs, name):
    """verl's validate_config (batch divisibility over the trainer's world size, ...) and its dataclasses."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    cfg = configs[name].copy()
    with open_dict(cfg):  # what the launcher derives for verl's separate-pool wiring (launch/prepare.py)
        apply_pool_aliases(cfg)
    OmegaConf.resolve(cfg)
    validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    for node in ("actor_rollout_ref.rollout", "actor_rollout_ref.actor", "algorithm",
                 "actor_rollout_ref.rollout.checkpoint_engine"):
        omega_conf_to_dataclass(OmegaConf.select(cfg, node))  # raises on a field the dataclass lacks


def _leaves(node: dict, prefix: str = ""):
    for k, v in node.items():
        if isinstance(v, dict) and v:
            yield from _leaves(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}"


def _exists(cfg: DictConfig, dotted: str) -> bool:
    node = cfg
    for part in dotted.split("."):
        if node is None:  # a null node in the base (e.g. rolloutpipe.workload) takes any value
            return True
        if not isinstance(node, DictConfig) or part not in node:
            return False
        node = node._get_node(part)
        node = None if node._is_none() else node
    return True


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_sets_only_existing_keys(base, name):
    """A recipe overrides keys; it never invents one under verl's nodes (our own keys live in rolloutpipe:)."""
    own = OmegaConf.to_container(OmegaConf.load(RECIPE_DIR / f"{name}.yaml")) or {}
    own.pop("defaults", None)
    own.pop("hydra", None)
    unknown = [k for k in _leaves(own) if not k.startswith(FREE_KEYS) and not _exists(base, k)]
    assert not unknown, f"recipes/{name}.yaml sets keys that conf/rolloutpipe_trainer.yaml + verl lack: {unknown}"


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_says_what_data_it_expects(name):
    header = []
    for line in (RECIPE_DIR / f"{name}.yaml").read_text().splitlines():
        if not line.startswith("#"):
            break
        header.append(line)
    assert header and any(line.startswith("# Data:") for line in header), \
        f"recipes/{name}.yaml must open with a comment block with a '# Data:' line"


@pytest.mark.parametrize("name", sorted(GPU_CLUSTERS))
def test_gpu_recipe_uses_separate_pools_that_fill_the_cluster(configs, name):
    cfg = configs[name]
    nodes, gpus_per_node = GPU_CLUSTERS[name]
    rp, t, r = cfg.rolloutpipe, cfg.trainer, cfg.actor_rollout_ref.rollout
    assert rp.platform == "gpu" and t.device == "cuda"
    assert not rp.tiny_assets.enable
    assert not cfg.actor_rollout_ref.hybrid_engine
    trainer_gpus = t.nnodes * t.n_gpus_per_node
    rollout_gpus = r.nnodes * r.n_gpus_per_node
    assert trainer_gpus > 0 and rollout_gpus > 0
    assert trainer_gpus + rollout_gpus == nodes * gpus_per_node
    assert rollout_gpus % (r.tensor_model_parallel_size * r.data_parallel_size) == 0
    assert r.checkpoint_engine.backend == "nccl"  # GPU-to-GPU weight sync between the pools
    assert r.max_model_len >= cfg.data.max_prompt_length + cfg.data.max_response_length
    assert rp.workload is None  # the model decides the lengths on a real run
    if rp.fgd.enable:
        assert rp.mode == "cgp" and r.scheduling_policy == "priority"


def test_multinode_recipe_joins_a_running_cluster(configs):
    assert configs["multinode_ray_cluster"].ray_kwargs.ray_init.address == "auto"


@pytest.mark.parametrize("name", TINY)
def test_tiny_recipes_run_on_this_cpu_machine(configs, name):
    cfg = configs[name]
    assert cfg.rolloutpipe.platform == "cpu" and cfg.trainer.device == "cpu"
    assert cfg.rolloutpipe.tiny_assets.enable


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_trainer_class_and_reward_load(configs, name):
    """A recipe's rolloutpipe.trainer_class and custom reward function load the way a run loads them
    (verl_pipe.launch.task_runner.build_trainer; verl's reward loop)."""
    from verl.trainer.ppo.reward import get_custom_reward_fn
    from verl.utils.import_utils import load_class_from_fqn

    from verl_pipe.trainer import RolloutPipeTrainer

    cfg = configs[name]
    if cfg.rolloutpipe.trainer_class:
        assert issubclass(load_class_from_fqn(cfg.rolloutpipe.trainer_class), RolloutPipeTrainer)
    if cfg.reward.custom_reward_function.path:
        assert callable(get_custom_reward_fn(cfg))


def test_tiny_cpu_is_the_embedded_default(configs, base):
    assert OmegaConf.to_container(configs["tiny_cpu"]) == OmegaConf.to_container(base)


def test_tiny_task_recipes_fit_their_tasks_lengths(configs):
    """The chain recipe's caps hold its long tail (prompt + response within vLLM's max_model_len) and its
    warm-start uses length-matched batches; the digit_math recipe keeps the short caps and verl's shuffled batches."""
    for name, task, response, length_batches in (("tiny_cpu_chain", "chain", 320, True),
                                                  ("tiny_cpu_digit_math", "digit_math", 32, False)):
        cfg = configs[name]
        assert cfg.rolloutpipe.tiny_assets.task == task
        assert cfg.rolloutpipe.tiny_assets.warm_start.length_batches is length_batches
        assert cfg.data.max_response_length == response
        assert cfg.data.max_prompt_length + cfg.data.max_response_length <= cfg.actor_rollout_ref.rollout.max_model_len
    # The chain task's small pool (chain_data.N_TRAIN) repeats within a run, and its epochs hold the 40 steps.
    from verl_pipe.assets.chain_data import N_TRAIN

    chain = configs["tiny_cpu_chain"]
    assert chain.trainer.total_training_steps * chain.data.train_batch_size <= N_TRAIN * chain.trainer.total_epochs


def test_tiny_cgp_fgd_is_pipelined_with_a_long_tail(configs):
    rp = configs["tiny_cpu_cgp_fgd"].rolloutpipe
    assert rp.mode == "cgp" and rp.fgd.enable and rp.workload.kind == "lognormal"


def test_tiny_multiturn_selects_the_agent_loop_and_its_environment(configs):
    """The multi-turn recipe: CGP + FGD, verl's agent-loop file names our loop (what verl's AgentLoopWorker reads),
    the launcher resolves its pkg:// path, and the environment's settings parse."""
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry

    from verl_pipe.assets.multiturn_env import EnvConfig
    from verl_pipe.config import resolve_pkg_path
    from verl_pipe.rollout.multiturn import AGENT_NAME, MultiTurnEnvAgentLoop, env_config

    cfg = configs["tiny_cpu_multiturn_cgp_fgd"]
    rp, rollout = cfg.rolloutpipe, cfg.actor_rollout_ref.rollout
    assert rp.mode == "cgp" and rp.fgd.enable and rp.workload is None
    assert rollout.agent.default_agent_loop == AGENT_NAME
    assert rollout.max_model_len >= cfg.data.max_prompt_length + cfg.data.max_response_length
    env = env_config(cfg)
    assert env == EnvConfig.from_dict(OmegaConf.to_container(rp.multiturn)) and env.turns.cap > 1
    assert env.turn_max_tokens <= cfg.data.max_response_length
    entries = OmegaConf.load(resolve_pkg_path(rollout.agent.agent_loop_config_path))
    assert [e.name for e in entries] == [AGENT_NAME]
    assert entries[0]["_target_"] == f"{MultiTurnEnvAgentLoop.__module__}.{MultiTurnEnvAgentLoop.__qualname__}"
    assert _agent_loop_registry[AGENT_NAME]["_target_"] == entries[0]["_target_"]


def test_single_turn_recipes_keep_verls_agent_loop(configs):
    multi_turn = ("tiny_cpu_multiturn_cgp_fgd", "qwen3_1p7b_tool_calc_4x4")  # the latter: tests/test_tool_recipe.py
    for name, cfg in configs.items():
        if name not in multi_turn:
            assert cfg.rolloutpipe.multiturn is None
            assert cfg.actor_rollout_ref.rollout.agent.default_agent_loop == "single_turn_agent"
            assert cfg.actor_rollout_ref.rollout.agent.agent_loop_config_path is None


@pytest.mark.parametrize("script", sorted(RECIPE_DIR.glob("*.sh")), ids=lambda p: p.name)
def test_run_scripts_parse_and_name_existing_recipes(script):
    subprocess.run(["bash", "-n", str(script)], check=True)
    names = re.findall(r"--config-name\s+(\S+)", script.read_text())
    assert names and all(n in RECIPES for n in names), f"{script.name}: {names}"


def test_make_demo_trains_the_long_tail_recipe_pipelined(configs):
    """``make demo`` (the README's first command) runs a shipped recipe in the product's mode: CGP with FGD on, on a
    task whose lengths the model decides (no forced workload) and whose responses may run long."""
    m = re.search(r"^demo:.*\n\t.*-m verl_pipe\.main_grpo --config-name (\w+)$", (ROOT / "Makefile").read_text(), re.M)
    assert m, "the Makefile's demo target runs main_grpo on a named recipe"
    cfg = configs[m.group(1)]
    rp = cfg.rolloutpipe
    assert rp.mode == "cgp" and rp.fgd.enable in ("auto", True) and rp.workload is None
    assert rp.tiny_assets.task == "chain" and cfg.data.max_response_length >= 200


def test_chain_recipe_runs_bypass_and_group_granularity(configs):
    """The chain recipe (main_grpo's default) takes vLLM's log-probs as the old log-probs, which needs the rollout to
    return them, and trains CGP at group granularity, whose micro-batches must divide n (docs/cgp.md)."""
    cfg = configs["tiny_cpu_chain"]
    assert cfg.algorithm.rollout_correction.bypass_mode is True
    assert cfg.actor_rollout_ref.rollout.calculate_log_probs is True
    assert cfg.rolloutpipe.cgp.granularity == "group"
    assert cfg.actor_rollout_ref.rollout.n % cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu == 0
