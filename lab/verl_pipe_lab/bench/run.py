"""Side-by-side benchmark: ``python -m verl_pipe_lab.bench [--quick] [--settings ...] [--repeats N] --out FILE.json
[--charts DIR]``.

One live stack (``PipeSession``: one Ray cluster, one vLLM start) per model size. For each setting (a named
response-length workload, lab/verl_pipe_lab/bench/conf/*.yaml) the modes run on the same workers, interleaved round-robin
(sync, cgp, cgp_group, cgp_fgd, sync, cgp, ...) so that machine noise hits every mode alike; in each round
every mode generates exactly the same per-request lengths (EOS ignored). One warm-up step per session is
discarded. Every step trains the model, so the weights differ between steps; the lengths, not the weights,
decide the rollout's timing.

Output: plain-text tables, and a JSON in docs/metrics.md's "Benchmark output" schema (``report``), with a
``sim_validation`` (the simulator calibrated on these very runs re-simulates each of them, ``calib``)
and a ``sim`` section (the calibrated simulator's figures for every mode, verl's V1 separate_async trainer
included, and a T/R sweep). Charts with ``--charts`` (``charts``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path

from verl_pipe_lab.bench.provenance import env_info, host_overlap
from verl_pipe_lab.bench.report import (BASE, MODES, PEERS, check_schema, format_setting, format_sim_validation,
                                    format_sweep, setting_entry)
from verl_pipe_lab.bench.settings import CONF_DIR, load_config, stack_of, stack_overrides, workload_for
from verl_pipe.sim.records import CPU_BLOCK_TOKENS, engine_donors, kv_override_tokens, recorded_shape
from verl_pipe.core.variants import GRANULARITIES, name_of, variant
from verl_pipe.trainer.knobs import window_label  # noqa: F401 -- FGD's window as the results record it (tests, callers)

SEPARATE_ASYNC = "verl_separate_async"


# ------------------------------------------------------------------------------------------------- config


def mode_kwargs(mode: str, granularity: str = "minibatch") -> dict:
    """session.step() arguments of a benchmark mode (verl_pipe/core/variants.py; ``granularity``: cgp_fgd's choice)."""
    return variant(mode).step_args(granularity)


def setting_knobs(configured, wl, setting: dict | None) -> dict:
    """A bench step's other knobs: the setting's ``knobs``, the rest as the stack configures them (session knobs stay
    for later steps, so each step sets them all), and the length predictor's keys: the workload's prompts within this
    setting (repeated prompts), else a new key per group and round (every prompt new: no history)."""
    from verl_pipe.core.workload import length_keys

    name = (setting or {}).get("name", "")
    keys = length_keys(wl)
    keys = (tuple(((name, k), e) for k, e in keys) if keys is not None
            else tuple(((name, hash(tuple(map(tuple, wl.lengths))), g), 0) for g in range(wl.num_groups)))
    return dict({"fgd_lengths": configured.fgd_lengths, "fgd_rest_order": configured.fgd_rest_order,
                 "fgd_policy": configured.fgd_policy,
                 "unit_fill": configured.unit_fill},
                **((setting or {}).get("knobs") or {}), length_keys=keys)


# ---------------------------------------------------------------------------------------------- peer


# What running the peer took when it was tried by hand (TransferQueue 0.1.11's wheel on PYTHONPATH, not
# installed): 2 steps of verl's V1 separate_async ran on this CPU platform once verl 0.9.1's
# ``logger.info(..., flush=True)`` in PPOTrainerSeparateAsync._setup (hybrid_engine=False) was patched out.
def peer_status() -> str:
    """Why a setting has no figures of verl's V1 separate_async trainer (lab/verl_pipe_lab/bench/peer runs it for real)."""
    import importlib.util

    if importlib.util.find_spec("transfer_queue") is None:
        return ("not measured: verl 0.9.1's V1 separate_async trainer imports transfer_queue (PyPI TransferQueue "
                "0.1.11, installed by make setup), which is not installed in this environment")
    return ("not run on this setting (the bench config's `peers` names the settings and configurations it runs on: "
            "each costs its own stack start-up); simulated figures: sim.settings[*].modes.verl_separate_async")


# ---------------------------------------------------------------------------------------------- runs


class BenchRunner:
    """Runs the configured settings on live sessions and keeps every measured step."""

    def __init__(self, cfg: dict, repeats: int, log=print):
        self.cfg = cfg
        self.repeats = repeats
        self.log = log
        self.steps: list[dict] = []  # every measured step (not the warm-up)
        self.skipped: dict[str, str] = {}  # mode -> reason, for the whole session
        self.granularity: dict[str, str] = {}  # setting -> cgp_fgd granularity
        self.shapes: dict = {}  # model size -> calib.StepShape
        self.skipped_reads: dict[str, str] = {}  # figure -> why it could not be read (once per run)
        self.cpu_samples: list[dict] = []  # /proc samples of this process's tree while our stacks ran (cpu_sampler)
        self.stacks: dict[str, dict] = {}  # stack -> its composed config (provenance.stack_record)
        self.env: dict | None = None  # the machine the steps ran on (provenance.env_info), set before a run
        self.startup_s = 0.0

    def dump(self) -> dict:
        """Everything the analysis needs, to rebuild the results later (``--reanalyze``)."""
        return {"shapes": {k: v.__dict__ for k, v in self.shapes.items()}, "skipped": self.skipped,
                "granularity": self.granularity, "startup_s": self.startup_s, "steps": self.steps,
                "cpu_samples": self.cpu_samples, "stacks": self.stacks, "env": self.env}

    def load(self, path: str | Path) -> None:
        """A steps file ``dump`` wrote, or a gzipped copy of one (``.gz``: how docs/bench keeps them)."""
        import gzip

        from verl_pipe.sim.calib import StepShape

        with (gzip.open if str(path).endswith(".gz") else open)(path, "rt") as f:
            d = json.load(f)
        self.shapes = {k: StepShape(**v) for k, v in d["shapes"].items()}
        self.skipped, self.granularity, self.steps = d["skipped"], d["granularity"], d["steps"]
        self.cpu_samples = d.get("cpu_samples", [])
        self.stacks = d.get("stacks", {})  # absent in steps files written before it was recorded
        self.env = d.get("env")  # the machine the steps ran on; absent in steps files written before it was recorded
        for stack, shape in self.shapes.items():  # steps files recorded before the shape held the pool and order
            self.shapes[stack] = recorded_shape(shape, self.stacks.get(stack))

    def overrides(self, stack: str) -> list[str]:
        return stack_overrides(self.cfg, stack)

    def run(self, settings: list[dict]) -> None:
        # ``peers_first`` (bench YAML): verl's trainers before our stacks instead of after, so that across runs the
        # place of each block (the host's drift over a run) does not always favour the same side
        if self.cfg.get("peers_first"):
            self._run_peers(settings)
        stacks = sorted({stack_of(s, self.cfg) for s in settings})
        for stack in stacks:
            self._run_size(stack, [s for s in settings if stack_of(s, self.cfg) == stack])
        if self.cfg.get("peers_first"):
            self._peer_prompt_len()
        else:
            self._run_peers(settings)

    def _peer_prompt_len(self) -> None:
        """The peers' prompt length: our sync's mean on the setting (what _run_peers sets when ours ran first)."""
        for st in self.steps:
            if st.get("peer") and not st.get("prompt_len"):
                ours = [o for o in self.steps if o["setting"] == st["setting"] and o["mode"] == BASE]
                st["prompt_len"] = sum(o["prompt_len"] for o in ours) / len(ours) if ours else 0.0

    def _run_peers(self, settings: list[dict]) -> None:
        """verl's V1 separate_async trainer on the settings that name it (``peers: [onpolicy, default]``), for real:
        its own stack in a subprocess (lab/verl_pipe_lab/bench/peer), after ours are down (the same cores), with the same
        overrides, model, workload seeds (round r: seed + r) and pinning; one warm-up step discarded."""
        from verl_pipe_lab.bench.peer import bench_spec, run_peer
        from verl_pipe_lab.bench.peer.configs import MODE_NAMES

        for s in settings:
            for config in s.get("peers") or []:
                mode = MODE_NAMES[config]
                stack = stack_of(s, self.cfg)
                repeats = min(self.repeats, int(s.get("repeats", self.repeats)))
                spec = bench_spec(config, repeats, self.cfg, s["name"], int(self.cfg.get("warmup_steps", 1)))
                t0 = time.perf_counter()
                try:
                    res = run_peer(spec, log=self.log)
                except RuntimeError as e:
                    self.skipped.setdefault(mode, f"the run failed: {str(e).splitlines()[0]}")
                    self.log(f"[bench] {mode} on {s['name']} failed: {e}")
                    continue
                self.startup_s += float(res.get("startup_s", 0.0))
                ours = [st for st in self.steps if st["setting"] == s["name"] and st["mode"] == BASE]
                prompt_len = sum(st["prompt_len"] for st in ours) / len(ours) if ours else 0.0
                measured = [st for st in res["steps"] if not st.get("warmup")]
                for r, st in enumerate(measured):
                    m = dict(st["metrics"])
                    m["wall_s"] = m.get("step_wall_s", m["step_time_s"])
                    self.steps.append({"setting": s["name"], "mode": mode, "granularity": variant(mode).granularity,
                                       "round": r,
                                       "metrics": m, "lengths": st["lengths"], "prompt_len": prompt_len,
                                       "model_size": stack, "weight_sync_s": m.get("weight_sync_s", 0.0),
                                       "trained_groups": int(m.get("num_trainable_groups", 0)),
                                       "weight_versions": st.get("weight_versions"),
                                       "unavailable": st.get("unavailable", {}), "peer": True,
                                       # what verl timed, and its trainer calls from t0 (for span-by-span A/Bs)
                                       "verl_timing_s": st.get("verl_timing_s", {}),
                                       "train_spans": st.get("train_spans", []),
                                       # colocated: the replicas' sleep and the weight reload, from t0
                                       "phases": st.get("phases", [])})
                    self.log(f"[bench] {s['name']} round {r} {mode} rollout→train_end "
                             f"{m['rollout_to_train_end_s']:6.2f}s wait {m['trainer_wait_ratio']:.3f} "
                             f"weight versions {st.get('weight_versions', {}).get('min_global_steps')}.."
                             f"{st.get('weight_versions', {}).get('max_global_steps')}")
                self.log(f"[bench] {mode} on {s['name']}: {time.perf_counter() - t0:.1f}s "
                         f"(its start-up {res.get('startup_s', 0.0):.1f}s)")

    def _run_size(self, size: str, settings: list[dict]) -> None:
        """One live stack (``size``: its name, see ``stack_of``) for ``settings``."""
        import tempfile

        from verl_pipe.launch.session import PipeSession, compose

        ckpt = tempfile.mkdtemp(prefix="verl_pipe_bench_ckpt_")
        t0 = time.perf_counter()
        overrides = self.overrides(size) + [f"trainer.default_local_dir={ckpt}"]
        session = PipeSession(compose(overrides))
        from verl_pipe_lab.bench.provenance import stack_record

        try:
            self.stacks[size] = stack_record(session.config, overrides)
        except Exception as e:  # the record must not cost the run (and leak a live stack); say what is missing
            self.stacks[size] = {"overrides": overrides, "error": f"{type(e).__name__}: {e}"}
        self.startup_s += time.perf_counter() - t0
        self.log(f"[bench] model size {size}: stack up in {time.perf_counter() - t0:.1f}s")
        from verl_pipe_lab.bench.cpu_sampler import SamplerProcess

        # where the cores go while the steps run: its own process, so sampling takes no GIL from this driver
        sampler = SamplerProcess(os.getpid(), Path(ckpt) / "cpu_samples.jsonl")
        sampler.start()
        try:
            self.shapes[size] = self._shape(session)
            self._warmup(session, settings[0])
            for s in settings:
                self._run_setting(session, s, size)
        finally:
            self.cpu_samples += sampler.stop()
            session.close()
            shutil.rmtree(ckpt, ignore_errors=True)

    def _shape(self, session):
        from verl_pipe.sim.calib import StepShape

        c = session.config
        roll = c.actor_rollout_ref.rollout
        n = int(roll.n)
        micro = int(c.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu)
        if micro != n:
            self.log(f"[bench] note: actor micro-batch {micro} rows != n={n}; the simulator pads per group")
        kv_tokens = self._kv_capacity_tokens(session)
        capped = kv_override_tokens(roll) is not None
        replicas = int(roll.nnodes) * int(roll.n_gpus_per_node) // int(roll.tensor_model_parallel_size)
        knobs = session.trainer.configured_knobs.record()  # the stack's admission as its config sets it, resolved
        return StepShape(n=n, groups_per_unit=int(c.actor_rollout_ref.actor.ppo_mini_batch_size), micro_rows=micro,
                         max_num_seqs=int(roll.max_num_seqs), max_num_batched_tokens=int(roll.max_num_batched_tokens),
                         kv_capacity_tokens=kv_tokens, num_replicas=max(1, replicas),
                         baseline_order=str(knobs["baseline_order"]), baseline_window=knobs["baseline_window"],
                         fgd_window=knobs["fgd_window"], kv_block_tokens=CPU_BLOCK_TOKENS if capped else 1,
                         update_order=str(c.rolloutpipe.micro_batch_order))

    @staticmethod
    def _kv_capacity_tokens(session) -> int:
        """KV tokens a replica holds: the capped block pool where the config caps it, else the CPU KV cache size over
        the model's bytes per token (fp32)."""
        capped = kv_override_tokens(session.config.actor_rollout_ref.rollout)
        if capped:
            return capped
        try:
            with open(Path(session.config.actor_rollout_ref.model.path) / "config.json") as f:
                mc = json.load(f)
            per_token = 2 * mc["num_hidden_layers"] * mc["num_key_value_heads"] * mc.get(
                "head_dim", mc["hidden_size"] // mc["num_attention_heads"]) * 4
            return int(int(session.config.rolloutpipe.cpu.kv_cache_gib) * (1 << 30) // per_token)
        except (OSError, KeyError, ValueError):
            return 1 << 20

    def _overrides_fn(self, wl):
        from verl_pipe.core.workload import exact_lengths

        return exact_lengths(wl)

    def _step(self, session, mode: str, wl, granularity: str = "minibatch", fgd_window=None,
              setting: dict | None = None) -> dict:
        """One step in ``mode``; ``fgd_window``: FGD's admission window for it (None: the stack's config);
        ``setting``: its ``knobs`` (other StepKnobs, e.g. ``fgd_lengths``, ``fgd_policy``; the rest as configured)."""
        preempted_before = self._preemptions(session)  # outside the timed step
        wall_start = time.time()  # epoch seconds, the clock of the /proc samples
        t = time.perf_counter()
        window = fgd_window or session.config.rolloutpipe.fgd.get("window")  # the trainer's run-time knob
        rec = session.step(**mode_kwargs(mode, granularity), sampling_overrides=self._overrides_fn(wl),
                           fgd_window=window, **setting_knobs(session.trainer.configured_knobs, wl, setting))
        wall = time.perf_counter() - t
        tl = session.trainer.timelines[-1]
        m = dict(rec["timeline"])
        m["wall_s"] = wall
        from verl_pipe_lab.bench.preemptions import step_delta

        preempted = step_delta(preempted_before, self._preemptions(session))
        if preempted is not None:  # vLLM counts them only with actor_rollout_ref.rollout.disable_log_stats=false
            m["vllm_preemptions"] = preempted
        from verl_pipe.trainer.step_record import learning_metrics

        return {"metrics": m, "timeline": tl.to_dict(), "fgd_window": rec["knobs"]["fgd_window"],  # as the step ran
                "unit_fill": rec["knobs"].get("unit_fill", "completion"),
                "learning": learning_metrics(rec["metrics"]),
                "prompt_len": float(rec["metrics"].get("prompt_length/mean", 0.0)),
                "trained_groups": len(rec.get("trained_groups", [])), "wall_window": [wall_start, wall_start + wall],
                "length_predictions": rec.get("lengths"),  # per group, predicted vs actual (core/lengths.py)
                "admission": rec.get("admission"), "fgd_lengths": rec["knobs"].get("fgd_lengths", "off")}

    def _preemptions(self, session) -> float | None:
        """vLLM's preemptions so far over the replicas (lab/verl_pipe_lab/bench/preemptions.py); None when not counted."""
        from verl_pipe_lab.bench.preemptions import replica_preemptions

        if session.config.actor_rollout_ref.rollout.get("disable_log_stats", True):
            return None  # vLLM counts nothing then: no calls into the servers
        try:
            return replica_preemptions(list(session.trainer.llm_server_manager.server_handles))
        except Exception as e:  # a figure the bench adds, never a reason to lose the run
            if "preemptions" not in self.skipped_reads:
                self.skipped_reads["preemptions"] = f"{type(e).__name__}: {e}"
                self.log(f"[bench] vLLM preemption counts not read: {e}")
            return None

    def _warmup(self, session, setting: dict) -> None:
        c = session.config
        wl = workload_for(setting["workload"], int(c.data.train_batch_size), int(c.actor_rollout_ref.rollout.n),
                          seed=10_000)
        for _ in range(int(self.cfg.get("warmup_steps", 1))):
            r = self._step(session, "sync", wl)
            self.log(f"[bench] warm-up step (discarded): {r['metrics']['wall_s']:.1f}s")

    def _run_setting(self, session, s: dict, size: str) -> None:
        c = session.config
        B, n = int(c.data.train_batch_size), int(c.actor_rollout_ref.rollout.n)
        modes = [m for m in s.get("modes") or self.cfg.get("modes", list(MODES))]
        gran_cfg = self.cfg.get("cgp_fgd_granularity", "auto")
        name = s["name"]
        t_set = time.perf_counter()
        per_round: dict[str, list] = {}
        for r in range(min(self.repeats, int(s.get("repeats", self.repeats)))):
            wl = workload_for(s["workload"], B, n, seed=int(self.cfg.get("seed", 0)), round_=r)
            # the modes' order rotates with the round: a mode's place in the round (what ran just before it, the
            # host's drift within the round) falls on every mode alike over the rounds
            for mode in modes[r % len(modes):] + modes[:r % len(modes)]:
                if mode in self.skipped:
                    continue
                gran = "minibatch"
                if variant(mode).granularity is None:  # cgp_fgd: the better of the other variants' granularities
                    gran = self._fgd_granularity(name, gran_cfg, per_round)
                try:
                    res = self._step(session, mode, wl, gran, s.get("fgd_window"), s)
                except NotImplementedError as e:
                    if mode == BASE:
                        raise
                    self.skipped[mode] = f"not implemented: {e}"
                    self.log(f"[bench] {mode} skipped: {e}")
                    continue
                res.update(setting=name, mode=mode, granularity=mode_kwargs(mode, gran)["granularity"], round=r,
                           lengths=wl.lengths, model_size=size,
                           weight_sync_s=res["metrics"]["weight_sync_s"])
                self.steps.append(res)
                per_round.setdefault(mode, []).append(res["metrics"])
                m = res["metrics"]
                self.log(f"[bench] {name} round {r} {mode:<9} rollout→train_end {m['rollout_to_train_end_s']:6.2f}s "
                         f"wait {m['trainer_wait_ratio']:.3f} rollout {m['rollout_end_s']:5.2f}s "
                         f"train {m['trainer_busy_s']:5.2f}s step {m['step_time_s']:5.2f}s")
        self.log(f"[bench] {name}: {time.perf_counter() - t_set:.1f}s")

    def _fgd_granularity(self, name: str, gran_cfg: str, per_round: dict) -> str:
        """FGD runs with the better CGP granularity, decided once per setting on its first round."""
        if name in self.granularity:
            return self.granularity[name]
        # the variants that fix each granularity without FGD (cgp, cgp_group) measured it
        minibatch, group = name_of("cgp", "minibatch"), name_of("cgp", "group")
        if gran_cfg in GRANULARITIES:
            g = gran_cfg
        elif group in self.skipped or not per_round.get(group):
            g = "minibatch"
        else:
            mb = per_round[minibatch][0]["rollout_to_train_end_s"] if per_round.get(minibatch) else math.inf
            gr = per_round[group][0]["rollout_to_train_end_s"]
            g = "group" if gr < mb else "minibatch"
        self.granularity[name] = g
        return g


# ---------------------------------------------------------------------------------------------- results


def build_result(cfg: dict, settings: list[dict], steps: list[dict], skipped_modes: dict[str, str],
                 granularity: dict[str, str], shapes: dict, env: dict, peer_reason: str | None,
                 tr_sim_points: list[float] | None = None, cpu_samples: list[dict] | None = None,
                 stacks: dict[str, dict] | None = None) -> dict:
    """The benchmark JSON from the measured steps (pure, apart from running the simulator).

    ``shapes``: model size -> StepShape; the simulator is calibrated per model size (each size has its own
    engine and trainer costs). ``cpu_samples``: the /proc samples taken while the steps ran (cpu_sampler): each of
    our modes gets the cores per process kind while trainer and engine were both busy, per setting and overall.
    ``stacks``: stack -> its composed config (provenance.stack_record), kept in ``config.stacks`` with the bench
    YAML itself and each mode's step arguments, so the JSON says how every figure in it was made.
    """
    result_settings = []
    for s in settings:
        mine = [st for st in steps if st["setting"] == s["name"]]
        if mine:
            result_settings.append(_setting_result(cfg, s, mine, skipped_modes, granularity, shapes, peer_reason,
                                                   cpu_samples))

    from verl_pipe_lab.bench.report import paper_targets

    sv, fits = validate_per_size(steps, shapes, stacks)
    sim = simulated_section(settings, steps, granularity, shapes, fits, tr_sim_points) if fits else {}
    targets = paper_targets({"settings": result_settings})
    cpu = {}
    if cpu_samples:
        from verl_pipe_lab.bench.cpu_sampler import overlap_cores

        for mode in MODES:
            windows = [st["wall_window"] for st in steps if st["mode"] == mode and st.get("wall_window")]
            if windows:
                cpu[mode] = overlap_cores(cpu_samples, windows)
    return {"settings": result_settings, "sim_validation": sv, "sim": sim, "env": env, "targets": targets,
            "cpu_overlap": cpu,
            "config": {"overrides": cfg.get("overrides", []), "modes": cfg.get("modes", list(MODES)),
                       "warmup_steps": cfg.get("warmup_steps", 1), "interleaved": True,
                       "shapes": {k: v.__dict__ for k, v in shapes.items()},
                       "stacks": stacks or {},
                       "coalesce_log_probs": {k: v.get("coalesce_log_probs") for k, v in (stacks or {}).items()},
                       # session.step's arguments per mode (cgp_fgd's granularity: its entry's, per setting)
                       "mode_args": {m: mode_kwargs(m) for m in MODES},
                       "bench_config": cfg}}


def _setting_result(cfg: dict, s: dict, mine: list[dict], skipped_modes: dict[str, str], granularity: dict[str, str],
                    shapes: dict, peer_reason: str | None, cpu_samples: list[dict] | None) -> dict:
    """One setting's entry of the results from its measured steps (``mine``): per mode its figures (or why it was
    skipped: not run on this setting, or a peer it did not run), the peers' extras, the trainer's cost split, the
    uncontended figures, the cores per process kind, and the granularity each of our modes trained at."""
    name = s["name"]
    per_mode: dict[str, list[dict]] = {}
    for st in sorted(mine, key=lambda st: st["round"]):
        per_mode.setdefault(st["mode"], []).append(st["metrics"])
    skip = dict(skipped_modes)
    for mode in MODES:  # a setting may run a subset (e.g. the FGD window sweep: sync and cgp_fgd)
        if s.get("modes") and mode not in s["modes"]:
            skip.setdefault(mode, f"not run on this setting (its modes: {', '.join(s['modes'])})")
    for peer in PEERS:  # a peer this setting did not run: say so (the bench config's ``peers``)
        if peer not in per_mode and peer_reason:
            skip.setdefault(peer, peer_reason)
    entry = setting_entry(name, per_mode, skip, workload=dict(s["workload"]),
                          model_size=mine[0].get("model_size", cfg.get("model_size", "bench")),
                          role=s.get("role", "sweep"), tr_sweep=bool(s.get("tr_sweep", False)),
                          prompt_len_mean=sum(st["prompt_len"] for st in mine) / len(mine))
    _peer_extras(entry, mine)
    _trainer_cost_split(entry, mine, shapes)
    _uncontended(entry, mine, shapes)
    if cpu_samples:
        _cpu_overlap(entry, mine, cpu_samples)
    for mode, e in entry["modes"].items():  # the granularity where it is chosen, or not mini-batch
        v = variant(mode)
        if "skipped" not in e and v.ours and v.granularity != "minibatch":
            e["granularity"] = v.granularity or granularity.get(name, "minibatch")
    return entry


def _peer_extras(entry: dict, steps: list[dict]) -> None:
    """verl's trainer beside ours: each peer's weight versions (staleness, exactly on-policy or not), what it cannot
    report, and every mode's rollout→train end reduction against the on-policy peer."""
    modes = entry["modes"]
    for peer in PEERS:
        mine = [st for st in steps if st["mode"] == peer]
        if not mine or "skipped" in modes.get(peer, {}):
            continue
        wv = [st.get("weight_versions") or {} for st in mine]
        modes[peer]["max_staleness"] = max(int(w.get("max_staleness", 0)) for w in wv)
        modes[peer]["on_policy"] = all(bool(w.get("on_policy")) for w in wv)
        modes[peer]["unavailable"] = {k: v for st in mine for k, v in (st.get("unavailable") or {}).items()}
        modes[peer]["step_wall_s"] = sum(st["metrics"]["wall_s"] for st in mine) / len(mine)
    ref = modes.get(SEPARATE_ASYNC, {})
    if "rollout_to_train_end_s" in ref:
        for mode, e in modes.items():
            if mode != SEPARATE_ASYNC and "rollout_to_train_end_s" in e:
                e["reduction_vs_verl_separate_async_pct"] = 100.0 * (
                    1.0 - e["rollout_to_train_end_s"] / ref["rollout_to_train_end_s"])


def _cpu_overlap(entry: dict, steps: list[dict], samples: list[dict]) -> None:
    """Each of our modes' cores per process kind while trainer and vLLM engine were both busy, in this setting's
    steps (bench/cpu_sampler.py): what the run's own orchestration takes from them on this host."""
    from verl_pipe_lab.bench.cpu_sampler import overlap_cores

    for mode in MODES:
        e = entry["modes"].get(mode)
        windows = [st["wall_window"] for st in steps if st["mode"] == mode and st.get("wall_window")]
        if e is not None and "skipped" not in e and windows:
            e["cpu_cores_during_overlap"] = overlap_cores(samples, windows)


def _trainer_cost_split(entry: dict, steps: list[dict], shapes: dict) -> None:
    """Each of our modes' trainer cost per 1,000 padded tokens, during and after the rollout (calib.trainer_cost_split):
    what overlapping the rollout costs the trainer on this host."""
    from verl_pipe.sim.calib import trainer_cost_split

    for mode in MODES:
        e = entry["modes"].get(mode)
        mine = [st for st in steps if st["mode"] == mode and st.get("timeline") and st.get("lengths")]
        shape = shapes.get(_size(mine[0])) if mine else None
        if e is not None and "skipped" not in e and shape is not None:
            e["trainer_s_per_1k_padded_tokens"] = trainer_cost_split(mine, shape.micro_rows)


def _uncontended(entry: dict, steps: list[dict], shapes: dict) -> None:
    """Each of our modes' uncontended bound and efficiency (bench/uncontended.py): its trainer work charged at this
    setting's sync rates after the rollout, beside ``pipeline_efficiency``, which charges the mode's own."""
    from verl_pipe_lab.bench.uncontended import mode_uncontended

    sync = [st for st in steps if st["mode"] == BASE and st.get("timeline") and st.get("lengths")]
    shape = shapes.get(_size(sync[0])) if sync else None
    if shape is None:
        return
    for mode in MODES:
        e = entry["modes"].get(mode)
        mine = [st for st in steps if st["mode"] == mode and st.get("timeline") and st.get("lengths")]
        if e is not None and "skipped" not in e and mine:
            e.update(mode_uncontended(mine, sync, shape.micro_rows))


def _size(st: dict) -> str:
    return st.get("model_size", "bench")


def validate_per_size(steps: list[dict], shapes: dict, stacks: dict | None = None) -> tuple[dict, dict]:
    """``sim_validation`` over every model size (each calibrated on its own runs, or with a capped KV pool on the
    engine of an uncapped stack of the same model: ``engine_donors``); returns it and the fits."""
    from verl_pipe.sim.calib import calibrate, sim_validation

    per_size, fits, rows, errors = {}, {}, [], []
    donors = engine_donors(shapes, stacks)
    for size, shape in sorted(shapes.items(), key=lambda kv: kv[0] in donors):  # donors first
        mine = [st for st in steps if _size(st) == size]
        if not mine:
            continue
        donor = donors.get(size)
        try:
            donor_cal = None
            if donor is not None:
                donor_cal = fits.get(donor) or calibrate(
                    [st for st in steps if _size(st) == donor and variant(st["mode"]).ours], shapes[donor])
            sv, fit = sim_validation(mine, shape, engine_donor=donor_cal)
        except ValueError as e:  # too little data to calibrate: say so, keep the schema
            errors.append(f"{size}: {e}")
            continue
        if donor is not None:
            sv["engine_from"] = donor
        fits[size] = fit
        per_size[size] = sv
        rows += [dict(r, model_size=size) for r in sv["rows"]]
    if not per_size:
        return {"max_rel_error": math.nan, "error": "; ".join(errors) or "no measured steps"}, {}
    per_mode: dict[str, dict] = {}
    for r in rows:
        per_mode.setdefault(r["mode"], []).append(r["rel_error"])
    first = next(iter(per_size.values()))
    out = {
        "metric": first["metric"], "target_rel_error": first["target_rel_error"],
        "max_rel_error": max(r["rel_error"] for r in rows),
        "per_mode": {m: {"mean_rel_error": sum(e) / len(e), "max_rel_error": max(e), "settings": len(e)}
                     for m, e in per_mode.items()},
        "rows": rows,
        "calibration": {size: sv["calibration"] for size, sv in per_size.items()},
        "note": first["note"] + "; the simulator is calibrated separately per model size",
    }
    out["within_target"] = bool(out["max_rel_error"] <= out["target_rel_error"])
    holdouts = [sv["holdout_max_rel_error"] for sv in per_size.values() if "holdout_max_rel_error" in sv]
    if holdouts:
        out["holdout_max_rel_error"] = max(holdouts)
    if errors:
        out["errors"] = errors
    borrowed = {size: sv["engine_from"] for size, sv in per_size.items() if "engine_from" in sv}
    if borrowed:
        out["engine_from"] = borrowed
    return out, fits


def simulated_section(settings, steps, granularity, shapes, fits, tr_points) -> dict:
    """The calibrated simulator on each measured setting's workloads, for every mode (peers included), and a
    T/R sweep on the balanced setting's workloads by scaling the trainer's cost."""
    from verl_pipe.sim.calib import simulate_like
    from verl_pipe.core.timeline import summarize
    from verl_pipe.sim.trainer import MODES as SIM_MODES

    any_fit = next(iter(fits.values()))
    out = {"note": ("simulated with the engine and trainer calibrated on this run, per model size "
                    "(sim_validation.calibration); verl_separate_async = the simulator's model of verl's V1 "
                    "separate_async trainer: mini-batches, a ReplayBuffer polled every poll_interval_s (verl's "
                    "default), pi_old kept by CPU model swaps (cost = the measured theta_k snapshot), FCFS dispatch; "
                    "every mode but sync uses the rollout engine fitted beside a busy trainer"),
           "poll_interval_s": any_fit.trainer.params.poll_interval_s, "settings": []}

    def sim_modes(rounds, size, trainer_params, name):
        cal = fits[size]
        ms = {}
        for mode in SIM_MODES:
            gran = granularity.get(name, "minibatch") if variant(mode).granularity is None else "minibatch"
            ms[mode] = summarize([simulate_like(st, mode, gran, cal.engine_for(mode), trainer_params, shapes[size])
                                  for st in rounds])
        return ms

    for s in settings:
        name = s["name"]
        rounds = [st for st in steps if st["setting"] == name and st["mode"] == BASE]
        if not rounds or _size(rounds[0]) not in fits:
            continue
        size = _size(rounds[0])
        modes = sim_modes(rounds, size, fits[size].trainer.params, name)
        base = modes[BASE]["rollout_to_train_end_s"]
        for mode, e in modes.items():
            if mode != BASE:
                e["reduction_vs_sync_pct"] = 100 * (1 - e["rollout_to_train_end_s"] / base)
        out["settings"].append({"name": name, "model_size": size, "sync_train_to_rollout_ratio":
                                modes[BASE]["trainer_busy_s"] / modes[BASE]["rollout_end_s"], "modes": modes})
    balanced = next((s for s in settings if s.get("role") == "balanced"), settings[0] if settings else None)
    rounds = [st for st in steps if balanced and st["setting"] == balanced["name"] and st["mode"] == BASE]
    if tr_points and rounds and _size(rounds[0]) in fits:
        size = _size(rounds[0])
        tp = fits[size].trainer.params
        base_sync = sim_modes(rounds, size, tp, balanced["name"])[BASE]
        tr0 = base_sync["trainer_busy_s"] / base_sync["rollout_end_s"]
        sweep = []
        for target in tr_points:
            ms = sim_modes(rounds, size, tp.with_(time_scale=target / tr0), balanced["name"])
            b = ms[BASE]["rollout_to_train_end_s"]
            sweep.append({"target_tr": target, "time_scale": target / tr0,
                          "sync_train_to_rollout_ratio": ms[BASE]["trainer_busy_s"] / ms[BASE]["rollout_end_s"],
                          "rollout_to_train_end_s": {m: e["rollout_to_train_end_s"] for m, e in ms.items()},
                          "trainer_wait_ratio": {m: e["trainer_wait_ratio"] for m, e in ms.items()},
                          "reduction_vs_sync_pct": {m: 100 * (1 - e["rollout_to_train_end_s"] / b)
                                                    for m, e in ms.items() if m != BASE}})
        out["tr_sweep_setting"] = balanced["name"]
        out["tr_sweep"] = sweep
    return out


def format_sim_section(sim: dict) -> str:
    if not sim.get("settings"):
        return ""
    lines = ["== simulated (calibrated) rollout→train end and reduction vs sync, all modes incl. peers"]
    for s in sim["settings"]:
        cells = []
        for m, e in s["modes"].items():
            red = f" ({e['reduction_vs_sync_pct']:+.1f}%)" if "reduction_vs_sync_pct" in e else ""
            cells.append(f"{m} {e['rollout_to_train_end_s']:.2f}s{red}")
        lines.append(f"  {s['name']} (T/R {s['sync_train_to_rollout_ratio']:.2f}): " + "; ".join(cells))
    for p in sim.get("tr_sweep", []):
        lines.append(f"  sim T/R {p['sync_train_to_rollout_ratio']:.2f}: " + "; ".join(
            f"{m} {v:+.1f}%" for m, v in p["reduction_vs_sync_pct"].items()))
    return "\n".join(lines)


def write_charts(result: dict, steps: list[dict], charts_dir: Path, shapes: dict,
                 chart_setting: str | None) -> list[Path]:
    from verl_pipe_lab.bench.charts import cdf_chart, sweep_chart, timeline_charts

    names = [s["name"] for s in result["settings"]]
    if not names:
        return []
    target = chart_setting if chart_setting in names else next(
        (s["name"] for s in result["settings"] if s.get("role") == "balanced"), names[0])
    targets = [target] + [s["name"] for s in result["settings"] if s.get("role") == "paper" and s["name"] != target]
    paths = []
    for name in targets:  # the balanced setting (or chart_setting) and the paper regime's long-tail setting
        mine = [st for st in steps if st["setting"] == name]
        last_round = max(st["round"] for st in mine)
        chosen = {st["mode"]: st for st in mine if st["round"] == last_round}
        chosen = {m: chosen[m] for m in MODES if m in chosen}
        shape = shapes.get(_size(mine[0]))
        paths += timeline_charts(chosen, charts_dir, name, shape.max_num_seqs if shape else None)
        paths.append(cdf_chart(chosen, charts_dir, name))
    p = sweep_chart(result, charts_dir)
    if p:
        paths.append(p)
    return paths


# ---------------------------------------------------------------------------------------------- CLI


def _parser() -> argparse.ArgumentParser:
    from verl_pipe_lab.bench.commands import listing

    ap = argparse.ArgumentParser(prog="python -m verl_pipe_lab.bench", description=__doc__.split("\n\n")[0],
                                 epilog=listing(), formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="the short run (lab/verl_pipe_lab/bench/conf/quick.yaml)")
    ap.add_argument("--config", help="a bench YAML (default lab/verl_pipe_lab/bench/conf/default.yaml, or quick.yaml with --quick)")
    ap.add_argument("--settings", help="comma-separated setting names to run (default: all in the config)")
    ap.add_argument("--repeats", type=int, help="rounds of the interleaved modes per setting")
    ap.add_argument("--model-size", help="run every chosen setting on this model size (verl_pipe/assets/model.py "
                    "MODEL_SIZES) instead of the config's")
    ap.add_argument("--modes", help="comma-separated subset of the config's modes to run (default: all; sync, the "
                    "baseline every reduction is measured against, must be among them)")
    ap.add_argument("--rotate-stacks", action="store_true", help="the second window of a split comparison "
                    "(lab/verl_pipe_lab/bench/conf/peer_split_*.yaml): verl's trainers on the other side of our stack (the YAML's "
                    "peers_first flipped), each setting's peers in reverse order")
    ap.add_argument("--out", required=True, help="write the results JSON here")
    ap.add_argument("--charts", help="write PNG charts into this folder")
    ap.add_argument("--learn", action="store_true", help="the learning curves instead (lab/verl_pipe_lab/bench/learn.py: "
                    "sync, cgp and cgp_fgd trained from the warm-start, validation accuracy per step and per second)")
    ap.add_argument("--soak", metavar="STEPS", help="the soak benchmark instead (lab/verl_pipe_lab/bench/soak.py: memory and "
                    "step time per step over a long CGP+FGD run)")
    ap.add_argument("--reanalyze", metavar="STEPS_JSON",
                    help="no runs: rebuild the results from a saved *_steps.json (tables, JSON, sim, charts)")
    return ap


def main(argv=None) -> int:
    """``python -m verl_pipe_lab.bench``: a registered command (lab/verl_pipe_lab/bench/commands.py: a name first, e.g.
    ``paired_rounds``, or a flag, ``--soak`` / ``--learn``), else the bench: run (or ``--reanalyze``) the config's
    settings, write the steps file first, then build, print and write the results (and charts). Exit 1 when the
    results do not match the schema."""
    from verl_pipe_lab.bench.commands import chosen_command, run_command

    argv = sys.argv[1:] if argv is None else list(argv)
    chosen = chosen_command(argv)
    if chosen is not None:
        return run_command(*chosen)
    ap = _parser()
    args = ap.parse_args(argv)

    t_start = time.perf_counter()
    cfg, settings, repeats = _bench_config(ap, args)
    peer_reason = peer_status()
    runner = BenchRunner(cfg, repeats)
    settings = _measure(runner, settings, args.reanalyze)
    t_runs = time.perf_counter()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    steps_path = out.with_name(out.stem + "_steps.json")
    if not args.reanalyze:  # first: an analysis that fails can be redone with --reanalyze, without the runs
        with open(steps_path, "w") as f:
            json.dump(runner.dump(), f, default=_json_default)
    result = _analysis(cfg, settings, runner, peer_reason, args)
    elapsed = time.perf_counter() - t_start
    result["elapsed_s"] = {"total": elapsed, "startup": runner.startup_s, "steps": t_runs - t_start - runner.startup_s,
                           "analysis": time.perf_counter() - t_runs, "measured_steps": len(runner.steps)}
    result["steps_file"] = str(args.reanalyze or steps_path)
    problems = _write_result(result, out)
    print(f"[bench] wrote {out}{'' if args.reanalyze else f' and {steps_path}'}; elapsed {elapsed:.1f}s "
          f"(stack start-up {runner.startup_s:.1f}s, {len(runner.steps)} measured steps)")
    return 1 if problems else 0


def _bench_config(ap: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[dict, list[dict], int]:
    """The bench YAML (``--config``, else quick.yaml or default.yaml), the settings chosen from it and the repeats;
    sets VERL_PIPE_CACHE to the repository's cache when the environment has none."""
    cfg_path = Path(args.config) if args.config else CONF_DIR / ("quick.yaml" if args.quick else "default.yaml")
    cfg = load_config(cfg_path)
    settings = _chosen_settings(ap, cfg["settings"], args.settings)
    if args.modes:
        cfg["modes"] = _chosen_modes(ap, list(cfg.get("modes") or MODES), args.modes)
    if args.model_size:
        settings = _on_model_size(ap, cfg, settings, args.model_size)
    if args.rotate_stacks:
        cfg["peers_first"] = not cfg.get("peers_first")
        settings = [dict(s, peers=list(reversed(s["peers"]))) if s.get("peers") else s for s in settings]
    repeats = args.repeats if args.repeats is not None else int(cfg.get("repeats", 1))
    if repeats < 1:
        ap.error("--repeats must be >= 1")
    os.environ.setdefault("VERL_PIPE_CACHE", str(Path(__file__).resolve().parents[3] / ".cache" / "verl_pipe"))
    return cfg, settings, repeats


def _on_model_size(ap: argparse.ArgumentParser, cfg: dict, settings: list[dict], size: str) -> list[dict]:
    """``--model-size``: the config's model size and every chosen setting's become ``size``; a setting on a named
    stack (its own overrides) cannot be moved, and an error names it."""
    from verl_pipe.assets.model import MODEL_SIZES

    if size not in MODEL_SIZES:
        ap.error(f"--model-size {size}: not one of {', '.join(MODEL_SIZES)}")
    stacked = [s["name"] for s in settings if s.get("stack")]
    if stacked:
        ap.error(f"--model-size: setting(s) {', '.join(stacked)} run on a named stack (stacks: in the config)")
    cfg["model_size"] = size
    return [{k: v for k, v in s.items() if k != "model_size"} for s in settings]


def _chosen_modes(ap: argparse.ArgumentParser, config_modes: list[str], arg: str) -> list[str]:
    """The modes ``--modes`` names, in the config's order; an error names any the config does not run, or a
    missing sync baseline."""
    asked = [m.strip() for m in arg.split(",") if m.strip()]
    unknown = [m for m in asked if m not in config_modes]
    if unknown:
        ap.error(f"--modes: {', '.join(unknown)} not in the config's modes ({', '.join(config_modes)})")
    if BASE not in asked:
        ap.error(f"--modes: {BASE} must be among them (the baseline every reduction is measured against)")
    return [m for m in config_modes if m in asked]


def _measure(runner: BenchRunner, settings: list[dict], reanalyze: str | None) -> list[dict]:
    """Fill ``runner`` with the steps: read from the ``reanalyze`` steps file (then only the settings it has steps
    of remain), else run on this machine. Returns the settings the results cover."""
    if reanalyze:
        runner.load(reanalyze)
        return [s for s in settings if any(st["setting"] == s["name"] for st in runner.steps)]
    runner.env = env_info()  # the machine the steps run on, kept in the steps file for --reanalyze
    runner.env["core_pair"] = host_overlap()  # can this host overlap at all (platform/core_pair.py)
    runner.log(f"[bench] host overlap capacity (2.0 = independent cores): compute "
               f"{runner.env['core_pair'].get('compute', {}).get('overlap_capacity')}, memory "
               f"{runner.env['core_pair'].get('memory', {}).get('overlap_capacity')}")
    runner.run(settings)
    return settings


def _analysis(cfg: dict, settings: list[dict], runner: BenchRunner, peer_reason: str,
              args: argparse.Namespace) -> dict:
    """The results from the runner's steps, printed as tables, with the charts written when ``--charts`` asks."""
    result = build_result(cfg, settings, runner.steps, runner.skipped, runner.granularity, runner.shapes,
                          runner.env or env_info(), peer_reason, cfg.get("sim_tr_sweep"), runner.cpu_samples,
                          runner.stacks)
    if args.reanalyze:  # what the reanalysis could not take from the steps file is this machine's, and says so
        result["reanalysis"] = {"steps_file": str(args.reanalyze), "env_from_steps_file": runner.env is not None}
    _print_tables(result)
    if args.charts:
        paths = write_charts(result, runner.steps, Path(args.charts), runner.shapes, cfg.get("chart_setting"))
        result["charts"] = [str(p) for p in paths]
        print(f"[bench] charts: {', '.join(str(p) for p in paths)}")
    return result


def _write_result(result: dict, out: Path) -> list[str]:
    """Write ``result`` to ``out``; returns its schema problems (printed to stderr), empty when none."""
    problems = check_schema(result)
    if problems:
        print("[bench] schema problems:\n  " + "\n  ".join(problems), file=sys.stderr)
    with open(out, "w") as f:
        json.dump(result, f, indent=1, default=_json_default)
    return problems


def _chosen_settings(ap: argparse.ArgumentParser, settings: list[dict], names: str | None) -> list[dict]:
    """The config's settings named in ``--settings`` (comma-separated; all when not given), in the config's order;
    an unknown name is a usage error."""
    if not names:
        return settings
    wanted = [x.strip() for x in names.split(",") if x.strip()]
    unknown = set(wanted) - {s["name"] for s in settings}
    if unknown:
        ap.error(f"unknown settings {sorted(unknown)}; known: {[s['name'] for s in settings]}")
    return [s for s in settings if s["name"] in wanted]


def _print_tables(result: dict) -> None:
    """The results as the console shows them: each setting's table, the T/R sweep, the simulator's validation, the
    paper's targets, the cores per process kind and the simulated section, each when there is one."""
    from verl_pipe_lab.bench.cpu_sampler import format_overlap
    from verl_pipe_lab.bench.report import format_targets

    for s in result["settings"]:
        print(format_setting(s), end="\n\n")
    sweep = format_sweep(result)
    if sweep:
        print(sweep, end="\n\n")
    print(format_sim_validation(result["sim_validation"]), end="\n\n")
    if result.get("targets"):
        print(format_targets(result["targets"]), end="\n\n")
    cpu_txt = format_overlap(result.get("cpu_overlap") or {})
    if cpu_txt:
        print(cpu_txt, end="\n\n")
    sim_txt = format_sim_section(result["sim"])
    if sim_txt:
        print(sim_txt, end="\n\n")


def _json_default(x):
    if hasattr(x, "item"):
        return x.item()
    if isinstance(x, (set, tuple)):
        return list(x)
    raise TypeError(f"not JSON serializable: {type(x)}")

