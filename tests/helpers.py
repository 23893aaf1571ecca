"""Shared helpers for the ftjit test suite.

Everything here is safe to use from several threads at once (the suite also
runs under pytest-run-parallel, which runs each test body in many threads).
Tests create their own compilers and caches inside the test body: fixtures
would be shared by the parallel copies of one test.
"""

import gc
import threading
import time
import weakref

import pytest

__all__ = [
    "CountingCompiler",
    "gc_collect_until",
    "run_threads",
    "weak_executable",
]


def _weak_or_strong(obj):
    """A zero-argument callable returning `obj`; holds it weakly if it can."""
    try:
        return weakref.ref(obj)
    except TypeError:  # not weakrefable (e.g. __slots__ = ())
        return lambda: obj


def weak_executable(fun):
    """An executable that calls `fun` without keeping it alive.

    The cache keeps executables alive until the wrapped function dies, so an
    executable holding `fun` strongly would keep it alive forever.
    """
    ref = _weak_or_strong(fun)

    def executable(*args, **kwargs):
        target = ref()
        assert target is not None, "executable called after its function died"
        return target(*args, **kwargs)

    return executable


def _make_exception(fail):
    if isinstance(fail, BaseException):
        return type(fail)(*fail.args)
    if isinstance(fail, type) and issubclass(fail, BaseException):
        return fail("compile failed")
    return fail()


class CountingCompiler:
    """A compiler for ftjit.jit(compiler=...) that counts its calls.

    * ``calls``: how many times the compiler ran (thread-safe).
    * ``exec_calls``: how many times an executable it returned ran.
    * ``delay``: seconds to sleep in each compile (before failing or returning).
    * ``fail``: None, or an exception instance / class / factory to raise from
      each compile (a fresh instance per compile, same type and args). It may
      be changed between calls.
    * ``on_compile``: optional ``hook(fun, args, kwargs)`` run in each compile
      after the delay (for re-entrancy tests); its exceptions propagate.
    * ``record``: keep every compile's (args, kwargs) in ``seen`` and every
      execution's (args, kwargs) in ``exec_seen``.

    The executables call ``fun`` through a weak reference.
    """

    def __init__(self, delay=0.0, fail=None, on_compile=None, record=False):
        self.delay = delay
        self.fail = fail
        self.on_compile = on_compile
        self.record = record
        self.seen = []
        self.exec_seen = []
        self._lock = threading.Lock()
        self._calls = 0
        self._exec_calls = 0

    @property
    def calls(self):
        with self._lock:
            return self._calls

    @property
    def exec_calls(self):
        with self._lock:
            return self._exec_calls

    def __call__(self, fun, args, kwargs):
        with self._lock:
            self._calls += 1
            if self.record:
                self.seen.append((args, kwargs))
        if self.delay:
            time.sleep(self.delay)
        if self.on_compile is not None:
            self.on_compile(fun, args, kwargs)
        fail = self.fail
        if fail is not None:
            raise _make_exception(fail)
        return self._executable(fun)

    def _executable(self, fun):
        ref = _weak_or_strong(fun)
        lock = self._lock

        def executable(*args, **kwargs):
            with lock:
                self._exec_calls += 1
                if self.record:
                    self.exec_seen.append((args, kwargs))
            target = ref()
            assert target is not None, "executable called after its function died"
            return target(*args, **kwargs)

        return executable


def run_threads(n, target, timeout=30.0):
    """Run ``target(i)`` for i in range(n), in n threads started on a Barrier.

    Joins every thread within ``timeout`` seconds (in total); a thread still
    alive after that fails the test (a hang is a failure, never a stall of the
    suite: the threads are daemons). Re-raises the first worker exception
    (lowest index). Returns the list of results, in index order.
    """
    barrier = threading.Barrier(n)
    results = [None] * n
    errors = [None] * n

    def worker(i):
        try:
            barrier.wait(timeout)
            results[i] = target(i)
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller
            errors[i] = e

    threads = [
        threading.Thread(target=worker, args=(i,), name=f"ftjit-test-{i}", daemon=True)
        for i in range(n)
    ]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    hung = [t.name for t in threads if t.is_alive()]
    if hung:
        pytest.fail(f"{len(hung)} of {n} threads still running after {timeout} s: {hung}")
    for e in errors:
        if e is not None:
            raise e
    return results


def gc_collect_until(predicate, timeout=5.0):
    """Run gc.collect() until ``predicate()`` is true; return its last value.

    One gc.collect() may be a no-op while another thread is collecting, so a
    single call is not enough when tests run in parallel threads.
    """
    deadline = time.monotonic() + timeout
    while True:
        gc.collect()
        if predicate():
            return True
        if time.monotonic() > deadline:
            return bool(predicate())
        time.sleep(0.01)
