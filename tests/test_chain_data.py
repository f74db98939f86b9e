"""The chain task's assets (verl_pipe/assets/chain_data.py): splits, answers, the length tail, the sloppy teacher, the
reward on worked solutions, what the tokenizer makes of it, its cache entry and its warm-start's overrides."""

from __future__ import annotations

import hashlib
import random
import re
import statistics

import pandas as pd
import pytest
from transformers import AutoTokenizer

from verl_pipe.assets import TASKS, ensure_assets
from verl_pipe.assets import chain_data as chain
from verl_pipe.assets.math_data import DATA_SOURCE, INSTRUCTION
from verl_pipe.assets.reward import compute_score
from verl_pipe.assets.warm_start import WarmStart, sft_overrides

QUESTION = re.compile(r"^Chain (\d), then ((?:[a-zA-Z][+*]\d)+), carrying the last digit of each result\.$")


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return ensure_assets(tmp_path_factory.mktemp("cache"), size="tiny", task="chain")


@pytest.fixture(scope="module")
def splits(assets):
    return {name: pd.read_parquet(getattr(assets, f"{name}_file")) for name in ("train", "val", "sft")}


@pytest.fixture(scope="module")
def tokenizer(assets):
    return AutoTokenizer.from_pretrained(assets.tokenizer_dir)


def evaluate(q: str, carry=lambda r: r % 10) -> tuple[list[str], int]:
    """An independent solver: the steps and the answer of a chain question, each step from carry(previous result)."""
    m = QUESTION.match(q)
    assert m, q
    x, chain_ops = int(m.group(1)), m.group(2)
    steps, result = [], None
    for i in range(0, len(chain_ops), 3):
        label, op, d = chain_ops[i], chain_ops[i + 1], int(chain_ops[i + 2])
        assert label == "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"[i // 3]
        if result is not None:
            x = carry(result)
        result = x + d if op == "+" else x * d
        steps.append(f"{label}{x}{op}{d}={result}")
    return steps, result


def _sft_question(messages) -> str:
    return messages[0]["content"].removesuffix(f" {INSTRUCTION}")


def test_split_sizes_and_disjoint_questions(splits):
    train, val, sft = splits["train"], splits["val"], splits["sft"]
    assert (len(train), len(val), len(sft)) == (chain.N_TRAIN, chain.N_VAL, chain.N_SFT) == (256, 512, 2048)
    train_q = set(train.extra_info.map(lambda x: x["question"]))
    val_q = set(val.extra_info.map(lambda x: x["question"]))
    sft_q = set(sft.messages.map(_sft_question))
    assert (len(train_q), len(val_q), len(sft_q)) == (256, 512, 2048)  # no question twice within a split
    assert not train_q & val_q and not sft_q & (train_q | val_q)


def test_records_are_verls_format_with_right_answers(splits):
    for name, split in (("train", "train"), ("val", "test")):
        df = splits[name]
        assert list(df.columns) == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
        for i, row in enumerate(df.itertuples()):
            info = row.extra_info
            assert row.data_source == DATA_SOURCE and info["split"] == split and info["index"] == i
            assert row.prompt[0]["content"] == f"{info['question']} {INSTRUCTION}"
            steps, ans = evaluate(info["question"])
            assert row.reward_model["ground_truth"] == str(ans) and info["k"] == len(steps)
            assert info["answer"] == "\n".join(steps) + f"\nAnswer: {ans}"
            # The worked solution scores 1 under the reward, and so does nothing else it contains.
            assert compute_score(row.data_source, info["answer"], str(ans)) == 1.0
            assert compute_score(row.data_source, info["answer"].rsplit("Answer:", 1)[0], str(ans)) in (0.0, 1.0)


def test_answers_are_spread(splits):
    counts = splits["train"].reward_model.map(lambda r: r["ground_truth"]).value_counts(normalize=True)
    assert len(counts) >= 30 and counts.max() < 0.15  # a guess is rarely right


def test_chain_length_is_heavy_tailed(splits):
    ks = [info["k"] for df in (splits["train"], splits["val"]) for info in df.extra_info]
    ks += [len(evaluate(_sft_question(m))[0]) for m in splits["sft"].messages]
    assert min(ks) >= chain.K_MIN and max(ks) <= chain.K_MAX
    q = statistics.quantiles(ks, n=20)
    median, p95 = statistics.median(ks), q[18]
    assert median <= 5 and p95 >= 20 and p95 / median >= 4 and max(ks) >= 35
    # The draws follow the power law, except that questions are distinct: there are only 9 x 19 one-step chains (a
    # start digit, "+0".."+9" or "*1".."*9"), so k = 1 draws fewer than k_weights asks once those are taken and the
    # draws it gives up go to the other lengths in proportion. The shares of k >= 2 follow the law on [2, K_MAX].
    assert chain.K_MIN == 1 and sum(k == 1 for k in ks) <= 9 * 19
    w = {k: p for k, p in chain.k_weights().items() if k >= 2}
    longer = [k for k in ks if k >= 2]
    for lo, hi in ((2, 3), (4, 9), (10, 40)):
        expected = sum(p for k, p in w.items() if lo <= k <= hi) / sum(w.values())
        assert sum(lo <= k <= hi for k in longer) / len(longer) == pytest.approx(expected, abs=0.03)


def test_train_pool_repeats_within_a_demo_run(splits):
    # 40 steps of 16 prompts: every train prompt comes back within the run (a later issue predicts a group's length
    # from the same prompt's earlier epochs).
    assert 40 * 16 >= 2 * len(splits["train"])


def test_sft_comes_from_a_sloppy_teacher(splits):
    right = sloppy = 0
    for messages in splits["sft"].messages:
        user, assistant = messages
        assert (user["role"], assistant["role"]) == ("user", "assistant")
        q = _sft_question(messages)
        good_steps, good = evaluate(q)
        bad_steps, bad = evaluate(q, carry=lambda r: r // 10)
        text = assistant["content"]
        if text == "\n".join(good_steps) + f"\nAnswer: {good}":
            right += good_steps != bad_steps  # a solution both procedures write alike tells nothing apart
        else:  # every step starts from the tens digit of the previous result: the answer is wrong
            assert text == "\n".join(bad_steps) + f"\nAnswer: {bad}"
            sloppy += 1
    assert sloppy / (right + sloppy) == pytest.approx(chain.SLOPPY, abs=0.04)


def test_sloppy_carry_and_worked_solution():
    steps, ans = chain.solve(7, [("+", 3), ("*", 4), ("+", 9), ("*", 2), ("+", 5)])
    assert (steps, ans) == (["a7+3=10", "b0*4=0", "c0+9=9", "d9*2=18", "e8+5=13"], 13)
    steps, ans = chain.solve(7, [("+", 3), ("*", 4), ("+", 9), ("*", 2), ("+", 5)], sloppy=True)
    assert (steps, ans) == (["a7+3=10", "b1*4=4", "c0+9=9", "d0*2=0", "e0+5=5"], 5)
    q = chain.question(7, [("+", 3), ("*", 4)])
    assert q == "Chain 7, then a+3b*4, carrying the last digit of each result."
    assert chain.parse_question(f"{q} {INSTRUCTION}") == (7, [("+", 3), ("*", 4)])
    assert len(chain.LABELS) >= chain.K_MAX


def test_sloppy_share_is_checked(tmp_path):
    with pytest.raises(ValueError, match="sloppy"):
        chain.build_dataset(tmp_path, n_train=4, n_val=2, n_sft=2, sloppy=-0.1)


def test_dataset_is_deterministic_for_a_seed(tmp_path):
    digest = lambda p: hashlib.sha256(p.read_bytes()).hexdigest()  # noqa: E731
    a = chain.build_dataset(tmp_path / "a", n_train=16, n_val=8, n_sft=8, seed=3)
    b = chain.build_dataset(tmp_path / "b", n_train=16, n_val=8, n_sft=8, seed=3)
    c = chain.build_dataset(tmp_path / "c", n_train=16, n_val=8, n_sft=8, seed=4)
    assert [digest(p) for p in a] == [digest(p) for p in b] and digest(a[0]) != digest(c[0])


def test_draw_k_stays_in_range():
    rng = random.Random(0)
    ks = [chain.draw_k(rng) for _ in range(5000)]
    assert min(ks) == chain.K_MIN and max(ks) == chain.K_MAX
    assert sum(chain.k_weights().values()) == pytest.approx(1.0)


# --- tokens: what the lengths are in tokens ---


def test_steps_are_compact_in_tokens(tokenizer):
    # One token per label, digit, operator, "=" and line break: a step "bx+d=r" costs 7-8 tokens.
    assert tokenizer.convert_ids_to_tokens(tokenizer.encode("a7+3=10\nb0*4=0\nC1+2=3\n")) == \
        ["a", "7", "+", "3", "=", "1", "0", "Ċ", "b", "0", "*", "4", "=", "0", "Ċ", "C", "1", "+", "2", "=", "3", "Ċ"]
    assert len(tokenizer.encode("Answer: 13")) <= 5
    # In the prompt each labelled operation is three tokens, its label the same token as in the solution's step.
    ids = tokenizer.encode(chain.question(7, [("+", 3), ("*", 4), ("+", 9)]))
    assert tokenizer.convert_ids_to_tokens(ids)[5:13] == ["Ġa", "+", "3", "b", "*", "4", "c", "+"]


def test_lengths_fit_the_caps(assets, splits, tokenizer):
    """The prompts fit the RL run's data.max_prompt_length (160), the worked solutions (with EOS) its
    max_response_length (320) with room to spare, and every SFT sample the warm-start's data.max_length."""
    prompts = [len(tokenizer.apply_chat_template(list(p), add_generation_prompt=True, return_dict=False))
               for df in (splits["train"], splits["val"]) for p in df.prompt]
    responses = [len(tokenizer.encode(info["answer"])) + 1 for df in (splits["train"], splits["val"])
                 for info in df.extra_info]
    sft = [len(tokenizer.apply_chat_template(list(m), return_dict=False)) for m in splits["sft"].messages]
    assert max(prompts) <= 160 and max(responses) <= 300
    assert max(sft) <= assets.sft_max_length == TASKS["chain"].sft_max_length
    # The tail in tokens: the worked solutions' p95 is over 4x their median, the longest over 200 tokens.
    q = statistics.quantiles(responses, n=20)
    assert q[18] / statistics.median(responses) >= 4 and max(responses) >= 200


# --- the cache entry and the warm-start ---


def test_task_has_its_own_cache_entry(assets, tmp_path):
    assert assets.model_dir.parent.name == f"tiny-chain-v{TASKS['chain'].version}"
    assert TASKS["digit_math"].cache_name("digit_math", "tiny") != TASKS["chain"].cache_name("chain", "tiny")
    with pytest.raises(ValueError, match="unknown tiny task"):
        ensure_assets(tmp_path, task="chains")
    assert not list(tmp_path.iterdir())


def test_warm_start_overrides_carry_the_tasks_max_length(assets, tmp_path):
    from hydra import compose, initialize_config_module

    spec = WarmStart(steps=7, lr=2e-3)
    overrides = sft_overrides(spec, assets.model_dir, assets.sft_file, tmp_path / "run", assets.sft_max_length)
    with initialize_config_module("verl.trainer.config", version_base=None):
        cfg = compose("sft_trainer_engine", overrides=overrides)
    assert cfg.data.max_length == 448 and cfg.data.train_files == str(assets.sft_file)
    # digit_math's warm-start keeps its bound (and its cache key: max_length only bounds the samples).
    assert "data.max_length=128" in sft_overrides(spec, assets.model_dir, assets.sft_file, tmp_path)
