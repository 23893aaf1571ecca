"""Scenario "batching": ftjit.batched under callers that come and go, mixed signatures, failing examples and
clears.

Short-lived caller threads (each makes a few calls, then ends; new ones start as others end, about twelve
alive at once) call ONE batched function with examples of three signatures (ints, floats, complex numbers:
three queues). Every 17th example is poisoned: the function raises ValueError for it, alone as in a batch; a
batch that holds one fails, and its examples run again alone, each in its caller's thread. A background thread
clears the compiled programs now and then. The batches run without JAX (stress.batch_runner: one jitted call of
the stacked examples), so ThreadSanitizer runs this scenario too.

Invariants: every caller of a clean example gets its right answer (no clean caller fails for another's
example: issue 45); every caller of a poisoned one raises its own ValueError; every call is counted once
(alone, one example of a batch that ran, or one retried alone after its batch failed); failed_batches is one per
batch that held a poisoned example plus one per poisoned call (each fails alone once); no batch mixes signatures.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import ftjit
from ftjit._batched import BatchedFunction

from ..batch_runner import RowsRunner
from ..registry import Context, Result, register
from ._pool import Pool, WorkerLog

DEFAULT_THREADS = 12  # alive at once
CALLS_PER_CALLER = 5
CALLERS_QUICK = 400
CALLERS_FULL = 2000
POISON_EVERY = 17
CLEAR_EVERY_S = 0.003


def _example(n: int) -> Any:
    kind = n % 3
    return n if kind == 0 else (n + 0.5 if kind == 1 else complex(n, 1))


def _poisoned(x: Any) -> bool:
    return int(x.real if isinstance(x, complex) else x) % POISON_EVERY == 0


def _triple(x: Any) -> Any:
    if _poisoned(x):
        raise ValueError(f"poisoned example {x!r}")
    time.sleep(0.0001)  # a call takes a moment, as a device's does (and lets other callers in on a GIL build)
    return 3 * x


class BatchingRun:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.alive = ctx.thread_count(DEFAULT_THREADS)
        self.callers = ctx.size(CALLERS_QUICK, CALLERS_FULL)
        self.runner = RowsRunner(_triple)
        self.fn = BatchedFunction(_triple, max_batch=8, max_wait=0.0005, sizes=None, to_host=False, timeout=None,
                                  static_argnums=(), static_argnames=(), runner=self.runner)
        self.pool = Pool(ctx, "batching", self.callers * CALLS_PER_CALLER)
        self.lock = threading.Lock()
        self.errors = 0  # guarded by lock: clean callers that raised a poisoned example's ValueError
        self.poisoned_calls = 0  # guarded by lock
        self.clears = 0
        self.next_caller = 0  # guarded by lock

    def caller(self, number: int, log: WorkerLog) -> None:
        for k in range(CALLS_PER_CALLER):
            x = _example(number * CALLS_PER_CALLER + k)
            out, exc = log.timed(self.fn, x)
            if _poisoned(x):
                with self.lock:
                    self.poisoned_calls += 1
                if not (isinstance(exc, ValueError) and str(exc) == f"poisoned example {x!r}"):
                    log.failures.append(f"the poisoned example {x!r} gave {out!r} / {exc!r}, not its ValueError")
            elif exc is not None:
                if isinstance(exc, ValueError) and "poisoned example" in str(exc):
                    with self.lock:
                        self.errors += 1
                log.failures.append(f"the clean example {x!r} raised {type(exc).__name__}: {exc}")
            elif out != 3 * x:
                log.failures.append(f"example {x!r} gave {out!r}, expected {3 * x!r}")
            self.pool.step()

    def spawner(self, index: int, log: WorkerLog) -> None:
        """One of `alive` slots: starts a caller thread, waits for it to end, starts the next."""
        while not self.pool.stop.is_set():
            with self.lock:
                number = self.next_caller
                if number >= self.callers:
                    return
                self.next_caller += 1
            sub = WorkerLog()
            t = threading.Thread(target=self.caller, args=(number, sub), name=f"batching-caller-{number}")
            t.start()
            t.join()
            log.calls += sub.calls
            log.latencies_ns += sub.latencies_ns
            log.failures += sub.failures
            log.round = number

    def clearer(self, index: int, log: WorkerLog) -> None:
        while not self.pool.stop.is_set():
            self.fn.clear_cache()
            self.clears += 1
            self.pool.stop.wait(CLEAR_EVERY_S)


@register("batching", "ftjit.batched: callers coming and going, three signatures, poisoned examples failing "
          "their batches, clears racing (no JAX: ThreadSanitizer runs it too)")
def run_batching(ctx: Context) -> Result:
    run = BatchingRun(ctx)
    aborted = run.pool.run([run.spawner] * run.alive, background=[run.clearer])
    violations = list(aborted)
    info = run.fn.batch_info()
    total = run.callers * CALLS_PER_CALLER
    batches = list(run.runner.batches)
    if not aborted:
        if info.calls != total:
            violations.append(f"batch_info().calls == {info.calls} != {total} calls")
        in_batches = sum(n * count for n, count in info.sizes)
        if info.alone + in_batches + info.retried != info.calls:
            violations.append(f"alone {info.alone} + examples in batches {in_batches} + retried {info.retried} != "
                              f"{info.calls} calls: a call counted twice or not at all")
        mixed = [xs for xs in batches if len({type(x) for x in xs}) > 1]
        if mixed:
            violations.append(f"{len(mixed)} batches mixed signatures, e.g. {list(mixed[0])}")
        if run.errors:
            violations.append(f"{run.errors} callers of clean examples raised another example's error")
        poisoned_batches = sum(1 for xs in batches if any(map(_poisoned, xs)))
        if info.failed_batches != poisoned_batches + run.poisoned_calls:
            violations.append(f"failed_batches == {info.failed_batches}, not one per batch that held a poisoned "
                              f"example ({poisoned_batches}) plus one per poisoned call ({run.poisoned_calls})")
        if run.clears == 0:
            violations.append("no clear ran: the scenario did not exercise clears")
    notes = [f"{info.batches} batches (mean {info.mean_batch_size:.1f} examples), {info.alone} alone, "
             f"{info.failed_batches} failed ({info.retried} examples retried alone), {run.clears} clears; clean "
             f"callers failed by another's example: {run.errors}"]
    return run.pool.result(run.runner.many.cache_info().compiles + run.runner.one.cache_info().compiles,
                           run.runner.many.cache_info().waits + run.runner.one.cache_info().waits, violations, notes,
                           threads=run.alive)
