"""rolloutpipe.fgd.window: 'adaptive' is the default, validated with the other spellings, and resolves to the
policy's AdaptiveWindow (verl_pipe.core.frontier) the way the trainer resolves it."""

import pytest

from verl_pipe.config import ConfigError, validate
from verl_pipe.core.frontier import AdaptiveWindow, resolve_window
from verl_pipe.launch.session import compose

CGP_FGD = ["rolloutpipe.mode=cgp", "rolloutpipe.fgd.enable=true"]


def test_the_default_window_is_adaptive_and_resolves_to_the_slots_plus_one_group():
    cfg = compose(CGP_FGD)
    validate(cfg, check_paths=False)
    assert cfg.rolloutpipe.fgd.window == "adaptive"
    roll = cfg.actor_rollout_ref.rollout
    w = resolve_window(cfg.rolloutpipe.fgd.window, int(cfg.actor_rollout_ref.actor.ppo_mini_batch_size),
                       int(roll.n), int(roll.max_num_seqs))
    assert w == AdaptiveWindow(capacity=int(roll.max_num_seqs), floor=min(int(roll.n), int(roll.max_num_seqs)))


@pytest.mark.parametrize("value", ["adaptive", "auto", "null", "64"])
def test_every_spelling_validates(value):
    validate(compose(CGP_FGD + [f"rolloutpipe.fgd.window={value}"]), check_paths=False)


@pytest.mark.parametrize("value", ["adapt", "0", "2.5"])
def test_a_bad_window_names_the_key_and_every_spelling(value):
    with pytest.raises(ConfigError) as err:
        validate(compose(CGP_FGD + [f"rolloutpipe.fgd.window={value}"]), check_paths=False)
    msg = str(err.value)
    assert msg.startswith("rolloutpipe.fgd.window:"), msg
    for spelling in ("null (max_num_seqs)", "'auto'", "an integer >= 1", "'adaptive'"):
        assert spelling in msg, msg
