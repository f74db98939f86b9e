"""The GPU start-up check of the NVIDIA driver (verl_pipe/launch/gpu_driver.py), on stubbed nvidia-smi, /proc and /dev."""

import subprocess
import warnings

import pytest

from verl_pipe.config import ConfigError
from verl_pipe.launch.gpu_driver import GpuDriverNotChecked, check_gpu_driver, gpu_expected, read_driver
from verl_pipe.launch.session import compose

CU13 = {"cuda": "13.0", "torch_version": "2.13.0"}  # PyPI's torch 2.13.0 (constraints/gpu.txt)
CU12 = {"cuda": "12.8", "torch_version": "2.10.0"}  # PyPI's torch 2.10.0 (constraints/gpu-cu12.txt)
NO_GPU_ENV = {"PATH": "/bin"}
OLD_FIELD = 'Field "compute_cap" is not a valid field to query.'


class Smi:
    """A stub ``nvidia-smi``: the reply per --query-gpu fields, ``None`` for not installed; records the calls."""

    def __init__(self, replies=None):
        self.replies, self.calls = replies, []

    def __call__(self, cmd, **kwargs):
        self.calls.append(cmd)
        if self.replies is None:
            raise FileNotFoundError("nvidia-smi")
        fields = cmd[1].split("=", 1)[1]
        rc, out, err = self.replies[fields]
        return subprocess.CompletedProcess(cmd, rc, out, err)


def smi(version: str, *gpus: tuple[str, str]) -> Smi:
    rows = "".join(f"{version}, {name}, {cc}\n" for name, cc in gpus)
    return Smi({"driver_version,name,compute_cap": (0, rows, ""),
                "driver_version": (0, f"{version}\n" * len(gpus), "")})


@pytest.fixture
def node(tmp_path):
    """A node without a driver: no nvidia-smi, no /proc/driver/nvidia/version, no /dev/nvidia<N>."""
    (tmp_path / "dev").mkdir()
    return {"run": Smi(), "proc_version": tmp_path / "version", "environ": NO_GPU_ENV, "dev": tmp_path / "dev"}


def _check(node, build=CU13, **changes):
    check_gpu_driver(**build, **{**node, **changes})


def test_a_driver_older_than_580_stops_a_cuda13_run_naming_the_minimum_and_the_alternatives(node):
    with pytest.raises(ConfigError) as err:
        _check(node, run=smi("550.54.15", ("NVIDIA H100 80GB HBM3", "9.0")))
    msg = str(err.value)
    assert msg.startswith("rolloutpipe.platform: 'gpu', but this node's NVIDIA driver is 550.54.15 (nvidia-smi)")
    assert "CUDA 13.0, which needs NVIDIA driver >= 580" in msg and "upgrade the NVIDIA driver to 580" in msg
    assert 'pip install ".[gpu-cu12]" -c constraints/gpu-cu12.txt' in msg and ">= 525.60.13" in msg
    assert "rolloutpipe.platform=cpu" in msg and "docs/install.md" in msg


def test_a_580_driver_on_hopper_passes_silently(node):
    run = smi("580.65.06", ("NVIDIA H200", "9.0"), ("NVIDIA H200", "9.0"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _check(node, run=run)
        _check(node, run=smi("590.10.01", ("NVIDIA GeForce RTX 2080 Ti", "7.5")))  # Turing: the oldest CUDA 13 runs
    assert run.calls == [["nvidia-smi", "--query-gpu=driver_version,name,compute_cap", "--format=csv,noheader"]]


def test_pre_turing_gpus_stop_a_cuda13_run(node):
    with pytest.raises(ConfigError) as err:
        _check(node, run=smi("580.82.07", ("Tesla V100-SXM2-32GB", "7.0"), ("NVIDIA A100-SXM4-80GB", "8.0")))
    msg = str(err.value)
    assert "Tesla V100-SXM2-32GB (7.0)" in msg and "A100" not in msg and "Turing" in msg and "gpu-cu12" in msg
    _check(node, build=CU12, run=smi("580.82.07", ("Tesla V100-SXM2-32GB", "7.0")))  # CUDA 12 still runs Volta


def test_an_old_nvidia_smi_without_compute_cap_still_gives_the_driver(node):
    run = Smi({"driver_version,name,compute_cap": (6, "", OLD_FIELD), "driver_version": (0, "470.82.01\n", "")})
    with pytest.raises(ConfigError, match="driver is 470.82.01 \\(nvidia-smi\\)"):
        _check(node, run=run)
    assert len(run.calls) == 2


def test_the_cuda12_set_needs_nvidias_cuda12_floor(node):
    _check(node, build=CU12, run=smi("535.104.05", ("NVIDIA A100-SXM4-80GB", "8.0")))
    with pytest.raises(ConfigError) as err:
        _check(node, build=CU12, run=smi("520.61.05", ("NVIDIA A100-SXM4-80GB", "8.0")))
    msg = str(err.value)
    assert "CUDA 12.8, which needs NVIDIA driver >= 525.60.13" in msg and "gpu-cu12" not in msg  # already on it


@pytest.mark.parametrize("line,version,enough", [
    ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024", "550.54.15", False),
    ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build  (dvs-builder@U16)  Sun Jul 27",
     "580.65.06", True),
])
def test_without_nvidia_smi_the_kernel_modules_version_is_read(node, line, version, enough):
    node["proc_version"].write_text(line + "\nGCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04)\n")
    driver, tried = read_driver(node["run"], node["proc_version"])
    assert driver.version == version and driver.source == str(node["proc_version"])
    assert tried == ["nvidia-smi: not installed"]
    if enough:
        _check(node)
    else:
        with pytest.raises(ConfigError, match=f"driver is {version} \\({node['proc_version']}\\)"):
            _check(node)


def test_no_driver_and_no_gpu_expected_warns_and_passes(node):
    """A launcher on a GPU-less head node of a Ray cluster: nothing to read here, nothing expected."""
    with pytest.warns(GpuDriverNotChecked, match="not checked: none on this node \\(nvidia-smi: not installed; "):
        _check(node)
    failing = Smi({"driver_version,name,compute_cap": (9, "", "NVIDIA-SMI has failed because it couldn't communicate "
                                                              "with the NVIDIA driver."),
                   "driver_version": (9, "", "NVIDIA-SMI has failed")})
    with pytest.warns(GpuDriverNotChecked, match="couldn't communicate"):
        _check(node, run=failing, environ={"CUDA_VISIBLE_DEVICES": "-1"})


@pytest.mark.parametrize("expect", ["device", "CUDA_VISIBLE_DEVICES"])
def test_no_readable_driver_where_a_gpu_is_expected_stops(node, expect):
    if expect == "device":
        (node["dev"] / "nvidia0").touch()
        (node["dev"] / "nvidiactl").touch()
        environ, why = NO_GPU_ENV, f"{node['dev'] / 'nvidia0'} exists"
    else:
        environ, why = {"CUDA_VISIBLE_DEVICES": "0,1"}, "CUDA_VISIBLE_DEVICES=0,1"
    with pytest.raises(ConfigError) as err:
        _check(node, environ=environ)
    msg = str(err.value)
    assert msg.startswith(f"rolloutpipe.platform: 'gpu' and a GPU is expected on this node ({why})")
    assert "nvidia-smi: not installed" in msg and f"{node['proc_version']}: absent" in msg and ">= 580" in msg


def test_gpu_expected_reads_devices_and_visible_devices(tmp_path):
    assert gpu_expected({}, tmp_path) is None
    assert gpu_expected({"CUDA_VISIBLE_DEVICES": ""}, tmp_path) is None
    (tmp_path / "nvidiactl").touch()  # the control device alone is not a GPU
    assert gpu_expected({}, tmp_path) is None
    (tmp_path / "nvidia3").touch()
    assert gpu_expected({}, tmp_path) == f"{tmp_path / 'nvidia3'} exists"


def test_a_torch_without_cuda_reads_nothing(node):
    run = Smi({})
    check_gpu_driver(cuda=None, torch_version="2.13.0+cpu", **{**node, "run": run})
    assert run.calls == []


def test_an_unknown_cuda_major_warns(node):
    with pytest.warns(GpuDriverNotChecked, match="CUDA 14.0, whose minimum driver"):
        _check(node, build={"cuda": "14.0", "torch_version": "2.20.0"}, run=smi("600.1.2", ("X", "10.0")))


def test_the_preflight_runs_it_on_gpu_only(node, monkeypatch):
    from verl_pipe.launch import preflight
    from verl_pipe.launch.ray_start import select_platform

    run = smi("550.54.15", ("NVIDIA H100", "9.0"))
    preflight.check_gpu_driver(compose([]), **CU13, **{**node, "run": run})  # the CPU platform: not checked
    assert run.calls == []
    gpu = compose(["rolloutpipe.platform=gpu", "trainer.device=cuda"])
    with pytest.raises(ConfigError, match="550.54.15"):
        preflight.check_gpu_driver(gpu, **CU13, **{**node, "run": run})
    # The launcher runs it on GPU, after the environment check: stubbed to a too-old driver here.
    for key in ("VERL_PLATFORM", "VLLM_TARGET_DEVICE", "VERL_PIPE_ALL_CORES", "VERL_PIPE_ROLLOUT_CORES",
                "VERL_PIPE_TRAINER_CORES"):
        monkeypatch.delenv(key, raising=False)
    real = preflight.check_gpu_driver
    monkeypatch.setattr(preflight, "check_gpu_driver", lambda config: real(config, **CU13, **{**node, "run": run}))
    with pytest.raises(ConfigError, match="550.54.15"):
        select_platform(gpu)
