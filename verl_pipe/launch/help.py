"""``python -m verl_pipe.main_grpo --help``: the user's recipes and config groups, not the project's internal ones.

Hydra's own help lists every config group on the search path, ours included: ``bench`` and ``sim`` (the benchmark's
and the simulator's settings, conf/) and ``lib`` (files the recipes include, recipes/lib/) are no configuration a run
picks. This help lists the recipes (``--config-name``, with each file's first line), verl's config groups (found in
verl's config directory without importing verl: seconds, not the verl import's), and where the settings are;
``--hydra-help`` still gives Hydra's.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

# Config groups on the search path that are the project's own machinery, not a run's choice.
INTERNAL_GROUPS = ("bench", "sim", "lib")
HELP_FLAGS = ("--help", "-h")


def wants_help(argv: list[str]) -> bool:
    return any(a in HELP_FLAGS for a in argv)


BASE_CONFIG = "rolloutpipe_trainer"
SUMMARY_CHARS = 80


def summary(header_line: str, limit: int = SUMMARY_CHARS) -> str:
    """A recipe header's first line, shortened to whole words within ``limit`` characters."""
    text = header_line.lstrip("# ").removeprefix("Recipe: ").split(" (")[0].rstrip(":,. ")
    if len(text) <= limit:
        return text
    return text[:limit - 4].rsplit(" ", 1)[0].rstrip(":,") + " ..."


def recipes() -> dict[str, str]:
    """Each recipe (``--config-name``) with the first line of its file's header; the base config too."""
    from verl_pipe import recipes as recipes_pkg

    out = {BASE_CONFIG: "the base config the recipes extend: verl's ppo_trainer with verl_pipe's keys"}
    for f in sorted(Path(recipes_pkg.__file__).parent.glob("*.yaml")):
        out[f.stem] = summary(next((line for line in f.read_text().splitlines() if line.startswith("#")), "#"))
    return out


def _group_dirs(root: Path) -> dict[str, list[str]]:
    return {d.name: sorted(f.stem for f in d.glob("*.yaml")) for d in sorted(root.iterdir())
            if d.is_dir() and any(d.glob("*.yaml"))}


def config_groups() -> dict[str, list[str]]:
    """The config groups a run may pick from (group -> options): verl's (its ppo_trainer's config directory) and any of
    ours that is not internal (``INTERNAL_GROUPS``)."""
    from verl_pipe import conf
    from verl_pipe import recipes as recipes_pkg

    groups: dict[str, list[str]] = {}
    spec = importlib.util.find_spec("verl")  # locates verl without importing it (torch, tensordict: seconds)
    if spec is not None and spec.submodule_search_locations:
        verl_conf = Path(list(spec.submodule_search_locations)[0]) / "trainer" / "config"
        if verl_conf.is_dir():
            groups.update(_group_dirs(verl_conf))
    for root in (conf.ROOT, Path(recipes_pkg.__file__).parent):
        for name, options in _group_dirs(root).items():
            if name not in INTERNAL_GROUPS:
                groups.setdefault(name, []).extend(o for o in options if o not in groups.get(name, []))
    return groups


def help_text(default_recipe: str) -> str:
    width = max(len(n) for n in recipes())
    lines = [
        "verl_pipe: GRPO on verl with the rollout (vLLM) and the trainer (verl's FSDP actor) on separate pools,",
        "pipelined: complete groups train while the rollout still generates.",
        "",
        "Usage: python -m verl_pipe.main_grpo [--config-name RECIPE] [key=value ...]",
        "",
        f"Recipes (--config-name RECIPE; default {default_recipe}):",
        *(f"  {name:<{width}}  {what}" for name, what in recipes().items()),
        "",
        "Config groups (group=option), verl's:",
        *(f"  {group}: {', '.join(options)}" for group, options in config_groups().items()),
        "",
        "Settings (key=value): verl's keys as verl's main_ppo takes them (data.*, actor_rollout_ref.*, algorithm.*,",
        "trainer.*; rollout.nnodes / rollout.n_gpus_per_node size the rollout pool as in verl's separated trainers)",
        "and verl_pipe's under rolloutpipe.* (conf/rolloutpipe_trainer.yaml says what each does). Every key and value",
        "is checked before anything is built or started; a wrong one is named with what is allowed.",
        "",
        "  --cfg job      print the composed config and exit",
        "  --hydra-help   Hydra's own options",
    ]
    return "\n".join(lines)
