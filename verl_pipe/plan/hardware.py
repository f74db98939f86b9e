"""Hardware profiles and model shapes: what one GPU and one model cost, with where each figure comes from.

Every figure carries a tag, as docs/sim_sources.md does: ``measured`` (on the hardware named, §8: the H200),
``published`` (a vendor or public figure, cited there), ``derived`` (arithmetic on the others) or ``assumed``.
The planner prints the tags next to its prediction, so a user sees which part of it rests on a measurement.
A profile builds the simulator's own parameter classes (``EngineParams``, ``TrainerParams``); nothing here
simulates.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from verl_pipe.sim.engine import EngineParams
from verl_pipe.sim.trainer import TrainerParams, placement_costs

GB = 1e9


@dataclass(frozen=True)
class Fig:
    v: float
    tag: str  # measured | published | derived | assumed
    src: str = ""


@dataclass(frozen=True)
class ModelShape:
    name: str
    params: float  # all parameters (embeddings included): the bytes a dense model's decode step reads, and what
    #                the trainer holds (fp32 weights, Adam, theta_k) and the weight sync sends
    non_embedding_params: float  # N in the FLOP model (a mixture of experts: the parameters active per token)
    layers: int  # layers with softmax attention (a KV cache and L^2 attention FLOPs)
    hidden: int  # the attention width (query heads x head_dim) of the attention FLOP model
    kv_heads: int
    head_dim: int
    src: str = ""
    # A mixture of experts (0 experts: dense). A decode step reads the dense part and the routed experts its batch
    # touches: of E experts, k per token, a batch of b touches E * (1 - (1 - k/E)^b) of them per layer [D].
    experts: int = 0
    experts_per_token: int = 0
    routed_expert_params: float = 0.0  # all routed experts, all layers
    state_bytes_per_seq: float = 0.0  # linear-attention (recurrent) state per sequence, read and written per step
    attention_heads: int = 0  # query heads (0: not given); tensor parallelism splits them evenly

    @property
    def kv_bytes_per_token(self) -> float:  # K and V, bf16
        return 2 * self.layers * self.kv_heads * self.head_dim * 2


@dataclass(frozen=True)
class MoEEngineParams(EngineParams):
    """Decode of a mixture-of-experts model (``ModelShape.experts``): a step of ``b`` running sequences reads the
    dense weights and the routed experts the batch touches, not every expert. ``weight_bytes`` stays the whole
    model (what a full batch reads) for what else reads it."""

    dense_bytes: float = 0.0
    expert_bytes: float = 0.0
    experts: int = 1
    experts_per_token: int = 1

    def weight_read_bytes(self, batch: int) -> float:
        touched = 1.0 - (1.0 - self.experts_per_token / self.experts) ** max(1, batch)
        return self.dense_bytes + self.expert_bytes * touched

    def step_time(self, batch: int, ctx_sum: float, prefill_tokens: float = 0.0) -> float:
        return (self.t0_s + self.per_seq_s * batch + (self.weight_read_bytes(batch) + ctx_sum * self.kv_bytes_per_token)
                / self.bw_eff_Bps + prefill_tokens * self.prefill_flops_per_token / self.prefill_flops_per_s)


# Public configs (HF model cards / config.json); sim_sources.md §3 derives the KV bytes of the dense ones and §10
# every figure of the mixture of experts, each tagged published / derived / assumed there.
MODELS = {
    "qwen3-1.7b": ModelShape("Qwen3-1.7B", 2.03e9, 1.72e9, 28, 2048, 8, 128,
                             "docs/sim_sources.md §3: 2.03B params, 28 layers, 8 KV heads, head_dim 128"),
    "qwen3-4b": ModelShape("Qwen3-4B", 4.02e9, 3.6e9, 36, 2560, 8, 128,
                           "docs/sim_sources.md §3: KV 147,456 B/token = 36 layers x 8 KV heads x 128"),
    # 35B total, 3B active [published]; 256 routed experts, 8 per token [published]; 10 softmax-attention layers
    # of 40 (3:1 Gated DeltaNet) [published]; 2 KV heads x 256, 16 query heads [assumed: Qwen3-Next's]; routed
    # experts 33.0B of the 35B [derived from total, active and 8/256]; DeltaNet state 30 MB/sequence [assumed]
    "qwen3.5-35b-a3b": ModelShape("Qwen3.5-35B-A3B", 35e9, 3e9, 10, 16 * 256, 2, 256,
                                  "docs/sim_sources.md §10 (published / derived / assumed per figure)",
                                  experts=256, experts_per_token=8, routed_expert_params=32e9 / (1 - 8 / 256),
                                  state_bytes_per_seq=30e6),
}


def shape_from_config(name: str, c: dict, src: str) -> ModelShape:
    """A dense decoder-only transformer's shape from its config.json values (Qwen2/Qwen3/Llama layout: q, k, v and o
    projections, a gated MLP of three matrices, input embeddings and an LM head, tied or not). Norms and biases (a
    few million parameters) are left out."""
    try:
        layers, hidden = int(c["num_hidden_layers"]), int(c["hidden_size"])
        heads = int(c["num_attention_heads"])
        kv = int(c.get("num_key_value_heads") or heads)
        head_dim = int(c.get("head_dim") or hidden // heads)
        inter, vocab = int(c["intermediate_size"]), int(c["vocab_size"])
    except KeyError as e:
        raise ValueError(f"{src}: no {e.args[0]!r}; the planner models decoder-only transformers "
                         "(Qwen/Llama-style config.json)") from None
    attn = hidden * head_dim * (heads + 2 * kv) + heads * head_dim * hidden
    non_emb = layers * (attn + 3 * hidden * inter)
    emb = vocab * hidden * (1 if c.get("tie_word_embeddings") else 2)
    return ModelShape(name, non_emb + emb, non_emb, layers, heads * head_dim, kv, head_dim, src,
                      attention_heads=heads)


def _hf(repo: str) -> str:
    return f"huggingface.co/{repo}/blob/main/config.json (docs/plan.md, Model shapes)"


# The public config.json values of the dense models verl users train (docs/plan.md lists them with their sources):
# layers, hidden, attention heads, KV heads, head_dim (None: hidden / heads), intermediate, vocab, tied embeddings.
_CONFIGS = {
    "Qwen2.5-0.5B": (24, 896, 14, 2, None, 4864, 151936, True),
    "Qwen2.5-1.5B": (28, 1536, 12, 2, None, 8960, 151936, True),
    "Qwen2.5-3B": (36, 2048, 16, 2, None, 11008, 151936, True),
    "Qwen2.5-7B": (28, 3584, 28, 4, None, 18944, 152064, False),
    "Qwen2.5-14B": (48, 5120, 40, 8, None, 13824, 152064, False),
    "Qwen2.5-32B": (64, 5120, 40, 8, None, 27648, 152064, False),
    "Qwen3-0.6B": (28, 1024, 16, 8, 128, 3072, 151936, True),
    "Qwen3-8B": (36, 4096, 32, 8, 128, 12288, 151936, False),
    "Qwen3-14B": (40, 5120, 40, 8, 128, 17408, 151936, False),
    "Qwen3-32B": (64, 5120, 64, 8, 128, 25600, 151936, False),
    "Llama-3-8B": (32, 4096, 32, 8, None, 14336, 128256, False),
    "Llama-3-70B": (80, 8192, 64, 8, None, 28672, 128256, False),
}
_REPOS = {"Llama-3-8B": "meta-llama/Meta-Llama-3-8B", "Llama-3-70B": "meta-llama/Meta-Llama-3-70B"}
for _name, (_l, _h, _a, _kv, _hd, _i, _v, _tie) in _CONFIGS.items():
    MODELS[_name.lower()] = shape_from_config(_name, {
        "num_hidden_layers": _l, "hidden_size": _h, "num_attention_heads": _a, "num_key_value_heads": _kv,
        "head_dim": _hd, "intermediate_size": _i, "vocab_size": _v, "tie_word_embeddings": _tie},
        _hf(_REPOS.get(_name, f"Qwen/{_name}")))
# the same shapes under the names their variants are published as
ALIASES = {"qwen2.5-math-1.5b": "qwen2.5-1.5b", "qwen2.5-math-7b": "qwen2.5-7b", "deepseek-r1-distill-qwen-1.5b":
           "qwen2.5-1.5b", "deepseek-r1-distill-qwen-7b": "qwen2.5-7b", "deepseek-r1-distill-qwen-14b": "qwen2.5-14b",
           "deepseek-r1-distill-qwen-32b": "qwen2.5-32b", "meta-llama-3-8b": "llama-3-8b",
           "meta-llama-3-70b": "llama-3-70b", "llama-3.1-8b": "llama-3-8b", "llama-3.1-70b": "llama-3-70b",
           "meta-llama-3.1-8b": "llama-3-8b", "meta-llama-3.1-70b": "llama-3-70b", "llama-3.3-70b": "llama-3-70b"}
_SUFFIXES = ("-instruct", "-base", "-chat", "-it", "-instruct-2507", "-thinking-2507")


def _by_name(path: str) -> ModelShape | None:
    key = Path(str(path).rstrip("/")).name.lower()
    for k in [key] + [key[:-len(s)] for s in _SUFFIXES if key.endswith(s)]:
        k = ALIASES.get(k, k)
        if k in MODELS:
            return MODELS[k]
    return None


def model_shape(path: str) -> ModelShape:
    """The model's shape from its local config.json when the path exists, else by name from ``MODELS`` (a published
    variant's suffix, -Instruct, -Base, ..., and the aliases of ``ALIASES`` find the same shape)."""
    cfg = Path(str(path)).expanduser() / "config.json"
    if cfg.is_file():
        c = json.loads(cfg.read_text())
        return shape_from_config(Path(str(path)).name, c.get("text_config") or c, str(cfg))
    got = _by_name(path)
    if got is not None:
        return got
    raise ValueError(f"actor_rollout_ref.model.path={path}: no config.json there and not a model the planner "
                     f"knows by name ({', '.join(m.name for m in MODELS.values())}); point the path at a local "
                     "copy of the model (only its config.json is read)")


@dataclass(frozen=True)
class Hardware:
    name: str
    mem_bytes: Fig
    hbm_Bps: Fig
    bf16_flops: Fig  # dense
    decode_t0_s: Fig  # fixed cost of one decode step
    bw_eff: Fig  # share of the HBM bandwidth a decode step reaches
    prefill_mfu: Fig
    train_mfu: Fig  # forward + backward with recompute
    logprob_ratio: Fig  # old-log-prob forward / training, per token
    optimizer_step_s_per_bparam: Fig  # AdamW step per 1e9 fp32 params, one GPU (sharded: an upper bound)
    microbatch_overhead_s: Fig
    pinned_Bps: Fig
    pageable_save_Bps: Fig
    pageable_restore_Bps: Fig
    pageable_opt_save_Bps: Fig
    device_copy_s_per_GB: Fig
    device_swap_s_per_GB: Fig
    notes: tuple[str, ...] = field(default_factory=tuple)
    # tensor parallelism: two all-reduces per layer per decode step (attention and MLP outputs), at small batch a
    # latency, not a bandwidth, cost
    tp_allreduce_s: Fig = Fig(10e-6, "assumed", "one NVLink all-reduce of a decode step's activations, ~10 us")
    # verl's colocated hybrid engine (verl_pipe/sim/colocated.py): the engines' sleep after the rollout, and the
    # weights' reload into them after the update (verl's timing_s/update_weights), per byte of bf16 weights
    engine_sleep_s: Fig = Fig(0.5, "assumed", "vLLM sleep level 2 (drain, free weights and KV cache): sub-second "
                                             "to seconds (vLLM blog 2025-10-26, Sleep Mode); docs/plan.md")
    weight_reload_Bps: Fig = Fig(15.23e9 / 10.72, "derived",
                                 "verl fully_async README, colocate sync Qwen2.5-Math-7B on 128 H20: step 356.30 s - "
                                 "gen 177.85 - old_log_prob 53.92 - update_actor 113.81 = 10.72 s for the reload "
                                 "(and reward, advantages: an upper bound) of 15.23 GB bf16; docs/plan.md")

    def figures(self) -> dict[str, dict]:
        return {k: {"value": v.v, "tag": v.tag, "source": v.src} for k, v in vars(self).items() if isinstance(v, Fig)}

    # ---- the simulator's parameters ------------------------------------------------------------------------
    def engine(self, m: ModelShape, *, max_num_seqs: int, max_num_batched_tokens: int,
               gpu_memory_utilization: float, activations_bytes: float = 2 * GB, tp: int = 1,
               resident_bytes: float = 0.0) -> EngineParams:
        """One replica of ``tp`` GPUs (vLLM's ``tensor_model_parallel_size``): the weights and the KV cache split over
        them, so a step reads ``tp`` GPUs' bandwidth, plus two all-reduces per layer. ``resident_bytes``: what else
        holds each GPU's memory while the engine runs (a colocated trainer's states: the engine gets at most what is
        left)."""
        weights = 2 * m.params  # bf16
        util = min(gpu_memory_utilization, 1.0 - resident_bytes / self.mem_bytes.v - 0.05)
        pool = tp * (self.mem_bytes.v * util - activations_bytes) - weights  # sim_sources.md §3 [A]
        if pool <= 0:
            tp_hint = next((t for t in (2, 4, 8) if t > tp and t * (self.mem_bytes.v * util - activations_bytes)
                            > 1.25 * weights), None)
            raise ValueError(
                f"actor_rollout_ref.rollout.gpu_memory_utilization={gpu_memory_utilization}"
                + (f" (beside the colocated trainer's {resident_bytes / GB:.1f} GB per GPU)" if resident_bytes else "")
                + f", tensor_model_parallel_size={tp}: {m.name}'s bf16 weights ({weights / GB:.1f} GB) leave no KV "
                f"cache on {tp} x {self.mem_bytes.v / GB:.0f} GB {self.name}"
                + (f"; set actor_rollout_ref.rollout.tensor_model_parallel_size={tp_hint}" if tp_hint else ""))
        bw = tp * self.bw_eff.v * self.hbm_Bps.v
        t0 = self.decode_t0_s.v + (2 * m.layers * self.tp_allreduce_s.v if tp > 1 else 0.0)
        kw = dict(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                  kv_capacity_tokens=int(pool / m.kv_bytes_per_token), kv_bytes_per_token=m.kv_bytes_per_token,
                  weight_bytes=weights, t0_s=t0, bw_eff_Bps=bw,
                  per_seq_s=2 * m.state_bytes_per_seq / bw,  # a recurrent state is read and written each step
                  prefill_flops_per_token=2 * m.non_embedding_params,
                  prefill_flops_per_s=tp * self.prefill_mfu.v * self.bf16_flops.v)
        if not m.experts:
            return EngineParams(**kw)
        experts = 2 * m.routed_expert_params
        return MoEEngineParams(**kw, dense_bytes=weights - experts, expert_bytes=experts, experts=m.experts,
                               experts_per_token=m.experts_per_token)

    def check_tp(self, m: ModelShape, tp: int, rollout_gpus: int) -> None:
        """vLLM splits the attention heads over the TP ranks, and a replica's GPUs come from the rollout pool."""
        if tp < 1 or rollout_gpus % tp:
            raise ValueError(f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp}: must divide the "
                             f"{rollout_gpus} rollout GPUs (whole replicas)")
        if m.attention_heads and m.attention_heads % tp:
            raise ValueError(f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp}: {m.name}'s "
                             f"{m.attention_heads} attention heads do not split evenly over {tp} GPUs")

    def check_trainer_fits(self, m: ModelShape, gpus: int, what: str = "trainer.n_gpus_per_node") -> None:
        """FSDP's fp32 weights, gradients and Adam states (16 B/param), sharded over the trainer's GPUs, with 15% of
        each GPU left for activations (gradient checkpointing) [assumed]: else refused, naming why."""
        need = 16 * m.params / gpus
        if need > 0.85 * self.mem_bytes.v:
            k = math.ceil(16 * m.params / (0.85 * self.mem_bytes.v))
            raise ValueError(f"{what}: {m.name}'s FSDP states (fp32 weights, gradients, Adam: 16 B/param = "
                             f"{16 * m.params / GB:.0f} GB) need {need / GB:.0f} GB on each of {gpus} "
                             f"{self.name} GPUs ({self.mem_bytes.v / GB:.0f} GB); at least {k} trainer GPUs (verl's "
                             "param / optimizer offload is not modelled)")

    def colocated_resident_bytes(self, m: ModelShape, gpus: int) -> float:
        """What verl's colocated trainer keeps on each GPU while the engines run (no offload, verl's default): fp32
        weights and Adam's two moments (12 B/param, sharded; the gradients are freed after the optimizer step)."""
        return 12 * m.params / gpus

    def colocated(self, m: ModelShape) -> dict:
        """verl's hybrid engine's costs per step (``sim.colocated.ColocatedParams`` fields): the engines' sleep and the
        weights' reload (resume, gather, copy; verl's timing_s/update_weights)."""
        return {"sleep_s": self.engine_sleep_s.v, "update_weights_s": 2 * m.params / self.weight_reload_Bps.v}

    def theta_k_figures(self, m: ModelShape, checkpoint_on_failure: bool = True) -> dict:
        """``sim.trainer.placement_costs``' input for this model: fp32 master weights and Adam's m and v."""
        return {"param_bytes": 4 * m.params, "opt_bytes": 8 * m.params, "checkpoint_on_failure": checkpoint_on_failure,
                "pageable_save_Bps": self.pageable_save_Bps.v, "pageable_restore_Bps": self.pageable_restore_Bps.v,
                "pageable_opt_save_Bps": self.pageable_opt_save_Bps.v, "pinned_Bps": self.pinned_Bps.v,
                "measured_param_bytes": GB, "device_snapshot_s": self.device_copy_s_per_GB.v,
                "device_swap_s": self.device_swap_s_per_GB.v}

    def trainer(self, m: ModelShape, *, gpus: int, recompute: bool, max_tokens_per_microbatch: int, use_ref: bool,
                placement: str) -> TrainerParams:
        f = self.theta_k_figures(m)
        verl = placement_costs("pageable", gpus, f)  # verl's separate_async keeps pi_old with save_model_to_cpu
        return TrainerParams(
            num_gpus=gpus, flops_per_s_per_gpu=self.train_mfu.v * self.bf16_flops.v, efficiency=1.0,
            linear_flops_per_token=(8 if recompute else 6) * m.non_embedding_params,
            attn_flops_coef=8 * m.layers * m.hidden, microbatch_overhead_s=self.microbatch_overhead_s.v,
            max_tokens_per_microbatch=max_tokens_per_microbatch, call_overhead_s=0.0,
            logprob_ratio=self.logprob_ratio.v, use_ref=use_ref,
            optimizer_step_s=self.optimizer_step_s_per_bparam.v * m.params / 1e9,
            **placement_costs(placement, gpus, f),
            verl_swap_save_s=verl["swap_save_s"], verl_swap_restore_s=verl["swap_restore_s"])

    def trainer_mem_fits_device_store(self, m: ModelShape, gpus: int) -> bool:
        """Whether θ_k and the optimizer's rollback copy fit on the trainer GPUs beside the model's own states
        (fp32 weights, gradients, Adam: 16 B/param, sharded), leaving theta_store's 25% margin for activations."""
        need = (16 + 12) * m.params / gpus
        return need <= 0.75 * self.mem_bytes.v


def _h200() -> Hardware:
    s8 = "docs/sim_sources.md §8 (one H200, Qwen3-1.7B shape)"
    return Hardware(
        name="h200",
        mem_bytes=Fig(141 * GB, "published", "NVIDIA H200 SXM: 141 GB HBM3e"),
        hbm_Bps=Fig(4.8e12, "published", "NVIDIA H200 SXM: 4.8 TB/s"),
        bf16_flops=Fig(989e12, "published", "dense bf16, the H100's (sim_sources.md §8)"),
        decode_t0_s=Fig(3.0e-3, "derived", "sim_sources.md §3: midpoint of 2.5-3.4 ms (H100, H20 anchors)"),
        bw_eff=Fig(0.8, "assumed", "sim_sources.md §3"),
        prefill_mfu=Fig(0.4, "assumed", "sim_sources.md §7"),
        train_mfu=Fig(0.33, "measured", s8 + ": train fwd+bwd with recompute 19-22k tok/s"),
        logprob_ratio=Fig(0.26, "measured", s8 + ": old-log-prob 75-85k tok/s vs 19-22k"),
        optimizer_step_s_per_bparam=Fig(0.015 / 1.72, "measured", s8 + ": AdamW over 1.72B fp32 params 15 ms"),
        microbatch_overhead_s=Fig(0.1, "published", "sim_sources.md §4: ThunderSyncRL ~0.09-0.16 s per micro-batch"),
        pinned_Bps=Fig(55e9, "measured", s8 + ": 6.9 GB in 0.125 s"),
        pageable_save_Bps=Fig(1.23e9, "measured", s8 + ": 6.9 GB in 5.61 s"),
        pageable_restore_Bps=Fig(6.70e9, "measured", s8 + ": 6.9 GB in 1.03 s"),
        pageable_opt_save_Bps=Fig(1.27e9, "measured", s8 + ": 13.8 GB in 10.90 s"),
        device_copy_s_per_GB=Fig(0.004 / 6.9, "measured", s8 + ": 6.9 GB device snapshot 4 ms"),
        device_swap_s_per_GB=Fig(0.012 / 6.9, "measured", s8 + ": swap live <-> frozen 12 ms (upper bound)"),
        notes=("trainer and copy costs measured on one H200; the decode model's constants are public-figure "
               "derivations (sim_sources.md §3), not measured on an H200",),
    )


def _h100() -> Hardware:
    h = _h200()
    a = "assumed: the H200's measured figure (same compute die, PCIe Gen5 host link)"
    return Hardware(
        name="h100",
        mem_bytes=Fig(80 * GB, "published", "NVIDIA H100 SXM: 80 GB"),
        hbm_Bps=Fig(3.35e12, "published", "sim_sources.md §3: H100 SXM 3.35 TB/s"),
        bf16_flops=Fig(989e12, "published", "sim_sources.md §3: 989 TF bf16 dense"),
        decode_t0_s=h.decode_t0_s, bw_eff=h.bw_eff, prefill_mfu=h.prefill_mfu,
        train_mfu=Fig(0.33, "assumed", a), logprob_ratio=Fig(0.26, "assumed", a),
        optimizer_step_s_per_bparam=Fig(h.optimizer_step_s_per_bparam.v, "assumed", a),
        microbatch_overhead_s=h.microbatch_overhead_s,
        pinned_Bps=Fig(55e9, "assumed", a), pageable_save_Bps=Fig(1.23e9, "assumed", a),
        pageable_restore_Bps=Fig(6.70e9, "assumed", a), pageable_opt_save_Bps=Fig(1.27e9, "assumed", a),
        device_copy_s_per_GB=Fig(h.device_copy_s_per_GB.v * 4.8 / 3.35, "derived", "H200's, scaled by HBM bandwidth"),
        device_swap_s_per_GB=Fig(h.device_swap_s_per_GB.v * 4.8 / 3.35, "derived", "H200's, scaled by HBM bandwidth"),
        notes=("no figure measured on an H100: public bandwidth and FLOP rate, the H200's measured efficiencies",),
    )


def _a100() -> Hardware:
    h = _h200()
    gen4 = "assumed: half the H200's measured pinned rate (PCIe Gen4 vs Gen5)"
    return Hardware(
        name="a100",
        mem_bytes=Fig(80 * GB, "published", "NVIDIA A100 SXM 80 GB"),
        hbm_Bps=Fig(2.039e12, "published", "NVIDIA A100 SXM 80 GB: 2,039 GB/s"),
        bf16_flops=Fig(312e12, "published", "NVIDIA A100: 312 TF bf16 dense"),
        decode_t0_s=Fig(3.0e-3, "assumed", "the H100/H20 figure (sim_sources.md §3)"), bw_eff=h.bw_eff,
        prefill_mfu=h.prefill_mfu,
        train_mfu=Fig(0.33, "assumed", "the H200's measured MFU"),
        logprob_ratio=Fig(0.26, "assumed", "the H200's measured ratio"),
        optimizer_step_s_per_bparam=Fig(h.optimizer_step_s_per_bparam.v * 4.8 / 2.039, "derived",
                                        "H200's, scaled by HBM bandwidth (AdamW is memory-bound)"),
        microbatch_overhead_s=h.microbatch_overhead_s,
        pinned_Bps=Fig(27.5e9, "assumed", gen4),
        pageable_save_Bps=Fig(1.23e9, "assumed", "the H200's (host-bound)"),
        pageable_restore_Bps=Fig(6.70e9 / 2, "assumed", gen4),
        pageable_opt_save_Bps=Fig(1.27e9, "assumed", "the H200's (host-bound)"),
        device_copy_s_per_GB=Fig(h.device_copy_s_per_GB.v * 4.8 / 2.039, "derived", "H200's, scaled by HBM bandwidth"),
        device_swap_s_per_GB=Fig(h.device_swap_s_per_GB.v * 4.8 / 2.039, "derived", "H200's, scaled by HBM bandwidth"),
        notes=("no figure measured on an A100: public bandwidth and FLOP rate, the H200's measured efficiencies",),
    )


_BY_HBM = "H200's, scaled by HBM bandwidth"


def _gh200(mem_gb: float = 96, hbm_tbps: float = 4.0, name: str = "gh200", memory: str = "96 GB HBM3") -> Hardware:
    """The Hopper GPU of a GH200 Grace Hopper superchip: the H100's compute die, its own memory; the host link is
    NVLink-C2C (900 GB/s) instead of PCIe, which the copy rates below do not credit (the H200's PCIe figures: a
    conservative bound)."""
    h = _h200()
    a = "assumed: the H200's measured figure (same compute die)"
    host = "assumed: the H200's measured PCIe Gen5 rate; NVLink-C2C (900 GB/s) is faster: an upper bound on the time"
    return Hardware(
        name=name,
        mem_bytes=Fig(mem_gb * GB, "published", f"NVIDIA GH200 Grace Hopper: {memory} (docs/plan.md)"),
        hbm_Bps=Fig(hbm_tbps * 1e12, "published", f"NVIDIA GH200 Grace Hopper: {hbm_tbps:g} TB/s (docs/plan.md)"),
        bf16_flops=Fig(989e12, "published", "GH200's Hopper GPU: the H100's 989 TF bf16 dense (docs/plan.md)"),
        decode_t0_s=h.decode_t0_s, bw_eff=h.bw_eff, prefill_mfu=h.prefill_mfu,
        train_mfu=Fig(0.33, "assumed", a), logprob_ratio=Fig(0.26, "assumed", a),
        optimizer_step_s_per_bparam=Fig(h.optimizer_step_s_per_bparam.v * 4.8 / hbm_tbps, "derived",
                                        "H200's, scaled by HBM bandwidth (AdamW is memory-bound)"),
        microbatch_overhead_s=h.microbatch_overhead_s,
        pinned_Bps=Fig(55e9, "assumed", host), pageable_save_Bps=Fig(1.23e9, "assumed", host),
        pageable_restore_Bps=Fig(6.70e9, "assumed", host), pageable_opt_save_Bps=Fig(1.27e9, "assumed", host),
        device_copy_s_per_GB=Fig(h.device_copy_s_per_GB.v * 4.8 / hbm_tbps, "derived", _BY_HBM),
        device_swap_s_per_GB=Fig(h.device_swap_s_per_GB.v * 4.8 / hbm_tbps, "derived", _BY_HBM),
        notes=(f"no figure measured on a {name.upper()}: public memory, bandwidth and FLOP rate, the H200's measured "
               "efficiencies; host copies at the H200's PCIe rates (NVLink-C2C is faster)",),
    )


def _b200() -> Hardware:
    h = _h200()
    a = "assumed: the H200's measured efficiency"
    return Hardware(
        name="b200",
        mem_bytes=Fig(180 * GB, "published", "NVIDIA HGX B200: 180 GB HBM3e per GPU (docs/plan.md)"),
        hbm_Bps=Fig(8.0e12, "published", "NVIDIA HGX B200: 8 TB/s per GPU (docs/plan.md)"),
        bf16_flops=Fig(2250e12, "published", "NVIDIA HGX B200 (1,000 W): 2,250 TF bf16 dense (docs/plan.md)"),
        decode_t0_s=Fig(3.0e-3, "assumed", "the H100/H20 figure (sim_sources.md §3)"), bw_eff=h.bw_eff,
        prefill_mfu=h.prefill_mfu,
        train_mfu=Fig(0.33, "assumed", a), logprob_ratio=Fig(0.26, "assumed", a),
        optimizer_step_s_per_bparam=Fig(h.optimizer_step_s_per_bparam.v * 4.8 / 8.0, "derived",
                                        "H200's, scaled by HBM bandwidth (AdamW is memory-bound)"),
        microbatch_overhead_s=h.microbatch_overhead_s,
        pinned_Bps=Fig(55e9, "assumed", "the H200's measured PCIe Gen5 rate (B200 has Gen6: an upper bound on time)"),
        pageable_save_Bps=Fig(1.23e9, "assumed", "the H200's (host-bound)"),
        pageable_restore_Bps=Fig(6.70e9, "assumed", "the H200's (host-bound)"),
        pageable_opt_save_Bps=Fig(1.27e9, "assumed", "the H200's (host-bound)"),
        device_copy_s_per_GB=Fig(h.device_copy_s_per_GB.v * 4.8 / 8.0, "derived", "H200's, scaled by HBM bandwidth"),
        device_swap_s_per_GB=Fig(h.device_swap_s_per_GB.v * 4.8 / 8.0, "derived", "H200's, scaled by HBM bandwidth"),
        notes=("no figure measured on a B200: public memory, bandwidth and FLOP rate, the H200's measured "
               "efficiencies (MFU 0.33 may not carry over to Blackwell)",),
    )


PROFILES = {"h200": _h200, "h100": _h100, "a100": _a100, "gh200": _gh200,
            "gh200-144g": lambda: _gh200(144, 4.9, "gh200-144g", "144 GB HBM3e"),
            "b200": _b200}


def profile(name: str) -> Hardware:
    try:
        return PROFILES[name.lower()]()
    except KeyError:
        raise ValueError(f"--hardware {name}: no such profile; choose {', '.join(PROFILES)}, or fit one from a "
                         "real run with --calibrate RUN_DIR (a verl log: --calibrate-verl-log LOG)") from None


def weight_sync_s(m: ModelShape, one_node: bool) -> tuple[float, str]:
    """bf16 weights over NCCL: NVLink within a node (100 GB/s [A]), 8.25 GB/s across nodes (sim_sources.md §6)."""
    bw = 100e9 if one_node else 8.25e9
    return 2 * m.params / bw, (f"derived: {2 * m.params / GB:.2f} GB bf16 at {bw / GB:g} GB/s "
                               f"({'NVLink in one node [assumed]' if one_node else 'across nodes, sim_sources.md §6'})")
