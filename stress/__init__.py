"""ftjit stress suite: concurrent scenarios that check the runtime's invariants (run with ``python -m stress``)."""

from __future__ import annotations

from .registry import Context, Result, Scenario, all_scenarios, register

__all__ = ["Context", "Result", "Scenario", "all_scenarios", "register"]
