"""The miss path's cost as a function grows: ns per miss (a new signature, compiled by a compiler that returns
the function) with many signatures already compiled against the same with few or none.

Two measurements: ``miss_measurement`` (4000 signatures against 10, explanations on and logged: what a user who
turns them on pays) and ``unexplained_miss_measurements`` (2000, 8000 and 16000 signatures against none, no
explanations: the store's own miss, publish included, which must not grow with the signatures cached)."""

from __future__ import annotations

import logging
import statistics
import time
from typing import Any, Callable, Sequence

from .cases import Case, Side, identity_compiler
from .timing import Measurement, in_thread

LARGE, SMALL = 4000, 10
#: Signatures cached before the unexplained misses: the anchor (none), then the rows (the target is on TARGETED).
UNEXPLAINED_ANCHOR, UNEXPLAINED_SIZES, TARGETED = 0, (2000, 8000, 16000), 8000


def _function(prefilled: int, explain: bool) -> tuple[Any, Callable[[], int]]:
    """A jitted f(x, n) (n static) with ``prefilled`` signatures compiled, and a maker of fresh n's."""
    import ftjit

    def f(x: float, n: int) -> float:
        return x

    jf = ftjit.jit(f, static_argnums=1, compiler=identity_compiler, cache=ftjit.FunctionCache(capacity=1 << 16),
                   explain_misses=explain)
    for n in range(prefilled):
        jf(1.0, n)
    counter = iter(range(prefilled, 1 << 62))
    return jf, lambda: next(counter)


def _interleaved(prefills: Sequence[int], explain: bool, misses: int, rounds: int) -> list[list[float]]:
    """ns per miss of a function per prefill, in a worker thread: ``rounds`` rounds, each timing ``misses``
    misses on every function in turn, the order rotating from round to round (each function goes first once
    every len(prefills) rounds). Every miss adds a signature: a function holds prefill + rounds * misses at
    the end. (Clearing the one prefilled with none after each of its timings would keep it nearer none, but the
    memory that frees then serves the next function's misses, which makes those look cheaper than they are.)"""

    def run() -> list[list[float]]:
        sides = [_function(p, explain) for p in prefills]
        out: list[list[float]] = [[] for _ in prefills]
        for r in range(rounds):
            for k in range(len(sides)):
                i = (k + r) % len(sides)
                jf, fresh = sides[i]
                ns = [fresh() for _ in range(misses)]
                t0 = time.perf_counter_ns()
                for n in ns:
                    jf(1.0, n)
                out[i].append((time.perf_counter_ns() - t0) / misses)
        return out

    return in_thread("worker", run)


def miss_measurement(misses: int = 200, rounds: int = 5) -> Measurement:
    """ns per miss at LARGE signatures (the ftjit side) against SMALL (the anchor), interleaved in rounds of
    ``misses`` misses each, in a worker thread, with explanations built and logged (to a null handler)."""
    logger = logging.getLogger("ftjit")
    old = (logger.level, logger.propagate)
    handler = logging.NullHandler()
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        large, small = _interleaved((LARGE, SMALL), True, misses, rounds)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old[0])
        logger.propagate = old[1]
    case = Case(f"miss with {LARGE} signatures cached", Side(f"{LARGE} signatures", lambda: None, ()),
                Side(f"{SMALL} signatures", lambda: None, ()), target=1.25,
                note="ns per miss (a new static value, compiled by a compiler that returns the function, explained and "
                     f"logged), with {LARGE} signatures of the function already compiled against {SMALL}: the miss path "
                     "must not grow with the signatures remembered")
    return Measurement(case, statistics.median(large), statistics.median(small), tuple(large), tuple(small))


def unexplained_miss_measurements(misses: int = 200, rounds: int = 5) -> list[Measurement]:
    """ns per miss, no explanations, at each of UNEXPLAINED_SIZES signatures (the ftjit side of one row each)
    against UNEXPLAINED_ANCHOR (every row's anchor), all interleaved in rounds of ``misses`` misses each, in a
    worker thread. The ratio of the TARGETED row is "8000 / 0": the cost of publishing into a full table."""
    anchor, *rows = _interleaved((UNEXPLAINED_ANCHOR, *UNEXPLAINED_SIZES), False, misses, rounds)
    note = ("ns per miss (a new static value, compiled by a compiler that returns the function, not explained), with "
            f"that many signatures of the function already compiled against {UNEXPLAINED_ANCHOR}; ratio = that "
            "many / none: a miss, its publish included, must not grow with the signatures cached")
    out = []
    for size, samples in zip(UNEXPLAINED_SIZES, rows):
        case = Case(f"miss unexplained, {size} signatures cached", Side(f"{size} signatures", lambda: None, ()),
                    Side(f"{UNEXPLAINED_ANCHOR} signatures", lambda: None, ()),
                    target=1.5 if size == TARGETED else None, note=note)
        out.append(Measurement(case, statistics.median(samples), statistics.median(anchor), tuple(samples),
                               tuple(anchor)))
    return out
