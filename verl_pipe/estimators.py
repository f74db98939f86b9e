"""Which advantage estimators RolloutPipe can train, and how: declared by registration, beside verl's.

verl registers estimators by name (``verl.trainer.ppo.core_algos.register_adv_est`` and
``get_adv_estimator_fn``, the seam this module sits next to); verl_pipe additionally needs to know whether an
estimator's advantages of a group are final when that group completes. Pure Python (no verl import), so the
config check runs before Ray and verl start.

``how`` an estimator streams:

- ``GROUP`` ("group"): a response's advantage depends only on its own group: final when the group completes;
  CGP streams it at either granularity.
- ``AFFINE_BATCH`` ("affine_batch"): per group, then an affine map per token with batch statistics
  (reinforce_plus_plus_baseline's whitening): CGP trains it exactly at group granularity, unit 0's early groups
  into gradient buffers (verl_pipe/trainer/whitening.py); sync mode recomputes it over the batch.
- ``BATCH`` ("batch"): per group, then normalized over the whole batch in another way: sync mode only (it
  recomputes the advantages over the complete batch, as verl does).

A custom group-based estimator registers with both::

    from verl.trainer.ppo import core_algos
    from verl_pipe.estimators import register_streaming

    @register_streaming("my_estimator", how="group")
    @core_algos.register_adv_est("my_estimator")
    def compute_my_advantage(token_level_rewards, response_mask, index, **kwargs): ...

The registration must run in the launcher (config check) and in the trainer's process: put it in the module of
``rolloutpipe.trainer_class`` or a module it imports; the config check imports that module when the estimator
is not registered yet (recipes/extension_example/estimator.py is the worked example).
"""

from __future__ import annotations

from collections.abc import Callable

GROUP, AFFINE_BATCH, BATCH = "group", "affine_batch", "batch"
HOWS = (GROUP, AFFINE_BATCH, BATCH)

_REGISTRY: dict[str, str] = {}


def register_streaming(name: str, how: str = GROUP) -> Callable:
    """Declares how estimator ``name`` streams (``how`` in HOWS). Registers at once; also usable as a decorator
    (returns the function unchanged). Re-registering a name with another ``how`` is refused."""
    if how not in HOWS:
        raise ValueError(f"register_streaming({name!r}): how must be one of {', '.join(HOWS)}, got {how!r}")
    if _REGISTRY.get(name, how) != how:
        raise ValueError(f"register_streaming({name!r}): already registered as {_REGISTRY[name]!r}, not {how!r}")
    _REGISTRY[name] = how

    def keep(fn):
        return fn

    return keep


def streaming(name: str) -> str | None:
    """How estimator ``name`` streams, or None if it is not registered."""
    return _REGISTRY.get(name)


def registered(how: str | None = None) -> tuple[str, ...]:
    """The registered names (of one ``how``), in registration order."""
    return tuple(n for n, h in _REGISTRY.items() if how is None or h == how)


def cgp_problem(name: str, granularity: str) -> str | None:
    """Why CGP at ``granularity`` cannot train estimator ``name`` exactly (None: it can). ``name`` is registered."""
    how = _REGISTRY[name]
    if how == GROUP or (how == AFFINE_BATCH and granularity == "group"):
        return None
    if how == AFFINE_BATCH:
        return (f"{name!r} whitens across the whole batch; CGP trains it exactly only at group granularity "
                "(verl_pipe/trainer/whitening.py): set rolloutpipe.cgp.granularity=group (or rolloutpipe.mode=sync)")
    return (f"{name!r} normalizes across the whole batch, so a group's advantages are not final when it "
            f"completes; CGP supports: {', '.join(registered(GROUP))}, and "
            f"{', '.join(registered(AFFINE_BATCH))} at rolloutpipe.cgp.granularity=group (use "
            "rolloutpipe.mode=sync for the others)")


# verl 0.9.1's group-based estimators (verl/trainer/ppo/core_algos.py).
for _name in ("grpo", "grpo_vectorized", "rloo", "rloo_vectorized", "grpo_passk", "opo"):
    register_streaming(_name, GROUP)
register_streaming("reinforce_plus_plus_baseline", AFFINE_BATCH)  # masked_whiten over the batch
for _name in ("gpg", "optimal_token_baseline", "tir_optimal_token_baseline"):  # the batch's non-zero share, ...
    register_streaming(_name, BATCH)
