"""What verl's DataProto -> TensorDict conversion and its pickling cost per unit, with all the rollout's non-tensor
columns and with only those verl's actor worker reads (docs/cpu.md, cut 7; ``trainer_seam.for_actor_worker``).

    python -m verl_pipe_lab.bench to_tensordict_bench [--rows 32] [--columns 14] [--repeats 20]

A unit-shaped DataProto (rows x 600 prompt+response tokens, the trainer's tensors) with ``--columns`` object columns
like the rollout's (prompts, reward-model entries, uids, agent-loop fields); best of ``--repeats``.
"""

from __future__ import annotations

import argparse
import pickle
import time

import numpy as np
import torch


def best_ms(fn, repeats: int) -> float:
    fn()
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return min(out) * 1e3


def main(argv=None) -> int:
    from verl import DataProto

    from verl_pipe.trainer import RolloutPipeTrainer
    from verl_pipe.trainer.seam import for_actor_worker

    ap = argparse.ArgumentParser(prog="python -m verl_pipe_lab.bench to_tensordict_bench",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--columns", type=int, default=14)
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args(argv)
    n = args.rows
    tensors = {k: torch.zeros(n, 600, dtype=torch.long) for k in ("input_ids", "attention_mask", "position_ids")}
    tensors.update({k: torch.zeros(n, 512) for k in ("responses", "response_mask", "old_log_probs", "advantages",
                                                     "rollout_log_probs", "token_level_rewards")})
    columns = {f"col{i}": np.array([{"i": j} if i % 3 == 0 else str(j) for j in range(n)], dtype=object)
               for i in range(args.columns - 1)}
    columns["multi_modal_inputs"] = np.array([{} for _ in range(n)], dtype=object)
    full = DataProto.from_dict(tensors=tensors, non_tensors=columns, meta_info={"temperature": 1.0})
    sent = for_actor_worker(full, RolloutPipeTrainer.actor_non_tensor_keys)
    for name, dp in (("all columns", full), ("the worker's columns", sent)):
        td = dp.to_tensordict()
        blob = pickle.dumps(td)
        convert = best_ms(dp.to_tensordict, args.repeats)
        dump = best_ms(lambda: pickle.dumps(td), args.repeats)  # noqa: B023 (called here, in this iteration)
        load = best_ms(lambda: pickle.loads(blob), args.repeats)  # noqa: B023
        print(f"{name:22s} ({len(dp.non_tensor_batch):2d} non-tensor): to_tensordict {convert:6.2f} ms, "
              f"pickle {dump:6.2f} ms, unpickle {load:6.2f} ms ({n} rows)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
