"""Keeps freed memory from staying in the process: glibc's malloc settings for a sidecar.

glibc raises its mmap threshold each time a large block is freed (up to 32 MiB), so after the
first 2 MiB page every later body, decoded text and answer is carved from the heap instead of
mapped, and the heap does not shrink while anything sits above the freed space: a sidecar that
fetched a few large pages keeps their high-water mark for its whole life. A fixed threshold
keeps large blocks mapped (returned to the kernel when freed), and a low trim threshold gives
back free heap tops. On a libc without mallopt (musl, macOS) nothing is changed. Never raises.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 128 * 1024
TRIM_THRESHOLD_BYTES = 256 * 1024


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


_LIBC = _libc()


def limit_heap_retention() -> None:
    """Fixed mmap and trim thresholds for this process (call once, early)."""
    if _LIBC is not None:
        with contextlib.suppress(OSError, ValueError):
            _LIBC.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
            _LIBC.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)


def release_free_memory() -> None:
    """Give free heap pages back to the kernel (after a large conversion; costs ~1 ms)."""
    if _LIBC is not None:
        with contextlib.suppress(OSError, ValueError):
            _LIBC.malloc_trim(0)
