"""Scenario "clear_storm": clear_cache(), clear_caches() and FunctionCache.clear() race threads calling."""

from __future__ import annotations

import random
import threading
import time
from typing import Any, Callable, Hashable

import ftjit

from ..registry import Context, Result, register
from ._calls import ARG_SPECS, TrackingCompiler, mismatch, signature_key
from ._pool import Pool, WorkerLog

DEFAULT_CALLERS = 24
CLEARERS = 4
FUNCTIONS = 4
STATICS = (0, 3)
CALLS_QUICK = 1000
CALLS_FULL = 2500
COMPILE_SLEEP_S = (0.0, 0.003)  #: clears land during compiles too
CLEAR_SLEEP_S = (0.002, 0.010)
CLEAR_KINDS = ("jf.clear_cache", "ftjit.clear_caches", "FunctionCache.clear")
SIGNATURES = len(ARG_SPECS) * len(STATICS)
#: every CLEAR_GATE calls a caller waits (briefly) until the clearers have
#: done at least calls/CLEAR_GATE clears in all, so clears land throughout the
#: storm however fast the calls are (hits take ~2 us, clears come every few ms)
CLEAR_GATE = 100
CLEAR_WAIT_S = 10.0


def make_function(index: int) -> Callable[..., Any]:
    def storm_target(x: Any, k: int) -> Any:
        return x * (index + 3) - k

    storm_target.__qualname__ = f"storm_target_{index}"
    return storm_target


class Storm:
    """One run: functions on a shared cache (and one on the default cache), callers and clearers."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.ncallers = ctx.thread_count(DEFAULT_CALLERS)
        self.calls_per_thread = ctx.size(CALLS_QUICK, CALLS_FULL)
        rng = random.Random(ctx.seed)
        self.funs = [make_function(i) for i in range(FUNCTIONS)]
        self.index_of = {fun: i for i, fun in enumerate(self.funs)}
        self.compiler = TrackingCompiler(self._key_of, rng, COMPILE_SLEEP_S)
        self.cache = ftjit.FunctionCache(capacity=FUNCTIONS * SIGNATURES)  # big enough: only clears drop entries
        caches = [self.cache] * (FUNCTIONS - 1) + [None]  # the last one lives in ftjit's default cache
        self.jfs = [ftjit.jit(f, static_argnums=1, compiler=self.compiler, cache=c) for f, c in zip(self.funs, caches)]
        self.seeds = [rng.getrandbits(32) for _ in range(self.ncallers + CLEARERS)]
        self.per_function_calls = [[0] * FUNCTIONS for _ in range(self.ncallers)]
        self.clears = {kind: 0 for kind in CLEAR_KINDS}
        self.clears_total = 0  # guarded by clears_lock (the condition's lock)
        self.clears_lock = threading.Lock()
        self.cleared = threading.Condition(self.clears_lock)  # notified after each clear
        self.pool = Pool(ctx, "clear_storm", self.ncallers * self.calls_per_thread)

    def _key_of(self, fun: Callable[..., Any], args: tuple[Any, ...]) -> Hashable:
        return (self.index_of[fun],) + signature_key(*args)

    def call(self, index: int, log: WorkerLog) -> None:
        rng = random.Random(self.seeds[index])
        counts = self.per_function_calls[index]
        for n in range(self.calls_per_thread):
            if self.pool.stop.is_set():
                return
            if n and n % CLEAR_GATE == 0 and not self._clears_caught_up(n // CLEAR_GATE):
                log.failures.append(f"caller {index}: the clearers did {self.clears_total} clears in "
                                    f"{CLEAR_WAIT_S} s, fewer than the {n // CLEAR_GATE} the storm needs")
                return
            f, spec, k = rng.randrange(FUNCTIONS), rng.choice(ARG_SPECS), rng.choice(STATICS)
            x = spec.make(rng.randrange(100))
            log.round, log.phase = n, f"call f{f} {spec} k={k}"
            out, exc = log.timed(self.jfs[f], x, k)
            counts[f] += 1
            problem = f"raised {type(exc).__name__}: {exc}" if exc else mismatch(out, self.funs[f](x, k))
            if problem:
                log.failures.append(f"caller {index} call {n} f{f} {spec} k={k}: {problem}")
            self.pool.step()

    def _clears_caught_up(self, needed: int) -> bool:
        with self.cleared:
            return self.cleared.wait_for(
                lambda: self.clears_total >= needed or self.pool.stop.is_set(), timeout=CLEAR_WAIT_S
            )

    def clear(self, index: int, log: WorkerLog) -> None:
        """Background: the three clears in turn (each clearer from its own
        starting point), every few ms until the callers are done."""
        rng = random.Random(self.seeds[self.ncallers + index])
        turn = index
        while not self.pool.stop.is_set():
            kind = CLEAR_KINDS[turn % len(CLEAR_KINDS)]
            turn += 1
            log.phase = kind
            if kind == "jf.clear_cache":
                self.jfs[rng.randrange(FUNCTIONS)].clear_cache()
            elif kind == "ftjit.clear_caches":
                ftjit.clear_caches()
            else:
                self.cache.clear()
            with self.cleared:
                self.clears[kind] += 1
                self.clears_total += 1
                self.cleared.notify_all()
            time.sleep(rng.uniform(*CLEAR_SLEEP_S))


def check(storm: Storm, aborted: list[str]) -> list[str]:
    """Exact books per function, then: after a final clear every size is 0, and each signature recompiles once."""
    violations = list(aborted)
    per_fun = [0] * FUNCTIONS
    for key, count in storm.compiler.per_key.items():
        per_fun[key[0]] += count  # type: ignore[index]
    for f, jf in enumerate(storm.jfs):
        info = jf.cache_info()
        calls = sum(counts[f] for counts in storm.per_function_calls)
        if info.compiles != per_fun[f] or info.misses != per_fun[f] or info.failures:
            violations.append(f"f{f}: {per_fun[f]} compiler calls but {info}")
        if not aborted and info.hits + info.misses + info.waits != calls:
            violations.append(f"f{f}: hits+misses+waits == {info.hits + info.misses + info.waits} != {calls} calls")
        if info.size > SIGNATURES:
            violations.append(f"f{f}: size {info.size} > {SIGNATURES} distinct signatures")
    if aborted:
        return violations
    # The storm happened: every kind of clear ran while callers called, and
    # clears dropped entries that callers then compiled again.
    if min(storm.clears.values()) == 0:
        violations.append(f"a kind of clear never ran during the storm: {storm.clears}")
    if storm.compiler.calls <= FUNCTIONS * SIGNATURES:
        violations.append(
            f"{storm.compiler.calls} compiles for {FUNCTIONS * SIGNATURES} signatures: no clear dropped an entry "
            "that was called again, so the storm tested nothing"
        )
    ftjit.clear_caches()
    sizes = [jf.cache_info().size for jf in storm.jfs] + [storm.cache.size()]
    if any(sizes):
        violations.append(f"sizes after a final clear_caches() with no compile running: {sizes}")
    violations.extend(_recompile_once(storm))
    return violations


def _recompile_once(storm: Storm) -> list[str]:
    """Single-threaded after the storm: every (function, signature) compiles exactly once more, correctly."""
    before = storm.compiler.calls
    out = []
    for _ in range(2):
        for f, jf in enumerate(storm.jfs):
            for spec in ARG_SPECS:
                for k in STATICS:
                    problem = mismatch(jf(spec.make(5), k), storm.funs[f](spec.make(5), k))
                    if problem:
                        out.append(f"after the storm f{f} {spec} k={k}: {problem}")
    if storm.compiler.calls - before != FUNCTIONS * SIGNATURES:
        out.append(f"after the storm: {storm.compiler.calls - before} compiles for {FUNCTIONS * SIGNATURES} keys")
    return out


@register("clear_storm", "clear_cache / clear_caches / FunctionCache.clear from some threads while others call")
def run_clear_storm(ctx: Context) -> Result:
    storm = Storm(ctx)
    aborted = storm.pool.run([storm.call] * storm.ncallers, background=[storm.clear] * CLEARERS)
    overlaps = len(storm.compiler.overlaps)  # allowed: a cleared in-progress compile is not kept (documented)
    violations = check(storm, aborted)
    infos = [jf.cache_info() for jf in storm.jfs]
    notes = [f"clears: {storm.clears}; {overlaps} compiles overlapped a cleared in-progress compile of their key"]
    return storm.pool.result(storm.compiler.calls, sum(i.waits for i in infos), violations, notes)
