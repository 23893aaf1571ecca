"""Stall watchdog: if the running scenario reports no progress for too long, dump all stacks and exit 3.

A Python thread cannot run while another thread holds the GIL forever (a deadlock in C++ code),
so the watchdog also keeps a faulthandler C-level timer armed as a backstop: if the Python loop
itself stops running for ``stall_seconds + BACKSTOP_MARGIN_S``, faulthandler dumps the stacks
("Timeout (...)!") and exits with code 1.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time
from typing import Optional, TextIO

STALL_EXIT_CODE = 3
_POLL_S = 0.25
_REARM_S = 1.0
BACKSTOP_MARGIN_S = 15.0


class Watchdog:
    """Background thread that kills the process when the active scenario stops calling ``beat()``."""

    def __init__(self, stall_seconds: float, stream: TextIO) -> None:
        self._stall_seconds = stall_seconds
        self._stream = _with_fileno(stream)
        self._lock = threading.Lock()
        self._active: Optional[str] = None
        self._last_beat = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="stress-watchdog", daemon=True)

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
        self._stream.write(
            f"\nstress: WATCHDOG: scenario {label!r} made no progress for {idle:.1f}s "
            f"(limit {self._stall_seconds:g}s); stacks of all threads follow\n"
        )
        self._stream.flush()
        faulthandler.dump_traceback(file=self._stream, all_threads=True)
        self._stream.write(f"stress: WATCHDOG: {label!r} stalled; exiting with code {STALL_EXIT_CODE}\n")
        self._stream.flush()
        os._exit(STALL_EXIT_CODE)


def _with_fileno(stream: TextIO) -> TextIO:
    """faulthandler writes to a file descriptor: fall back to the real stderr for in-memory streams."""
    try:
        stream.fileno()
        return stream
    except (AttributeError, OSError, ValueError):
        return sys.__stderr__
