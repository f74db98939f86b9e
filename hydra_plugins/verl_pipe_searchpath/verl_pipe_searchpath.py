"""Hydra SearchPathPlugin: lets ``--config-name <recipe>`` find the configs in the repo's ``recipes/``.

Hydra imports every module under the ``hydra_plugins`` namespace package and calls each
``SearchPathPlugin``. This one appends, after the primary config dir (``conf/``):

- ``pkg://verl.trainer.config``: verl's ``ppo_trainer`` that ``conf/rolloutpipe_trainer.yaml``
  extends. Hydra accepts ``hydra.searchpath`` only in the *primary* config and refuses it in any
  config loaded from a defaults list ("Overriding hydra.searchpath is only supported from the
  primary config"). A recipe is the primary config and lists ``rolloutpipe_trainer`` in its
  defaults, so neither file may set ``hydra.searchpath``; the plugin provides verl's path for
  every config instead.
- the repo's ``recipes/`` (next to the installed ``verl_pipe`` package), so that

    python -m verl_pipe.main_grpo --config-name qwen3_1p7b_gsm8k_4x4

  and ``verl_pipe.session.compose([], config_name="qwen3_1p7b_gsm8k_4x4")`` both work.

Appended, not prepended: a recipe never shadows a config of the same name in ``conf/``.
"""

from pathlib import Path

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin

VERL_CONFIG = "pkg://verl.trainer.config"


def recipes_dir() -> Path:
    import verl_pipe

    return Path(verl_pipe.__file__).resolve().parent.parent / "recipes"


class VerlPipeSearchPathPlugin(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        search_path.append(provider="verl_pipe", path=VERL_CONFIG)
        path = recipes_dir()
        if path.is_dir():  # a non-editable install has no recipes/ next to the package
            search_path.append(provider="verl_pipe-recipes", path=f"file://{path}")
