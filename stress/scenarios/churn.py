"""Scenario "churn": threads create, jit, call and drop closures while another thread runs gc; nothing leaks."""

from __future__ import annotations

import gc
import os
import random
import statistics
import threading
import time
import weakref
from typing import Any, Callable, Optional

import ftjit

from ..gc_wait import gc_collect_until
from ..registry import Context, Result, register
from ._calls import ARG_SPECS, mismatch, weak_executable
from ._pool import Pool, WorkerLog

DEFAULT_THREADS = 16
CLOSURES_QUICK = 300  #: per thread
CLOSURES_FULL = 800
SHARED_CAPACITY = 8
OWN_CAPACITY = 2  #: a closure with its own cache uses up to 3 signatures: it evicts
OWN_CACHE_P = 0.5  #: probability that a closure gets its own FunctionCache rather than the shared one
CYCLE_P = 0.3  #: probability that a closure is kept in a reference cycle (only the gc frees it)
KEEP_OWN_CACHE_EVERY = 8  #: keep every 8th own cache alive to check it empties when its function dies
RSS_SAMPLE_EVERY = 8  #: each worker samples RSS after every 8th closure (the pool's 50 ms polls are too coarse)
GC_SLEEP_S = (0.001, 0.005)
_MIB = 2**20
#: Ballast, so that a leak shows in RSS: every closure and every executable holds this many touched bytes. A
#: leak of either grows RSS by ~PAYLOAD_BYTES per leaked object: at quick size ~150 MiB of ballast moves through
#: between the two RSS windows, against an allowed growth of RSS_GROWTH_LIMIT.
PAYLOAD_BYTES = 16 * 1024
#: Allowed growth of the median RSS from the run's second quarter to its last (by progress): after the first
#: quarter the allocator's arenas are warm; without a leak it moves by 0-4 MiB (measured), while leaking just
#: the evicted executables grows it by ~35 MiB at quick size.
RSS_GROWTH_LIMIT = 10 * _MIB
RSS_TEETH = 4  #: the ballast moved between the two windows must be >= RSS_TEETH x the limit, or the check is void


def rss_bytes() -> int:
    """Resident set size of this process (Linux /proc; 0 where unavailable)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def ballast(fill: int) -> bytes:
    """PAYLOAD_BYTES bytes, every page written (so they count in RSS at once)."""
    return bytes([fill]) * PAYLOAD_BYTES


def make_closure(tag: int) -> Callable[..., Any]:
    """A fresh function object closing over ``tag`` (and ballast): exact on the small integers the threads pass."""
    payload = ballast(tag & 0xFF)

    def churn_target(x: Any, k: int) -> Any:
        assert payload  # keeps the ballast in the closure
        return x * tag + k

    churn_target.tag = tag  # type: ignore[attr-defined]
    return churn_target


class BallastCompiler:
    """Counts its calls; each executable holds ``fun`` weakly and PAYLOAD_BYTES of ballast (a leaked one shows in RSS).

    Keeps no per-key records: the scenario's own bookkeeping must not grow with the run, or it would pass for a
    leak in the RSS check.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls = 0  # guarded by _lock

    @property
    def calls(self) -> int:
        with self._lock:
            return self._calls

    def __call__(self, fun: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Callable[..., Any]:
        with self._lock:
            self._calls += 1
        executable = weak_executable(fun)
        executable.ballast = ballast(0x5A)  # type: ignore[attr-defined]
        return executable


def _tag_of(obj: Any) -> Any:
    """The closure tag of a closure or of its jitted wrapper (for naming survivors)."""
    return getattr(obj, "tag", None) or getattr(getattr(obj, "__wrapped__", None), "tag", "?")


class Churn:
    """One run: the shared cache and compiler, the weakrefs to everything dropped, and RSS samples."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.nthreads = ctx.thread_count(DEFAULT_THREADS)
        self.closures = ctx.size(CLOSURES_QUICK, CLOSURES_FULL)
        rng = random.Random(ctx.seed)
        self.thread_seeds = [rng.getrandbits(32) for _ in range(self.nthreads + 1)]
        self.compiler = BallastCompiler()
        self.shared = ftjit.FunctionCache(capacity=SHARED_CAPACITY)
        self.lock = threading.Lock()
        #: every dropped closure and jitted closure until it dies (a WeakSet: constant memory when nothing leaks)
        self.alive: weakref.WeakSet[Any] = weakref.WeakSet()
        self.dropped = 0  # guarded by lock
        self.kept_caches: list[Any] = []
        self.closure_compiles = 0
        self.closure_waits = 0
        self.collections = 0  #: by the collector thread (its own counter: no lock needed)
        self.rss: list[tuple[int, int]] = []  #: (closures done, RSS bytes), appended by the workers
        self.size_violations: list[str] = []
        self.pool = Pool(ctx, "churn", self.nthreads * self.closures, on_poll=self._sample)

    def _sample(self) -> None:
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
            if n % RSS_SAMPLE_EVERY == 0:
                self.rss.append((self.pool.done, rss_bytes()))

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
            self.alive.add(fun)
            self.alive.add(jf)
            self.dropped += 2
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


def rss_windows(samples: list[tuple[int, int]], total: int) -> Optional[tuple[float, float]]:
    """Median RSS in the run's second quarter and in its last quarter (by closures done); None if either is empty.

    Medians: cyclic garbage (closures with ballast waiting for the collector) makes transient peaks and dips.
    """
    second = [rss for done, rss in samples if total // 4 <= done < total // 2]
    last = [rss for done, rss in samples if done >= 3 * total // 4]
    if not second or not last or not all(second + last):
        return None
    return float(statistics.median(second)), float(statistics.median(last))


def check_rss(churn: Churn) -> tuple[list[str], str]:
    """RSS growth from the second quarter to the last stays under the limit; returns (violations, note)."""
    if churn.ctx.scale < 1:
        # A scaled-down run (ThreadSanitizer: its shadow memory dwarfs the ballast) moves too little for the
        # bound to mean anything: the weakref checks above still run, the RSS check does not.
        return [], f"RSS not checked: a run scaled by {churn.ctx.scale:g} moves too little ballast for the bound"
    windows = rss_windows(churn.rss, churn.pool.total)
    if windows is None:  # e.g. no /proc: say so rather than pass silently
        return [], f"RSS not checked: {len(churn.rss)} samples, none usable in both windows"
    second, last = windows
    # Ballast moved from the middle of the second quarter to the middle of the last: half the run's closures,
    # each with its own ballast and that of its executables (one per compile).
    closures = churn.pool.total // 2
    moved = closures * PAYLOAD_BYTES * (1 + churn.compiler.calls / max(1, churn.pool.total))
    note = (f"median RSS in the second quarter {second / _MIB:.1f} MiB, in the last quarter {last / _MIB:.1f} MiB "
            f"({(last - second) / _MIB:+.1f} MiB, limit +{RSS_GROWTH_LIMIT / _MIB:g}; {moved / _MIB:.0f} MiB of "
            f"ballast moved through in between; {len(churn.rss)} samples)")
    out = []
    if last - second > RSS_GROWTH_LIMIT:
        out.append(f"RSS grew {(last - second) / _MIB:.1f} MiB from the second quarter of the run to the last "
                   f"(limit {RSS_GROWTH_LIMIT / _MIB:g} MiB): a leak")
    if moved < RSS_TEETH * RSS_GROWTH_LIMIT:
        out.append(f"only {moved / _MIB:.0f} MiB of ballast moved between the RSS windows: too little for the "
                   f"{RSS_GROWTH_LIMIT / _MIB:g} MiB bound to detect a leak (needs {RSS_TEETH}x)")
    return out, note


def check(churn: Churn, aborted: list[str]) -> list[str]:
    violations = list(aborted) + churn.size_violations
    if churn.closure_compiles != churn.compiler.calls:
        violations.append(f"closures' compiles sum to {churn.closure_compiles} != {churn.compiler.calls} compiler calls")
    if not gc_collect_until(lambda: len(churn.alive) == 0):
        alive = [f"{type(o).__name__} of closure {_tag_of(o)}" for o in list(churn.alive)[:5]]
        violations.append(f"{len(churn.alive)} of {churn.dropped} dropped objects (closures and their jitted "
                          f"wrappers) still alive: {alive}")
    if not gc_collect_until(lambda: churn.shared.size() == 0):
        violations.append(f"shared cache holds {churn.shared.size()} entries after all its functions died")
    full = [c.size() for c in churn.kept_caches if c.size() != 0]
    if full:
        violations.append(f"{len(full)} own caches of dead functions not empty: sizes {full[:5]}")
    if not aborted:
        violations += check_rss(churn)[0]
    return violations


@register("churn", "closures created, jitted, called and dropped while another thread collects garbage")
def run_churn(ctx: Context) -> Result:
    churn = Churn(ctx)
    aborted = churn.pool.run([churn.work] * churn.nthreads, background=[churn.collector])
    violations = check(churn, aborted)
    notes = [f"{churn.dropped // 2} closures dropped, {churn.collections} concurrent gc.collect() calls, "
             f"{len(churn.kept_caches)} own caches checked empty"]
    notes.append(check_rss(churn)[1])
    return churn.pool.result(churn.compiler.calls, churn.closure_waits, violations, notes)
