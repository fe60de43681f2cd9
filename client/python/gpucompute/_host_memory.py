"""The process's allocator setting for large messages (as the C++ CLI's
--retain_host_memory_bytes, proto/host_memory.h)."""

from __future__ import annotations

import ctypes
import ctypes.util

# glibc mallopt parameters.
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8


def keep_freed_host_memory(retain_bytes: int = 2**31 - 1) -> bool:
    """Serves every allocation of this process from one heap that keeps up to `retain_bytes`
    of freed memory for reuse (glibc: one arena, no mmap for large blocks, the trim threshold
    at `retain_bytes`), so that each large message reuses memory already mapped instead of
    page-faulting fresh buffers in. Process-wide, and the process then keeps up to
    `retain_bytes` it no longer uses: call it once, early, in programs that move large
    tensors (the benchmark does). Returns False where the C library is not glibc or refuses.
    """
    if not 0 < retain_bytes <= 2**31 - 1:
        raise ValueError(f"retain_bytes: expected 1 to {2**31 - 1} but got {retain_bytes}")
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return (mallopt(_M_ARENA_MAX, 1) == 1 and mallopt(_M_MMAP_MAX, 0) == 1
            and mallopt(_M_TRIM_THRESHOLD, int(retain_bytes)) == 1)
