"""python -m verl_pipe.sim --grid cluster_grid [--placement pageable|pinned|device] [--compare-placements] [--out FILE.json]

``--grid`` is a grid YAML path, or the name of one shipped in conf/sim/ (e.g. ``cluster_grid``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from verl_pipe.conf import ROOT as CONF_ROOT
from verl_pipe.sim.grid import compare_placements, format_placements, format_setting, run_grid
from verl_pipe.sim.trainer import PLACEMENTS

SIM_CONF = CONF_ROOT / "sim"  # conf/sim in a checkout, verl_pipe/conf/sim installed


def grid_path(arg: str) -> Path:
    """A path as given if it exists, else the packaged grid of that name (``cluster_grid`` or ``cluster_grid.yaml``)."""
    path = Path(arg)
    if path.exists():
        return path
    packaged = SIM_CONF / (path.name if path.suffix == ".yaml" else f"{path.name}.yaml")
    if packaged.exists():
        return packaged
    raise SystemExit(f"--grid {arg}: no such file, and no grid of that name in {SIM_CONF} "
                     f"(shipped: {', '.join(sorted(p.stem for p in SIM_CONF.glob('*.yaml')))})")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m verl_pipe.sim", description=__doc__)
    ap.add_argument("--grid", required=True, help="grid YAML path, or a packaged grid name, e.g. cluster_grid")
    ap.add_argument("--placement", choices=PLACEMENTS,
                    help="where CGP keeps theta_k and the rollback snapshot (default: the grid's theta_k.placement)")
    ap.add_argument("--compare-placements", action="store_true",
                    help="reductions vs sync per theta_k placement (pageable, pinned, device), no sweeps")
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args(argv)
    grid = grid_path(args.grid)
    if args.compare_placements:
        results = compare_placements(grid, PLACEMENTS)
        print(format_placements(results))
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"grid": str(grid), "placements": PLACEMENTS, "settings": results}, f, indent=1)
        return
    results = run_grid(grid, args.placement)
    for r in results:
        print(format_setting(r), end="\n\n")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"grid": str(grid), "placement": args.placement, "settings": results}, f, indent=1)


if __name__ == "__main__":
    main()
