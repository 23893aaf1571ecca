"""Interleaved timing: both sides of every case are timed back to back, in alternating order.

Each side's ns/call is the median of its timings, less timeit's own loop
overhead, and the ratio is ftjit's median over the anchor's: every number
the table prints is one of these, so each ratio can be checked from the two
times beside it. Host noise that slows a stretch of the run hits both sides
alike (the pairs are adjacent), and slow rows are split into many short
pairs (``Case.splits``) for the same reason.

Rows are timed in a worker thread (where serving code calls from) and, for
comparison, in the main thread: see ``measure(thread=...)``.
"""

from __future__ import annotations

import dataclasses
import gc
import statistics
import threading
import timeit
from typing import Any, Callable, Optional, Sequence

from .cases import Case, Side


@dataclasses.dataclass(frozen=True)
class Measurement:
    """Median ns/call of both sides of one case, plus every timing."""

    case: Case
    ftjit_ns: float
    anchor_ns: float
    ftjit_samples_ns: tuple[float, ...]
    anchor_samples_ns: tuple[float, ...]
    thread: str = "worker"  #: where it was timed: "worker" or "main"

    @property
    def ratio(self) -> float:
        """ftjit_ns / anchor_ns (both printed beside it)."""
        return self.ftjit_ns / self.anchor_ns

    @property
    def passed(self) -> bool:
        """Met the target (True for a row without one: it cannot miss)."""
        return self.case.target is None or self.ratio <= self.case.target

    @property
    def status(self) -> str:
        if self.case.target is None:
            return "report"
        return "PASS" if self.passed else "MISS"


def _timer(side: Side) -> timeit.Timer:
    stmt, namespace = side.statement()
    side.fn(*side.args)  # warm up: the ftjit side compiles its one signature here
    return timeit.Timer(stmt, globals=namespace)


def _ns_per_call(timer: timeit.Timer, number: int) -> float:
    return timer.timeit(number) / number * 1e9


def in_thread(thread: str, fn: Callable[[], Any]) -> Any:
    """fn() in a fresh worker thread (``thread="worker"``) or right here (``"main"``); re-raises its error."""
    if thread == "main":
        return fn()
    if thread != "worker":
        raise ValueError(f"thread must be 'worker' or 'main', got {thread!r}")
    out: list[Any] = []
    err: list[BaseException] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as e:  # re-raised below
            err.append(e)

    t = threading.Thread(target=run, name="bench-worker")
    t.start()
    t.join()
    if err:
        raise err[0]
    return out[0]


def measure(cases: Sequence[Case], number: int, repeat: int,
            on_repeat: Optional[Callable[[int, int], None]] = None, overhead_ns: float = 0.0,
            make_timer: Callable[[Side], Any] = _timer,
            time_calls: Callable[[Any, int], float] = _ns_per_call, thread: str = "worker") -> list[Measurement]:
    """Times every case ``repeat`` times (each time as ``case.splits`` pairs of
    ``number * case.scale / splits`` calls per side), alternating which side
    goes first, with the GC off while timing, in a worker thread or the main
    thread (``thread``). ``overhead_ns`` (timeit's loop, see loop_overhead_ns)
    is taken out of the reported times. ``make_timer``/``time_calls`` are the
    timing itself (tests replace them)."""

    def run() -> list[tuple[list[float], list[float]]]:
        timers = [(make_timer(c.ftjit), make_timer(c.anchor)) for c in cases]
        samples: list[tuple[list[float], list[float]]] = [([], []) for _ in cases]
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            for r in range(repeat):
                for case, (ft, an), (ft_s, an_s) in zip(cases, timers, samples):
                    splits = max(1, case.splits)
                    n = max(1, int(number * case.scale / splits))
                    for s in range(splits):
                        order = ((ft, ft_s), (an, an_s)) if (r * splits + s) % 2 == 0 else ((an, an_s), (ft, ft_s))
                        for timer, out in order:
                            out.append(time_calls(timer, n))
                if on_repeat is not None:
                    on_repeat(r + 1, repeat)
        finally:
            if gc_was_enabled:
                gc.enable()
        return samples

    out = []
    for c, (ft_s, an_s) in zip(cases, in_thread(thread, run)):
        ft_net = tuple(max(t - overhead_ns, 1e-3) for t in ft_s)
        an_net = tuple(max(t - overhead_ns, 1e-3) for t in an_s)
        out.append(Measurement(c, statistics.median(ft_net), statistics.median(an_net), ft_net, an_net, thread))
    return out


def loop_overhead_ns(number: int, repeat: int) -> float:
    """ns per iteration of timeit's own loop (included in every number above, on both sides)."""
    return min(timeit.repeat("pass", number=number, repeat=repeat)) / number * 1e9
