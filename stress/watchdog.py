"""Stall watchdog, the suite's one hang detector: no progress for ``stall_seconds`` dumps every stack and exits 3.

Scenarios do not time out on their own: they report progress (``Context.progress``) and the watchdog
judges. When the running scenario has reported nothing for ``stall_seconds`` (default 20), it

1. writes ``stress: WATCHDOG: scenario 'NAME' made no progress for ...`` on stderr,
2. dumps the stack of every thread with ``faulthandler.dump_traceback(all_threads=True)``,
3. calls ``on_stall(label, idle)`` (the command line prints the summary, with the scenario marked STALL),
4. exits the process with ``STALL_EXIT_CODE`` (3) without running interpreter shutdown (hung threads
   may be blocked in C++ and must not take part in it).

Backstop, not a second detector: a Python thread cannot run while another thread holds the GIL forever
(a deadlock in C++ code that kept it), so the watchdog also keeps a faulthandler C-level timer armed at
``stall_seconds + BACKSTOP_MARGIN_S``, re-armed every second by the watchdog's own loop. It can only fire
when that loop itself stopped running; faulthandler then dumps the stacks ("Timeout (...)!") and exits
with code 1 (faulthandler's, not configurable).
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time
from typing import Callable, Optional, TextIO

STALL_EXIT_CODE = 3
_POLL_S = 0.1
_REARM_S = 1.0
BACKSTOP_MARGIN_S = 15.0

#: on_stall(label, idle_seconds): runs in the watchdog thread just before the process exits
StallFn = Callable[[str, float], None]


class Watchdog:
    """Background thread that ends the process when the active scenario stops calling ``beat()``."""

    def __init__(self, stall_seconds: float, stream: TextIO, on_stall: Optional[StallFn] = None) -> None:
        self._stall_seconds = stall_seconds
        self._stream = _with_fileno(stream)
        self._on_stall = on_stall
        self._lock = threading.Lock()
        self._active: Optional[str] = None  # guarded by _lock
        self._last_beat = time.monotonic()  # racy on purpose: a float store from beat(), read by the loop
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="stress-watchdog", daemon=True)

    @property
    def stall_seconds(self) -> float:
        return self._stall_seconds

    def __enter__(self) -> Watchdog:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        faulthandler.cancel_dump_traceback_later()

    def enter(self, label: str) -> None:
        """Marks ``label`` as the running scenario and starts its stall clock."""
        with self._lock:
            self._active = label
            self._last_beat = time.monotonic()

    def leave(self) -> None:
        with self._lock:
            self._active = None

    def beat(self) -> None:
        self._last_beat = time.monotonic()  # a plain store: cheap enough to call from hot loops

    def _arm_backstop(self) -> None:
        faulthandler.dump_traceback_later(self._stall_seconds + BACKSTOP_MARGIN_S, exit=True, file=self._stream)

    def _loop(self) -> None:
        self._arm_backstop()
        last_arm = time.monotonic()
        while not self._stop.wait(_POLL_S):
            if time.monotonic() - last_arm >= _REARM_S:
                self._arm_backstop()
                last_arm = time.monotonic()
            with self._lock:
                active, idle = self._active, time.monotonic() - self._last_beat
            if active is not None and idle > self._stall_seconds:
                self._fire(active, idle)

    def _fire(self, label: str, idle: float) -> None:
        faulthandler.cancel_dump_traceback_later()  # this dump is the one; no second one from the backstop
        self._stream.write(
            f"\nstress: WATCHDOG: scenario {label!r} made no progress for {idle:.1f}s "
            f"(limit {self._stall_seconds:g}s); stacks of all threads follow (most recent call first)\n"
        )
        self._stream.flush()
        faulthandler.dump_traceback(file=self._stream, all_threads=True)
        self._stream.flush()
        try:
            if self._on_stall is not None:
                self._on_stall(label, idle)
        finally:
            self._stream.write(f"stress: WATCHDOG: {label!r} stalled; exiting with code {STALL_EXIT_CODE}\n")
            self._stream.flush()
            sys.stdout.flush()
            os._exit(STALL_EXIT_CODE)


def _with_fileno(stream: TextIO) -> TextIO:
    """faulthandler writes to a file descriptor: fall back to the real stderr for in-memory streams."""
    try:
        stream.fileno()
        return stream
    except (AttributeError, OSError, ValueError):
        return sys.__stderr__
