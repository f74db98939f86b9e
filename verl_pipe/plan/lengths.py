"""Where the planner's response lengths come from, and how a step's workload is drawn from them.

Sources (``--lengths``):

- a distribution spec, as ``rolloutpipe.workload`` spells it: ``lognormal:median=700,sigma=0.8,rho=0.7,cap=4096``
  (or ``mean=``), ``equal:1000``, a named setting ``D1``..``D4`` (docs/sim_sources.md §7), or an inline YAML
  mapping ``{kind: lognormal, ...}``;
- verl's rollout dumps (``trainer.rollout_data_dir``: one ``<step>.jsonl`` per step, one record per response with
  ``input``, ``output``, ``step``; written by ``RayPPOTrainer._write_generations``) — a file or a folder of them;
- a bench's per-step file (``*_steps_*.json[.gz]``, ``FILE:SIZE`` for one model size: every measured step's groups);
- our step records (``rolloutpipe.trace_dir``: ``steps.jsonl``, or a folder holding it) and Chrome traces
  (``step_NNNNN.json``);
- a parquet column (``FILE.parquet:COLUMN``): token counts, one row per response (with ``--group-column``, or
  ``n`` consecutive rows a group, verl's batch order) or one list per row (a group).

A real source's groups are kept whole: a step draws whole groups (with replacement), so the lengths of one
prompt's responses stay correlated as they were measured; a group of another size than the planned ``n`` is
resampled within itself.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from verl_pipe.core.workload import SETTINGS, Workload, from_spec


@dataclass(frozen=True)
class Lengths:
    source: str
    groups: list[list[int]] = field(default_factory=list)  # measured: response tokens per group
    spec: dict | None = None  # a distribution: drawn per seed
    prompt_len: float | None = None  # mean prompt tokens, when the source says

    def workload(self, num_groups: int, n: int, cap: int, prompt_len: int, seed: int) -> Workload:
        """One step's lengths: ``num_groups`` groups of ``n``, capped at ``cap`` (data.max_response_length)."""
        if self.spec is not None:
            spec = dict(self.spec)
            if spec.get("kind", "lognormal") == "lognormal":
                spec["cap"] = min(int(spec.get("cap", cap)), cap)
            else:
                spec["length"] = min(int(spec["length"]), cap)
            return from_spec(spec, num_groups, n, prompt_len, seed)
        rng = np.random.default_rng(seed)
        out = []
        for i in rng.integers(0, len(self.groups), num_groups):
            g = self.groups[int(i)]
            picked = g if len(g) == n else [g[int(j)] for j in rng.integers(0, len(g), n)]
            out.append([max(1, min(int(x), cap)) for x in picked])
        return Workload(num_groups, n, out, prompt_len, self.source)

    def stats(self, cap: int, n: int = 16) -> dict:
        """Mean, p50/p90/p99, share at the cap, and the within-group correlation of log-lengths (ICC)."""
        wl = self.workload(256, n, cap, 0, seed=12345)
        x = np.asarray(wl.lengths, dtype=float)
        lg = np.log(x)
        between = lg.mean(axis=1).var()
        within = lg.var(axis=1, ddof=1).mean() if n > 1 else 0.0
        icc = float(max(0.0, between - within / n) / max(between - within / n + within, 1e-12))
        return {"mean": float(x.mean()), "p50": float(np.percentile(x, 50)), "p90": float(np.percentile(x, 90)),
                "p99": float(np.percentile(x, 99)), "at_cap": float((x >= cap).mean()),
                "cv": float(x.std() / x.mean()), "icc_log": icc}


# ---------------------------------------------------------------------------------------------- specs

_KEYS = {"median", "mean", "sigma", "rho", "cap", "length"}


def parse_spec(text: str) -> dict:
    """``lognormal:k=v,...`` / ``equal:L`` / ``D1``..``D4`` / ``{kind: ..., ...}`` -> a workload spec dict."""
    t = text.strip()
    if t in SETTINGS:
        return dict(SETTINGS[t], kind="lognormal")
    if t.startswith("{"):
        spec = yaml.safe_load(t)
        if not isinstance(spec, dict):
            raise ValueError(f"--lengths {text}: not a mapping")
    else:
        kind, _, rest = t.partition(":")
        if kind == "equal":
            try:
                return {"kind": "equal", "length": int(rest)}
            except ValueError:
                raise ValueError(f"--lengths {text}: equal needs a length, e.g. equal:1000") from None
        if kind != "lognormal" or not rest:
            raise ValueError(f"--lengths {text}: not a file, and not a spec (lognormal:median=700,sigma=0.8,"
                             f"rho=0.7,cap=4096 | equal:1000 | {' | '.join(SETTINGS)})")
        spec = {"kind": "lognormal"}
        for kv in rest.split(","):
            k, eq, v = kv.partition("=")
            if not eq or k.strip() not in _KEYS:
                raise ValueError(f"--lengths {text}: {kv!r} is not key=value with a key in {sorted(_KEYS)}")
            spec[k.strip()] = float(v)
    spec.setdefault("kind", "lognormal")
    spec.pop("seed", None)  # the planner draws its own seeds
    if spec["kind"] == "lognormal":
        missing = [k for k in ("sigma",) if k not in spec] + ([] if ("mean" in spec) != ("median" in spec)
                                                             else ["exactly one of mean, median"])
        if missing:
            raise ValueError(f"--lengths {text}: lognormal needs {', '.join(missing)}")
        if "rho" not in spec:  # docs/sim_sources.md §1b: arrival ICC 0.54-0.72; the output says it was assumed
            spec["rho"], spec["rho_assumed"] = 0.7, True
        spec.setdefault("cap", 1 << 30)
        if not 0 <= float(spec["rho"]) <= 1 or float(spec["sigma"]) < 0:
            raise ValueError(f"--lengths {text}: rho must be in [0, 1] and sigma >= 0")
    elif spec["kind"] != "equal" or "length" not in spec:
        raise ValueError(f"--lengths {text}: kind must be lognormal or equal (with length)")
    return spec


# ---------------------------------------------------------------------------------------------- files

def _groups_from_timeline(tl: dict) -> list[list[int]]:
    by: dict[int, list[int]] = {}
    for r in tl.get("responses", []):
        by.setdefault(int(r["group"]), []).append(int(r["num_tokens"]))
    return [by[g] for g in sorted(by)]


def _groups_from_chrome(path: Path) -> list[list[int]]:
    d = json.loads(path.read_text())
    by: dict[tuple, list[int]] = {}
    for e in d.get("traceEvents", []):
        a = e.get("args") or {}
        if e.get("ph") == "X" and e.get("pid") == 1 and a.get("tokens") is not None and not (
                a.get("aborted") or a.get("unfinished")):
            by.setdefault((a.get("step"), a["group"]), []).append(int(a["tokens"]))
    return list(by.values())


def _read_jsonl(path: Path) -> list[dict]:
    out = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"--lengths {path}: line {i} is not JSON ({e.msg})") from None
    return out


_TOKEN_FIELDS = ("response_length", "num_tokens", "response_tokens", "output_tokens")


def _verl_dump_groups(records: list[dict], path: Path, count_tokens) -> list[list[int]]:
    """verl's dump keeps decoded text; a group is one step's responses to one identical prompt (``input``)."""
    by: dict[tuple, list[int]] = {}
    for i, r in enumerate(records, 1):
        if "output" not in r or "input" not in r:
            raise ValueError(f"--lengths {path}: record {i} has no 'input'/'output' (not a verl rollout dump)")
        field_ = next((k for k in _TOKEN_FIELDS if isinstance(r.get(k), (int, float))), None)
        if field_ is not None:
            tokens = int(r[field_])
        elif count_tokens is None:
            raise ValueError(f"--lengths {path}: verl's rollout dump keeps decoded text, not token counts; pass "
                             "--tokenizer PATH (the model's tokenizer) to count them, or --chars-per-token X to "
                             "estimate them")
        else:
            tokens = count_tokens(str(r["output"]))
        by.setdefault((r.get("step"), r["input"]), []).append(max(1, tokens))
    return list(by.values())


def _our_steps(records: list[dict], path: Path) -> tuple[list[list[int]], float | None]:
    groups, prompts = [], []
    for i, rec in enumerate(records, 1):
        tl = rec.get("events") or {}
        if tl.get("responses"):
            groups += _groups_from_timeline(tl)
        else:  # records written before steps.jsonl carried the events: the step's Chrome trace beside it
            trace = path.parent / f"step_{int(rec.get('step', 0)):05d}.json"
            if not trace.exists():
                raise ValueError(f"--lengths {path}: record {i} (step {rec.get('step')}) has no events and there is "
                                 f"no {trace.name} beside it")
            groups += _groups_from_chrome(trace)
        p = (rec.get("metrics") or {}).get("prompt_length/mean")
        if p:
            prompts.append(float(p))
    return groups, (sum(prompts) / len(prompts) if prompts else None)


def _parquet(path: Path, column: str, group_column: str | None, n: int) -> list[list[int]]:
    import pandas as pd

    df = pd.read_parquet(path)
    if column not in df.columns:
        raise ValueError(f"--lengths {path}:{column}: no such column (has {', '.join(map(str, df.columns))})")
    col = df[column]
    if len(col) and isinstance(col.iloc[0], (list, tuple, np.ndarray)):
        return [[int(x) for x in v] for v in col]
    if group_column:
        if group_column not in df.columns:
            raise ValueError(f"--group-column {group_column}: no such column in {path}")
        return [[int(x) for x in g[column]] for _, g in df.groupby(group_column, sort=False)]
    vals = [int(x) for x in col]
    return [vals[i:i + n] for i in range(0, len(vals) - n + 1, n)]


def load(arg: str, *, n: int, tokenizer: str | None = None, chars_per_token: float | None = None,
         group_column: str | None = None, cap: int | None = None, flag: str = "--lengths") -> Lengths:
    """``--lengths ARG`` -> Lengths. ``n``: the config's responses per prompt (used to group parquet rows);
    ``cap``: data.max_response_length (a verl log's fitted distribution is capped there unless the log clipped)."""
    from verl_pipe.plan import verl_log
    from verl_pipe.plan.calibrate import is_steps_file, split_source, steps_file

    spath, size = split_source(arg)
    if is_steps_file(spath):  # a bench's per-step file: the groups each measured step generated
        return _bench_steps(arg, steps_file(spath, size))
    m = re.match(r"^(.*\.parquet):([^/]+)$", arg)
    path = Path(m.group(1) if m else arg).expanduser()
    if not m and path.exists() and verl_log.is_verl_log(path):  # verl's console / file-logger metrics
        spec, prompt, desc = verl_log.lengths_spec(path, n, cap or (1 << 30), flag)
        return Lengths(source=desc, spec=spec, prompt_len=prompt)
    if not path.exists():
        if m or arg.endswith((".jsonl", ".json", ".parquet")) or "/" in arg:
            raise ValueError(f"--lengths {arg}: no such file or folder")
        return Lengths(source=f"spec {arg}", spec=parse_spec(arg))
    if m or path.suffix == ".parquet":
        if not m:
            raise ValueError(f"--lengths {arg}: name the column of token counts, e.g. {arg}:response_length")
        groups, prompt = _parquet(path, m.group(2), group_column, n), None
        kind = f"parquet column {m.group(2)}"
    else:
        files = [path] if path.is_file() else (
            [path / "steps.jsonl"] if (path / "steps.jsonl").exists() else sorted(path.glob("*.jsonl")))
        if not files:
            traces = sorted(path.glob("step_*.json"))
            if not traces:
                raise ValueError(f"--lengths {arg}: no steps.jsonl, *.jsonl dump or step_*.json trace in this folder")
            files = traces
        groups, prompts, kinds = [], [], set()
        count = _token_counter(tokenizer, chars_per_token)
        for f in files:
            if f.suffix == ".json":
                groups += _groups_from_chrome(f)
                kinds.add("Chrome traces")
                continue
            recs = _read_jsonl(f)
            if recs and ("trained_groups" in recs[0] or "events" in recs[0]):
                g, p = _our_steps(recs, f)
                kinds.add("steps.jsonl")
                if p:
                    prompts.append(p)
            else:
                g = _verl_dump_groups(recs, f, count)
                kinds.add("verl rollout dump")
            groups += g
        prompt = sum(prompts) / len(prompts) if prompts else None
        kind = " + ".join(sorted(kinds))
    groups = [g for g in groups if g]
    if not groups:
        raise ValueError(f"--lengths {arg}: no finished responses found")
    return Lengths(source=f"{kind} {arg} ({len(groups)} groups, {sum(map(len, groups))} responses)",
                   groups=groups, prompt_len=prompt)


def _bench_steps(arg: str, got: dict) -> Lengths:
    steps = got["ours"] + got["peer"]
    groups = [list(map(int, g)) for s in steps for g in s["lengths"] if g]
    prompt = sum(s["prompt_len"] for s in steps) / len(steps)
    return Lengths(source=f"bench steps {arg} ({len(steps)} steps, {len(groups)} groups, "
                          f"{sum(map(len, groups))} responses)", groups=groups, prompt_len=prompt)


def _token_counter(tokenizer: str | None, chars_per_token: float | None):
    if tokenizer:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(tokenizer)
        return lambda s: len(tok.encode(s, add_special_tokens=False)) + 1  # + EOS, which the dump's decode drops
    if chars_per_token:
        if chars_per_token <= 0:
            raise ValueError("--chars-per-token must be > 0")
        return lambda s: int(round(len(s) / chars_per_token)) + 1
    return None
