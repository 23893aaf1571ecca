"""Runs scenarios once or as a timed soak, wiring each one to the progress display and the watchdog."""

from __future__ import annotations

import dataclasses
import random
import threading
import time
import traceback
from typing import Optional, Sequence

from .progress import ProgressReporter
from .registry import Context, Result, Scenario
from .watchdog import Watchdog


@dataclasses.dataclass(frozen=True)
class Plan:
    """What to run: which scenarios, how big, with which seed, once or for ``minutes``."""

    scenarios: Sequence[Scenario]
    seed: int
    quick: bool
    threads: Optional[int]
    minutes: Optional[float]
    stall_seconds: float
    scale: float = 1.0


class RunState:
    """What has run so far and what runs now: read by the watchdog's stall report from its own thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._results: list[Result] = []  # guarded by _lock
        self._current: Optional[str] = None  # guarded by _lock: the running scenario's name
        self._done = 0  # racy on purpose: plain int stores from the progress callback, read for the report
        self._total = 0

    def begin(self, name: str) -> None:
        with self._lock:
            self._current = name
            self._done = self._total = 0

    def progress(self, done: int, total: int) -> None:
        self._done, self._total = done, total

    def finish(self, result: Result) -> None:
        with self._lock:
            self._results.append(result)
            self._current = None

    def snapshot(self) -> tuple[list[Result], Optional[str], int, int]:
        """(results so far, running scenario or None, its last reported done, total)."""
        with self._lock:
            return list(self._results), self._current, self._done, self._total


def scenario_seed(base_seed: int, name: str, iteration: int) -> int:
    """A per-run seed derived deterministically from the base seed, scenario name and soak iteration."""
    return random.Random(f"{base_seed}:{name}:{iteration}").getrandbits(32)


def run_one(scenario: Scenario, ctx: Context) -> Result:
    """Runs a scenario; an exception escaping it becomes a FAIL result instead of ending the suite."""
    started = time.monotonic()
    try:
        result = scenario.run(ctx)
    except Exception as exc:  # noqa: BLE001  (reported as a violation)
        detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        result = Result(scenario=scenario.name, threads=ctx.thread_count(0), errors=1)
        result.violations.append(f"scenario raised {detail}")
        traceback.print_exc()
    result.seconds = time.monotonic() - started
    return result


def _run_tracked(scenario: Scenario, iteration: int, plan: Plan, reporter: ProgressReporter, dog: Watchdog,
                 state: RunState) -> Result:
    seed = scenario_seed(plan.seed, scenario.name, iteration)
    label = scenario.name if plan.minutes is None else f"{scenario.name} #{iteration + 1}"

    def progress(done: int, total: int) -> None:
        dog.beat()
        state.progress(done, total)
        reporter.update(done, total)

    ctx = Context(seed=seed, quick=plan.quick, progress=progress, threads=plan.threads,
                  stall_seconds=plan.stall_seconds, scale=plan.scale)
    state.begin(scenario.name)
    reporter.start(label)
    dog.enter(label)
    try:
        result = run_one(scenario, ctx)
    finally:
        dog.leave()
    state.finish(result)
    reporter.end(label, result)
    if not result.passed:
        reporter.note(f"stress: {label} failed with run seed {seed} (suite --seed {plan.seed})")
    return result


def merge_by_name(results: Sequence[Result]) -> list[Result]:
    merged: dict[str, Result] = {}
    for result in results:
        prior = merged.get(result.scenario)
        merged[result.scenario] = result if prior is None else prior.merge(result)
    return list(merged.values())


def execute(plan: Plan, reporter: ProgressReporter, dog: Watchdog, state: RunState) -> list[Result]:
    """Runs the plan; in soak mode repeats all scenarios until the time is up and merges rows by scenario."""
    if plan.minutes is None:
        return [_run_tracked(s, 0, plan, reporter, dog, state) for s in plan.scenarios]
    deadline = time.monotonic() + plan.minutes * 60.0
    results: list[Result] = []
    iteration = 0
    while True:
        for scenario in plan.scenarios:
            results.append(_run_tracked(scenario, iteration, plan, reporter, dog, state))
            if time.monotonic() >= deadline:
                return merge_by_name(results)
        iteration += 1
