"""The README is a manual (issue 38): at most 200 lines, its migration diff from a verl ``main_ppo`` GRPO command is
real (the old side composes as verl's own ``ppo_trainer`` config, the new side composes and validates as ours, and
every verl key the diff keeps means the same on both sides), and the knobs table names keys that exist with the
defaults it states. A README edit that breaks any of it fails here, so the manual cannot rot."""

import os
import re
import shlex
from functools import lru_cache

import pytest
from omegaconf import OmegaConf

from tests.checkout import ROOT
from verl_pipe.config import validate
from verl_pipe.launch.session import compose

README = ROOT / "README.md"
MAX_LINES = 200
MIGRATION = "## From a verl `main_ppo` GRPO recipe"
KNOBS = "## The knobs that matter"


def section(title: str) -> str:
    text = README.read_text()
    assert title in text, f"README.md: no section {title!r}"
    body = text.split(title, 1)[1]
    return body.split("\n## ", 1)[0]


def diff_block() -> list[str]:
    (block,) = re.findall(r"```diff\n(.*?)```", section(MIGRATION), re.S)
    return block.splitlines()


def argv(lines: list[str], home: str = "/home/user") -> list[str]:
    """A shell command written over several lines with trailing backslashes, as a list of arguments."""
    command = " ".join(line.rstrip().removesuffix("\\") for line in lines)
    return shlex.split(command.replace("$HOME", home))


def sides(home: str = "/home/user") -> tuple[list[str], list[str]]:
    lines = diff_block()
    assert all(line[:1] in "-+ " for line in lines), "a diff line must start with '-', '+' or ' '"
    old = argv([line[1:] for line in lines if line[:1] in "- "], home)
    new = argv([line[1:] for line in lines if line[:1] in "+ "], home)
    return old, new


@lru_cache(maxsize=None)
def default_config():
    return compose([])


def overrides(args: list[str]) -> dict[str, str]:
    return dict(a.split("=", 1) for a in args)


def test_the_readme_is_at_most_200_lines():
    n = len(README.read_text().splitlines())
    assert n <= MAX_LINES, f"README.md has {n} lines; the manual keeps to {MAX_LINES} (measurements: docs/results.md)"


def test_the_readme_opens_with_what_it_is_and_the_two_commands():
    """The title, what it is in a few lines, then the two commands of a fresh machine (main job, tests); the
    contributors' `make check` further down."""
    text = README.read_text()
    head = text.split("```", 2)
    assert head[0].startswith("# verl_pipe") and head[0].count("\n") <= 6
    commands = [line.split("#")[0].strip() for line in head[1].splitlines()[1:] if line.strip()]
    assert commands == ["make demo", "make test"]
    assert "make check" in text.split("## ", 1)[1]


def test_the_old_side_is_a_verl_main_ppo_grpo_command():
    old, _ = sides()
    assert old[:3] == ["python3", "-m", "verl.trainer.main_ppo"]
    cfg = compose(old[3:], config_name="ppo_trainer")  # verl's own config: Hydra refuses a key it does not have
    assert cfg.algorithm.adv_estimator == "grpo"
    assert cfg.actor_rollout_ref.hybrid_engine is True  # verl's default: actor and rollout share the GPUs


def test_the_new_side_composes_and_validates(tmp_path):
    old, new = sides(home=str(tmp_path))
    assert new[:3] == ["python", "-m", "verl_pipe.main_grpo"] and new[3] == "--config-name"
    recipe, args = new[4], new[5:]
    assert (ROOT / "recipes" / f"{recipe}.yaml").is_file(), recipe
    cfg = compose(args, config_name=recipe)
    # the data files as verl's preprocessing writes them under $HOME (empty here: only their paths are checked)
    for key in ("data.train_files", "data.val_files"):
        path = OmegaConf.select(cfg, key)
        assert str(path).startswith(str(tmp_path)), key
        os.makedirs(os.path.dirname(path), exist_ok=True)
        open(path, "wb").close()
    validate(cfg)  # the model is a Hugging Face hub id, which the check accepts
    assert cfg.rolloutpipe.mode == "cgp" and cfg.rolloutpipe.platform == "gpu" and cfg.trainer.device == "cuda"
    assert cfg.actor_rollout_ref.hybrid_engine is False
    # the 8 GPUs verl shared between rollout and training are split between the two pools
    verl = compose(old[3:], config_name="ppo_trainer")
    pools = cfg.trainer.n_gpus_per_node + cfg.actor_rollout_ref.rollout.n_gpus_per_node
    assert pools == verl.trainer.n_gpus_per_node * verl.trainer.nnodes


def test_every_verl_key_the_diff_keeps_means_the_same_on_both_sides():
    old, new = sides()
    kept = overrides(argv([line[1:] for line in diff_block() if line.startswith(" ")])).keys()
    assert len(kept) >= 10 and kept <= overrides(old[3:]).keys() & overrides(new[5:]).keys()
    a = compose(old[3:], config_name="ppo_trainer")
    b = compose(new[5:], config_name=new[4])
    for key in sorted(kept):
        assert OmegaConf.select(a, key) == OmegaConf.select(b, key), key


def knob_rows() -> list[tuple[str, str]]:
    """(key, default) for every key the knobs table names; a row may name several (``a.b.c``, ``.d``: ``a.b.d``)."""
    out = []
    for line in section(KNOBS).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("| `") or len(cells) < 3:
            continue
        keys = re.findall(r"`([\w.]+)`", cells[0])
        defaults = re.findall(r"`([^`]*)`", cells[1])
        assert len(keys) == len(defaults), line
        full = []
        for k in keys:
            full.append(full[-1].rsplit(".", 1)[0] + k if k.startswith(".") else k)
        out += list(zip(full, defaults))
    return out


def test_the_knobs_table_names_real_keys_with_their_defaults():
    rows = knob_rows()
    assert len(rows) >= 10 and {k for k, _ in rows} >= {"rolloutpipe.mode", "rolloutpipe.fgd.enable",
                                                        "rolloutpipe.cgp.granularity", "rolloutpipe.platform"}
    cfg = default_config()
    for key, default in rows:
        parent, leaf = key.rsplit(".", 1)
        node = OmegaConf.select(cfg, parent)
        assert node is not None and leaf in node, f"README knobs table: {key} is not a config key"
        assert str(OmegaConf.to_yaml({"v": node[leaf]})).strip() in (f"v: {default}", f"v: '{default}'"), \
            f"README knobs table: {key} defaults to {node[leaf]!r}, the table says {default!r}"


@pytest.mark.parametrize("key", sorted(set(re.findall(r"rolloutpipe(?:\.\w+)+", README.read_text()))))
def test_every_rolloutpipe_key_the_readme_names_exists(key):
    cfg = default_config()
    parent, leaf = key.rsplit(".", 1)
    node = OmegaConf.select(cfg, parent)
    assert node is not None and leaf in node, f"README.md names {key}, which the config does not have"


def slug(heading: str) -> str:
    """GitHub's anchor of a markdown heading: lower case, punctuation dropped (but - and _), spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {slug(m) for m in re.findall(r"^#+ (.+)$", text, re.M)}


@pytest.mark.parametrize("doc", ["README.md", "docs/results.md", "docs/layout.md"])
def test_every_relative_link_resolves(doc):
    """The manual and the pages it sends readers to: every relative link names a file that exists, and an anchor that
    one of its headings makes."""
    page = ROOT / doc
    bad = []
    for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists() or (anchor and dest.suffix == ".md" and anchor not in anchors(dest)):
            bad.append(target)
    assert bad == [], f"{doc}: links that do not resolve: {bad}"


@pytest.mark.parametrize("doc", ["README.md", "docs/results.md", "docs/layout.md"])
def test_every_repository_path_named_exists(doc):
    """A file or folder of the repository named in the manual or its pages (`recipes/...`, `tests/test_x.py`) exists."""
    from tests.test_figures_doc import missing, named_paths

    metric_names = {"verl_pipe/digit_math/acc/mean"}  # a validation metric's key (…/mean@1), not a path
    named = [p for p in named_paths((ROOT / doc).read_text()) if p not in metric_names]
    assert missing(named) == [], f"{doc} names paths that do not exist"
