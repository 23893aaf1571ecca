"""Interleaved, paired timing: both sides of every case are timed back to back, in alternating order.

Each row's ns/call per side is its best timing, less timeit's own loop
overhead. Its ratio is the median over the pairs (one ftjit timing and the
anchor timing next to it) of their ratio: host noise that slows a stretch of
the run hits both members of a pair, so the median of paired ratios is far
steadier than the ratio of two independent minimums (which let one side's
lucky timing decide a PASS or a MISS). Slow rows are split into many short
pairs (``Case.splits``) for the same reason.
"""

from __future__ import annotations

import dataclasses
import gc
import statistics
import timeit
from typing import Any, Callable, Optional, Sequence

from .cases import Case, Side


@dataclasses.dataclass(frozen=True)
class Measurement:
    """Best-of-repeats ns/call of both sides of one case, plus every repeat's value."""

    case: Case
    ftjit_ns: float
    anchor_ns: float
    ftjit_samples_ns: tuple[float, ...]
    anchor_samples_ns: tuple[float, ...]
    #: per pair, ftjit/anchor (loop overhead taken out); empty for rows timed otherwise
    paired_ratios: tuple[float, ...] = ()

    @property
    def ratio(self) -> float:
        """The median paired ratio when there are pairs, else best ftjit / best anchor."""
        if self.paired_ratios:
            return statistics.median(self.paired_ratios)
        return self.ftjit_ns / self.anchor_ns

    @property
    def passed(self) -> bool:
        """Met the target (True for a row without one: it cannot miss)."""
        return self.case.target is None or self.ratio <= self.case.target

    @property
    def goal_met(self) -> Optional[bool]:
        return None if self.case.goal is None else self.ratio <= self.case.goal

    @property
    def status(self) -> str:
        if self.case.target is None:
            return "report"
        if not self.passed:
            return "MISS"
        return "PASS (goal)" if self.goal_met else "PASS"


def _timer(side: Side) -> timeit.Timer:
    stmt, namespace = side.statement()
    side.fn(*side.args)  # warm up: the ftjit side compiles its one signature here
    return timeit.Timer(stmt, globals=namespace)


def _ns_per_call(timer: timeit.Timer, number: int) -> float:
    return timer.timeit(number) / number * 1e9


def measure(cases: Sequence[Case], number: int, repeat: int,
            on_repeat: Optional[Callable[[int, int], None]] = None, overhead_ns: float = 0.0,
            make_timer: Callable[[Side], Any] = _timer,
            time_calls: Callable[[Any, int], float] = _ns_per_call) -> list[Measurement]:
    """Times every case ``repeat`` times (each time as ``case.splits`` pairs of
    ``number * case.scale / splits`` calls per side), alternating which side
    goes first, with the GC off while timing. ``overhead_ns`` (timeit's loop,
    see loop_overhead_ns) is taken out of the reported times and ratios.
    ``make_timer``/``time_calls`` are the timing itself (tests replace them)."""
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
    out = []
    for c, (ft_s, an_s) in zip(cases, samples):
        ft_net = [max(t - overhead_ns, 1e-3) for t in ft_s]
        an_net = [max(t - overhead_ns, 1e-3) for t in an_s]
        pairs = tuple(f / a for f, a in zip(ft_net, an_net))
        out.append(Measurement(c, min(ft_net), min(an_net), tuple(ft_net), tuple(an_net), pairs))
    return out


def loop_overhead_ns(number: int, repeat: int) -> float:
    """ns per iteration of timeit's own loop (included in every number above, on both sides)."""
    return min(timeit.repeat("pass", number=number, repeat=repeat)) / number * 1e9
