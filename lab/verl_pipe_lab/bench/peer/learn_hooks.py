"""The learning bench's peer trainer: the speed bench's PeerSeparateAsyncTrainer that also records verl's
validations and the training loop's wall-clock (peer/learn.py). The runner (runner.py) imports it by the spec's
``trainer_cls`` after start_ray, as it does the hooks.

PeerLearnTrainer subclasses the speed bench's PeerSeparateAsyncTrainer (which subclasses verl's); every override
calls super() and only records times and results: ``_validate`` (verl's validation, before training and every
test_freq steps), ``on_train_begin`` (the training loop's start) and ``_compute_metrics`` (once per step, after the
step's validation: the step's record gets a ``learn`` entry, see learn.learn_rows).
"""

from __future__ import annotations

import time

from verl_pipe_lab.bench.peer.hooks import PeerSeparateAsyncTrainer


def _floats(metrics: dict) -> dict:
    out = {}
    for k, v in metrics.items():
        try:
            out[k] = float(v)
        except (TypeError, ValueError):
            pass
    return out


class PeerLearnTrainer(PeerSeparateAsyncTrainer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._train_t0: float | None = None
        self._val_before: dict | None = None
        self._val_s_total = 0.0
        self._step_val: tuple[dict, float] | None = None

    def _validate(self):
        start = time.time()
        out = super()._validate()
        seconds = time.time() - start
        if self._train_t0 is None:  # fit's val_before_train
            self._val_before = _floats(out)
            print(f"[peer] validation before training ({seconds:.1f}s): {self._val_before}", flush=True)
        else:
            self._val_s_total += seconds
            self._step_val = (_floats(out), seconds)
        return out

    def on_train_begin(self):
        self._train_t0 = time.time()
        return super().on_train_begin()

    def _compute_metrics(self, batch, metrics, timing_raw, global_steps, epoch):
        out = super()._compute_metrics(batch, metrics, timing_raw, global_steps=global_steps, epoch=epoch)
        rec = self.peer_records[-1]  # the record super() just made (the runner's list holds the same dict)
        val, val_s = self._step_val or (None, None)
        rec["learn"] = {"t_end": time.time(), "train_t0": self._train_t0, "val_s_total": self._val_s_total,
                        "val": val, "val_s": val_s,
                        "val_before": self._val_before if len(self.peer_records) == 1 else None}
        if val is not None:
            print(f"[peer] step {global_steps} validation ({val_s:.1f}s): "
                  f"{ {k: v for k, v in val.items() if k.startswith('val-core/')} }", flush=True)
        self._step_val = None
        return out
