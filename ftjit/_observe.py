"""Observability: compile logging, the miss-explanation switch, stats().

Everything here runs on the miss path (or on demand), never on a cache hit.
The core calls on_compile/on_wait after each compile and wait; miss
explanations and the max_signatures message are written by ftjit._explain
(the core owns the count: its Guard).

Shared state: none of its own. The explanation switch and the "ahead of
traffic" marks are the core's (a relaxed atomic, and a per-thread depth).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
from typing import Any, Iterator, NamedTuple

from ._core import _ahead_enter, _ahead_exit, _explain_misses, _live_functions, _set_explain_misses

logger = logging.getLogger("ftjit")


def set_explain_misses(enabled: bool) -> None:
    """Turns miss explanations on or off for every function jitted with ``explain_misses=None``.

    Thread-safe (a single flag of the core's, read at each miss).
    """
    numpy_bool = type(enabled).__module__ == "numpy" and type(enabled).__name__ in ("bool", "bool_")
    if not (isinstance(enabled, (bool, int)) or numpy_bool):  # "no" would otherwise mean True
        raise TypeError(f"set_explain_misses expects a bool, got {enabled!r}")
    _set_explain_misses(bool(enabled))


def explain_misses_enabled() -> bool:
    return _explain_misses()


# The global switch's first value.
set_explain_misses(os.environ.get("FTJIT_EXPLAIN_MISSES", "") not in ("", "0"))


@contextlib.contextmanager
def compiling_ahead() -> Iterator[None]:
    """Marks this thread's compiles as requested ahead of traffic
    (``precompile``/``warmup``): they are not explained as misses (the
    ``max_signatures`` guard still counts them). The mark is the core's
    (``JitFunction.precompile`` sets it too)."""
    _ahead_enter()
    try:
        yield
    finally:
        _ahead_exit()


# --- logging hooks (called by the C++ core after each compile / wait) --------


def on_compile(name: str, signature: str, seconds: float, error: BaseException | None) -> None:
    if not logger.isEnabledFor(logging.INFO):
        return
    thread = threading.current_thread().name
    if error is None:
        logger.info("compiled %s in %.3f s (thread %s)", signature, seconds, thread)
    else:
        logger.info(
            "compile of %s failed after %.3f s (thread %s): %s: %s",
            signature,
            seconds,
            thread,
            type(error).__name__,
            error,
        )


def on_wait(name: str, signature: str, seconds: float) -> None:
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug(
            "waited %.3f s for %s, compiled by another thread (thread %s)",
            seconds,
            signature,
            threading.current_thread().name,
        )


# --- process-wide stats --------------------------------------------------------


class FunctionStats(NamedTuple):
    name: str
    hits: int
    misses: int
    compiles: int
    waits: int
    evictions: int
    size: int
    failures: int
    compile_seconds: float
    wait_seconds: float


@dataclasses.dataclass(frozen=True)
class Stats:
    """A snapshot over every live jitted function (see ``ftjit.stats()``)."""

    functions: tuple[FunctionStats, ...]  # sorted by compile time, largest first
    totals: FunctionStats
    #: every live ftjit.batched function's BatchInfo, by name
    batched: tuple[Any, ...] = ()

    def top(self, n: int = 10) -> tuple[FunctionStats, ...]:
        return self.functions[:n]

    def as_dict(self, top: int = 10) -> dict[str, Any]:
        return {"totals": self.totals._asdict(), "functions": [f._asdict() for f in self.top(top)],
                "batched": [dataclasses.asdict(b) for b in self.batched]}

    def __str__(self) -> str:
        header = ("function", "hits", "misses", "compiles", "waits", "evict", "size", "fail", "compile s", "wait s")
        rows = [header]
        for f in (*self.top(10), self.totals):
            rows.append(
                (
                    f.name,
                    str(f.hits),
                    str(f.misses),
                    str(f.compiles),
                    str(f.waits),
                    str(f.evictions),
                    str(f.size),
                    str(f.failures),
                    f"{f.compile_seconds:.3f}",
                    f"{f.wait_seconds:.3f}",
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
        lines = []
        for j, r in enumerate(rows):
            cells = [r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:], widths[1:])]
            lines.append("  ".join(cells))
            if j == 0 or j == len(rows) - 2:
                lines.append("  ".join("-" * w for w in widths))
        lines += [f"batched {b}" for b in self.batched]
        return "\n".join(lines)


def stats() -> Stats:
    """Snapshot of every live jitted function's counters, with totals.

    One entry per (function, options) pair (wrappers of the same function
    share it). Each function's counters are read atomically; the whole is not a
    consistent cut across functions under concurrent calls.
    """
    funcs = [FunctionStats(name, *info) for name, info in _live_functions()]
    funcs.sort(key=lambda f: f.compile_seconds, reverse=True)
    total = FunctionStats(
        f"TOTAL ({len(funcs)} function{'' if len(funcs) == 1 else 's'})",
        *(sum(getattr(f, field) for f in funcs) for field in FunctionStats._fields[1:]),
    )
    from ._batched import live_batched

    batched = sorted((b.batch_info() for b in live_batched()), key=lambda b: b.name)
    return Stats(tuple(funcs), total, tuple(batched))
