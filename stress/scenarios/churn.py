"""Scenario "churn": threads create, jit, call and drop closures while another thread runs gc; nothing leaks."""

from __future__ import annotations

import gc
import random
import statistics
import threading
import time
import tracemalloc
import weakref
from typing import Any, Callable, Optional

import ftjit
from ftjit import _core

from .. import memory
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
#: between the two RSS windows, against an allowed growth of rss_limit().
PAYLOAD_BYTES = 16 * 1024
#: Allowed growth of the median RSS from the run's second quarter to its last (by progress): RSS_GROWTH_BASE plus
#: RSS_GROWTH_PER_THREAD per worker thread. The allocator's own ramp, which threads allocating and freeing in
#: parallel keep up past the first quarter (free-threaded CPython's mimalloc: a heap per thread, pages freed by
#: other threads), is measured by the scenario churn-control (the same closures, calls and collections without
#: ftjit): on 13 cores (3.13t, GIL off) it grew +31 MiB at 16 workers and +45 to +86 MiB at 48, 1.8 MiB per
#: thread at most; in 4-minute soaks both plateaued (churn's last-quarter median 504-512 MiB in five runs of 48
#: threads; churn-control's 482-520 in seven). On 2 cores it moves 0-4 MiB. What the RSS bound lets through, the
#: exact checks catch: the core's objects (entries, stores, retired; check_core), malloc's bytes in use (the
#: core allocates with malloc; MALLOC_GROWTH_LIMIT) and the weak references to every dropped object.
RSS_GROWTH_BASE = 10 * _MIB
RSS_GROWTH_PER_THREAD = 2 * _MIB
RSS_TEETH = 3  #: the ballast moved between the two windows must be >= RSS_TEETH x the limit, or the check is void
#: Allowed growth of glibc malloc's bytes in use between the same windows (medians): the core's entries, stores,
#: signatures and tables are malloc'd, so a leak of them shows here whatever mimalloc's pages do. Measured: +0.1
#: MiB at 16 threads and +0.4 at 48 on 13 cores (3.13t); on 3.11, where Python's objects over 512 bytes (the
#: ballast) are malloc'd too, ... (see memory_note).
MALLOC_GROWTH_LIMIT = 4 * _MIB


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


class Survivors:
    """Weak references to every dropped object until it dies, all behind one lock. (A WeakSet does not do here:
    its len(), read while a weakref callback in another thread removes from it, is a data race that
    ThreadSanitizer reports on 3.13t.) The lock is reentrant: a collection can run a callback in a thread that
    holds it."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._refs: dict[int, weakref.ref[Any]] = {}  # guarded by _lock
        self._next = 0  # guarded by _lock

    def add(self, obj: Any) -> None:
        with self._lock:
            key, self._next = self._next, self._next + 1
            self._refs[key] = weakref.ref(obj, lambda _ref, key=key: self._gone(key))

    def _gone(self, key: int) -> None:
        with self._lock:
            del self._refs[key]

    def __len__(self) -> int:
        with self._lock:
            return len(self._refs)

    def objects(self, most: int) -> list[Any]:
        """Up to ``most`` of the objects still alive."""
        with self._lock:
            refs = list(self._refs.values())
        return [obj for obj in (ref() for ref in refs) if obj is not None][:most]


class Churn:
    """One run: the shared cache and compiler, the weakrefs to everything dropped, and RSS samples."""

    def __init__(self, ctx: Context, control: bool = False) -> None:
        self.ctx = ctx
        self.control = control  #: churn-control: the same closures, calls and collections, without ftjit
        self.nthreads = ctx.thread_count(DEFAULT_THREADS)
        self.closures = ctx.size(CLOSURES_QUICK, CLOSURES_FULL)
        rng = random.Random(ctx.seed)
        self.thread_seeds = [rng.getrandbits(32) for _ in range(self.nthreads + 1)]
        self.compiler = BallastCompiler()
        self.shared = ftjit.FunctionCache(capacity=SHARED_CAPACITY)
        self.lock = threading.Lock()
        #: every dropped closure and jitted closure until it dies (constant memory when nothing leaks)
        self.alive = Survivors()
        self.dropped = 0  # guarded by lock
        self.kept_caches: list[Any] = []
        self.closure_compiles = 0
        self.closure_waits = 0
        self.collections = 0  #: by the collector thread (its own counter: no lock needed)
        self.gc_seconds: list[tuple[int, float]] = []  #: (closures done, seconds) of each collection (its thread's)
        self.rss: list[tuple[int, int]] = []  #: (closures done, RSS bytes), appended by the workers
        #: (closures done, memory.snapshot()) at each of the pool's polls (50 ms): malloc's bytes and the core's
        #: objects. One thread takes them: ctypes (mallinfo2) is not thread-safe on 3.13t (ThreadSanitizer).
        self.snapshots: list[tuple[int, dict[str, int]]] = []
        _core._thread_index()  # this (the checking) thread's index, taken before the count as after it
        for _ in range(3):  # earlier scenarios' garbage (functions in cycles) goes before the count
            gc.collect()
        self.before = memory.core_counts(reclaim=True)  #: the core's objects before the run (other scenarios')
        self.size_violations: list[str] = []
        self.pool = Pool(ctx, "churn-control" if control else "churn", self.nthreads * self.closures,
                         on_poll=self._sample)

    def _sample(self) -> None:
        size = self.shared.size()
        if size > SHARED_CAPACITY + self.nthreads and len(self.size_violations) < 3:
            self.size_violations.append(
                f"shared cache.size() == {size} mid-run > capacity {SHARED_CAPACITY} + {self.nthreads} compiling")
        if self.pool.done >= self.pool.total:  # the run's work is done: a sample now is not of the run
            return
        snap = memory.snapshot()
        snap["backlog"] = len(self.alive)  # dropped, not yet freed: mostly cycles awaiting the collector
        self.snapshots.append((self.pool.done, snap))

    def work(self, index: int, log: WorkerLog) -> None:
        rng = random.Random(self.thread_seeds[index])
        for n in range(self.closures):
            if self.pool.stop.is_set():
                return
            log.round, log.phase = n, "closure"
            self._one_closure(index * self.closures + n + 1, rng, log)
            self.pool.step()
            if n % RSS_SAMPLE_EVERY == 0:
                self.rss.append((self.pool.done, memory.rss_bytes()))

    def _one_closure(self, tag: int, rng: random.Random, log: WorkerLog) -> None:
        fun = make_closure(tag)
        if self.control:
            self._one_plain_closure(fun, rng, log)
            return
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

    def _one_plain_closure(self, fun: Callable[..., Any], rng: random.Random, log: WorkerLog) -> None:
        """churn-control's closure: called as the jitted one would be, kept in a cycle as often, never jitted."""
        rng.random()  # the own-cache draw, as _one_closure makes it
        for spec in rng.sample(ARG_SPECS, rng.randint(1, 3)):
            for value in (rng.randrange(50), rng.randrange(50)):
                log.timed(fun, spec.make(value), rng.randrange(2))
        if rng.random() < CYCLE_P:
            fun.cycle = (fun,)  # type: ignore[attr-defined]
        with self.lock:
            self.alive.add(fun)
            self.dropped += 2
        del fun

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
            start = time.perf_counter()
            gc.collect(rng.choice((0, 1, 2)))
            self.gc_seconds.append((self.pool.done, time.perf_counter() - start))
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


def rss_limit(churn: Churn) -> float:
    """The RSS growth allowed between the two windows (see RSS_GROWTH_BASE)."""
    return RSS_GROWTH_BASE + RSS_GROWTH_PER_THREAD * churn.nthreads


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
    limit = rss_limit(churn)
    # Ballast moved from the middle of the second quarter to the middle of the last: half the run's closures,
    # each with its own ballast and that of its executables (one per compile).
    closures = churn.pool.total // 2
    moved = closures * PAYLOAD_BYTES * (1 + churn.compiler.calls / max(1, churn.pool.total))
    note = (f"median RSS in the second quarter {second / _MIB:.1f} MiB, in the last quarter {last / _MIB:.1f} MiB "
            f"({(last - second) / _MIB:+.1f} MiB, limit +{limit / _MIB:g}; {moved / _MIB:.0f} MiB of "
            f"ballast moved through in between; {len(churn.rss)} samples)")
    out = []
    if last - second > limit:
        out.append(f"RSS grew {(last - second) / _MIB:.1f} MiB from the second quarter of the run to the last "
                   f"(limit {limit / _MIB:g} MiB): a leak")
    if moved < RSS_TEETH * limit and not churn.control:
        out.append(f"only {moved / _MIB:.0f} MiB of ballast moved between the RSS windows: too little for the "
                   f"{limit / _MIB:g} MiB bound to detect a leak (needs {RSS_TEETH}x)")
    return out, note


def check_malloc(churn: Churn) -> list[str]:
    """glibc malloc's bytes in use (medians of the two windows) grow by at most MALLOC_GROWTH_LIMIT."""
    total = churn.pool.total
    second = [s["malloc_used"] for done, s in churn.snapshots if total // 4 <= done < total // 2 and "malloc_used" in s]
    last = [s["malloc_used"] for done, s in churn.snapshots if done >= 3 * total // 4 and "malloc_used" in s]
    if not second or not last or tracemalloc.is_tracing():  # off glibc; tracemalloc's own traces are malloc'd
        return []
    growth = statistics.median(last) - statistics.median(second)
    if growth <= MALLOC_GROWTH_LIMIT:
        return []
    return [f"malloc's bytes in use grew {growth / _MIB:.1f} MiB from the second quarter of the run to the last "
            f"(limit {MALLOC_GROWTH_LIMIT / _MIB:g} MiB): C or C++ memory kept per closure"]


#: The core's objects that follow the work: once every closure of the run is dead, each is back to at most its count
#: before the run (retired: 0, after a reclaim): none kept per closure. At most, not exactly: an earlier scenario's
#: objects may die during the run. Checked whatever the RSS did.
FOLLOW_THE_WORK = ("entries", "stores", "batch_queues")


def check_core(churn: Churn) -> list[str]:
    """The core's live objects are back where they were before the run: nothing kept per dropped closure (entries,
    stores), per thread (indices, once the workers' thread-locals are gone) or retired and never freed."""
    before = churn.before
    after: dict[str, int] = {}

    def settled() -> bool:
        after.clear()
        after.update(memory.core_counts(reclaim=True))
        return (all(after[k] <= before[k] for k in FOLLOW_THE_WORK) and after["retired"] == 0
                and after["thread_indices_held"] <= before["thread_indices_held"])

    if gc_collect_until(settled):
        return []
    changed = {k: (before[k], after[k]) for k in (*FOLLOW_THE_WORK, "retired", "thread_indices_held")
               if after[k] > before[k]}
    return [f"the core's objects did not return to their count before the run (before, after): {changed}"]


def memory_note(churn: Churn) -> str:
    """Where memory went, by owner: malloc's bytes in use and held free (glibc), its arenas, the core's objects
    (the most seen mid-run), and Python's (tracemalloc, when the run traces)."""
    total = churn.pool.total
    second = [s for done, s in churn.snapshots if total // 4 <= done < total // 2]
    last = [s for done, s in churn.snapshots if done >= 3 * total // 4]
    parts = []
    if second and last and "malloc_used" in last[0]:
        for key, label in (("malloc_used", "malloc in use"), ("malloc_free", "malloc held free")):
            a = statistics.median(s[key] for s in second)
            b = statistics.median(s[key] for s in last)
            parts.append(f"{label} {memory.mib(a)} -> {memory.mib(b)} ({(b - a) / _MIB:+.1f})")
        if "py_blocks" in last[0]:
            a, b = (int(statistics.median(s["py_blocks"] for s in w)) for w in (second, last))
            parts.append(f"Python's allocated blocks {a} -> {b} ({b - a:+d})")
        arenas = memory.malloc_arenas()
        if arenas is not None:
            parts.append(f"{arenas} malloc arenas")
    if second and last:
        a, b = (int(statistics.median(s["backlog"] for s in w)) for w in (second, last))
        parts.append(f"dropped closures not yet freed {a} -> {b}")
    gc_second = [t for done, t in churn.gc_seconds if total // 4 <= done < total // 2]
    gc_last = [t for done, t in churn.gc_seconds if done >= 3 * total // 4]
    if gc_second and gc_last:
        parts.append(f"gc.collect() {statistics.median(gc_second) * 1e3:.1f} -> "
                     f"{statistics.median(gc_last) * 1e3:.1f} ms")
    parts.append(f"{len(second)} and {len(last)} snapshots in those quarters")
    if churn.snapshots:
        peak = {k: max(s[k] for _, s in churn.snapshots) for k in ("entries", "stores", "retired")}
        parts.append("the core's most alive at once: " + ", ".join(f"{v} {k}" for k, v in peak.items()))
    if tracemalloc.is_tracing():
        current, peak_py = tracemalloc.get_traced_memory()
        parts.append(f"Python (tracemalloc) {memory.mib(current)} now, {memory.mib(peak_py)} at the peak")
    return "; ".join(parts) if parts else "no malloc or core figures sampled"


def check(churn: Churn, aborted: list[str]) -> list[str]:
    if churn.control:  # no invariant of ftjit's: its RSS is the figure churn's is read against
        return list(aborted)
    violations = list(aborted) + churn.size_violations
    if churn.closure_compiles != churn.compiler.calls:
        violations.append(f"closures' compiles sum to {churn.closure_compiles} != {churn.compiler.calls} compiler calls")
    if not gc_collect_until(lambda: len(churn.alive) == 0):
        alive = [f"{type(o).__name__} of closure {_tag_of(o)}" for o in churn.alive.objects(5)]
        violations.append(f"{len(churn.alive)} of {churn.dropped} dropped objects (closures and their jitted "
                          f"wrappers) still alive: {alive}")
    if not gc_collect_until(lambda: churn.shared.size() == 0):
        violations.append(f"shared cache holds {churn.shared.size()} entries after all its functions died")
    full = [c.size() for c in churn.kept_caches if c.size() != 0]
    if full:
        violations.append(f"{len(full)} own caches of dead functions not empty: sizes {full[:5]}")
    if not aborted:
        violations += check_core(churn)
        violations += check_malloc(churn)
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
    notes.append(memory_note(churn))
    return churn.pool.result(churn.compiler.calls, churn.closure_waits, violations, notes)


@register("churn-control", "churn's closures, calls, cycles and collections without ftjit: the RSS growth of the "
          "interpreter and its allocators alone, against which churn's is read", hidden=True)
def run_churn_control(ctx: Context) -> Result:
    churn = Churn(ctx, control=True)
    aborted = churn.pool.run([churn.work] * churn.nthreads, background=[churn.collector])
    notes = [f"{churn.dropped // 2} plain closures dropped (no ftjit), {churn.collections} concurrent gc.collect() "
             f"calls", check_rss(churn)[1], memory_note(churn)]
    return churn.pool.result(0, 0, check(churn, aborted), notes)
