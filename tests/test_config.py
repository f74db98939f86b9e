"""Bad configs fail before Ray starts, with a message that names the setting."""

import pytest

from verl_pipe.config import ConfigError, validate
from verl_pipe.launch.session import compose

# The table of bad configs (every rolloutpipe.* key and the verl keys we depend on): test_config_table.py.


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
