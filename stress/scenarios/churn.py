"""Scenario "churn": threads create, jit, call and drop closures while another thread runs gc; nothing leaks."""

from __future__ import annotations

import gc
import os
import random
import threading
import time
import weakref
from typing import Any, Callable, Hashable, Optional

import ftjit

from ..registry import Context, Result, register
from ._calls import ARG_SPECS, TrackingCompiler, mismatch, signature_key
from ._pool import Pool, WorkerLog

DEFAULT_THREADS = 16
CLOSURES_QUICK = 150  #: per thread
CLOSURES_FULL = 800
SHARED_CAPACITY = 8
OWN_CAPACITY = 2  #: a closure with its own cache uses up to 3 signatures: it evicts
OWN_CACHE_P = 0.5  #: probability that a closure gets its own FunctionCache rather than the shared one
CYCLE_P = 0.3  #: probability that a closure is kept in a reference cycle (only the gc frees it)
KEEP_OWN_CACHE_EVERY = 8  #: keep every 8th own cache alive to check it empties when its function dies
GC_SLEEP_S = (0.001, 0.005)
RSS_GROWTH_LIMIT = 48 * 2**20  #: generous: a real leak of these closures grows far beyond it at full size
_GC_UNTIL_S = 5.0
_MIB = 2**20


def rss_bytes() -> int:
    """Resident set size of this process (Linux /proc; 0 where unavailable)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def make_closure(tag: int) -> Callable[..., Any]:
    """A fresh function object closing over ``tag``: exact on the small integers the threads pass."""

    def churn_target(x: Any, k: int) -> Any:
        return x * tag + k

    churn_target.tag = tag  # type: ignore[attr-defined]
    return churn_target


class Churn:
    """One run: the shared cache and compiler, the weakrefs to everything dropped, and RSS samples."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.nthreads = ctx.thread_count(DEFAULT_THREADS)
        self.closures = CLOSURES_QUICK if ctx.quick else CLOSURES_FULL
        rng = random.Random(ctx.seed)
        self.thread_seeds = [rng.getrandbits(32) for _ in range(self.nthreads + 1)]
        self.compiler = TrackingCompiler(self._key_of, rng)
        self.shared = ftjit.FunctionCache(capacity=SHARED_CAPACITY)
        self.lock = threading.Lock()
        self.dropped: list[tuple[str, weakref.ref[Any]]] = []
        self.kept_caches: list[Any] = []
        self.closure_compiles = 0
        self.closure_waits = 0
        self.collections = 0  #: by the collector thread (its own counter: no lock needed)
        self.rss: list[int] = []
        self.size_violations: list[str] = []
        self.pool = Pool(ctx, "churn", self.nthreads * self.closures, on_poll=self._sample)

    @staticmethod
    def _key_of(fun: Callable[..., Any], args: tuple[Any, ...]) -> Hashable:
        return (fun.tag,) + signature_key(*args)  # type: ignore[attr-defined]

    def _sample(self) -> None:
        self.rss.append(rss_bytes())
        size = self.shared.size()
        if size > SHARED_CAPACITY + self.nthreads and len(self.size_violations) < 3:
            self.size_violations.append(
                f"shared cache.size() == {size} mid-run > capacity {SHARED_CAPACITY} + {self.nthreads} compiling")

    def work(self, index: int, log: WorkerLog) -> None:
        rng = random.Random(self.thread_seeds[index])
        for n in range(self.closures):
            if self.pool.stop.is_set():
                return
            log.round, log.phase = n, "closure"
            self._one_closure(index * self.closures + n + 1, rng, log)
            self.pool.step()

    def _one_closure(self, tag: int, rng: random.Random, log: WorkerLog) -> None:
        fun = make_closure(tag)
        own = ftjit.FunctionCache(capacity=OWN_CAPACITY) if rng.random() < OWN_CACHE_P else None
        jf = ftjit.jit(fun, static_argnums=1, compiler=self.compiler, cache=own or self.shared)
        calls = 0
        for spec in rng.sample(ARG_SPECS, rng.randint(1, 3)):
            for value in (rng.randrange(50), rng.randrange(50)):
                x, k = spec.make(value), rng.randrange(2)
                log.phase = f"call {spec} k={k}"
                out, exc = log.timed(jf, x, k)
                calls += 1
                problem = f"raised {type(exc).__name__}: {exc}" if exc else mismatch(out, fun(x, k))
                if problem:
                    log.failures.append(f"closure {tag} {spec} k={k}: {problem}")
        log.failures.extend(self._closure_books(tag, jf.cache_info(), calls, OWN_CAPACITY if own else None))
        if rng.random() < CYCLE_P:
            fun.cycle = (fun, jf)  # type: ignore[attr-defined]
        with self.lock:
            self.dropped += [(f"closure {tag}", weakref.ref(fun)), (f"jitted closure {tag}", weakref.ref(jf))]
            if own is not None and tag % KEEP_OWN_CACHE_EVERY == 0:
                self.kept_caches.append(own)
        log.phase = "dropping"
        del fun, jf, own

    def _closure_books(self, tag: int, info: Any, calls: int, own_capacity: Optional[int]) -> list[str]:
        with self.lock:
            self.closure_compiles += info.compiles
            self.closure_waits += info.waits
        out = []
        if info.misses != info.compiles or info.failures or info.hits + info.misses + info.waits != calls:
            out.append(f"closure {tag}: books off after {calls} calls: {info}")
        if own_capacity is not None and info.size > own_capacity:
            out.append(f"closure {tag}: size {info.size} > its own cache's capacity {own_capacity}")
        return out

    def collector(self, index: int, log: WorkerLog) -> None:
        """Background: gc.collect() of a random generation every few ms until the workers are done."""
        rng = random.Random(self.thread_seeds[-1])
        log.phase = "collecting"
        while not self.pool.stop.is_set():
            gc.collect(rng.choice((0, 1, 2)))
            self.collections += 1
            time.sleep(rng.uniform(*GC_SLEEP_S))


def collect_until(predicate: Callable[[], bool], timeout: float = _GC_UNTIL_S) -> bool:
    """gc.collect() until ``predicate()`` holds or ``timeout`` passed (one collect can race another thread's)."""
    deadline = time.monotonic() + timeout
    while True:
        gc.collect()
        if predicate():
            return True
        if time.monotonic() > deadline:
            return predicate()
        time.sleep(0.01)


def rss_thirds(samples: list[int]) -> tuple[float, float]:
    """Mean RSS of the first and the last third of the samples."""
    third = max(1, len(samples) // 3)
    first, last = samples[:third], samples[-third:]
    return sum(first) / len(first), sum(last) / len(last)


def check(churn: Churn, hangs: list[str]) -> list[str]:
    violations = list(hangs) + churn.size_violations
    if churn.closure_compiles != churn.compiler.calls:
        violations.append(f"closures' compiles sum to {churn.closure_compiles} != {churn.compiler.calls} compiler calls")
    if not collect_until(lambda: all(ref() is None for _, ref in churn.dropped)):
        alive = [name for name, ref in churn.dropped if ref() is not None]
        violations.append(f"{len(alive)} of {len(churn.dropped)} dropped objects still alive: {alive[:5]}")
    if not collect_until(lambda: churn.shared.size() == 0):
        violations.append(f"shared cache holds {churn.shared.size()} entries after all its functions died")
    full = [c.size() for c in churn.kept_caches if c.size() != 0]
    if full:
        violations.append(f"{len(full)} own caches of dead functions not empty: sizes {full[:5]}")
    if len(churn.rss) >= 3:
        first, last = rss_thirds(churn.rss)
        if last - first > RSS_GROWTH_LIMIT:
            violations.append(f"RSS grew {(last - first) / _MIB:.1f} MiB from the first to the last third "
                              f"(limit {RSS_GROWTH_LIMIT / _MIB:.0f} MiB)")
    return violations


@register("churn", "closures created, jitted, called and dropped while another thread collects garbage")
def run_churn(ctx: Context) -> Result:
    churn = Churn(ctx)
    hangs = churn.pool.run([churn.work] * churn.nthreads, background=[churn.collector])
    violations = check(churn, hangs)
    notes = [f"{len(churn.dropped) // 2} closures dropped, {churn.collections} concurrent gc.collect() calls, "
             f"{len(churn.kept_caches)} own caches checked empty"]
    if len(churn.rss) >= 3:
        first, last = rss_thirds(churn.rss)
        notes.append(f"RSS first third {first / _MIB:.1f} MiB, last third {last / _MIB:.1f} MiB "
                     f"({(last - first) / _MIB:+.1f} MiB, {len(churn.rss)} samples)")
    return churn.pool.result(churn.compiler.calls, churn.closure_waits, violations, notes)
