"""verl plugin entry point (group ``verl.plugins``), loaded by ``import verl`` in every process.

It always registers the CPU platform and the ``ray_store`` checkpoint engine
(registration alone changes nothing for GPU users); it applies the CPU patches
and asks for AMX only when the CPU platform is selected with ``VERL_PLATFORM=cpu``.
verl swallows plugin import errors at debug level, so failures are logged loudly here.
"""

import logging
import os

logger = logging.getLogger("verl_pipe.platform")


def _register() -> None:
    from verl.plugin.platform.platform_manager import PlatformRegistry

    from verl_pipe.platform.cpu_platform import PlatformCPU

    if PlatformRegistry.get("cpu") is not PlatformCPU:
        PlatformRegistry.register(platform="cpu")(PlatformCPU)


def activate_cpu() -> None:
    """Select the CPU platform in this process (env already set, or set here) and patch verl."""
    import verl.plugin.platform.platform_manager as pm

    from verl_pipe.platform.amx import request_amx_permission
    from verl_pipe.platform.patches import apply_cpu_patches

    os.environ["VERL_PLATFORM"] = "cpu"
    _register()
    current = pm._current_platform
    if current is not None and current.device_name != "cpu":
        raise RuntimeError(f"verl already resolved its platform to {current.device_name!r} in this process; "
                           "set VERL_PLATFORM=cpu before anything calls verl.utils.device")
    request_amx_permission()
    apply_cpu_patches()


def _load() -> None:
    _register()
    if os.environ.get("VERL_PLATFORM", "").strip().lower() == "cpu":
        activate_cpu()


try:
    _load()
except Exception:  # pragma: no cover - must never be silent
    logger.exception("verl_pipe CPU platform plugin failed to load")
    raise
