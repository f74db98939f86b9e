"""Do the rollout's samples come from the trainer's weights in every mode? One live stack of the tiny default
(``PipeSession``), a step per mode named on the command line; after each, the mean and max |vLLM log-prob - trainer
old log-prob at θ_k| over the step's response tokens (both fp32 on CPU: ~1e-6 when vLLM serves θ_k), and the
step's mean reward.

    VERL_PIPE_CACHE=.cache/verl_pipe .venv/bin/python -m verl_pipe_lab.bench logprob_gap_check \
        sync,sync,cgp,cgp,cgp,sync,sync
"""

import argparse

from verl_pipe.launch.session import PipeSession, compose


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m verl_pipe_lab.bench logprob_gap_check",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("modes", help="comma-separated modes, one step each, in this order (e.g. sync,cgp,sync)")
    modes = ap.parse_args(argv).modes.split(",")
    cfg = compose(["trainer.total_training_steps=1000", "trainer.test_freq=-1", "trainer.val_before_train=false",
                   "trainer.default_local_dir=/tmp/logprob_gap_check"])
    session = PipeSession(cfg)
    try:
        for mode in modes:
            rec = session.step(mode=mode)
            batch = session.trainer.last_outcome.batch
            mask = batch.batch["response_mask"].bool()
            gap = (batch.batch["rollout_log_probs"] - batch.batch["old_log_probs"]).abs()[mask]
            print("GAP", mode, session.trainer.global_steps, (float(gap.mean()), float(gap.max())),
                  rec["metrics"].get("critic/score/mean"), flush=True)
    finally:
        session.close()


if __name__ == "__main__":
    main()
