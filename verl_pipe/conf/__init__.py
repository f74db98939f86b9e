"""Hydra configs shipped with the package: ``rolloutpipe_trainer.yaml`` (the base config, primary config dir of
``verl_pipe.main_grpo``, ``pkg://verl_pipe.conf``), ``bench/`` (benchmark settings) and ``sim/`` (simulator grids)."""
