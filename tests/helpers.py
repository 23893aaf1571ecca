"""Shared helpers for the ftjit test suite.

Everything here is safe to use from several threads at once (the suite also
runs under pytest-run-parallel, which runs each test body in many threads).
Tests create their own compilers and caches inside the test body: fixtures
would be shared by the parallel copies of one test.
"""

import ast
import functools
import gc
import importlib
import inspect
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
import weakref

import numpy as np
import pytest

# gc_collect_until is defined once, in the stress package (which cannot import
# from tests/): the repository root is on sys.path under `python -m pytest`
# from there; added here for any other way of running the suite.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.append(_ROOT)

from stress.gc_wait import gc_collect_until  # noqa: E402

# Exactly what the test files import (or, for decorated_double, use as helpers.decorated_double).
__all__ = [
    "ContextCompiler",
    "CountingCompiler",
    "LogCapture",
    "SERVE_TOOLS",
    "ThreadContextCompiler",
    "builtin_signature",
    "child_env",
    "classes_can_die",
    "decorated_double",
    "explanations",
    "fresh1",
    "gated_compiler",
    "gc_collect_until",
    "meta_dataclass",
    "named",
    "parse_python",
    "reachable_from",
    "require_module",
    "require_tcp",
    "run_script",
    "run_threads",
    "unique_name",
    "wait_for",
    "weak_executable",
    "z",
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


def wait_for(predicate, timeout):
    """Poll ``predicate`` until true or ``timeout`` seconds passed; return it.

    For ordering events across threads by a condition rather than a sleep.
    Callers assert the result: a wait that gave up must fail the test.
    """
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return bool(predicate())
        time.sleep(0.002)
    return True


def classes_can_die():
    """Whether a class nothing refers to is ever collected on this interpreter.

    Not on CPython 3.13t once a second thread has started: the free-threaded
    3.13 build then makes every object with deferred reference counting
    (classes, functions, modules) immortal, for good. (pytest-timeout's
    thread method starts one per test.) 3.14t counts them per thread instead.
    """
    class Probe:
        pass

    is_immortal = getattr(sys, "_is_immortal", None)
    if is_immortal is not None:
        return not is_immortal(Probe)
    return sys.getrefcount(Probe) < 2**30


def reachable_from(root, target, limit=100_000):
    """Whether ``target`` is reachable from ``root`` by strong references the
    GC can see (gc.get_referents, transitively). Weak references do not count."""
    seen = {id(root)}
    todo = [root]
    while todo and len(seen) < limit:
        for obj in gc.get_referents(todo.pop()):
            if obj is target:
                return True
            if id(obj) not in seen and not isinstance(obj, (type, weakref.ref)):
                seen.add(id(obj))
                todo.append(obj)
    return False


def child_env(extra: dict | None = None) -> dict:
    """The environment of every helper process a test starts: this process's
    (PYTHONPATH and the like included), with ``JAX_PLATFORMS=cpu``, then ``extra``.

    A child that imports JAX must not try to open an accelerator: on a TPU one
    program at a time can hold the chip, and the test process itself holds it
    (a second opener fails with "Internal error when accessing libtpu
    multi-process lockfile"); on a GPU a second process would compete for its
    memory. The children's tests are about CPU matters anyway (several CPU
    devices through XLA_FLAGS or jax_num_cpu_devices, fresh-interpreter
    behaviour). The test process itself keeps whatever JAX finds."""
    return dict(os.environ, JAX_PLATFORMS="cpu", **(extra or {}))


def run_script(script: str, env: dict | None = None) -> str:
    """Runs `script` (dedented) in a fresh interpreter on the CPU backend
    (``child_env(env)``); returns its stdout, stripped (fails the test on errors)."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, timeout=240,
        env=child_env(env),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.strip()


# --- what a machine may lack: TCP sockets, test tools --------------------------


@functools.cache
def _tcp_refusal() -> str | None:
    """None if this process can listen on a TCP port of 127.0.0.1, else why not.
    Found by trying once (cached): some sandboxes refuse every internet socket,
    loopback included (errno 97, EAFNOSUPPORT, on the TPU machine)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            s.listen(1)
    except OSError as e:
        return f"{type(e).__name__}: {e}"
    return None


def require_tcp(what: str) -> None:
    """Skips the calling test when TCP on 127.0.0.1 does not work here,
    naming what needs it (``what``) and why a listening socket failed."""
    refusal = _tcp_refusal()
    if refusal is not None:
        pytest.skip(f"{what} needs TCP on 127.0.0.1, which this machine refuses "
                    f"(binding 127.0.0.1:0 failed: {refusal})")


ACCELERATOR_RUN = os.environ.get("FTJIT_TEST_ACCELERATOR") == "1"
# The serve extra (pyproject.toml), which examples/serve.py imports, and with it every script and test
# that imports serve.py: each asks require_module for them.
SERVE_TOOLS = ("waitress", "prometheus_client")


def require_module(name: str, why: str, module_level: bool = False):
    """Imports and returns the test tool ``name`` (mypy, chex, waitress,
    prometheus_client: the ``test`` extra), which ``why`` needs.

    Missing, it fails the test (at a module's top, the file's collection),
    naming the module: CI and ``bash dev.sh test`` install the test extra,
    and a skip there (``pytest.importorskip``) would turn a broken set-up
    into a green run with tests quietly not run. The one exception is a run
    marked ``FTJIT_TEST_ACCELERATOR=1`` (``bash dev.sh test-accelerator``
    sets it; on a machine like the TPU one, which has JAX but no package
    registry to install the tools from, set it by hand): there a missing
    tool skips, with its name and what needs it. The mark is a statement by
    whoever runs the suite, not a guess from the machine, and the skips are
    listed in the run's summary (``-rs``). ``module_level``: called at a
    test module's top (a skip then skips the whole file)."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        if ACCELERATOR_RUN:
            pytest.skip(f"{name} is not installed ({why}); skipped because FTJIT_TEST_ACCELERATOR=1",
                        allow_module_level=module_level)
        pytest.fail(f"{name} is not installed for {sys.executable}, and {why}: pip install 'ftjit[test]' "
                    f"(bash dev.sh test installs it), or set FTJIT_TEST_ACCELERATOR=1 on a machine that "
                    f"cannot have it ({type(e).__name__}: {e})", pytrace=False)


# --- functions with unique names, log capture, miss explanations ----------------

import logging as _logging
import uuid as _uuid

_level_lock = threading.Lock()
_level_users = {}  # logger name -> [count, saved level]; guarded by _level_lock


# CPython 3.11's AST converter keeps its recursion depth in module state, not per
# thread: a garbage collection inside it can run a finalizer that switches threads,
# and another thread's conversion then fails it with "AST constructor recursion
# depth mismatch". Everything in the suite that builds an AST goes through here:
# ast.parse, and inspect.signature of a builtin (it parses __text_signature__).
_ast_lock = threading.Lock()


def parse_python(source: str, filename: str = "<unknown>") -> ast.Module:
    """ast.parse, one thread at a time."""
    with _ast_lock:
        return ast.parse(source, filename)


def builtin_signature(obj) -> inspect.Signature:
    """inspect.signature of a builtin or C slot, one thread at a time."""
    with _ast_lock:
        return inspect.signature(obj)


def unique_name(prefix="fn"):
    """A function name no other test (or parallel copy of a test) uses."""
    return f"{prefix}_{_uuid.uuid4().hex[:12]}"


def named(fun, name):
    """Gives ``fun`` the ``__name__``/``__qualname__`` ``name`` (ftjit names functions by qualname)."""
    fun.__name__ = name
    fun.__qualname__ = name
    return fun


class _Dispatcher(_logging.Handler):
    """One handler per logger, installed once and never removed: adding and
    removing handlers while other threads log can make them skip a handler
    (Logger.callHandlers iterates the list that removeHandler mutates)."""

    def __init__(self):
        super().__init__(level=_logging.NOTSET)
        self.captures = set()  # guarded by _level_lock

    def emit(self, record):
        with _level_lock:
            captures = list(self.captures)
        for capture in captures:
            capture._offer(record)


_dispatchers = {}  # logger name -> _Dispatcher; guarded by _level_lock


class LogCapture:
    """Collects the records of one logger whose message contains ``needle``.

    A context manager. While any LogCapture of a logger is active, the logger's
    level is at most ``level`` (reference-counted, so parallel copies of a test
    do not restore it under each other's feet). Thread-safe.
    """

    def __init__(self, needle, logger_name="ftjit", level=_logging.DEBUG):
        self.needle = needle
        self.logger = _logging.getLogger(logger_name)
        self.level = level
        self._records = []
        self._lock = threading.Lock()

    def _offer(self, record):
        if self.needle in record.getMessage():
            with self._lock:
                self._records.append(record)

    @property
    def records(self):
        with self._lock:
            return list(self._records)

    def messages(self, level=None):
        return [r.getMessage() for r in self.records if level is None or r.levelno == level]

    def __enter__(self):
        name = self.logger.name
        with _level_lock:
            dispatcher = _dispatchers.get(name)
            if dispatcher is None:
                dispatcher = _dispatchers[name] = _Dispatcher()
                self.logger.addHandler(dispatcher)
            dispatcher.captures.add(self)
            entry = _level_users.get(name)
            if entry is None:
                entry = _level_users[name] = [0, self.logger.level]
            entry[0] += 1
            if self.logger.level == _logging.NOTSET or self.logger.level > self.level:
                self.logger.setLevel(self.level)
        return self

    def __exit__(self, *exc):
        name = self.logger.name
        with _level_lock:
            _dispatchers[name].captures.discard(self)
            entry = _level_users[name]
            entry[0] -= 1
            if entry[0] == 0:
                self.logger.setLevel(entry[1])
                del _level_users[name]
        return False


def z(*shape, dtype=np.float32):
    """A numpy array of zeros of this shape (float32 unless ``dtype`` says otherwise)."""
    return np.zeros(shape, dtype)


def fresh1(prefix="fn", body=lambda x: x + 1):
    """A new function ``fun(x)`` that returns ``body(x)``, with a unique name
    (unique_name(prefix)); returns (function, name)."""
    name = unique_name(prefix)

    def fun(x):
        return body(x)

    return named(fun, name), name


def gated_compiler(until):
    """A CountingCompiler whose compiles set `started`, then hold until
    ``until()`` is true (e.g. ``lambda: jf.cache_info().waits >= 1``: until
    another caller waits on the compile). A compile still held after 30 s
    fails with AssertionError. Returns (compiler, started, held): ``held``
    gets each hold's duration in seconds (time.monotonic)."""
    started = threading.Event()
    held = []

    def hook(fun, args, kwargs):
        t0 = time.monotonic()
        started.set()
        if not wait_for(until, 30):
            raise AssertionError("the condition holding the compile never came true")
        held.append(time.monotonic() - t0)

    return CountingCompiler(on_compile=hook), started, held


def explanations(cap, name):
    """The miss explanations of the function named ``name`` that the
    LogCapture ``cap`` saw (WARNING records), without their prefix."""
    prefix = f"cache miss of {name}: "
    return [m[len(prefix):] for m in cap.messages(_logging.WARNING) if m.startswith(prefix)]


class ContextCompiler:
    """A custom compiler whose tracing context is whatever `cur` holds."""

    def __init__(self):
        self.cur = None

    def context(self):
        return self.cur

    def __call__(self, fun, args, kwargs):
        return fun


class ThreadContextCompiler:
    """A compiler whose context is this thread's ``cur`` (a threading.local),
    counting its compiles in ``calls``."""

    def __init__(self):
        self.local = threading.local()
        self.calls = 0

    def context(self):
        return getattr(self.local, "cur", None)

    def __call__(self, fun, args, kwargs):
        self.calls += 1
        return fun


def meta_dataclass():
    """A new JAX-registered dataclass Layer(w, act): ``w`` a child, ``act``
    static (the pytree node's aux data). Imports JAX (this module does not)."""
    import dataclasses as dc
    from typing import Any

    import jax

    @dc.dataclass
    class Layer:
        w: Any
        act: Any = dc.field(metadata=dict(static=True))

    return jax.tree_util.register_dataclass(Layer)


@__import__("ftjit").jit(compiler=lambda fun, args, kwargs: fun)
def decorated_double(x):
    """A module-level function in its decorated form: it pickles by reference."""
    return x * 2
