"""The hit path's fences (cpp/primitives/fences.h): asymmetric (membarrier on
the rare side) by default where Linux registers it, symmetric (seq_cst) with
FTJIT_FENCES=symmetric. Either way an entry evicted while threads are inside
its executable is freed exactly once, after the last of them leaves, and a
forked child keeps the parent's mode."""

from __future__ import annotations

import ctypes
import os
import platform
import sys

import pytest

from helpers import run_script

# membarrier(2)'s number where this test knows it; elsewhere the default mode is not predicted.
_MEMBARRIER_NR = {"x86_64": 324, "aarch64": 283}.get(platform.machine())
MEMBARRIER_CMD_PRIVATE_EXPEDITED = 1 << 3


def _membarrier_registers() -> bool | None:
    """Whether this kernel offers MEMBARRIER_CMD_PRIVATE_EXPEDITED (None: unknown here)."""
    if not sys.platform.startswith("linux") or _MEMBARRIER_NR is None:
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    cmds = libc.syscall(_MEMBARRIER_NR, 0, 0, 0)  # MEMBARRIER_CMD_QUERY
    return cmds >= 0 and bool(cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED)


# 8 threads hit 6 signatures of a function whose cache holds 2: entries are
# evicted while other threads are inside their executables (which yield to
# keep them there). Every result is checked; afterwards no entry, retired
# object or in-flight count is left.
_WORKLOAD = r"""
import gc, os, sys, threading, time
import ftjit, ftjit._core as core
sys.path.insert(0, os.environ["FTJIT_TESTS"])
from helpers import CountingCompiler, run_threads

mode = core._fences()
print(mode)

def work(x, k):
    time.sleep(0)  # another thread runs while this call is in flight
    return x * 10 + k

comp = CountingCompiler()
cache = ftjit.FunctionCache(capacity=2)
jf = ftjit.jit(work, compiler=comp, cache=cache, static_argnums=1)
calls = 300

def worker(t):
    for i in range(calls):
        k = (t + i) % 6
        assert jf(i, k) == i * 10 + k
    return calls

assert sum(run_threads(8, worker, timeout=120)) == 8 * calls
info = jf.cache_info()
assert info.hits + info.misses + info.waits == 8 * calls, info  # every call counted once
assert info.evictions > 0, info
del jf, cache
gc.collect()
live = core._live_counts(reclaim=True)
assert (live["entries"], live["retired"]) == (0, 0), live
if hasattr(os, "fork"):
    pid = os.fork()
    if pid == 0:
        jg = ftjit.jit(lambda x: x + 1, compiler=CountingCompiler())
        os._exit(0 if core._fences() == mode and jg(1) == 2 and jg(2) == 3 else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
print("ok")
"""


@pytest.mark.parametrize("asked", ["default", "symmetric", "asymmetric"])
def test_entries_evicted_under_hits_are_freed_in_each_fence_mode(asked):
    env = {"FTJIT_TESTS": os.path.dirname(__file__)}
    if asked != "default":
        env["FTJIT_FENCES"] = asked
    out = run_script(_WORKLOAD, env=env).splitlines()
    assert out[-1] == "ok"
    registers = _membarrier_registers()
    if asked == "symmetric":
        assert out[0] == "symmetric"
    elif registers is not None:
        assert out[0] == ("asymmetric" if registers else "symmetric")


def test_an_unknown_fence_mode_warns_and_keeps_the_default():
    out = run_script(
        """
        import warnings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import ftjit._core as core
        print(core._fences())
        print([str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)])
        """,
        env={"FTJIT_FENCES": "fast"},
    ).splitlines()
    registers = _membarrier_registers()
    if registers is not None:
        assert out[0] == ("asymmetric" if registers else "symmetric")
    assert out[1] == ("[\"ftjit: FTJIT_FENCES=fast is not 'symmetric' or 'asymmetric': asymmetric "
                      "(the default) is used\"]")
