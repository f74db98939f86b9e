"""The learning comparison's charts: held-out accuracy against step and training wall-clock, mean ± one standard
error over seeds (main seeds), from a merged comparison (``python -m verl_pipe_lab.bench --learn``'s JSON).

``write_charts`` draws one comparison (the bench calls it with ``--charts``). The README's chart puts several
comparisons side by side, one panel each, so that runs from different hosts or designs never share an axis:

    python -m verl_pipe_lab.bench.learn_charts docs/bench/learn_chain_v3_2026-12-07.json \\
        docs/bench/learn_chain_v2_7b_2026-12-06.json --out docs/img/learn_readme/learning_acc_vs_wall.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from verl_pipe_lab.bench.charts import _plt
from verl_pipe_lab.bench.peer.learn import LEARN_MODE as PEER_MODE
from verl_pipe.core.variants import BASE, FGD_VARIANT

# The README's one chart: accuracy against training wall-clock, sync vs CGP+FGD vs verl's peer.
HEADLINE_MODES = (BASE, FGD_VARIANT, PEER_MODE)
LABELS = {BASE: "sync", FGD_VARIANT: "CGP+FGD", PEER_MODE: "verl separate_async (tuned)"}
COLORS = {BASE: "C0", FGD_VARIANT: "C1", PEER_MODE: "C2"}  # a mode keeps its colour across panels


def draw_curve(ax, summary: dict, mode: str, x: str, label: str | None = None) -> None:
    """One mode's mean validation curve against ``x`` ("step" or "wall_s"), its ± 1 se band shaded."""
    c = summary[mode]["curve"]
    xs = [p[x] for p in c]
    m = [p["val_acc"] for p in c]
    se = [p["se"] for p in c]
    ax.plot(xs, m, marker="o", markersize=3, color=COLORS.get(mode),
            label=f"{label or mode} (n={len(summary[mode]['seeds'])})")
    ax.fill_between(xs, [a - b for a, b in zip(m, se)], [a + b for a, b in zip(m, se)], alpha=0.2,
                    color=COLORS.get(mode))


def _acc_vs_wall(ax, result: dict, labels: dict | None = None) -> None:
    summary = result["comparison"]["summary"]
    target = result["comparison"]["target_val_acc"]
    for mode in (m for m in HEADLINE_MODES if m in summary):
        draw_curve(ax, summary, mode, "wall_s", (labels or {}).get(mode))
    base = result["comparison"].get("base", BASE)
    ax.axhline(target, color="grey", ls=":", lw=1, label=f"target {target:.3f} ({base}'s final - margin)")
    ax.set_xlabel("training wall-clock (s, validation excluded)")
    ax.set_ylabel("held-out accuracy (greedy)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")


def write_charts(result: dict, out_dir: Path) -> list[Path]:
    """Validation accuracy against training wall-clock for sync, CGP+FGD and verl's peer, and against step and
    wall-clock for every mode."""
    plt = _plt()
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = result["comparison"]["summary"]
    target = result["comparison"]["target_val_acc"]
    paths = []

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    _acc_vs_wall(ax, result)
    ax.set_title(f"accuracy vs wall-clock: mean ± 1 se over seeds ({result.get('val_size')} questions)", fontsize=9)
    fig.tight_layout()
    paths.append(out_dir / "learning_acc_vs_wall.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for mode in summary:
        draw_curve(axes[0], summary, mode, "step")
        draw_curve(axes[1], summary, mode, "wall_s")
    for ax, xl in zip(axes, ("GRPO step", "training wall-clock (s)")):
        ax.axhline(target, color="grey", ls=":", lw=1)
        ax.set_xlabel(xl)
        ax.set_ylabel("held-out accuracy (greedy)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("validation accuracy: mean ± 1 se over seeds")
    fig.tight_layout()
    paths.append(out_dir / "learning_val_acc.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths


def panel_title(path: Path, result: dict) -> str:
    """What a panel shows, from its JSON: the file, the seeds a mode, the arms' order and the validation size."""
    summary = result["comparison"]["summary"]
    seeds = sorted({len(v["seeds"]) for v in summary.values()})
    return (f"{path.stem}\n{'/'.join(map(str, seeds))} seeds a mode, {result.get('design', 'cyclic')} order, "
            f"{result.get('val_size')} questions, {result.get('steps')} steps")


def readme_chart(paths: list[Path], out: Path) -> Path:
    """One panel per comparison, side by side, each on its own wall-clock axis (the y axis shared)."""
    plt = _plt()
    results = [json.loads(Path(p).read_text()) for p in paths]
    for p, r in zip(paths, results):
        if "summary" not in r.get("comparison", {}):
            raise ValueError(f"{p}: no comparison to draw (a part? merge the parts with --learn --merge first)")
    fig, axes = plt.subplots(1, len(results), figsize=(5.2 * len(results), 4.2), sharey=True, squeeze=False)
    for ax, p, r in zip(axes[0], paths, results):
        _acc_vs_wall(ax, r, LABELS)
        ax.set_title(panel_title(Path(p), r), fontsize=8)
    for ax in axes[0][1:]:
        ax.set_ylabel("")
    fig.suptitle("held-out accuracy vs training wall-clock, mean ± 1 se over seeds (each panel its own runs)",
                 fontsize=9)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("comparisons", nargs="+", type=Path, help="merged learning comparisons, one panel each")
    ap.add_argument("--out", type=Path, required=True, help="the PNG to write")
    args = ap.parse_args(argv)
    try:
        print(readme_chart(args.comparisons, args.out))
    except (OSError, ValueError, KeyError) as e:
        raise SystemExit(f"learn_charts: {e}") from None


if __name__ == "__main__":
    main()
