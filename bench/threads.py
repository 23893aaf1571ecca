"""Two threads hammering one jitted function: aggregate ns/call of ftjit vs jax.jit, measured in one run."""

from __future__ import annotations

import dataclasses
import statistics
import threading
import time
from typing import Any, Callable

try:  # voluntary context switches (blocking waits); absent on Windows
    import resource
except ImportError:  # pragma: no cover
    resource = None  # type: ignore[assignment]

from .cases import Case, Side, _add
from .timing import Measurement


def _blocking_waits() -> int:
    """This process's voluntary context switches so far (0 where unknown)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw if resource is not None else 0


def _hammer(fn: Callable[..., Any], args: tuple[Any, ...], threads: int, calls: int) -> tuple[float, float]:
    """Wall ns per call when `threads` threads each make `calls` calls, released
    together, and the blocking waits (voluntary context switches) per call."""
    barrier = threading.Barrier(threads + 1)
    errors: list[BaseException] = []

    def work() -> None:
        try:
            barrier.wait()
            for _ in range(calls):
                fn(*args)
        except BaseException as exc:  # re-raised below
            errors.append(exc)

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for w in workers:
        w.start()
    waits0 = _blocking_waits()
    barrier.wait()
    t0 = time.perf_counter_ns()
    for w in workers:
        w.join(timeout=600)
    elapsed = time.perf_counter_ns() - t0
    waits = _blocking_waits() - waits0
    if errors:
        raise errors[0]
    if any(w.is_alive() for w in workers):
        raise RuntimeError("benchmark thread hung")
    return elapsed / (threads * calls), waits / (threads * calls)


def two_thread_measurement(calls: int, repeat: int) -> Measurement:
    import jax
    import jax.numpy as jnp

    import ftjit

    x = jnp.arange(4, dtype=jnp.float32)
    ours = ftjit.jit(_add, cache=ftjit.FunctionCache(capacity=4))
    theirs = jax.jit(_add)
    ours(x, x)
    theirs(x, x)
    case = Case("jax: 2 threads hammering x+y", Side("ftjit.jit", ours, (x, x)), Side("jax.jit", theirs, (x, x)),
                target=1 / 0.9, goal=1.00,
                note="aggregate wall ns/call of 2 threads; target = throughput >= 0.9x jax.jit's")
    ft: list[float] = []
    an: list[float] = []
    ft_waits: list[float] = []
    an_waits: list[float] = []
    sides = ((ours, ft, ft_waits), (theirs, an, an_waits))
    for r in range(repeat):
        for fn, ns_out, waits_out in (sides if r % 2 == 0 else sides[::-1]):
            ns, waits = _hammer(fn, (x, x), threads=2, calls=calls)
            ns_out.append(ns)
            waits_out.append(waits)
    if resource is not None:
        # Under the GIL the two threads mostly take turns; what the row costs
        # beyond the GIL-held work shows in how often a thread blocks.
        case = dataclasses.replace(case, note=case.note + (
            f"; blocking waits per call (median): ftjit {statistics.median(ft_waits):.2f}, "
            f"jax.jit {statistics.median(an_waits):.2f}"))
    return Measurement(case, min(ft), min(an), tuple(ft), tuple(an))
