"""python -m verl_pipe.sim --grid conf/sim/cluster_grid.yaml [--placement pageable|pinned|device] [--out FILE.json]"""

from __future__ import annotations

import argparse
import json

from verl_pipe.sim.grid import compare_placements, format_placements, format_setting, run_grid
from verl_pipe.sim.trainer import PLACEMENTS


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m verl_pipe.sim", description=__doc__)
    ap.add_argument("--grid", required=True, help="grid YAML, e.g. conf/sim/cluster_grid.yaml")
    ap.add_argument("--placement", choices=PLACEMENTS,
                    help="where CGP keeps theta_k and the rollback snapshot (default: the grid's theta_k.placement)")
    ap.add_argument("--compare-placements", action="store_true",
                    help="reductions vs sync per theta_k placement (pageable, pinned, device), no sweeps")
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args(argv)
    if args.compare_placements:
        results = compare_placements(args.grid, PLACEMENTS)
        print(format_placements(results))
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"grid": args.grid, "placements": PLACEMENTS, "settings": results}, f, indent=1)
        return
    results = run_grid(args.grid, args.placement)
    for r in results:
        print(format_setting(r), end="\n\n")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"grid": args.grid, "placement": args.placement, "settings": results}, f, indent=1)


if __name__ == "__main__":
    main()
