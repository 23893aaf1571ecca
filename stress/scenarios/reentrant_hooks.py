"""Scenarios "reentrant_hooks" (JAX) and "reentrant_copies" (JAX-free): code that ftjit runs calls jitted functions
back, on the same thread, under other configs.

Twelve threads call ONE jitted function, each with arguments of its own, switching between two configs on a
pattern of their own (JAX: the default and ``jax.enable_x64()``; without JAX: contexts "A" and "B" of
stress.copy_compiler's CopyCompiler, whose executables are copies per thread as jaxlib's are). Meanwhile
Python code that ftjit itself runs re-enters it on the calling thread:

- a logging handler on the "ftjit" logger (compiles log at INFO, waits at DEBUG): from inside a compile or a
  wait, it calls the same function under the other config (the answer is checked), or under a config whose
  compile fails (JAX: ``jax.numpy_rank_promotion("raise")``; without: context "F"), checked to raise
  ValueError: the failure happens while an outer call of the same thread still runs its copy;
- the compiler: after each compile, in the compiling thread, it calls a second jitted function under the
  other config (checked).

A background thread clears the cache now and then and compiles other signatures into it, and the workers
now and then call other signatures too, so entries are evicted (a capacity of 4) while calls run them. Every answer must be the right program's for its caller's
config, nothing may crash, and the books must balance: each call of either function counted exactly once as a
hit, a miss or a wait, the workers', the hooks' and the background thread's alike.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable

import numpy as np

import ftjit

from ..copy_compiler import CopyCompiler
from ..registry import Context, Result, register
from ._pool import Pool, WorkerLog

DEFAULT_THREADS = 12
CALLS_QUICK = 250  #: per thread
CALLS_FULL = 1200
BACKGROUND_EVERY_S = 0.004


class _Jax:
    """Configs: x64 off/on. Failing: rank promotion "raise" (the program broadcasts (4,) to (2, 4))."""

    configs = (False, True)
    calls_scale, background_every_s = 1, BACKGROUND_EVERY_S

    def __init__(self, run: ReentrantRun) -> None:
        run_ = run

        class Compiler(ftjit.JaxCompiler):
            def __call__(self, fun: Any, args: tuple, kwargs: dict) -> Any:
                out = super().__call__(fun, args, kwargs)
                run_.reenter_from_compiler()
                return out

        self.compiler = Compiler()

    @staticmethod
    def program(x: Any, *pad: Any) -> Any:
        import jax.numpy as jnp

        return x * 3 + jnp.ones((2,) + x.shape, x.dtype)

    @staticmethod
    def helper(x: Any) -> Any:
        return x - 1

    @staticmethod
    def argument(index: int) -> Any:
        return np.arange(4, dtype=np.int64) + index

    @staticmethod
    def current() -> bool:
        import jax

        return bool(jax.config.jax_enable_x64)  # type: ignore[attr-defined]

    @staticmethod
    def call(fn: Callable[..., Any], config: bool, *args: Any) -> Any:
        import jax

        with jax.enable_x64(config):
            return fn(*args)

    @staticmethod
    def call_failing(fn: Callable[..., Any], *args: Any) -> Any:
        import jax

        with jax.numpy_rank_promotion("raise"):
            return fn(*args)

    @staticmethod
    def check(out: Any, x: Any, config: bool, helper: bool = False) -> str:
        got = np.asarray(out)
        want_dtype = np.int64 if config else np.int32
        want = (x - 1) if helper else np.broadcast_to(x * 3 + 1, (2,) + x.shape)
        if got.dtype != want_dtype:
            return f"dtype {got.dtype} under {'x64' if config else 'x32'}, expected {np.dtype(want_dtype)}"
        if got.tolist() != want.tolist():
            return f"values {got.tolist()} for {x.tolist()}"
        return ""


class _Copies:
    """Configs: contexts "A" and "B" of a CopyCompiler; failing: context "F", whose compiles raise ValueError."""

    configs = ("A", "B")
    calls_scale, background_every_s = 10, BACKGROUND_EVERY_S / 8  # its calls take microseconds

    def __init__(self, run: ReentrantRun) -> None:
        run_ = run

        class Compiler(CopyCompiler):
            def __call__(self, fun: Any, args: tuple, kwargs: dict) -> Any:
                out = super().__call__(fun, args, kwargs)
                run_.reenter_from_compiler()
                return out

        self.compiler = Compiler(fail_in=("F",))

    @staticmethod
    def program(x: Any, *pad: Any) -> Any:
        return x * 3 + 1

    @staticmethod
    def helper(x: Any) -> Any:
        return x - 1

    @staticmethod
    def argument(index: int) -> Any:
        return index

    def current(self) -> str:
        return self.compiler.current()  # type: ignore[no-any-return]

    def call(self, fn: Callable[..., Any], config: str, *args: Any) -> Any:
        before = self.compiler.current()
        self.compiler.set_context(config)
        try:
            return fn(*args)
        finally:
            self.compiler.set_context(before)

    def call_failing(self, fn: Callable[..., Any], *args: Any) -> Any:
        return self.call(fn, "F", *args)

    @staticmethod
    def check(out: Any, x: Any, config: str, helper: bool = False) -> str:
        want = (config, x - 1 if helper else x * 3 + 1)
        return "" if out == want else f"{out!r} for {x!r} under {config!r}, expected {want!r}"


class ReentrantRun:
    def __init__(self, ctx: Context, name: str, backend: type) -> None:
        self.ctx = ctx
        self.n = ctx.thread_count(DEFAULT_THREADS)
        self.b = backend(self)
        self.calls_each = ctx.size(CALLS_QUICK * self.b.calls_scale, CALLS_FULL * self.b.calls_scale)
        self.lock = threading.Lock()
        self.local = threading.local()
        self.counts = {"function": 0, "helper": 0, "raised": 0, "handler": 0, "compiler": 0}  # guarded by lock
        self.problems: list[str] = []  # guarded by lock
        self.cache = ftjit.FunctionCache(capacity=4)
        self.jf = ftjit.jit(self.b.program, cache=self.cache, compiler=self.b.compiler)
        self.jg = ftjit.jit(self.b.helper, cache=self.cache, compiler=self.b.compiler)
        self.pool = Pool(ctx, name, self.n * self.calls_each)

    def _other(self) -> Any:
        current = self.b.current()
        return self.b.configs[1] if current == self.b.configs[0] else self.b.configs[0]

    def _count(self, key: str, problem: str = "") -> None:
        with self.lock:
            self.counts[key] += 1
            if problem:
                self.problems.append(problem)

    # -- the re-entrant code (one level deep per thread) -----------------------------------------------------
    def reenter_from_handler(self) -> None:
        """From a log record of a compile or wait: this thread calls the function again, under another config."""
        if getattr(self.local, "busy", False):
            return
        self.local.busy = True
        try:
            self._count("handler")
            x = self.b.argument(100 + threading.get_ident() % 7)
            turn = self.local.__dict__.get("turn", 0)
            self.local.turn = turn + 1
            if turn % 2 == 0:
                config = self._other()
                self._count("function", self.b.check(self.b.call(self.jf, config, x), x, config))
                return
            try:
                self.b.call_failing(self.jf, x)
                self._count("function", "a call under the failing config did not raise")
            except ValueError:
                self._count("function")
                self._count("raised")
        finally:
            self.local.busy = False

    def reenter_from_compiler(self) -> None:
        """After a compile, in the compiling thread: the helper function under the other config."""
        if getattr(self.local, "busy", False):
            return
        self.local.busy = True
        try:
            self._count("compiler")
            x = self.b.argument(200)
            config = self._other()
            self._count("helper", self.b.check(self.b.call(self.jg, config, x), x, config, helper=True))
        finally:
            self.local.busy = False

    # -- the threads --------------------------------------------------------------------------------------------
    def worker(self, index: int, log: WorkerLog) -> None:
        period = 2 + index % 5  # each thread switches config on a pattern of its own
        for call in range(self.calls_each):
            if self.pool.stop.is_set():
                return
            config = self.b.configs[(call // period + index) % 2]
            log.round, log.phase = call, f"config {config}"
            x = self.b.argument(index)
            # Now and then another signature (1 to 6 more arguments): with the background thread's, these
            # evict entries (the cache holds 4) whatever the scheduling gives that thread.
            pad = [0] * (1 + (call + index) % 6) if (call + 3 * index) % 61 == 0 else []
            out, exc = log.timed(self.b.call, self.jf, config, x, *pad)
            self._count("function")
            problem = f"raised {type(exc).__name__}: {exc}" if exc else self.b.check(out, x, config)
            if problem:
                log.failures.append(f"thread {index} call {call} ({log.phase}): {problem}")
            self.pool.step()

    def background(self, index: int, log: WorkerLog) -> None:
        """Clears the cache, and compiles other signatures into it (evictions: its capacity is 4)."""
        pad = 1
        while not self.pool.stop.is_set():
            self.cache.clear()  # every entry compiles again: more compiles, more re-entries
            x, config = self.b.argument(0), self.b.configs[pad % 2]
            out, exc = log.timed(self.b.call, self.jf, config, x, *[0] * pad)
            self._count("function", f"raised {type(exc).__name__}: {exc}" if exc else self.b.check(out, x, config))
            pad = 1 + pad % 6
            self.pool.stop.wait(self.b.background_every_s)


class _Handler(logging.Handler):
    """Re-enters from every record. It must not hold its lock across the call, as logging.Handler.handle does
    around emit: the call may wait for another thread's compile, and a compile nested in that one (the
    compiler's own re-entry) logs through this handler before it finishes: a deadlock of the handler's lock
    and the compile, which no one but the handler can see (docs/behaviour.md, "Logging")."""

    def __init__(self, run: ReentrantRun) -> None:
        super().__init__(level=logging.DEBUG)
        self.run = run

    def handle(self, record: logging.LogRecord) -> bool:
        self.emit(record)  # unlocked: see the class docstring
        return True

    def emit(self, record: logging.LogRecord) -> None:
        self.run.reenter_from_handler()


def _run(ctx: Context, name: str, backend: type) -> Result:
    run = ReentrantRun(ctx, name, backend)
    logger = logging.getLogger("ftjit")
    handler = _Handler(run)
    level, propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)  # compiles at INFO, waits at DEBUG: both re-enter
    logger.propagate = False  # the records are the handler's, not the terminal's
    try:
        aborted = run.pool.run([run.worker] * run.n, background=[run.background])
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate
    violations = list(aborted) + run.problems[:10]
    if len(run.problems) > 10:
        violations.append(f"... and {len(run.problems) - 10} more wrong answers from re-entrant calls")
    f_info, g_info = run.jf.cache_info(), run.jg.cache_info()
    with run.lock:
        counts = dict(run.counts)
    if not aborted:
        for fname, info, calls in (("function", f_info, counts["function"]), ("helper", g_info, counts["helper"])):
            if info.hits + info.misses + info.waits != calls:
                violations.append(f"books of the {fname}: hits+misses+waits == "
                                  f"{info.hits + info.misses + info.waits} != {calls} calls")
        if counts["handler"] == 0 or counts["compiler"] == 0 or counts["raised"] == 0:
            violations.append(f"the hooks did not re-enter (handler {counts['handler']}, compiler "
                              f"{counts['compiler']}, failed re-entrant compiles {counts['raised']}): the scenario "
                              "exercised nothing")
        if f_info.evictions + g_info.evictions == 0:
            violations.append("no entry was evicted: the scenario did not exercise evictions")
    notes = [f"re-entered {counts['handler']} times from the log handler ({counts['raised']} failed compiles) and "
             f"{counts['compiler']} from the compiler; {f_info.compiles + g_info.compiles} compiles, "
             f"{f_info.evictions + g_info.evictions} evictions"]
    return run.pool.result(f_info.compiles + g_info.compiles, f_info.waits + g_info.waits, violations, notes,
                           threads=run.n)


@register("reentrant_hooks", "a logging handler and the compiler call jitted functions back on the same thread "
          "under other JAX configs, while threads call one function and a thread clears and evicts", needs_jax=True)
def run_reentrant_hooks(ctx: Context) -> Result:
    return _run(ctx, "reentrant_hooks", _Jax)


@register("reentrant_copies", "the same without JAX: copies per thread of a context-checking compiler "
          "(stress.copy_compiler), for ThreadSanitizer")
def run_reentrant_copies(ctx: Context) -> Result:
    return _run(ctx, "reentrant_copies", _Copies)
