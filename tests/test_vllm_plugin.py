"""verl_pipe/platform/vllm_plugin.py's memory trim after weight updates: verl's worker extension method is wrapped
once, calls the original, then malloc_trim -- also when the update raises."""

import pytest

from verl_pipe.platform import vllm_plugin


@pytest.fixture
def ext(monkeypatch):
    from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension as cls

    calls = []
    original = cls.update_weights_from_ipc

    def fake_update(self, *args, **kwargs):
        calls.append(("update", args, kwargs))
        if kwargs.get("fail"):
            raise RuntimeError("bad bucket")
        return "done"

    monkeypatch.setattr(cls, "update_weights_from_ipc", fake_update)
    monkeypatch.setattr(vllm_plugin, "malloc_trim", lambda: calls.append(("trim",)) or True)
    yield cls, calls
    cls.update_weights_from_ipc = original


def test_every_weight_update_is_followed_by_a_trim(ext):
    cls, calls = ext
    vllm_plugin._trim_after_weight_updates()
    vllm_plugin._trim_after_weight_updates()  # idempotent: wrapped once
    assert cls.update_weights_from_ipc(object(), use_shm=True) == "done"
    assert calls == [("update", (), {"use_shm": True}), ("trim",)]
    with pytest.raises(RuntimeError, match="bad bucket"):
        cls.update_weights_from_ipc(object(), fail=True)
    assert calls[-1] == ("trim",)


def test_malloc_trim_runs_here():
    from verl_pipe.platform.env import malloc_trim

    assert malloc_trim() in (True, False)  # glibc: returns whether memory was released


def test_reloads_compute_with_torch_linear_instead_of_a_new_packed_copy(monkeypatch):
    """The first load goes through vLLM's dispatch (remove_weight=False, so the weight stays reloadable); every later
    process_weights_after_loading (one per weight update) sets torch's linear on the updated weight, no new pack."""
    import torch
    import vllm.model_executor.layers.utils as layer_utils

    calls = []

    def fake_dispatch(layer, remove_weight):
        calls.append(remove_weight)
        layer.cpu_linear = "packed"

    monkeypatch.setattr(layer_utils, "dispatch_cpu_unquantized_gemm", fake_dispatch)
    vllm_plugin._keep_linear_weights_for_reload()
    dispatch = layer_utils.dispatch_cpu_unquantized_gemm
    layer = torch.nn.Linear(4, 3)
    dispatch(layer, remove_weight=True)
    assert calls == [False] and layer.cpu_linear == "packed"
    with torch.no_grad():
        layer.weight.mul_(2.0)  # a weight update lands in place
    dispatch(layer, remove_weight=True)
    assert calls == [False], "no second pack"
    x = torch.randn(2, 4)
    torch.testing.assert_close(layer.cpu_linear(x, layer.weight, layer.bias), layer(x))
