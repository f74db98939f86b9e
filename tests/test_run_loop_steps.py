"""RunLoop's steps fitted to the data: a run asked for more steps than its data gives ends at the data's last batch,
and that step is its last (validated and checkpointed), said at the start. Pure: a RunLoop with a list as its data."""

from omegaconf import OmegaConf

from verl_pipe.trainer.run_loop import RunLoop


def _loop(steps: int, batches: int, epochs: int) -> RunLoop:
    loop = RunLoop()
    loop.train_dataloader = [None] * batches
    loop.config = OmegaConf.create({"trainer": {"total_epochs": epochs}})
    loop.total_training_steps = steps
    return loop


def test_more_steps_than_the_data_gives_end_at_its_last_batch(capsys):
    loop = _loop(steps=20, batches=16, epochs=1)
    loop._fit_steps_to_the_data()
    assert loop.total_training_steps == 16
    out = capsys.readouterr().out
    assert "trainer.total_training_steps=20" in out and "trainer.total_epochs=1" in out and "step 16" in out


def test_steps_the_data_gives_are_left_alone(capsys):
    for steps, epochs in ((16, 1), (10, 1), (20, 2)):
        loop = _loop(steps=steps, batches=16, epochs=epochs)
        loop._fit_steps_to_the_data()
        assert loop.total_training_steps == steps
    assert capsys.readouterr().out == ""
