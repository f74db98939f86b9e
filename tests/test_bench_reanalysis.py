"""The bench JSONs in docs/bench whose per-step files are kept (gzipped beside them, ``NAME_steps_DATE.json.gz``)
regenerate from those steps: ``python -m verl_pipe_lab.bench --reanalyze STEPS.json.gz --config BENCH.yaml`` (the bench
YAML the JSON recorded under ``config.bench_config``) rebuilds every figure of the JSON. The JSONs whose steps were
not kept are the ones docs/metrics.md lists as such. No Ray, no vLLM: the analysis and the simulator only."""

import json
import math
from pathlib import Path

import pytest
import yaml

from verl_pipe_lab.bench.run import BenchRunner, main

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "docs" / "bench"
# where the figures legitimately differ: when and how long the analysis ran, where the steps were read from, and the
# CPU probe of the machine the reanalysis runs on (steps files older than env's recording do not carry the run's)
NOT_FIGURES = {"elapsed_s", "steps_file", "reanalysis", "env", "charts"}  # charts: written only with --charts


def bench_results() -> list[Path]:
    """docs/bench's results of ``python -m verl_pipe_lab.bench`` (not the learning curves, soaks or span tables)."""
    out = []
    for p in sorted(BENCH.glob("*.json")):
        with open(p) as f:
            d = json.load(f)
        if isinstance(d, dict) and "settings" in d and "steps_file" in d:
            out.append(p)
    return out


def kept_steps(result: Path) -> Path | None:
    name, _, date = result.stem.rpartition("_")
    p = result.with_name(f"{name}_steps_{date}.json.gz")
    return p if p.exists() else None


def _diffs(a, b, path=""):
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a and path.endswith(".modes") and set(b[k]) == {"skipped"}:
                continue  # a peer configuration added to the variant table after the run: it did not run then either
            if k not in a or k not in b:
                yield f"{path}.{k}: only in {'the committed JSON' if k in a else 'the reanalysis'}"
            elif k == "skipped" and isinstance(a[k], str) and isinstance(b[k], str):
                continue  # why a mode did not run: its wording depends on what this environment has installed
            else:
                yield from _diffs(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            yield f"{path}: {len(a)} vs {len(b)} entries"
        for i, (x, y) in enumerate(zip(a, b)):
            yield from _diffs(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and isinstance(b, (int, float)) and not isinstance(b, bool):
        if not math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12):
            yield f"{path}: {a} vs {b}"
    elif a != b:
        yield f"{path}: {str(a)[:80]} vs {str(b)[:80]}"


def test_every_bench_json_has_its_steps_kept_or_is_listed_as_not_kept():
    metrics = (ROOT / "docs" / "metrics.md").read_text()
    results = bench_results()
    assert results
    for p in results:
        if kept_steps(p) is None:
            assert f"`{p.name}`" in metrics.split("## The README's and docs' figures")[-1], \
                f"{p.name}: no kept steps file beside it and docs/metrics.md does not list it as not kept"


@pytest.mark.parametrize("result", [p for p in bench_results() if kept_steps(p)], ids=lambda p: p.stem)
def test_a_kept_steps_file_regenerates_its_json(result, tmp_path):
    with open(result) as f:
        committed = json.load(f)
    cfg = tmp_path / "bench.yaml"
    cfg.write_text(yaml.safe_dump(committed["config"]["bench_config"]))
    out = tmp_path / "re.json"
    assert main(["--reanalyze", str(kept_steps(result)), "--config", str(cfg), "--out", str(out)]) == 0
    with open(out) as f:
        again = json.load(f)
    assert again["reanalysis"]["steps_file"] == str(kept_steps(result))
    problems = list(_diffs({k: v for k, v in committed.items() if k not in NOT_FIGURES},
                           {k: v for k, v in again.items() if k not in NOT_FIGURES}))
    assert problems == [], "\n".join(problems[:20])
    if again["reanalysis"]["env_from_steps_file"]:  # the run's machine, not the one reanalysing
        assert again["env"] == committed["env"]


def test_the_steps_file_keeps_the_machine_and_a_gzipped_copy_loads(tmp_path):
    import gzip

    runner = BenchRunner({}, 1)
    runner.env = {"machine": {"arch": "x86_64"}}
    dumped = runner.dump()
    assert dumped["env"] == {"machine": {"arch": "x86_64"}}
    with gzip.open(tmp_path / "s.json.gz", "wt") as f:
        json.dump(dumped, f)
    again = BenchRunner({}, 1)
    again.load(tmp_path / "s.json.gz")
    assert again.env == {"machine": {"arch": "x86_64"}} and again.steps == [] and again.stacks == {}
    # a steps file written before the machine was recorded loads with none, and the reanalysis says so
    del dumped["env"]
    (tmp_path / "old.json").write_text(json.dumps(dumped))
    old = BenchRunner({}, 1)
    old.load(tmp_path / "old.json")
    assert old.env is None
