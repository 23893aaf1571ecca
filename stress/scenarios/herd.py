"""Scenario "herd": many threads released at once onto each new signature; exactly one compile per signature."""

from __future__ import annotations

import array
import dataclasses
import gc
import random
import threading
import time
import weakref
from typing import Any, Callable, Optional

import numpy as np

import ftjit

from ..registry import Context, Result, register

DEFAULT_THREADS = 64
ROUNDS_QUICK = 30
ROUNDS_FULL = 150
HITS_PER_ROUND = 4  #: calls each thread makes after the herd call, on the now-compiled signature
COMPILE_SLEEP_S = (0.020, 0.050)  #: the compiler sleeps this long to widen the race window
_POLL_S = 0.1
_FAILURES_SHOWN = 5


def target(x: Any, k: int) -> Any:
    """The jitted function; ``k`` is static. Exact for the small integers the threads pass."""
    return x * 2 + k


@dataclasses.dataclass(frozen=True)
class Signature:
    """One round's fresh call signature: an array dtype/shape, or a Python float with a new static ``k``."""

    kind: str  #: "shape", "dtype" (same shape as an earlier round, other dtype) or "static"
    k: int
    shape: tuple[int, ...] = ()
    dtype: str = ""

    def argument(self, value: int) -> Any:
        if self.kind == "static":
            return float(value)
        return np.full(self.shape, value, dtype=self.dtype)

    @property
    def own_key(self) -> tuple[Any, ...]:
        return signature_key(self.argument(0), self.k)

    def check(self, value: int, out: Any) -> Optional[str]:
        """None when ``out`` is target(argument(value), k); else what is wrong with it."""
        expected = target(self.argument(value), self.k)
        if self.kind == "static":
            ok = type(out) is float and out == expected
        else:
            ok = isinstance(out, np.ndarray) and out.dtype == expected.dtype and np.array_equal(out, expected)
        return None if ok else f"got {out!r}, expected {expected!r}"


def signature_key(x: Any, k: Any) -> tuple[Any, ...]:
    """The signature a call with these arguments belongs to, as the compiler sees it."""
    if isinstance(x, np.ndarray):
        return ("array", str(x.dtype), x.shape, k)
    return ("scalar", type(x).__name__, k)


def make_signatures(rng: random.Random, rounds: int) -> list[Signature]:
    """``rounds`` distinct signatures cycling shape -> dtype -> static, drawn from ``rng``."""
    sizes = rng.sample(range(1, 512), rounds)
    statics = rng.sample(range(1, 1_000_000), rounds)
    signatures: list[Signature] = []
    last_shape: tuple[int, ...] = (1,)
    for i in range(rounds):
        kind = ("shape", "dtype", "static")[i % 3]
        if kind == "shape":
            last_shape = (sizes[i],) if rng.random() < 0.5 else (2, sizes[i])
            signatures.append(Signature("shape", k=0, shape=last_shape, dtype="float32"))
        elif kind == "dtype":
            signatures.append(Signature("dtype", k=0, shape=last_shape, dtype="float64"))
        else:
            signatures.append(Signature("static", k=statics[i]))
    assert len({s.own_key for s in signatures}) == rounds, "signatures must be distinct"
    return signatures


class CountingCompiler:
    """Counts compiles per signature key and sleeps a seeded 20-50 ms in each."""

    def __init__(self, rng: random.Random) -> None:
        self._lock = threading.Lock()
        self._rng = rng
        self.per_key: dict[tuple[Any, ...], int] = {}
        self.bad_calls: list[str] = []

    @property
    def calls(self) -> int:
        with self._lock:
            return sum(self.per_key.values())

    def __call__(self, fun: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Callable[..., Any]:
        with self._lock:
            if len(args) != 2 or kwargs:
                self.bad_calls.append(f"compiler got args={args!r} kwargs={kwargs!r}")
            key = signature_key(*args[:2]) if len(args) >= 2 else ("malformed call",)
            self.per_key[key] = self.per_key.get(key, 0) + 1
            delay = self._rng.uniform(*COMPILE_SLEEP_S)
        time.sleep(delay)
        ref = weakref.ref(fun)  # the cache keeps executables alive until fun dies: don't hold fun
        return lambda *a, **k: ref()(*a, **k)  # type: ignore[misc]


@dataclasses.dataclass
class WorkerLog:
    """What one thread saw: its latencies, its failures, and where it is now (for hang reports)."""

    latencies_ns: list[int] = dataclasses.field(default_factory=list)
    failures: list[str] = dataclasses.field(default_factory=list)
    calls: int = 0
    round: int = -1
    phase: str = "starting"
    broken_barrier: bool = False


class Herd:
    """One run of the scenario: the shared jitted function, the barrier and the worker threads."""

    def __init__(self, ctx: Context) -> None:
        rng = random.Random(ctx.seed)
        self.ctx = ctx
        self.nthreads = ctx.thread_count(DEFAULT_THREADS)
        self.signatures = make_signatures(rng, ctx.size(ROUNDS_QUICK, ROUNDS_FULL))
        self.compiler = CountingCompiler(rng)
        self.cache = ftjit.FunctionCache(capacity=4 * len(self.signatures) + 16)
        self.fun = _fresh_target()
        self.jf = ftjit.jit(self.fun, static_argnums=1, compiler=self.compiler, cache=self.cache)
        self.logs = [WorkerLog() for _ in range(self.nthreads)]
        self.rounds_started = 0
        self.barrier = threading.Barrier(self.nthreads, action=self._on_round)
        self.threads = [
            threading.Thread(target=self._work, args=(i,), name=f"herd-{i}", daemon=True) for i in range(self.nthreads)
        ]

    def _on_round(self) -> None:
        """Barrier action: every thread finished the previous round."""
        self.ctx.progress(self.rounds_started, len(self.signatures))
        self.rounds_started += 1

    def _work(self, index: int) -> None:
        log = self.logs[index]
        try:
            self._rounds(index, log)
        except BaseException as exc:  # noqa: BLE001  (a thread dying is a finding; the others must not wait for it)
            log.failures.append(f"thread {index} died in round {log.round} ({log.phase}): {type(exc).__name__}: {exc}")
            log.phase = "died"
            self.barrier.abort()

    def _rounds(self, index: int, log: WorkerLog) -> None:
        for rnd, sig in enumerate(self.signatures):
            if not self._wait(log, rnd, "barrier"):
                return
            x = sig.argument(index)
            for call in range(1 + HITS_PER_ROUND):
                log.phase = "herd call" if call == 0 else "hit call"
                self._call(log, rnd, sig, index, x)
        self._wait(log, len(self.signatures), "final barrier")
        log.phase = "done"

    def _wait(self, log: WorkerLog, rnd: int, phase: str) -> bool:
        log.round, log.phase = rnd, phase
        try:
            self.barrier.wait(timeout=self.ctx.wait_timeout)
            return True
        except threading.BrokenBarrierError:
            log.broken_barrier = True
            return False

    def _call(self, log: WorkerLog, rnd: int, sig: Signature, index: int, x: Any) -> None:
        start = time.perf_counter_ns()
        try:
            out = self.jf(x, sig.k)
            problem = None
        except Exception as exc:  # noqa: BLE001  (every exception is a finding)
            out, problem = None, f"raised {type(exc).__name__}: {exc}"
        log.latencies_ns.append(time.perf_counter_ns() - start)
        log.calls += 1
        problem = problem or sig.check(index, out)
        if problem:
            log.failures.append(f"round {rnd} ({sig.kind}) thread {index}: {problem}")

    def run(self) -> list[str]:
        """Starts the threads and joins them; returns why the run was cut short (empty: it was not).

        No timeout here: a round that stops making progress is the watchdog's to report (every stack, exit 3).
        """
        for thread in self.threads:
            thread.start()
        while any(t.is_alive() for t in self.threads):
            for thread in self.threads:
                thread.join(_POLL_S)
        died = [self.threads[i].name for i, log in enumerate(self.logs) if log.phase == "died"]
        if died:
            return [f"run cut short: {len(died)} thread(s) died and the barrier was aborted: {', '.join(died[:8])}"]
        return []


def summarize_failures(failures: list[str]) -> list[str]:
    """The first few failed calls verbatim, then a count of the rest."""
    lines = failures[:_FAILURES_SHOWN]
    if len(failures) > len(lines):
        lines.append(f"... {len(failures) - len(lines)} more failed calls ({len(failures)} in all)")
    return lines


def _fresh_target() -> Callable[..., Any]:
    """A new function object per run, so its cache entries and lifetime are this run's alone."""

    def herd_target(x: Any, k: int) -> Any:
        return target(x, k)

    return herd_target


def _check_invariants(herd: Herd, aborted: list[str]) -> list[str]:
    violations = list(aborted)
    n = len(herd.signatures)
    info = herd.jf.cache_info()
    calls = sum(log.calls for log in herd.logs)
    expected_keys = {s.own_key for s in herd.signatures}
    dup = {k: c for k, c in herd.compiler.per_key.items() if c != 1}
    if herd.compiler.calls != n:
        violations.append(f"compiler called {herd.compiler.calls} times for {n} distinct signatures")
    if dup:
        violations.append(f"signatures compiled more than once: {dup}")
    if set(herd.compiler.per_key) - expected_keys:
        violations.append(f"compiler saw unexpected signatures: {set(herd.compiler.per_key) - expected_keys}")
    violations.extend(herd.compiler.bad_calls)
    for field, want in (("compiles", n), ("misses", n), ("failures", 0), ("size", n), ("evictions", 0)):
        if getattr(info, field) != want:
            violations.append(f"cache_info().{field} == {getattr(info, field)}, expected {want}")
    if not aborted and info.hits + info.misses + info.waits != calls:
        violations.append(f"hits+misses+waits == {info.hits + info.misses + info.waits} != {calls} calls made")
    violations.extend(summarize_failures([f for log in herd.logs for f in log.failures]))
    if not aborted and any(log.broken_barrier for log in herd.logs):
        violations.append(f"barrier broke although no thread died (a round took longer than "
                          f"{herd.ctx.wait_timeout:g}s without the watchdog firing)")
    return violations


def _check_release(herd: Herd) -> list[str]:
    """Dropping the jitted function must free the user function (executables hold it weakly)."""
    fun_ref = weakref.ref(herd.fun)
    del herd.fun, herd.jf
    gc.collect()
    return [] if fun_ref() is None else ["function still alive after its jitted wrapper was dropped"]


@register("herd", "threads released together by a barrier onto each new signature; one compile each")
def run_herd(ctx: Context) -> Result:
    herd = Herd(ctx)
    aborted = herd.run()
    violations = _check_invariants(herd, aborted)
    info = herd.jf.cache_info()
    if not aborted:
        violations.extend(_check_release(herd))
    return Result(
        scenario="herd",
        threads=herd.nthreads,
        calls=sum(log.calls for log in herd.logs),
        compiles=herd.compiler.calls,
        waits=info.waits,
        errors=sum(len(log.failures) for log in herd.logs),
        latencies_ns=array.array("q", (ns for log in herd.logs for ns in log.latencies_ns)),
        violations=violations,
    )
