"""Scenario "reentrant_hooks": code that ftjit runs calls jitted functions back, on the same thread, under other configs.

Twelve threads call ONE jitted function, each with arrays of its own, switching between the default config and
``jax.enable_x64()`` on a pattern of their own. Meanwhile Python code that ftjit itself runs re-enters it on
the calling thread:

- a logging handler on the "ftjit" logger (compiles log at INFO, waits at DEBUG): from inside a compile or a
  wait, it calls the same function under the other x64 setting (the answer is checked), or under
  ``jax.numpy_rank_promotion("raise")``, whose compile fails (a ValueError, checked): the failure drops that
  thread's copy of the entry while an outer call of the same thread is still running a copy;
- the compiler: after each compile, in the compiling thread, it calls a second jitted function under the
  other x64 setting (checked).

A background thread clears the cache now and then and compiles other shapes into it, so entries are evicted
(a capacity of 4) while calls run them. Every answer must be the right program's for its caller's config,
nothing may crash, and the books must balance: each call of the function counted exactly once as a hit, a
miss or a wait, the workers', the handler's and the background thread's alike.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import numpy as np

import ftjit

from ..registry import Context, Result, register
from ._pool import Pool, WorkerLog

DEFAULT_THREADS = 12
CALLS_QUICK = 250  #: per thread
CALLS_FULL = 1200
BACKGROUND_EVERY_S = 0.004


def _program(x: Any) -> Any:
    import jax.numpy as jnp

    # A (2, 4) result from a (4,) argument: an implicit rank promotion, which
    # jax.numpy_rank_promotion("raise") refuses when it traces.
    return x * 3 + jnp.ones((2,) + x.shape, x.dtype)


def _helper(x: Any) -> Any:
    return x - 1


def _argument(index: int, size: int = 4) -> np.ndarray:
    return np.arange(size, dtype=np.int64) + index


def _check(out: Any, x: np.ndarray, x64: bool, helper: bool = False) -> str:
    """Empty when ``out`` is the right program's answer under the caller's config, else what is wrong."""
    got = np.asarray(out)
    want_dtype = np.int64 if x64 else np.int32
    want = (x - 1) if helper else np.broadcast_to(x * 3 + 1, (2,) + x.shape)
    if got.dtype != want_dtype:
        return f"dtype {got.dtype} under {'x64' if x64 else 'x32'}, expected {np.dtype(want_dtype)}"
    if got.tolist() != want.tolist():
        return f"values {got.tolist()} for {x.tolist()}"
    return ""


def _x64_now() -> bool:
    import jax

    return bool(jax.config.jax_enable_x64)  # type: ignore[attr-defined]


class ReentrantRun:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.n = ctx.thread_count(DEFAULT_THREADS)
        self.calls_each = ctx.size(CALLS_QUICK, CALLS_FULL)
        self.lock = threading.Lock()
        self.local = threading.local()
        self.counts = {"function": 0, "helper": 0, "raised": 0, "handler": 0, "compiler": 0}  # guarded by lock
        self.problems: list[str] = []  # guarded by lock
        self.compiler = _ReentrantCompiler(self)
        self.cache = ftjit.FunctionCache(capacity=4)
        self.jf = ftjit.jit(_program, cache=self.cache, compiler=self.compiler)
        self.jg = ftjit.jit(_helper, cache=self.cache, compiler=self.compiler)
        self.pool = Pool(ctx, "reentrant_hooks", self.n * self.calls_each)

    # -- the re-entrant code ---------------------------------------------------------------------------------
    def _busy(self) -> bool:
        return getattr(self.local, "busy", False)

    def _count(self, key: str, problem: str = "") -> None:
        with self.lock:
            self.counts[key] += 1
            if problem:
                self.problems.append(problem)

    def reenter_from_handler(self) -> None:
        """From a log record of a compile or wait: this thread calls the function again, under another config."""
        import jax

        if self._busy():
            return
        self.local.busy = True
        try:
            self._count("handler")
            x = _argument(100 + threading.get_ident() % 7)
            if self.local.__dict__.setdefault("turn", 0) % 2 == 0:
                x64 = not _x64_now()
                with jax.enable_x64(x64):
                    out = self.jf(x)
                self._count("function", _check(out, x, x64))
            else:
                try:
                    with jax.numpy_rank_promotion("raise"):
                        self.jf(x)
                    self._count("function", "a call under numpy_rank_promotion('raise') did not raise")
                except ValueError:
                    self._count("function")
                    self._count("raised")
            self.local.turn += 1
        finally:
            self.local.busy = False

    def reenter_from_compiler(self) -> None:
        """After a compile, in the compiling thread: the helper function under the other x64 setting."""
        import jax

        if self._busy():
            return
        self.local.busy = True
        try:
            self._count("compiler")
            x = _argument(200)
            x64 = not _x64_now()
            with jax.enable_x64(x64):
                out = self.jg(x)
            self._count("helper", _check(out, x, x64, helper=True))
        finally:
            self.local.busy = False

    # -- the threads --------------------------------------------------------------------------------------------
    def worker(self, index: int, log: WorkerLog) -> None:
        import jax

        period = 2 + index % 5  # each thread switches config on a pattern of its own
        for call in range(self.calls_each):
            if self.pool.stop.is_set():
                return
            x64 = (call // period + index) % 2 == 1
            log.round, log.phase = call, f"{'x64' if x64 else 'x32'}"
            x = _argument(index)
            if x64:
                with jax.enable_x64(True):
                    out, exc = log.timed(self.jf, x)
            else:
                out, exc = log.timed(self.jf, x)
            self._count("function")
            problem = f"raised {type(exc).__name__}: {exc}" if exc else _check(out, x, x64)
            if problem:
                log.failures.append(f"thread {index} call {call} ({log.phase}): {problem}")
            self.pool.step()

    def background(self, index: int, log: WorkerLog) -> None:
        """Clears the cache, and compiles other shapes into it (evictions: its capacity is 4)."""
        size = 5
        while not self.pool.stop.is_set():
            if size % 3 == 0:
                self.cache.clear()
            x = _argument(0, size)
            out, exc = log.timed(self.jf, x)
            self._count("function", f"raised {type(exc).__name__}: {exc}" if exc else _check(out, x, _x64_now()))
            size = 5 + (size - 4) % 6
            self.pool.stop.wait(BACKGROUND_EVERY_S)


class _ReentrantCompiler(ftjit.JaxCompiler):
    """The JAX compiler, which after each compile calls a jitted function back (ReentrantRun.reenter_from_compiler)."""

    def __init__(self, run: ReentrantRun) -> None:
        super().__init__()
        self.run = run

    def __call__(self, fun: Any, args: tuple, kwargs: dict) -> Any:
        out = super().__call__(fun, args, kwargs)
        self.run.reenter_from_compiler()
        return out


class _Handler(logging.Handler):
    """Re-enters from every record. It must not hold its lock across the call, as logging.Handler.handle does
    around emit: the call may wait for another thread's compile, and a compile nested in that one (the
    compiler's own re-entry) logs through this handler before it finishes: a deadlock of the handler's lock
    and the compile, which no one but the handler can see. (docs/behaviour.md, "Logging".)"""

    def __init__(self, run: ReentrantRun) -> None:
        super().__init__(level=logging.DEBUG)
        self.run = run

    def handle(self, record: logging.LogRecord) -> bool:
        self.emit(record)  # unlocked: see the class docstring
        return True

    def emit(self, record: logging.LogRecord) -> None:
        self.run.reenter_from_handler()


@register("reentrant_hooks", "a logging handler and the compiler call jitted functions back on the same thread "
          "under other configs, while threads call one function and a thread clears and evicts", needs_jax=True)
def run_reentrant_hooks(ctx: Context) -> Result:
    run = ReentrantRun(ctx)
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
        for name, info, calls in (("function", f_info, counts["function"]), ("helper", g_info, counts["helper"])):
            if info.hits + info.misses + info.waits != calls:
                violations.append(f"books of the {name}: hits+misses+waits == "
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
