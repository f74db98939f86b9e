"""Can a replica's placement groups be placed on the cluster's live nodes right now? A pure decision.

A restarted rollout replica asks Ray for placement groups (one per node of the replica, each a list of bundles such
as ``{"CPU": 2, "GPU": 1, "verl_pipe_rollout": 0.0001}``). Ray keeps a group that fits nowhere pending for good, and
the restart would wait on it. ``unplaceable`` answers from each live node's free resources (what Ray's GCS reports)
whether the groups fit, and if not, why, in one line. It packs greedily (the groups largest first, a PACK group's
bundles first-fit over the nodes, a STRICT_PACK group on one node), so a "fits" can be wrong where only a cleverer
packing would not fit (then the caller's bounded wait for the groups decides); a "does not fit" is right for the
free resources it was given.
"""

from __future__ import annotations

EPS = 1e-6  # Ray counts resources in units of 1e-4; a role resource's bundle asks 1e-4 of it


def _fits(need: dict[str, float], free: dict[str, float]) -> bool:
    return all(free.get(k, 0.0) + EPS >= v for k, v in need.items() if v > 0)


def _take(need: dict[str, float], free: dict[str, float]) -> None:
    for k, v in need.items():
        free[k] = free.get(k, 0.0) - v


def _total(bundles: list[dict[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for b in bundles:
        for k, v in b.items():
            out[k] = out.get(k, 0.0) + v
    return out


def _place_group(bundles: list[dict[str, float]], free: dict[str, dict[str, float]], strategy: str) -> bool:
    """Places one group on ``free`` (updated in place when it fits); whether it fits."""
    if strategy == "STRICT_PACK":
        need = _total(bundles)
        node = next((n for n, res in free.items() if _fits(need, res)), None)
        if node is None:
            return False
        _take(need, free[node])
        return True
    trial = {n: dict(res) for n, res in free.items()}
    for bundle in bundles:
        node = next((n for n, res in trial.items() if _fits(bundle, res)), None)
        if node is None:
            return False
        _take(bundle, trial[node])
    free.update(trial)
    return True


def _why(bundle: dict[str, float], free: dict[str, dict[str, float]]) -> str:
    asked = ", ".join(f"{k} {v:g}" for k, v in sorted(bundle.items()))
    if not free:
        return f"no live node for a bundle of {asked}"
    per_node = "; ".join(f"{n[:8]}: " + ", ".join(f"{k} {res.get(k, 0.0):g}" for k in sorted(bundle))
                         for n, res in sorted(free.items()))
    return f"no live node has a bundle of {asked} free (free per node: {per_node})"


def unplaceable(groups: list[list[dict[str, float]]], free: dict[str, dict[str, float]],
                strategy: str = "PACK") -> str | None:
    """None when ``groups`` (placement groups, each a list of bundles) fit on ``free`` ({live node id: free
    resources}); otherwise why not, naming the resources asked and those free on each node."""
    if strategy not in ("PACK", "STRICT_PACK"):
        raise ValueError(f"placement strategy must be PACK or STRICT_PACK, got {strategy!r}")
    left = {n: dict(res) for n, res in free.items()}
    for bundles in sorted(groups, key=len, reverse=True):
        if not _place_group(bundles, left, strategy):
            if strategy == "STRICT_PACK":
                return _why(_total(bundles), free)
            return _why(next((b for b in bundles if not any(_fits(b, res) for res in left.values())), bundles[0]),
                        free)
    return None
