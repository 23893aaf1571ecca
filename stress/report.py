"""Summary table and final pass/fail line printed on stdout after the scenarios ran."""

from __future__ import annotations

import math
import sys
from typing import Optional, Sequence, TextIO

from .registry import Result

_MAX_VIOLATIONS_SHOWN = 20
_COLUMNS = ("scenario", "threads", "calls", "compiles", "waits", "errors", "p50 µs", "p99 µs", "verdict")


def _fmt_us(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.1f}"


def _row(result: Result) -> tuple[str, ...]:
    name = result.scenario if result.runs == 1 else f"{result.scenario} x{result.runs}"
    if result.stalled:  # the watchdog ended the run inside this scenario: it has no counters to show
        return (name, str(result.threads) if result.threads else "-", "-", "-", "-", "-", "-", "-", result.verdict)
    return (
        name,
        str(result.threads),
        str(result.calls),
        str(result.compiles),
        str(result.waits),
        str(result.errors),
        _fmt_us(result.p50_us),
        _fmt_us(result.p99_us),
        result.verdict,
    )


def format_table(results: Sequence[Result]) -> str:
    """A fixed-width table: first column left-aligned, numbers right-aligned."""
    rows = [_COLUMNS] + [_row(r) for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]

    def line(row: tuple[str, ...]) -> str:
        cells = [row[0].ljust(widths[0])] + [cell.rjust(w) for cell, w in zip(row[1:], widths[1:])]
        return "  ".join(cells).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(rows[0]), rule] + [line(row) for row in rows[1:]])


def format_violations(results: Sequence[Result]) -> str:
    """Every violated invariant, grouped by scenario; empty when all passed."""
    lines: list[str] = []
    for result in results:
        shown = result.violations[:_MAX_VIOLATIONS_SHOWN]
        lines.extend(f"  {result.scenario}: {violation}" for violation in shown)
        hidden = len(result.violations) - len(shown)
        if hidden:
            lines.append(f"  {result.scenario}: ... and {hidden} more")
    return "violated invariants:\n" + "\n".join(lines) if lines else ""


def format_notes(results: Sequence[Result]) -> str:
    """Each scenario's measurements (e.g. RSS), one line each; empty when there are none."""
    lines = [f"  {result.scenario}: {note}" for result in results for note in result.notes[:_MAX_VIOLATIONS_SHOWN]]
    return "notes:\n" + "\n".join(lines) if lines else ""


def gil_state_line() -> str:
    """Whether the GIL is on now, after the scenarios ran (CI asserts it stays off on a free-threaded build)."""
    is_enabled = getattr(sys, "_is_gil_enabled", None)
    if is_enabled is None:
        return f"stress: sys._is_gil_enabled() n/a (Python {sys.version_info.major}.{sys.version_info.minor})"
    return f"stress: sys._is_gil_enabled() == {is_enabled()}"


def print_summary(results: Sequence[Result], stream: TextIO, total_seconds: Optional[float] = None,
                  budget_seconds: Optional[float] = None) -> bool:
    """The table, notes, violations, totals and GIL state; returns False when the run exceeded its time budget."""
    print(format_table(results), file=stream)
    notes = format_notes(results)
    if notes:
        print(notes, file=stream)
    violations = format_violations(results)
    if violations:
        print(violations, file=stream)
    passed = sum(r.passed for r in results)
    stalled = [r.scenario for r in results if r.stalled]
    within = True
    if total_seconds is not None:
        budget = "" if budget_seconds is None else f" (budget {budget_seconds:g} s)"
        print(f"stress: total wall time {total_seconds:.1f} s{budget}", file=stream)
        if budget_seconds is not None and total_seconds > budget_seconds:
            within = False
            print(f"stress: FAIL: the run took {total_seconds:.1f} s, over its {budget_seconds:g} s budget "
                  f"(a slowdown, or a machine too busy for it)", file=stream)
    print(gil_state_line(), file=stream)
    stall = f", {len(stalled)} stalled ({', '.join(stalled)})" if stalled else ""
    print(f"stress: {passed} passed, {len(results) - passed - len(stalled)} failed{stall}", file=stream)
    return within
