"""Bench output: the fixed-width tables on stdout and the JSON results file."""

from __future__ import annotations

import json
import platform
import sys
from typing import Any, Optional, Sequence

from .threads import ScalingResult, shown_rate
from .timing import Measurement

_HEADER = ("case", "thread", "ftjit /call", "anchor", "anchor /call", "ratio", "target", "status")
_LEFT_ALIGNED = {0, 1, 3, 7}


def format_time(ns: float, unit: str) -> str:
    """A per-call time stored in ns, shown in the row's unit ("ns" or "ms")."""
    if unit == "ms":
        return f"{ns / 1e6:.1f} ms"
    return f"{ns:.1f} ns"


def _bound(value: float | None, op: str = "<=") -> str:
    return "-" if value is None else f"{op} {value:.3g}"


def _row(m: Measurement, footnote: str) -> tuple[str, ...]:
    return (
        m.case.name + footnote,
        m.thread,
        format_time(m.ftjit_ns, m.case.unit),
        m.case.anchor.label,
        format_time(m.anchor_ns, m.case.unit),
        f"{m.ratio:.3f}x",
        _bound(m.case.target),
        m.status,
    )


def _grid(rows: Sequence[tuple[str, ...]], left: set[int]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]

    def line(row: tuple[str, ...]) -> str:
        cells = [c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))]
        return "  ".join(cells).rstrip()

    return [line(rows[0]), "  ".join("-" * w for w in widths)] + [line(r) for r in rows[1:]]


def format_table(measurements: Sequence[Measurement]) -> str:
    """The table, then numbered notes for the rows that have one, then a MISS summary line if any.

    ratio = ftjit /call ÷ anchor /call (lower is better); rows without a target show "-" and status "report".
    """
    notes: list[str] = []
    rows = [_HEADER]
    for m in measurements:
        footnote = ""
        if m.case.note:
            if m.case.note not in notes:
                notes.append(m.case.note)
            footnote = f" [{notes.index(m.case.note) + 1}]"
        rows.append(_row(m, footnote))
    out = _grid(rows, _LEFT_ALIGNED)
    out += [f"[{i}] {note}" for i, note in enumerate(notes, 1)]
    misses = [f"{m.case.name} ({m.thread} thread)" for m in measurements if not m.passed]
    if misses:
        out.append(f"MISS: {len(misses)} case(s) slower than target: {', '.join(misses)}")
    return "\n".join(out)


def _rate(r: float) -> str:
    """A rate as the table prints it: rounded by ``shown_rate``, which the targets are computed from."""
    r = shown_rate(r)
    if r >= 1e6:
        return f"{r / 1e6:.3f}M"
    return f"{r / 1e3:.1f}k"


def _ratio_columns(result: ScalingResult) -> list[tuple[str, str]]:
    """(header, config key) of the columns that divide a config's rate by the 1-thread rate."""
    if result.thread_counts is None:
        return [("scaling, one fn", "same"), ("scaling, two fns", "distinct")]
    n = result.thread_counts[-1]
    return [(f"speed-up {n}/1", str(n))]


def format_scaling(result: ScalingResult) -> str:
    """The thread-scaling table (calls/s per config, and scaling against 1 thread), then its targets."""
    configs, ratios = result.configs, _ratio_columns(result)
    rows: list[tuple[str, ...]] = [("side", *(cfg.label for cfg in configs), *(header for header, _ in ratios))]
    for group in result.groups:
        for s in group:
            rows.append((s.label, *(_rate(s.rate(cfg.key)) for cfg in configs),
                         *(f"{s.shown_scaling(key):.2f}x" for _, key in ratios)))
    lb, la = result.load_before, result.load_after
    own = "arguments" if result.thread_counts is None else "function and arguments, released by a barrier"
    out = [f"thread scaling: calls/s, all threads together (median of {result.rounds} interleaved rounds of "
           f"{result.calls} calls per thread; worker threads, each with its own {own}; "
           f"load average {lb[0]:.2f} before, {la[0]:.2f} after)"]
    out += _grid(rows, {0})
    if result.thread_counts is None:
        out.append("scaling = the 2-thread rate / the 1-thread rate, from the rates above")
    else:
        n = result.thread_counts[-1]
        out.append(f"speed-up {n}/1 = the {n}-thread rate / the 1-thread rate, from the rates above")
    if not result.targets:
        return "\n".join(out)
    trows: list[tuple[str, ...]] = [("target", "value", "needs", "status")]
    for t in result.targets:
        trows.append((t.text, f"{t.value:.2f}x", _bound(t.minimum, ">="), t.status))
    out += _grid(trows, {0, 3})
    for reason in dict.fromkeys(t.reason for t in result.targets if t.status == "report"):
        out.append(f"(report: {reason})")
    misses = [t.text for t in result.targets if t.status == "MISS"]
    if misses:
        out.append(f"MISS: {len(misses)} scaling target(s) missed: {'; '.join(misses)}")
    return "\n".join(out)


def to_json(measurements: Sequence[Measurement], meta: dict[str, Any],
            scaling: Optional[ScalingResult] = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "meta": {"python": sys.version, "platform": platform.platform(), **meta},
        "results": [
            {
                "case": m.case.name,
                "thread": m.thread,
                "ftjit": m.case.ftjit.label,
                "ftjit_ns": m.ftjit_ns,
                "anchor": m.case.anchor.label,
                "anchor_ns": m.anchor_ns,
                "ratio": m.ratio,
                "target": m.case.target,
                "status": m.status,
                "unit": m.case.unit,
                "note": m.case.note,
                "ftjit_samples_ns": list(m.ftjit_samples_ns),
                "anchor_samples_ns": list(m.anchor_samples_ns),
            }
            for m in measurements
        ],
    }
    if scaling is not None:
        out["scaling"] = {
            "calls": scaling.calls,
            "rounds": scaling.rounds,
            "load_before": list(scaling.load_before),
            "load_after": list(scaling.load_after),
            "thread_counts": None if scaling.thread_counts is None else list(scaling.thread_counts),
            "configs": [{"key": cfg.key, "label": cfg.label, "threads": cfg.threads, "shared": cfg.shared}
                        for cfg in scaling.configs],
            "sides": [{"label": s.label, "group": g, "rates": {cfg: list(v) for cfg, v in s.rates.items()},
                       "median": {cfg.key: s.rate(cfg.key) for cfg in scaling.configs}}
                      for g, group in enumerate(scaling.groups) for s in group],
            "targets": [{"text": t.text, "value": t.value, "minimum": t.minimum, "status": t.status,
                         "reason": t.reason if t.status == "report" else ""}
                        for t in scaling.targets],
        }
    return out


def write_json(path: str, measurements: Sequence[Measurement], meta: dict[str, Any],
               scaling: Optional[ScalingResult] = None) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(to_json(measurements, meta, scaling), f, indent=2)
        f.write("\n")
