"""Bad configs fail before Ray starts, with a message that names the setting."""

import pytest

from verl_pipe.config import ConfigError, validate
from verl_pipe.session import compose

BAD = [
    (["data.train_batch_size=6", "actor_rollout_ref.actor.ppo_mini_batch_size=4"], "ppo_mini_batch_size"),
    (["actor_rollout_ref.rollout.n=1"], "actor_rollout_ref.rollout.n"),
    (["rolloutpipe.mode=turbo"], "rolloutpipe.mode"),
    (["rolloutpipe.cgp.granularity=token"], "rolloutpipe.cgp.granularity"),
    (["rolloutpipe.platform=tpu"], "rolloutpipe.platform"),
    (["rolloutpipe.cpu.rollout_cores=0-63"], "rolloutpipe.cpu.rollout_cores"),
    (["rolloutpipe.cpu.trainer_cores=0"], "rolloutpipe.cpu.trainer_cores"),
    (["rolloutpipe.cpu.trainer_cores=abc"], "rolloutpipe.cpu.trainer_cores"),
    (["rolloutpipe.fgd.enable=true"], "rolloutpipe.fgd.enable"),
    (["rolloutpipe.mode=cgp", "rolloutpipe.fgd.enable=true", "rolloutpipe.fgd.window=0"], "rolloutpipe.fgd.window"),
    (["rolloutpipe.fgd.frontier_groups=0"], "rolloutpipe.fgd.frontier_groups"),
    (["rolloutpipe.oversample=-1"], "rolloutpipe.oversample"),
    (["rolloutpipe.mode=cgp", "algorithm.adv_estimator=gae"], "algorithm.adv_estimator"),
    (["rolloutpipe.mode=cgp", "algorithm.adv_estimator=reinforce_plus_plus_baseline"], "algorithm.adv_estimator"),
    (["rolloutpipe.mode=cgp", "actor_rollout_ref.actor.ppo_epochs=2"], "ppo_epochs"),
    (["actor_rollout_ref.hybrid_engine=true"], "actor_rollout_ref.hybrid_engine"),
    (["+rolloutpipe.workload={kind: lognormal, median: 8, sigma: 1, rho: 0.5, cap: 4096}"], "rolloutpipe.workload.cap"),
    (["trainer.device=cuda"], "trainer.device"),
    (["rolloutpipe.mode=cgp", "rolloutpipe.fgd.enable=true", "actor_rollout_ref.rollout.scheduling_policy=fcfs"],
     "scheduling_policy"),
    (["rolloutpipe.mode=cgp", "rolloutpipe.cgp.granularity=group", "actor_rollout_ref.rollout.n=4",
      "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8"], "ppo_micro_batch_size_per_gpu"),
]


@pytest.mark.parametrize("overrides,key", BAD, ids=[b[1] + ":" + ",".join(b[0]) for b in BAD])
def test_bad_config_names_the_setting(overrides, key):
    cfg = compose(overrides)
    with pytest.raises(ConfigError) as err:
        validate(cfg, check_paths=False)
    assert key in str(err.value)


def test_default_config_is_valid():
    validate(compose([]), check_paths=False)


@pytest.mark.parametrize("key", ["actor_rollout_ref.model.path", "data.train_files", "data.val_files"])
def test_missing_paths(key, tmp_path):
    overrides = ["actor_rollout_ref.model.path=" + str(tmp_path), f"data.train_files={tmp_path}/x.parquet",
                 f"data.val_files={tmp_path}/y.parquet"]
    (tmp_path / "x.parquet").write_bytes(b"")
    (tmp_path / "y.parquet").write_bytes(b"")
    overrides = [o for o in overrides if not o.startswith(key + "=")]
    overrides.append(f"{key}={tmp_path}/does-not-exist")
    cfg = compose(overrides)
    with pytest.raises(ConfigError) as err:
        validate(cfg, check_paths=True)
    assert key in str(err.value) and "does not exist" in str(err.value)


def test_unset_model_path_names_the_key():
    cfg = compose(["rolloutpipe.tiny_assets.enable=false"])
    with pytest.raises(ConfigError, match="actor_rollout_ref.model.path"):
        validate(cfg, check_paths=True)
