"""Scenario "server": many threads on ONE jitted function (a server's shape), with JAX config changes and clears.

Every thread calls the same ftjit.jit function with arrays of its own. First two herds: all threads at once in
the default config, then all at once inside ``jax.enable_x64()`` (thread-local: each thread enters it itself),
each of which must compile exactly once. Then a mixed load: each thread switches between the two configs on a
pattern of its own while a background thread clears the function's cache now and then; every result must be
the right program's for the calling thread's config now (int64 under x64, int32 otherwise, and the values).
This is what the executables per thread (ThreadExecutables) and their misses must keep exact.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

import ftjit

from ..registry import Context, Result, register
from ._pool import Pool, WorkerLog
from .jax_default import counting_jax_compiler

DEFAULT_THREADS = 12
MIXED_CALLS_QUICK = 400  #: per thread
MIXED_CALLS_FULL = 1500
CLEAR_EVERY_S = 0.005


def _program(x: Any) -> Any:
    return x * 3 + 1


def _argument(index: int) -> np.ndarray:
    return np.arange(4, dtype=np.int64) + index


def _check(out: Any, x: np.ndarray, x64: bool) -> str:
    """Empty when ``out`` is the program's answer under the caller's config, else what is wrong."""
    got = np.asarray(out)
    want_dtype = np.int64 if x64 else np.int32
    if got.dtype != want_dtype:
        return f"dtype {got.dtype} under {'x64' if x64 else 'x32'}, expected {np.dtype(want_dtype)}"
    if got.tolist() != (x * 3 + 1).tolist():
        return f"values {got.tolist()} for {x.tolist()}"
    return ""


class ServerRun:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.n = ctx.thread_count(DEFAULT_THREADS)
        self.mixed_calls = ctx.size(MIXED_CALLS_QUICK, MIXED_CALLS_FULL)
        self.compiler = counting_jax_compiler()
        self.jf = ftjit.jit(_program, cache=ftjit.FunctionCache(capacity=64), compiler=self.compiler)
        self.pool = Pool(ctx, "server", 2 * self.n + self.n * self.mixed_calls)
        self.barrier = threading.Barrier(self.n)
        self.pool.barriers.append(self.barrier)
        self.herd_calls = 0
        self.lock = threading.Lock()
        self.herd_compiles: list[int] = []  # compiles after each herd
        self.clears = 0

    def _call(self, log: WorkerLog, index: int, x64: bool, what: str) -> None:
        import jax

        x = _argument(index)
        if x64:
            with jax.enable_x64(True):
                out, exc = log.timed(self.jf, x)
        else:
            out, exc = log.timed(self.jf, x)
        problem = f"raised {type(exc).__name__}: {exc}" if exc else _check(out, x, x64)
        if problem:
            log.failures.append(f"thread {index} {what}: {problem}")

    def herds(self, index: int, log: WorkerLog) -> None:
        for rnd, x64 in enumerate((False, True)):
            log.round, log.phase = rnd, "barrier"
            try:
                self.barrier.wait(self.ctx.wait_timeout)
            except threading.BrokenBarrierError:
                return
            log.phase = f"herd {'x64' if x64 else 'x32'}"
            self._call(log, index, x64, log.phase)
            with self.lock:
                self.herd_calls += 1
            try:
                self.barrier.wait(self.ctx.wait_timeout)  # the herd is over: count its compiles
            except threading.BrokenBarrierError:
                return
            if index == 0:
                self.herd_compiles.append(self.jf.cache_info().compiles)
            self.pool.step()

    def mixed(self, index: int, log: WorkerLog) -> None:
        period = 3 + index % 5  # each thread switches config on a pattern of its own
        for call in range(self.mixed_calls):
            if self.pool.stop.is_set():
                return
            x64 = (call // period + index) % 2 == 1
            log.round, log.phase = call, f"mixed {'x64' if x64 else 'x32'}"
            self._call(log, index, x64, log.phase)
            self.pool.step()

    def clearer(self, index: int, log: WorkerLog) -> None:
        while not self.pool.stop.is_set():
            self.jf.clear_cache()
            self.clears += 1
            self.pool.stop.wait(CLEAR_EVERY_S)


@register("server", "one function, many threads (a server): herds into a config change, then configs switching "
          "per thread with clears racing", needs_jax=True)
def run_server(ctx: Context) -> Result:
    run = ServerRun(ctx)
    aborted = run.pool.run([run.herds] * run.n)
    violations = list(aborted)
    if not aborted and run.herd_compiles != [1, 2]:
        violations.append(f"herds: compiles after the default-config herd and the x64 herd == {run.herd_compiles}, "
                          "expected [1, 2] (each herd compiles once)")
    if not aborted and run.compiler.overlaps:
        violations.append(f"herds: the JAX compiler ran twice at once for {run.compiler.overlaps}")
    before = run.jf.cache_info()
    if not aborted:
        aborted = run.pool.run([run.mixed] * run.n, background=[run.clearer])
        violations += aborted
    info = run.jf.cache_info()
    if not aborted:
        calls = run.herd_calls + run.n * run.mixed_calls
        if info.hits + info.misses + info.waits != calls:
            violations.append(f"books: hits+misses+waits == {info.hits + info.misses + info.waits} != {calls} calls")
        if info.failures:
            violations.append(f"books: {info.failures} failed compiles")
        if run.clears == 0:
            violations.append("no clear ran during the mixed load: the scenario did not exercise clears")
        # Each clear can cost each config's signature one compile, and no more.
        if not 2 <= info.compiles <= 2 * (run.clears + 1) + 2:
            violations.append(f"compiles {info.compiles} with {run.clears} clears: expected 2 to {2 * (run.clears + 2)}")
        if info.compiles != sum(run.compiler.per_key.values()):
            violations.append(f"ftjit counted {info.compiles} compiles, the JAX compiler ran "
                              f"{sum(run.compiler.per_key.values())} times")
    notes = [f"herd compiles {run.herd_compiles}; mixed load: {info.compiles - before.compiles} compiles across "
             f"{run.clears} clears, hits {info.hits - before.hits}, waits {info.waits - before.waits}"]
    return run.pool.result(info.compiles, info.waits, violations, notes, threads=run.n)
