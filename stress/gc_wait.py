"""gc.collect() until a condition holds: used by the stress scenarios and by the pytest suite (tests/helpers.py)."""

from __future__ import annotations

import gc
import time
from typing import Callable


def gc_collect_until(predicate: Callable[[], object], timeout: float = 5.0) -> bool:
    """Run gc.collect() until ``predicate()`` is true or ``timeout`` seconds passed; return its last value, as a bool.

    One gc.collect() may be a no-op while another thread is collecting, so a single call is not enough when
    other threads run (the stress scenarios' collector thread, tests run in parallel threads).
    """
    deadline = time.monotonic() + timeout
    while True:
        gc.collect()
        if predicate():
            return True
        if time.monotonic() > deadline:
            return bool(predicate())
        time.sleep(0.01)
