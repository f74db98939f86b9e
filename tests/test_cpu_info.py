"""CPU capability report (verl_pipe/platform/cpu_info.py) and the start-up warning for bf16 on a CPU without
native bf16."""

import warnings

import pytest

from verl_pipe.platform.cpu_info import bf16_problem, cpu_flags, probe_matmul

EPYC_AVX2 = "processor\t: 0\nmodel name\t: AMD EPYC 7B12\nflags\t\t: fpu sse2 avx avx2 fma\n"
SAPPHIRE = ("processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Processor\n"
            "flags\t\t: avx avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n")


def test_flags_from_cpuinfo():
    avx2 = cpu_flags(EPYC_AVX2)
    assert avx2["model"] == "AMD EPYC 7B12"
    assert avx2["flags"]["avx2"] and not avx2["flags"]["avx512f"] and not avx2["native_bf16"]
    amx = cpu_flags(SAPPHIRE)
    assert amx["native_bf16"] and amx["flags"]["amx_bf16"]


def test_matmul_probe_reports_both_paths():
    out = probe_matmul(seconds=0.2, n=128)
    assert out["fp32_gflops"] > 0 and out["bf16_gflops"] > 0
    assert out["bf16_over_fp32"] == pytest.approx(out["bf16_gflops"] / out["fp32_gflops"], rel=1e-2)


def _cfg(*overrides):
    from verl_pipe.launch.session import compose

    return compose(list(overrides))


def test_the_cpu_default_computes_in_fp32():
    cfg = _cfg()
    for role in ("actor", "ref"):
        mp = cfg.actor_rollout_ref[role].fsdp_config.mixed_precision
        assert (mp.param_dtype, mp.reduce_dtype, mp.buffer_dtype) == ("fp32", "fp32", "fp32"), role
    assert cfg.actor_rollout_ref.rollout.dtype == "float32"
    assert bf16_problem(cfg, cpu_flags(EPYC_AVX2)) is None


def test_bf16_on_a_cpu_without_native_bf16_is_named():
    cfg = _cfg("actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bf16")
    msg = bf16_problem(cfg, cpu_flags(EPYC_AVX2))
    assert "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype" in msg
    assert "ref.fsdp_config" not in msg
    assert "AVX512_BF16" in msg and "AMX_BF16" in msg and "AMD EPYC 7B12" in msg
    assert bf16_problem(cfg, cpu_flags(SAPPHIRE)) is None  # native bf16: nothing to say
    # verl's FSDP engine computes in bf16 when mixed_precision is unset
    cfg = _cfg("~actor_rollout_ref.ref.fsdp_config.mixed_precision")
    assert "actor_rollout_ref.ref.fsdp_config.mixed_precision.param_dtype" in bf16_problem(cfg, cpu_flags(EPYC_AVX2))
    cfg = _cfg("actor_rollout_ref.rollout.dtype=bfloat16")
    assert "actor_rollout_ref.rollout.dtype" in bf16_problem(cfg, cpu_flags(EPYC_AVX2))


def test_validation_warns_at_start_up(monkeypatch):
    import verl_pipe.platform.cpu_info as ci
    from verl_pipe.config import CpuBf16Warning, validate

    monkeypatch.setattr(ci, "cpu_flags", lambda cpuinfo=None: cpu_flags(EPYC_AVX2))
    cfg = _cfg("actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bf16")
    with pytest.warns(CpuBf16Warning, match="mixed_precision.param_dtype"):
        validate(cfg, check_paths=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CpuBf16Warning)
        validate(_cfg(), check_paths=False)  # the fp32 default: silent
