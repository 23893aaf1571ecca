"""Latency statistics: nearest-rank percentiles of nanosecond samples, reported in microseconds."""

from __future__ import annotations

import math
from typing import Sequence


def percentile_us(samples_ns: Sequence[int], pct: float) -> float:
    """The nearest-rank ``pct`` percentile of ``samples_ns`` in µs; NaN when there are no samples."""
    if not samples_ns:
        return math.nan
    ordered = sorted(samples_ns)
    rank = max(1, math.ceil(pct / 100.0 * len(ordered)))
    return ordered[rank - 1] / 1000.0
