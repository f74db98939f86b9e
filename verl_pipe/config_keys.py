"""Unknown keys anywhere in a run's composed config, refused at launch with a did-you-mean.

Hydra lets a user's recipe (``--config-dir``) and ``+key=value`` overrides add keys freely: a misspelt key was silently
ignored (``data: {train_batchsize: 4}`` trained with verl's default batch size and exited 0), or, in one of verl's
dataclass sections, ended in a Hydra instantiation traceback far from the launch. The keys allowed are verl 0.9.1's
own, not a hand list:

- the keys of verl's ``ppo_trainer`` config as verl composes it (its YAML: ``verl.trainer.config``), and
- in a section verl instantiates as a dataclass (a ``_target_`` there), every field of that dataclass, recursively
  into fields whose type is a dataclass;
- a mapping verl leaves open (an empty mapping or null in its YAML, or a dataclass field typed as a dict or Any: model
  overrides, engine kwargs, reward kwargs) takes any key, except where verl hands it to a callable as keyword arguments:
  ``ray_kwargs.ray_init`` goes to ``ray.init``, whose parameters are the keys allowed (``CALLEE_KWARGS``);
- ``rolloutpipe:`` has its own table (verl_pipe/config.py ROLLOUTPIPE); the top-level ``rollout:`` of verl's separated
  trainers holds the rollout pool's size, aliases of ours (``POOL_ALIASES``), and nothing else.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
import typing
from typing import Any

from omegaconf import DictConfig, OmegaConf

# Our own section (its table is verl_pipe/config.py's).
LAUNCHER_KEYS = ("rolloutpipe",)
# verl's separated trainers (one_step_off_policy, fully_async_policy) size the rollout pool with a top-level
# ``rollout:`` node and copy it into actor_rollout_ref.rollout (verl 0.9.1: one_step_off_policy/main_ppo.py,
# fully_async_main.py). Here those keys are aliases of ours (``POOL_ALIASES``: the launcher copies a set one over,
# verl_pipe/launch/prepare.py) and the launcher writes the pool's size back to ``rollout`` (verl's
# create_resource_pool_manager reads it there); their other keys there are refused naming ours (``POOL_REFUSED``).
POOL_ALIASES = {"nnodes": "actor_rollout_ref.rollout.nnodes",
                "n_gpus_per_node": "actor_rollout_ref.rollout.n_gpus_per_node"}
POOL_REFUSED = {
    "n": "verl's fully-async key; the responses per prompt are actor_rollout_ref.rollout.n here",
    "total_rollout_steps": "verl's fully-async key; the run's length is trainer.total_training_steps here "
                           "(trainer.total_epochs bounds it)",
}
# Keys verl 0.9.1's code reads that its YAML does not declare: (path, verl function that reads it). A test checks
# that each function's source reads the key, so the list cannot outlive verl's code.
READ_BY_VERL = {
    "reward.custom_reward_function.reward_kwargs": "verl.trainer.ppo.reward.get_custom_reward_fn",
    "custom_reward_function.reward_kwargs": "verl.trainer.ppo.reward.get_custom_reward_fn",
}
# Open mappings verl passes on as keyword arguments: the keys are the callee's parameters (verl 0.9.1's
# main_ppo / our main_grpo: ray.init(**ray_kwargs.ray_init)).
CALLEE_KWARGS = {"ray_kwargs.ray_init": "ray.init"}


class UnknownKeyError(ValueError):
    pass


def pool_alias_problems(config: DictConfig) -> list[tuple[str, str]]:
    """(path, message) for each key under the top-level ``rollout:`` that is not one of verl's pool-size aliases
    (``POOL_ALIASES``) set to null or an integer >= 1."""
    node = config.get("rollout")
    if node is None:
        return []
    if not isinstance(node, DictConfig):
        return [("rollout", f"got {node!r}; allowed: a mapping with keys {', '.join(POOL_ALIASES)} (verl's separated "
                            "trainers' rollout pool size, aliases of " + ", ".join(POOL_ALIASES.values()) + ")")]
    problems = []
    for key in node.keys():
        key, path = str(key), f"rollout.{key}"
        if key in POOL_ALIASES:
            value = node.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                problems.append((path, f"got {value!r}; allowed: null or an integer >= 1 (an alias of "
                                       f"{POOL_ALIASES[key]})"))
        elif key in POOL_REFUSED:
            if node.get(key) is not None:
                problems.append((path, f"not supported: {POOL_REFUSED[key]}"))
        else:
            problems.append((path, f"unknown key{_suggest(key, set(POOL_ALIASES), 'rollout')}; the top-level rollout "
                                   "holds verl's separated-trainer pool size only: "
                                   + ", ".join(f"rollout.{k} (= {v})" for k, v in POOL_ALIASES.items())))
    return problems


def apply_pool_aliases(config: DictConfig) -> list[str]:
    """Copies each pool-size alias set under the top-level ``rollout:`` to the key it stands for (verl's separated
    trainers do the same: the top-level value wins), then writes the pool's size back there for verl's
    create_resource_pool_manager. Returns a note per value an alias changed. Refuses a bad key or value first
    (``pool_alias_problems``). ``config`` must be open (open_dict)."""
    problems = pool_alias_problems(config)
    if problems:
        raise UnknownKeyError(f"{problems[0][0]}: {problems[0][1]}")
    node = config.get("rollout")
    notes = []
    for key, target in POOL_ALIASES.items():
        value = node.get(key) if node is not None else None
        if value is None:
            continue
        current = OmegaConf.select(config, target)
        if current != value:
            notes.append(f"rollout.{key}={value} (verl's separated-trainer key) sets {target} (was {current})")
            OmegaConf.update(config, target, value, merge=False)
    config.rollout = {k: OmegaConf.select(config, t) for k, t in POOL_ALIASES.items()}
    return notes


@functools.lru_cache(maxsize=1)
def verl_reference() -> DictConfig:
    """verl 0.9.1's ppo_trainer config as verl composes it (Hydra's compose of ``verl.trainer.config``); inside a
    running Hydra app (the launcher) through its compose API, whose search path holds verl's config dir
    (hydra_plugins/verl_pipe_searchpath); verl's generated full config as a fallback."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    try:
        if GlobalHydra.instance().is_initialized():
            return compose("ppo_trainer")
        with initialize_config_module("verl.trainer.config", version_base=None):
            return compose("ppo_trainer")
    except Exception:  # noqa: BLE001 -- the same keys, flattened by verl
        from importlib.resources import files

        return OmegaConf.load(str(files("verl.trainer.config") / "_generated_ppo_trainer.yaml"))


@functools.lru_cache(maxsize=None)
def _dataclass(target: str | None):
    if not target:
        return None
    try:
        from hydra.utils import get_class

        cls = get_class(target)
    except Exception:  # noqa: BLE001 -- not a class verl_pipe can import here: its YAML keys alone
        return None
    return cls if dataclasses.is_dataclass(cls) else None


@functools.lru_cache(maxsize=None)
def _fields(cls) -> dict[str, Any]:
    """A dataclass's fields and their types (resolved where they can be)."""
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # noqa: BLE001 -- unresolvable annotations: the declared ones
        hints = {}
    return {f.name: hints.get(f.name, f.type) for f in dataclasses.fields(cls)}


def _unwrap(tp):
    """Optional[X] / X | None -> X."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if typing.get_origin(tp) in (typing.Union, getattr(__import__("types"), "UnionType", None)) and len(args) == 1:
        return args[0]
    return tp


def _open_type(tp) -> bool:
    tp = _unwrap(tp)
    return tp is Any or tp is dict or typing.get_origin(tp) in (dict, typing.Dict) or isinstance(tp, str) \
        or (typing.get_origin(tp) is typing.Union)


@dataclasses.dataclass
class _Schema:
    """What a config node may hold: verl's YAML node (``ref``) and the dataclass it instantiates (``cls``)."""
    ref: DictConfig | None
    cls: type | None
    open: bool = False  # any key
    callee: str | None = None  # keys: this callable's parameters

    def keys(self) -> set[str]:
        out = set(self.ref.keys()) if isinstance(self.ref, DictConfig) else set()
        if self.cls is not None:
            out |= set(_fields(self.cls))
        if self.callee is not None:
            out |= _callee_params(self.callee)
        return {str(k) for k in out}

    def child(self, key: str, path: str) -> _Schema:
        if path in CALLEE_KWARGS:
            return _Schema(None, None, callee=CALLEE_KWARGS[path])
        ref = self.ref._get_node(key) if isinstance(self.ref, DictConfig) and key in self.ref.keys() else None
        ftype = _fields(self.cls).get(key) if self.cls is not None else None
        if isinstance(ref, DictConfig):
            if len(ref) == 0 and ftype is None:
                return _Schema(None, None, open=True)  # an empty mapping in verl's YAML
            cls = _dataclass(ref.get("_target_")) if "_target_" in ref.keys() else None
            if cls is None and ftype is not None and dataclasses.is_dataclass(_unwrap(ftype)):
                cls = _unwrap(ftype)
            open_ = ftype is not None and _open_type(ftype) and cls is None
            return _Schema(ref, cls, open=open_)
        if ftype is not None and dataclasses.is_dataclass(_unwrap(ftype)):
            return _Schema(None, _unwrap(ftype))
        return _Schema(None, None, open=True)  # null or a value in verl's YAML, or an open-typed field


@functools.lru_cache(maxsize=None)
def _callee_params(callee: str) -> frozenset[str]:
    import importlib

    module, _, name = callee.rpartition(".")
    fn = getattr(importlib.import_module(module), name)
    return frozenset(p for p in inspect.signature(fn).parameters if p not in ("args", "kwargs"))


def _all_paths(node: DictConfig, prefix: str = "") -> list[str]:
    out = []
    for k in node.keys():
        path = f"{prefix}.{k}" if prefix else str(k)
        out.append(path)
        child = node._get_node(k)
        if isinstance(child, DictConfig):
            out += _all_paths(child, path)
    return out


def _suggest(key: str, allowed: set[str], prefix: str) -> str:
    close = difflib.get_close_matches(key, sorted(allowed), n=1, cutoff=0.6)
    if close:
        return f" (did you mean {prefix + '.' if prefix else ''}{close[0]}?)"
    # the right name at another level, e.g. data.ppo_mini_batch_size for actor_rollout_ref.actor.ppo_mini_batch_size
    paths = _all_paths(verl_reference())
    leaves = {p.rsplit(".", 1)[-1] for p in paths}
    close = difflib.get_close_matches(key, sorted(leaves), n=1, cutoff=0.8)
    if close:
        where = [p for p in paths if p.rsplit(".", 1)[-1] == close[0]][:3]
        return f" (did you mean {' or '.join(where)}?)"
    return ""


def unknown_keys(config: DictConfig) -> list[tuple[str, str]]:
    """(path, message) for every key of ``config`` that verl 0.9.1 does not know (rolloutpipe's are the table's)."""
    problems: list[tuple[str, str]] = []

    def walk(node: DictConfig, schema: _Schema, prefix: str) -> None:
        allowed = schema.keys()
        for key in node.keys():
            key = str(key)
            path = f"{prefix}.{key}" if prefix else key
            if (not prefix and key in LAUNCHER_KEYS) or path in READ_BY_VERL:
                continue
            if not prefix and key == "rollout":  # verl's separated trainers' pool size: aliases of ours
                problems.extend(pool_alias_problems(config))
                continue
            if key not in allowed:
                shown = sorted(k for k in allowed if not k.startswith("_"))
                listing = ", ".join(shown[:40]) + (", ..." if len(shown) > 40 else "")
                problems.append((path, f"unknown key{_suggest(key, allowed, prefix)}; "
                                       f"keys {'under ' + prefix if prefix else 'at the top'}: {listing}"))
                continue
            if schema.callee is not None:
                continue
            child = node._get_node(key)
            if isinstance(child, DictConfig):
                sub = schema.child(key, path)
                if not sub.open:
                    walk(child, sub, path)

    ref = verl_reference()
    walk(config, _Schema(ref, None), "")
    return problems


def check_known_keys(config: DictConfig) -> None:
    """Refuses a config with a key verl 0.9.1 does not know, naming it (the first; the others counted)."""
    problems = unknown_keys(config)
    if problems:
        path, msg = problems[0]
        more = f" ({len(problems) - 1} more: {', '.join(p for p, _ in problems[1:4])})" if len(problems) > 1 else ""
        raise UnknownKeyError(f"{path}: {msg}{more}")
