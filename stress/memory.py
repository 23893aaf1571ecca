"""Where a process's memory is, by owner: the core's live objects, C and C++ allocations (glibc malloc), and RSS.

The churn scenario samples these as it runs, so that growth can be told apart: live objects of ftjit's core
(``_core._live_counts``: entries, stores, objects retired and not yet freed) must return to where they started;
memory the C/C++ allocator holds (in use, or freed and kept in its arenas) and RSS may grow with the threads that
allocate in parallel (glibc gives each contending thread an arena of its own, up to 8 per core) and then plateau.
Python objects on a free-threaded build live in mimalloc's heaps, which glibc's counts do not include.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import re
import sys
import tempfile
from typing import Optional

from ftjit import _core

_MIB = 2**20


def rss_bytes() -> int:
    """Resident set size of this process (Linux /proc; 0 where unavailable)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def _libc() -> Optional[ctypes.CDLL]:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
        libc.fdopen.restype = ctypes.c_void_p
        libc.fdopen.argtypes = [ctypes.c_int, ctypes.c_char_p]
        libc.fclose.argtypes = [ctypes.c_void_p]
        return libc
    except (OSError, AttributeError):  # not glibc (musl, macOS): no malloc figures
        return None


_LIBC = _libc()


def malloc_bytes() -> Optional[tuple[int, int]]:
    """(bytes glibc malloc has handed out and not had back, bytes it holds free in its arenas), or None off glibc."""
    if _LIBC is None:
        return None
    info = _LIBC.mallinfo2()
    return info.uordblks + info.hblkhd, info.fordblks


def malloc_arenas() -> Optional[int]:
    """How many arenas glibc malloc has made (one per thread that found the others locked, up to 8 per core)."""
    if _LIBC is None:
        return None
    with tempfile.TemporaryFile() as tmp:
        fp = _LIBC.fdopen(os.dup(tmp.fileno()), b"w")
        if not fp:
            return None
        _LIBC.malloc_info(0, fp)
        _LIBC.fclose(fp)
        tmp.seek(0)
        text = tmp.read().decode("ascii", "replace")
    return len(re.findall(r'<heap nr="\d+">', text))


def core_counts(reclaim: bool = False) -> dict[str, int]:
    """``_core._live_counts()``: the core's live objects by kind (see its docstring)."""
    return dict(_core._live_counts(reclaim))


def snapshot() -> dict[str, int]:
    """Every figure at once (those unavailable here left out): rss, malloc_used, malloc_free, py_blocks (Python's
    allocated memory blocks, with the GIL on only), and the core's."""
    out = {"rss": rss_bytes()}
    if getattr(sys, "_is_gil_enabled", lambda: True)():
        # Not with the GIL off: 3.13t's getallocatedblocks() walks every thread's mimalloc heap while a thread
        # being started initializes its own, a data race in CPython that ThreadSanitizer reports.
        out["py_blocks"] = sys.getallocatedblocks()
    m = malloc_bytes()
    if m is not None:
        out["malloc_used"], out["malloc_free"] = m
    out.update(core_counts())
    return out


def mib(n: float) -> str:
    return f"{n / _MIB:.1f} MiB"
