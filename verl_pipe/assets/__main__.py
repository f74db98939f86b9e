"""``python -m verl_pipe.assets [hydra overrides]``: build and cache the base config's assets (tokenizer, model,
digit-math data) and its SFT warm-start, as ``python -m verl_pipe.main_grpo --config-name rolloutpipe_trainer`` would
before it trains; prints where. ``make assets`` runs it, so the first test does not pay the build (the tests compose
the base config; the demo's chain recipe builds its own warm-start on its first run)."""

import sys


def main(argv: list[str]) -> int:
    from verl_pipe.launch.prepare import prepare_config
    from verl_pipe.launch.session import compose

    config = prepare_config(compose(argv))
    print(f"model: {config.actor_rollout_ref.model.path}\ntrain: {config.data.train_files}\n"
          f"val: {config.data.val_files}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
