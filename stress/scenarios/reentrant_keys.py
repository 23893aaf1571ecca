"""Scenario "reentrant_keys": static arguments whose __eq__/__hash__ re-enter jit, clear the cache or run the gc."""

from __future__ import annotations

import gc
import random
import threading
from typing import Any, Callable, Hashable

import ftjit

from ..registry import Context, Result, register
from ._calls import ARG_SPECS, TrackingCompiler, mismatch, signature_key
from ._pool import Pool, WorkerLog

DEFAULT_THREADS = 24
CALLS_QUICK = 100
CALLS_FULL = 400
KEY_VALUES = 6  #: Key(0..5); hashes collide in pairs, so lookups run __eq__ against other values too
MODES = ("reenter", "clear", "gc", "hash_reenter", "plain")
MODE_WEIGHTS = (3, 1, 2, 2, 2)  #: "clear" is rarer, or almost every call would miss
COMPILE_SLEEP_S = (0.0, 0.002)  #: so threads also wait on each other's compiles
FULL_GC_EVERY = 16  #: one gc.collect() in 16 from __eq__ is a full collection, the rest generation 0
GARBAGE_CYCLES = 500
CAPACITY = 64
_depth = threading.local()


class Key:
    """A static argument that misbehaves in __eq__ or __hash__ according to its mode (at depth 0 only)."""

    def __init__(self, v: int, mode: str, owner: Reentrant) -> None:
        self.v = v
        self.mode = mode
        self.owner = owner

    def __hash__(self) -> int:
        if self.mode == "hash_reenter":
            self.owner.misbehave("reenter")
        return hash(("Key", self.v // 2))

    def __eq__(self, other: object) -> bool:
        if other is self:
            return True
        if not isinstance(other, Key):
            return NotImplemented
        self.owner.misbehave(self.mode)
        return self.v == other.v

    def __repr__(self) -> str:
        return f"Key({self.v}, {self.mode})"


def reentrant_target(x: Any, k: Any) -> Any:
    return x * (k.v + 1 if isinstance(k, Key) else k) + 1


class Reentrant:
    """One run: the jitted function, the misbehaviours its keys trigger, and the calls that check it."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.nthreads = ctx.thread_count(DEFAULT_THREADS)
        self.calls_per_thread = ctx.size(CALLS_QUICK, CALLS_FULL)
        rng = random.Random(ctx.seed)
        self.compiler = TrackingCompiler(self._key_of, rng, COMPILE_SLEEP_S)
        self.jf = ftjit.jit(reentrant_target, static_argnums=1, compiler=self.compiler,
                            cache=ftjit.FunctionCache(capacity=CAPACITY))
        self.seeds = [rng.getrandbits(32) for _ in range(self.nthreads)]
        self.lock = threading.Lock()
        self.misbehaved = {mode: 0 for mode in MODES if mode != "plain"}
        self.inner_failures: list[str] = []
        self.gc_runs = 0
        self.pool = Pool(ctx, "reentrant_keys", self.nthreads * self.calls_per_thread)

    @staticmethod
    def _key_of(fun: Callable[..., Any], args: tuple[Any, ...]) -> Hashable:
        x, k = args
        static = ("Key", k.v) if isinstance(k, Key) else ("int", k)  # never hash a Key here: it would re-enter
        return signature_key(x, static)

    def misbehave(self, mode: str) -> None:
        """Runs ``mode``'s side effect unless this thread is already inside one (no unbounded recursion)."""
        if getattr(_depth, "inside", False) or mode == "plain":
            return
        _depth.inside = True
        try:
            self._side_effect(mode)
        finally:
            _depth.inside = False
        with self.lock:
            self.misbehaved[mode] += 1

    def _side_effect(self, mode: str) -> None:
        if mode == "reenter":  # an int static: another signature of the same function, mid-lookup
            self._inner_check(self.jf(3.0, 4), 13.0, mode)
            self._inner_check(self.jf(3, Key(2, "plain", self)), 10, mode)
        elif mode == "clear":
            self.jf.clear_cache()
        elif mode == "gc":
            junk: list[Any] = []
            for _ in range(GARBAGE_CYCLES):
                cycle: list[Any] = [junk]
                cycle.append(cycle)
            del junk
            with self.lock:
                self.gc_runs += 1
                full = self.gc_runs % FULL_GC_EVERY == 0
            gc.collect(2 if full else 0)

    def _inner_check(self, out: Any, expected: Any, mode: str) -> None:
        problem = mismatch(out, expected)
        if problem:
            with self.lock:
                self.inner_failures.append(f"re-entered call from {mode}: {problem}")

    def work(self, index: int, log: WorkerLog) -> None:
        rng = random.Random(self.seeds[index])
        for n in range(self.calls_per_thread):
            if self.pool.stop.is_set():
                return
            # Each thread's first key is a "clear" one: with "clear" this rare,
            # a run whose first stored keys (whose __eq__ the lookups call)
            # all had other modes could finish without a single clear (~3% of
            # --quick runs), testing nothing of that mode.
            mode = "clear" if n == 0 else rng.choices(MODES, MODE_WEIGHTS)[0]
            key = Key(rng.randrange(KEY_VALUES), mode, self)
            spec = rng.choice(ARG_SPECS)
            x = spec.make(rng.randrange(50))
            log.round, log.phase = n, f"call {spec} {key!r}"
            out, exc = log.timed(self.jf, x, key)
            problem = f"raised {type(exc).__name__}: {exc}" if exc else mismatch(out, reentrant_target(x, key))
            if problem:
                log.failures.append(f"thread {index} call {n} {spec} {key!r}: {problem}")
            self.pool.step()


def check(run: Reentrant, aborted: list[str]) -> list[str]:
    violations = list(aborted) + run.inner_failures[:5]
    info = run.jf.cache_info()
    if info.compiles != run.compiler.calls or info.misses != run.compiler.calls or info.failures:
        violations.append(f"{run.compiler.calls} compiler calls but {info}")
    if info.size > len(run.compiler.per_key):
        violations.append(f"size {info.size} > {len(run.compiler.per_key)} distinct signatures compiled")
    idle = [mode for mode, count in run.misbehaved.items() if count == 0]
    if idle and not aborted:
        violations.append(f"modes never triggered (the scenario did not test them): {idle}")
    return violations


@register("reentrant_keys", "static args whose __eq__/__hash__ re-enter the function, clear its cache, or run gc")
def run_reentrant_keys(ctx: Context) -> Result:
    run = Reentrant(ctx)
    aborted = run.pool.run([run.work] * run.nthreads)
    violations = check(run, aborted)
    notes = [f"misbehaviours run: {run.misbehaved}"]
    return run.pool.result(run.compiler.calls, run.jf.cache_info().waits, violations, notes)
