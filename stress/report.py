"""Summary table and final pass/fail line printed on stdout after the scenarios ran."""

from __future__ import annotations

import math
from typing import Sequence, TextIO

from .registry import Result

_MAX_VIOLATIONS_SHOWN = 20
_COLUMNS = ("scenario", "threads", "calls", "compiles", "waits", "errors", "p50 µs", "p99 µs", "verdict")


def _fmt_us(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.1f}"


def _row(result: Result) -> tuple[str, ...]:
    name = result.scenario if result.runs == 1 else f"{result.scenario} x{result.runs}"
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


def print_summary(results: Sequence[Result], stream: TextIO) -> None:
    print(format_table(results), file=stream)
    notes = format_notes(results)
    if notes:
        print(notes, file=stream)
    violations = format_violations(results)
    if violations:
        print(violations, file=stream)
    passed = sum(r.passed for r in results)
    print(f"stress: {passed} passed, {len(results) - passed} failed", file=stream)
