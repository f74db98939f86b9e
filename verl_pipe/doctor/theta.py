"""The θ_k store (verl_pipe/trainer/theta_store.py) under FSDP2 on this device: torch only.

A tiny model (an embedding, two tanh layers, a head), ``fully_shard`` on each layer and on the root over the
process group's ranks (FSDP2's default reshard_after_forward, so a forward-only pass leaves the root unsharded: the
case the store must handle), trained data-parallel as the trainer's ranks are. Per placement (device, pinned) it
saves θ_k and the optimizer state, trains two AdamW steps and checks on this rank that the log-probs computed through
the store equal those at θ_k (bitwise on CPU; on an accelerator within ``GPU_TOL`` nats), differ from the live
weights', that a swap leaves the live weights bitwise as they were, and that ``restore()`` brings θ_k and Adam's
state and learning rate back bitwise. The caller owns the process group (``torch.distributed`` initialized).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from verl_pipe.trainer.theta_store import OptimizerSnapshot, ThetaStore, reshard

GPU_TOL = 1e-4  # nats: max |Δ| of old log-probs through the store on an accelerator; 0 on CPU
VOCAB, WIDTH, SEQ = 64, 32, 12


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, WIDTH)
        self.layers = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh())
                                           for _ in range(2))
        self.head = torch.nn.Linear(WIDTH, VOCAB)

    def forward(self, ids):
        h = self.emb(ids)
        for layer in self.layers:
            h = h + layer(h)
        return self.head(h)


def log_probs(model, ids) -> torch.Tensor:
    logits = model(ids)[:, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)


def _host(t):
    t = t.to_local() if hasattr(t, "to_local") else t
    return t.detach().to("cpu", copy=True)


def _params(model) -> dict:
    reshard(model)
    return {n: _host(p) for n, p in model.named_parameters()}


def _same(model, ref: dict) -> bool:
    return all(torch.equal(v, ref[n]) for n, v in _params(model).items())


def _opt_state(optimizer) -> list:
    return [{k: _host(v) if torch.is_tensor(v) else v for k, v in optimizer.state.get(p, {}).items()}
            for g in optimizer.param_groups for p in g["params"]]


def _states_equal(a: list, b: list) -> bool:
    return len(a) == len(b) and all(
        x.keys() == y.keys() and all(torch.equal(x[k], y[k]) if torch.is_tensor(x[k]) else x[k] == y[k] for k in x)
        for x, y in zip(a, b))


def build(device: torch.device):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)  # the same initial weights on every rank, then sharded
    model = Tiny().to(device)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)


def train_step(model, optimizer, ids) -> None:
    (-log_probs(model, ids).mean()).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def check_placement(model, optimizer, placement: str, batch, eval_ids, tol: float) -> dict:
    """One placement's round: the figures, and ``failures`` in words (none: it passed)."""
    with torch.no_grad():
        lp_k = log_probs(model, eval_ids)
    at_k = _params(model)
    store, opt = ThetaStore(model, placement), OptimizerSnapshot(optimizer, placement)
    store.save()
    opt.save()
    opt_ref, lr_ref = _opt_state(optimizer), [g["lr"] for g in optimizer.param_groups]
    for _ in range(2):
        train_step(model, optimizer, batch)
    for g in optimizer.param_groups:
        g["lr"] *= 0.5  # the snapshot must bring the hyperparameters back too
    live = _params(model)
    with torch.no_grad():
        lp_live = log_probs(model, eval_ids)
        store.swap_in()
        lp_store = log_probs(model, eval_ids)
        store.swap_out()
    untouched = _same(model, live)
    store.restore()
    restored = _same(model, at_k)
    opt.restore()
    opt_exact = _states_equal(_opt_state(optimizer), opt_ref) and [g["lr"] for g in optimizer.param_groups] == lr_ref
    diff = float((lp_store - lp_k).abs().max())
    moved = float((lp_store - lp_live).abs().max())
    failures = [what for ok, what in ((untouched, "a swap changed the live weights"),
                                      (restored, "restore() did not bring θ_k back bitwise"),
                                      (opt_exact, "the optimizer snapshot did not restore Adam's state and lr bitwise"))
                if not ok]
    if diff > tol:
        failures.append(f"old log-probs through the store differ from those at θ_k by {diff:g} > {tol:g}")
    if moved == 0.0:
        failures.append("the updates did not change the log-probs: the check proves nothing")
    return {"requested": placement, "placement": store.placement, "swap": store.stats.swap,
            "theta_bytes": store.nbytes, "old_logprob_max_abs_diff": diff, "tolerance": tol,
            "store_vs_live_max_abs_diff": moved, "failures": failures}


def check_theta_store(device: torch.device, placements=("device", "pinned")) -> list[dict]:
    """Every placement's round on ``device``, each rank its own batch; the process group must be up."""
    rank = dist.get_rank()
    model, optimizer = build(device)
    g = torch.Generator().manual_seed(1 + rank)
    batch = torch.randint(0, VOCAB, (4, SEQ), generator=g).to(device)
    eval_ids = torch.randint(0, VOCAB, (3, SEQ), generator=torch.Generator().manual_seed(7)).to(device)
    train_step(model, optimizer, batch)  # Adam's state exists before the first snapshot
    tol = 0.0 if device.type == "cpu" else GPU_TOL
    return [check_placement(model, optimizer, p, batch, eval_ids, tol) for p in placements]
