"""Hidden scenarios that test the suite itself (tests/test_stress.py): a stall, a violation, a quick pass.

Hidden: not listed by ``--list`` and never run by default; only ``--scenario _NAME`` runs one.
"""

from __future__ import annotations

import threading
import time

from ..registry import Context, Result, register
from ._pool import Pool, WorkerLog

STALL_THREADS = 3
STALL_STEPS = 4  #: progress made before the stall, so the report shows where it stopped
PASS_STEPS = 10
PASS_STEP_S = 0.1


def _blocked_forever(event: threading.Event) -> None:
    """Where the stalled threads wait (the watchdog's stack dump must show this frame)."""
    event.wait()


@register("_stall", "self-test: makes a little progress, then blocks every worker forever", hidden=True)
def run_stall(ctx: Context) -> Result:
    never = threading.Event()
    pool = Pool(ctx, "_stall", STALL_THREADS * (STALL_STEPS + 1))

    def work(index: int, log: WorkerLog) -> None:
        for n in range(STALL_STEPS):
            log.round, log.phase = n, "stepping"
            time.sleep(0.01)
            pool.step()
        log.phase = "blocked"
        _blocked_forever(never)

    pool.run([work] * STALL_THREADS)
    return pool.result(0, 0, ["the stall scenario returned: its workers were not blocked"])


@register("_violation", "self-test: runs briefly and reports one violated invariant", hidden=True)
def run_violation(ctx: Context) -> Result:
    ctx.progress(1, 1)
    return Result(scenario="_violation", threads=1, calls=1, violations=["injected violation (self-test)"])


@register("_pass", "self-test: makes steady progress for about a second and passes", hidden=True)
def run_pass(ctx: Context) -> Result:
    for n in range(PASS_STEPS):
        time.sleep(PASS_STEP_S)
        ctx.progress(n + 1, PASS_STEPS)
    return Result(scenario="_pass", threads=1, calls=PASS_STEPS)
