"""Scenario "mixed": threads call many functions x signatures at random through one small shared FunctionCache."""

from __future__ import annotations

import random
from typing import Any, Callable, Hashable

import ftjit

from ..registry import Context, Result, register
from ._calls import ARG_SPECS, ArgSpec, TrackingCompiler, mismatch, signature_key
from ._pool import Pool, WorkerLog

DEFAULT_THREADS = 32
FUNCTIONS = 8
STATICS = (1, 7)  #: static ``k`` values: each doubles the signatures of every arg spec
CAPACITY = 12  #: far below FUNCTIONS * len(ARG_SPECS) * len(STATICS) == 96 keys: evictions during compiles
CALLS_QUICK = 300
CALLS_FULL = 1500
COMPILE_SLEEP_S = (0.0, 0.002)
ZIPF_S = 0.9  #: key popularity ~ 1 / rank**ZIPF_S, so some keys stay cached and hit


def make_function(index: int) -> Callable[..., Any]:
    """Function ``index``: exact on the small integers the threads pass."""

    def mixed_target(x: Any, k: int) -> Any:
        return x * (index + 2) + k

    mixed_target.__qualname__ = f"mixed_target_{index}"
    return mixed_target


Key = tuple[int, ArgSpec, int]  #: (function index, dynamic arg spec, static k)


class Mixed:
    """One run: the functions, their jitted wrappers over one small cache, and the per-thread call mix."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.nthreads = ctx.thread_count(DEFAULT_THREADS)
        self.calls_per_thread = ctx.size(CALLS_QUICK, CALLS_FULL)
        rng = random.Random(ctx.seed)
        self.funs = [make_function(i) for i in range(FUNCTIONS)]
        self.index_of = {fun: i for i, fun in enumerate(self.funs)}
        self.compiler = TrackingCompiler(self._key_of, rng, COMPILE_SLEEP_S)
        self.cache = ftjit.FunctionCache(capacity=CAPACITY)
        self.jfs = [ftjit.jit(f, static_argnums=1, compiler=self.compiler, cache=self.cache) for f in self.funs]
        self.keys: list[Key] = [(f, spec, k) for f in range(FUNCTIONS) for spec in ARG_SPECS for k in STATICS]
        rng.shuffle(self.keys)
        self.weights = [1.0 / (rank + 1) ** ZIPF_S for rank in range(len(self.keys))]
        self.thread_seeds = [rng.getrandbits(32) for _ in range(self.nthreads)]
        self.per_function_calls = [[0] * FUNCTIONS for _ in range(self.nthreads)]
        self.max_size_seen = 0
        self.size_violations: list[str] = []
        self.pool = Pool(ctx, "mixed", self.nthreads * self.calls_per_thread, on_poll=self._sample)

    def _key_of(self, fun: Callable[..., Any], args: tuple[Any, ...]) -> Hashable:
        return (self.index_of[fun],) + signature_key(*args)

    def _sample(self) -> None:
        """While compiles run, pinned entries may exceed the capacity, by at most one per compiling thread."""
        size = self.cache.size()
        self.max_size_seen = max(self.max_size_seen, size)
        if size > CAPACITY + self.nthreads and len(self.size_violations) < 3:
            self.size_violations.append(f"cache.size() == {size} mid-run > capacity {CAPACITY} + {self.nthreads}")

    def work(self, index: int, log: WorkerLog) -> None:
        rng = random.Random(self.thread_seeds[index])
        counts = self.per_function_calls[index]
        for call in range(self.calls_per_thread):
            if self.pool.stop.is_set():
                return
            log.round = call
            f, spec, k = rng.choices(self.keys, self.weights)[0]
            x = spec.make(rng.randrange(100))
            log.phase = f"call f{f} {spec} k={k}"
            out, exc = log.timed(self.jfs[f], x, k)
            counts[f] += 1
            problem = f"raised {type(exc).__name__}: {exc}" if exc else mismatch(out, self.funs[f](x, k))
            if problem:
                log.failures.append(f"thread {index} call {call} f{f} {spec} k={k}: {problem}")
            self.pool.step()


def check(mixed: Mixed, aborted: list[str]) -> list[str]:
    violations = list(aborted) + mixed.size_violations
    infos = [jf.cache_info() for jf in mixed.jfs]
    per_fun_compiles = [0] * FUNCTIONS
    for key, count in mixed.compiler.per_key.items():
        per_fun_compiles[key[0]] += count  # type: ignore[index]
    if mixed.compiler.overlaps:
        shown = sorted(set(map(str, mixed.compiler.overlaps)))[:5]
        violations.append(f"{len(mixed.compiler.overlaps)} compiles entered while the same key compiled: {shown}")
    evictions = sum(info.evictions for info in infos)
    if evictions == 0:
        violations.append("no evictions: the scenario did not exercise eviction during compiles")
    size = mixed.cache.size()
    if size > CAPACITY:
        violations.append(f"cache.size() == {size} > capacity {CAPACITY} after all compiles finished")
    if sum(info.size for info in infos) != size:
        violations.append(f"per-function sizes sum to {sum(i.size for i in infos)} != cache.size() {size}")
    for f, info in enumerate(infos):
        calls = sum(counts[f] for counts in mixed.per_function_calls)
        violations.extend(_function_books(f, info, per_fun_compiles[f], calls, cut_short=bool(aborted)))
    return violations


def _function_books(f: int, info: Any, compiler_calls: int, calls: int, cut_short: bool) -> list[str]:
    """Exact per-function counters: no failures, one miss per compile, and compiles - evictions == size."""
    out = []
    if info.compiles != compiler_calls or info.misses != compiler_calls:
        out.append(f"f{f}: compiles {info.compiles}, misses {info.misses}, compiler calls {compiler_calls}")
    if info.failures:
        out.append(f"f{f}: {info.failures} failed compiles (the compiler never fails)")
    if info.compiles - info.evictions != info.size:
        out.append(f"f{f}: compiles {info.compiles} - evictions {info.evictions} != size {info.size}")
    if not cut_short and info.hits + info.misses + info.waits != calls:
        out.append(f"f{f}: hits+misses+waits == {info.hits + info.misses + info.waits} != {calls} calls")
    return out


@register("mixed", "random functions x signatures through one small FunctionCache; evictions during compiles")
def run_mixed(ctx: Context) -> Result:
    mixed = Mixed(ctx)
    aborted = mixed.pool.run([mixed.work] * mixed.nthreads)
    violations = check(mixed, aborted)
    infos = [jf.cache_info() for jf in mixed.jfs]
    notes = [f"{sum(i.evictions for i in infos)} evictions, cache size peaked at {mixed.max_size_seen} "
             f"(capacity {CAPACITY}), up to {mixed.compiler.max_active} compiles at once"]
    return mixed.pool.result(mixed.compiler.calls, sum(i.waits for i in infos), violations, notes)
