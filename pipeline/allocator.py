"""Training keeps the memory it frees instead of handing it back to the kernel (glibc malloc).

torch allocates every CPU tensor with ``malloc`` and frees it on release, no cache. glibc
serves anything over 32 MiB (its largest mmap threshold), such as a micro-batch's logits over
the vocabulary, with a fresh ``mmap`` and unmaps it on free: every update step page-faults
and zeroes those pages again (130k-320k minor faults per update of
``benchmarks/update_throughput.py``'s default, about 0.5-1.2 GiB). That kernel work does not
shrink with more threads, so at two threads it was a larger share of a shorter update and
the update's MFU fell. With mmap off and the heap trimmed only past 1 GiB of free space the
same update faults a few thousand times. The cost: the process keeps its peak heap.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4


@functools.cache
def keep_freed_memory() -> bool:
    """Set once per process; False where the C library is not glibc (nothing changes)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # noqa: B018  # glibc only: musl has mallopt as a stub
    except (OSError, AttributeError, TypeError):
        return False
    return bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, 1 << 30))
