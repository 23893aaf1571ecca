"""``ftjit.batched``: concurrent calls of one function, each with one example, merged into one call of a batch.

A threaded server's worker threads each hold one request and call the model with one example; on an
accelerator every call pays a launch and a device round trip. ``batched(fn)`` lets those threads share calls:
calls of one signature (``JitFunction._batch_key``: tree, shapes, dtypes, weak types, statics and context,
exactly what ``ftjit.jit`` compiles for) wait in one queue; one of them, the *leader*, takes up to ``max_batch``
of them, stacks each leaf of their examples along a new leading axis, pads the stack to the next size in
``sizes`` and calls ``jax.vmap(fn)`` (compiled by ``ftjit.jit``, once per size), then wakes each caller, which
takes its own row.

There is no thread of its own: the callers themselves lead and follow, so nothing runs once the batched
function is gone. The protocol is the core's (``_core._BatchQueue``; cpp/primitives/batch_queue.h), one C++ call
per call, so that neither a signal nor a fork can leave its state half-changed:

- A call that finds its queue empty, no batch forming and no batch running goes at once, alone, through
  ``ftjit.jit(fn)``: a lone caller is never held back.
- Otherwise it waits as a pending call; the first to wait while none leads becomes the leader. The leader takes
  the pending calls when ``max_batch`` of them wait, when no batch is running (the device is idle: go now), or
  once it waited ``max_wait`` and fewer than two batches run (the next batch forms while one runs: pipelined).
  Calls left over make the first of them the next leader. A batch (or lone call) that has run ten times this
  function's mean run, at least 1 s and at most 5 s (5 s before any run ended), no longer counts as running:
  an example that never finishes holds its own batch's callers (and its thread), never the signature's later
  calls.
- The leader runs its batch; while it runs, the next batch forms under the next leader. Each caller is woken on
  a word of its own and takes its row in its own thread (in parallel, with the GIL off).
- A batch that fails runs again example by example, each caller alone in its own thread: a caller gets its own
  result or its own error, as a lone call gives it, never another example's. A leader interrupted by Ctrl-C
  (any BaseException that is no Exception) puts its followers back in the queue, where the first becomes the
  next leader: another thread's interrupt fails nobody else.
- A call waits at most ``timeout`` seconds for its batch (then ``BatchTimeoutError``, for that caller alone: a
  pending example is taken out, a running one's row is dropped), and answers Ctrl-C while it waits (it wakes
  every 100 ms to run signal handlers). A call that runs (alone, or leading its batch once it started) runs to
  the end: ``timeout`` bounds the wait for a batch, not a computation.
- A queue closes when it is idle (nothing pending, leading or running) and goes, however its last call ended
  (a result, an error, a timeout, Ctrl-C); the next call of its signature makes a new one. So queues follow the
  signatures in use, not every signature ever seen.
- In a forked child every queue of the parent is closed (its waiters do not exist there): calls make new ones.

Shared state: ``_live`` (a WeakSet of every BatchedFunction, for ``ftjit.stats()``) is guarded by
``_live_lock`` (made anew in a forked child); the queues of a BatchedFunction, by signature, are the core's
(``_core._Batcher.call``: a dict read and written with single operations, a closed queue taken out by the call
that saw it close, however that call ended), each queue's state is the core's, under its own lock; so are the
counters.

Lock order: ``_live_lock`` is a leaf; a queue's lock is the core's (a leaf, taken around Python-free steps).
"""

from __future__ import annotations

import dataclasses
import os
import threading
import types
import weakref
from typing import Any, Callable, Iterable, Sequence

from ._core import _Batcher
from .errors import BatchTimeoutError

__all__ = ["BatchInfo", "BatchedFunction", "batched"]

#: Batches of one signature running at once: two, so that the next forms and starts while one finishes.
_MAX_RUNNING = 2


@dataclasses.dataclass(frozen=True)
class BatchInfo:
    """A snapshot of a batched function's counters (``BatchedFunction.batch_info()``); each field is read
    atomically, the whole is not one instant's."""

    name: str
    calls: int  #: every call, whichever way it ran
    batches: int  #: calls of the batched program (two examples or more)
    alone: int  #: calls that ran by themselves (nothing forming or running, one left in a batch, or not batchable)
    mean_batch_size: float  #: examples per batch (alone calls not included)
    padded_rows: int  #: rows added to reach a size of ``sizes`` (never seen by a caller)
    waited_seconds: float  #: time calls spent waiting for their batch to start (followers and leaders)
    timeouts: int  #: calls that gave up (``BatchTimeoutError``)
    failed_batches: int  #: batches and alone calls that raised an Exception (a failed batch's examples retry alone)
    fallback: int  #: calls that took ftjit.jit's fallback (a JAX trace active, tracers: never batched)
    sizes: tuple[tuple[int, int], ...]  #: (examples in a batch, how many batches had that many), ascending
    compiles: int = 0  #: programs compiled (the example's, and the batch's at each size): both ftjit.jit's
    retried: int = 0  #: examples run again alone after their batch failed (each then has its own result or error)
    interrupted: int = 0  #: calls ended by a BaseException that is no Exception (Ctrl-C) while they ran or waited

    def __str__(self) -> str:
        hist = ", ".join(f"{n}: {count}" for n, count in self.sizes) or "none"
        return (f"{self.name}: {self.calls} calls, {self.batches} batches (mean {self.mean_batch_size:.1f} "
                f"examples, {self.padded_rows} padded rows), {self.alone} alone, {self.timeouts} timeouts, "
                f"{self.failed_batches} failed ({self.retried} examples retried alone), {self.interrupted} "
                f"interrupted, waited {self.waited_seconds:.3f} s, {self.compiles} compiles; batch sizes {hist}")


_live: "weakref.WeakSet[BatchedFunction]" = weakref.WeakSet()  # guarded by _live_lock
_live_lock = threading.Lock()


def _reinit_live_lock() -> None:
    """In a forked child: a parent thread may have held the lock at the fork."""
    global _live_lock
    _live_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reinit_live_lock)


def live_batched() -> list[BatchedFunction]:
    """Every live BatchedFunction (for ``ftjit.stats()``)."""
    with _live_lock:
        return list(_live)


class BatchedFunction:
    """``fn`` called with one example, its calls from many threads merged into calls of a batch (see the
    module docstring and ``ftjit.batched``). Thread-safe: any number of threads may call it at once."""

    def __init__(self, fn: Callable[..., Any], *, max_batch: int, max_wait: float, sizes: Sequence[int] | None,
                 to_host: bool, timeout: float | None, static_argnums: Any = None, static_argnames: Any = None,
                 runner: Any = None, **jit_options: Any) -> None:
        if not callable(fn):
            raise TypeError(f"batched() needs a callable, got {fn!r}")
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise ValueError(f"max_batch must be an int >= 1, got {max_batch!r}")
        if isinstance(max_wait, bool) or not isinstance(max_wait, (int, float)) or not 0 <= max_wait <= 60:
            raise ValueError(f"max_wait must be a number of seconds in [0, 60], got {max_wait!r}")
        self.max_batch = max_batch
        self.max_wait = float(max_wait)
        self.sizes = _check_sizes(sizes, max_batch)
        self.to_host = bool(to_host)
        self.timeout = _check_timeout(timeout)
        self.__wrapped__ = fn
        self.__name__ = getattr(fn, "__name__", "batched")
        self.__qualname__ = getattr(fn, "__qualname__", self.__name__)
        self.__doc__ = getattr(fn, "__doc__", None)
        if runner is None:
            from ._batch_jax import JaxBatches

            # The statics as given: ftjit.jit resolves them (names to positions and back) as jax.jit does, which
            # a normalised () in place of None would stop.
            runner = JaxBatches(fn, self.sizes, self.to_host, static_argnums, static_argnames, jit_options)
        self._runner = runner
        self._key = runner.one._batch_key
        self._batcher = _Batcher(self.__name__, max_batch, self.max_wait, list(self.sizes), _MAX_RUNNING,
                                       BatchTimeoutError)
        with _live_lock:
            _live.add(self)

    # -- calling ----------------------------------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` for this one example, computed in a batch with other threads' examples of the
        same signature when there are any (see the module docstring)."""
        return self._call(args, kwargs, self.timeout)

    def call(self, *args: Any, timeout: float | None = None, **kwargs: Any) -> Any:
        """As calling it, with this call's own ``timeout`` (seconds; None: the function's)."""
        return self._call(args, kwargs, self.timeout if timeout is None else _check_timeout(timeout))

    def _call(self, args: tuple, kwargs: dict, timeout: float | None) -> Any:
        found = self._key(*args, **kwargs)
        if found is None:  # the compiler's fallback (a JAX trace active, tracers): one example, not batched
            return self._batcher.run(True, self._runner.fallback, args, kwargs)
        key, leaves = found
        if not leaves or key in self._runner.per_call:  # nothing to stack, or a program vmap cannot make
            return self._batcher.run(False, self._runner.alone, args, kwargs)
        return self._batcher.call(self._runner, key, leaves, args, kwargs, timeout)

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        """As a method: bound to the instance, which is then the first argument (as ``jax.jit`` binds)."""
        if obj is None:
            return self
        return types.MethodType(self, obj)

    @property
    def _queues(self) -> dict[Any, Any]:
        """The queues now, by signature key (tests, diagnostics): the core's dict, not a copy."""
        return self._batcher.queues

    # -- observing, warming up ----------------------------------------------------------------------------------
    def batch_info(self) -> BatchInfo:
        """A snapshot of the counters (see BatchInfo)."""
        c = self._batcher.info()
        compiles = self._runner.one.cache_info().compiles + self._runner.many.cache_info().compiles
        batches = c["batches"]
        return BatchInfo(self.__name__, c["calls"], batches, c["alone"], c["examples"] / batches if batches else 0.0,
                         c["padded"], c["waited_seconds"], c["timeouts"], c["failed"], c["fallback"], c["sizes"],
                         compiles, c["retried"], c["interrupted"])

    def warmup(self, specs: Iterable[Any], workers: int = 1, strict: bool = False,
               progress: Any = None) -> Any:
        """Compiles, for each spec of one example (a tuple of positional arguments, or ``ftjit.Spec``; arrays
        may be ``jax.ShapeDtypeStruct``), the example's own signature and the batched program at every size
        of ``sizes``, so that no call of traffic compiles. Returns one WarmupReport (see
        ``JitFunction.warmup``)."""
        return self._runner.warmup(specs, workers, strict, progress)

    def clear_cache(self) -> None:
        """Drops the compiled programs (the example's and every batch size's) and what the batches of each
        signature were planned with; queued calls carry on."""
        self._runner.clear()

    def __repr__(self) -> str:
        return (f"<ftjit.BatchedFunction of {self.__wrapped__!r}: max_batch={self.max_batch}, "
                f"max_wait={self.max_wait:g}, sizes={self.sizes}>")


def _check_sizes(sizes: Sequence[int] | None, max_batch: int) -> tuple[int, ...]:
    if sizes is None:
        out, s = [], 1
        while s < max_batch:
            out.append(s)
            s *= 2
        return (*out, max_batch)
    try:
        given = tuple(sizes)
    except TypeError:
        raise TypeError(f"sizes must be a sequence of ints, got {sizes!r}") from None
    if not given or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in given):
        raise ValueError(f"sizes must be ints >= 1, got {sizes!r}")
    if list(given) != sorted(set(given)):
        raise ValueError(f"sizes must increase, without repeats, got {sizes!r}")
    if given[-1] != max_batch:
        raise ValueError(f"the largest size must be max_batch={max_batch} (a full batch's size), got {sizes!r}")
    return given


def _check_timeout(timeout: float | None) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0 or timeout == float("inf"):
        raise ValueError(f"timeout must be a finite number of seconds > 0, or None, got {timeout!r}")
    return float(timeout)


def batched(fn: Any = None, /, *, max_batch: int = 64, max_wait: float = 0.001, sizes: Sequence[int] | None = None,
            to_host: bool = True, timeout: float | None = None, static_argnums: int | Sequence[int] | None = None,
            static_argnames: str | Sequence[str] | None = None, **jit_options: Any) -> Any:
    """Merges concurrent calls of ``fn``, each with one example, into calls of a batch.

    ``fn`` is written for one example (a pytree of arrays with no batch axis); ``predict = batched(fn)`` is
    called the same way, from any number of threads, and each caller gets ``fn`` of its own example. Calls
    of one signature (as ``ftjit.jit`` keys it: statics by ``static_argnums``/``static_argnames``) that
    arrive while a batch runs are stacked along a new leading axis, padded to the next of ``sizes`` (default:
    powers of two up to ``max_batch``) and run as one call of ``jax.vmap(fn)``, compiled by ``ftjit.jit``
    once per size (``warmup()`` compiles every size ahead of traffic). A call that finds nothing forming and
    nothing running goes at once, alone; the batch of calls arriving meanwhile starts when the running one
    ends, when ``max_batch`` wait, or after ``max_wait`` seconds. With ``to_host=True`` (the default) a
    batch's outputs are copied to the host once and each caller gets numpy rows (views of that copy); with
    ``to_host=False`` each gets jax Arrays, split from the batch inside the compiled program (on a TPU v5e, 64
    rows each read back to the host took 24 times as long as one copy of the batch: docs/behaviour.md). Each
    caller gets what a lone call gives (dtype, weak type, value, error, type): a batch that fails runs again
    example by example. ``timeout`` (seconds) bounds each call's wait for its batch (``BatchTimeoutError``); a
    call that runs alone or leads a started batch runs to the end. Other keywords go to ``ftjit.jit``
    (``cache``, ``compile_timeout``, ``explain_misses``, ...). Usable as ``@batched(max_batch=32)``.

    Thread-safety: see the module docstring of ftjit._batched; ``batch_info()`` is a snapshot.
    """

    def make(f: Callable[..., Any]) -> BatchedFunction:
        return BatchedFunction(f, max_batch=max_batch, max_wait=max_wait, sizes=sizes, to_host=to_host,
                               timeout=timeout, static_argnums=static_argnums, static_argnames=static_argnames,
                               **jit_options)

    return make if fn is None else make(fn)
