"""Every private Ray API verl_pipe touches, listed and checked against the installed Ray (pyproject bounds Ray to the
release this list was checked on: ray[default]>=2.60,<2.61). A test fails when one of them moves (gone, renamed,
its parameters changed), and another when the code uses a private Ray API this list does not name."""

import importlib
import importlib.util
import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# (module, attribute path, parameters it must take (None: not called), where we use it)
PRIVATE = [
    ("ray.experimental.internal_kv", "_internal_kv_put", ("key", "value", "overwrite", "namespace"),
     "verl_pipe/launch/stop_request.py: the stop request in the GCS"),
    ("ray.experimental.internal_kv", "_internal_kv_exists", ("key", "namespace"), "verl_pipe/launch/stop_request.py"),
    ("ray.experimental.internal_kv", "_internal_kv_del", ("key", "namespace"), "verl_pipe/launch/stop_request.py"),
    ("ray._private.state", "available_resources_per_node", (), "verl_pipe/rollout/placement.py: can a restart fit"),
    ("ray._private.state", "actors", (), "tests/e2e/test_multinode.py: the GCS's actor table"),
    ("ray.util.collective.collective", "_group_mgr._name_group_map", None,
     "verl_pipe/platform/nccl_engine.py: a group taken out of Ray's GroupManager"),
    ("ray.util.collective.collective", "_group_mgr_lock", None, "verl_pipe/platform/nccl_engine.py"),
    ("ray._raylet", "GcsClient", None, "tools/local_ray_cluster.py: the GCS's node table (a Cython class: "
                                       "GcsClient(address=...), checked below)"),
    ("ray._raylet", "InnerGcsClient.get_all_node_info", None, "tools/local_ray_cluster.py (GcsClient forwards to it)"),
    ("ray._private.authentication.authentication_token_setup", "maybe_enable_token_auth_if_token_available",
     ("warn_if_disabled",), "tools/local_ray_cluster.py: token auth as ray.init does"),
]
# NCCLGroup cannot be imported without cupy (no GPU here): its source must still define what nccl_engine.py uses.
NCCL_GROUP = ("ray.util.collective.collective_group.nccl_collective_group", "NCCLGroup",
              ("def _destroy_store", "def _generate_group_key", "self._dev_comm_map"))
# Ray's own actor methods and attributes (double underscore, not documented): defined in ray/actor.py.
ACTOR_DUNDERS = ("__ray_call__", "__ray_actor_class__")
# What counts as a private Ray use in our code, and the names the list above covers.
PATTERN = re.compile(r"ray\._private(?:\.[\w.]+)?|ray\._raylet|_internal_kv_\w+|_group_mgr\w*|_name_group_map|"
                     r"_dev_comm_map|_destroy_store|_generate_group_key|__ray_call__|__ray_actor_class__")
COVERED = {"_internal_kv_put", "_internal_kv_exists", "_internal_kv_del", "_group_mgr", "_group_mgr_lock",
           "_name_group_map", "_dev_comm_map", "_destroy_store", "_generate_group_key", "__ray_call__",
           "__ray_actor_class__", "ray._raylet", "ray._private.state", "ray._private.authentication",
           "ray._private.authentication.authentication_token_setup"}


def _resolve(module: str, path: str):
    obj = importlib.import_module(module)
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


@pytest.mark.parametrize("module, path, params, where", PRIVATE, ids=[f"{m}.{p}" for m, p, _, _ in PRIVATE])
def test_each_private_ray_api_we_use_is_there(module, path, params, where):
    obj = _resolve(module, path)
    if params is not None:
        have = set(inspect.signature(obj).parameters)
        assert set(params) <= have, f"{module}.{path} ({where}) takes {sorted(have)}, not {params}"


def test_ncclgroup_still_has_what_the_recoverable_sync_uses():
    module, cls, needles = NCCL_GROUP
    source = Path(importlib.util.find_spec(module).origin).read_text()
    body = source.split(f"class {cls}", 1)[1]
    for needle in needles:
        assert needle in body, f"{module}.{cls}: no {needle!r} (verl_pipe/platform/nccl_engine.py uses it)"


def test_gcs_client_takes_an_address():
    """Cython (no signature to read; constructing one connects): its constructor's argument parsing refuses a
    keyword it does not know before it connects, and names its one positional argument."""
    from ray._raylet import GcsClient

    with pytest.raises(TypeError, match="at least 1 positional argument"):
        GcsClient(addresss="127.0.0.1:1")
    assert "InnerGcsClient" in (GcsClient.__doc__ or "")


def test_rays_actor_dunders_are_there():
    import ray.actor

    source = inspect.getsource(ray.actor)
    assert "def __ray_call__" in source and "__ray_actor_class__" in source


def test_the_installed_ray_is_the_bounded_release():
    import ray
    from packaging.requirements import Requirement

    try:
        import tomllib
    except ImportError:  # Python 3.10
        from pip._vendor import tomli as tomllib
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (req,) = [Requirement(d) for d in deps if Requirement(d).name == "ray"]
    assert req.specifier.contains(ray.__version__), f"Ray {ray.__version__} outside pyproject's {req.specifier}"
    upper = [s for s in req.specifier if s.operator == "<"]
    assert upper, f"pyproject's Ray requirement {req} has no upper bound: a newer Ray may move the private APIs"


def test_no_private_ray_api_is_used_without_being_listed():
    found: dict[str, set[str]] = {}
    for top in ("verl_pipe", "tools", "tests/e2e", "recipes"):
        for f in (ROOT / top).rglob("*.py"):
            for m in PATTERN.finditer(f.read_text()):
                found.setdefault(m.group(0), set()).add(str(f.relative_to(ROOT)))
    unlisted = {name: sorted(files) for name, files in found.items()
                if name not in COVERED and not any(name.startswith(c + ".") for c in COVERED)
                and not name.startswith("ray._private.state.")}
    assert not unlisted, f"private Ray APIs used but not in tests/test_ray_private_api.py's list: {unlisted}"
