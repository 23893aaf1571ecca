"""The miss path's cost as a function grows: ns per miss (a new signature, compiled by a compiler that returns
the function) with 4000 signatures already compiled, against the same with 10; explanations on and logged."""

from __future__ import annotations

import logging
import statistics
import time
from typing import Any, Callable

from .cases import Case, Side, identity_compiler
from .timing import Measurement, in_thread

LARGE, SMALL = 4000, 10


def _function(prefilled: int) -> tuple[Any, Callable[[], int]]:
    """A jitted f(x, n) (n static) with ``prefilled`` signatures compiled, and a maker of fresh n's."""
    import ftjit

    def f(x: float, n: int) -> float:
        return x

    jf = ftjit.jit(f, static_argnums=1, compiler=identity_compiler, cache=ftjit.FunctionCache(capacity=1 << 16),
                   explain_misses=True)
    for n in range(prefilled):
        jf(1.0, n)
    counter = iter(range(prefilled, 1 << 62))
    return jf, lambda: next(counter)


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
        def run() -> tuple[list[float], list[float]]:
            sides = [_function(LARGE), _function(SMALL)]
            out: tuple[list[float], list[float]] = ([], [])
            for r in range(rounds):
                for i in ((0, 1) if r % 2 == 0 else (1, 0)):
                    jf, fresh = sides[i]
                    ns = [fresh() for _ in range(misses)]
                    t0 = time.perf_counter_ns()
                    for n in ns:
                        jf(1.0, n)
                    out[i].append((time.perf_counter_ns() - t0) / misses)
            return out

        large, small = in_thread("worker", run)
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
