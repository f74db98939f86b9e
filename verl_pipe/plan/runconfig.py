"""The run config the user would launch -> the shape the planner simulates, or a refusal naming the key.

``shape_of`` is pure (it reads a composed config); ``compose_run`` composes it exactly as
``python -m verl_pipe.main_grpo --config-name NAME overrides...`` would (``verl_pipe.launch.session.compose``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from verl_pipe import estimators
from verl_pipe.core.variants import resolve_fgd


# vLLM: the engine model's scheduler; SGLang (verl's other server): the same continuous batching, at the speed a verl
# log fits (--calibrate-verl-log) or, without one, the profile's (a note says which)
ROLLOUTS = ("vllm", "sglang")


class CannotModel(ValueError):
    """A config the planner cannot model; the message names the key and why."""


@dataclass(frozen=True)
class Shape:
    num_groups: int  # prompts per step
    n: int
    groups_per_unit: int  # prompts per PPO mini-batch (one training unit)
    rollout_gpus: int
    train_gpus: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_response_length: int
    max_prompt_length: int
    gpu_memory_utilization: float
    micro_rows: int  # rows per micro-batch (padding unit of the trainer without remove-padding)
    max_tokens_per_microbatch: int
    recompute: bool
    use_ref: bool
    padded: bool  # use_remove_padding=false: the trainer pays for padded tokens
    granularities: tuple[str, ...]  # what CGP can train this estimator at
    configured_mode: str
    configured_granularity: str
    fgd_enabled: bool
    fgd_window: int | str | None
    theta_k_store: str
    dispatch_order: str
    dispatch_window: int | None
    one_node: bool
    model_path: str
    estimator: str
    cpu: bool
    rollout_nnodes: int = 1
    train_nnodes: int = 1
    unit_fill: str = "dispatch"  # rolloutpipe.cgp.unit_fill (verl_pipe/core/release.py)
    fgd_rest_order: str = "auto"  # rolloutpipe.fgd.rest_order: FGD's order beyond the frontier (core/admission.py)
    tp: int = 1  # actor_rollout_ref.rollout.tensor_model_parallel_size: GPUs per engine replica
    rollout_name: str = "vllm"  # actor_rollout_ref.rollout.name: vllm | sglang

    @property
    def replicas(self) -> int:
        """Engine replicas of the rollout pool (TP GPUs each)."""
        return max(1, self.rollout_gpus // self.tp)

    @property
    def units(self) -> int:
        return self.num_groups // self.groups_per_unit

    def with_split(self, rollout_gpus: int, train_gpus: int) -> "Shape":
        return replace(self, rollout_gpus=rollout_gpus, train_gpus=train_gpus)


def _get(cfg, dotted: str, default=None):
    from omegaconf import OmegaConf

    v = OmegaConf.select(cfg, dotted, default=default)
    return default if v is None else v


def _rollout(cfg, need) -> tuple[str, int]:
    """The rollout's server (vLLM or SGLang) and its tensor parallelism, checked."""
    roll = "actor_rollout_ref.rollout"
    name = str(_get(cfg, f"{roll}.name", "vllm"))
    need(name in ROLLOUTS, f"{roll}.name={name}: the engine model is a continuous-batching server with vLLM's "
                           f"scheduler; the planner models {', '.join(ROLLOUTS)}")
    tp = int(_get(cfg, f"{roll}.tensor_model_parallel_size", 1))
    need(tp >= 1, f"{roll}.tensor_model_parallel_size={tp}: must be >= 1")
    return name, tp


def shape_of(cfg) -> Shape:
    """Read the planner's shape from a composed run config; raise CannotModel for what it cannot model."""
    def need(cond: bool, msg: str) -> None:
        if not cond:
            raise CannotModel(msg)

    roll, actor = "actor_rollout_ref.rollout", "actor_rollout_ref.actor"
    est = str(_get(cfg, "algorithm.adv_estimator", "grpo"))
    how = estimators.streaming(est)
    need(how is not None, f"algorithm.adv_estimator={est}: not a group-based estimator CGP streams (a critic, e.g. "
                          f"gae, is not modelled); the planner models {', '.join(estimators.registered())}")
    grans = tuple(g for g in ("minibatch", "group") if estimators.cgp_problem(est, g) is None)
    need(bool(grans), f"algorithm.adv_estimator={est}: {estimators.cgp_problem(est, 'group')}; only sync would "
                      "run, there is nothing to plan")
    name, tp = _rollout(cfg, need)
    need(not _get(cfg, f"{roll}.multi_turn.enable", False),
         f"{roll}.multi_turn.enable=true: multi-turn / tool rollouts are not modelled (one generation per request)")
    need(int(_get(cfg, "rolloutpipe.oversample", 0)) == 0 and not _get(cfg, "rolloutpipe.filter_zero_variance", False),
         "rolloutpipe.oversample / rolloutpipe.filter_zero_variance: dynamic sampling (dropping and replacing "
         "groups) is not modelled; every group is trained")
    need(not _get(cfg, f"{actor}.fsdp_config.param_offload", False) and not _get(
        cfg, f"{actor}.fsdp_config.optimizer_offload", False),
         f"{actor}.fsdp_config.param_offload / optimizer_offload: offloaded trainers are not modelled")
    num_groups = int(_get(cfg, "data.train_batch_size"))
    gpu = int(_get(cfg, f"{actor}.ppo_mini_batch_size"))
    need(gpu >= 1 and num_groups % gpu == 0, f"{actor}.ppo_mini_batch_size={gpu}: must divide "
                                            f"data.train_batch_size={num_groups} (whole training units)")
    r_gpus = int(_get(cfg, f"{roll}.nnodes", 1)) * int(_get(cfg, f"{roll}.n_gpus_per_node", 1))
    need(r_gpus % tp == 0, f"{roll}.tensor_model_parallel_size={tp}: must divide the {r_gpus} rollout GPUs "
                           f"({roll}.nnodes x {roll}.n_gpus_per_node: whole replicas)")
    t_gpus = int(_get(cfg, "trainer.nnodes", 1)) * int(_get(cfg, "trainer.n_gpus_per_node", 1))
    resp, prompt = int(_get(cfg, "data.max_response_length")), int(_get(cfg, "data.max_prompt_length"))
    micro = int(_get(cfg, f"{actor}.ppo_micro_batch_size_per_gpu", 0) or 1)
    dyn = bool(_get(cfg, f"{actor}.use_dynamic_bsz", False))
    max_tok = int(_get(cfg, f"{actor}.ppo_max_token_len_per_gpu", 0)) if dyn else micro * (prompt + resp)
    workers = int(_get(cfg, f"{roll}.agent.num_workers", 1))
    order = _get(cfg, "rolloutpipe.dispatch.order") or (f"interleave:{workers}" if workers > 1 else "group_major")
    cpu = str(_get(cfg, "rolloutpipe.platform", "cpu")) == "cpu" or str(_get(cfg, "trainer.device", "cuda")) == "cpu"
    return Shape(
        num_groups=num_groups, n=int(_get(cfg, f"{roll}.n")), groups_per_unit=gpu, rollout_gpus=r_gpus,
        train_gpus=t_gpus, max_num_seqs=int(_get(cfg, f"{roll}.max_num_seqs", 256)),
        max_num_batched_tokens=int(_get(cfg, f"{roll}.max_num_batched_tokens", 8192)),
        max_response_length=resp, max_prompt_length=prompt,
        gpu_memory_utilization=float(_get(cfg, f"{roll}.gpu_memory_utilization", 0.5)),
        micro_rows=micro, max_tokens_per_microbatch=max(max_tok, 1),
        recompute=bool(_get(cfg, "actor_rollout_ref.model.enable_gradient_checkpointing", False)),
        use_ref=bool(_get(cfg, f"{actor}.use_kl_loss", False) or _get(cfg, "algorithm.use_kl_in_reward", False)),
        padded=not bool(_get(cfg, "actor_rollout_ref.model.use_remove_padding", False)),
        granularities=grans, configured_mode=str(_get(cfg, "rolloutpipe.mode", "sync")),
        configured_granularity=str(_get(cfg, "rolloutpipe.cgp.granularity", "minibatch")),
        fgd_enabled=resolve_fgd(_get(cfg, "rolloutpipe.fgd.enable", False), str(_get(cfg, "rolloutpipe.mode", "sync"))), fgd_window=_get(cfg, "rolloutpipe.fgd.window"),
        theta_k_store=str(_get(cfg, "rolloutpipe.theta_k.store", "auto")), dispatch_order=str(order),
        dispatch_window=_get(cfg, "rolloutpipe.dispatch.window"),
        one_node=int(_get(cfg, "trainer.nnodes", 1)) == 1 and int(_get(cfg, f"{roll}.nnodes", 1)) == 1,
        model_path=str(_get(cfg, "actor_rollout_ref.model.path", "")), estimator=est, cpu=cpu,
        rollout_nnodes=int(_get(cfg, f"{roll}.nnodes", 1)), train_nnodes=int(_get(cfg, "trainer.nnodes", 1)),
        unit_fill=str(_get(cfg, "rolloutpipe.cgp.unit_fill", "dispatch")), tp=tp, rollout_name=name,
        fgd_rest_order=str(_get(cfg, "rolloutpipe.fgd.rest_order", "auto") or "auto"))


def compose_run(config_name: str | None, overrides: list[str]):
    """The config ``main_grpo`` would compose (its own config module and search path, recipes included)."""
    from verl_pipe.launch.session import compose

    try:
        return compose(overrides, config_name=config_name or "rolloutpipe_trainer")
    except Exception as e:  # Hydra's errors name the override or config; keep them, say which flag fed it
        raise CannotModel(f"--config-name {config_name} {' '.join(overrides)}: Hydra could not compose it: {e}") from e
