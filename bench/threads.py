"""Thread scaling: calls per second with 1 thread, and with 2 threads on one function and on two, for
the ftjit core against functools.lru_cache, the core on a jax Array (no anchor) and ftjit.jit against
jax.jit, interleaved in one run; or, given thread counts (``--threads 1,2,4``), with each of those many
threads, every thread calling a function of its own, and ftjit.jit against jax.jit again with one
function that every thread calls (a server's worker threads).

Every thread is a worker (never the main thread) and calls with arguments of
its own (distinct objects of the same signature, as requests carry), so the
numbers show what the dispatch itself shares between threads, not the
reference counts of one argument object. A configuration's calls/s is the
median over the rounds; scaling (speed-up) is the 2-thread (N-thread) median
over the 1-thread median. Every number the table prints, and every target
computed from them, comes from the same rounding (``shown_rate``, and the
speed-ups as printed), so every ratio printed can be recomputed from the
numbers beside it, to the last digit printed, on any machine.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import statistics
import threading
import time
from typing import Any, Callable, Optional, Sequence

from .cases import FREE_THREADED, identity_compiler


@dataclasses.dataclass(frozen=True)
class Config:
    """A column of the table: ``threads`` worker threads, all calling one function (``shared``) or thread i
    calling the i-th function the contender made; ``key`` names it in Scaling.rates and the JSON."""

    key: str
    label: str
    threads: int
    shared: bool = False


#: The default columns: 1 thread; 2 threads sharing one function; 2 threads, a function each.
CONFIGS = (Config("one", "1 thread", 1), Config("same", "2 threads, one function", 2, shared=True),
           Config("distinct", "2 threads, two functions", 2))


def thread_configs(counts: Sequence[int]) -> tuple[Config, ...]:
    """The columns of ``--threads``: one per count, keyed by the count, every thread with its own function."""
    return tuple(Config(str(n), f"{n} thread{'s' if n > 1 else ''}", n) for n in counts)


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
    base: str = "one"  # the 1-thread config's key

    def rate(self, config: str) -> float:
        return statistics.median(self.rates[config])

    def scaling(self, config: str) -> float:
        return self.rate(config) / self.rate(self.base)

    def shown_rate(self, config: str) -> float:
        """The median rate as the table prints it (``shown_rate``)."""
        return shown_rate(self.rate(config))

    def shown_scaling(self, config: str) -> float:
        """The speed-up as the table prints it: of the printed rates, to two decimals."""
        return round(ratio(self.shown_rate(config), self.shown_rate(self.base)), 2)


def shown_rate(rate: float) -> float:
    """A rate (calls/s) rounded as the table prints it: to thousands from a million up ("6.181M"), else to
    hundreds ("165.8k")."""
    return round(rate, -3) if rate >= 1e6 else round(rate, -2)


def ratio(a: float, b: float) -> float:
    """``a / b``, infinite where ``b`` printed as 0."""
    return a / b if b else math.inf


@dataclasses.dataclass(frozen=True)
class Target:
    """A checked claim on the scaling numbers: ``value() >= minimum``."""

    text: str
    value: float
    minimum: float
    applies: bool  # set for this build and machine (False: reported only)
    reason: str = ""  # why it is reported only, when it does not apply

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
    thread_counts: Optional[tuple[int, ...]] = None  # --threads; None: the default configs

    @property
    def configs(self) -> tuple[Config, ...]:
        return CONFIGS if self.thread_counts is None else thread_configs(self.thread_counts)


def _hammer(fns: Sequence[Callable[..., Any]], arg_makers: Sequence[Callable[[], tuple[Any, ...]]],
            calls: int) -> float:
    """Calls per second (all threads together) of len(fns) worker threads, thread i calling fns[i] with
    arguments from arg_makers[i](), released together by a barrier: all the calls over the span from the
    first thread's start to the last one's end, each read by the worker itself (the main thread's clock
    would start late on a GIL build, when the last thread to reach the barrier keeps running)."""
    barrier = threading.Barrier(len(fns))
    errors: list[BaseException] = []
    spans: list[tuple[float, float]] = []

    def work(fn: Callable[..., Any], make_args: Callable[[], tuple[Any, ...]]) -> None:
        try:
            args = make_args()
            fn(*args)  # this thread's first call (its per-thread state) is not timed
            barrier.wait()
            start = time.perf_counter()
            for _ in range(calls):
                fn(*args)
            spans.append((start, time.perf_counter()))
        except BaseException as exc:  # re-raised below
            errors.append(exc)
            barrier.abort()

    workers = [threading.Thread(target=work, args=(fn, mk)) for fn, mk in zip(fns, arg_makers)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=600)
    if errors:
        raise errors[0]
    if any(w.is_alive() for w in workers):
        raise RuntimeError("benchmark thread hung")
    elapsed = max(end for _, end in spans) - min(start for start, _ in spans)
    return len(fns) * calls / elapsed


def measure_scaling(groups: Sequence[Sequence[Contender]], calls: int, rounds: int,
                    on_round: Optional[Callable[[int, int], None]] = None,
                    configs: Sequence[Config] = CONFIGS) -> list[tuple[Scaling, ...]]:
    """Every contender in every config, ``rounds`` times; within a round the sides of a group alternate
    which goes first, config by config. Each contender makes one function per thread index once, and a
    config's threads call the first (shared) or one each."""
    width = max(cfg.threads for cfg in configs)
    made = [[(c, [c.make(t) for t in range(width)]) for c in group] for group in groups]
    rates: list[list[dict[str, list[float]]]] = [[{cfg.key: [] for cfg in configs} for _ in group] for group in groups]
    for r in range(rounds):
        for g, group in enumerate(made):
            for k, cfg in enumerate(configs):
                order = range(len(group)) if (r + k) % 2 == 0 else reversed(range(len(group)))
                for i in order:
                    per_index = group[i][1]  # (function, argument maker) per thread index
                    per_thread = per_index[:1] * cfg.threads if cfg.shared else per_index[:cfg.threads]
                    fns, makers = zip(*per_thread)
                    rates[g][i][cfg.key].append(_hammer(fns, makers, calls))
        if on_round is not None:
            on_round(r + 1, rounds)
    return [tuple(Scaling(c.label, {key: tuple(v) for key, v in rates[g][i].items()}, configs[0].key)
                  for i, (c, _) in enumerate(group))
            for g, group in enumerate(made)]


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


def _core_array_contenders() -> tuple[Contender, Contender]:
    """The core on one f32[4] jax Array, without JAX's dispatch: with the identity compiler (no hooks: the
    array is read as any duck-typed array, through its .dtype/.shape/.weak_type properties), and with the
    JAX compiler's signature hooks but an executable that returns the function (what ftjit.jit does
    before it calls jaxlib: the JAX context, the array read through .aval). No anchor: lru_cache cannot
    hash a jax Array."""
    import dataclasses

    import jax.numpy as jnp

    import ftjit

    class JaxSignatureOnly(ftjit.JaxCompiler):
        """The JAX compiler's signature; the executable is the function itself."""

        def __call__(self, fun: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            return fun

        def hooks(self, fun: Callable[..., Any]) -> Any:
            return dataclasses.replace(super().hooks(fun), executable_for=None, context_in_executable=False,
                                       thread_call=None)

    def maker(compiler: Callable[[], Any]) -> Callable[[int], tuple[Callable[..., Any], Callable[[], tuple[Any, ...]]]]:
        def core(i: int) -> tuple[Callable[..., Any], Callable[[], tuple[Any, ...]]]:
            def f(x: Any) -> Any:
                return x

            fn = ftjit.jit(f, compiler=compiler(), cache=ftjit.FunctionCache(capacity=16))
            return fn, lambda: (jnp.arange(4, dtype=jnp.float32) + 0,)  # an array object of the thread's own

        return core

    return (Contender("ftjit core, jax Array", maker(lambda: identity_compiler)),
            Contender("ftjit core + JAX hooks, jax Array", maker(JaxSignatureOnly)))


def _jax_contenders(shared: bool = False) -> tuple[Contender, Contender]:
    """ftjit.jit and jax.jit of x + y on two f32[4] jax Arrays, each thread with arrays of its own: a
    function per thread index, or (``shared``) one function that every thread calls, as a server's
    worker threads do."""
    import jax
    import jax.numpy as jnp

    import ftjit

    def arrays() -> tuple[Any, ...]:
        return jnp.arange(4, dtype=jnp.float32), jnp.ones(4, dtype=jnp.float32)

    def add(x: Any, y: Any) -> Any:
        return x + y

    def one_each(jit: Callable[[Callable[..., Any]], Any]) -> Callable[[int], tuple[Any, Any]]:
        def make(i: int) -> tuple[Callable[..., Any], Callable[[], tuple[Any, ...]]]:
            def f(x: Any, y: Any) -> Any:
                return add(x, y)

            return jit(f), arrays

        return make

    def one_for_all(jit: Callable[[Callable[..., Any]], Any]) -> Callable[[int], tuple[Any, Any]]:
        made: list[Any] = []

        def make(i: int) -> tuple[Callable[..., Any], Callable[[], tuple[Any, ...]]]:
            if not made:
                def f(x: Any, y: Any) -> Any:
                    return add(x, y)

                made.append(jit(f))
            return made[0], arrays

        return make

    def ours(f: Callable[..., Any]) -> Any:
        return ftjit.jit(f, cache=ftjit.FunctionCache(capacity=16))

    if shared:
        return (Contender("ftjit.jit, one function", one_for_all(ours)),
                Contender("jax.jit, one function", one_for_all(jax.jit)))
    return Contender("ftjit.jit", one_each(ours)), Contender("jax.jit", one_each(jax.jit))


def _jaxlib_contenders() -> tuple[Contender, Contender]:
    """jaxlib alone: the compiled x + y program's C++ call object (what ftjit.jit's executables are, made
    as jax.stages.Compiled makes it), one per thread and one that every thread shares, each thread with
    arrays of its own. No ftjit, no jax.jit dispatch: the ceiling of what any dispatch above jaxlib gets."""
    import jax
    import jax.numpy as jnp

    def arrays() -> tuple[Any, ...]:
        return jnp.arange(4, dtype=jnp.float32), jnp.ones(4, dtype=jnp.float32)

    compiled = jax.jit(lambda x, y: x + y).lower(*arrays()).compile()

    def call() -> Callable[..., Any]:
        made = compiled._executable.create_cpp_call(compiled._params)
        return made if made is not None else compiled

    shared: list[Any] = []

    def one_each(i: int) -> tuple[Callable[..., Any], Callable[[], tuple[Any, ...]]]:
        return call(), arrays

    def one_for_all(i: int) -> tuple[Callable[..., Any], Callable[[], tuple[Any, ...]]]:
        if not shared:
            shared.append(call())
        return shared[0], arrays

    return (Contender("jaxlib's call, one per thread", one_each),
            Contender("jaxlib's call, one shared", one_for_all))


def scaling_result(calls: int, rounds: int, with_jax: bool = True,
                   on_round: Optional[Callable[[int, int], None]] = None,
                   thread_counts: Optional[Sequence[int]] = None) -> ScalingResult:
    """The scaling table's measurement and its targets: for the default configs, or for ``thread_counts``
    (increasing, from 1) with every thread calling a function of its own."""
    groups: list[tuple[Contender, ...]] = [_core_contenders()]
    if with_jax:
        groups += [_core_array_contenders(), _jax_contenders()]
        if thread_counts is not None:  # and one function that every thread calls, as a server's do
            groups += [_jax_contenders(shared=True), _jaxlib_contenders()]
    counts = None if thread_counts is None else tuple(thread_counts)
    configs = CONFIGS if counts is None else thread_configs(counts)
    load_before = os.getloadavg()
    measured = measure_scaling(groups, calls, rounds, on_round, configs)
    load_after = os.getloadavg()
    targets = (_default_targets(measured) if counts is None
               else _thread_targets(measured, counts[-1]) + _shared_function_targets(measured, counts))
    return ScalingResult(tuple(measured), tuple(targets), calls, rounds, load_before, load_after, counts)


def _default_targets(measured: Sequence[tuple[Scaling, ...]]) -> list[Target]:
    """Set for the free-threaded build: on a GIL build two threads take turns, and the core's scaling is
    reported only; ftjit.jit against jax.jit has a GIL build's minimum of its own."""
    core, _ = measured[0]
    targets = [
        Target("ftjit core: 2 threads on one function / 1 thread", core.shown_scaling("same"), 1.8, FREE_THREADED,
               "the target is set for the free-threaded build; on a GIL build two threads take turns"),
    ]
    if len(measured) > 1:
        ours, theirs = measured[-1]
        # 2 threads, one function: the ratio of the two rates printed in that column.
        minimum, applies = (1.5, True) if FREE_THREADED else (0.9, True)
        targets.append(Target("ftjit.jit / jax.jit throughput, 2 threads on one function",
                              ratio(ours.shown_rate("same"), theirs.shown_rate("same")), minimum, applies))
    return targets


def _shared_function_targets(measured: Sequence[tuple[Scaling, ...]], counts: Sequence[int]) -> list[Target]:
    """Issue 40's targets on one function every thread calls (a server's shape), at the counts given: >= 0.95
    of jax.jit at 1 thread, >= 1.20 at 12 threads, and >= 1.0 with three times more threads than 16 (48:
    more threads than cores, and than the 16 slots of old). Set on a free-threaded build with at least 12
    cores (the many-core device); reported elsewhere."""
    if len(measured) < 4:
        return []
    cpus = os.cpu_count() or 1
    ours_one, theirs_one = measured[3]
    applies = FREE_THREADED and cpus >= 12
    reason = ("the targets are set for the free-threaded build; on a GIL build threads take turns"
              if not FREE_THREADED else f"set for a machine of 12 cores or more; this one has {cpus}")
    wanted = [(1, 0.95), (12, 1.20)] + [(n, 1.0) for n in counts if n >= 48]
    return [Target(f"ftjit.jit / jax.jit, one function, at {n} thread{'s' if n > 1 else ''}",
                   ratio(ours_one.shown_rate(str(n)), theirs_one.shown_rate(str(n))), minimum, applies, reason)
            for n, minimum in wanted if n in counts]


def _thread_targets(measured: Sequence[tuple[Scaling, ...]], n: int) -> list[Target]:
    """--threads' targets, at the largest count n: set on a free-threaded build with n cores or more (a GIL
    build runs one thread at a time; fewer cores than threads measure the machine, not ftjit)."""
    if len(measured) == 1:  # --no-jax: both targets are about jax Arrays
        return []
    cpus = os.cpu_count() or 1
    applies = FREE_THREADED and cpus >= n
    reason = ("the targets are set for the free-threaded build; on a GIL build threads take turns"
              if not FREE_THREADED else
              f"{n} threads need {n} cores and this machine has {cpus}: measure on one with as many cores")
    (array, _), (ours, theirs), (ours_one, theirs_one) = measured[1], measured[2], measured[3]
    key, one = str(n), "1"
    ceiling = []
    if len(measured) > 4:  # jaxlib alone: how much of the gap to jax.jit is ftjit's, and how much jaxlib's
        own_calls, _ = measured[4]
        why = "jaxlib's ceiling, reported: ftjit.jit's executables are these calls, one per thread"
        ceiling = [
            Target(f"jaxlib's call per thread / jax.jit, one function, at {n} threads",
                   ratio(own_calls.shown_rate(key), theirs_one.shown_rate(key)), 1.25, False, why),
            Target(f"ftjit.jit, one function / jaxlib's call per thread, at {n} threads",
                   ratio(ours_one.shown_rate(key), own_calls.shown_rate(key)), 1.0, False, why),
            Target("ftjit.jit / jaxlib's call per thread, 1 thread",
                   ratio(ours.shown_rate(one), own_calls.shown_rate(one)), 1.0, False, why),
        ]
    return [
        Target(f"ftjit core, jax Array: {n} threads / 1 thread", array.shown_scaling(key), 1.0, applies, reason),
        Target(f"ftjit.jit / jax.jit throughput, 1 thread", ratio(ours.shown_rate(one), theirs.shown_rate(one)), 0.97,
               applies, reason),
        Target(f"ftjit.jit / jax.jit throughput at {n} threads, a function each",
               ratio(ours.shown_rate(key), theirs.shown_rate(key)), 1.3, applies, reason),
        Target(f"ftjit.jit / jax.jit throughput at {n} threads, one function",
               ratio(ours_one.shown_rate(key), theirs_one.shown_rate(key)), 1.25, applies, reason),
        Target(f"ftjit.jit's {n}/1 speed-up, one function / a function each",
               ratio(ours_one.shown_scaling(key), ours.shown_scaling(key)), 0.9, applies, reason),
        *ceiling,
    ]
