"""Runnable recipes: Hydra configs (``*.yaml``, found with ``--config-name <recipe>`` through the search-path
plugin in ``hydra_plugins/verl_pipe_searchpath``), their launch scripts, and the worked extension example.

They ship inside the package (package data) so an installed verl_pipe, not only a checkout, runs them.
"""
