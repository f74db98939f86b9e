"""The chain task's partial-credit reward (verl_pipe/assets/chain_reward.py): a right chain scores 1, a sloppy one
partial, junk 0; ``acc`` stays the exact answer; a bad record or setting raises naming it; it is the chain task's
reward in a run, loaded the way verl loads it."""

from __future__ import annotations

import pytest

from verl_pipe.assets import TASKS
from verl_pipe.assets import chain_data as chain
from verl_pipe.assets.chain_reward import compute_score, correct_steps
from verl_pipe.assets.math_data import DATA_SOURCE

START, OPS = 7, [("+", 3), ("*", 4), ("+", 9), ("*", 2), ("+", 5)]
QUESTION = chain.question(START, OPS)
INFO = {"split": "train", "index": 3, "question": QUESTION}
RIGHT = "a7+3=10\nb0*4=0\nc0+9=9\nd9*2=18\ne8+5=13\nAnswer: 13"
SLOPPY = "a7+3=10\nb1*4=4\nc0+9=9\nd0*2=0\ne0+5=5\nAnswer: 5"


def score(text, truth="13", info=INFO, **kw):
    return compute_score(DATA_SOURCE, text, truth, extra_info=info, **kw)


def test_the_right_chain_scores_one():
    assert chain.solve(START, OPS) == (RIGHT.split("\nAnswer")[0].split("\n"), 13)
    assert score(RIGHT) == {"score": 1.0, "acc": 1.0, "steps": 1.0}


def test_the_sloppy_chain_scores_partial():
    # a is right; b carries the tens digit of 10 (1, not 0); c starts from 0 after b's 4, d from 0 after c's 9;
    # e starts from 0 after d's 0, the last digit, and 0+5=5: right where the two digits agree.
    assert correct_steps(SLOPPY, START, OPS) == (2, 5)
    result = score(SLOPPY)
    assert result == {"score": pytest.approx(0.5 * 2 / 5), "acc": 0.0, "steps": pytest.approx(2 / 5)}
    assert 0.0 < result["score"] < 1.0


def test_a_slip_costs_its_own_step_and_an_answer_right_by_luck_its_half():
    slipped = RIGHT.replace("d9*2=18\ne8+5=13", "d9*2=17\ne7+5=12").replace("Answer: 13", "Answer: 12")
    assert score(slipped)["score"] == pytest.approx(0.5 * 4 / 5)  # e is right from the 17 d wrote
    assert score("Answer: 13") == {"score": 0.5, "acc": 1.0, "steps": 0.0}


def test_steps_past_the_chain_and_out_of_order_earn_nothing():
    padded = RIGHT.replace("\nAnswer", "\nf3+1=4\ng4+1=5\nh5+1=6\ni6+1=7\nj7+1=8\nAnswer")
    assert score(padded)["steps"] == pytest.approx(5 / 10)
    swapped = "b7+3=10\na0*4=0\nAnswer: 0"  # labels out of order, the operations of a and b swapped
    assert score(swapped, truth="13")["steps"] == 0.0


@pytest.mark.parametrize("junk", ["", "I think it is", "12 15 18", None, "a7+3=11\nAnswer: 99", "Answer:"])
def test_junk_scores_zero(junk):
    assert score(junk) == {"score": 0.0, "acc": 0.0, "steps": 0.0}


def test_the_step_credit_is_a_setting():
    assert score(SLOPPY, step_credit=1.0)["score"] == pytest.approx(2 / 5)
    assert score(SLOPPY, step_credit=0.0)["score"] == 0.0
    assert score(RIGHT, step_credit=0.0)["score"] == 1.0
    with pytest.raises(ValueError, match=r"reward_kwargs\.step_credit must be in \[0, 1\], got 1\.5"):
        score(RIGHT, step_credit=1.5)


@pytest.mark.parametrize("info, match", [
    (None, r"record None has no chain question"),
    ({"split": "test", "index": 9}, r"record \{'split': 'test', 'index': 9\} has no chain question"),
    ({"split": "test", "index": 9, "question": "What is (7 * 3) % 10 + 4?"}, r"'index': 9\} has no chain question"),
])
def test_a_record_without_a_chain_raises_naming_it(info, match):
    with pytest.raises(ValueError, match=match):
        score(RIGHT, info=info)


def test_a_record_whose_truth_disagrees_with_its_chain_raises_naming_it():
    with pytest.raises(ValueError, match=r"record train/3 has ground truth '14', but its chain .* gives 13"):
        score(RIGHT, truth="14")
    with pytest.raises(ValueError, match="no integer ground truth"):
        score(RIGHT, truth="thirteen")


def test_the_worked_solutions_of_the_built_splits_score_one(tmp_path):
    import pandas as pd

    train, val, _ = chain.build_dataset(tmp_path, n_train=64, n_val=64, n_sft=8)
    for path in (train, val):
        for row in pd.read_parquet(path).itertuples():
            info = dict(row.extra_info)
            result = compute_score(row.data_source, info["answer"], row.reward_model["ground_truth"], extra_info=info)
            assert result == {"score": 1.0, "acc": 1.0, "steps": 1.0}


def test_it_is_the_chain_tasks_reward_in_a_run(tmp_path):
    """launch.prepare.prepare_config sets the task's reward when the run names none; verl loads it from that file."""
    from omegaconf import open_dict
    from verl.trainer.ppo.reward import get_custom_reward_fn

    import verl_pipe.assets.chain_reward as chain_reward
    import verl_pipe.assets.reward as digit_reward
    from verl_pipe.launch.session import compose
    from verl_pipe.launch.prepare import prepare_config

    assert TASKS["chain"].reward_module == "verl_pipe.assets.chain_reward"
    assert TASKS["digit_math"].reward_module == "verl_pipe.assets.reward"
    cfg = compose(["rolloutpipe.tiny_assets.warm_start.steps=0", f"rolloutpipe.tiny_assets.cache_dir={tmp_path}",
                   f"trainer.default_local_dir={tmp_path / 'ckpt'}"], config_name="tiny_cpu_chain")
    with open_dict(cfg):
        prepare_config(cfg)
    assert cfg.reward.custom_reward_function.path == chain_reward.__file__
    fn = get_custom_reward_fn(cfg)
    assert fn(DATA_SOURCE, RIGHT, "13", extra_info=INFO) == {"score": 1.0, "acc": 1.0, "steps": 1.0}
    assert digit_reward.__file__ != chain_reward.__file__
