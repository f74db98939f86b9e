"""The README's and docs' benchmark tables, rendered from the results JSONs they quote.

``python -m verl_pipe_lab.bench.readme_tables --check`` exits 1 and lists every marked table that differs from what its
JSON renders; ``--write`` rewrites the marked tables in place. A table is marked in the markdown by

    <!-- table: docs/bench/NAME.json:KIND -->
    | ... the table ... |
    <!-- /table -->

(the path relative to the repository root, KIND one of ``KINDS``). Only tables whose every figure is in a JSON are
marked; figures measured by hand without a kept artifact are listed in docs/metrics.md ("Figures that cannot be
regenerated"). Pure: it reads JSON and markdown.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from verl_pipe_lab.bench.report import MODES
from verl_pipe.core.variants import BASE, ON_POLICY_PEER

ROOT = Path(__file__).resolve().parents[3]
DEFAULT_FILES = ("README.md", "docs/*.md")
MARKER = re.compile(r"^<!-- table: (?P<path>\S+?\.json):(?P<kind>[a-z_]+) -->\s*$")
END = "<!-- /table -->"

MINUS = "\u2212"  # the README writes negative figures with a minus sign, not a hyphen
BASELINE = "\u2013"  # en dash: the row a reduction is measured against


# ------------------------------------------------------------------------------------------------- cells


def seconds(x: float, digits: int = 2) -> str:
    return f"{x:.{digits}f} s"


def change(reduction_pct: float) -> str:
    """A reduction (positive = shorter) as the change the tables print: −26.4% is 26.4% shorter."""
    return f"{-reduction_pct:+.1f}%".replace("-", MINUS)


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    return [_row(head), "|" + "---|" * len(head)] + [_row(r) for r in rows]


def setting_with_role(result: dict, role: str) -> dict:
    found = [s for s in result["settings"] if s.get("role") == role]
    if len(found) != 1:
        raise ValueError(f"expected one setting with role {role!r}, found {[s['name'] for s in found]}")
    return found[0]


def _ran(setting: dict, modes) -> list[tuple[str, dict]]:
    return [(m, setting["modes"][m]) for m in modes if m in setting["modes"] and "skipped" not in setting["modes"][m]]


PEER_LABELS = {"verl_separate_async": "verl separate_async, on-policy",
               "verl_separate_async_1off": "verl separate_async, 1 batch ahead",
               "verl_separate_async_tuned": "verl separate_async, on-policy, tuned",
               "verl_separate_sync": "verl separate sync", "verl_colocated": "verl colocated sync (V1, main_ppo)"}


def _labels(fgd: str, cgp: str = "cgp") -> dict[str, str]:
    return {"sync": "sync", "cgp": cgp, "cgp_group": "cgp, group granularity", "cgp_fgd": fgd, **PEER_LABELS}


def _fgd_window(result: dict, setting: dict):
    shape = (result.get("config") or {}).get("shapes", {}).get(setting.get("model_size"), {})
    return shape.get("fgd_window")


# ------------------------------------------------------------------------------------------------- kinds


def balanced(result: dict) -> list[str]:
    """The balanced setting: our modes with rollout→train end, trainer wait and both reductions vs sync."""
    s = setting_with_role(result, "balanced")
    fgd = s["modes"].get("cgp_fgd", {})
    labels = _labels(f"cgp + fgd ({fgd.get('granularity', 'minibatch')})", cgp="cgp (mini-batch units)")
    rows = []
    for m, e in _ran(s, MODES):
        base = m == BASE
        rows.append([labels[m], seconds(e["rollout_to_train_end_s"]),
                     BASELINE if base else change(e["reduction_vs_sync_pct"]), f"{e['trainer_wait_ratio']:.3f}",
                     BASELINE if base else change(e["wait_reduction_vs_sync_pct"]), f"{e['pipeline_efficiency']:.2f}"])
    return _table(["mode", "rollout→train end", "vs sync", "trainer wait", "wait vs sync", "efficiency"], rows)


def paper(result: dict) -> list[str]:
    """The paper regime: our modes and verl's peers with trainer busy time."""
    s = setting_with_role(result, "paper")
    labels = _labels(f"cgp + fgd (window auto = {_fgd_window(result, s)})")
    rows = []
    for m, e in _ran(s, MODES + tuple(PEER_LABELS)):
        rows.append([labels[m], seconds(e["rollout_to_train_end_s"]),
                     BASELINE if m == BASE else change(e["reduction_vs_sync_pct"]), f"{e['trainer_wait_ratio']:.3f}",
                     f"{e['pipeline_efficiency']:.2f}", seconds(e["trainer_busy_s"], 1)])
    return _table(["mode", "rollout→train end", "vs sync", "trainer wait", "efficiency", "trainer busy"], rows)


def paper_vs_peer(result: dict) -> list[str]:
    """The paper regime against sync and against verl's on-policy peer."""
    s = setting_with_role(result, "paper")
    labels = _labels("cgp + fgd (window auto)")
    rows = []
    for m, e in _ran(s, MODES + (ON_POLICY_PEER,)):
        rows.append([labels[m], seconds(e["rollout_to_train_end_s"]),
                     BASELINE if m == BASE else change(e["reduction_vs_sync_pct"]),
                     BASELINE if m == ON_POLICY_PEER else change(e["reduction_vs_verl_separate_async_pct"]),
                     f"{e['trainer_wait_ratio']:.3f}", f"{e['pipeline_efficiency']:.2f}"])
    return _table(["mode", "rollout→train end", "vs sync", "vs verl on-policy", "trainer wait", "efficiency"], rows)


def trainer_costs(result: dict) -> list[str]:
    """The paper regime's trainer seconds per 1k padded tokens: sync after the rollout, cgp and cgp+fgd during /
    after it (``trainer_s_per_1k_padded_tokens``)."""
    s = setting_with_role(result, "paper")
    cost = {m: s["modes"][m]["trainer_s_per_1k_padded_tokens"] for m in ("sync", "cgp", "cgp_fgd")}
    rows = []
    for kind, label in (("update", "update"), ("old_log_prob", "old log-prob")):
        pair = [f"{cost[m][kind]['during_rollout']:.3f} / {cost[m][kind]['after_rollout']:.3f} s"
                for m in ("cgp", "cgp_fgd")]
        rows.append([label, f"{cost['sync'][kind]['after_rollout']:.3f} s"] + pair)
    return _table(["trainer call", "sync (after)", "cgp during / after", "cgp+fgd during / after"], rows)


def trainer_gap(result: dict) -> list[str]:
    """Our modes against verl's on-policy peer where the trainer bounds the step (settings with role
    ``trainer-gap``, lab/verl_pipe_lab/bench/conf/trainer_gap.yaml): each setting's modes, the peer's figures taken from the
    setting that ran it, with the update's row order (``rolloutpipe.micro_batch_order``) of each."""
    settings = [s for s in result["settings"] if s.get("role") == "trainer-gap"]
    peer = next((s["modes"][ON_POLICY_PEER] for s in settings
                 if "skipped" not in s["modes"].get(ON_POLICY_PEER, {"skipped": 1})), None)
    if peer is None:
        raise ValueError(f"no trainer-gap setting ran {ON_POLICY_PEER}")
    labels = _labels("cgp + fgd")
    rows = []
    for s in settings:
        order = "arrival" if s["name"].endswith("-arrival") else "length"
        for m, e in _ran(s, MODES):
            vs_peer = 100.0 * (1.0 - e["rollout_to_train_end_s"] / peer["rollout_to_train_end_s"])
            rows.append([labels[m], order, seconds(e["rollout_to_train_end_s"]), change(vs_peer),
                         seconds(e["trainer_busy_s"]), f"{e['trainer_wait_ratio']:.3f}", _efficiencies(e)])
    rows.append([PEER_LABELS[ON_POLICY_PEER], "completion", seconds(peer["rollout_to_train_end_s"]), BASELINE,
                 seconds(peer["trainer_busy_s"]), f"{peer['trainer_wait_ratio']:.3f}", _efficiencies(peer)])
    return _table(["mode", "update rows", "rollout→train end", "vs verl on-policy", "trainer busy", "trainer wait",
                   "efficiency: own / uncontended"], rows)


def _efficiencies(e: dict) -> str:
    """``pipeline_efficiency`` (against the bound built from the mode's own trainer time) beside
    ``uncontended_efficiency`` (the trainer's work charged at sync's after-rollout rates, bench/uncontended.py);
    the latter is absent for verl's peer and for results that predate it."""
    unc = e.get("uncontended_efficiency")
    return f"{e['pipeline_efficiency']:.2f} / " + (BASELINE if unc is None else f"{unc:.2f}")


def trainer_spans(result: dict) -> list[str]:
    """Per measured step, the driver's update and log-prob spans against the worker's time in the same calls
    (``python -m verl_pipe_lab.bench.trainer_gap``'s rows)."""
    rows = []
    for r in result["rows"]:
        u, lp = r["update"], r["old_log_prob"]
        if not u["calls"]:  # the run did not log this mode's update calls
            rows.append([r["setting"], r["mode"], f"{u['driver_s']:.2f} / – / – s", BASELINE, BASELINE,
                         f"{lp['driver_s']:.2f} / {lp['worker_s']:.2f} / {lp['overhead_s']:.2f} s",
                         f"{lp['padded_tokens']:.0f}"])
            continue
        rows.append([r["setting"], r["mode"], f"{u['driver_s']:.2f} / {u['worker_s']:.2f} / {u['overhead_s']:.2f} s",
                     f"{u['padded_tokens']:.0f} / {u['tokens']:.0f}",
                     BASELINE if u["worker_ms_per_padded_ktok"] is None else f"{u['worker_ms_per_padded_ktok']:.0f}",
                     f"{lp['driver_s']:.2f} / {lp['worker_s']:.2f} / {lp['overhead_s']:.2f} s",
                     f"{lp['padded_tokens']:.0f}"])
    return _table(["setting", "mode", "update: driver / worker / rest", "update padded / real tokens",
                   "worker ms per 1k padded tokens", "log-probs: driver / worker / rest", "log-prob padded tokens"],
                  rows)


def fgd_vs_cgp(result: dict) -> list[str]:
    """FGD against cgp on every setting that ran both (means over the rounds): rollout→train end and its change,
    first unit ready, rollout end, and vLLM's preemptions per step where counted."""
    rows = []
    for s in result["settings"]:
        modes = s["modes"]
        if not all(m in modes and "skipped" not in modes[m] for m in ("cgp", "cgp_fgd")):
            continue
        c, f = modes["cgp"], modes["cgp_fgd"]
        pre = [e.get("vllm_preemptions") for e in (c, f)]
        rows.append([f"`{s['name']}`", seconds(c["rollout_to_train_end_s"]), seconds(f["rollout_to_train_end_s"]),
                     change(100.0 * (1.0 - f["rollout_to_train_end_s"] / c["rollout_to_train_end_s"])),
                     f"{c['first_unit_ready_s']:.2f} / {f['first_unit_ready_s']:.2f} s",
                     f"{c['rollout_end_s']:.2f} / {f['rollout_end_s']:.2f} s",
                     BASELINE if None in pre else f"{pre[0]:.0f} / {pre[1]:.0f}"])
    return _table(["setting", "cgp", "cgp + fgd", "fgd vs cgp", "first unit ready: cgp / fgd",
                   "rollout end: cgp / fgd", "preemptions per step: cgp / fgd"], rows)


from verl_pipe_lab.bench.peer.split import aa_table, split_table  # noqa: E402 -- docs/peer.md's gain split (bench/peer/split.py)
from verl_pipe_lab.bench.peer.tuning import table as tuning_table  # noqa: E402 -- docs/peer.md's tuning sweep

KINDS = {"gain_split": split_table, "gain_split_aa": aa_table, "peer_tuning": tuning_table, "fgd_vs_cgp": fgd_vs_cgp,
         "balanced": balanced, "paper": paper, "paper_vs_peer": paper_vs_peer, "trainer_costs": trainer_costs,
         "trainer_gap": trainer_gap, "trainer_spans": trainer_spans}


# ------------------------------------------------------------------------------------------------- markdown


def blocks(text: str) -> list[dict]:
    """Each marked table: {"line": 1-based line of the marker, "path", "kind", "start", "end" (0-based indices of
    the table's first line and of the end marker), "lines"}."""
    lines = text.split("\n")
    out = []
    i = 0
    while i < len(lines):
        m = MARKER.match(lines[i])
        if m:
            end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == END), None)
            if end is None:
                raise ValueError(f"line {i + 1}: table marker without {END}")
            out.append({"line": i + 1, "path": m["path"], "kind": m["kind"], "start": i + 1, "end": end,
                        "lines": lines[i + 1:end]})
            i = end
        i += 1
    return out


def render(path: str, kind: str, root: Path = ROOT) -> list[str]:
    if kind not in KINDS:
        raise ValueError(f"unknown table kind {kind!r} (known: {sorted(KINDS)})")
    with open(root / path) as f:
        return KINDS[kind](json.load(f))


def check_text(text: str, name: str, root: Path = ROOT) -> list[str]:
    """Every way the marked tables of one markdown text differ from their JSONs, one message per problem."""
    problems = []
    try:
        found = blocks(text)
    except ValueError as e:
        return [f"{name}: {e}"]
    for b in found:
        where = f"{name}:{b['line']} ({b['path']}:{b['kind']})"
        try:
            want = render(b["path"], b["kind"], root)
        except (OSError, ValueError, KeyError, TypeError) as e:
            problems.append(f"{where}: cannot render: {type(e).__name__}: {e}")
            continue
        have = [ln.rstrip() for ln in b["lines"]]
        if have != want:
            diff = [f"    have: {h}\n    want: {w}" for h, w in zip(have, want) if h != w]
            if len(have) != len(want):
                diff.append(f"    {len(have)} lines in the markdown, {len(want)} rendered")
            problems.append(f"{where}: differs from its JSON\n" + "\n".join(diff))
    return problems


def rewrite_text(text: str, root: Path = ROOT) -> str:
    lines = text.split("\n")
    for b in reversed(blocks(text)):  # from the bottom, so earlier indices stay valid
        lines[b["start"]:b["end"]] = render(b["path"], b["kind"], root)
    return "\n".join(lines)


def markdown_files(root: Path = ROOT, patterns=DEFAULT_FILES) -> list[Path]:
    return sorted({p for pat in patterns for p in root.glob(pat)})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m verl_pipe_lab.bench.readme_tables", description=__doc__.split("\n\n")[0])
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--check", action="store_true", help="list marked tables that differ from their JSON; exit 1 if any")
    what.add_argument("--write", action="store_true", help="rewrite the marked tables from their JSONs")
    ap.add_argument("files", nargs="*", help=f"markdown files (default: {' '.join(DEFAULT_FILES)} under the repo)")
    args = ap.parse_args(argv)
    files = [Path(f) for f in args.files] or markdown_files()
    problems, tables = [], 0
    for f in files:
        text = f.read_text()
        tables += len(blocks(text))
        if args.write:
            new = rewrite_text(text)
            if new != text:
                f.write_text(new)
                print(f"rewrote {f}")
        else:
            problems += check_text(text, str(f))
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 1
    print(f"{tables} marked tables in {len(files)} files" + (" match their JSONs" if args.check else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
