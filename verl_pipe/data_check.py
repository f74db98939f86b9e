"""Check RL data records before training: bad ones are skipped, named in the log and counted.

A record is skipped, for one reason (the slug is the metric's name):

- ``non_utf8``: text that is not valid UTF-8 (pandas and verl's loader cannot even read such a row);
- ``empty_prompt``: no prompt, no messages, or only blank ones;
- ``malformed_prompt``: not a list of {role, content} text messages, or the chat template fails on it;
- ``missing_ground_truth``: ``reward_model.ground_truth`` absent, null or empty;
- ``malformed_ground_truth``: not a string or number (a list or mapping only where the reward takes one:
  a custom reward function, verl's searchR1_* sources), or a form the data source's scorer can never
  match (``GROUND_TRUTH_RULES``: digit_math needs an integer, verl's gsm8k scorer a numeric string);
- ``overlong_prompt``: more than ``data.max_prompt_length`` tokens after the chat template, counted
  exactly like verl's ``RLHFDataset.maybe_filter_out_long_prompts`` (the run's tokenizer,
  ``add_generation_prompt=True``, ``data.apply_chat_template_kwargs``), and only when
  ``data.filter_overlong_prompts`` is on, as in verl (off: verl truncates instead).

Each skipped record gets a log line naming the file, the row and the reason (the first
``MAX_LOGGED_PER_FILE`` per file, then a count). A file with bad records is replaced by a cleaned
copy under ``trainer.default_local_dir/clean_data`` (same schema, good rows in order); the original
is never modified. A file with no good record is an error. The counts per split and reason are
stored in ``config.rolloutpipe.data_check_counts``, which travels with the config to the trainer's
process; ``skip_metrics(config)`` turns them into metrics.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

REASONS = ("non_utf8", "empty_prompt", "malformed_prompt", "missing_ground_truth", "malformed_ground_truth",
           "overlong_prompt")
MAX_LOGGED_PER_FILE = 20
SPLITS = (("train", "train_files"), ("val", "val_files"))
METRIC_PREFIX = "data/skipped_records"


class DataCheckError(ValueError):
    pass


def dataset_row(record: dict) -> int | None:
    """A record's dataset row: verl's RLHFDataset ``index``, else its ``extra_info.index`` (verl's
    ``_get_gen_batch`` moves the non-tensor ``index`` into the generation batch and leaves ``extra_info``, a reward
    key, in the step's); None when the record has neither. The one rule the length history (a step batch's groups)
    and the multi-turn episodes (a prompt's task key) share."""
    extra = record.get("extra_info")
    index = record.get("index", extra.get("index") if isinstance(extra, dict) else None)
    return None if index is None else int(index)


@dataclass(frozen=True)
class Problem:
    reason: str  # one of REASONS
    detail: str

    def __str__(self) -> str:
        return f"{self.reason}: {self.detail}"


def _log(msg: str) -> None:
    print(f"[verl_pipe] data check: {msg}", flush=True)


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "...'"


# ---------------------------------------------------------------- one record


def _bad_utf8_field(value: Any, where: str) -> str | None:
    """The first field holding text that cannot be encoded as UTF-8 (lone surrogates)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return where
    elif isinstance(value, dict):
        for k, v in value.items():
            found = _bad_utf8_field(v, f"{where}.{k}" if where else str(k))
            if found:
                return found
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            found = _bad_utf8_field(v, f"{where}[{i}]")
            if found:
                return found
    return None


def _plain(value: Any) -> Any:
    """numpy arrays / scalars (pandas-read records) as Python lists / scalars."""
    return value.tolist() if hasattr(value, "tolist") and not isinstance(value, (str, bytes)) else value


def _prompt_problem(prompt: Any, key: str) -> Problem | None:
    prompt = _plain(prompt)
    if prompt is None:
        return Problem("empty_prompt", f"no {key}")
    if not isinstance(prompt, (list, tuple)):
        return Problem("malformed_prompt", f"{key} is a {type(prompt).__name__}, not a list of {{role, content}} messages")
    if not prompt:
        return Problem("empty_prompt", f"{key} has no messages")
    for j, msg in enumerate(prompt):
        if not isinstance(msg, dict):
            return Problem("malformed_prompt", f"{key}[{j}] is a {type(msg).__name__}, not a {{role, content}} message")
        role, content = msg.get("role"), msg.get("content")
        if not isinstance(role, str) or not role.strip():
            return Problem("malformed_prompt", f"{key}[{j}] has no role")
        if isinstance(content, bytes):
            try:
                content.decode("utf-8")
            except UnicodeDecodeError:
                return Problem("non_utf8", f"{key}[{j}].content is not valid UTF-8")
            return Problem("malformed_prompt", f"{key}[{j}].content is bytes, not text")
        if not isinstance(content, str):
            return Problem("malformed_prompt", f"{key}[{j}].content is a {type(content).__name__}, not text")
    if not any(m["content"].strip() for m in prompt):
        return Problem("empty_prompt", f"every message of {key} is blank")
    return None


def _digit_math_truth(gt: Any) -> str | None:
    from verl_pipe.assets.math_data import DATA_SOURCE
    from verl_pipe.assets.reward import compute_score

    try:
        compute_score(DATA_SOURCE, "", gt)
    except ValueError:
        return f"{_short(gt)} is not an integer (the digit-math reward compares integers)"
    return None


def _gsm8k_truth(gt: Any) -> str | None:
    # verl.utils.reward_score.gsm8k compares the extracted answer (digits, '.', a leading '-', commas
    # and '$' removed) to the ground truth as is: anything else can never match.
    if not isinstance(gt, str) or not re.fullmatch(r"-?[0-9.]+", gt):
        return f"{_short(gt)} is not a numeric string (verl's gsm8k scorer compares strings like '72')"
    return None


# data_source -> check of a scalar ground truth for the scorer of that source (None: fine).
GROUND_TRUTH_RULES: dict[str, Callable[[Any], str | None]] = {
    "verl_pipe/digit_math": _digit_math_truth,
    "openai/gsm8k": _gsm8k_truth,
}
# verl's built-in scorers that take a structured ground truth ({"target": [...]}).
STRUCTURED_TRUTH_SOURCES = ("searchR1_",)


def _ground_truth_problem(record: dict, structured_ok: bool) -> Problem | None:
    rm = record.get("reward_model")
    gt = _plain(rm.get("ground_truth")) if isinstance(rm, dict) else None
    if gt is None or (isinstance(gt, float) and math.isnan(gt)):
        return Problem("missing_ground_truth", "no reward_model.ground_truth")
    if isinstance(gt, (str, list, tuple, dict)) and not (gt.strip() if isinstance(gt, str) else gt):
        return Problem("missing_ground_truth", f"reward_model.ground_truth is empty ({_short(gt)})")
    source = str(record.get("data_source") or "")
    if isinstance(gt, (list, tuple, dict)):
        if structured_ok or source.startswith(STRUCTURED_TRUTH_SOURCES):
            return None
        return Problem("malformed_ground_truth",
                       f"reward_model.ground_truth is a {type(gt).__name__} ({_short(gt)}), not a string or number")
    if isinstance(gt, bool) or not isinstance(gt, (str, int, float)):
        return Problem("malformed_ground_truth",
                       f"reward_model.ground_truth is a {type(gt).__name__} ({_short(gt)}), not a string or number")
    rule = GROUND_TRUTH_RULES.get(source)
    why = rule(gt) if rule else None
    return Problem("malformed_ground_truth", f"reward_model.ground_truth {why}") if why else None


def record_problem(record: dict | None, prompt_key: str = "prompt", structured_ground_truth: bool = False
                   ) -> Problem | None:
    """What is wrong with one record (None: nothing), apart from its length in tokens.

    ``record`` None stands for a row that could not be decoded (non-UTF-8 bytes in a string column).
    ``structured_ground_truth``: the reward takes list / mapping ground truths (a custom reward)."""
    if record is None:
        return Problem("non_utf8", "a text field is not valid UTF-8 (the row cannot be decoded)")
    field = _bad_utf8_field(record, "")
    if field:
        return Problem("non_utf8", f"{field} is not valid UTF-8")
    return (_prompt_problem(record.get(prompt_key), prompt_key)
            or _ground_truth_problem(record, structured_ground_truth))


# ---------------------------------------------------------------- prompt length


class PromptLength:
    """Prompt tokens after the chat template, counted like verl's RLHFDataset.maybe_filter_out_long_prompts:
    ``len(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, **kwargs))``
    (rendered, then tokenized in one batch without special tokens: what apply_chat_template does)."""

    def __init__(self, tokenizer_or_path: Any, max_prompt_length: int, template_kwargs: dict | None = None,
                 trust_remote_code: bool = False):
        self._tokenizer = tokenizer_or_path
        self.trust_remote_code = trust_remote_code
        self.max_prompt_length = int(max_prompt_length)
        kwargs = dict(template_kwargs or {})
        for k in ("tokenize", "return_dict", "return_tensors"):  # verl pops these too
            kwargs.pop(k, None)
        self.template_kwargs = kwargs

    @classmethod
    def from_config(cls, config: DictConfig) -> PromptLength | None:
        """None where verl does not drop overlong prompts or we cannot count like it does."""
        data = config.data
        if not data.get("filter_overlong_prompts", True):
            _log("overlong prompts are not skipped (data.filter_overlong_prompts=false: verl truncates them)")
            return None
        if data.get("tool_config_path") or data.get("function_tool_path"):
            _log("overlong prompts are left to verl's filter (tool schemas in the chat template); not counted")
            return None
        path = config.actor_rollout_ref.model.path  # the dataset's tokenizer (verl_pipe.launch.task_runner)
        if not path or not Path(os.path.expanduser(str(path))).exists():
            _log(f"overlong prompts are left to verl's filter (no local model path: {path}); not counted")
            return None
        kwargs = data.get("apply_chat_template_kwargs")
        kwargs = OmegaConf.to_container(kwargs, resolve=True) if isinstance(kwargs, DictConfig) else dict(kwargs or {})
        return cls(os.path.expanduser(str(path)), int(data.max_prompt_length), kwargs,
                   trust_remote_code=bool(data.get("trust_remote_code", False)))

    @property
    def tokenizer(self):
        if isinstance(self._tokenizer, (str, Path)):
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(str(self._tokenizer),
                                                            trust_remote_code=self.trust_remote_code)
        return self._tokenizer

    def problems(self, prompts: list) -> list[Problem | None]:
        texts, problems = [], [None] * len(prompts)
        for i, messages in enumerate(prompts):
            try:
                texts.append((i, self.tokenizer.apply_chat_template(
                    _plain(messages), add_generation_prompt=True, tokenize=False, **self.template_kwargs)))
            except Exception as e:  # noqa: BLE001 - verl counts a failing template as overlong; we name it
                problems[i] = Problem("malformed_prompt", f"the chat template fails: {type(e).__name__}: {e}")
        if texts:
            ids = self.tokenizer([t for _, t in texts], add_special_tokens=False)["input_ids"]
            for (i, _), tokens in zip(texts, ids):
                if len(tokens) > self.max_prompt_length:
                    problems[i] = Problem("overlong_prompt", f"{len(tokens)} tokens after the chat template > "
                                                             f"data.max_prompt_length={self.max_prompt_length}")
        return problems


# ---------------------------------------------------------------- one file


def read_records(path: str):
    """(pyarrow table, one dict per row, or None for a row whose text is not valid UTF-8)."""
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    rows: list[dict | None] = []
    for start in range(0, table.num_rows, 1024):
        chunk = table.slice(start, 1024)
        try:
            rows.extend(chunk.to_pylist())
        except UnicodeDecodeError:  # find the rows, one by one
            for i in range(chunk.num_rows):
                try:
                    rows.extend(chunk.slice(i, 1).to_pylist())
                except UnicodeDecodeError:
                    rows.append(None)
    return table, rows


def _row_name(row: int, record: dict | None) -> str:
    info = record.get("extra_info") if isinstance(record, dict) else None
    index = info.get("index") if isinstance(info, dict) else None
    return f"row {row}" + (f" (extra_info.index={index})" if index is not None and index != row else "")


def check_records(rows: list, prompt_key: str = "prompt", lengths: PromptLength | None = None,
                  structured_ground_truth: bool = False) -> list[Problem | None]:
    problems = [record_problem(r, prompt_key, structured_ground_truth) for r in rows]
    if lengths is not None:
        ok = [i for i, p in enumerate(problems) if p is None]
        for i, p in zip(ok, lengths.problems([rows[i][prompt_key] for i in ok])):
            problems[i] = p
    return problems


def clean_file(path: str, out_dir: Path, prompt_key: str = "prompt", lengths: PromptLength | None = None,
               structured_ground_truth: bool = False) -> tuple[str, dict[str, int]]:
    """Checks one parquet file; returns (the file to train on, skipped records per reason)."""
    table, rows = read_records(path)
    problems = check_records(rows, prompt_key, lengths, structured_ground_truth)
    bad = [(i, p) for i, p in enumerate(problems) if p is not None]
    for i, p in bad[:MAX_LOGGED_PER_FILE]:
        _log(f"skipping {_row_name(i, rows[i])} of {path}: {p}")
    if len(bad) > MAX_LOGGED_PER_FILE:
        _log(f"{path}: {len(bad) - MAX_LOGGED_PER_FILE} more bad records not shown")
    counts = dict(Counter(p.reason for _, p in bad))
    if not rows:
        raise DataCheckError(f"{path}: the file has no records")
    if len(bad) == len(rows):
        raise DataCheckError(f"{path}: all {len(rows)} records are bad ({_tally(counts)}); nothing to train on "
                             "(see the lines above)")
    if not bad:
        return path, {}
    out_dir.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha1(os.path.abspath(path).encode()).hexdigest()[:8]
    out = out_dir / f"{Path(path).stem}.clean-{digest}.parquet"
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    import pyarrow.parquet as pq

    pq.write_table(table.take([i for i, p in enumerate(problems) if p is None]), tmp)
    os.replace(tmp, out)
    _log(f"{path}: kept {len(rows) - len(bad)} of {len(rows)} records, skipped {len(bad)} ({_tally(counts)}); "
         f"training reads {out}")
    return str(out), counts


def _tally(counts: dict[str, int]) -> str:
    return ", ".join(f"{r}={counts[r]}" for r in REASONS if counts.get(r))


# ---------------------------------------------------------------- the run's files


def _custom_reward(config: DictConfig) -> bool:
    """A custom reward function other than the digit-math one: it may take structured ground truths."""
    path = OmegaConf.select(config, "reward.custom_reward_function.path")
    if not path:
        return False
    import verl_pipe.assets.reward as digit_reward

    return os.path.abspath(os.path.expanduser(str(path))) != os.path.abspath(digit_reward.__file__)


def clean_datasets(config: DictConfig) -> dict[str, dict[str, int]]:
    """Replaces data.train_files / data.val_files by cleaned copies where needed. Returns (and stores in
    config.rolloutpipe.data_check_counts) the skipped records per split and reason, with a total."""
    out_dir = Path(config.trainer.default_local_dir).expanduser() / "clean_data"
    prompt_key = config.data.get("prompt_key", "prompt")
    lengths = PromptLength.from_config(config)
    structured = _custom_reward(config)
    counts: dict[str, dict[str, int]] = {}
    with open_dict(config):
        for split, key in SPLITS:
            files = config.data.get(key)
            tally: Counter = Counter()
            if files:
                single = isinstance(files, str)
                cleaned = []
                for f in [files] if single else list(files):
                    f = str(f)
                    if "://" in f or not f.endswith(".parquet"):
                        _log(f"{f} not checked (only local parquet files are)")
                        cleaned.append(f)
                        continue
                    new, skipped = clean_file(os.path.expanduser(f), out_dir, prompt_key, lengths, structured)
                    cleaned.append(new)
                    tally.update(skipped)
                config.data[key] = cleaned[0] if single else cleaned
            counts[split] = {r: tally.get(r, 0) for r in REASONS}
            counts[split]["total"] = sum(tally.values())
        config.rolloutpipe.data_check_counts = counts
    return counts


def skip_metrics(config: DictConfig) -> dict[str, int]:
    """``data/skipped_records/<split>/<reason>`` and ``.../<split>/total`` from the launcher's data check
    ({} if it did not run). Works in any process the config reaches (the TaskRunner)."""
    counts = config.get("rolloutpipe", {}).get("data_check_counts")
    if not counts:
        return {}
    return {f"{METRIC_PREFIX}/{split}/{reason}": int(n) for split, c in counts.items() for reason, n in c.items()}


# ---------------------------------------------------------------- test data


def write_bad_records_parquet(path: str | Path, good_records_source: str | Path, max_prompt_length: int,
                              num_good: int | None = None) -> dict[str, int]:
    """Writes ``path``: the first ``num_good`` records of ``good_records_source`` (a digit-math parquet,
    e.g. ``ensure_assets().train_file``; all by default) with one record of each bad kind mixed in.
    Returns the skip counts the data check must find ({reason: 1, ..., "total": 6})."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    source = pq.read_table(str(good_records_source))
    good = source.slice(0, source.num_rows if num_good is None else num_good).to_pylist()
    if not good:
        raise ValueError(f"{good_records_source}: no good records to mix the bad ones into")
    template = good[0]

    def variant(kind: str, content: str | bytes, truth: str | None = "7", role: str | None = "user") -> dict:
        rec = dict(template)
        rec["prompt"] = [{"role": role, "content": content}]
        rec["reward_model"] = {**template["reward_model"], "ground_truth": truth}
        rec["extra_info"] = {**template["extra_info"], "index": -1, "question": f"bad record: {kind}"}
        return rec

    question = "What is 3 + 4 modulo 10? Put the final answer after 'Answer:'"
    bad = {
        "missing_ground_truth": variant("missing_ground_truth", question, truth=None),
        "malformed_ground_truth": variant("malformed_ground_truth", question, truth="seven"),
        "empty_prompt": variant("empty_prompt", "   "),
        "malformed_prompt": variant("malformed_prompt", question, role=None),
        # Every digit is its own token: max_prompt_length + 1 digits are too long whatever the template adds.
        "overlong_prompt": variant("overlong_prompt", "What is " + " + ".join("1" * (max_prompt_length + 1))),
        "non_utf8": variant("non_utf8", b"What is 3 + 4 \xff\xfe modulo 10?"),
    }
    rows = list(good)
    step = max(1, len(good) // (len(bad) + 1))
    for k, rec in enumerate(bad.values()):  # spread through the file, good rows keep their order
        rows.insert(min(len(rows), (k + 1) * step + k), rec)
    contents = [c if isinstance(c, bytes) else c.encode() for r in rows for c in (m["content"] for m in r["prompt"])]
    # A string column holding bytes that are not UTF-8, as a broken writer leaves it (pyarrow refuses to
    # build one from Python values, so the bytes are viewed as strings).
    messages = pa.StructArray.from_arrays(
        [pa.array([m["role"] for r in rows for m in r["prompt"]], pa.string()),
         pa.array(contents, pa.binary()).view(pa.string())], names=["role", "content"])
    offsets = [0]
    for r in rows:
        offsets.append(offsets[-1] + len(r["prompt"]))
    prompt = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), messages)
    rest = source.schema.remove(source.schema.get_field_index("prompt"))
    table = pa.Table.from_pylist([{k: v for k, v in r.items() if k != "prompt"} for r in rows], schema=rest)
    table = table.add_column(source.schema.get_field_index("prompt"), "prompt", prompt)
    pq.write_table(table, str(path))
    return {**{r: 1 for r in REASONS}, "total": len(REASONS)}


# ---------------------------------------------------------------- a record that fails mid-run

ON_BAD_RECORD = ("fail", "skip")
BAD_RECORD_METRIC = "data/bad_records_skipped"


class BadRecordError(DataCheckError):
    """A record failed in verl's dataset while the run drew a batch (rolloutpipe.fault.on_bad_record=fail)."""


class GuardedDataset:
    """verl's training dataset, its records read as verl reads them, with a record that fails there named: the check
    above runs before training, but a record can still fail in verl's ``__getitem__`` mid-run (its file changed
    under the run, a multimodal file gone, a case the check does not know). ``policy`` (rolloutpipe.fault.on_bad_record):
    ``fail`` raises BadRecordError naming the split's files, the row and verl's error (the run loop checkpoints the
    last completed step with the data loader before the batch, verl_pipe/trainer/run_loop.py); ``skip`` logs it and
    leaves it out of its batch (``guarded_collate``), counted in ``data/bad_records_skipped``: the batch is one prompt
    short, as when a group is dropped (an oversampled prompt, rolloutpipe.oversample, takes its place). Everything
    else is verl's dataset's (attributes are forwarded)."""

    def __init__(self, dataset, files, policy: str = "fail", split: str = "train"):
        if policy not in ON_BAD_RECORD:
            raise ValueError(f"rolloutpipe.fault.on_bad_record: got {policy!r}; allowed: one of "
                             f"{', '.join(ON_BAD_RECORD)}")
        self.dataset, self.policy, self.split = dataset, policy, split
        self.files = [str(f) for f in ([files] if isinstance(files, str) else list(files or []))]
        self.skipped: list[str] = []  # named, since the last take_skipped()

    def __len__(self) -> int:
        return len(self.dataset)

    def __getattr__(self, name):
        if name in ("dataset", "policy", "split", "files", "skipped"):  # not set yet (unpickling)
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def __getitem__(self, item):
        try:
            return self.dataset[item]
        except Exception as e:  # noqa: BLE001 -- any error of verl's dataset on this record
            where = self.describe(item)
            msg = f"{where} failed in verl's dataset: {type(e).__name__}: {e}"
            if self.policy == "fail":
                raise BadRecordError(f"{msg} (rolloutpipe.fault.on_bad_record=fail)") from e
            _log(f"{msg}; skipped (rolloutpipe.fault.on_bad_record=skip)")
            self.skipped.append(where)
            return None

    def describe(self, item) -> str:
        """The record as a user finds it: the split's files, the row, and its extra_info.index when readable."""
        files = ", ".join(self.files) or "?"
        name = f"data.{self.split}_files ({files}) row {item}"
        try:
            index = (self.dataset.dataframe[int(item)].get("extra_info") or {}).get("index")
        except Exception:  # noqa: BLE001 -- the record may be unreadable
            index = None
        return name if index is None else f"{name} (record index {index})"

    def take_skipped(self) -> list[str]:
        out, self.skipped = self.skipped, []
        return out


def guarded_collate(collate: Callable) -> Callable:
    """verl's collate function over the records ``GuardedDataset`` did not skip (None for a batch of skipped
    records only)."""

    def collate_good(records):
        good = [r for r in records if r is not None]
        return collate(good) if good else None

    return collate_good


def bad_record_metrics(dataset) -> dict[str, int]:
    """The records skipped since the last step (``data/bad_records_skipped``), for the step's metrics."""
    take = getattr(dataset, "take_skipped", None)
    return {BAD_RECORD_METRIC: len(take())} if take is not None else {}
