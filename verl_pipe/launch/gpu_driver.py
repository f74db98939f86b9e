"""The NVIDIA driver of a GPU run's launcher node can run the CUDA build of the installed torch.

PyPI's torch 2.13.0 (constraints/gpu.txt) is the CUDA 13.0 build, and vLLM 0.29.0 and cupy-cuda13x follow it.
CUDA 13 needs an NVIDIA driver >= 580 and no longer supports GPUs before Turing (compute capability < 7.5); the
CUDA 12 set (constraints/gpu-cu12.txt, torch 2.10.0 for CUDA 12.8) needs NVIDIA's CUDA 12 floor, 525.60.13.
Without this check an old driver surfaces only when a worker first touches CUDA, as a bare "driver too old"
error inside Ray, after the model is loaded; here the launcher stops before Ray starts, naming the minimum
and the alternatives (docs/install.md).

The driver version comes from ``nvidia-smi`` (with each GPU's compute capability), else from
``/proc/driver/nvidia/version`` (the loaded kernel module's, there with or without nvidia-smi). Neither
readable means no driver on this node; that passes with a warning only when no GPU is expected here either
(a launcher on a GPU-less head node of a Ray cluster: the GPU nodes are not checked from here), and is an error
when one is (``/dev/nvidia<N>`` exists, or ``CUDA_VISIBLE_DEVICES`` names a device). A torch without CUDA
(``torch.version.cuda`` is None) has nothing to check.
"""

from __future__ import annotations

import os
import re
import subprocess
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from verl_pipe.errors import ConfigError  # not verl_pipe.config: no omegaconf on a torch-only machine (the doctor)

# NVIDIA's minimum Linux driver per CUDA major (CUDA's minor-version compatibility table).
MIN_DRIVER = {13: "580", 12: "525.60.13"}
# CUDA 13 dropped Maxwell, Pascal and Volta: Turing (7.5) is the oldest GPU it runs on.
MIN_COMPUTE_CAPABILITY = {13: (7, 5)}
PROC_VERSION = Path("/proc/driver/nvidia/version")
QUERY = ("driver_version,name,compute_cap", "driver_version")  # compute_cap is unknown to drivers before ~510
CU12_SET = 'pip install ".[gpu-cu12]" -c constraints/gpu-cu12.txt'


class GpuDriverNotChecked(UserWarning):
    pass


@dataclass(frozen=True)
class Gpu:
    name: str
    compute_capability: tuple[int, int] | None


@dataclass(frozen=True)
class Driver:
    version: str
    source: str
    gpus: tuple[Gpu, ...] = ()


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split("."))


def _parse_smi(stdout: str) -> Driver | None:
    version, gpus = None, []
    for line in stdout.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if not re.fullmatch(r"\d+(\.\d+)+", parts[0]):
            return None
        version = version or parts[0]
        if len(parts) >= 3:
            m = re.fullmatch(r"(\d+)\.(\d+)", parts[-1])
            gpus.append(Gpu(", ".join(parts[1:-1]), (int(m.group(1)), int(m.group(2))) if m else None))
    return Driver(version, "nvidia-smi", tuple(gpus)) if version else None


def read_driver(run: Callable[..., subprocess.CompletedProcess] = subprocess.run,
                proc_version: Path = PROC_VERSION) -> tuple[Driver | None, list[str]]:
    """The driver, or None with what was tried (for the messages)."""
    tried = []
    for fields in QUERY:
        try:
            out = run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"],
                      capture_output=True, text=True, timeout=30)
        except FileNotFoundError:
            tried.append("nvidia-smi: not installed")
            break
        except (OSError, subprocess.TimeoutExpired) as e:
            tried.append(f"nvidia-smi: {type(e).__name__}: {e}")
            break
        driver = _parse_smi(out.stdout) if out.returncode == 0 else None
        if driver is not None:
            return driver, tried
        problem = (out.stderr or out.stdout).strip().splitlines()
        tried.append(f"nvidia-smi --query-gpu={fields}: exit {out.returncode}"
                     + (f" ({problem[0]})" if problem else ""))
    try:
        text = proc_version.read_text()
    except OSError:
        tried.append(f"{proc_version}: absent")
        return None, tried
    m = re.search(r"NVRM version:.*?\s(\d+\.\d+(?:\.\d+)?)\s", text + " ")
    if m:
        return Driver(m.group(1), str(proc_version)), tried
    tried.append(f"{proc_version}: no version in {text.strip()[:120]!r}")
    return None, tried


def gpu_expected(environ: Mapping[str, str], dev: Path = Path("/dev")) -> str | None:
    """Why a GPU is expected on this node, or None."""
    devices = sorted(p.name for p in dev.glob("nvidia[0-9]*"))
    if devices:
        return f"{dev / devices[0]} exists"
    visible = environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    if visible and visible != "-1":
        return f"CUDA_VISIBLE_DEVICES={visible}"
    return None


def check(cuda: str | None, torch_version: str, driver: Driver | None, tried: list[str],
          expected: str | None) -> None:
    """Raises ConfigError when this node's driver cannot run torch's CUDA build; warns when nothing was checked."""
    if not cuda:
        return
    major = int(cuda.split(".")[0])
    if major not in MIN_DRIVER:
        warnings.warn(f"the NVIDIA driver was not checked: torch {torch_version} is built for CUDA {cuda}, whose "
                      f"minimum driver verl_pipe does not know (it knows CUDA {sorted(MIN_DRIVER)})",
                      GpuDriverNotChecked, stacklevel=3)
        return
    need = MIN_DRIVER[major]
    build = f"torch {torch_version} is built for CUDA {cuda}, which needs NVIDIA driver >= {need}"
    fixes = f"upgrade the NVIDIA driver to {need} or newer"
    if major >= 13:
        fixes += f"; or keep this driver and install the CUDA 12 version set ({CU12_SET}; driver >= " \
                 f"{MIN_DRIVER[12]})"
    fixes += "; or run on CPU (`make setup`, rolloutpipe.platform=cpu). See docs/install.md"
    if driver is None:
        if expected is None:
            warnings.warn(f"the NVIDIA driver was not checked: none on this node ({'; '.join(tried)}) and no GPU "
                          f"expected here (no /dev/nvidia<N>, no CUDA_VISIBLE_DEVICES); the GPU nodes need "
                          f"driver >= {need} ({build})", GpuDriverNotChecked, stacklevel=3)
            return
        raise ConfigError(f"rolloutpipe.platform: 'gpu' and a GPU is expected on this node ({expected}), but its "
                          f"NVIDIA driver version cannot be read ({'; '.join(tried)}); {build}. Make nvidia-smi available "
                          f"(or /proc/driver/nvidia/version readable) so the driver can be checked; if it is older: "
                          f"{fixes}")
    try:
        have = _version(driver.version)
    except ValueError:
        raise ConfigError(f"rolloutpipe.platform: 'gpu', but the NVIDIA driver version {driver.version!r} "
                          f"({driver.source}) is not a version number; {build}") from None
    if have < _version(need):
        raise ConfigError(f"rolloutpipe.platform: 'gpu', but this node's NVIDIA driver is {driver.version} "
                          f"({driver.source}) and {build}. Either {fixes}")
    oldest = MIN_COMPUTE_CAPABILITY.get(major)
    old = [g for g in driver.gpus if oldest and g.compute_capability and g.compute_capability < oldest]
    if old:
        names = ", ".join(f"{g.name} ({g.compute_capability[0]}.{g.compute_capability[1]})" for g in old)
        raise ConfigError(f"rolloutpipe.platform: 'gpu', but this node has GPUs older than CUDA {major} supports "
                          f"(compute capability >= {oldest[0]}.{oldest[1]}, Turing or newer): {names}; {build}. Run "
                          f"on Turing or newer GPUs, or install the CUDA 12 version set ({CU12_SET})")


def check_gpu_driver(cuda: str | None = None, torch_version: str | None = None,
                     run: Callable[..., subprocess.CompletedProcess] = subprocess.run,
                     proc_version: Path = PROC_VERSION, environ: Mapping[str, str] | None = None,
                     dev: Path = Path("/dev")) -> None:
    """The check on this node. ``cuda`` and ``torch_version`` (tests give both) default to the installed torch's."""
    if torch_version is None:
        import torch

        cuda, torch_version = torch.version.cuda, torch.__version__
    if not cuda:
        return  # a CPU (or ROCm) torch: no CUDA driver to compare against
    driver, tried = read_driver(run, proc_version)
    check(cuda, torch_version, driver, tried, gpu_expected(os.environ if environ is None else environ, dev))
