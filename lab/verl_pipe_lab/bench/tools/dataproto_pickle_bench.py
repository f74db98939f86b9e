"""What pickling one reward call's DataProto costs with verl's two serialization methods.

    python -m verl_pipe_lab.bench dataproto_pickle_bench

verl's agent loop sends each finished response to a reward worker as a one-row DataProto (AgentLoopWorker.
_compute_score: prompts, responses, input_ids, attention_mask, position_ids and the prompt row's fields); Ray pickles
it in the rollout driver and unpickles it in the reward worker. verl pickles a DataProto by consolidating its
TensorDict and torch.save-ing it, or, with VERL_DATAPROTO_SERIALIZATION_METHOD=numpy (verl's own switch), by sending
each tensor's bytes as a numpy array. This builds such a DataProto (a 35-token prompt, a 90-token response, the
digit-math row's fields), checks that both methods give back the same tensors, and prints the best per-call time of
each over 5 x 500 calls.
"""

from __future__ import annotations

import argparse
import os
import pickle
import timeit

import numpy as np
import torch
from tensordict import TensorDict

from verl import DataProto

METHOD = "VERL_DATAPROTO_SERIALIZATION_METHOD"


def reward_call_dataproto(prompt_len: int = 35, response_len: int = 90) -> DataProto:
    """One row as verl's _compute_score builds it (pad_sequence of one item, the row's fields repeated once)."""
    p, r = torch.arange(prompt_len, dtype=torch.int64), torch.arange(response_len, dtype=torch.int64)
    ids = torch.cat([p, r])
    pad = torch.nn.utils.rnn.pad_sequence
    batch = TensorDict({"prompts": pad([p], batch_first=True), "responses": pad([r], batch_first=True),
                        "attention_mask": pad([torch.ones_like(ids)], batch_first=True),
                        "input_ids": pad([ids], batch_first=True),
                        "position_ids": pad([torch.arange(len(ids))], batch_first=True)}, batch_size=1)
    row = {"raw_prompt": [{"role": "user", "content": "What is 12+30? Answer with the number."}],
           "data_source": "digit_math", "reward_model": {"ground_truth": "42", "style": "rule"},
           "extra_info": {"index": 3, "split": "train"}, "index": 3, "agent_name": "single_turn_agent",
           "tools_kwargs": {}}
    non_tensor = {**{k: np.array([v]) for k, v in row.items()}, "__num_turns__": np.array([2]),
                  "tool_extra_fields": np.array([{"turn_scores": [], "tool_rewards": []}], dtype=object),
                  "prompt_len": np.array([prompt_len]), "response_len": np.array([response_len])}
    return DataProto(batch=batch, non_tensor_batch=non_tensor)


def time_method(data: DataProto, method: str | None, number: int = 500, repeat: int = 5) -> dict:
    """Best per-call pickle and unpickle seconds with ``method`` (None: verl's default, torch.save)."""
    if method is None:
        os.environ.pop(METHOD, None)
    else:
        os.environ[METHOD] = method
    blob = pickle.dumps(data, protocol=5)
    back = pickle.loads(blob)
    same = all(torch.equal(back.batch[k], data.batch[k]) and back.batch[k].dtype == data.batch[k].dtype
               for k in data.batch.keys()) and set(back.non_tensor_batch) == set(data.non_tensor_batch)
    dump_s = min(timeit.repeat(lambda: pickle.dumps(data, protocol=5), number=number, repeat=repeat)) / number
    load_s = min(timeit.repeat(lambda: pickle.loads(blob), number=number, repeat=repeat)) / number
    return {"pickle_us": dump_s * 1e6, "unpickle_us": load_s * 1e6, "bytes": len(blob), "round_trip_equal": same}


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(prog="python -m verl_pipe_lab.bench dataproto_pickle_bench",
                            description=__doc__.split("\n\n")[0]).parse_args(argv)  # no arguments: --help
    data = reward_call_dataproto()
    print(f"load average {os.getloadavg()[0]:.1f}")
    for method in (None, "numpy"):
        r = time_method(data, method)
        print(f"{method or 'torch (default)':16s} pickle {r['pickle_us']:7.1f} us  unpickle {r['unpickle_us']:7.1f} us"
              f"  {r['bytes']} bytes  round trip equal: {r['round_trip_equal']}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
