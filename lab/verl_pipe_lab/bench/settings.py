"""A bench YAML (lab/verl_pipe_lab/bench/conf/*.yaml, package data of the lab): loading and checking it, the live
stack each setting runs on and that stack's Hydra overrides, and a setting's workload.

Shared by the bench's runner (``run``), verl's peer (``peer``), the window sweep (``sim_windows``) and the planner's
validation (verl_pipe/plan/validate.py); it imports none of them, so none of them imports another for these.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from verl_pipe_lab.bench.report import MODES
from verl_pipe.core.variants import BASE
from verl_pipe_lab.bench.variants import PEER_MODE_NAMES

CONF_DIR = Path(__file__).resolve().parent / "conf"  # the bench YAMLs, beside this module (checkout or installed)


def load_config(path: str | Path) -> dict:
    with open(path) as f:
        cfg = yaml.safe_load(f)
    stacks = cfg.get("stacks") or {}
    for name, st in stacks.items():
        unknown = set(st) - {"model_size", "overrides"}
        if unknown:
            raise ValueError(f"{path}: stacks.{name}: unknown keys {sorted(unknown)} (allowed: model_size, overrides)")
    for s in cfg["settings"]:
        if not s["name"].startswith(("longtail-", "notail-")):
            raise ValueError(f"setting {s['name']!r}: names start with longtail- or notail-")
        if s.get("stack") is not None and s["stack"] not in stacks:
            raise ValueError(f"setting {s['name']!r}: stack {s['stack']!r} is not under stacks: {sorted(stacks)}")
        modes = s.get("modes") or cfg.get("modes") or list(MODES)
        bad = set(modes) - set(MODES)
        if bad:
            raise ValueError(f"setting {s['name']!r}: unknown modes {sorted(bad)} (known: {list(MODES)})")
        if BASE not in modes:  # refused before any run: the analysis reports every mode against it
            raise ValueError(f"setting {s['name']!r}: modes {list(modes)} lack {BASE!r}; every figure of a setting is "
                             f"relative to its {BASE} runs (list {BASE} among the setting's or the config's modes)")
        # The peer's configurations: the lab's variant columns' (bench/variants.py; bench/peer/configs.py CONFIGS has
        # the same keys).
        bad = set(s.get("peers") or []) - set(PEER_MODE_NAMES)
        if bad:
            raise ValueError(f"setting {s['name']!r}: unknown peers {sorted(bad)} (known: {sorted(PEER_MODE_NAMES)})")
    return cfg


def stack_of(setting: dict, cfg: dict) -> str:
    """The live stack a setting runs on: a named entry of the config's ``stacks`` (its own model size and overrides,
    e.g. the many-groups regime), or else its model size on the config's shared overrides. Steps, shapes and the
    simulator's calibration are kept per stack (the ``model_size`` field of a step names it)."""
    return setting.get("stack") or setting.get("model_size", cfg.get("model_size", "bench"))


def stack_overrides(cfg: dict, stack: str) -> list[str]:
    """The Hydra overrides of a live stack (``stack_of``): the config's shared overrides, the named stack's own, and
    its model size. Our modes and verl's peer (lab/verl_pipe_lab/bench/peer) both start their stacks from these."""
    spec = (cfg.get("stacks") or {}).get(stack)
    size = spec.get("model_size", cfg.get("model_size", "bench")) if spec else stack
    extra = list(spec.get("overrides", [])) if spec else []
    # Lengths are forced per request (rolloutpipe.workload): the speed comparison needs no warm-start of the model.
    return list(cfg.get("overrides", [])) + extra + [f"rolloutpipe.tiny_assets.size={size}",
                                                      "rolloutpipe.tiny_assets.warm_start.steps=0"]


def workload_for(spec: dict, num_groups: int, n: int, seed: int, round_: int | None = None):
    """A setting's workload; ``round_``: the bench's round, which draws new lengths (``seed + round_``) or, over repeated
    prompts (the spec's ``prompts``), is the run's step (epoch) of the pool seeded by ``seed``."""
    from verl_pipe.core.workload import from_spec

    if round_ is None:
        return from_spec(dict(spec), num_groups, n, prompt_len=0, seed=seed)
    if spec.get("prompts") is not None:
        return from_spec(dict(spec), num_groups, n, prompt_len=0, seed=seed, step=round_)
    return from_spec(dict(spec), num_groups, n, prompt_len=0, seed=seed + round_)
