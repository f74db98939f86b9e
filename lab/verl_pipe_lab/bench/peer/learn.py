"""verl's separate_async as a learning mode of ``python -m verl_pipe_lab.bench --learn`` (docs/peer.md, docs/learning.md).

The speed bench runs the peer on forced response lengths with an untrained model; the learning bench runs it on the
task our modes learn: the same warm-start, data, batch shape and seeds, the model deciding every length (no
workload), our task's rule-based reward through verl's own reward loop (``reward.custom_reward_function``, which
``prepare_config`` sets for the tiny task, as for our modes), and verl's own validation (``PPOTrainer.fit``:
``trainer.val_before_train`` and every ``trainer.test_freq`` steps, ``_validate`` on the held-out set, greedy
``val_kwargs``).

The peer's settings come from ``configs.peer_overrides`` (``LEARN_CONFIG``: the on-policy configuration, with
whatever tuning of poll interval, TransferQueue storage units or agent-loop workers it carries); the learning bench
only appends the run's own keys (seed, validation cadence, epochs) after them.

This module is pure apart from ``run_learning`` (which starts the runner subprocess with ``learn_hooks``' trainer):
the spec and the mapping of the runner's records onto the learning bench's per-step rows are unit-tested.
"""

from __future__ import annotations

from verl_pipe_lab.bench.peer.configs import CONFIGS, MODE_NAMES

# The peer configuration the learning bench runs: verl's on-policy separate_async at the fair-peer work's tuned
# settings (configs.py "tuned") where that configuration exists, else the plain on-policy one.
LEARN_CONFIG = "tuned" if "tuned" in CONFIGS else "onpolicy"
LEARN_MODE = MODE_NAMES[LEARN_CONFIG]
TRAINER_CLS = "verl_pipe_lab.bench.peer.learn_hooks:PeerLearnTrainer"  # imported by the runner after start_ray


def learn_spec(base: list[str], run_keys: list[str], steps: int, seed: int, config: str = LEARN_CONFIG,
               config_name: str | None = None) -> dict:
    """The runner's spec of one learning run: ``config_name`` (the recipe the task comes from, as for our modes;
    None: rolloutpipe_trainer) with ``base`` (the bench's overrides, e.g. none: the tiny default), the
    peer's own overrides on top (configs.peer_overrides, in the runner), then ``run_keys`` (the learning bench's
    per-run keys: seed, validation cadence, logger) and the epochs verl's loop needs to reach ``steps``
    (PPOTrainer.fit stops at trainer.total_epochs; total_training_steps still ends the run)."""
    if steps < 1:
        raise ValueError(f"steps={steps}: expected >= 1")
    return {"config": config, "steps": int(steps), "warmup_steps": 0, "overrides": list(base), "workload": None,
            "seed": int(seed), "post_overrides": list(run_keys) + [f"trainer.total_epochs={int(steps)}"],
            "setting": None, "model_size": None, "trainer_cls": TRAINER_CLS, "config_name": config_name}


def _num(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def learn_rows(records: list[dict], val_key_of, step_keys: dict[str, str]) -> tuple[float | None, list[dict]]:
    """(accuracy before training, per-step rows) from the learn runner's step records.

    Each record carries ``verl_metrics`` (verl's own step metrics: reward, response length, entropy, timing) and
    ``learn`` (learn_hooks.PeerLearnTrainer: ``t_end`` when the step's metrics were computed, ``train_t0`` when verl's training loop
    began, ``val_s_total`` the validation seconds inside training so far, ``val``/``val_s`` this step's validation,
    ``val_before`` the one before training, on the first record). Training wall-clock at step k = t_end(k) -
    train_t0 - val_s_total(k): the loop's time, validation excluded, as for our modes. ``val_key_of(metrics)``
    picks the accuracy key; ``step_keys`` maps row fields to verl metric names."""
    rows, before = [], None
    for rec in records:
        lr, vm, m = rec["learn"], rec.get("verl_metrics", {}), rec.get("metrics", {})
        if lr.get("val_before") is not None:
            key = val_key_of(lr["val_before"])
            before = _num(lr["val_before"].get(key)) if key else None
        row = {"step": int(rec["step"]), "wall_s": float(lr["t_end"] - lr["train_t0"] - lr["val_s_total"]),
               "rollout_to_train_end_s": _num(m.get("rollout_to_train_end_s")),
               "trainer_wait_ratio": _num(m.get("trainer_wait_ratio"))}
        row.update({k: _num(vm.get(key)) for k, key in step_keys.items()})
        if row.get("step_s") is None:
            row["step_s"] = _num(m.get("step_wall_s"))
        if lr.get("val") is not None:
            key = val_key_of(lr["val"])
            if key:
                row["val_acc"] = _num(lr["val"][key])
                row["val_s"] = float(lr["val_s"])
        rows.append(row)
    return before, rows


def run_learning(spec: dict, timeout_s: float | None = 3600, log=print, log_path: str | None = None) -> dict:
    """One learning run of the peer, for real, in its own subprocess and Ray cluster (run_peer)."""
    from verl_pipe_lab.bench.peer import run_peer

    return run_peer(spec, timeout_s=timeout_s, log=log, log_path=log_path)
