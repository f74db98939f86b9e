"""The lab's columns of the runtime's variant table (verl_pipe/core/variants.py), keyed by its variant names.

The runtime names the variants and what each means to its trainer, simulator and planner; which of verl's trainer
configurations the bench's peer runs for each of verl's variants (``PEER_CONFIGS``: bench/peer/configs.py
``CONFIGS``) is the lab's alone. tests/test_variants.py keeps the keys equal to the runtime's ``PEERS``.
"""

from __future__ import annotations

from verl_pipe.core.variants import PEERS, variant

# variant name -> the peer's configuration that runs it (bench/peer/configs.py CONFIGS): verl 0.9.1's V1
# separate_async on-policy, at verl's defaults (one batch ahead), tuned for this work (docs/peer.md); verl's
# synchronous trainers on separate pools and colocated
PEER_CONFIGS: dict[str, str] = {
    "verl_separate_async": "onpolicy",
    "verl_separate_async_1off": "default",
    "verl_separate_async_tuned": "tuned",
    "verl_separate_sync": "separate_sync",
    "verl_colocated": "colocated",
}
PEER_MODE_NAMES = {c: name for name, c in PEER_CONFIGS.items()}  # peer configuration -> variant name
# verl's trainer.v1.trainer_mode of its synchronous (colocated) trainer, the peer verl_colocated runs
# (bench/peer/v1_sync.py): verl's own value, not a variant of ours
V1_SYNC_TRAINER_MODE = "sync"


def peer_config(name: str) -> str:
    """The peer's configuration that runs the variant ``name`` (one of verl's trainers: a ``PEERS`` name)."""
    v = variant(name)
    if v.ours or name not in PEER_CONFIGS:
        raise ValueError(f"mode {name!r} is not one of verl's trainers the peer runs; choose from {', '.join(PEERS)}")
    return PEER_CONFIGS[name]
