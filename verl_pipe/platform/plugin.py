"""verl plugin entry point (group ``verl.plugins``), loaded by ``import verl`` in every process.

It always registers the CPU platform and the ``ray_store`` checkpoint engine
(registration alone changes nothing for GPU users); it applies the CPU patches
and asks for AMX only when the CPU platform is selected with ``VERL_PLATFORM=cpu``.
verl swallows plugin import errors at debug level, so failures are logged loudly here.
"""

import logging
import os

logger = logging.getLogger("verl_pipe.platform")


def _load() -> None:
    from verl.plugin.platform.platform_manager import PlatformRegistry

    from verl_pipe.platform.cpu_platform import PlatformCPU

    PlatformRegistry.register(platform="cpu")(PlatformCPU)
    if os.environ.get("VERL_PLATFORM", "").strip().lower() == "cpu":
        from verl_pipe.platform.amx import request_amx_permission
        from verl_pipe.platform.patches import apply_cpu_patches

        request_amx_permission()
        apply_cpu_patches()


try:
    _load()
except Exception:  # pragma: no cover - must never be silent
    logger.exception("verl_pipe CPU platform plugin failed to load")
    raise
