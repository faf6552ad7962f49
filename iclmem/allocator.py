"""Keep the memory of freed activations mapped, so that batched CPU forwards do not page-fault.

A probe's forward call allocates activations of a few MB each ([4096 tokens, 256] float32 = 4 MB) and
frees them a few microseconds later, thousands of times per ``score``. glibc's malloc serves chunks above
its mmap threshold with fresh ``mmap``s and hands the top of its heap back to the kernel once more than its
trim threshold is free; both adapt to the workload, but not fast enough for this pattern, so the next
allocation of the same size faults its pages in again and the kernel zeroes them. Measured on pfn-mini's
probe when ``score`` made one call per shape group (benchmarks/RESULTS.md, *Probe throughput*, fresh
processes): ~31,000 minor page faults (~120 MB zeroed) per ``score`` on ``digits`` and ~4,000 on
``breast_cancer``, costing 9% / 7% of their forward time; with the thresholds below, none. Since ``score``
packs several shape groups into each of pfn-mini's calls, the same benchmark measures a handful of faults
either way (the thresholds still serve unpacked calls: ``merge=False``, models that do not pack).

The cost: a process keeps up to ``TRIM_THRESHOLD_BYTES`` of freed heap mapped (it is reused by the next
allocations), and chunks up to ``MMAP_THRESHOLD_BYTES`` come from the heap. Process-wide, glibc only (Linux);
elsewhere nothing is changed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform
import threading

# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# The largest mmap threshold glibc accepts on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX = 4 MiB * sizeof(long)).
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024
# Free heap kept mapped: a probe's working set (measured: 16 MiB still faulted on digits, 64 MiB did not).
TRIM_THRESHOLD_BYTES = 64 * 1024 * 1024

_lock = threading.Lock()
_applied: bool | None = None  # None: not tried yet in this process


def retain_freed_memory() -> bool:
    """Set glibc's mmap and trim thresholds for this process (once; later calls return the first answer).
    True when they are in force, False where the C library is not glibc or refused them."""
    global _applied
    with _lock:
        if _applied is None:
            _applied = _set_thresholds()
        return _applied


def uses_glibc() -> bool:
    """This process runs on glibc (Linux), whose thresholds ``retain_freed_memory`` sets."""
    return platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


def _set_thresholds() -> bool:
    if not uses_glibc():
        return False
    name = ctypes.util.find_library("c") or "libc.so.6"
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    # mallopt returns 1 on success; setting either threshold also stops glibc adapting them
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
