"""Bench output: the fixed-width results table on stdout and the JSON results file."""

from __future__ import annotations

import json
import platform
import sys
from typing import Any, Sequence

from .timing import Measurement

_HEADER = ("case", "ftjit /call", "anchor", "anchor /call", "ratio", "target", "goal", "status")
_LEFT_ALIGNED = {0, 2, 7}


def format_time(ns: float, unit: str) -> str:
    """A per-call time stored in ns, shown in the row's unit ("ns" or "ms")."""
    if unit == "ms":
        return f"{ns / 1e6:.1f} ms"
    return f"{ns:.1f} ns"


def _bound(value: float | None) -> str:
    return "-" if value is None else f"<= {value:.3g}"


def _row(m: Measurement, footnote: str) -> tuple[str, ...]:
    return (
        m.case.name + footnote,
        format_time(m.ftjit_ns, m.case.unit),
        m.case.anchor.label,
        format_time(m.anchor_ns, m.case.unit),
        f"{m.ratio:.3f}x",
        _bound(m.case.target),
        _bound(m.case.goal),
        m.status,
    )


def format_table(measurements: Sequence[Measurement]) -> str:
    """The table, then numbered notes for the rows that have one, then a MISS summary line if any.

    ratio = ftjit/anchor (lower is better); rows without a target show "-" and status "report".
    """
    notes: list[str] = []
    rows = [_HEADER]
    for m in measurements:
        footnote = ""
        if m.case.note:
            notes.append(m.case.note)
            footnote = f" [{len(notes)}]"
        rows.append(_row(m, footnote))
    widths = [max(len(row[i]) for row in rows) for i in range(len(_HEADER))]

    def line(row: tuple[str, ...]) -> str:
        cells = [c.ljust(w) if i in _LEFT_ALIGNED else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))]
        return "  ".join(cells).rstrip()

    out = [line(rows[0]), "  ".join("-" * w for w in widths)] + [line(r) for r in rows[1:]]
    out += [f"[{i}] {note}" for i, note in enumerate(notes, 1)]
    misses = [m.case.name for m in measurements if not m.passed]
    if misses:
        out.append(f"MISS: {len(misses)} case(s) slower than target: {', '.join(misses)}")
    return "\n".join(out)


def to_json(measurements: Sequence[Measurement], meta: dict[str, Any]) -> dict[str, Any]:
    return {
        "meta": {"python": sys.version, "platform": platform.platform(), **meta},
        "results": [
            {
                "case": m.case.name,
                "ftjit": m.case.ftjit.label,
                "ftjit_ns": m.ftjit_ns,
                "anchor": m.case.anchor.label,
                "anchor_ns": m.anchor_ns,
                "ratio": m.ratio,
                "target": m.case.target,
                "goal": m.case.goal,
                "status": m.status,
                "goal_met": m.goal_met,
                "unit": m.case.unit,
                "note": m.case.note,
                "ftjit_samples_ns": list(m.ftjit_samples_ns),
                "anchor_samples_ns": list(m.anchor_samples_ns),
                "paired_ratios": list(m.paired_ratios),
            }
            for m in measurements
        ],
    }


def write_json(path: str, measurements: Sequence[Measurement], meta: dict[str, Any]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(to_json(measurements, meta), f, indent=2)
        f.write("\n")
