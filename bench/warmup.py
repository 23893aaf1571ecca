"""Parallel warm-up: wall time of fn.warmup(specs, workers=N) vs workers=1 over fresh signatures of a JAX MLP."""

from __future__ import annotations

import itertools
import os
import time
from typing import Any, Callable

from .cases import Case, Side
from .timing import Measurement

LAYERS = 8
WIDTH = 64
_serial = itertools.count()  # names the MLPs apart in ftjit.stats() and logs


def make_mlp(salt: float) -> Callable[..., Any]:
    """A fresh 8-layer MLP function (a new object, so no JAX trace or compile cache can serve it).

    Its XLA compile takes ~0.1-0.3 s per batch size on a laptop-class CPU,
    most of it in XLA with the GIL released; tracing and lowering hold it.
    """
    import jax
    import jax.numpy as jnp

    def mlp(params: list[tuple[Any, Any]], x: Any) -> Any:
        h = x
        for w, b in params:
            h = jax.nn.gelu(h @ w + b) + salt
            h = h / (1 + jnp.linalg.norm(h, axis=-1, keepdims=True))
        return jax.nn.log_softmax(h, axis=-1)

    mlp.__name__ = mlp.__qualname__ = f"bench_mlp_{next(_serial)}"
    return mlp


def specs(signatures: int) -> list[tuple[Any, ...]]:
    """``signatures`` warm-up specs (jax.ShapeDtypeStruct): batch sizes 1..signatures, the same parameters."""
    import jax
    import numpy as np

    params = [(jax.ShapeDtypeStruct((WIDTH, WIDTH), np.float32), jax.ShapeDtypeStruct((WIDTH,), np.float32))] * LAYERS
    return [(params, jax.ShapeDtypeStruct((batch, WIDTH), np.float32)) for batch in range(1, signatures + 1)]


def warm_fresh(workers: int, signatures: int, salt: float) -> tuple[float, float]:
    """(wall, process CPU) seconds of one fn.warmup of ``signatures`` specs with ``workers`` threads, on a fresh
    function and cache.

    Raises RuntimeError if a spec failed or anything but one compile per spec happened.
    """
    import ftjit

    fn = ftjit.jit(make_mlp(salt), cache=ftjit.FunctionCache(capacity=max(16, signatures)))
    todo = specs(signatures)
    cpu0 = time.process_time()
    report = fn.warmup(todo, workers=workers, progress=False)
    cpu = time.process_time() - cpu0
    if not report.ok:
        raise RuntimeError(f"bench warmup failed:\n{report}")
    if report.workers != workers:  # e.g. warmup fell back to this thread: the row would compare a loop with a loop
        raise RuntimeError(f"bench warmup ran with {report.workers} worker(s), asked for {workers}")
    compiles = fn.cache_info().compiles
    if compiles != signatures or not all(r.compiled for r in report.results):
        raise RuntimeError(f"bench warmup compiled {compiles} signatures, expected {signatures}:\n{report}")
    return report.wall_seconds, cpu


def warmup_measurement(signatures: int = 8, workers: int = 4, repeat: int = 2) -> Measurement:
    """The table row: per-signature wall ms of ``workers`` threads vs one, best of ``repeat`` runs each.

    The two sides alternate which goes first; every run jits a new function,
    so every run compiles all ``signatures`` signatures from scratch.
    """
    if signatures < 1 or workers < 2 or repeat < 1:
        raise ValueError(f"need signatures >= 1, workers >= 2, repeat >= 1; got {signatures}, {workers}, {repeat}")
    # JAX's first compiles in a process pay one-time set-up (and per-shape
    # traces of the jnp helpers the MLP calls): keep them out of both sides.
    warm_fresh(1, signatures, salt=-1.0)
    parallel: list[float] = []
    loop: list[float] = []
    loop_cores: list[float] = []  # CPU seconds / wall seconds of each loop run: cores it kept busy
    salt = 0.0
    for r in range(repeat):
        for n in ((workers, 1) if r % 2 == 0 else (1, workers)):
            salt += 1.0
            wall, cpu = warm_fresh(n, signatures, salt)
            (parallel if n == workers else loop).append(wall / signatures * 1e9)
            if n == 1:
                loop_cores.append(cpu / wall)
    cores = os.cpu_count() or 1
    busy = loop_cores[loop.index(min(loop))]  # of the best loop run, the one in the table
    case = Case(
        f"jax: warmup {signatures} signatures, {workers} workers",
        Side(f"warmup workers={workers}", warm_fresh, (workers, signatures, 0.0)),
        Side("workers=1 (loop)", warm_fresh, (1, signatures, 0.0)),
        target=1.0,
        unit="ms",
        note=(f"ms per signature (wall time of fn.warmup / {signatures}), a fresh {LAYERS}-layer MLP each run, "
              f"best run of each side; target: faster than a loop. Ideal on {cores} CPU core(s): ~{1 / min(workers, cores):.2f}x, "
              f"less as XLA compiles on threads of its own; the loop kept {busy:.1f} core(s) busy "
              "(CPU s / wall s, under 1 when other processes compete)"),
    )
    return Measurement(case, min(parallel), min(loop), tuple(parallel), tuple(loop), thread="main")
