"""The one policy for a pending Ctrl-C (cpp/pyutil/errors.h), path by path.

Where the core swallows an error that Python code it runs for itself raised
(a context's __eq__, repr() for a message, a logging hook, copying a failed
compile's exception for waiters, repr() of the wrapped function), a
KeyboardInterrupt among them is never lost on the main thread under
Python's default SIGINT handler: it is re-armed, and the interpreter's next
signal check raises it. In any other thread, or under a custom handler, it
is dropped and the call carries on as if the error had been any other.
"""

from __future__ import annotations

import logging
import signal
import threading
import time

import pytest

import ftjit

from helpers import CountingCompiler, ThreadContextCompiler, run_threads

pytestmark = pytest.mark.thread_unsafe(reason="sets the SIGINT handler, runs code on the main thread")


class _Once:
    """Raises KeyboardInterrupt the first time it is asked."""

    def __init__(self):
        self.fired = 0

    def fire(self):
        if self.fired == 0:
            self.fired += 1
            raise KeyboardInterrupt


class _Ctx:
    """A compiler context of equal hash per key whose __eq__ can be made to raise."""

    def __init__(self, key, once=None):
        self.key, self.once = key, once

    def __hash__(self):
        return hash(self.key)

    def __eq__(self, other):
        if other is self:
            return True
        if self.once is not None:
            self.once.fire()
        return isinstance(other, _Ctx) and other.key == self.key


def _context_eq_path():
    """A context equal in hash to an interned one, whose __eq__ raises."""
    once = _Once()
    comp = ThreadContextCompiler()
    f = ftjit.jit(lambda x: x + 1, compiler=comp, cache=ftjit.FunctionCache())

    def call():
        comp.local.cur = _Ctx(("same", id(once)), once)  # interned first: its __eq__ is asked
        assert f(1.0) == 2.0
        comp.local.cur = _Ctx(("same", id(once)))  # a different object of equal hash
        return f(2.0)

    return once, call, 3.0


class _Static:
    def __init__(self, once):
        self.once = once

    def __hash__(self):
        return 7

    def __eq__(self, other):
        return isinstance(other, _Static)

    def __repr__(self):
        self.once.fire()
        return "_Static()"


def _static_repr_path():
    """The compile's log line prints a static argument whose __repr__ raises."""
    once = _Once()
    f = ftjit.jit(lambda x, s: x * 2, static_argnums=1, compiler=CountingCompiler(), cache=ftjit.FunctionCache())
    return once, lambda: f(2.0, _Static(once)), 4.0


class _RaisingHandler(logging.Handler):
    def __init__(self, once):
        super().__init__(logging.INFO)
        self.once = once

    def emit(self, record):
        self.once.fire()


def _logging_hook_path():
    """A logging handler of the ftjit logger raises in the compile's log line."""
    once = _Once()
    f = ftjit.jit(lambda x: x - 1, compiler=CountingCompiler(), cache=ftjit.FunctionCache())
    logger = logging.getLogger("ftjit")
    handler = _RaisingHandler(once)

    def call():
        old_level = logger.level
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        try:
            return f(5.0)
        finally:
            logger.removeHandler(handler)
            logger.setLevel(old_level)

    return once, call, 4.0


class _Uncopyable(Exception):
    once: _Once

    def __reduce_ex__(self, protocol):
        type(self).once.fire()
        return super().__reduce_ex__(protocol)


class _CompileFails:
    def __call__(self, fun, args, kwargs):
        raise _Uncopyable("no compile")


def _waiter_copy_path():
    """copy.copy of the failed compile's exception (kept for waiters) raises."""
    once = _Once()
    _Uncopyable.once = once
    f = ftjit.jit(lambda x: x, compiler=_CompileFails(), cache=ftjit.FunctionCache())

    def call():
        with pytest.raises(_Uncopyable, match="no compile"):
            f(1.0)
        return "raised"

    return once, call, "raised"


class _Named:
    def __init__(self, once):
        self.once = once

    def __call__(self, x):
        return x

    def __repr__(self):
        self.once.fire()
        return "_Named()"


def _function_repr_path():
    """repr() of a jitted function whose function's __repr__ raises."""
    once = _Once()
    f = ftjit.jit(_Named(once), compiler=CountingCompiler(), cache=ftjit.FunctionCache())
    return once, lambda: repr(f), "<ftjit.JitFunction>"


class _ProbedCompiler(CountingCompiler):
    """A compiler whose executables check the context themselves (context_in_executable: the core builds a
    partial signature on the hit path) and whose context probe raises KeyboardInterrupt once asked."""

    def __init__(self, once):
        super().__init__()
        self.once = once

    def hooks(self, fun):
        def probe(arg):
            self.once.fire()
            return arg

        return ftjit.CompilerHooks(context_in_executable=True,
                                   executable_for=lambda compiled, args, kwargs, leaves: (compiled, False),
                                   context=ftjit.ContextHooks(context=lambda: "ctx", probe=probe))


def _defers_probe_path():
    """A call whose partial signature fails (a str argument) asks the probe whether the call defers
    (issue 46, finding 3: that probe's error was swallowed whole, a Ctrl-C among them)."""
    once = _Once()
    f = ftjit.jit(lambda x: x, compiler=_ProbedCompiler(once), cache=ftjit.FunctionCache())

    def call():
        with pytest.raises(TypeError):
            f("not an array")
        return "TypeError"

    return once, call, "TypeError"


PATHS = {
    "defers_probe": _defers_probe_path,
    "context_eq": _context_eq_path,
    "static_repr": _static_repr_path,
    "logging_hook": _logging_hook_path,
    "waiter_copy": _waiter_copy_path,
    "function_repr": _function_repr_path,
}


def _run_on_main(action, handler):
    """Runs action() on the main thread under `handler` for SIGINT, then lets
    the interpreter check for signals: (what action returned or None,
    whether a KeyboardInterrupt reached this thread)."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals are only delivered to the main thread")
    old = signal.signal(signal.SIGINT, handler)
    result, interrupted = None, False
    try:
        try:
            result = action()
            for _ in range(1000):  # backward jumps check for signals
                pass
            time.sleep(0.01)
        except KeyboardInterrupt:
            interrupted = True
        # Nothing may still be pending when the handler is put back.
        for _ in range(1000):
            pass
    finally:
        signal.signal(signal.SIGINT, old)
    return result, interrupted


@pytest.mark.parametrize("path", sorted(PATHS))
def test_an_interrupt_on_the_main_thread_is_re_armed_not_lost(path):
    once, action, _ = PATHS[path]()
    _, interrupted = _run_on_main(action, signal.default_int_handler)
    assert once.fired == 1  # the path ran, and raised KeyboardInterrupt there
    assert interrupted


@pytest.mark.parametrize("path", sorted(PATHS))
def test_an_interrupt_in_another_thread_is_dropped_and_the_call_carries_on(path):
    once, action, expected = PATHS[path]()
    assert run_threads(1, lambda i: action()) == [expected]
    assert once.fired == 1


def test_an_interrupt_under_a_custom_sigint_handler_is_dropped():
    """Re-arming would run the application's own handler for an interrupt
    that was no signal: it is dropped instead."""
    seen = []
    once, action, expected = _static_repr_path()
    result, interrupted = _run_on_main(action, lambda signum, frame: seen.append(signum))
    assert once.fired == 1
    assert (result, interrupted, seen) == (expected, False, [])
