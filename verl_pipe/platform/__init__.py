"""What makes verl (and vLLM) run on a CPU-only machine.

Everything here is loaded through the extension points of verl and vLLM, never by
editing their files:

- ``plugin``: verl's ``verl.plugins`` entry point. It runs in every process that
  imports verl (driver, Ray workers, vLLM server actors) and, when
  ``VERL_PLATFORM=cpu``, registers the CPU platform and applies ``patches``.
- ``cpu_platform``: a ``PlatformBase`` for CPU (gloo, logical ``GPU`` Ray resource,
  no-op device-memory calls).
- ``patches``: the few monkeypatches verl 0.9.1 still needs on CPU, in one place.
- ``ray_store_engine``: a checkpoint-engine backend that moves weights from the
  trainer pool to the rollout pool through Ray's object store (no CUDA, no NCCL).
- ``vllm_plugin``: vLLM's ``vllm.general_plugins`` entry point, run in every vLLM
  process (AMX permission, weight reload on the CPU backend).
- ``env``: the environment variables a CPU run needs, in one dict.
"""
