"""Entry point: ``python -m verl_pipe.main_grpo [hydra overrides]``.

With no arguments it trains the embedded tiny CPU default: a 2-layer Qwen3, a local tokenizer and a synthetic digit-math
set, built and cached on first run, with a real vLLM engine on one core and verl's FSDP2 actor on the other. The
launcher itself is verl_pipe/launch/ (launcher.py: the run; prepare.py: the config's checks and assets; ray_start.py).
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from verl_pipe.launch.prepare import CONF_MODULE, DEFAULT_RECIPE


@hydra.main(config_path=f"pkg://{CONF_MODULE}", config_name=DEFAULT_RECIPE, version_base=None)
def main(config: DictConfig) -> None:
    from verl_pipe.launch.launcher import launch

    launch(config)


if __name__ == "__main__":
    main()
