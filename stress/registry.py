"""Scenario registry plus the context a scenario receives and the result record it returns."""

from __future__ import annotations

import array
import dataclasses
import importlib
from typing import Callable, Optional

from .stats import percentile_us

#: progress(done, total): a scenario calls it whenever it makes progress; it feeds the display and the watchdog.
ProgressFn = Callable[[int, int], None]

#: Safety bound on barrier waits, as a multiple of the stall limit: the watchdog (which dumps every stack and
#: fails the run) always fires first; the bound only keeps a thread from waiting forever without one.
WAIT_TIMEOUT_FACTOR = 3.0


@dataclasses.dataclass(frozen=True)
class Context:
    """What a scenario gets: its seed, the size preset, optional overrides and the progress callback."""

    seed: int
    quick: bool
    progress: ProgressFn
    threads: Optional[int] = None  #: overrides the scenario's default thread count
    stall_seconds: float = 20.0  #: the watchdog's limit: no progress this long fails the whole run
    scale: float = 1.0  #: multiplies the scenario's sizes (rounds, calls): < 1 for slow builds (TSAN)

    def thread_count(self, default: int) -> int:
        return self.threads if self.threads is not None else default

    def size(self, quick: int, full: int) -> int:
        """The quick or full size of a loop, times ``scale`` (at least 1)."""
        return max(1, round((quick if self.quick else full) * self.scale))

    @property
    def wait_timeout(self) -> float:
        """Timeout for a barrier wait: longer than the stall limit, so a stall is the watchdog's to report."""
        return WAIT_TIMEOUT_FACTOR * self.stall_seconds


@dataclasses.dataclass
class Result:
    """One scenario run: the counters shown in the summary table and the invariants it violated."""

    scenario: str
    threads: int
    calls: int = 0
    compiles: int = 0
    waits: int = 0
    errors: int = 0
    #: one 8-byte item per call, no object each: a soak's merged rows stay small (see merge)
    latencies_ns: array.array = dataclasses.field(default_factory=lambda: array.array("q"), repr=False)
    violations: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)  #: measurements shown under the table
    seconds: float = 0.0
    runs: int = 1
    stalled: bool = False  #: the watchdog fired during this scenario (the run ends with it)

    @property
    def verdict(self) -> str:
        if self.stalled:
            return "STALL"
        return "PASS" if not self.violations else "FAIL"

    @property
    def passed(self) -> bool:
        return not self.violations and not self.stalled

    @property
    def p50_us(self) -> float:
        return percentile_us(self.latencies_ns, 50.0)

    @property
    def p99_us(self) -> float:
        return percentile_us(self.latencies_ns, 99.0)

    def merge(self, other: Result) -> Result:
        """Combines two runs of the same scenario (soak mode) into one row."""
        return Result(
            scenario=self.scenario,
            threads=max(self.threads, other.threads),
            calls=self.calls + other.calls,
            compiles=self.compiles + other.compiles,
            waits=self.waits + other.waits,
            errors=self.errors + other.errors,
            latencies_ns=self.latencies_ns + other.latencies_ns,
            violations=self.violations + other.violations,
            notes=self.notes + other.notes,
            seconds=self.seconds + other.seconds,
            runs=self.runs + other.runs,
            stalled=self.stalled or other.stalled,
        )


ScenarioFn = Callable[[Context], Result]


@dataclasses.dataclass(frozen=True)
class Scenario:
    """A registered scenario: its name, a one-line description and the function that runs it.

    A hidden scenario (the suite's own self-tests) runs only when named with ``--scenario``.
    """

    name: str
    description: str
    run: ScenarioFn
    hidden: bool = False
    needs_jax: bool = False  #: skipped by --no-jax


_REGISTRY: dict[str, Scenario] = {}


def register(name: str, description: str, hidden: bool = False,
             needs_jax: bool = False) -> Callable[[ScenarioFn], ScenarioFn]:
    """Decorator: ``@register("herd", "...")`` adds a scenario function to the registry."""

    def decorate(fn: ScenarioFn) -> ScenarioFn:
        if name in _REGISTRY:
            raise ValueError(f"stress scenario {name!r} registered twice")
        _REGISTRY[name] = Scenario(name, description, fn, hidden, needs_jax)
        return fn

    return decorate


def all_scenarios() -> dict[str, Scenario]:
    """All registered scenarios by name (hidden ones too), in registration order (imports the built-in ones first)."""
    importlib.import_module(f"{__package__}.scenarios")  # registers the built-in scenarios on first import

    return dict(_REGISTRY)
