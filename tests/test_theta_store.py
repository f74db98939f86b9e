"""The θ_k store and the optimizer snapshot on CPU: plain modules in process, FSDP2 (gloo, one and two ranks) in a
subprocess (the doctor's θ_k check, verl_pipe/doctor/theta.py, and a short script for the unsharded-root case)."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from verl_pipe.trainer.theta_store import (AUTO_MARGIN_FRACTION, KEY, OptimizerSnapshot, ThetaStore, ThetaStoreError,
                                   check_placement, resolve_placement)

ROOT = Path(__file__).resolve().parents[1]
GIB = 1 << 30


def _model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Embedding(32, 16), torch.nn.Linear(16, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 32))


def _train(model, opt, steps=3, seed=1):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randint(0, 32, (4, 8), generator=g)
        loss = model(x).logsumexp(-1).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


X = torch.arange(24).reshape(3, 8) % 32


def _params(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _same(model, ref):
    return all(torch.equal(p, ref[n]) for n, p in model.named_parameters())


@pytest.mark.parametrize("placement", ["device", "pinned", "auto"])
def test_swap_computes_at_theta_k_and_restores_live_weights_bitwise(placement):
    torch.set_num_threads(1)
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    _train(model, opt, 1)
    with torch.no_grad():
        out_k = model(X)
    theta_k = _params(model)
    store = ThetaStore(model, placement)
    store.save()
    assert store.placement == ("pinned" if placement == "pinned" else "device")  # auto on CPU: device
    assert store.stats.swap == ("copy" if placement == "pinned" else "pointer")
    assert store.nbytes == sum(t.numel() * 4 for t in theta_k.values())
    _train(model, opt, 3)
    live = _params(model)
    with torch.no_grad():
        out_live = model(X)
    assert not torch.equal(out_live, out_k)
    for _ in range(2):  # persistent buffers: the second swap reuses them
        with store.at_theta_k(), torch.no_grad():
            assert torch.equal(model(X), out_k)  # the same weights, the same ops: bitwise
            assert _same(model, theta_k)
        assert _same(model, live)
        assert all(p is q for p, q in zip(model.parameters(), opt.param_groups[0]["params"]))
    with torch.no_grad():
        assert torch.equal(model(X), out_live)
    named = dict(store.named_tensors())
    assert all(torch.equal(named[n], theta_k[n]) for n in theta_k)
    _train(model, opt, 1)  # the optimizer still trains the live parameters after swaps
    assert not _same(model, live)
    store.restore()
    assert _same(model, theta_k)


def test_swap_is_a_no_op_when_not_needed_and_refresh_follows_the_weights():
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    store = ThetaStore(model, "device")
    store.save()
    buffers = [t.data_ptr() for _, t in store.named_tensors()]
    _train(model, opt, 2)
    live = _params(model)
    with store.at_theta_k(needed=False):
        assert _same(model, live) and not store.swapped
    store.save()  # refresh: θ_k := the current weights, into the same buffers
    assert [t.data_ptr() for _, t in store.named_tensors()] == buffers
    with store.at_theta_k():
        assert _same(model, live)
    store.invalidate()
    with pytest.raises(RuntimeError, match="no θ_k saved"):
        store.swap_in()


def test_swap_out_restores_even_when_the_block_raises():
    model = _model()
    store = ThetaStore(model, "device")
    store.save()
    live_ptrs = [p.data_ptr() for p in model.parameters()]
    with pytest.raises(ValueError), store.at_theta_k():
        raise ValueError("boom")
    assert [p.data_ptr() for p in model.parameters()] == live_ptrs and not store.swapped


def test_the_config_allows_the_store_placements():
    from verl_pipe.config import THETA_K_PLACEMENTS
    from verl_pipe.trainer.theta_store import PLACEMENTS

    assert THETA_K_PLACEMENTS == PLACEMENTS


def test_replaced_parameters_get_new_buffers():
    model = _model()
    store = ThetaStore(model, "device")
    store.save()
    model[1].weight = torch.nn.Parameter(torch.ones(16, 16))  # e.g. a checkpoint loaded with assign=True
    theta_k = _params(model)
    store.save()
    with torch.no_grad():
        model[1].weight.add_(1.0)
    live = _params(model)
    with store.at_theta_k():
        assert _same(model, theta_k)
    assert _same(model, live)


def test_placement_errors_name_the_key():
    with pytest.raises(ThetaStoreError, match=r"^rolloutpipe\.theta_k\.store: got 'host'; allowed: one of device, "
                                              r"pinned, auto"):
        check_placement("host")
    with pytest.raises(ThetaStoreError, match=KEY):
        ThetaStore(_model(), "gpu")
    with pytest.raises(ThetaStoreError, match=KEY):
        OptimizerSnapshot(torch.optim.AdamW(_model().parameters()), "everywhere")
    full = lambda device: (1 * GIB, 80 * GIB)  # noqa: E731
    with pytest.raises(ThetaStoreError, match=r"^rolloutpipe\.theta_k\.store: 'device' needs 2\.00 GiB .* only 1\.00 "
                                              r"GiB are free .* use 'pinned'"):
        resolve_placement("device", 2 * GIB, torch.device("cpu"), free_memory=full)
    model = _model()
    store = ThetaStore(model, "device", free_memory=lambda d: (100, 1000))  # a device with 100 bytes free
    with pytest.raises(ThetaStoreError, match=KEY):
        store.save()
    assert not store.valid


def test_auto_chooses_by_the_margin():
    dev = torch.device("cpu")
    mem = lambda free, total: (lambda d: (free, total))  # noqa: E731
    # default margin: AUTO_MARGIN_FRACTION of the total
    assert AUTO_MARGIN_FRACTION == 0.25
    assert resolve_placement("auto", 10 * GIB, dev, free_memory=mem(30 * GIB, 80 * GIB)) == "device"  # 10+20 <= 30
    assert resolve_placement("auto", 11 * GIB, dev, free_memory=mem(30 * GIB, 80 * GIB)) == "pinned"
    assert resolve_placement("auto", 11 * GIB, dev, margin_bytes=0, free_memory=mem(30 * GIB, 80 * GIB)) == "device"
    assert resolve_placement("auto", 1, dev, margin_bytes=0, free_memory=mem(0, 80 * GIB)) == "pinned"
    assert resolve_placement("pinned", 1, dev, free_memory=mem(80 * GIB, 80 * GIB)) == "pinned"
    assert resolve_placement("auto", 10 * GIB, dev) == "device"  # CPU: no figure, host memory either way
    need = sum(p.numel() * 4 for p in _model().parameters())
    for free, want in ((need + 1000, "device"), (need + 999, "pinned")):
        store = ThetaStore(_model(), "auto", margin_bytes=1000, free_memory=mem(free, 10 * need))
        store.save()
        assert store.placement == want


@pytest.mark.parametrize("placement", ["device", "pinned"])
def test_optimizer_snapshot_restores_adam_state_exactly(placement):
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    snap = OptimizerSnapshot(opt, placement)
    snap.save()  # before any step: no state, nothing allocated
    assert snap.stats.nbytes == 0 and snap.placement is None
    _train(model, opt, 2)
    snap.restore()  # back to "never stepped"
    assert not opt.state
    _train(model, opt, 2)
    snap.save()
    assert snap.placement == placement
    nbytes = snap.stats.nbytes
    ref = {id(p): {k: v.clone() for k, v in opt.state[p].items()} for p in model.parameters()}
    lr = opt.param_groups[0]["lr"]
    _train(model, opt, 3)
    opt.param_groups[0]["lr"] = lr / 10
    assert any(not torch.equal(opt.state[p]["exp_avg"], ref[id(p)]["exp_avg"]) for p in model.parameters())
    snap.restore()
    for p in model.parameters():
        assert opt.state[p].keys() == ref[id(p)].keys()
        for k, v in opt.state[p].items():
            assert torch.equal(v, ref[id(p)][k]), k  # exp_avg, exp_avg_sq and step
    assert opt.param_groups[0]["lr"] == lr
    snap.save()  # reuses the buffers
    assert snap.stats.nbytes == nbytes
    state_ptrs = {id(p): opt.state[p]["exp_avg"].data_ptr() for p in model.parameters()}
    snap.restore()
    assert {id(p): opt.state[p]["exp_avg"].data_ptr() for p in model.parameters()} == state_ptrs  # in place


def _run(args, timeout=240):
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


THETA_SCRIPT = textwrap.dedent("""
    import json, os, socket, torch, torch.distributed as dist
    torch.set_num_threads(1)
    if "WORLD_SIZE" not in os.environ:  # one process, not torchrun's
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(s.getsockname()[1]), RANK="0", WORLD_SIZE="1")
    dist.init_process_group("gloo")
    from verl_pipe.doctor.theta import check_theta_store
    rounds = check_theta_store(torch.device("cpu"), placements=("device", "pinned", "auto"))
    dist.barrier()
    if dist.get_rank() == 0:
        print("RESULT" + json.dumps(rounds))
    dist.destroy_process_group()
""")


def _theta_rounds(proc) -> dict:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("RESULT")]
    by = {r["requested"]: r for r in json.loads(line[len("RESULT"):])}
    assert set(by) == {"device", "pinned", "auto"}
    assert by["device"]["swap"] == "pointer" and by["pinned"]["swap"] == "copy" and by["auto"]["placement"] == "device"
    for r in by.values():
        assert r["failures"] == [] and r["old_logprob_max_abs_diff"] == 0.0 == r["tolerance"]  # bitwise on CPU
        assert r["store_vs_live_max_abs_diff"] > 0  # the updates moved the live weights: the check has teeth
    return by


def test_doctor_theta_check_under_fsdp2_on_cpu(tmp_path):
    """python -m verl_pipe.doctor's θ_k store check (verl_pipe/doctor/theta.py), here on CPU over gloo: FSDP2 at world
    size 1, each placement bitwise."""
    from verl_pipe.doctor.theta import Tiny

    script = tmp_path / "theta.py"
    script.write_text(THETA_SCRIPT)
    by = _theta_rounds(_run([str(script)]))
    params_bytes = 4 * sum(p.numel() for p in Tiny().parameters())  # fp32, one rank holds every parameter
    assert {r["theta_bytes"] for r in by.values()} == {params_bytes}


def test_doctor_theta_check_sharded_over_two_ranks_under_torchrun(tmp_path):
    """WORLD_SIZE > 1: FSDP2 shards over both ranks and every rank checks its shards."""
    from verl_pipe.doctor.theta import Tiny

    script = tmp_path / "theta.py"
    script.write_text(THETA_SCRIPT)
    by = _theta_rounds(_run(["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script)]))
    params_bytes = 4 * sum(p.numel() for p in Tiny().parameters())
    for r in by.values():  # rank 0 keeps about half of the parameters (its shards, with FSDP2's padding)
        assert 0.4 * params_bytes < r["theta_bytes"] < 0.6 * params_bytes


FSDP_ROOT_SCRIPT = textwrap.dedent("""
    import os, sys, torch, torch.distributed as dist
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
    dist.init_process_group("gloo", rank=0, world_size=1)
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.device_mesh import init_device_mesh
    from verl_pipe.trainer.theta_store import ThetaStore
    mesh = init_device_mesh("cpu", (1,))
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Embedding(11, 8), torch.nn.Sequential(torch.nn.Linear(8, 8)),
                            torch.nn.Linear(8, 11))  # 11 rows: padding is irrelevant at world size 1, still fine
    fully_shard(m[1], mesh=mesh)
    fully_shard(m, mesh=mesh)  # default reshard_after_forward: the root stays unsharded after a forward
    opt = torch.optim.AdamW(m.parameters(), lr=0.05)
    x = torch.tensor([[1, 2, 3, 4]])
    m(x).sum().backward(); opt.step(); opt.zero_grad()
    with torch.no_grad():
        out_k = m(x)
    for swap in ("auto", "copy"):
        store = ThetaStore(m, "device", swap=swap)
        store.save()
        kind = store.stats.swap
        for _ in range(2):
            m(x).sum().backward(); opt.step(); opt.zero_grad()
        with torch.no_grad():
            out_live = m(x)  # leaves the root's parameters unsharded, gathered from the live weights
            with store.at_theta_k():
                out_store = m(x)
            out_after = m(x)
        assert not torch.equal(out_live, out_k)
        assert torch.equal(out_store, out_k), (swap, (out_store - out_k).abs().max())
        assert torch.equal(out_after, out_live), swap
        names = dict(store.named_tensors())
        assert set(names) == {n for n, _ in m.named_parameters()}
        store.restore()
        with torch.no_grad():
            assert torch.equal(m(x), out_k)
        print(swap, kind)
    dist.destroy_process_group()
    print("ok")
""")


def test_fsdp2_swap_with_an_unsharded_root(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = tmp_path / "fsdp_root.py"
    script.write_text(FSDP_ROOT_SCRIPT)
    proc = _run([str(script), str(port)], timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.split() == ["auto", "pointer", "copy", "copy", "ok"]
