"""Interleaved timing: both sides of every case are timed in each repeat, and the best repeat per side is kept."""

from __future__ import annotations

import dataclasses
import gc
import timeit
from typing import Callable, Optional, Sequence

from .cases import Case, Side


@dataclasses.dataclass(frozen=True)
class Measurement:
    """Best-of-repeats ns/call of both sides of one case, plus every repeat's value."""

    case: Case
    ftjit_ns: float
    anchor_ns: float
    ftjit_samples_ns: tuple[float, ...]
    anchor_samples_ns: tuple[float, ...]

    @property
    def ratio(self) -> float:
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
            on_repeat: Optional[Callable[[int, int], None]] = None) -> list[Measurement]:
    """Times every case ``repeat`` times, alternating which side goes first, with the GC off while timing."""
    timers = [(_timer(c.ftjit), _timer(c.anchor)) for c in cases]
    samples: list[tuple[list[float], list[float]]] = [([], []) for _ in cases]
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for r in range(repeat):
            for case, (ft, an), (ft_s, an_s) in zip(cases, timers, samples):
                order = ((ft, ft_s), (an, an_s)) if r % 2 == 0 else ((an, an_s), (ft, ft_s))
                n = max(1, int(number * case.scale))
                for timer, out in order:
                    out.append(_ns_per_call(timer, n))
            if on_repeat is not None:
                on_repeat(r + 1, repeat)
    finally:
        if gc_was_enabled:
            gc.enable()
    return [Measurement(c, min(ft_s), min(an_s), tuple(ft_s), tuple(an_s)) for c, (ft_s, an_s) in zip(cases, samples)]


def loop_overhead_ns(number: int, repeat: int) -> float:
    """ns per iteration of timeit's own loop (included in every number above, on both sides)."""
    return min(timeit.repeat("pass", number=number, repeat=repeat)) / number * 1e9
