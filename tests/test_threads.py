"""Concurrency: compile-once, waiting, errors, re-entrancy, cycles, signals,
and garbage collection racing with lookups.

Every test starts its threads together on a threading.Barrier (helpers.
run_threads), joins them with a timeout (a hang fails the test) and re-raises
worker exceptions."""

import ast
import _thread
import collections
import gc
import itertools
import os
import random
import re
import signal
import subprocess
import sys
import threading
import traceback
import time
import weakref

import numpy as np
import pytest

import ftjit
from helpers import CountingCompiler, child_env, gc_collect_until, run_threads, wait_for

pytestmark = pytest.mark.timeout(120)


def test_00_run_threads_helper_reraises_and_detects_hangs():
    """The helper itself: results in order, worker exceptions re-raised, and a
    hung thread fails the test instead of stalling it."""
    assert run_threads(4, lambda i: i * i) == [0, 1, 4, 9]

    def boom(i):
        if i == 2:
            raise LookupError("worker 2")
        return i

    with pytest.raises(LookupError, match="^worker 2$"):
        run_threads(3, boom)
    release = threading.Event()
    try:
        with pytest.raises(pytest.fail.Exception, match="still running"):
            run_threads(2, lambda i: release.wait(10) if i else None, timeout=0.3)
    finally:
        release.set()


def test_01_thundering_herd_compiles_once():
    """32 threads released together onto one new signature whose compile is
    held until the other 31 wait on it: one compile, every waiter gets its own
    result, and no serialisation: all 32 are inside the executable at once
    (they meet at a 32-party barrier there, which one-at-a-time wake-ups or
    executions under a lock could never pass)."""
    n = 32
    inside = threading.Barrier(n)

    def hook(fun, args, kwargs):
        if not wait_for(lambda: jf.cache_info().waits >= n - 1, 30):
            raise AssertionError(f"only {jf.cache_info().waits} of {n - 1} callers waited on the compile")

    def f(x):
        inside.wait(30)
        return x * 2 + 1

    comp = CountingCompiler(on_compile=hook)
    jf = ftjit.jit(f, compiler=comp, cache=ftjit.FunctionCache())
    assert run_threads(n, lambda i: jf(float(i)), timeout=90) == [i * 2.0 + 1 for i in range(n)]
    assert comp.calls == 1
    assert comp.exec_calls == n
    info = jf.cache_info()
    assert (info.misses, info.compiles, info.size, info.evictions) == (1, 1, 1, 0)
    assert (info.hits, info.waits) == (0, n - 1)


@pytest.mark.parametrize("kind", ["static", "shape"])
def test_02_many_threads_many_signatures(kind):
    """8 threads x 200 calls spread over 20 signatures: exactly 20 compiles and
    every result right, with threads hitting signatures in different orders."""
    n_threads, n_calls, n_sigs = 8, 200, 20
    comp = CountingCompiler(delay=0.001)
    if kind == "static":
        jf = ftjit.jit(lambda x, k: x + k, static_argnums=1, compiler=comp,
                       cache=ftjit.FunctionCache())
        call = lambda v, s: jf(v, s)  # noqa: E731
        expect = lambda v, s: v + s  # noqa: E731
    else:
        jf = ftjit.jit(lambda x: float(x.sum()), compiler=comp, cache=ftjit.FunctionCache())
        call = lambda v, s: jf(np.full(s + 1, v))  # noqa: E731
        expect = lambda v, s: v * (s + 1)  # noqa: E731

    def target(t):
        bad = []
        for k in range(n_calls):
            s = (t * 7 + k) % n_sigs
            v = float(t * 1000 + k)
            r = call(v, s)
            if r != expect(v, s):
                bad.append((v, s, r))
        return bad

    assert run_threads(n_threads, target) == [[]] * n_threads
    assert comp.calls == n_sigs
    info = jf.cache_info()
    assert info.compiles == n_sigs
    assert info.misses == n_sigs
    assert info.size == n_sigs
    assert info.hits + info.waits == n_threads * n_calls - n_sigs


def test_03_recursive_compile_same_signature():
    """A compiler that calls its own jitted function with the signature being
    compiled: RecursiveCompileError (a RecursionError), not a self-deadlock."""
    inner = []
    active = [True]

    def hook(fun, args, kwargs):
        if active[0]:
            try:
                jf(*args, **kwargs)
            except ftjit.RecursiveCompileError as e:
                inner.append(e)
                raise

    comp = CountingCompiler(on_compile=hook)

    def recursing_function(x, n):
        return x * n

    jf = ftjit.jit(recursing_function, static_argnums=1, compiler=comp,
                   cache=ftjit.FunctionCache())
    x = np.ones((3, 5), np.float32)
    with pytest.raises(ftjit.RecursiveCompileError) as ei:
        jf(x, 47)
    assert isinstance(ei.value, RecursionError)
    assert len(inner) == 1
    for err in (inner[0], ei.value):
        msg = str(err)
        assert recursing_function.__qualname__ in msg, msg
        # The signature, readably: dtype, dims and the static value.
        assert "float32" in msg and re.search(r"\b3\b\D{1,4}\b5\b", msg), msg
        assert "47" in msg, msg
        assert "weakref" not in msg.lower(), msg
    # The failed entry is not kept: the next call compiles again.
    active[0] = False
    np.testing.assert_array_equal(jf(x, 47), x * 47)
    assert comp.calls == 2
    assert jf.cache_info().size == 1


def test_04_nested_compile_of_other_signature_is_allowed():
    """A compiler that calls its own jitted function with a different signature:
    a nested compile, which succeeds (only the same signature is recursion)."""

    def hook(fun, args, kwargs):
        if args[0].shape == (3,):
            np.testing.assert_array_equal(jf(np.ones(2)), np.full(2, 2.0))

    comp = CountingCompiler(on_compile=hook)
    jf = ftjit.jit(lambda x: x * 2, compiler=comp, cache=ftjit.FunctionCache())
    np.testing.assert_array_equal(jf(np.ones(3)), np.full(3, 2.0))
    assert comp.calls == 2
    np.testing.assert_array_equal(jf(np.ones(2)), np.full(2, 2.0))
    np.testing.assert_array_equal(jf(np.ones(3)), np.full(3, 2.0))
    assert comp.calls == 2
    assert jf.cache_info().size == 2


def test_05_cross_thread_compile_cycle_is_an_error_not_a_hang():
    """Two threads whose compiles wait on each other (f's compile needs g's
    in-progress signature and vice versa): each thread gets CompileCycleError
    (a RecursionError; the one refused the wait raises it, the other gets it
    as its compile's error), not a hang (run_threads fails one)."""
    both_compiling = threading.Barrier(2)
    active = [True]

    def f_hook(fun, args, kwargs):
        if active[0]:
            both_compiling.wait(10)
            g(1.0)

    def g_hook(fun, args, kwargs):
        if active[0]:
            both_compiling.wait(10)
            f(1.0)

    cache = ftjit.FunctionCache()
    f_comp, g_comp = CountingCompiler(on_compile=f_hook), CountingCompiler(on_compile=g_hook)
    f_fun, g_fun = (lambda x: x + 1), (lambda x: x + 2)
    assert f_fun.__qualname__ == g_fun.__qualname__  # so both threads' messages are one
    f = ftjit.jit(f_fun, compiler=f_comp, cache=cache)
    g = ftjit.jit(g_fun, compiler=g_comp, cache=cache)

    def target(i):
        try:
            return ("ok", (f, g)[i](1.0))
        except Exception as e:  # noqa: BLE001 - examined below
            return ("err", e)

    results = run_threads(2, target, timeout=30)
    for kind, e in results:
        assert kind == "err" and type(e) is ftjit.CompileCycleError, results
        assert isinstance(e, RecursionError)
        # The waiter gets a copy of the refused thread's error: one message.
        assert str(e) == (
            f"compiling in this thread needs {f_fun.__qualname__}(float), which another thread is compiling while it "
            "waits (directly or through other threads) for a compile this thread is running: the compiles "
            "form a cycle and would deadlock. Compile one of the functions first, or break the mutual dependency."
        )
    assert (f_comp.calls, g_comp.calls) == (1, 1)
    for jitted in (f, g):
        info = jitted.cache_info()
        assert (info.compiles, info.failures, info.size) == (0, 1, 0), info
    # Both functions work once the cycle is gone.
    active[0] = False
    assert f(1.0) == 2.0
    assert g(1.0) == 3.0
    assert (f_comp.calls, g_comp.calls) == (2, 2)


def _herd_on_a_failing_compile(n, fail, wait_s):
    """n threads call one new signature whose compile raises ``fail`` (see
    CountingCompiler) once the other n - 1 wait on it (up to ``wait_s``).
    Returns (each thread's exception or None, the compiler, the function)."""

    def hook(fun, args, kwargs):
        # Keep the compile in progress until the other callers are waiting.
        if not wait_for(lambda: jf.cache_info().waits >= n - 1, wait_s):
            raise AssertionError(f"only {jf.cache_info().waits} of {n - 1} callers waited on the compile")

    comp = CountingCompiler(fail=fail, on_compile=hook)
    jf = ftjit.jit(lambda x: x + 1, compiler=comp, cache=ftjit.FunctionCache())

    def target(i):
        try:
            jf(float(i))
        except Exception as e:  # noqa: BLE001 - examined by the caller
            return e
        return None

    return run_threads(n, target), comp, jf


def test_06_failed_compile_reaches_every_waiter_once():
    """8 threads on one signature whose compile raises: the compiling caller and
    all waiters get the error, no waiter starts its own compile, and the
    failed entry is dropped so the next call compiles again."""
    n = 8
    errors, comp, jf = _herd_on_a_failing_compile(n, ValueError("compile failed: boom"), wait_s=10.0)
    for e in errors:
        assert type(e) is ValueError, repr(e)
        assert str(e) == "compile failed: boom"
    # Every thread unwinds its own exception object (the compiling thread the
    # original, each waiter a copy), so no two write one __traceback__.
    assert len({id(e) for e in errors}) == n
    # Each copy keeps the compile's traceback: it shows where it failed.
    for e in errors:
        assert "raise _make_exception(fail)" in "".join(traceback.format_exception(e))
    assert comp.calls == 1
    info = jf.cache_info()
    assert info.size == 0
    assert info.compiles == 0
    assert info.waits == n - 1
    # Not kept: the next call compiles again.
    comp.fail = None
    assert jf(41.0) == 42.0
    assert comp.calls == 2
    info = jf.cache_info()
    assert (info.compiles, info.misses, info.size) == (1, 2, 1)


def test_06b_waiters_of_an_uncopyable_compile_error_each_raise_their_own_exception():
    """When a waiter cannot make its own copy of the compile's exception, it
    raises a fresh RuntimeError caused by it, never the object the other
    threads raise too (they would race on its __traceback__ and __context__)."""

    class Flaky(Exception):
        made = 0  # the original and the one copy made for the waiters; no more

        def __new__(cls, *args):
            cls.made += 1
            if cls.made > 2:
                raise TypeError("no more Flaky objects")
            return super().__new__(cls, *args)

    n = 6
    errors, comp, jf = _herd_on_a_failing_compile(n, lambda: Flaky("compile failed: flaky"), wait_s=10.0)
    assert comp.calls == 1
    originals = [e for e in errors if type(e) is Flaky]
    fresh = [e for e in errors if type(e) is RuntimeError]
    assert len(originals) == 1 and len(fresh) == n - 1, [repr(e) for e in errors]
    assert len({id(e) for e in errors}) == n
    for e in fresh:
        assert str(e) == ("ftjit: the compile of _herd_on_a_failing_compile.<locals>.<lambda>() failed in "
                          "another thread with Flaky, which cannot be copied for this thread (see __cause__)")
        assert type(e.__cause__) is Flaky and e.__cause__.args == ("compile failed: flaky",)
        assert e.__cause__ is not originals[0]
    assert jf.cache_info().failures == 1


class _TwoArgError(Exception):
    """copy.copy cannot rebuild it: __init__ does not take its own args."""

    def __init__(self, a, b):
        super().__init__(f"{a}/{b}")
        self.a = a


class _UncopyableError(Exception):
    """Neither copy.copy nor __new__(cls, *args) can rebuild it."""

    def __new__(cls, a, b):
        return super().__new__(cls, f"{a}/{b}")

    def __init__(self, a, b):
        super().__init__(f"{a}/{b}")


@pytest.mark.parametrize("error_type", [_TwoArgError, _UncopyableError])
def test_06c_waiters_never_share_the_compile_error_object(error_type):
    """A compile error whose type copy.copy cannot rebuild still reaches each
    waiter as an object of its own: a copy of the same type made without
    __init__, or, when even that fails, a RuntimeError caused by it."""
    n = 4
    errors, comp, _ = _herd_on_a_failing_compile(n, lambda: error_type(1, 2), wait_s=10.0)
    assert comp.calls == 1
    assert len({id(e) for e in errors}) == n
    originals = [e for e in errors if type(e) is error_type]
    for e in errors:
        if error_type is _TwoArgError:
            assert type(e) is _TwoArgError and e.args == ("1/2",) and e.a == 1
            assert "raise _make_exception(fail)" in "".join(traceback.format_exception(e))
        elif e is not originals[0]:
            assert type(e) is RuntimeError, repr(e)
            assert str(e) == (
                "ftjit: the compile failed in another thread with _UncopyableError, "
                "which cannot be copied for this thread (see __cause__)"
            )
            assert e.__cause__ is originals[0]
    if error_type is _UncopyableError:
        assert len(originals) == 1 and originals[0].args == ("1/2",)


class _Interrupt(BaseException):
    """A BaseException that is not an Exception, like KeyboardInterrupt."""


@pytest.mark.parametrize("interruption", [KeyboardInterrupt, SystemExit, _Interrupt])
def test_06d_interrupted_compile_is_retried_not_spread_to_waiters(interruption):
    """The compiling thread is interrupted (KeyboardInterrupt, SystemExit: a
    BaseException that is not an Exception). That is the thread's, not the
    compile's result: only it raises; one waiter compiles again and every
    other thread gets its result from that compile."""
    n = 6
    first = [True]
    lock = threading.Lock()

    def hook(fun, args, kwargs):
        with lock:
            interrupted, first[0] = first[0], False
        if interrupted:
            # Interrupt only once every other caller waits on this compile.
            assert wait_for(lambda: jf.cache_info().waits >= n - 1, 5)
            raise interruption("stop")

    comp = CountingCompiler(on_compile=hook)
    jf = ftjit.jit(lambda x: x + 1, compiler=comp, cache=ftjit.FunctionCache())

    def target(i):
        try:
            return ("ok", jf(float(i)))
        except BaseException as e:  # noqa: BLE001 - examined below
            return ("err", e)

    results = run_threads(n, target)
    errors = [r[1] for r in results if r[0] == "err"]
    assert len(errors) == 1, results
    assert type(errors[0]) is interruption and errors[0].args == ("stop",)
    for i, (kind, value) in enumerate(results):
        assert kind == "err" or value == float(i) + 1, (i, results)
    assert comp.calls == 2  # the interrupted compile, and one retry
    info = jf.cache_info()
    assert (info.compiles, info.failures, info.size) == (1, 1, 1)
    assert jf(10.0) == 11.0 and comp.calls == 2


@pytest.mark.parametrize("how", ["call", "precompile"])
def test_06e_retry_after_an_abandoned_compile_keeps_its_signature(how):
    """B's lookup misses, then finds A's entry inserted meanwhile (B's insert
    loses), and waits; A's compile is interrupted; B looks its signature up
    again and compiles it. That retry must use B's real signature (it was
    once consumed by the lost insert), so the entry is found by later calls."""

    class Interrupt(BaseException):
        pass

    b_in_insert, a_compiling = threading.Event(), threading.Event()
    b_eq_calls = [0]
    armed = [False]

    class S:
        def __init__(self, v):
            self.v = v

        def __hash__(self):
            return 0  # collides with S(0): every lookup of S(1) runs __eq__

        def __eq__(self, other):
            if threading.current_thread().name == "B":
                b_eq_calls[0] += 1
                if b_eq_calls[0] == 2:  # in B's insert, after its plain lookup missed
                    b_in_insert.set()
                    assert a_compiling.wait(10)
            return isinstance(other, S) and self.v == other.v

    def hook(fun, args, kwargs):
        if armed[0] and threading.current_thread().name == "A":
            armed[0] = False
            a_compiling.set()
            assert wait_for(lambda: jf.cache_info().waits >= 1, 10)  # B waits on A's entry
            raise Interrupt("stop")

    comp = CountingCompiler(on_compile=hook)
    jf = ftjit.jit(lambda x, s: x + s.v, static_argnums=1, compiler=comp, cache=ftjit.FunctionCache())
    assert jf(1.0, S(0)) == 1.0
    armed[0] = True
    out = {}

    def run(name):
        try:
            if name == "B" and how == "precompile":
                out[name] = jf.precompile(1.0, S(1))
            else:
                out[name] = jf(1.0, S(1))
        except BaseException as e:  # noqa: BLE001 - examined below
            out[name] = e

    b = threading.Thread(target=run, args=("B",), name="B", daemon=True)
    b.start()
    assert b_in_insert.wait(10)
    a = threading.Thread(target=run, args=("A",), name="A", daemon=True)
    a.start()
    for t in (a, b):
        t.join(15)
        assert not t.is_alive(), t.name
    assert type(out["A"]) is Interrupt, out
    assert out["B"] == (True if how == "precompile" else 2.0), out
    assert comp.calls == 3  # S(0), A's interrupted compile, B's retry
    assert jf(1.0, S(1)) == 2.0  # B's entry is found: a hit
    assert comp.calls == 3
    assert jf.cache_info().size == 2
    assert sorted(s.signature.count("S") for s in jf.signatures()) == [1, 1]


def test_06f_precompile_waiting_on_an_interrupted_compile_compiles_it():
    """A precompile that waited on a compile the compiling thread abandoned
    (KeyboardInterrupt) compiles the signature itself and says so (True)."""
    first = [True]

    def hook(fun, args, kwargs):
        if first[0]:
            first[0] = False
            assert wait_for(lambda: jf.cache_info().waits >= 1, 5)
            raise KeyboardInterrupt

    comp = CountingCompiler(on_compile=hook)
    jf = ftjit.jit(lambda x: x + 1, compiler=comp, cache=ftjit.FunctionCache())

    def target(i):
        if i == 0:
            try:
                jf(1.0)
            except KeyboardInterrupt:
                return "interrupted"
            return "not interrupted"
        assert wait_for(lambda: comp.calls == 1, 5)
        try:
            return jf.precompile(2.0)
        except BaseException as e:  # noqa: BLE001 - a KeyboardInterrupt must fail the test, not end the run
            return e

    assert run_threads(2, target) == ["interrupted", True]
    assert comp.calls == 2
    assert comp.exec_calls == 0
    assert jf(3.0) == 4.0 and comp.calls == 2


def test_07_executable_error_propagates_and_entry_stays():
    """Executables raising in many threads: each caller gets its own error and
    the compiled entry stays (no recompiles)."""

    def f(x):
        if x < 0:
            raise ArithmeticError(f"negative {x}")
        return x * 2

    comp = CountingCompiler()
    jf = ftjit.jit(f, compiler=comp, cache=ftjit.FunctionCache())

    def target(i):
        out = []
        for k in range(20):
            v = -float(i * 100 + k + 1)
            try:
                jf(v)
            except ArithmeticError as e:
                out.append(str(e) == f"negative {v}")
            out.append(jf(-v) == -2 * v)
        return all(out) and len(out) == 40

    assert run_threads(8, target) == [True] * 8
    assert comp.calls == 1
    assert comp.exec_calls == 8 * 40
    info = jf.cache_info()
    assert (info.size, info.compiles, info.misses) == (1, 1, 1)


@pytest.mark.thread_unsafe(reason="delivers SIGINT to the main thread")
def test_08_wait_is_interruptible_by_ctrl_c():
    """The main thread waiting on another thread's compile answers Ctrl-C
    (KeyboardInterrupt) while that compile still runs: the interrupt is sent
    once main is registered as waiting, and the compile is held (up to 60 s)
    until main has caught it, so a wait that ignored the interrupt would end
    only with the compile and fail the test."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals are only delivered to the main thread")
    started, release = threading.Event(), threading.Event()

    def hook(fun, args, kwargs):
        started.set()
        release.wait(60)

    comp = CountingCompiler(on_compile=hook)
    jf = ftjit.jit(lambda x: x + 1, compiler=comp, cache=ftjit.FunctionCache())
    result = []
    worker = threading.Thread(target=lambda: result.append(jf(1.0)), daemon=True)
    worker.start()
    assert started.wait(5)

    poked = []

    def poke():
        # The worker compiles (it does not wait): the one waiter is main.
        poked.append(wait_for(lambda: ftjit._core._waiting_threads() >= 1, 10))
        _thread.interrupt_main()

    poker = threading.Thread(target=poke, daemon=True)
    old_handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    interrupted = False
    result_when_interrupted = None
    try:
        poker.start()
        try:
            jf(2.0)  # same signature: waits on the worker's compile
        except KeyboardInterrupt:
            interrupted = True
            result_when_interrupted = list(result)
        if not interrupted:
            # Swallow the interrupt still to come, so it cannot hit pytest.
            try:
                poker.join(15)
                for _ in range(50):
                    time.sleep(0.01)
            except KeyboardInterrupt:
                pass
    finally:
        release.set()
        poker.join(15)
        signal.signal(signal.SIGINT, old_handler)
    worker.join(10)
    assert not worker.is_alive()
    assert not poker.is_alive()
    assert poked == [True], "main never registered as waiting on the compile"
    assert interrupted, "KeyboardInterrupt did not interrupt the wait"
    assert result_when_interrupted == [], "the wait ended only when the compile did"
    assert result == [2.0]
    assert comp.calls == 1
    # The interrupted waiter left the entry intact.
    assert jf(5.0) == 6.0
    assert comp.calls == 1


@pytest.mark.thread_unsafe(reason="re-arms SIGINT in the main thread")
def test_ctrl_c_while_an_error_message_is_built_is_not_lost():
    """repr() of user objects while ftjit builds an error message runs the
    signal handlers first; a KeyboardInterrupt raised there must reach the
    program (re-armed), not be swallowed with the failed repr."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals are only delivered to the main thread")

    class Key:
        def __repr__(self):
            raise KeyboardInterrupt  # as a Ctrl-C landing in repr() would

        def __lt__(self, other):
            return id(self) < id(other)

    jf = ftjit.jit(lambda d: d, compiler=CountingCompiler(), cache=ftjit.FunctionCache())
    old_handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    interrupt = None
    try:
        try:
            jf({Key(): {1: 1.0, "a": 2.0}})  # unsortable inner keys: the message repr()s Key
        except TypeError:
            for _ in range(1000):  # the re-armed SIGINT is handled at the next check
                time.sleep(0)
    except KeyboardInterrupt as e:
        interrupt = e
    finally:
        signal.signal(signal.SIGINT, old_handler)
    assert interrupt is not None, "the KeyboardInterrupt was lost"
    # Raised while the call's TypeError (with its best-effort message) was handled.
    assert type(interrupt.__context__) is TypeError
    assert "d[<unprintable Key>]" in str(interrupt.__context__)


@pytest.mark.thread_unsafe(reason="installs a SIGINT handler in the main thread")
@pytest.mark.parametrize("where", ["worker_thread", "custom_handler"])
def test_a_swallowed_keyboard_interrupt_is_not_re_armed_where_it_would_misfire(where):
    """Re-arming means a SIGINT for the main thread: from a worker thread it
    would interrupt the wrong thread, and a custom handler would run a second
    time. There the interrupt is dropped as before (message still built)."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals are only delivered to the main thread")

    class Key:
        def __repr__(self):
            raise KeyboardInterrupt

        def __lt__(self, other):
            return id(self) < id(other)

    jf = ftjit.jit(lambda d: d, compiler=CountingCompiler(), cache=ftjit.FunctionCache())
    handled = []
    handler = signal.default_int_handler if where == "worker_thread" else (lambda *a: handled.append(a))
    old_handler = signal.signal(signal.SIGINT, handler)
    messages = []

    def call():
        try:
            jf({Key(): {1: 1.0, "a": 2.0}})
        except TypeError as e:
            messages.append(str(e))

    interrupted = False
    try:
        if where == "worker_thread":
            run_threads(1, lambda i: call())
        else:
            call()
        for _ in range(1000):
            time.sleep(0)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        signal.signal(signal.SIGINT, old_handler)
    assert len(messages) == 1 and "d[<unprintable Key>]" in messages[0], messages
    assert not interrupted
    assert handled == []


@pytest.mark.thread_unsafe(reason="delivers SIGUSR1 to the main thread")
def test_08b_a_signal_handler_that_compiles_inside_a_wait_closes_no_false_cycle():
    """The main thread waits on f, which thread B compiles. A signal handler
    runs in the main thread during that wait and compiles g; B's compile of f
    then needs g. Nothing is deadlocked (the handler is running, not waiting:
    g gets published, then f), so both calls succeed; the wait-for graph must
    not take the main thread for blocked on f meanwhile (before the fix: both
    got CompileCycleError)."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals are only delivered to the main thread")
    if not hasattr(signal, "pthread_kill"):
        pytest.skip("needs signal.pthread_kill")
    b_compiling, handler_compiling = threading.Event(), threading.Event()
    cache = ftjit.FunctionCache()

    def f_hook(fun, args, kwargs):  # in thread B
        b_compiling.set()
        assert handler_compiling.wait(10)
        assert g(1.0) == 4.0  # waits for the handler's compile of g

    def g_hook(fun, args, kwargs):  # in the main thread's signal handler
        handler_compiling.set()
        assert wait_for(lambda: g.cache_info().waits == 1, 10), "B never waited on g"

    f = ftjit.jit(lambda x: x + 1, compiler=CountingCompiler(on_compile=f_hook), cache=cache)
    g = ftjit.jit(lambda x: x + 3, compiler=CountingCompiler(on_compile=g_hook), cache=cache)
    outcomes = {}

    def handler(signum, frame):
        outcomes["handler"] = g(1.0)

    def poke():
        assert wait_for(lambda: f.cache_info().waits == 1, 10), "main never waited on f"
        signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)

    b = threading.Thread(target=lambda: outcomes.setdefault("B", f(1.0)), daemon=True)
    poker = threading.Thread(target=poke, daemon=True)
    old_handler = signal.signal(signal.SIGUSR1, handler)
    try:
        b.start()
        assert b_compiling.wait(10)
        poker.start()
        outcomes["main"] = f(1.0)  # waits on B's compile; the handler runs inside that wait
    finally:
        signal.signal(signal.SIGUSR1, old_handler)
    for t in (b, poker):
        t.join(15)
        assert not t.is_alive(), t.name
    assert outcomes == {"B": 2.0, "main": 2.0, "handler": 4.0}
    assert (f.cache_info().compiles, g.cache_info().compiles) == (1, 1)
    assert (f.cache_info().waits, g.cache_info().waits) == (1, 1)
    assert ftjit._core._waiting_threads() == 0


@pytest.mark.thread_unsafe(reason="delivers SIGUSR1 to the main thread")
@pytest.mark.parametrize("cycle_closes", ["after_nested_wait", "during_nested_wait"])
def test_08c_nested_wait_in_a_signal_handler_keeps_cycle_detection(cycle_closes):
    """The main thread compiles h, whose compile waits on f, which thread A is
    compiling. While main waits, a signal handler runs in it and itself waits
    on a third compile (g, by thread B): a nested wait. Then A's compile of f
    asks for h, closing the cycle main -> f -> A -> h -> main, either after the
    nested wait ended or while it still hides main's wait on f. Both threads
    must get CompileCycleError within a few seconds, not wait for the compile
    timeout (before the fix: the nested wait erased main's wait-for edge)."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals are only delivered to the main thread")
    if not hasattr(signal, "pthread_kill"):
        pytest.skip("needs signal.pthread_kill")
    a_compiling, go_a = threading.Event(), threading.Event()
    g_compiling, release_g, handler_done = threading.Event(), threading.Event(), threading.Event()
    cache = ftjit.FunctionCache()
    active = [True]

    def f_hook(fun, args, kwargs):  # in thread A
        if active[0]:
            a_compiling.set()
            assert go_a.wait(10)
            h(1.0)

    def h_hook(fun, args, kwargs):  # in the main thread
        if active[0]:
            f(1.0)

    def g_hook(fun, args, kwargs):  # in thread B
        if active[0]:
            g_compiling.set()
            assert release_g.wait(10)

    kw = dict(cache=cache, compile_timeout=8.0)
    f = ftjit.jit(lambda x: x + 1, compiler=CountingCompiler(on_compile=f_hook), **kw)
    h = ftjit.jit(lambda x: x + 2, compiler=CountingCompiler(on_compile=h_hook), **kw)
    g = ftjit.jit(lambda x: x + 3, compiler=CountingCompiler(on_compile=g_hook), **kw)
    outcomes = {}

    def catch(name, fn):
        try:
            outcomes[name] = ("ok", fn())
        except BaseException as e:  # noqa: BLE001 - examined below
            outcomes[name] = ("err", e)

    b = threading.Thread(target=catch, args=("B", lambda: g(1.0)), daemon=True)

    def handler(signum, frame):
        b.start()
        assert g_compiling.wait(5)
        catch("handler", lambda: g(1.0))  # the nested wait
        handler_done.set()

    def poke():
        assert wait_for(lambda: ftjit._core._waiting_threads() >= 1, 5)  # main waits on f
        signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)
        assert wait_for(lambda: g.cache_info().waits == 1, 5)  # the handler waits on g
        if cycle_closes == "after_nested_wait":
            release_g.set()
            assert handler_done.wait(5)
            go_a.set()
        else:
            go_a.set()
            # A waits on h while main's innermost wait is still the one on g.
            assert wait_for(lambda: ftjit._core._waiting_threads() >= 2, 5)
            release_g.set()

    a = threading.Thread(target=catch, args=("A", lambda: f(1.0)), daemon=True)
    poker = threading.Thread(target=catch, args=("poker", poke), daemon=True)
    old_handler = signal.signal(signal.SIGUSR1, handler)
    try:
        a.start()
        assert a_compiling.wait(5)
        poker.start()
        # No timeout is set: a cycle missed here would hang (the test's timeout fails it).
        catch("main", lambda: h(1.0))
    finally:
        signal.signal(signal.SIGUSR1, old_handler)
        go_a.set()
        release_g.set()
    for t in (a, b, poker):
        t.join(15)
        assert not t.is_alive(), t.name
    assert outcomes["poker"] == ("ok", None), outcomes
    assert outcomes["B"] == ("ok", 4.0), outcomes
    assert outcomes["handler"] == ("ok", 4.0), outcomes
    for name in ("main", "A"):
        kind, err = outcomes[name]
        assert kind == "err" and type(err) is ftjit.CompileCycleError, (name, outcomes[name])
        assert "the compiles form a cycle" in str(err)
    assert ftjit._core._waiting_threads() == 0
    # Nothing failed is kept: f and h compile again once the cycle is gone.
    active[0] = False
    assert (f(1.0), h(1.0), g(1.0)) == (2.0, 3.0, 4.0)


class Reentrant:
    """A static argument whose __eq__ re-enters the jitted function `jf` and
    clears its cache in the middle of the lookup."""

    depth = threading.local()

    def __init__(self, v, jf_box):
        self.v = v
        self.jf_box = jf_box

    def __hash__(self):
        return 4242

    def __eq__(self, other):
        if other is self:
            return True
        if not isinstance(other, Reentrant):
            return NotImplemented
        d = getattr(Reentrant.depth, "n", 0)
        if d == 0:
            Reentrant.depth.n = 1
            try:
                jf = self.jf_box[0]
                assert jf(10.0, 3) == 30.0  # re-enter: a different signature
                jf.clear_cache()  # clear from inside the lookup
                assert jf(10.0, 3) == 30.0
            finally:
                Reentrant.depth.n = 0
        return self.v == other.v


def _reentrant_function(x, k):
    return x * k if isinstance(k, int) else x + k.v


def test_09_static_eq_reenters_and_clears_cache():
    """A static argument's __eq__ that calls the same jitted function and
    clear_cache() during the lookup: no crash, no deadlock, right results."""
    box = []
    comp = CountingCompiler()
    jf = ftjit.jit(_reentrant_function, static_argnums=1, compiler=comp,
                   cache=ftjit.FunctionCache())
    box.append(jf)
    r1, r2, r1b = Reentrant(1, box), Reentrant(2, box), Reentrant(1, box)
    assert jf(1.0, r1) == 2.0
    for _ in range(5):
        assert jf(1.0, r2) == 3.0
        assert jf(2.0, r1) == 3.0
        assert jf(2.0, r1b) == 3.0  # equal to r1: compares, re-enters, clears
        assert jf(4.0, 5) == 20.0
    # Deterministic: every r1b lookup compares with r1 (same hash), whose
    # __eq__ compiles (10.0, 3), clears, compiles it again; so the 4 loop
    # signatures are compiled again after each clear. A clear that did
    # nothing from inside the lookup would leave 4 entries and 4 compiles.
    info = jf.cache_info()
    assert (info.hits, info.misses, info.compiles, info.size) == (15, 28, 28, 2)
    assert comp.calls == 28
    jf.clear_cache()
    assert jf.cache_info().size == 0
    assert jf(7.0, r2) == 9.0


def test_10_static_eq_reentry_from_many_threads():
    """The re-entrant, cache-clearing __eq__ from 8 threads at once on one
    function: every result right, nothing hangs."""
    box = []
    comp = CountingCompiler()
    jf = ftjit.jit(_reentrant_function, static_argnums=1, compiler=comp,
                   cache=ftjit.FunctionCache())
    box.append(jf)

    def target(i):
        keys = [Reentrant(v, box) for v in range(3)]
        ok = True
        for k in range(30):
            key = keys[(i + k) % 3]
            ok &= jf(float(k), key) == k + key.v
            ok &= jf(float(k), 2) == 2.0 * k
        return ok

    assert run_threads(8, target, timeout=60) == [True] * 8
    assert jf.cache_info().compiles == comp.calls
    # 4 signatures; more compiles prove the clears inside __eq__ took effect.
    assert comp.calls > 4


def test_11_gc_weakref_callback_during_another_threads_lookup():
    """Functions dying in reference cycles (their weakref callbacks removing
    entries) while other threads' lookups run __eq__ that allocates and calls
    gc.collect(), all on one FunctionCache."""
    cache = ftjit.FunctionCache()
    eq_calls = itertools.count()

    class Collider:
        def __init__(self, v):
            self.v = v

        def __hash__(self):
            return 99

        def __eq__(self, other):
            if other is self:
                return True
            if not isinstance(other, Collider):
                return NotImplemented
            junk = [[] for _ in range(2000)]  # trips automatic collections
            del junk
            n = next(eq_calls)
            gc.collect(2 if n % 16 == 0 else 0)
            return self.v == other.v

    comp = CountingCompiler()
    jf = ftjit.jit(lambda x, k: x + k.v, static_argnums=1, compiler=comp, cache=cache)
    dying_comp = CountingCompiler()
    dead_refs = []
    refs_lock = threading.Lock()

    def lookups(t):
        ok = True
        for k in range(40):
            c = Collider(k % 5)
            ok &= jf(float(k), c) == k + c.v
        return ok

    def dying(t):
        for k in range(60):
            def g(x, n):
                return x + n

            jg = ftjit.jit(g, static_argnums=1, compiler=dying_comp, cache=cache)
            assert jg(1.0, 1) == 2.0
            assert jg(1.0, 2) == 3.0
            g.cycle = (g, jg)  # only the garbage collector frees these
            with refs_lock:
                dead_refs.append(weakref.ref(g))
            del g, jg
        return True

    results = run_threads(4, lambda i: lookups(i) if i < 2 else dying(i), timeout=90)
    assert results == [True] * 4
    assert comp.calls == 5
    assert dying_comp.calls == 2 * 60 * 2
    assert gc_collect_until(lambda: all(r() is None for r in dead_refs))
    assert gc_collect_until(lambda: cache.size() == 5), cache.size()
    assert jf.cache_info().size == 5
    for v in range(5):
        assert jf(1.0, Collider(v)) == 1.0 + v
    assert comp.calls == 5


def test_12_disable_jit_is_thread_local():
    """disable_jit() in one thread while another thread calls the same function:
    only the disabling thread bypasses the compiler."""
    direct = []

    def f(x):
        direct.append(threading.get_ident())
        return x if isinstance(x, str) else x + 1

    comp = CountingCompiler()
    jf = ftjit.jit(f, compiler=comp, cache=ftjit.FunctionCache())
    inside, compiled, done = (threading.Barrier(2) for _ in range(3))

    def target(i):
        if i == 0:
            with ftjit.disable_jit():
                inside.wait(10)
                compiled.wait(10)  # thread 1 compiled this signature meanwhile
                r = jf(1.0)  # still bypasses: fun runs directly, not the executable
                s = jf("not a leaf")  # no signature is built at all
                done.wait(10)
            return r, s
        inside.wait(10)
        r = jf(2.0)  # thread 0 is inside disable_jit() right now
        compiled.wait(10)
        done.wait(10)
        return r

    assert run_threads(2, target) == [(2.0, "not a leaf"), 3.0]
    assert comp.calls == 1  # thread 1's call only
    assert comp.exec_calls == 1  # thread 0's calls never reached the executable
    assert len(direct) == 3  # thread 0 twice directly, thread 1 once via the executable
    # Outside disable_jit() the main thread uses the compiled entry.
    assert jf(3.0) == 4.0
    assert (comp.calls, comp.exec_calls) == (1, 2)


def test_13_clear_cache_while_other_threads_call():
    """clear_cache() hammered from two threads while six threads call over four
    signatures: right results, consistent counters."""
    comp = CountingCompiler()
    jf = ftjit.jit(lambda x, k: x * k, static_argnums=1, compiler=comp,
                   cache=ftjit.FunctionCache())

    def target(i):
        if i < 2:
            for _ in range(50):
                jf.clear_cache()
                time.sleep(0.0005)
            return True
        ok = True
        for k in range(300):
            ok &= jf(float(k), k % 4) == float(k) * (k % 4)
        return ok

    assert run_threads(8, target) == [True] * 8
    info = jf.cache_info()
    assert comp.calls >= 4
    assert info.compiles == comp.calls
    assert info.misses == comp.calls
    assert info.size <= 4
    jf.clear_cache()
    assert jf.cache_info().size == 0


def test_14_wrappers_created_and_dropped_concurrently():
    """8 threads each creating, calling and dropping 30 jitted functions on one
    shared FunctionCache: every entry leaves the cache with its function."""
    cache = ftjit.FunctionCache()
    comp = CountingCompiler()
    refs = []
    lock = threading.Lock()

    def target(t):
        ok = True
        for k in range(30):
            def g(x, _c=t * 100 + k):
                return x + _c

            jg = ftjit.jit(g, compiler=comp, cache=cache)
            ok &= jg(1.0) == 1.0 + t * 100 + k
            ok &= jg(2.0) == 2.0 + t * 100 + k
            with lock:
                refs.append(weakref.ref(g))
            del g, jg
        return ok

    assert run_threads(8, target) == [True] * 8
    assert comp.calls == 8 * 30
    assert gc_collect_until(lambda: all(r() is None for r in refs))
    assert gc_collect_until(lambda: cache.size() == 0), cache.size()


def test_15_compiles_of_different_signatures_do_not_block_each_other():
    """While one signature's compile is held open, another thread compiles and
    runs a different signature of the same function (no global compile lock)."""
    started, release = threading.Event(), threading.Event()
    order = []

    def hook(fun, args, kwargs):
        if args[0] == "slow":
            started.set()
            assert release.wait(10)

    comp = CountingCompiler(on_compile=hook)
    jf = ftjit.jit(lambda tag, x: x + 1, static_argnums=0, compiler=comp,
                   cache=ftjit.FunctionCache())

    def target(i):
        if i == 0:
            r = jf("slow", 1.0)
            order.append("slow")
            return r
        assert started.wait(10)
        r = jf("fast", 2.0)
        order.append("fast")
        release.set()
        return r

    assert run_threads(2, target) == [2.0, 3.0]
    assert order == ["fast", "slow"]
    assert comp.calls == 2


def test_16_waiters_get_their_own_results():
    """8 threads on one new signature, the compile held until all 7 others are
    waiting: one compile, each thread's result computed from its own value."""
    n = 8

    def hook(fun, args, kwargs):
        if not wait_for(lambda: jf.cache_info().waits >= n - 1, 10.0):
            raise AssertionError(f"only {jf.cache_info().waits} of {n - 1} callers waited on the compile")

    comp = CountingCompiler(on_compile=hook)
    jf = ftjit.jit(lambda x, y: x * 10 + y, compiler=comp, cache=ftjit.FunctionCache())

    results = run_threads(n, lambda i: jf(float(i), y=float(-i)))
    assert results == [i * 10.0 - i for i in range(n)]
    assert comp.calls == 1
    info = jf.cache_info()
    assert (info.misses, info.compiles, info.waits, info.size) == (1, 1, n - 1, 1)


def test_17_two_wrappers_of_one_function_compile_once_concurrently():
    """Two jit wrappers of the same function, options and cache, called from 8
    threads at once on one new signature: they share one compile."""
    n = 8
    comp = CountingCompiler(delay=0.05)
    cache = ftjit.FunctionCache()

    def f(x):
        return x - 1

    wrappers = [ftjit.jit(f, compiler=comp, cache=cache) for _ in range(2)]
    results = run_threads(n, lambda i: wrappers[i % 2](float(i)))
    assert results == [i - 1.0 for i in range(n)]
    assert comp.calls == 1
    assert cache.size() == 1


def test_18_failed_compile_then_concurrent_retry():
    """After a failed compile, 8 threads retry the same signature together:
    exactly one new compile serves them all."""
    comp = CountingCompiler(fail=RuntimeError("first compile fails"))
    jf = ftjit.jit(lambda x: x * 3, compiler=comp, cache=ftjit.FunctionCache())
    with pytest.raises(RuntimeError, match="^first compile fails$"):
        jf(1.0)
    assert comp.calls == 1
    comp.fail = None
    comp.delay = 0.05
    assert run_threads(8, lambda i: jf(float(i))) == [3.0 * i for i in range(8)]
    assert comp.calls == 2


def test_19_execution_time_recursion_is_not_compile_recursion():
    """A function that calls its own jitted self while executing (after its
    compile finished), from 4 threads: plain recursion, no RecursiveCompileError."""
    comp = CountingCompiler(delay=0.01)

    def fact(n):
        return 1 if n <= 1 else n * jf(n - 1)

    jf = ftjit.jit(fact, compiler=comp, cache=ftjit.FunctionCache())
    assert run_threads(4, lambda i: jf(5 + i)) == [120, 720, 5040, 40320]
    assert comp.calls == 1  # one signature: a weak-typed Python int


def test_20_bounded_cache_under_concurrency_keeps_its_books():
    """8 threads, each with its own function, churning one small shared LRU:
    right results, the bound holds, and compiles - evictions == size."""
    cache = ftjit.FunctionCache(capacity=5)
    comp = CountingCompiler()
    fns = [ftjit.jit(lambda x, k, _t=t: x + k + _t, static_argnums=1, compiler=comp,
                     cache=cache) for t in range(8)]

    def target(t):
        ok = True
        for j in range(100):
            k = (j * 3 + t) % 10
            ok &= fns[t](1.0, k) == 1.0 + k + t
        return ok

    assert run_threads(8, target) == [True] * 8
    infos = [f.cache_info() for f in fns]
    # Entries leave only by eviction, and only while over capacity: once 5 are
    # in, the size never drops below 5 (and the bound holds once no compile pins one).
    assert cache.size() == 5
    assert sum(i.size for i in infos) == cache.size()
    assert sum(i.compiles for i in infos) == comp.calls
    for i in infos:
        assert i.misses == i.compiles
        assert i.hits + i.waits + i.misses == 100
        assert i.compiles - i.evictions == i.size



def test_20b_thousands_of_misses_racing_with_hits_on_12_threads_lose_no_entry():
    """12 threads, each missing on 500 signatures of its own and on 500 shared
    with the others (in an order of its own), with two hits on signatures it
    saw compiled after every call: the ready table grows (and is rebuilt) under
    the hits of the other threads. Every call runs the executable compiled for
    its own signature, each signature compiles exactly once, the books balance
    and, at the end, every signature is a hit."""
    n_threads, own, shared = 12, 500, 500
    total = n_threads * own + shared
    compiled = collections.Counter()
    lock = threading.Lock()

    def compiler(fun, args, kwargs):
        k = args[1]
        with lock:
            compiled[k] += 1
        return lambda x, n: (k, n, x)  # the signature it was compiled for, then the call's

    jf = ftjit.jit(lambda x, n: None, static_argnums=1, compiler=compiler,
                   cache=ftjit.FunctionCache(capacity=1 << 16))

    def target(t):
        rng = random.Random(t)
        keys = list(range(shared + t * own, shared + (t + 1) * own)) + list(range(shared))
        rng.shuffle(keys)
        seen, bad = [], []
        for i, k in enumerate(keys):
            if jf(float(i), k) != (k, k, float(i)):
                bad.append(("miss", k))
            seen.append(k)
            for _ in range(2):
                h = seen[rng.randrange(len(seen))]
                if jf(-1.0, h) != (h, h, -1.0):
                    bad.append(("hit", h))
        return bad

    assert run_threads(n_threads, target, timeout=90) == [[]] * n_threads
    assert len(compiled) == total and set(compiled.values()) == {1}
    info = jf.cache_info()
    assert (info.compiles, info.misses, info.size, info.evictions, info.failures) == (total, total, total, 0, 0)
    assert info.hits + info.waits + info.misses == n_threads * (own + shared) * 3
    for k in range(total):
        assert jf(0.5, k) == (k, k, 0.5)
    assert sum(compiled.values()) == total
    assert jf.cache_info().hits == info.hits + total

DEEP_RECURSION = """
import sys, threading, ftjit
from ftjit import _core
stack_mib, limit = int(sys.argv[1]), int(sys.argv[2])
if limit:
    sys.setrecursionlimit(limit)
f = ftjit.jit(lambda n, x: x if n == 0 else f(n - 1, x), compiler=lambda fun, a, k: fun)
threading.stack_size(stack_mib << 20)
out = []
def run():
    try:
        f(100_000, 1.0)
    except RecursionError as e:
        out.append(str(e))
    out.append(f(20, 2.0))  # usable afterwards (20 levels: under ThreadSanitizer about 70 fit in 1 MiB)
    out.append(_core._debug_stack()[1] >> 10)  # the stack's size, as the message gives it
t = threading.Thread(target=run)
t.start()
t.join(60)
print(repr(out))
"""


@pytest.mark.parametrize("stack_mib", [1, 2])
@pytest.mark.parametrize("limit", [0, 1500, 3000])
def test_21_deep_recursion_through_a_jitted_function_is_a_recursion_error_not_a_crash(stack_mib, limit):
    """Each level of recursion through a jitted function runs C frames of
    ftjit's and of CPython's, which no recursion count bounds (3.12 and
    3.13 count C calls up to 8,000-10,000, 3.11 counts both kinds against
    a limit that can be raised): a runaway recursion on a 1 or 2 MiB thread
    stack, at the default limit (0 here) or a raised one, is a
    RecursionError, not a segfault (it was rc -11 at e4148de on 3.13t at
    the default limit and on 3.11 at 1500). Either the count or the check
    of the stack's headroom (ThreadStack) stops it; at a 3000 limit the
    stack always comes first."""
    proc = subprocess.run([sys.executable, "-c", DEEP_RECURSION, str(stack_mib), str(limit)], capture_output=True,
                          text=True, timeout=120, env=child_env())
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    message, after, size_kib = ast.literal_eval(proc.stdout.strip())
    assert after == 2.0
    by_stack = ("maximum recursion depth exceeded while calling a jitted function: less than 64 KiB of this "
                f"thread's {size_kib} KiB C stack is left (a recursion through jitted functions; a thread made "
                "after threading.stack_size(n) with a larger n has room for more levels)")
    assert stack_mib << 10 >= size_kib > (stack_mib << 10) - 64
    if limit == 3000:
        assert message == by_stack
    else:
        assert message in (by_stack, "maximum recursion depth exceeded while calling a jitted function")
