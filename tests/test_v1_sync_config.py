"""verl's V1 sync trainer's config from ours (lab/verl_pipe_lab/bench/peer/v1_sync.py) and the replay files
(lab/verl_pipe_lab/bench/peer/replay.py). No Ray: composes configs and writes files."""

import pytest

OURS = ["actor_rollout_ref.model.path=/models/tiny", "data.train_files=/data/train.parquet",
        "data.val_files=/data/val.parquet", "data.train_batch_size=8", "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8", "actor_rollout_ref.actor.optim.lr=3e-3",
        "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.clip_ratio_high=0.28",
        "reward.custom_reward_function.path=/rewards/r.py"]


def _ours():
    from verl_pipe.launch.session import compose

    return compose(OURS)


def test_verl_defaults_with_our_experiment():
    from omegaconf import OmegaConf

    from verl_pipe_lab.bench.peer.v1_sync import CPU_SETTINGS, shared_differences, v1_sync_config

    ours = _ours()
    cfg = v1_sync_config(ours, steps=3, overrides={"trainer.default_local_dir": "/tmp/x"})
    assert shared_differences(ours, cfg) == []
    # verl's default synchronous trainer: V1, sync, colocated (hybrid engine), verl's naive in-process weight sync
    assert cfg.trainer.use_v1 and cfg.trainer.v1.trainer_mode == "sync" and cfg.actor_rollout_ref.hybrid_engine
    assert cfg.actor_rollout_ref.rollout.checkpoint_engine.backend == "naive"
    assert "rolloutpipe" not in cfg
    # the experiment is ours ...
    actor = cfg.actor_rollout_ref.actor
    assert (actor.optim.lr, actor.ppo_mini_batch_size, actor.use_kl_loss) == (3e-3, 8, True)
    assert actor.clip_ratio_high == 0.28
    assert OmegaConf.to_container(actor.fsdp_config.mixed_precision) == {
        "param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}
    assert cfg.actor_rollout_ref.model.path == "/models/tiny" and cfg.actor_rollout_ref.rollout.n == 4
    assert cfg.reward.custom_reward_function.path == "/rewards/r.py"
    # ... the CPU settings and the run's length are set, the rest is verl's own
    for key, value in CPU_SETTINGS.items():
        assert OmegaConf.select(cfg, key) == value, key
    assert (cfg.trainer.total_training_steps, cfg.trainer.save_freq, cfg.trainer.val_before_train) == (3, -1, False)
    assert cfg.trainer.default_local_dir == "/tmp/x"
    assert cfg.trainer.balance_batch is True and cfg.actor_rollout_ref.rollout.scheduling_policy == "fcfs"


def test_shared_differences_names_the_key():
    from omegaconf import open_dict

    from verl_pipe_lab.bench.peer.v1_sync import shared_differences, v1_sync_config

    ours = _ours()
    cfg = v1_sync_config(ours)
    with open_dict(cfg):
        cfg.actor_rollout_ref.actor.optim.lr = 1e-6
    (diff,) = shared_differences(ours, cfg)
    assert diff == "actor_rollout_ref.actor.optim.lr: ours 0.003, verl 1e-06"


def test_replay_file_and_overrides(tmp_path):
    import torch
    import yaml

    from verl_pipe_lab.bench.peer.replay import REPLAY_AGENT, replay_overrides, row_key, write_replay

    rows = [{"index": i, "session": s, "prompt_ids": [1, 2, i], "response_ids": [7, s], "rollout_log_probs": None,
             "version": 0, "position": 2 * i + s} for i in range(2) for s in range(2)]
    path = write_replay(rows, tmp_path)
    (entry,) = yaml.safe_load(path.read_text())
    assert entry["name"] == REPLAY_AGENT and entry["_target_"] == "verl_pipe_lab.bench.peer.replay.ReplayAgentLoop"
    saved = torch.load(entry["replay_path"], weights_only=False)
    assert saved[row_key(1, 0)] == {"prompt_ids": [1, 2, 1], "response_ids": [7, 0], "rollout_log_probs": None,
                                    "version": 0, "position": 2}
    # verl's batch carries the dataset index as a tensor or numpy scalar
    assert row_key(torch.tensor(1), torch.tensor(0)) == row_key(1, 0) == ("1", 0)
    assert replay_overrides(path) == {"actor_rollout_ref.rollout.agent.agent_loop_config_path": str(path),
                                      "actor_rollout_ref.rollout.agent.default_agent_loop": REPLAY_AGENT}
    with pytest.raises(ValueError, match="index 0 session 1"):
        write_replay(rows + [rows[1]], tmp_path)


def test_replay_waits_for_rows_written_after_verl_started(tmp_path):
    """verl can start before the responses exist: a replayed request waits for write_rows, or raises once cancelled."""
    import asyncio

    import yaml

    from verl_pipe_lab.bench.peer import replay

    (entry,) = yaml.safe_load(replay.replay_agent_loop(tmp_path).read_text())
    rows = [{"index": 3, "session": 0, "prompt_ids": [1], "response_ids": [2], "version": 0}]

    async def wait_then_write():
        waiting = asyncio.ensure_future(replay._rows(entry["replay_path"]))
        await asyncio.sleep(0.2)
        assert not waiting.done()
        assert replay.write_rows(rows, tmp_path) == tmp_path / replay.ROWS_FILE
        return await asyncio.wait_for(waiting, 5)

    got = asyncio.run(wait_then_write())
    assert got[replay.row_key(3, 0)]["response_ids"] == [2]
    assert not list(tmp_path.glob("*.partial"))

    other = tmp_path / "cancelled"
    other.mkdir()
    (entry,) = yaml.safe_load(replay.replay_agent_loop(other).read_text())
    replay.cancel_replay(other)
    with pytest.raises(RuntimeError, match="replay cancelled"):
        asyncio.run(replay._rows(entry["replay_path"]))
