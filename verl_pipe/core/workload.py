"""Response lengths of one RL step: who finishes when is what the whole pipeline question hinges on.

Lengths are log-normal with a per-group latent (docs/sim_sources.md §7, "Length sampler"):

    log L_ij = mu + sigma * (sqrt(rho) * Z_i + sqrt(1 - rho) * E_ij),   then min(L_ij, cap)

rho is the within-group correlation of log-lengths; it is what makes some *groups* (not just some
responses) long, which is what CGP and FGD exploit. An equal-length workload has no tail at all and is
the control where pipelining can only add overhead.

Repeated prompts (``prompts`` in a spec, ``repeated_lognormal``): a pool of prompts seen once per epoch, in a fresh
order each epoch. A prompt's latent Z carries over from one epoch to the next with correlation ``cross_epoch``
(Z_e = x Z_{e-1} + sqrt(1 - x^2) W_e, each Z_e standard normal), so the prompt's earlier epochs predict its lengths
without making them known: the within-step formula and its ``rho`` are unchanged. The default x = 0.6
(``CROSS_EPOCH``) is a stated assumption, not a measurement (docs/fgd.md). Without ``prompts`` every step's prompts
are new (nothing repeats: a length predictor has only the group's own finished responses).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Workload:
    num_groups: int
    n: int
    lengths: list[list[int]]  # lengths[group][index], response tokens
    prompt_len: int
    name: str = ""
    prompt_keys: tuple | None = None  # per group, the prompt it is (repeated prompts); None: every prompt new
    epoch: int | None = None  # the epoch of the prompts' pool this step is in (repeated prompts)

    def __post_init__(self):
        if len(self.lengths) != self.num_groups or any(len(g) != self.n for g in self.lengths):
            raise ValueError("lengths must be num_groups lists of n ints")
        if any(x < 1 for g in self.lengths for x in g):
            raise ValueError("every response needs at least one token")
        if self.prompt_keys is not None and len(self.prompt_keys) != self.num_groups:
            raise ValueError("prompt_keys must name one prompt per group")

    def seq_lens(self, group: int) -> list[int]:
        return [self.prompt_len + x for x in self.lengths[group]]

    @property
    def response_tokens(self) -> int:
        return sum(sum(g) for g in self.lengths)

    def truncated_fraction(self, cap: int) -> float:
        return sum(x >= cap for g in self.lengths for x in g) / (self.num_groups * self.n)


def lognormal(num_groups: int, n: int, *, sigma: float, rho: float, cap: int, prompt_len: int,
              seed: int, mean: float | None = None, median: float | None = None, name: str = "") -> Workload:
    """Correlated log-normal lengths; give the body's `mean` or `median` (before the cap), not both.

    The mean is that of the uncapped log-normal, as the sources quote it (docs/sim_sources.md §1c, §7).
    """
    if (mean is None) == (median is None):
        raise ValueError("give exactly one of mean, median")
    if not 0.0 <= rho <= 1.0:
        raise ValueError("rho must be in [0, 1]")
    mu = math.log(median) if median is not None else math.log(mean) - sigma ** 2 / 2
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((num_groups, 1))  # the group latent: shared by all n responses of a prompt
    e = rng.standard_normal((num_groups, n))
    logl = mu + sigma * (math.sqrt(rho) * z + math.sqrt(1.0 - rho) * e)
    lengths = np.clip(np.rint(np.exp(logl)), 1, cap).astype(int)
    return Workload(num_groups, n, lengths.tolist(), prompt_len, name)


CROSS_EPOCH = 0.6  # the default cross-epoch correlation of a repeated prompt's latent (an assumption: docs/fgd.md)


def repeated_lognormal(num_groups: int, n: int, *, prompts: int, step: int, sigma: float, rho: float, cap: int,
                       prompt_len: int, seed: int, cross_epoch: float = CROSS_EPOCH, mean: float | None = None,
                       median: float | None = None, name: str = "") -> Workload:
    """Step ``step`` of a run over a pool of ``prompts`` prompts (a multiple of ``num_groups``), each seen once per
    epoch (``prompts // num_groups`` steps), in a seeded fresh order every epoch. Group g of the step is prompt
    ``prompt_keys[g]``; its latent is that prompt's in this epoch (an AR(1) chain over epochs with correlation
    ``cross_epoch``, seeded by ``seed`` and the prompt alone, so every step of a run sees the same chains), its
    within-group noise fresh (seeded by ``seed`` and ``step``). With ``cross_epoch`` 0 the epochs are independent."""
    if (mean is None) == (median is None):
        raise ValueError("give exactly one of mean, median")
    if not 0.0 <= rho <= 1.0:
        raise ValueError("rho must be in [0, 1]")
    if not 0.0 <= cross_epoch <= 1.0:
        raise ValueError("cross_epoch must be in [0, 1]")
    if prompts < num_groups or prompts % num_groups:
        raise ValueError(f"prompts ({prompts}) must be a multiple of the step's groups ({num_groups})")
    if step < 0:
        raise ValueError("step must be >= 0")
    per_epoch = prompts // num_groups
    epoch, part = divmod(step, per_epoch)
    order = np.random.default_rng([seed, 1, epoch]).permutation(prompts)
    keys = [int(p) for p in order[part * num_groups:(part + 1) * num_groups]]
    # each prompt's chain: Z_0 standard normal, then the innovations of epochs 1..epoch
    draws = np.random.default_rng([seed, 2]).standard_normal((epoch + 1, prompts))
    z = draws[0].copy()
    for e in range(1, epoch + 1):
        z = cross_epoch * z + math.sqrt(1.0 - cross_epoch ** 2) * draws[e]
    mu = math.log(median) if median is not None else math.log(mean) - sigma ** 2 / 2
    e = np.random.default_rng([seed, 3, step]).standard_normal((num_groups, n))
    latent = z[keys][:, None]
    logl = mu + sigma * (math.sqrt(rho) * latent + math.sqrt(1.0 - rho) * e)
    lengths = np.clip(np.rint(np.exp(logl)), 1, cap).astype(int)
    return Workload(num_groups, n, lengths.tolist(), prompt_len, name, prompt_keys=tuple(keys), epoch=epoch)


def equal_lengths(num_groups: int, n: int, length: int, prompt_len: int, name: str = "equal") -> Workload:
    """Every response the same length: no tail, the control setting ("notail-")."""
    return Workload(num_groups, n, [[int(length)] * n for _ in range(num_groups)], prompt_len, name)


def from_spec(spec: dict, num_groups: int, n: int, prompt_len: int, seed: int, step: int = 0) -> Workload:
    """Build a workload from a config dict: {kind: lognormal|equal, mean|median, sigma, rho, cap, length}; with
    ``prompts`` (a pool of repeated prompts) and ``cross_epoch`` (default ``CROSS_EPOCH``), step ``step`` of a run over
    that pool (``repeated_lognormal``, ``seed`` fixed over the run); without, ``seed`` draws the step (new prompts)."""
    kind = spec.get("kind", "lognormal")
    name = spec.get("name", kind)
    if kind == "equal":
        return equal_lengths(num_groups, n, int(spec["length"]), prompt_len, name)
    if kind == "lognormal" and spec.get("prompts") is not None:
        return repeated_lognormal(num_groups, n, prompts=int(spec["prompts"]), step=step, sigma=float(spec["sigma"]),
                                  rho=float(spec["rho"]), cap=int(spec["cap"]), prompt_len=prompt_len, seed=seed,
                                  cross_epoch=float(spec.get("cross_epoch", CROSS_EPOCH)), mean=spec.get("mean"),
                                  median=spec.get("median"), name=name)
    if kind == "lognormal":
        return lognormal(num_groups, n, sigma=float(spec["sigma"]), rho=float(spec["rho"]), cap=int(spec["cap"]),
                         prompt_len=prompt_len, seed=seed, mean=spec.get("mean"), median=spec.get("median"),
                         name=name)
    raise ValueError(f"unknown workload kind {kind!r}")


def length_keys(workload: Workload) -> tuple | None:
    """(prompt, epoch) per group of a workload over repeated prompts (what a length predictor keys its history by);
    None when every prompt is new."""
    if workload.prompt_keys is None:
        return None
    return tuple((k, workload.epoch) for k in workload.prompt_keys)


def exact_lengths(workload: Workload):
    """Per-request sampling overrides that make response (group, index) exactly ``workload.lengths[group][index]``
    tokens long (EOS ignored), the same in every mode: for vLLM's ``max_tokens`` / ``ignore_eos``."""

    def overrides(group: int, index: int) -> dict:
        return {"max_tokens": int(workload.lengths[group][index]), "ignore_eos": True}

    return overrides


# The four length distributions of docs/sim_sources.md §7 (D1..D4); sources are in conf/sim/cluster_grid.yaml.
SETTINGS: dict[str, dict] = {
    "D1": {"name": "base-early", "mean": 1000, "sigma": 0.8, "rho": 0.72, "cap": 8192},
    "D2": {"name": "distill-8k", "mean": 3500, "sigma": 0.64, "rho": 0.72, "cap": 8192},
    "D3": {"name": "long-cot-24k", "median": 6701, "sigma": 0.742, "rho": 0.54, "cap": 24576},
    "D4": {"name": "cap-bound-8k", "median": 6701, "sigma": 0.742, "rho": 0.54, "cap": 8192},
}


def named(setting: str, num_groups: int = 128, n: int = 16, prompt_len: int = 300, seed: int = 0) -> Workload:
    """A named seeded setting: D1..D4, or "equal:<length>"."""
    if setting.startswith("equal:"):
        return equal_lengths(num_groups, n, int(setting.split(":", 1)[1]), prompt_len)
    spec = dict(SETTINGS[setting], kind="lognormal")
    return from_spec(spec, num_groups, n, prompt_len, seed)
