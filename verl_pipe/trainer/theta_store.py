"""θ_k store and optimizer rollback snapshot with explicit placement: plain torch only.

No verl, Ray or vLLM import, so ``python -m verl_pipe.doctor --gpu`` (verl_pipe/doctor/theta.py) can check it on an
accelerator machine that has only torch.

``ThetaStore`` keeps a frozen copy of a module's parameters (this rank's shards under FSDP2) at θ_k, the
step's rollout weights, so that later units' old log-probs are computed at θ_k after earlier units'
optimizer steps moved the live weights. Placements (``rolloutpipe.theta_k.store``):

- ``device``: the frozen copy sits on the parameters' own device, refreshed by a device-to-device copy.
  A swap rebinds the parameters' storage to the frozen buffers and back (a pointer swap: no copy at all).
- ``pinned``: host buffers allocated once and reused (pinned when the parameters live on an accelerator),
  filled by non-blocking copies; a swap copies the live weights into a second host buffer, θ_k into the
  live weights, and back afterwards (the copies the old pageable path made, without its allocations).
- ``auto``: ``device`` when the copy fits in the device's free memory with a margin to spare
  (``margin_bytes``, default ``AUTO_MARGIN_FRACTION`` of the device's total memory), else ``pinned``.

On CPU both placements are a preallocated host copy reused every step (no pinned memory there):
``device`` swaps by pointer, ``pinned`` by copy.

``OptimizerSnapshot`` keeps the optimizer's state (Adam's m, v and step, this rank's shards) in persistent
buffers with the same placements, and restores it exactly.

Seams (torch internals this module relies on, checked when a store is built):

- FSDP2 (``torch.distributed.fsdp.fully_shard``): a parameter is a DTensor whose ``_local_tensor`` is a
  view of its ``FSDPParam._sharded_param_data`` (the padded flat shard the all-gather reads). The pointer
  swap rebinds both, as FSDP2's own ``FSDPParam.reset_sharded_param`` does; ``FSDPModule._get_fsdp_state()
  ._fsdp_param_group.fsdp_params`` lists them. A parameter whose layout differs falls back to a copy swap.
- ``FSDPModule.reshard()`` (public) before and after a swap: a forward-only pass can leave a root module's
  parameters unsharded (gathered from the weights of that moment); resharding makes the next forward gather
  the weights now bound.
- plain parameters: ``param.data = tensor`` rebinds storage.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

KEY = "rolloutpipe.theta_k.store"
PLACEMENTS = ("device", "pinned", "auto")
AUTO_MARGIN_FRACTION = 0.25  # auto keeps this share of the device's total memory free (activations, peaks)
GIB = float(1 << 30)

FreeMemoryFn = Callable[[torch.device], "tuple[int, int] | None"]  # device -> (free, total) bytes, or None


class ThetaStoreError(ValueError):
    pass


def check_placement(placement: str, key: str = KEY) -> str:
    if placement not in PLACEMENTS:
        raise ThetaStoreError(f"{key}: got {placement!r}; allowed: one of {', '.join(PLACEMENTS)}")
    return placement


def device_memory(device: torch.device) -> tuple[int, int] | None:
    """(free, total) bytes of an accelerator as its driver reports them; None on CPU."""
    if device.type == "cpu":
        return None
    backend = getattr(torch, device.type, None)
    if backend is None or not hasattr(backend, "mem_get_info"):
        return None
    free, total = backend.mem_get_info(device)
    return int(free), int(total)


def resolve_placement(placement: str, need_bytes: int, device: torch.device, *, margin_bytes: int | None = None,
                      free_memory: FreeMemoryFn = device_memory, key: str = KEY) -> str:
    """``device`` or ``pinned`` for a copy of ``need_bytes`` of tensors living on ``device``.

    ``device`` that does not fit in the free memory is an error naming ``key``; ``auto`` picks ``device``
    only when ``need_bytes + margin`` fits. On CPU (no figure) ``auto`` is ``device``: host memory either way,
    and the pointer swap needs no copy."""
    check_placement(placement, key)
    if placement == "pinned":
        return "pinned"
    mem = free_memory(device)
    if mem is None:
        return "device"
    free, total = mem
    if placement == "device":
        if need_bytes > free:
            raise ThetaStoreError(
                f"{key}: 'device' needs {need_bytes / GIB:.2f} GiB on {device} but only {free / GIB:.2f} GiB are "
                f"free (of {total / GIB:.2f} GiB); use 'pinned' (host buffers) or 'auto'")
        return "device"
    margin = int(AUTO_MARGIN_FRACTION * total) if margin_bytes is None else int(margin_bytes)
    return "device" if need_bytes + margin <= free else "pinned"


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _pin(device: torch.device) -> bool:
    return device.type != "cpu"


def _alloc(like: torch.Tensor, placement: str, key: str) -> torch.Tensor:
    """An uninitialized buffer shaped like ``like``: on its device (``device``) or on the host (``pinned``)."""
    try:
        if placement == "device":
            return torch.empty_like(like, memory_format=torch.contiguous_format)
        return torch.empty(like.shape, dtype=like.dtype, device="cpu", pin_memory=_pin(like.device))
    except torch.OutOfMemoryError as e:
        raise ThetaStoreError(f"{key}: '{placement}' could not allocate {like.numel() * like.element_size() / GIB:.2f}"
                              f" GiB on {like.device if placement == 'device' else 'the host'} ({e}); use 'pinned' "
                              "or 'auto'") from e


def _fsdp_modules(module: torch.nn.Module) -> list:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # torch without FSDP2
        return []
    return [m for m in module.modules() if isinstance(m, FSDPModule)]


def reshard(module: torch.nn.Module) -> None:
    """Every FSDP2 module's parameters back to sharded (drops unsharded copies gathered earlier)."""
    for m in _fsdp_modules(module):
        m.reshard()


def _fsdp_params_by_param(module: torch.nn.Module) -> dict[int, object]:
    out = {}
    for m in _fsdp_modules(module):
        group = getattr(m._get_fsdp_state(), "_fsdp_param_group", None)
        for fp in (group.fsdp_params if group is not None else ()):
            out[id(fp.sharded_param)] = fp
    return out


# ---------------------------------------------------------------- one parameter


@dataclass
class _Slot:
    """One parameter: how to read its live storage and rebind it."""
    name: str
    param: torch.nn.Parameter
    fsdp_param: object | None  # torch FSDPParam when FSDP2 manages the parameter
    frozen: tuple[torch.Tensor, ...] = ()  # θ_k, same structure as live()
    scratch: torch.Tensor | None = None  # copy swap: the live weights while θ_k is in
    held: tuple[torch.Tensor, ...] = ()  # pointer swap: the live tensors while θ_k is bound

    def live(self) -> tuple[torch.Tensor, ...]:
        """The tensors holding the live weights: (flat padded shard, local view) under FSDP2, else (data,)."""
        if self.fsdp_param is not None:
            return self.fsdp_param._sharded_param_data, self.fsdp_param.sharded_param._local_tensor
        if hasattr(self.param, "to_local"):
            return (self.param.to_local(),)
        return (self.param.data,)

    def bind(self, tensors: tuple[torch.Tensor, ...]) -> None:
        if self.fsdp_param is not None:
            self.fsdp_param._sharded_param_data, self.fsdp_param.sharded_param._local_tensor = tensors
        else:
            self.param.data = tensors[0]

    def source(self) -> torch.Tensor:
        """The one tensor a copy reads and writes (includes FSDP2's padding)."""
        return self.live()[0]

    def pointer_swappable(self) -> bool:
        if self.fsdp_param is None:
            return not hasattr(self.param, "to_local")  # a DTensor outside FSDP2: copy swap
        flat, local = self.live()
        return (type(flat) is torch.Tensor and flat.is_contiguous() and flat.dim() == 1
                and (local.numel() == 0 or local.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr())
                and local.storage_offset() >= flat.storage_offset())

    def make_frozen(self, placement: str, key: str) -> tuple[torch.Tensor, ...]:
        flat = _alloc(self.source(), placement, key)
        if self.fsdp_param is None:
            return (flat,)
        live_flat, local = self.live()
        view = flat.as_strided(local.size(), local.stride(), local.storage_offset() - live_flat.storage_offset())
        return flat, view


def _copy_all(dsts: list[torch.Tensor], srcs: list[torch.Tensor], non_blocking: bool) -> None:
    if not dsts:
        return
    if all(d.device == s.device == dsts[0].device for d, s in zip(dsts, srcs)):
        torch._foreach_copy_(dsts, srcs)  # one launch per chunk instead of one per parameter
        return
    for d, s in zip(dsts, srcs):
        d.copy_(s, non_blocking=non_blocking)


def _event(device: torch.device):
    backend = getattr(torch, device.type, None)
    if device.type == "cpu" or backend is None or not hasattr(backend, "Event"):
        return None
    ev = backend.Event()
    ev.record()
    return ev


# ---------------------------------------------------------------- θ_k


@dataclass
class ThetaStats:
    placement: str | None = None
    swap: str | None = None  # pointer | copy | mixed
    nbytes: int = 0
    save_s: list[float] = field(default_factory=list)
    swap_s: list[float] = field(default_factory=list)  # swap in + swap out, host-side wall time


class ThetaStore:
    """A frozen copy of ``module``'s parameters at θ_k with an explicit placement (see the module doc).

    ``save()`` refreshes it from the live weights (allocates on the first call only); ``at_theta_k()``
    (or ``swap_in()`` / ``swap_out()``) makes the module compute at θ_k and restores the live weights
    exactly afterwards; ``restore()`` copies θ_k into the live weights (rollback); ``named_tensors()``
    gives θ_k's local tensors by parameter name. The module's parameters must not be replaced (``.to()``,
    re-sharding) while a store holds them, and no optimizer step may run while θ_k is swapped in.
    """

    def __init__(self, module: torch.nn.Module, placement: str = "auto", *, margin_bytes: int | None = None,
                 free_memory: FreeMemoryFn = device_memory, swap: str = "auto", key: str = KEY):
        self.requested = check_placement(placement, key)
        if swap not in ("auto", "copy"):
            raise ValueError(f"swap: got {swap!r}; allowed: auto (pointer where possible), copy")
        self.module, self.key, self._swap_pref = module, key, swap
        self._margin, self._free_memory = margin_bytes, free_memory
        self._slots = self._build_slots()
        if not self._slots:
            raise ValueError(f"{key}: the module has no parameters")
        self.stats = ThetaStats()
        self.valid = False
        self.swapped = False
        self._ready = None  # event after the last host-bound copies

    def _build_slots(self) -> list[_Slot]:
        reshard(self.module)  # the registered parameters are the sharded ones
        fsdp = _fsdp_params_by_param(self.module)
        return [_Slot(n, p, fsdp.get(id(p))) for n, p in self.module.named_parameters()]

    def _params_replaced(self) -> bool:
        """Whether the module's parameters are other objects than when the buffers were made (a checkpoint
        loaded with assign=True, a re-wrap): then the buffers are made again."""
        reshard(self.module)
        current = [(n, id(p)) for n, p in self.module.named_parameters()]
        fsdp = _fsdp_params_by_param(self.module)
        return (current != [(s.name, id(s.param)) for s in self._slots]
                or any(fsdp.get(id(s.param)) is not s.fsdp_param for s in self._slots))

    @property
    def placement(self) -> str | None:
        """``device`` or ``pinned`` once the first ``save()`` allocated the buffers."""
        return self.stats.placement

    @property
    def nbytes(self) -> int:
        return self.stats.nbytes

    def need_bytes(self) -> int:
        return sum(s.source().numel() * s.source().element_size() for s in self._slots)

    def _allocate(self) -> None:
        device = self._slots[0].source().device
        placement = resolve_placement(self.requested, self.need_bytes(), device, margin_bytes=self._margin,
                                      free_memory=self._free_memory, key=self.key)
        for s in self._slots:
            s.frozen = s.make_frozen(placement, self.key)
        pointer = [placement == "device" and self._swap_pref == "auto" and s.pointer_swappable() for s in self._slots]
        self._pointer = pointer
        self.stats.placement = placement
        self.stats.swap = "pointer" if all(pointer) else "copy" if not any(pointer) else "mixed"
        self.stats.nbytes = sum(s.frozen[0].numel() * s.frozen[0].element_size() for s in self._slots)

    def save(self) -> None:
        """θ_k := the live weights (a copy into the persistent buffers)."""
        if self.swapped:
            raise RuntimeError(f"{self.key}: save() while θ_k is swapped in")
        t = time.perf_counter()
        if self.stats.placement and self._params_replaced():
            self._slots, self.stats.placement = self._build_slots(), None  # frees the old buffers
        if not self.stats.placement:
            self._allocate()
        non_blocking = self.stats.placement == "pinned"
        _copy_all([s.frozen[0] for s in self._slots], [s.source() for s in self._slots], non_blocking)
        self._ready = _event(self._slots[0].source().device) if non_blocking else None
        self.valid = True
        self.stats.save_s.append(time.perf_counter() - t)

    def invalidate(self) -> None:
        """Forget θ_k (the buffers stay allocated for the next step)."""
        if self.swapped:
            self.swap_out()
        self.valid = False

    def _check_valid(self) -> None:
        if not self.valid:
            raise RuntimeError(f"{self.key}: no θ_k saved (save() first)")

    def swap_in(self) -> None:
        """The module computes at θ_k until ``swap_out()``."""
        self._check_valid()
        if self.swapped:
            raise RuntimeError(f"{self.key}: θ_k is already swapped in")
        self._t_swap = time.perf_counter()
        reshard(self.module)
        copies = []
        for s, pointer in zip(self._slots, self._pointer):
            if pointer:
                s.held = s.live()
                s.bind(s.frozen)
            else:
                if s.scratch is None:
                    s.scratch = _alloc(s.source(), self.stats.placement, self.key)
                copies.append(s)
        nb = self.stats.placement == "pinned"
        _copy_all([s.scratch for s in copies], [s.source() for s in copies], nb)  # live -> scratch
        _copy_all([s.source() for s in copies], [s.frozen[0] for s in copies], nb)  # θ_k -> live
        self.swapped = True

    def swap_out(self) -> None:
        """The live weights again, bit for bit."""
        if not self.swapped:
            return
        reshard(self.module)  # drop parameters gathered at θ_k
        copies = []
        for s, pointer in zip(self._slots, self._pointer):
            if pointer:
                s.bind(s.held)
                s.held = ()
            else:
                copies.append(s)
        _copy_all([s.source() for s in copies], [s.scratch for s in copies], self.stats.placement == "pinned")
        self.swapped = False
        self.stats.swap_s.append(time.perf_counter() - self._t_swap)

    @contextmanager
    def at_theta_k(self, needed: bool = True):
        """The module at θ_k inside the block (nothing happens when ``needed`` is false)."""
        if not needed:
            yield
            return
        self.swap_in()
        try:
            yield
        finally:
            self.swap_out()

    def restore(self) -> None:
        """The live weights := θ_k (rollback of a failed step)."""
        self._check_valid()
        if self.swapped:
            self.swap_out()
        reshard(self.module)
        _copy_all([s.source() for s in self._slots], [s.frozen[0] for s in self._slots],
                  self.stats.placement == "pinned")

    def named_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """θ_k's local tensors (this rank's shard, without FSDP2's padding) by parameter name, where they live
        (host buffers for ``pinned``: complete when yielded)."""
        self._check_valid()
        if self._ready is not None:
            self._ready.synchronize()
        for s in self._slots:
            yield s.name, s.frozen[-1] if s.fsdp_param is not None else s.frozen[0]


def save_step_state(theta: ThetaStore, optimizer: "OptimizerSnapshot | None" = None) -> None:
    """The snapshot the trainer takes once per step, before the step's first optimizer step
    (``PipeActorWorker.save_train_state``): θ_k, then the optimizer state for a rollback. Both are issued on the
    current stream, so the step's kernels queue behind the copies (``pinned``: non-blocking host copies whose
    time still lands in the step). Its cost against a training step: docs/cgp.md."""
    theta.save()
    if optimizer is not None:
        optimizer.save()


# ---------------------------------------------------------------- optimizer


@dataclass
class OptimizerStats:
    placement: str | None = None
    nbytes: int = 0
    save_s: list[float] = field(default_factory=list)
    restore_s: list[float] = field(default_factory=list)


class OptimizerSnapshot:
    """The optimizer's per-parameter state and param-group hyperparameters in persistent buffers.

    ``save(stream=None)`` copies the tensor state (Adam's exp_avg, exp_avg_sq, step, ...; the local shard of a
    DTensor) into buffers allocated on the first save that has state, and deep-copies everything else;
    ``restore()`` puts it back exactly (a parameter without state at save time loses its state). With
    ``stream`` (an accelerator stream) the copies run there: call ``fence()`` before anything modifies the
    optimizer state (the next optimizer step), so the step waits for the copy and not the rest.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, placement: str = "auto", *, margin_bytes: int | None = None,
                 free_memory: FreeMemoryFn = device_memory, key: str = KEY):
        self.requested = check_placement(placement, key)
        self.optimizer, self.key = optimizer, key
        self._margin, self._free_memory = margin_bytes, free_memory
        self._bufs: list[dict[str, torch.Tensor]] = []
        self._saved: list[dict | None] | None = None  # per param: {key: buffer or deep-copied value} or None
        self._groups: list[dict] = []
        self._side = None  # (stream, event) of a save issued on a side stream
        self.stats = OptimizerStats()

    @property
    def placement(self) -> str | None:
        return self.stats.placement

    def _params(self) -> list[torch.nn.Parameter]:
        return [p for g in self.optimizer.param_groups for p in g["params"]]

    def need_bytes(self) -> int:
        state = self.optimizer.state
        return sum(_local(v).numel() * _local(v).element_size() for p in self._params() if p in state
                   for v in state[p].values() if torch.is_tensor(v))

    def _buffer(self, i: int, k: str, src: torch.Tensor) -> torch.Tensor:
        buf = self._bufs[i].get(k)
        where = src.device if self.stats.placement == "device" else torch.device("cpu")
        if buf is None or buf.shape != src.shape or buf.dtype != src.dtype or buf.device != where:
            # a 0-dim CPU step counter stays a CPU tensor either way
            buf = _alloc(src, self.stats.placement if src.device.type != "cpu" else "device", self.key)
            self._bufs[i][k] = buf
            self.stats.nbytes = sum(b.numel() * b.element_size() for d in self._bufs for b in d.values())
        return buf

    def save(self, stream=None) -> None:
        t = time.perf_counter()
        params = self._params()
        if len(self._bufs) != len(params):
            self._bufs = [{} for _ in params]
        state = self.optimizer.state
        if not self.stats.placement and any(p in state for p in params):
            device = next(_local(v).device for p in params if p in state for v in state[p].values()
                          if torch.is_tensor(v))
            self.stats.placement = resolve_placement(self.requested, self.need_bytes(), device,
                                                     margin_bytes=self._margin, free_memory=self._free_memory,
                                                     key=self.key)
        saved: list[dict | None] = []
        dsts, srcs = [], []
        for i, p in enumerate(params):
            if p not in state:
                saved.append(None)
                continue
            entry = {}
            for k, v in state[p].items():
                if torch.is_tensor(v):
                    src = _local(v)
                    buf = self._buffer(i, k, src)
                    dsts.append(buf)
                    srcs.append(src)
                    entry[k] = buf
                else:
                    entry[k] = copy.deepcopy(v)
            saved.append(entry)
        self._groups = [{k: copy.deepcopy(v) for k, v in g.items() if k != "params"} for g in self.optimizer.param_groups]
        non_blocking = self.stats.placement == "pinned"
        if stream is not None:
            backend = getattr(torch, srcs[0].device.type) if srcs else None
            if backend is not None and srcs[0].device.type != "cpu":
                stream.wait_stream(backend.current_stream())  # the state as the main stream left it
                with backend.stream(stream):
                    for d, s in zip(dsts, srcs):
                        d.copy_(s, non_blocking=non_blocking)
                    ev = backend.Event()
                    ev.record(stream)
                self._side = ev
                dsts = srcs = []
        for d, s in zip(dsts, srcs):
            d.copy_(s, non_blocking=non_blocking)
        self._saved = saved
        self.stats.save_s.append(time.perf_counter() - t)

    def fence(self) -> None:
        """The current stream waits for a save issued on a side stream (a no-op otherwise)."""
        if self._side is not None:
            backend = getattr(torch, self._side_device_type(), None)
            backend.current_stream().wait_event(self._side)
            self._side = None

    def _side_device_type(self) -> str:
        for d in self._bufs:
            for b in d.values():
                if b.device.type != "cpu":
                    return b.device.type
        return "cuda"

    def clear(self) -> None:
        """Forget the snapshot (the buffers stay allocated)."""
        self.fence()
        self._saved = None

    @property
    def valid(self) -> bool:
        return self._saved is not None

    def restore(self) -> None:
        if self._saved is None:
            raise RuntimeError(f"{self.key}: no optimizer snapshot saved")
        t = time.perf_counter()
        self.fence()
        state = self.optimizer.state
        for p, entry in zip(self._params(), self._saved, strict=True):
            if entry is None:
                state.pop(p, None)  # the optimizer had not stepped yet
                continue
            cur = state[p]
            for k, v in entry.items():
                if not torch.is_tensor(v):
                    cur[k] = copy.deepcopy(v)
                elif torch.is_tensor(cur.get(k)):
                    _local(cur[k]).copy_(v, non_blocking=self.stats.placement == "pinned")
                elif hasattr(p, "to_local"):
                    raise RuntimeError(f"{self.key}: optimizer state {k!r} of a DTensor parameter is gone; "
                                       "cannot rebuild it from the snapshot")
                else:
                    cur[k] = v.to(p.device if v.dim() else v.device, copy=True)
        for group, saved in zip(self.optimizer.param_groups, self._groups, strict=True):
            group.update(copy.deepcopy(saved))
        self.stats.restore_s.append(time.perf_counter() - t)
