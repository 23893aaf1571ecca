"""Scenario "failing_compiles": compiles fail at random under herds; every waiter sees the error, later calls recover."""

from __future__ import annotations

import random
import threading
import time
from typing import Any, Callable, Hashable, Optional

import ftjit

from ..registry import Context, Result, register
from ._calls import ARG_SPECS, ArgSpec, TrackingCompiler, mismatch, signature_key
from ._pool import Pool, WorkerLog

DEFAULT_THREADS = 32
ROUNDS_QUICK = 60
ROUNDS_FULL = 300
FAIL_P = 0.3
SIGNATURES = [(spec, k) for spec in ARG_SPECS for k in (1, 2, 3)]
RECOVERY_TRIES = 100  #: single-threaded calls per signature until its compile succeeds (0.3**100: never)
HERD_WAIT_S = 2.0  #: a failing compile stays open until the whole herd waits on it, at most this long


class InjectedError(Exception):
    """A compile failure of this scenario's own type."""


FAILURE_TYPES: tuple[type[Exception], ...] = (InjectedError, ValueError, RuntimeError, ArithmeticError)


def failing_target(x: Any, k: int) -> Any:
    return x * k + 5


Outcome = Optional[tuple[str, str]]  #: None: the right result; else (exception type name, message)


class Failing:
    """One run: the herd rounds, what each thread got, and what each round's compiles did."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.nthreads = ctx.thread_count(DEFAULT_THREADS)
        rng = random.Random(ctx.seed)
        nrounds = ctx.size(ROUNDS_QUICK, ROUNDS_FULL)
        self.rounds: list[tuple[ArgSpec, int]] = [rng.choice(SIGNATURES) for _ in range(nrounds)]
        self.fail_rng = random.Random(rng.getrandbits(32))
        self.compiler = TrackingCompiler(_key_of, rng, hook=self._maybe_fail)
        self.jf = ftjit.jit(failing_target, static_argnums=1, compiler=self.compiler,
                            cache=ftjit.FunctionCache(capacity=64))
        self.outcomes: list[list[Outcome]] = [[None] * self.nthreads for _ in self.rounds]
        self.raised: dict[int, list[tuple[str, str]]] = {}  #: round -> what its failing compiles raised
        self.compiles_in: list[int] = []  #: compiler calls per round, closed by the barrier action
        self.compiled_before: list[bool] = []  #: whether a round's signature had compiled in an earlier round
        self.succeeded: set[tuple[ArgSpec, int]] = set()
        self.current = -1
        self.round_calls0 = 0
        self.round_waits0 = 0
        self.pool = Pool(ctx, "failing_compiles", nrounds)
        self.barrier = threading.Barrier(self.nthreads, action=self._next_round)
        self.pool.barriers.append(self.barrier)

    def _next_round(self) -> None:
        """Barrier action (all threads between rounds): closes the last round's books, opens the next."""
        calls = self.compiler.calls
        if self.current >= 0:
            self.compiles_in.append(calls - self.round_calls0)
            if not self.raised.get(self.current) and self.compiles_in[-1] >= 1:
                self.succeeded.add(self.rounds[self.current])
            self.pool.step()
        self.current += 1
        if self.current < len(self.rounds):
            self.compiled_before.append(self.rounds[self.current] in self.succeeded)
        self.round_calls0, self.round_waits0 = calls, self.jf.cache_info().waits

    def _maybe_fail(self, fun: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], key: Hashable) -> None:
        """Compiler hook: holds the compile until the herd waits on it, then fails with probability FAIL_P."""
        rnd = self.current
        if 0 <= rnd < len(self.rounds):
            deadline = time.monotonic() + HERD_WAIT_S
            while self.jf.cache_info().waits - self.round_waits0 < self.nthreads - 1 and time.monotonic() < deadline:
                time.sleep(0.001)
        # The draw is always made (the sequence stays the seed's); the first
        # compile of the first round always fails, so every run tests a failure.
        if self.fail_rng.random() >= FAIL_P and (self.raised or rnd != 0):
            return
        error_type = self.fail_rng.choice(FAILURE_TYPES)
        message = f"injected compile failure of {key} in round {rnd}"
        self.raised.setdefault(rnd, []).append((error_type.__name__, message))
        raise error_type(message)

    def work(self, index: int, log: WorkerLog) -> None:
        for rnd, (spec, k) in enumerate(self.rounds):
            log.round, log.phase = rnd, "barrier"
            try:
                self.barrier.wait(self.ctx.wait_timeout)
            except threading.BrokenBarrierError:
                return
            x = spec.make(index)
            log.phase = "herd call"
            out, exc = log.timed(self.jf, x, k)
            if exc is not None:
                log.errors += 1
                self.outcomes[rnd][index] = (type(exc).__name__, str(exc))
            else:
                problem = mismatch(out, failing_target(x, k))
                self.outcomes[rnd][index] = ("wrong result", problem) if problem else None
        log.phase = "final barrier"
        try:
            self.barrier.wait(self.ctx.wait_timeout)
        except threading.BrokenBarrierError:
            pass


def _key_of(fun: Callable[..., Any], args: tuple[Any, ...]) -> Hashable:
    return signature_key(*args)


def check_rounds(run: Failing) -> list[str]:
    """Per round: one compile exactly when the signature was not compiled yet; all threads saw the same thing."""
    out = []
    for rnd, (spec, k) in enumerate(run.rounds[:len(run.compiles_in)]):
        want = 0 if run.compiled_before[rnd] else 1
        if run.compiles_in[rnd] != want:
            out.append(f"round {rnd} ({spec} k={k}): {run.compiles_in[rnd]} compiler calls for a herd of "
                       f"{run.nthreads}, expected {want}")
        raised = run.raised.get(rnd, [])
        expected: list[Outcome] = [raised[0] if raised else None] * run.nthreads
        if run.outcomes[rnd] != expected:
            wrong = [(i, o) for i, o in enumerate(run.outcomes[rnd]) if o != expected[0]]
            out.append(f"round {rnd}: compile raised {raised or 'nothing'}, but threads got {wrong[:3]} "
                       f"({len(wrong)} of {run.nthreads} differ)")
    return out


def check_recovery(run: Failing) -> list[str]:
    """Single-threaded: retrying each signature eventually compiles it; then every signature hits, correctly."""
    out = []
    for spec, k in SIGNATURES:
        for _ in range(RECOVERY_TRIES):
            try:
                problem = mismatch(run.jf(spec.make(7), k), failing_target(spec.make(7), k))
                if problem:
                    out.append(f"recovered {spec} k={k}: {problem}")
                break
            except FAILURE_TYPES:
                continue
        else:
            out.append(f"{spec} k={k} never compiled in {RECOVERY_TRIES} tries")
    info = run.jf.cache_info()
    failed = sum(len(v) for v in run.raised.values())
    want = (len(SIGNATURES), failed, run.compiler.calls, len(SIGNATURES))
    got = (info.compiles, info.failures, info.misses, info.size)
    if got != want:
        out.append(f"after recovery (compiles, failures, misses, size) == {got}, expected {want}")
    return out


@register("failing_compiles", "compiles fail at random under herds: all waiters see the error, no storms, recovery")
def run_failing_compiles(ctx: Context) -> Result:
    run = Failing(ctx)
    aborted = run.pool.run([run.work] * run.nthreads)
    violations = list(aborted)
    failed = sum(len(v) for v in run.raised.values())
    if not aborted:
        violations += check_rounds(run)[:10] + check_recovery(run)
        if failed == 0:
            violations.append("no compile failed: the scenario tested nothing")
    notes = [f"{failed} of {run.compiler.calls} compiles failed; {len(run.rounds)} herd rounds, "
             f"{sum(1 for b in run.compiled_before if not b)} of them compiling"]
    return run.pool.result(run.compiler.calls, run.jf.cache_info().waits, violations, notes)
