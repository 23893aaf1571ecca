"""Worker threads for a scenario: per-thread logs and progress counting; stalls are the watchdog's to report."""

from __future__ import annotations

import array
import dataclasses
import threading
import time
import traceback
from typing import Any, Callable, Optional, Sequence

from ..registry import Context, Result
from .herd import summarize_failures

_POLL_S = 0.05


@dataclasses.dataclass
class WorkerLog:
    """What one thread saw: latencies, failures, expected errors, and where it is now (for hang reports)."""

    latencies_ns: list[int] = dataclasses.field(default_factory=list)
    failures: list[str] = dataclasses.field(default_factory=list)
    calls: int = 0
    errors: int = 0  #: exceptions the scenario expects (counted, not failures)
    round: int = -1
    phase: str = "starting"

    def timed(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, Optional[BaseException]]:
        """Calls ``fn``, recording its latency: (result, None) or (None, the exception it raised)."""
        start = time.perf_counter_ns()
        try:
            out, exc = fn(*args, **kwargs), None
        except Exception as error:  # noqa: BLE001  (the caller judges it)
            out, exc = None, error
        self.latencies_ns.append(time.perf_counter_ns() - start)
        self.calls += 1
        return out, exc


WorkFn = Callable[[int, WorkerLog], None]


class Pool:
    """Runs worker threads to completion and background threads until the workers are done.

    It has no timeout of its own: it reports progress (``ctx.progress``) whenever ``step`` was called, and a
    pool that stops making progress is the watchdog's to report (every thread's stack, exit code 3).
    """

    def __init__(self, ctx: Context, name: str, total: int, on_poll: Optional[Callable[[], None]] = None) -> None:
        self.ctx = ctx
        self.name = name
        self.total = total
        self.stop = threading.Event()  #: set when the workers finished or one died: background threads and the rest exit
        self.logs: list[WorkerLog] = []
        self.barriers: list[threading.Barrier] = []  #: aborted when a worker dies, so the others do not wait for it
        self._on_poll = on_poll
        self._lock = threading.Lock()
        self._done = 0  # guarded by _lock
        self._died: list[str] = []  # guarded by _lock: names of threads that ended by an exception

    def step(self, n: int = 1) -> None:
        """A worker made ``n`` units of progress (out of ``total``)."""
        with self._lock:
            self._done += n

    @property
    def done(self) -> int:
        with self._lock:
            return self._done

    def run(self, workers: Sequence[WorkFn], background: Sequence[WorkFn] = ()) -> list[str]:
        """Runs ``workers[i](i, log)`` and ``background[j](j, log)`` in threads until all have returned.

        Returns why the run was cut short (empty: it was not): a thread that died aborts the barriers, so the
        others' books are incomplete; its exception is among the failures. A pool may run several batches one
        after the other; logs and progress accumulate.
        """
        self.stop.clear()
        fg = [self._thread(f"{self.name}-{i}", fn, i) for i, fn in enumerate(workers)]
        bg = [self._thread(f"{self.name}-bg{j}", fn, j) for j, fn in enumerate(background)]
        for thread, _ in fg + bg:
            thread.start()
        self._join(fg)
        self.stop.set()
        self._join(bg)
        with self._lock:
            died = list(self._died)
        if not died:
            return []
        shown = ", ".join(died[:8]) + (", ..." if len(died) > 8 else "")
        return [f"run cut short: {len(died)} thread(s) died and the barriers were aborted: {shown}"]

    def _thread(self, name: str, fn: WorkFn, index: int) -> tuple[threading.Thread, WorkerLog]:
        log = WorkerLog()
        self.logs.append(log)

        def body() -> None:
            try:
                fn(index, log)
                log.phase = "done"
            except BaseException as exc:  # noqa: BLE001  (a worker dying is a finding)
                detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
                log.failures.append(f"{name} died in round {log.round} ({log.phase}): {detail}")
                log.phase = "died"
                with self._lock:
                    self._died.append(name)
                self.stop.set()
                for barrier in self.barriers:
                    barrier.abort()

        return threading.Thread(target=body, name=name, daemon=True), log

    def _join(self, threads: list[tuple[threading.Thread, WorkerLog]]) -> None:
        """Joins ``threads``, reporting progress each time ``step`` moved; no timeout (the watchdog judges)."""
        last_done = -1
        while True:
            alive = [t for t, _ in threads if t.is_alive()]
            if not alive:
                return
            alive[0].join(_POLL_S)
            if self._on_poll is not None:
                self._on_poll()
            done = self.done
            if done != last_done:
                last_done = done
                self.ctx.progress(min(done, self.total), self.total)

    # -- totals over every thread's log ------------------------------------------------------------------------
    @property
    def calls(self) -> int:
        return sum(log.calls for log in self.logs)

    @property
    def failures(self) -> list[str]:
        return [f for log in self.logs for f in log.failures]

    def result(self, compiles: int, waits: int, violations: list[str], notes: Sequence[str] = (),
               threads: Optional[int] = None) -> Result:
        """The scenario's Result: totals of the logs (threads: all of them unless given); failed calls are violations."""
        failures = self.failures
        return Result(
            scenario=self.name,
            threads=len(self.logs) if threads is None else threads,
            calls=self.calls,
            compiles=compiles,
            waits=waits,
            errors=sum(log.errors for log in self.logs) + len(failures),
            latencies_ns=array.array("q", (ns for log in self.logs for ns in log.latencies_ns)),
            violations=violations + summarize_failures(failures),
            notes=list(notes),
        )
