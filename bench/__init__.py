"""ftjit benchmarks: dispatch latency against reference implementations (run with ``python -m bench``)."""

from __future__ import annotations

from .cases import Case, Side, default_cases
from .timing import Measurement, measure

__all__ = ["Case", "Side", "Measurement", "default_cases", "measure"]
