"""Runnable recipes: Hydra configs (``*.yaml``, found with ``--config-name <recipe>`` through the search-path
plugin in ``hydra_plugins/verl_pipe_searchpath``), their launch scripts, and the worked extension example.

This directory is ``recipes/`` at the top of the repository; pyproject's package-dir installs it as the subpackage
``verl_pipe.recipes`` (with its YAML and shell files as package data), so an installed verl_pipe, not only a
checkout, runs them.
"""
