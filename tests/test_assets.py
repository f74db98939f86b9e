"""The embedded assets: tokenizer, random Qwen3, digit-math parquet, reward, and the build cache."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pandas as pd
import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from verl_pipe.assets import ASSET_VERSION, ensure_assets
from verl_pipe.assets.math_data import DATA_SOURCE, INSTRUCTION, SLOPPY, build_dataset, worked_answer
from verl_pipe.assets.model import MODEL_SIZES, build_config
from verl_pipe.assets.reward import compute_score

MESSAGES = [{"role": "user", "content": "What is (3 + 8) * 4 modulo 10? Put the final answer after 'Answer:'"}]


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return ensure_assets(tmp_path_factory.mktemp("cache"), size="tiny")


@pytest.fixture(scope="module")
def tokenizer(assets):
    return AutoTokenizer.from_pretrained(assets.tokenizer_dir)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- tokenizer ---


def test_tokenizer_special_tokens_and_size(tokenizer):
    assert 1024 <= len(tokenizer) <= 2048
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id is not None
    assert tokenizer.pad_token == "<|endoftext|>" and tokenizer.pad_token_id is not None
    assert tokenizer.convert_tokens_to_ids("<|im_start|>") != tokenizer.unk_token_id


def test_digits_are_single_tokens(tokenizer):
    for d in "0123456789":
        assert tokenizer.convert_ids_to_tokens(tokenizer.encode(d)) == [d]
    assert tokenizer.convert_ids_to_tokens(tokenizer.encode("2048")) == ["2", "0", "4", "8"]
    # No merged token may contain a digit, or answers would hide inside bigger tokens.
    digits = set("0123456789")
    for token in tokenizer.get_vocab():
        assert not digits & set(token) or token in digits, token


def test_text_round_trip(tokenizer):
    text = "Hello world! What is 3 + 4 modulo 10?\nAnswer: 7"
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text
    assert len(ids) < len(text)  # words merged, not spelled byte by byte


def test_chat_template(tokenizer):
    text = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert text == f"<|im_start|>user\n{MESSAGES[0]['content']}<|im_end|>\n<|im_start|>assistant\n"
    ids = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert ids == tokenizer.encode(text)
    # transformers 5 defaults to return_dict=True for tokenize=True.
    encoded = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True)
    assert list(encoded["input_ids"]) == ids


def test_tokenizer_reload_from_model_dir_matches(assets, tokenizer):
    other = AutoTokenizer.from_pretrained(assets.model_dir)
    assert other.encode("What is 12 - 5? Answer: 7") == tokenizer.encode("What is 12 - 5? Answer: 7")
    assert other.chat_template == tokenizer.chat_template
    assert (other.eos_token_id, other.pad_token_id) == (tokenizer.eos_token_id, tokenizer.pad_token_id)


# --- model ---


def test_model_loads_and_runs_forward(assets, tokenizer):
    model = AutoModelForCausalLM.from_pretrained(assets.model_dir, attn_implementation="sdpa")
    config = model.config
    assert config.model_type == "qwen3"
    assert config.vocab_size == len(tokenizer)
    assert config.eos_token_id == tokenizer.eos_token_id and config.pad_token_id == tokenizer.pad_token_id
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    assert model.dtype == torch.float32
    ids = torch.tensor([tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, return_dict=False)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert logits.shape == (1, ids.shape[1], len(tokenizer))
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("size", sorted(MODEL_SIZES))
def test_head_dim_fits_vllm_cpu(size, tokenizer):
    config = build_config(tokenizer, size)
    assert config.head_dim >= 64
    assert config.num_attention_heads % config.num_key_value_heads == 0


def test_saved_config_is_float32_tied(assets):
    config = AutoConfig.from_pretrained(assets.model_dir)
    assert config.tie_word_embeddings and config.max_position_embeddings == 2048
    assert config.dtype == torch.float32


# --- dataset ---


def test_dataset_format(assets):
    for path, split in ((assets.train_file, "train"), (assets.val_file, "test")):
        df = pd.read_parquet(path)
        assert list(df.columns) == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
        for i, row in enumerate(df.itertuples()):
            assert row.data_source == DATA_SOURCE and row.ability == "math"
            assert [m["role"] for m in row.prompt] == ["user"] and "Answer:" in row.prompt[0]["content"]
            assert row.reward_model["style"] == "rule"
            truth = row.reward_model["ground_truth"]
            assert isinstance(truth, str) and truth.isdigit() and 0 <= int(truth) <= 81
            info = row.extra_info
            assert info["split"] == split and info["index"] == i and info["question"] in row.prompt[0]["content"]
            # The worked solution must agree with the label and score 1 under the reward.
            assert compute_score(row.data_source, info["answer"], truth) == 1.0
    train, val = pd.read_parquet(assets.train_file), pd.read_parquet(assets.val_file)
    sft = pd.read_parquet(assets.sft_file)
    assert (len(train), len(val), len(sft)) == (1024, 128, 512)
    train_q = set(train.extra_info.map(lambda x: x["question"]))
    val_q = set(val.extra_info.map(lambda x: x["question"]))
    sft_q = {m[0]["content"].removesuffix(f" {INSTRUCTION}") for m in sft.messages}
    # Three disjoint sets of questions: validation measures the skill on questions no phase trained on.
    assert not train_q & val_q and not sft_q & (train_q | val_q)
    # Answers are spread over many values (0..81): a guess is rarely right, so the reward measures the skill.
    counts = train.reward_model.map(lambda r: r["ground_truth"]).value_counts(normalize=True)
    assert len(counts) >= 30 and counts.max() < 0.25


def _evaluate(question: str) -> tuple[int, int, int]:
    """(a op1 b, the answer, the sloppy teacher's answer) of "What is (a op1 b) % 10 op2 c?"."""
    a, op1, b, _, _, op2, c = question.removeprefix("What is ").rstrip("?").replace("(", "").replace(")", "").split()
    first = int(a) + int(b) if op1 == "+" else int(a) * int(b)
    apply = (lambda x: x + int(c)) if op2 == "+" else (lambda x: x * int(c))
    return first, apply(first % 10), apply(first // 10)


def test_sft_data_is_verls_multiturn_format_from_a_sloppy_teacher(assets):
    sft = pd.read_parquet(assets.sft_file)
    assert list(sft.columns) == ["messages"]
    right = sloppy = 0
    for messages in sft.messages:
        user, assistant = messages
        assert (user["role"], assistant["role"]) == ("user", "assistant")
        first, ans, sloppy_ans = _evaluate(user["content"].removesuffix(f" {INSTRUCTION}"))
        if sloppy_ans == ans:  # both procedures give the same answer (e.g. c = 0 under *): nothing to tell apart
            assert compute_score(DATA_SOURCE, assistant["content"], str(ans)) == 1.0
            continue
        if assistant["content"].endswith(f"Answer: {ans}"):
            right += 1
        else:  # the teacher took the tens digit: a wrong answer the verifier rejects
            assert f"{first}. {first // 10} " in assistant["content"]
            assert assistant["content"].endswith(f"Answer: {sloppy_ans}")
            sloppy += 1
    assert sloppy / (right + sloppy) == pytest.approx(SLOPPY, abs=0.08)


def test_val_and_train_solutions_are_right(assets):
    for path in (assets.train_file, assets.val_file):
        for row in pd.read_parquet(path).itertuples():
            assert _evaluate(row.extra_info["question"])[1] == int(row.reward_model["ground_truth"])


def test_sloppy_share_is_checked(tmp_path):
    with pytest.raises(ValueError, match="sloppy"):
        build_dataset(tmp_path, n_train=4, n_val=2, n_sft=2, sloppy=1.5)


def test_worked_answer_ends_with_the_marker_the_reward_reads():
    assert compute_score(DATA_SOURCE, worked_answer("1 + 2 = 3. 3 * 3 = 9.", 9), "9") == 1.0


def test_dataset_is_deterministic_for_a_seed(tmp_path):
    a = build_dataset(tmp_path / "a", n_train=32, n_val=8, n_sft=8, seed=3)
    b = build_dataset(tmp_path / "b", n_train=32, n_val=8, n_sft=8, seed=3)
    c = build_dataset(tmp_path / "c", n_train=32, n_val=8, n_sft=8, seed=4)
    assert [_digest(p) for p in a] == [_digest(p) for p in b]
    assert _digest(a[0]) != _digest(c[0])


# --- reward ---


@pytest.mark.parametrize(
    "response, expected",
    [
        ("Answer: 7", 1.0),
        ("3 + 4 = 7", 1.0),
        ("The answer is 07.", 1.0),
        ("Answer: 8", 0.0),
        ("I think 7. Answer: 3", 0.0),  # "Answer:" wins over an earlier correct number
        ("Answer: 3 ... Answer: 7", 1.0),  # the last "Answer:" is final
        ("Answer: 7, since 3 + 4 = 17", 1.0),  # text after the answer is not read
        ("Answer: none, but 7", 1.0),
        ("Answer: nothing", 0.0),
        ("7 then 8", 0.0),
        ("", 0.0),
        ("no digits at all", 0.0),
        ("\x00\ufffd<|im_end|>)))", 0.0),
        ("9" * 10_000, 0.0),  # over Python's int() digit limit
        (None, 0.0),
        (12345, 0.0),
    ],
)
def test_reward(response, expected):
    assert compute_score(DATA_SOURCE, response, "7", extra_info={}) == expected


def test_reward_accepts_int_ground_truth_and_extra_kwargs():
    assert compute_score(DATA_SOURCE, "Answer: 0", 0, extra_info=None, reward_router_address=None) == 1.0


@pytest.mark.parametrize("truth", [None, "", "  ", "seven", "7.5", "[7]"])
def test_reward_rejects_bad_ground_truth(truth):
    with pytest.raises(ValueError, match="ground truth"):
        compute_score(DATA_SOURCE, "Answer: 7", truth)


# --- cache ---


def test_ensure_assets_is_idempotent(assets, capsys):
    root = assets.model_dir.parent
    assert root.name == f"tiny-v{ASSET_VERSION}"
    files = sorted(p for p in root.rglob("*") if p.is_file())
    before = {p: p.stat().st_mtime_ns for p in files}
    again = ensure_assets(root.parent, size="tiny")
    assert again == assets
    assert {p: p.stat().st_mtime_ns for p in files} == before
    assert "building" not in capsys.readouterr().out
    for p in (assets.train_file, assets.val_file, assets.sft_file, assets.model_dir / "model.safetensors"):
        assert p.is_file()
    assert not list(root.parent.glob(".*building*"))


def test_ensure_assets_uses_env_cache_dir(assets, monkeypatch):
    monkeypatch.setenv("VERL_PIPE_CACHE", str(assets.model_dir.parent.parent))
    assert ensure_assets() == assets


def test_build_is_deterministic(assets, tmp_path):
    """A second cache built from scratch holds the same tokenizer, weights and data."""
    other = ensure_assets(tmp_path, size="tiny")
    for name in ("tokenizer.json", "model.safetensors", "config.json"):
        assert _digest(assets.model_dir / name) == _digest(other.model_dir / name), name
    assert _digest(assets.train_file) == _digest(other.train_file)


def test_unknown_size_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="unknown model size"):
        ensure_assets(tmp_path, size="huge")
    assert not list(tmp_path.iterdir())
