"""Check RL data records before training: bad ones are reported by name and skipped.

A record is bad when its ground truth is missing or empty, its prompt is empty or
not a list of chat messages, or its text is not valid UTF-8. (Prompts longer than
``data.max_prompt_length`` are dropped by verl's own ``filter_overlong_prompts``.)
When a file has bad records, a cleaned copy is written next to the run's cache and
used instead; the original file is never modified.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

from omegaconf import DictConfig, open_dict

logger = logging.getLogger(__name__)


def record_problem(record: dict, prompt_key: str = "prompt") -> str | None:
    prompt = record.get(prompt_key)
    if prompt is None or len(prompt) == 0:
        return "empty prompt"
    try:
        for msg in prompt:
            content = msg.get("content") if isinstance(msg, dict) else None
            if not isinstance(content, str):
                return "prompt is not a list of {role, content} messages"
            content.encode("utf-8")
        if not any(m.get("content", "").strip() for m in prompt):
            return "empty prompt"
    except (UnicodeEncodeError, AttributeError, TypeError):
        return "prompt text is not valid UTF-8"
    rm = record.get("reward_model")
    gt = rm.get("ground_truth") if isinstance(rm, dict) else None
    if gt is None or (isinstance(gt, str) and not gt.strip()):
        return "missing ground truth (reward_model.ground_truth)"
    return None


def clean_file(path: str, out_dir: Path, prompt_key: str = "prompt") -> tuple[str, int]:
    import pandas as pd

    df = pd.read_parquet(path)
    keep, skipped = [], 0
    for i, rec in enumerate(df.to_dict(orient="records")):
        problem = record_problem(rec, prompt_key)
        if problem:
            idx = (rec.get("extra_info") or {}).get("index", i) if isinstance(rec.get("extra_info"), dict) else i
            logger.warning("skipping record %s of %s: %s", idx, path, problem)
            print(f"[verl_pipe] skipping record {idx} of {path}: {problem}", flush=True)
            skipped += 1
        else:
            keep.append(i)
    if not skipped:
        return path, 0
    if not keep:
        raise ValueError(f"{path}: every record is invalid (see the messages above)")
    out_dir.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha1(os.path.abspath(path).encode()).hexdigest()[:8]
    out = out_dir / f"{Path(path).stem}.clean-{digest}.parquet"
    df.iloc[keep].reset_index(drop=True).to_parquet(out)
    return str(out), skipped


def clean_datasets(config: DictConfig) -> dict[str, int]:
    """Replaces data.train_files / data.val_files by cleaned copies where needed; returns skip counts."""
    out_dir = Path(config.trainer.default_local_dir).expanduser() / "clean_data"
    counts = {}
    with open_dict(config):
        for key in ("train_files", "val_files"):
            files = config.data[key]
            single = isinstance(files, str)
            cleaned = []
            total = 0
            for f in [files] if single else list(files):
                if "://" in str(f):
                    cleaned.append(f)
                    continue
                new, skipped = clean_file(os.path.expanduser(str(f)), out_dir, config.data.prompt_key)
                cleaned.append(new)
                total += skipped
            config.data[key] = cleaned[0] if single else cleaned
            counts[key] = total
        config.rolloutpipe.skipped_records = counts
    return counts
