"""Scenario "jax": the default JAX compiler under a herd onto new shapes and a mixed load over a small cache."""

from __future__ import annotations

import random
import threading
from typing import Any, Callable, Hashable

import numpy as np

import ftjit

from ..registry import Context, Result, register
from ._pool import Pool, WorkerLog

DEFAULT_THREADS = 32  #: herd threads; the mixed part runs half as many
HERD_SIZES_QUICK = (1, 2, 3, 5)  #: one herd round per shape (n,): JAX compiles take 50-200 ms here
HERD_SIZES_FULL = (1, 2, 3, 4, 5, 6, 7, 8, 11, 16)
HITS_PER_ROUND = 2
MIXED_SIZES = (1, 2, 3, 4)
MIXED_CALLS_QUICK = 12  #: per thread
MIXED_CALLS_FULL = 60
MIXED_CAPACITY = 5  #: of 3 functions x 4 shapes == 12 keys: evictions
ZIPF_S = 1.2
RTOL = 1e-5


def _functions() -> list[tuple[Callable[[Any], Any], Callable[[np.ndarray], np.ndarray]]]:
    """(jax function, numpy reference) pairs; imports jax only when the scenario runs."""
    import jax.numpy as jnp

    def jax_sin(x: Any) -> Any:
        return jnp.sin(x) * 2 + 1

    def jax_square(x: Any) -> Any:
        return x * x - 3

    def jax_cos(x: Any) -> Any:
        return jnp.cos(x) + x

    return [(jax_sin, lambda x: np.sin(x) * 2 + 1), (jax_square, lambda x: x * x - 3),
            (jax_cos, lambda x: np.cos(x) + x)]


def counting_jax_compiler() -> Any:
    """A ``ftjit.JaxCompiler`` (every hook inherited: the JAX path end to end) that also counts its compiles.

    Counted independently of ftjit's own books: per (function, shape, dtype) how often it compiled, and every
    compile entered while the same key was still compiling in another thread (which must never happen).
    """

    class CountingJaxCompiler(ftjit.JaxCompiler):
        def __init__(self) -> None:
            super().__init__()
            self.lock = threading.Lock()
            self.per_key: dict[Hashable, int] = {}  # guarded by lock
            self.active: dict[Hashable, int] = {}  # guarded by lock
            self.overlaps: list[Hashable] = []  # guarded by lock

        def __call__(self, fun: Callable[..., Any], args: tuple, kwargs: dict) -> Callable[..., Any]:
            key = (fun.__name__,) + tuple((np.shape(a), str(np.asarray(a).dtype)) for a in args)
            with self.lock:
                self.per_key[key] = self.per_key.get(key, 0) + 1
                if self.active.get(key, 0):
                    self.overlaps.append(key)
                self.active[key] = self.active.get(key, 0) + 1
            try:
                return super().__call__(fun, args, kwargs)
            finally:
                with self.lock:
                    self.active[key] -= 1

        def calls_for(self, name: str) -> tuple[int, int]:
            """(compiles, distinct signatures) of the function called ``name``."""
            with self.lock:
                counts = [c for k, c in self.per_key.items() if k[0] == name]
            return sum(counts), len(counts)

    return CountingJaxCompiler()


def mismatch(out: Any, expected: np.ndarray) -> str:
    """Empty when ``out`` matches ``expected`` in shape and (to RTOL) values, else the assertion message."""
    try:
        got = np.asarray(out)
        if got.shape != expected.shape or got.dtype != expected.dtype:
            return f"got {got.dtype}{got.shape}, expected {expected.dtype}{expected.shape}"
        np.testing.assert_allclose(got, expected, rtol=RTOL, atol=1e-6)
        return ""
    except AssertionError as exc:
        return str(exc).strip().splitlines()[-1]


def argument(n: int, value: int) -> np.ndarray:
    return np.linspace(-1.0, 1.0, n, dtype=np.float32) + np.float32(value % 7) / 8


class JaxRun:
    """One run: the herd part (one function, a new shape per round) then the mixed part (small cache)."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.nherd = ctx.thread_count(DEFAULT_THREADS)
        self.nmixed = max(2, self.nherd // 2)
        self.sizes = HERD_SIZES_QUICK if ctx.quick else HERD_SIZES_FULL
        self.mixed_calls = ctx.size(MIXED_CALLS_QUICK, MIXED_CALLS_FULL)
        rng = random.Random(ctx.seed)
        self.pairs = _functions()
        self.herd_compiler = counting_jax_compiler()
        self.mixed_compiler = counting_jax_compiler()
        self.herd_jf = ftjit.jit(self.pairs[0][0], cache=ftjit.FunctionCache(capacity=64), compiler=self.herd_compiler)
        self.cache = ftjit.FunctionCache(capacity=MIXED_CAPACITY)
        self.mixed_jfs = [ftjit.jit(fn, cache=self.cache, compiler=self.mixed_compiler) for fn, _ in self.pairs]
        self.keys = [(f, n) for f in range(len(self.pairs)) for n in MIXED_SIZES]
        rng.shuffle(self.keys)
        self.weights = [1.0 / (rank + 1) ** ZIPF_S for rank in range(len(self.keys))]
        self.seeds = [rng.getrandbits(32) for _ in range(self.nmixed)]
        self.per_function_calls = [[0] * len(self.pairs) for _ in range(self.nmixed)]
        self.herd_calls = [0] * self.nherd
        total = len(self.sizes) * self.nherd + self.nmixed * self.mixed_calls
        self.pool = Pool(ctx, "jax", total)
        self.barrier = threading.Barrier(self.nherd)
        self.pool.barriers.append(self.barrier)

    def herd(self, index: int, log: WorkerLog) -> None:
        reference = self.pairs[0][1]
        for rnd, n in enumerate(self.sizes):
            log.round, log.phase = rnd, "barrier"
            try:
                self.barrier.wait(self.ctx.wait_timeout)
            except threading.BrokenBarrierError:
                return
            x = argument(n, index)
            for call in range(1 + HITS_PER_ROUND):
                log.phase = "herd call" if call == 0 else "hit call"
                out, exc = log.timed(self.herd_jf, x)
                self.herd_calls[index] += 1
                problem = f"raised {type(exc).__name__}: {exc}" if exc else mismatch(out, reference(x))
                if problem:
                    log.failures.append(f"herd thread {index} shape ({n},): {problem}")
            self.pool.step()

    def mixed(self, index: int, log: WorkerLog) -> None:
        rng = random.Random(self.seeds[index])
        for call in range(self.mixed_calls):
            if self.pool.stop.is_set():
                return
            f, n = rng.choices(self.keys, self.weights)[0]
            x = argument(n, rng.randrange(100))
            log.round, log.phase = call, f"mixed call f{f} ({n},)"
            out, exc = log.timed(self.mixed_jfs[f], x)
            self.per_function_calls[index][f] += 1
            problem = f"raised {type(exc).__name__}: {exc}" if exc else mismatch(out, self.pairs[f][1](x))
            if problem:
                log.failures.append(f"mixed thread {index} f{f} ({n},): {problem}")
            self.pool.step()


def check_herd(run: JaxRun) -> list[str]:
    info, rounds = run.herd_jf.cache_info(), len(run.sizes)
    out = []
    got = (info.compiles, info.misses, info.failures, info.size, info.evictions)
    if got != (rounds, rounds, 0, rounds, 0):
        out.append(f"herd: (compiles, misses, failures, size, evictions) == {got} for {rounds} distinct shapes")
    if info.hits + info.misses + info.waits != sum(run.herd_calls):
        out.append(f"herd: hits+misses+waits == {info.hits + info.misses + info.waits} != {sum(run.herd_calls)} calls")
    counted = run.herd_compiler.per_key
    if sorted(counted.values()) != [1] * rounds or run.herd_compiler.overlaps:
        out.append(f"herd: the JAX compiler itself ran {sum(counted.values())} times for {rounds} distinct shapes "
                   f"(per signature {dict(counted)}; compiled concurrently twice: {run.herd_compiler.overlaps})")
    return out


def check_mixed(run: JaxRun) -> list[str]:
    infos = [jf.cache_info() for jf in run.mixed_jfs]
    out = []
    if sum(i.evictions for i in infos) == 0:
        out.append("mixed: no evictions: the scenario did not exercise eviction")
    if run.cache.size() > MIXED_CAPACITY or sum(i.size for i in infos) != run.cache.size():
        out.append(f"mixed: cache.size() {run.cache.size()}, sizes {[i.size for i in infos]}, capacity {MIXED_CAPACITY}")
    if run.mixed_compiler.overlaps:
        shown = sorted(set(map(str, run.mixed_compiler.overlaps)))[:5]
        out.append(f"mixed: {len(run.mixed_compiler.overlaps)} JAX compiles entered while the same signature "
                   f"was compiling: {shown}")
    for f, info in enumerate(infos):
        calls = sum(counts[f] for counts in run.per_function_calls)
        compiled, distinct = run.mixed_compiler.calls_for(run.pairs[f][0].__name__)
        if info.compiles != info.misses or info.failures or info.compiles - info.evictions != info.size:
            out.append(f"mixed f{f}: books off: {info}")
        # Counted by the compiler itself: each compile is one of ftjit's, and a signature compiles again only
        # after an eviction of it: distinct <= compiles <= distinct + evictions.
        if compiled != info.compiles or not distinct <= compiled <= distinct + info.evictions:
            out.append(f"mixed f{f}: the JAX compiler ran {compiled} times for {distinct} distinct signatures, "
                       f"ftjit counted {info.compiles} compiles and {info.evictions} evictions")
        if info.hits + info.misses + info.waits != calls:
            out.append(f"mixed f{f}: hits+misses+waits == {info.hits + info.misses + info.waits} != {calls} calls")
    return out


@register("jax", "the default JAX compiler: a herd onto new shapes, then a mixed load over a small cache",
          needs_jax=True)
def run_jax(ctx: Context) -> Result:
    run = JaxRun(ctx)
    aborted = run.pool.run([run.herd] * run.nherd)
    violations = list(aborted) or check_herd(run)
    if not aborted:
        aborted = run.pool.run([run.mixed] * run.nmixed)
        violations += aborted or check_mixed(run)
    infos = [run.herd_jf.cache_info()] + [jf.cache_info() for jf in run.mixed_jfs]
    notes = [f"herd compiles {infos[0].compiles} for {len(run.sizes)} shapes; mixed compiles "
             f"{sum(i.compiles for i in infos[1:])} ({len(run.mixed_compiler.per_key)} distinct signatures), "
             f"evictions {sum(i.evictions for i in infos[1:])}; "
             f"compile seconds {sum(i.compile_seconds for i in infos):.2f}"]
    return run.pool.result(sum(i.compiles for i in infos), sum(i.waits for i in infos), violations, notes,
                           threads=run.nherd)
