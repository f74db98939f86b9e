"""Hydra SearchPathPlugin: lets ``--config-name <recipe>`` find verl's configs and our recipes.

Hydra imports every module under the ``hydra_plugins`` namespace package and calls each
``SearchPathPlugin`` (Hydra's own plugin discovery, not a verl seam; the package ships
``hydra_plugins/`` next to ``verl_pipe/``). It appends, after the primary config dir
(``pkg://verl_pipe.conf``, where ``rolloutpipe_trainer.yaml`` lives):

- ``pkg://verl.trainer.config``: verl's ``ppo_trainer`` that ``rolloutpipe_trainer.yaml`` extends.
  Hydra accepts ``hydra.searchpath`` only in the *primary* config and refuses it in any config
  loaded from a defaults list ("Overriding hydra.searchpath is only supported from the primary
  config"). A recipe is the primary config and lists ``rolloutpipe_trainer`` in its defaults, so
  neither file may set ``hydra.searchpath``; the plugin provides verl's path for every config instead.
- ``pkg://verl_pipe.recipes``: the recipes (``recipes/`` in the checkout, installed as the subpackage
  ``verl_pipe.recipes`` by pyproject's package-dir, as ``conf/`` is as ``verl_pipe.conf``), so that, from any
  directory,

    python -m verl_pipe.main_grpo --config-name qwen3_1p7b_gsm8k_4x4

  and ``verl_pipe.launch.session.compose([], config_name="qwen3_1p7b_gsm8k_4x4")`` both work.

Only ``pkg://`` paths: a ``file://`` path next to the package exists in a checkout only.
Appended, not prepended: a recipe never shadows a config of the same name in the primary dir.
"""

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin

VERL_CONFIG = "pkg://verl.trainer.config"
RECIPES = "pkg://verl_pipe.recipes"


class VerlPipeSearchPathPlugin(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        search_path.append(provider="verl_pipe", path=VERL_CONFIG)
        search_path.append(provider="verl_pipe-recipes", path=RECIPES)
