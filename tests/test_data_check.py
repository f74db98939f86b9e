"""Bad data records are reported by name and skipped; the original file is never modified."""

import pandas as pd
import pytest

from verl_pipe.data_check import clean_file, record_problem


def _rec(i, content="What is 1 + 1 modulo 10?", gt="2"):
    return {"data_source": "t", "prompt": [{"role": "user", "content": content}], "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": gt}, "extra_info": {"split": "train", "index": i}}


def test_record_problems():
    assert record_problem(_rec(0)) is None
    assert "ground truth" in record_problem(_rec(1, gt=None))
    assert "ground truth" in record_problem(_rec(2, gt="  "))
    assert "empty prompt" in record_problem(_rec(3, content="   "))
    assert "empty prompt" in record_problem({**_rec(4), "prompt": []})
    assert "UTF-8" in record_problem(_rec(5, content="bad \udcff text"))


def test_clean_file_skips_and_names_records(tmp_path, capsys):
    src = tmp_path / "train.parquet"
    records = [_rec(0), _rec(1, gt=None), _rec(2, content=""), _rec(3)]
    pd.DataFrame(records).to_parquet(src)
    before = src.read_bytes()
    out, skipped = clean_file(str(src), tmp_path / "clean")
    assert skipped == 2
    assert src.read_bytes() == before, "the original file is untouched"
    kept = pd.read_parquet(out)
    assert [e["index"] for e in kept["extra_info"]] == [0, 3]
    printed = capsys.readouterr().out
    assert "record 1" in printed and "record 2" in printed and "ground truth" in printed


def test_clean_file_keeps_good_file_as_is(tmp_path):
    src = tmp_path / "ok.parquet"
    pd.DataFrame([_rec(0), _rec(1)]).to_parquet(src)
    out, skipped = clean_file(str(src), tmp_path / "clean")
    assert (out, skipped) == (str(src), 0)


def test_all_bad_is_an_error(tmp_path):
    src = tmp_path / "bad.parquet"
    pd.DataFrame([_rec(0, gt=None)]).to_parquet(src)
    with pytest.raises(ValueError, match="every record is invalid"):
        clean_file(str(src), tmp_path / "clean")
