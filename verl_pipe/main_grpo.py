"""Entry point: ``python -m verl_pipe.main_grpo [--config-name RECIPE] [hydra overrides]`` (``--help``: the recipes).

With no arguments it trains the chain recipe (recipes/tiny_cpu_chain.yaml): a 2-layer Qwen3, a local tokenizer and a
synthetic task, built and cached on first run, with a real vLLM engine on one core and verl's FSDP2 actor on the other.
The launcher is verl_pipe/launch/: prepare.py (the config's checks, then the assets), ray_start.py, launcher.py (the
run and its stop), help.py.
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from verl_pipe.launch.prepare import CONF_MODULE, DEFAULT_RECIPE


@hydra.main(config_path=f"pkg://{CONF_MODULE}", config_name=DEFAULT_RECIPE, version_base=None)
def _run(config: DictConfig) -> None:
    from verl_pipe.launch.launcher import launch

    launch(config)


def main() -> None:
    from verl_pipe.launch.help import help_text, wants_help

    if wants_help(sys.argv[1:]):  # the user's recipes and config groups (Hydra's own: --hydra-help)
        print(help_text(DEFAULT_RECIPE))
        return
    _run()


if __name__ == "__main__":
    main()
