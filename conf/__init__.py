"""Hydra configs shipped with the package as the subpackage ``verl_pipe.conf`` (this directory is ``conf/`` at the
top of the repository, mapped by pyproject's package-dir): ``rolloutpipe_trainer.yaml`` (the base config, primary
config dir of ``verl_pipe.main_grpo``, ``pkg://verl_pipe.conf``) and ``sim/`` (simulator grids). The benchmark's
settings are the lab's (lab/verl_pipe_lab/bench/conf)."""

from pathlib import Path

# This directory, wherever it is: conf/ in a checkout (an editable install maps verl_pipe.conf there), the
# package's verl_pipe/conf in an installed wheel.
ROOT = Path(__file__).resolve().parent
