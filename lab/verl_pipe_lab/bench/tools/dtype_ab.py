"""Side by side: the quick bench's sync step with the trainer in fp32 (the CPU default) and in bf16 mixed
precision, on the same stack sizing, workload and cores. Prints per-step rollout and train time.

    .venv/bin/python -m verl_pipe_lab.bench dtype_ab [--steps 2] [--out ab.json]

To see the AVX2-only path on a CPU that has AMX/AVX512_BF16, run it with
``ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 ATEN_CPU_CAPABILITY=avx2`` and a separate
``TORCHINDUCTOR_CACHE_DIR`` (kernels that vLLM's sampler compiles under the capped ISA must not land in the
shared inductor cache: later normal runs' vLLM workers aborted on them). The one-second matmul probe printed
first tells which path the processes get; Ray's workers inherit the launcher's environment.
"""

import argparse
import json
import time

import yaml

BF16 = ["actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bf16",
        "actor_rollout_ref.ref.fsdp_config.mixed_precision.param_dtype=bf16"]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m verl_pipe_lab.bench dtype_ab",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=2, help="measured sync steps per dtype (after one warm-up)")
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--out")
    args = ap.parse_args(argv)

    from verl_pipe_lab.bench.settings import CONF_DIR
    from verl_pipe.platform.cpu_info import report
    from verl_pipe.launch.session import PipeSession, compose

    env = report()
    print("[ab] cpu", json.dumps(env))
    with open(CONF_DIR / "quick.yaml") as f:
        quick = yaml.safe_load(f)
    setting = next(s for s in quick["settings"] if s.get("role") == "balanced")
    out = {"env": env, "setting": setting["name"], "dtypes": {}}
    for dtype in args.dtypes.split(","):
        t0 = time.perf_counter()
        cfg = compose(quick["overrides"] + [f"rolloutpipe.tiny_assets.size={quick['model_size']}",
                                            "trainer.default_local_dir=/tmp/verl_pipe_ab_ckpt"]
                      + (BF16 if dtype == "bf16" else []))
        session = PipeSession(cfg)
        startup = time.perf_counter() - t0
        try:
            session.step(mode="sync", workload={"kind": "equal", "length": 8})  # vLLM warm-up
            steps = []
            for r in range(args.steps):
                rec = session.step(mode="sync", workload={**setting["workload"], "seed": r})
                tm = rec["timeline"]
                steps.append({"rollout_s": round(tm["rollout_end_s"], 2),
                              "train_s": round(tm["trainer_busy_s"], 2),
                              "step_s": round(tm["step_time_s"], 2),
                              "prob_diff_max": rec["metrics"].get("training/rollout_probs_diff_max")})
                print(f"[ab] {dtype} step {r}: {steps[-1]}", flush=True)
        finally:
            session.close()
        out["dtypes"][dtype] = {"startup_s": round(startup, 1), "steps": steps}
    print("[ab] result", json.dumps(out["dtypes"]))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
