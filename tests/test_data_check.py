"""Bad data records are skipped, named in the log and counted per reason; the original file is never modified."""

import pickle

import pyarrow.parquet as pq
import pytest

from verl_pipe.config import validate
from verl_pipe.data_check import (
    MAX_LOGGED_PER_FILE,
    REASONS,
    DataCheckError,
    PromptLength,
    check_records,
    clean_datasets,
    clean_file,
    read_records,
    record_problem,
    skip_metrics,
    write_bad_records_parquet,
)
from verl_pipe.launch.session import compose

DIGITS = "verl_pipe/digit_math"


def _rec(i, content="What is 1 + 1 modulo 10?", gt="2", source=DIGITS, role="user"):
    return {"data_source": source, "prompt": [{"role": role, "content": content}], "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": gt}, "extra_info": {"split": "train", "index": i}}


@pytest.fixture(scope="module")
def assets():
    from verl_pipe.assets import ensure_assets

    return ensure_assets()  # the shared cache (tests/conftest.py sets VERL_PIPE_CACHE)


@pytest.fixture(scope="module")
def tokenizer(assets):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(assets.model_dir)


def _reason(record, **kw):
    p = record_problem(record, **kw)
    return p.reason if p else None


@pytest.mark.parametrize("record,reason", [
    (_rec(0), None),
    (_rec(0, gt=7), None),  # an int is a fine digit-math truth
    (_rec(1, gt=None), "missing_ground_truth"),
    (_rec(2, gt="  "), "missing_ground_truth"),
    (_rec(3, gt=float("nan")), "missing_ground_truth"),
    (_rec(4, gt=[]), "missing_ground_truth"),
    ({**_rec(5), "reward_model": None}, "missing_ground_truth"),
    (_rec(6, gt=["7"]), "malformed_ground_truth"),
    (_rec(7, gt={"target": "7"}), "malformed_ground_truth"),
    (_rec(8, gt=True), "malformed_ground_truth"),
    (_rec(9, gt=b"7"), "malformed_ground_truth"),
    (_rec(10, gt="seven"), "malformed_ground_truth"),  # the digit-math reward needs an integer
    (_rec(11, gt="7.5"), "malformed_ground_truth"),
    (_rec(12, gt="seven", source="math_dapo"), None),  # latex answers: any text
    (_rec(13, gt=72, source="openai/gsm8k"), "malformed_ground_truth"),  # verl's scorer compares strings
    (_rec(14, gt="72", source="openai/gsm8k"), None),
    (_rec(15, gt={"target": ["Paris"]}, source="searchR1_nq"), None),  # verl's structured truths
    (_rec(16, content="   "), "empty_prompt"),
    ({**_rec(17), "prompt": []}, "empty_prompt"),
    ({**_rec(18), "prompt": None}, "empty_prompt"),
    ({**_rec(19), "prompt": "What is 1 + 1?"}, "malformed_prompt"),
    ({**_rec(20), "prompt": ["What is 1 + 1?"]}, "malformed_prompt"),
    (_rec(21, role=None), "malformed_prompt"),
    (_rec(22, content=None), "malformed_prompt"),
    (_rec(23, content=b"bytes"), "malformed_prompt"),
    (_rec(24, content=b"bad \xff bytes"), "non_utf8"),
    (_rec(25, content="bad \udcff text"), "non_utf8"),
    ({**_rec(26), "extra_info": {"note": "\ud800"}}, "non_utf8"),
    (None, "non_utf8"),  # a row that could not even be decoded
])
def test_record_problems(record, reason):
    assert _reason(record) == reason


def test_structured_truth_with_a_custom_reward():
    assert _reason(_rec(0, gt={"target": ["a"]}, source="my/data"), structured_ground_truth=True) is None
    assert _reason(_rec(0, gt={"target": ["a"]}, source="my/data")) == "malformed_ground_truth"
    assert _reason(_rec(0, gt=None, source="my/data"), structured_ground_truth=True) == "missing_ground_truth"


def test_prompt_length_is_verls_rule(assets, tokenizer):
    """verl's RLHFDataset keeps len(apply_chat_template(prompt, add_generation_prompt=True, tokenize=True))
    <= max_prompt_length; the boundary is the same here."""
    _, rows = read_records(str(assets.train_file))
    rows = rows[:64]
    for i, r in enumerate(rows):  # the task's prompts all have one length: vary it around the limit
        r["prompt"] = [{**r["prompt"][0], "content": r["prompt"][0]["content"] + " please" * (i % 4)}]
    lens = [len(tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=True,
                                              return_dict=False)) for r in rows]
    limit = sorted(set(lens))[-2]  # some prompts exactly at the limit, some one token or more over
    problems = check_records(rows, lengths=PromptLength(tokenizer, limit))
    assert [p.reason if p else None for p in problems] == [
        "overlong_prompt" if n > limit else None for n in lens]
    assert any(n == limit for n in lens) and any(n > limit for n in lens)


def test_chat_template_failure_is_a_malformed_prompt(tokenizer):
    class Broken:
        def apply_chat_template(self, *a, **kw):
            raise ValueError("no template")

    problems = PromptLength(Broken(), 64).problems([[{"role": "user", "content": "hi"}]])
    assert problems[0].reason == "malformed_prompt" and "no template" in problems[0].detail


def test_clean_file_skips_each_kind_and_names_the_rows(assets, tokenizer, tmp_path, capsys):
    src = tmp_path / "train.parquet"
    expected = write_bad_records_parquet(src, assets.train_file, max_prompt_length=64, num_good=12)
    before = src.read_bytes()
    out, skipped = clean_file(str(src), tmp_path / "clean", lengths=PromptLength(tokenizer, 64))
    assert skipped == {r: 1 for r in REASONS}
    assert expected == {**skipped, "total": 6}
    assert src.read_bytes() == before, "the original file is untouched"
    kept = pq.read_table(out)
    assert [e["index"] for e in kept.column("extra_info").to_pylist()] == list(range(12)), "good rows, in order"
    assert kept.schema == pq.read_table(assets.train_file).schema
    lines = [line for line in capsys.readouterr().out.splitlines() if "skipping row" in line]
    _, rows = read_records(str(src))
    bad_rows = [i for i, r in enumerate(rows) if r is None or r["extra_info"]["index"] == -1]
    assert len(lines) == len(bad_rows) == 6
    for line, row in zip(lines, bad_rows):
        assert f"skipping row {row} " in line and str(src) in line
    assert {line.split(": ")[2] for line in lines} == set(REASONS)


def test_non_utf8_row_cannot_be_read_by_pandas_but_is_skipped(assets, tmp_path):
    import pandas as pd

    src = tmp_path / "train.parquet"
    write_bad_records_parquet(src, assets.train_file, max_prompt_length=64, num_good=4)
    import pyarrow as pa

    with pytest.raises((pa.ArrowException, UnicodeDecodeError)):
        pd.read_parquet(src)
    out, skipped = clean_file(str(src), tmp_path / "clean")
    assert skipped["non_utf8"] == 1
    pd.read_parquet(out)  # the cleaned copy reads


def test_log_lines_are_capped(tmp_path, capsys):
    import pyarrow as pa

    src = tmp_path / "many.parquet"
    pq.write_table(pa.Table.from_pylist([_rec(i, gt=None) for i in range(30)] + [_rec(30)]), src)
    _, skipped = clean_file(str(src), tmp_path / "clean")
    assert skipped == {"missing_ground_truth": 30}
    out = capsys.readouterr().out
    assert out.count("skipping row") == MAX_LOGGED_PER_FILE
    assert f"{30 - MAX_LOGGED_PER_FILE} more bad records not shown" in out


def test_clean_file_keeps_good_file_as_is(tmp_path):
    import pyarrow as pa

    src = tmp_path / "ok.parquet"
    pq.write_table(pa.Table.from_pylist([_rec(0), _rec(1)]), src)
    assert clean_file(str(src), tmp_path / "clean") == (str(src), {})
    assert not (tmp_path / "clean").exists()


def test_all_bad_is_an_error_naming_the_file(tmp_path):
    import pyarrow as pa

    src = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist([_rec(0, gt=None), _rec(1, content="")]), src)
    with pytest.raises(DataCheckError, match=f"{src}: all 2 records are bad"):
        clean_file(str(src), tmp_path / "clean")


def _run_config(tmp_path, assets, train, *overrides):
    return compose([f"data.train_files={train}", f"data.val_files={assets.val_file}",
                    f"actor_rollout_ref.model.path={assets.model_dir}", f"trainer.default_local_dir={tmp_path}/ckpt",
                    *overrides])


def test_clean_datasets_counts_reach_the_trainer_as_metrics(assets, tmp_path):
    src = tmp_path / "train.parquet"
    write_bad_records_parquet(src, assets.train_file, max_prompt_length=64, num_good=16)
    cfg = _run_config(tmp_path, assets, src)
    counts = clean_datasets(cfg)
    assert counts["train"] == {**{r: 1 for r in REASONS}, "total": 6}
    assert counts["val"] == {**{r: 0 for r in REASONS}, "total": 0}
    assert cfg.data.train_files != str(src) and cfg.data.val_files == str(assets.val_file)
    validate(cfg, check_paths=True)  # the stored counts are an allowed (internal) rolloutpipe key
    # The trainer runs in another Ray process: the counts travel inside the (pickled) config.
    metrics = skip_metrics(pickle.loads(pickle.dumps(cfg)))
    assert metrics["data/skipped_records/train/total"] == 6
    assert metrics["data/skipped_records/train/overlong_prompt"] == 1
    assert metrics["data/skipped_records/val/total"] == 0
    assert len(metrics) == 2 * (len(REASONS) + 1)


def test_overlong_prompts_are_kept_without_verls_filter(assets, tmp_path):
    src = tmp_path / "train.parquet"
    write_bad_records_parquet(src, assets.train_file, max_prompt_length=64, num_good=8)
    counts = clean_datasets(_run_config(tmp_path, assets, src, "data.filter_overlong_prompts=false"))
    assert counts["train"]["overlong_prompt"] == 0 and counts["train"]["total"] == 5


def test_no_local_model_leaves_length_to_verl(assets, tmp_path, capsys):
    src = tmp_path / "train.parquet"
    write_bad_records_parquet(src, assets.train_file, max_prompt_length=64, num_good=8)
    counts = clean_datasets(_run_config(tmp_path, assets, src, "actor_rollout_ref.model.path=null"))
    assert counts["train"]["overlong_prompt"] == 0 and counts["train"]["total"] == 5
    assert "overlong prompts are left to verl's filter" in capsys.readouterr().out


def test_skip_metrics_without_a_check():
    assert skip_metrics(compose([])) == {}
