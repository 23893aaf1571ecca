"""Scenario "recursion": same-thread compile recursion and cross-thread compile cycles end in RecursionError, never a hang."""

from __future__ import annotations

import collections
import dataclasses
import random
import threading
import time
from typing import Any, Callable, Hashable

import ftjit

from ..registry import Context, Result, register
from ._calls import ARG_SPECS, TrackingCompiler, mismatch, signature_key
from ._pool import Pool, WorkerLog

DEFAULT_THREADS = 32  #: half recurse on their own, half form pairs whose compiles wait on each other
SELF_CALLS_QUICK = 40
SELF_CALLS_FULL = 200
PAIR_ROUNDS_QUICK = 25
PAIR_ROUNDS_FULL = 100
SELF_GROUPS = 4  #: threads of one group share signatures, so some calls wait on a recursing compile
CYCLE_BOUND_S = 3.0  #: a cycle must end in an error within this
SELF_COMPILE_SLEEP_S = (0.0, 0.003)  #: the recursing compile stays open a little: group members wait on it


def self_target(x: Any, k: int) -> Any:
    return x + k


def f_target(x: Any) -> Any:
    return x * 2 + 1


def g_target(x: Any) -> Any:
    return x * 3 + 2


def _static_key(fun: Callable[..., Any], args: tuple[Any, ...]) -> Hashable:
    return signature_key(*args)


@dataclasses.dataclass
class Pair:
    """Two threads, each compiling one of f and g; each compile waits for the other's, then calls it.

    Every round forms the cycle: both compiles meet on ``compiling`` (so each function's entry is owned by
    its own thread) before either calls the other function. One thread then finds the cycle and raises
    CompileCycleError; the other is waiting on that thread's compile and receives the same error through it.
    """

    index: int
    f: Any = None
    g: Any = None
    start: threading.Barrier = dataclasses.field(default_factory=lambda: threading.Barrier(2))
    compiling: threading.Barrier = dataclasses.field(default_factory=lambda: threading.Barrier(2))
    outcomes: dict[int, list[str]] = dataclasses.field(default_factory=dict)  #: round -> [f thread's, g thread's]
    elapsed: dict[int, list[float]] = dataclasses.field(default_factory=dict)
    met: dict[int, int] = dataclasses.field(default_factory=dict)  #: round -> compiles that passed ``compiling``
    #: round -> per side: "detected" (its cross call found the cycle), "received" (it got the other's error)
    inner: dict[int, list[str]] = dataclasses.field(default_factory=dict)


class Recursion:
    """One run: the self-recursing function and the cycling pairs."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        nthreads = max(4, ctx.thread_count(DEFAULT_THREADS))
        self.npairs = nthreads // 4
        self.nself = nthreads - 2 * self.npairs
        self.self_calls = ctx.size(SELF_CALLS_QUICK, SELF_CALLS_FULL)
        self.pair_rounds = ctx.size(PAIR_ROUNDS_QUICK, PAIR_ROUNDS_FULL)
        rng = random.Random(ctx.seed)
        self.seeds = [rng.getrandbits(32) for _ in range(self.nself)]
        self.lock = threading.Lock()
        self.role = threading.local()
        self.cycles_on = True
        self.inner: collections.Counter[str] = collections.Counter()  #: outcome of each compile's re-entering call
        self.self_compiler = TrackingCompiler(_static_key, rng, SELF_COMPILE_SLEEP_S, hook=self._recurse)
        cache = ftjit.FunctionCache(capacity=4096)
        self.jf = ftjit.jit(self_target, static_argnums=1, compiler=self.self_compiler, cache=cache)
        self.pairs = [self._make_pair(i, cache) for i in range(self.npairs)]
        total = self.nself * self.self_calls + 2 * self.npairs * self.pair_rounds
        self.pool = Pool(ctx, "recursion", total)
        self.pool.barriers.extend(b for p in self.pairs for b in (p.start, p.compiling))

    def _make_pair(self, index: int, cache: Any) -> Pair:
        pair = Pair(index)
        pair.f = ftjit.jit(f_target, compiler=self._cycle_compiler(pair, 0), cache=cache)
        pair.g = ftjit.jit(g_target, compiler=self._cycle_compiler(pair, 1), cache=cache)
        return pair

    def _cycle_compiler(self, pair: Pair, side: int) -> TrackingCompiler:
        own, other = ("f_target", "g_target") if side == 0 else ("g_target", "f_target")

        def hook(fun: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], key: Hashable) -> None:
            if not self.cycles_on:
                return
            rnd = self.role.round
            if self.role.value != (pair.index, side):
                raise RuntimeError(f"pair {pair.index}: thread {self.role.value} compiles side {side}: no cycle")
            pair.compiling.wait(self.ctx.wait_timeout)  # both entries are now owned, one by each thread
            with self.lock:
                pair.met[rnd] = pair.met.get(rnd, 0) + 1
            try:
                (pair.g if side == 0 else pair.f)(*args, **kwargs)
                how = "returned"
            except ftjit.CompileCycleError as exc:
                # The detector's message names the entry it refused to wait on (the other function); the
                # waiter receives a copy of that error, which names the function this thread compiles.
                text = str(exc)
                how = "detected" if f"needs {other}(" in text else "received" if f"needs {own}(" in text else text
                raise
            except Exception as exc:  # noqa: BLE001  (recorded, then propagates into the compile)
                how = f"{type(exc).__name__}: {exc}"
                raise
            finally:
                with self.lock:
                    pair.inner.setdefault(rnd, ["", ""])[side] = how

        return TrackingCompiler(_static_key, random.Random(pair.index), hook=hook)

    def _recurse(self, fun: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], key: Hashable) -> None:
        """Self compiler hook: the same signature again, from inside its own compile."""
        try:
            self.jf(*args, **kwargs)
            outcome = "returned"
        except Exception as exc:  # noqa: BLE001  (any other outcome is counted and fails the run)
            outcome = type(exc).__name__
            if type(exc) is ftjit.RecursiveCompileError:
                with self.lock:
                    self.inner[outcome] += 1
                raise
        with self.lock:
            self.inner[outcome] += 1
        raise RuntimeError(f"re-entering the compiling signature {key} {outcome}, not RecursiveCompileError")

    def self_work(self, index: int, log: WorkerLog) -> None:
        rng = random.Random(self.seeds[index])
        for n in range(self.self_calls):
            if self.pool.stop.is_set():
                return
            spec, k = rng.choice(ARG_SPECS), index % SELF_GROUPS
            log.round, log.phase = n, f"self call {spec} k={k}"
            out, exc = log.timed(self.jf, spec.make(n), k)
            if type(exc) is ftjit.RecursiveCompileError:
                log.errors += 1
            else:
                got = f"{type(exc).__name__}: {exc}" if exc else f"returned {out!r}"
                log.failures.append(f"self-recursing thread {index} call {n}: {got}, not RecursiveCompileError")
            self.pool.step()

    def pair_work(self, index: int, log: WorkerLog) -> None:
        pair, side = self.pairs[index // 2], index % 2
        self.role.value = (pair.index, side)
        jf = pair.f if side == 0 else pair.g
        for rnd in range(self.pair_rounds):
            log.round, log.phase = rnd, "pair start barrier"
            self.role.round = rnd
            try:
                pair.start.wait(self.ctx.wait_timeout)
            except threading.BrokenBarrierError:
                log.failures.append(f"pair {pair.index} side {side} round {rnd}: start barrier broke")
                return
            log.phase = f"cycle call ({'f' if side == 0 else 'g'})"
            started = time.monotonic()
            out, exc = log.timed(jf, ARG_SPECS[rnd % len(ARG_SPECS)].make(rnd))
            with self.lock:
                pair.outcomes.setdefault(rnd, ["", ""])[side] = "returned" if exc is None else type(exc).__name__
                pair.elapsed.setdefault(rnd, [0.0, 0.0])[side] = time.monotonic() - started
            if isinstance(exc, RecursionError):
                log.errors += 1
            elif exc is not None:
                log.failures.append(f"pair {pair.index} side {side} round {rnd}: {type(exc).__name__}: {exc}")
            self.pool.step()


def check_pairs(run: Recursion) -> tuple[list[str], collections.Counter[str]]:
    """Each pair-round formed the cycle and ended in CompileCycleError (a RecursionError) in BOTH threads.

    Exactly: both compiles met before the cross calls; one cross call detected the cycle, the other received
    that error through the compile it waited for; both outer calls raised CompileCycleError; in time.
    """
    out: list[str] = []
    tally: collections.Counter[str] = collections.Counter()
    for pair in run.pairs:
        for rnd in range(run.pair_rounds):
            outcome = pair.outcomes.get(rnd, ["missing", "missing"])
            inner = pair.inner.get(rnd, ["missing", "missing"])
            tally["/".join(outcome)] += 1
            if outcome != ["CompileCycleError", "CompileCycleError"]:
                out.append(f"pair {pair.index} round {rnd}: outer calls ended {outcome}, "
                           f"expected CompileCycleError in both threads")
            if pair.met.get(rnd, 0) != 2:
                out.append(f"pair {pair.index} round {rnd}: {pair.met.get(rnd, 0)} compiles met before the "
                           f"cross calls, expected 2 (the cycle did not form)")
            if sorted(inner) != ["detected", "received"]:
                out.append(f"pair {pair.index} round {rnd}: cross calls ended {inner}, expected one "
                           f"'detected' and one 'received'")
            slow = [s for s in pair.elapsed.get(rnd, []) if s > CYCLE_BOUND_S]
            if slow:
                out.append(f"pair {pair.index} round {rnd}: a cycle took {max(slow):.1f}s > {CYCLE_BOUND_S:g}s")
    return out, tally


def check_self(run: Recursion) -> list[str]:
    """Every compile's re-entering call raised RecursiveCompileError; nothing was ever cached."""
    out = []
    info = run.jf.cache_info()
    compiles = run.self_compiler.calls
    if dict(run.inner) != {"RecursiveCompileError": compiles}:
        out.append(f"{compiles} recursing compiles, inner calls ended: {dict(run.inner)}")
    if (info.failures, info.misses, info.compiles, info.size, info.hits) != (compiles, compiles, 0, 0, 0):
        out.append(f"{compiles} compiles that all failed, but {info}")
    return out


def check_recovery(run: Recursion) -> list[str]:
    """Without the cross calls, every pair's functions compile and return the right values."""
    run.cycles_on = False
    out = []
    for pair in run.pairs:
        for jf, target in ((pair.f, f_target), (pair.g, g_target)):
            problem = mismatch(jf(5.0), target(5.0))
            if problem:
                out.append(f"pair {pair.index} after the cycles: {problem}")
    return out


@register("recursion", "same-thread compile recursion and cross-thread compile cycles: RecursionError, no hang")
def run_recursion(ctx: Context) -> Result:
    run = Recursion(ctx)
    workers = [run.self_work] * run.nself + [run.pair_work] * (2 * run.npairs)
    aborted = run.pool.run(_offset(workers, run.nself))
    violations = list(aborted)
    pair_violations, tally = check_pairs(run)
    if not aborted:
        violations += check_self(run) + pair_violations[:10] + check_recovery(run)
    compiles = run.self_compiler.calls + sum(p.f.cache_info().misses + p.g.cache_info().misses for p in run.pairs)
    detectors = collections.Counter("fg"[side] for p in run.pairs for sides in p.inner.values()
                                    for side, how in enumerate(sides) if how == "detected")
    notes = [f"pair outcomes (f thread/g thread): {dict(tally)}; cycle detected by the f/g thread: "
             f"{detectors['f']}/{detectors['g']}",
             f"self-recursing compiles {run.self_compiler.calls}, inner outcomes {dict(run.inner)}"]
    return run.pool.result(compiles, run.jf.cache_info().waits, violations, notes)


def _offset(workers: list[Callable[[int, WorkerLog], None]], nself: int) -> list[Callable[[int, WorkerLog], None]]:
    """Pair workers are indexed from 0 among themselves (thread i of the pool runs pair worker i - nself)."""

    def shifted(fn: Callable[[int, WorkerLog], None]) -> Callable[[int, WorkerLog], None]:
        return lambda index, log: fn(index - nself, log)

    return workers[:nself] + [shifted(fn) for fn in workers[nself:]]
