"""Progress display on stderr: an in-place bar on a TTY, one line per scenario start/end otherwise."""

from __future__ import annotations

import threading
import time
from typing import TextIO

from .registry import Result

_BAR_WIDTH = 30
_REDRAW_INTERVAL_S = 0.05


class ProgressReporter:
    """Shows which scenario runs and how far along it is; safe to update from any thread."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._tty = _is_tty(stream)
        self._lock = threading.Lock()
        self._label = ""
        self._started = 0.0
        self._last_draw = 0.0

    def start(self, label: str) -> None:
        with self._lock:
            self._label = label
            self._started = time.monotonic()
            self._last_draw = 0.0
            if self._tty:
                self._draw(0, 0)
            else:
                self._write(f"stress: {label} ...\n")

    def update(self, done: int, total: int) -> None:
        if not self._tty:
            return
        with self._lock:
            now = time.monotonic()
            if done < total and now - self._last_draw < _REDRAW_INTERVAL_S:
                return
            self._last_draw = now
            self._draw(done, total)

    def end(self, label: str, result: Result) -> None:
        with self._lock:
            elapsed = time.monotonic() - self._started
            prefix = "\r\x1b[K" if self._tty else ""
            detail = "" if result.passed else f" ({len(result.violations)} violated invariants)"
            self._write(f"{prefix}stress: {label} {result.verdict} in {elapsed:.1f}s{detail}\n")

    def note(self, message: str) -> None:
        """A free-form line (e.g. a failure detail), kept off the bar line."""
        with self._lock:
            prefix = "\r\x1b[K" if self._tty else ""
            self._write(f"{prefix}{message}\n")

    def _draw(self, done: int, total: int) -> None:
        frac = done / total if total > 0 else 0.0
        filled = int(round(frac * _BAR_WIDTH))
        bar = "#" * filled + "." * (_BAR_WIDTH - filled)
        count = f"{done}/{total}" if total > 0 else "starting"
        elapsed = time.monotonic() - self._started
        self._write(f"\r\x1b[K{self._label} [{bar}] {count} {elapsed:5.1f}s")

    def _write(self, text: str) -> None:
        self._stream.write(text)
        self._stream.flush()


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
