"""Interpreter shutdown while daemon threads wait on a compile must exit cleanly."""

import subprocess
import sys
import textwrap

import pytest

from helpers import child_env

SCRIPT = textwrap.dedent(
    """
    import threading, time, ftjit
    gate = threading.Event()
    def compiler(fun, args, kwargs):
        gate.wait()
        return fun
    jf = ftjit.jit(lambda x: x, compiler=compiler, cache=ftjit.FunctionCache(8))
    threading.Thread(target=jf, args=(1.0,), daemon=True).start()
    time.sleep(0.2)
    for v in (2.0, 3.0):
        threading.Thread(target=jf, args=(v,), daemon=True).start()
    deadline = time.monotonic() + 10
    while jf.cache_info().waits < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    print("waits", jf.cache_info().waits)
    """
)


def test_exit_while_threads_wait_on_a_compile():
    # A waiter re-taking the GIL during finalisation is ended by CPython (3.11-3.13
    # use pthread_exit); that must not abort the process ("terminate called ...").
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60, env=child_env())
    assert proc.stdout.strip() == "waits 2", proc.stdout + proc.stderr
    assert proc.returncode == 0, proc.stderr
    assert "terminate" not in proc.stderr


CLEARED_SCRIPT = textwrap.dedent(
    """
    import threading, time, ftjit
    gate = threading.Event()
    started = threading.Event()
    def compiler(fun, args, kwargs):
        started.set()
        # Wakes every 10 ms, re-taking the GIL: finalization ends this thread
        # inside the compile, unwinding through ftjit with no thread state.
        while not gate.wait(0.01):
            pass
        return fun
    jf = ftjit.jit(lambda x: x, compiler=compiler, cache=ftjit.FunctionCache(8))
    threading.Thread(target=jf, args=(1.0,), daemon=True).start()
    started.wait(10)
    for _ in range(3):
        threading.Thread(target=jf, args=(2.0,), daemon=True).start()
    deadline = time.monotonic() + 10
    while jf.cache_info().waits < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    jf.clear_cache()  # the entry leaves the map and the LRU: the threads hold its last references
    info = jf.cache_info()
    print("waits", info.waits, "size", info.size)

    class SlowFinalizer:
        # Deleted while the interpreter finalizes, after daemon threads are
        # told to end: gives them time to wake and be ended there.
        def __del__(self, sleep=time.sleep):
            sleep(0.3)
    slow = SlowFinalizer()
    """
)


def test_exit_while_threads_hold_the_last_reference_to_a_cleared_entry():
    # The daemon threads' own references are the entry's last: ending them at
    # shutdown (no thread state) must queue its reclamation, never run the
    # deleters that drop Python objects, and never touch a lock the GIL guards.
    for _ in range(3):
        proc = subprocess.run([sys.executable, "-c", CLEARED_SCRIPT], capture_output=True, text=True, timeout=60,
                              env=child_env())
        assert proc.stdout.strip() == "waits 3 size 0", proc.stdout + proc.stderr
        assert proc.returncode == 0, proc.stderr
        assert proc.stderr == "", proc.stderr


METHOD_SCRIPT = textwrap.dedent(
    """
    import sys, threading, time, ftjit
    gate = threading.Event()
    started = threading.Event()
    def compiler(fun, args, kwargs):
        started.set()
        while not gate.wait(0.01):  # wakes, re-taking the GIL: finalization ends the thread here
            pass
        return fun
    jf = ftjit.jit(lambda x: x, compiler=compiler, cache=ftjit.FunctionCache(8))
    if sys.argv[1] == "precompile":  # one thread compiles, two wait on it
        for _ in range(3):
            threading.Thread(target=jf.precompile, args=(1.0,), daemon=True).start()
    else:  # a warm-up in a background thread, its three workers in precompile
        threading.Thread(target=jf.warmup, args=([(1.0,)] * 3,), kwargs={"workers": 3, "progress": False},
                         daemon=True).start()
    started.wait(10)
    deadline = time.monotonic() + 10
    while jf.cache_info().waits < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    print("waits", jf.cache_info().waits)

    class SlowFinalizer:
        # Deleted while the interpreter finalizes, after daemon threads are
        # told to end: gives them time to wake and be ended there.
        def __del__(self, sleep=time.sleep):
            sleep(0.3)
    slow = SlowFinalizer()
    """
)


@pytest.mark.parametrize("method", ["precompile", "warmup"])
def test_exit_while_daemon_threads_are_inside_a_method(method):
    # As the warm-up's daemon workers are when Ctrl-C ends the program: each
    # thread is ended by CPython inside a method (a nanobind function), one in
    # the compile, the others waiting on it (and, for a warm-up, its own
    # thread in its wait). A forced unwind into nanobind's noexcept dispatch
    # would abort the exit; the thread is parked instead.
    proc = subprocess.run([sys.executable, "-c", METHOD_SCRIPT, method], capture_output=True, text=True, timeout=60,
                          env=child_env())
    assert proc.stdout.strip() == "waits 2", proc.stdout + proc.stderr
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "", proc.stderr


THREAD_CALL_SCRIPT = textwrap.dedent(
    """
    import sys, threading, time
    sys.path.insert(0, sys.argv[1])
    import ftjit
    from stress.copy_compiler import CopyCompiler
    gate, started = threading.Event(), threading.Event()

    class Slow(CopyCompiler):
        def __call__(self, fun, args, kwargs):
            started.set()
            while not gate.wait(0.01):
                pass
            return super().__call__(fun, args, kwargs)

    jf = ftjit.jit(lambda x: x, compiler=Slow(thread_calls=True), cache=ftjit.FunctionCache(8))
    for _ in range(3):
        threading.Thread(target=jf, args=(1.0,), daemon=True).start()
    started.wait(10)
    deadline = time.monotonic() + 10
    while jf.cache_info().waits < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    print("waits", jf.cache_info().waits, jf._thread_call_state()["enabled"], flush=True)

    class SlowFinalizer:
        def __del__(self, sleep=time.sleep):
            sleep(0.3)

    slow = SlowFinalizer()
    """
)


def test_exit_while_daemon_threads_are_inside_a_thread_call_objects_miss():
    """The compile and the waits are reached through each thread's call object's miss (CompilerHooks.thread_call):
    CPython ending those threads at exit must park them there, not unwind through the call object (a crash)."""
    import os

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-c", THREAD_CALL_SCRIPT, root], capture_output=True, text=True, timeout=60,
                          env=child_env())
    assert proc.stdout.strip() == "waits 2 True", proc.stdout + proc.stderr
    assert proc.returncode == 0, proc.stderr
    assert "terminate" not in proc.stderr
