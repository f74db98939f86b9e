"""PipeSession's sticky knobs (verl_pipe/launch/session.py), without a stack: a knob set by one step and set again by the
next must replace the earlier value (the bench changes the mode every step)."""

from types import SimpleNamespace

from verl_pipe.launch.session import PipeSession, compose


def _session():
    s = PipeSession.__new__(PipeSession)  # no Ray, no workers: only the knob bookkeeping
    s.trainer = SimpleNamespace(config=compose())
    s._changes = {}
    return s


def test_a_knob_set_again_replaces_the_earlier_value():
    s = _session()
    assert s.change(mode="cgp", fgd=True).mode == "cgp"
    k = s.change(mode="sync", fgd=False)
    assert (k.mode, k.fgd) == ("sync", False)
    assert s.change(granularity="group").mode == "sync"  # unset knobs stay as the last step left them


def test_fgd_auto_follows_the_step_mode_and_an_explicit_value_wins():
    """The default config's rolloutpipe.fgd.enable is auto: FGD on for a cgp step, off for a sync one, unless a step
    (or the config) says true or false."""
    s = _session()
    assert s.trainer.config.rolloutpipe.fgd.enable == "auto"
    assert s.change(mode="cgp").fgd is True
    assert s.change(mode="sync").fgd is False
    assert s.change(mode="cgp", fgd=False).fgd is False
    assert s.change(mode="cgp").fgd is False  # sticky, like every knob


def test_every_variant_says_fgd_explicitly():
    """A variant's overrides never leave FGD to the config's auto (cgp alone must stay FGD-free)."""
    from verl_pipe.core.variants import OURS, resolve_fgd, variant

    for name in OURS:
        ov = variant(name).overrides()
        assert [o for o in ov if o.startswith("rolloutpipe.fgd.enable=")] == [
            f"rolloutpipe.fgd.enable={str(variant(name).fgd).lower()}"]
    assert resolve_fgd("auto", "cgp") and not resolve_fgd("auto", "sync") and resolve_fgd(True, "sync")


def test_the_sessions_batches_carry_the_epoch_as_the_run_loop_does():
    """A session steps through the data loader epoch after epoch and sets the trainer's epoch as the run loop's fit
    does: the length history predicts a prompt's lengths only from its earlier epochs, so a session that left the
    epoch at 0 would never predict from history (length-aware FGD in the learning bench ordered by siblings only)."""
    seen = []

    class Trainer:
        epoch = 0

        def epoch_batches(self):
            for b in ("a", "b"):
                yield b

    s = PipeSession.__new__(PipeSession)
    s.trainer = Trainer()
    batches = s._batch_iter()
    for _ in range(5):
        seen.append((next(batches), s.trainer.epoch))
    assert seen == [("a", 0), ("b", 0), ("a", 1), ("b", 1), ("a", 2)]


def test_the_length_history_keys_groups_by_dataset_row_after_verls_gen_batch_split():
    """verl's _get_gen_batch moves the non-tensor ``index`` into the generation batch; the step's batch keeps
    ``extra_info`` (a reward key), whose ``index`` is the row: the length history must key groups by it (else every
    group is a prior and length-aware FGD never predicts from a prompt's earlier epochs)."""
    import numpy as np

    from verl_pipe.trainer.pipe_trainer import dataset_index

    extra = np.array([{"index": 7, "split": "train"}, {"index": 3}, {"split": "train"}], dtype=object)
    after_split = SimpleNamespace(non_tensor_batch={"extra_info": extra, "uid": np.array(["a", "b", "c"])})
    assert dataset_index(after_split, 3) == [7, 3, None]
    before_split = SimpleNamespace(non_tensor_batch={"index": np.array([5, 6]), "extra_info": extra[:2]})
    assert dataset_index(before_split, 2) == [5, 6]
    assert dataset_index(None, 2) == [None, None]
    assert dataset_index(SimpleNamespace(non_tensor_batch={}), 2) == [None, None]
