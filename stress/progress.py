"""Progress display on stderr: an in-place bar on a TTY; otherwise (a CI log) plain lines, at most one per interval."""

from __future__ import annotations

import threading
import time
from typing import TextIO

from .registry import Result

_BAR_WIDTH = 30
_REDRAW_INTERVAL_S = 0.05
LINE_INTERVAL_S = 5.0  #: off a TTY: at most one progress line per scenario this often


class ProgressReporter:
    """Shows which scenario runs and how far along it is; safe to update from any thread."""

    def __init__(self, stream: TextIO, line_interval_s: float = LINE_INTERVAL_S) -> None:
        self._stream = stream
        self._tty = _is_tty(stream)
        self._line_interval_s = line_interval_s
        self._lock = threading.Lock()
        self._label = ""  # guarded by _lock (all fields below too)
        self._started = 0.0
        self._last_draw = 0.0

    def start(self, label: str) -> None:
        with self._lock:
            self._label = label
            self._started = time.monotonic()
            if self._tty:
                self._last_draw = 0.0
                self._draw(0, 0)
            else:
                self._last_draw = self._started  # the first progress line comes one interval in
                self._write(f"stress: {label} ...\n")

    def update(self, done: int, total: int) -> None:
        with self._lock:
            now = time.monotonic()
            if self._tty:
                if done < total and now - self._last_draw < _REDRAW_INTERVAL_S:
                    return
                self._last_draw = now
                self._draw(done, total)
            elif now - self._last_draw >= self._line_interval_s:
                self._last_draw = now
                pct = f" ({100.0 * done / total:.0f}%)" if total > 0 else ""
                self._write(f"stress: {self._label} {done}/{total}{pct} after {now - self._started:.1f}s\n")

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
