"""Thread scaling: calls per second with 1 thread, and with 2 threads on one function and on two, for
the ftjit core against functools.lru_cache, the core on a jax Array (no anchor) and ftjit.jit against
jax.jit, interleaved in one run.

Every thread is a worker (never the main thread) and calls with arguments of
its own (distinct objects of the same signature, as requests carry), so the
numbers show what the dispatch itself shares between threads, not the
reference counts of one argument object. A configuration's calls/s is the
median over the rounds; scaling is the 2-thread median over the 1-thread
median, so every ratio printed can be recomputed from the rates beside it.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import statistics
import threading
import time
from typing import Any, Callable, Optional, Sequence

from .cases import FREE_THREADED, identity_compiler

#: (label, config) in table order: 1 thread; 2 threads sharing one function; 2 threads, a function each.
CONFIGS = (("1 thread", "one"), ("2 threads, one function", "same"), ("2 threads, two functions", "distinct"))


@dataclasses.dataclass(frozen=True)
class Contender:
    """One side: a label and how to make a fresh (function, per-thread argument maker) pair."""

    label: str
    make: Callable[[int], tuple[Callable[..., Any], Callable[[], tuple[Any, ...]]]]


@dataclasses.dataclass(frozen=True)
class Scaling:
    """Measured calls/s of one contender, per config (all rounds kept)."""

    label: str
    rates: dict[str, tuple[float, ...]]

    def rate(self, config: str) -> float:
        return statistics.median(self.rates[config])

    def scaling(self, config: str) -> float:
        return self.rate(config) / self.rate("one")


@dataclasses.dataclass(frozen=True)
class Target:
    """A checked claim on the scaling numbers: ``value() >= minimum``."""

    text: str
    value: float
    minimum: float
    applies: bool  # set for this build (False: reported only)

    @property
    def status(self) -> str:
        if not self.applies:
            return "report"
        return "PASS" if self.value >= self.minimum else "MISS"


@dataclasses.dataclass(frozen=True)
class ScalingResult:
    groups: tuple[tuple[Scaling, ...], ...]  # (ftjit side, anchor side), or the ftjit side alone, per group
    targets: tuple[Target, ...]
    calls: int
    rounds: int
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float]


def _hammer(fns: Sequence[Callable[..., Any]], arg_makers: Sequence[Callable[[], tuple[Any, ...]]],
            calls: int) -> float:
    """Calls per second (all threads together) of len(fns) worker threads, thread i calling fns[i] with
    arguments from arg_makers[i](), released together by a barrier."""
    barrier = threading.Barrier(len(fns) + 1)
    errors: list[BaseException] = []

    def work(fn: Callable[..., Any], make_args: Callable[[], tuple[Any, ...]]) -> None:
        try:
            args = make_args()
            fn(*args)  # this thread's first call (its per-thread state) is not timed
            barrier.wait()
            for _ in range(calls):
                fn(*args)
        except BaseException as exc:  # re-raised below
            errors.append(exc)
            barrier.abort()

    workers = [threading.Thread(target=work, args=(fn, mk)) for fn, mk in zip(fns, arg_makers)]
    for w in workers:
        w.start()
    try:
        barrier.wait()
    except threading.BrokenBarrierError:
        pass
    t0 = time.perf_counter()
    for w in workers:
        w.join(timeout=600)
    elapsed = time.perf_counter() - t0
    if errors:
        raise errors[0]
    if any(w.is_alive() for w in workers):
        raise RuntimeError("benchmark thread hung")
    return len(fns) * calls / elapsed


def measure_scaling(groups: Sequence[Sequence[Contender]], calls: int, rounds: int,
                    on_round: Optional[Callable[[int, int], None]] = None) -> list[tuple[Scaling, ...]]:
    """Every contender in every config, ``rounds`` times; within a round the sides of a group alternate
    which goes first, config by config."""
    made = [[(c, c.make(0), c.make(1)) for c in pair] for pair in groups]
    rates: list[list[dict[str, list[float]]]] = [[{cfg: [] for _, cfg in CONFIGS} for _ in pair] for pair in groups]
    for r in range(rounds):
        for g, pair in enumerate(made):
            for k, (_, cfg) in enumerate(CONFIGS):
                order = range(len(pair)) if (r + k) % 2 == 0 else reversed(range(len(pair)))
                for i in order:
                    _, (fn0, args0), (fn1, args1) = pair[i]
                    if cfg == "one":
                        fns, makers = [fn0], [args0]
                    elif cfg == "same":
                        fns, makers = [fn0, fn0], [args0, args0]
                    else:
                        fns, makers = [fn0, fn1], [args0, args1]
                    rates[g][i][cfg].append(_hammer(fns, makers, calls))
        if on_round is not None:
            on_round(r + 1, rounds)
    return [tuple(Scaling(c.label, {cfg: tuple(v) for cfg, v in rates[g][i].items()})
                  for i, (c, _, _) in enumerate(pair))
            for g, pair in enumerate(made)]


def _core_contenders() -> tuple[Contender, Contender]:
    import ftjit

    def core(i: int) -> tuple[Callable[..., Any], Callable[[], tuple[Any, ...]]]:
        def f(x: float, y: float) -> float:
            return x

        fn = ftjit.jit(f, compiler=identity_compiler, cache=ftjit.FunctionCache(capacity=16))
        return fn, lambda: (float("1.5"), float("2.5"))  # fresh float objects per thread

    def lru(i: int) -> tuple[Callable[..., Any], Callable[[], tuple[Any, ...]]]:
        def f(x: float, y: float) -> float:
            return x

        return functools.lru_cache(maxsize=None)(f), lambda: (float("1.5"), float("2.5"))

    return Contender("ftjit core", core), Contender("lru_cache", lru)


def _core_array_contender() -> Contender:
    """The core (identity compiler) on one f32[4] jax Array: what ftjit's own signature of an array costs
    across threads, without JAX's dispatch. No anchor: lru_cache cannot hash a jax Array."""
    import jax.numpy as jnp

    import ftjit

    def core(i: int) -> tuple[Callable[..., Any], Callable[[], tuple[Any, ...]]]:
        def f(x: Any) -> Any:
            return x

        fn = ftjit.jit(f, compiler=identity_compiler, cache=ftjit.FunctionCache(capacity=16))
        return fn, lambda: (jnp.arange(4, dtype=jnp.float32) + 0,)  # an array object of the thread's own

    return Contender("ftjit core, jax Array", core)


def _jax_contenders() -> tuple[Contender, Contender]:
    import jax
    import jax.numpy as jnp

    import ftjit

    def arrays() -> tuple[Any, ...]:
        return jnp.arange(4, dtype=jnp.float32), jnp.ones(4, dtype=jnp.float32)

    def ours(i: int) -> tuple[Callable[..., Any], Callable[[], tuple[Any, ...]]]:
        def add(x: Any, y: Any) -> Any:
            return x + y

        return ftjit.jit(add, cache=ftjit.FunctionCache(capacity=16)), arrays

    def theirs(i: int) -> tuple[Callable[..., Any], Callable[[], tuple[Any, ...]]]:
        def add(x: Any, y: Any) -> Any:
            return x + y

        return jax.jit(add), arrays

    return Contender("ftjit.jit", ours), Contender("jax.jit", theirs)


def scaling_result(calls: int, rounds: int, with_jax: bool = True,
                   on_round: Optional[Callable[[int, int], None]] = None) -> ScalingResult:
    """The scaling table's measurement and its targets (set for the free-threaded build: on a GIL build
    two threads take turns, and the numbers are reported only)."""
    groups: list[tuple[Contender, ...]] = [_core_contenders()]
    if with_jax:
        groups += [(_core_array_contender(),), _jax_contenders()]
    load_before = os.getloadavg()
    measured = measure_scaling(groups, calls, rounds, on_round)
    load_after = os.getloadavg()
    core, lru = measured[0]
    targets = [
        Target("ftjit core: 2 threads on one function / 1 thread", core.scaling("same"), 1.8, FREE_THREADED),
    ]
    if with_jax:
        ours, theirs = measured[-1]
        # 2 threads, one function: the ratio of the two rates printed in that column.
        minimum, applies = (1.5, True) if FREE_THREADED else (0.9, True)
        targets.append(Target("ftjit.jit / jax.jit throughput, 2 threads on one function",
                              ours.rate("same") / theirs.rate("same"), minimum, applies))
    return ScalingResult(tuple(measured), tuple(targets), calls, rounds, load_before, load_after)
