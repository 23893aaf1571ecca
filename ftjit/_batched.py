"""``ftjit.batched``: concurrent calls of one function, each with one example, merged into one call of a batch.

A threaded server's worker threads each hold one request and call the model with one example; on an
accelerator every call pays a launch and a device round trip. ``batched(fn)`` lets those threads share calls:
calls of one signature (``JitFunction._call_key``: tree, shapes, dtypes, statics and context, exactly what
``ftjit.jit`` compiles for) wait in one queue; one of them, the *leader*, takes up to ``max_batch`` of them,
stacks their examples along a new leading axis, pads the stack to the next size in ``sizes`` and calls
``jax.vmap(fn)`` (compiled by ``ftjit.jit``, once per size), then hands each caller its own row.

There is no thread of its own: the callers themselves lead and follow, so nothing runs once the batched
function is gone. The protocol (one ``_Queue`` per signature; each field under the queue's lock):

- A call that finds its queue empty, no batch forming and no batch running goes at once, alone, through
  ``ftjit.jit(fn)``: a lone caller is never held back.
- Otherwise it joins the pending calls; the first to join while none leads becomes the leader. The leader
  takes the pending calls when ``max_batch`` of them wait, when no batch is running (the device is idle: go
  now), or once it waited ``max_wait`` and fewer than two batches run (the next batch forms while one runs:
  pipelined). Calls left over make the first of them the next leader.
- The leader runs its batch, unlocked; while it runs, the next batch forms under the next leader. It hands
  each follower its row and wakes it (each follower waits on a lock of its own, released once).
- A batch's error reaches every caller of that batch (each raises its own copy, of the same type), and no
  other. A leader interrupted by Ctrl-C (any BaseException that is no Exception) puts its followers back in
  the queue, where the first becomes the next leader: another thread's interrupt fails nobody else.
- A call waits at most ``timeout`` seconds for its result (then ``BatchTimeoutError``, for that caller alone:
  a pending example is taken out, a running one's row is dropped), and answers Ctrl-C while it waits (its
  lock is taken in slices of 100 ms). The leader's own timeout counts while it collects; its batch, once
  running, runs to the end.

Shared state: ``_live`` (a WeakSet of every BatchedFunction, for ``ftjit.stats()``) is guarded by
``_live_lock``; a BatchedFunction's ``_queues`` dict is written under ``_queues_lock`` (read without it: a
dict lookup is atomic); each queue's fields under its own ``cond``; a waiter's fields are written by the
thread that decides its fate under the queue's lock, and read by its own thread after its gate opens.

Lock order: a queue's lock is a leaf (nothing else is taken under it: the batch and every executable run
unlocked); ``_queues_lock`` and ``_live_lock`` are leaves too.
"""

from __future__ import annotations

import copy
import dataclasses
import threading
import time
import weakref
from typing import Any, Callable, Iterable, Sequence

from .errors import BatchTimeoutError

__all__ = ["BatchInfo", "BatchedFunction", "batched"]

#: Batches of one signature running at once: two, so that the next forms and starts while one finishes.
_MAX_RUNNING = 2
#: How often a waiting call wakes to run signal handlers (Ctrl-C), as compile waits do.
_SLICE_S = 0.1

_PENDING, _TAKEN, _DONE, _LEAD, _GONE = range(5)


@dataclasses.dataclass(frozen=True)
class BatchInfo:
    """A snapshot of a batched function's counters (``BatchedFunction.batch_info()``); each field is read under
    its queue's lock, the whole is not one cut across queues."""

    name: str
    calls: int  #: every call, whichever way it ran
    batches: int  #: calls of the batched program (two examples or more)
    alone: int  #: calls that ran by themselves (nothing forming or running, or one left in a batch)
    mean_batch_size: float  #: examples per batch (alone calls not included)
    padded_rows: int  #: rows added to reach a size of ``sizes`` (never seen by a caller)
    waited_seconds: float  #: time calls spent waiting for their batch to start (followers and leaders)
    timeouts: int  #: calls that gave up (``BatchTimeoutError``)
    failed_batches: int  #: batches (or alone calls) that raised
    fallback: int  #: calls that took ftjit.jit's fallback (a JAX trace active, tracers: never batched)
    sizes: tuple[tuple[int, int], ...]  #: (examples in a batch, how many batches had that many), ascending
    compiles: int = 0  #: programs compiled (the example's, and the batch's at each size): both ftjit.jit's

    def __str__(self) -> str:
        hist = ", ".join(f"{n}: {count}" for n, count in self.sizes) or "none"
        return (f"{self.name}: {self.calls} calls, {self.batches} batches (mean {self.mean_batch_size:.1f} "
                f"examples, {self.padded_rows} padded rows), {self.alone} alone, {self.timeouts} timeouts, "
                f"{self.failed_batches} failed, waited {self.waited_seconds:.3f} s, {self.compiles} compiles; "
                f"batch sizes {hist}")


class _Waiter:
    """One call in a queue. ``gate`` is taken at birth and released once, by whoever decides its fate (its
    batch's leader: DONE; a leader that promotes it: LEAD)."""

    __slots__ = ("args", "kwargs", "timeout", "gate", "state", "result", "error", "t0")

    def __init__(self, args: tuple, kwargs: dict, timeout: float | None) -> None:
        self.args, self.kwargs, self.timeout = args, kwargs, timeout
        self.gate = threading.Lock()
        self.gate.acquire()
        self.state = _PENDING
        self.result: Any = None
        self.error: BaseException | None = None
        self.t0 = time.monotonic()


class _Queue:
    """The calls of one signature. Every field is guarded by ``cond`` (its lock)."""

    __slots__ = ("cond", "pending", "leading", "running", "calls", "batches", "alone", "examples", "padded",
                 "waited", "timeouts", "failed", "sizes")

    def __init__(self) -> None:
        self.cond = threading.Condition(threading.Lock())
        self.pending: list[_Waiter] = []
        self.leading = False  # a leader collects the pending calls
        self.running = 0  # batches (and alone calls) running now
        self.calls = self.batches = self.alone = self.examples = self.padded = self.timeouts = self.failed = 0
        self.waited = 0.0
        self.sizes: dict[int, int] = {}

    def promote_locked(self) -> None:
        """The first pending call leads next (or none does, when none is pending)."""
        if self.pending:
            first = self.pending[0]
            first.state = _LEAD
            first.gate.release()
        else:
            self.leading = False

    def finished_locked(self) -> None:
        self.running -= 1
        self.cond.notify()  # a collecting leader: the device may be idle now


_live: "weakref.WeakSet[BatchedFunction]" = weakref.WeakSet()  # guarded by _live_lock
_live_lock = threading.Lock()


def live_batched() -> list[BatchedFunction]:
    """Every live BatchedFunction (for ``ftjit.stats()``)."""
    with _live_lock:
        return list(_live)


def _copy_error(error: BaseException) -> BaseException:
    """This caller's own copy of its batch's error (same type; the original as its cause), so that threads
    raising at once never write one exception's traceback; the original itself when it cannot be copied."""
    try:
        mine = copy.copy(error)
    except Exception:  # noqa: BLE001 - a type copy cannot rebuild: the shared one, as a last resort
        return error
    if type(mine) is not type(error):
        return error
    mine.__cause__ = error
    return mine


class BatchedFunction:
    """``fn`` called with one example, its calls from many threads merged into calls of a batch (see the
    module docstring and ``ftjit.batched``). Thread-safe: any number of threads may call it at once."""

    def __init__(self, fn: Callable[..., Any], *, max_batch: int, max_wait: float, sizes: Sequence[int] | None,
                 to_host: bool, timeout: float | None, static_argnums: Sequence[int], static_argnames: Sequence[str],
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

            runner = JaxBatches(fn, self.sizes, self.to_host, tuple(static_argnums), tuple(static_argnames),
                                jit_options)
        self._runner = runner
        self._key = runner.one._call_key
        self._queues: dict[Any, _Queue] = {}  # written under _queues_lock
        self._queues_lock = threading.Lock()
        self._fallback = 0  # guarded by _queues_lock
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
        key = self._key(*args, **kwargs)
        if key is None:  # the compiler's fallback (a JAX trace active, tracers): one example, not batched
            with self._queues_lock:
                self._fallback += 1
            return self._runner.one(*args, **kwargs)
        q = self._queues.get(key)
        if q is None:
            with self._queues_lock:
                q = self._queues.setdefault(key, _Queue())
        deadline = None if timeout is None else time.monotonic() + timeout
        w: _Waiter | None = None
        with q.cond:
            q.calls += 1
            if q.running == 0 and not q.leading:  # nothing forming, nothing running: at once
                q.running += 1
                q.alone += 1
            else:
                w = _Waiter(args, kwargs, timeout)
                q.pending.append(w)
                if len(q.pending) >= self.max_batch:
                    q.cond.notify()
                if not q.leading:
                    q.leading = True
                    w.state = _LEAD
        if w is None:
            return self._alone(q, args, kwargs)
        if w.state == _LEAD:
            return self._lead(q, w, deadline)
        return self._follow(q, w, deadline)

    def _alone(self, q: _Queue, args: tuple, kwargs: dict) -> Any:
        try:
            return self._runner.alone(args, kwargs)
        except Exception:
            with q.cond:
                q.failed += 1
            raise
        finally:
            with q.cond:
                q.finished_locked()

    def _follow(self, q: _Queue, w: _Waiter, deadline: float | None) -> Any:
        try:
            while True:
                slice_s = _SLICE_S if deadline is None else max(0.0, min(_SLICE_S, deadline - time.monotonic()))
                if w.gate.acquire(timeout=slice_s):
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    with q.cond:
                        if w.state in (_DONE, _LEAD):
                            w.gate.acquire()  # released just now: ours after all
                            break
                        self._give_up_locked(q, w, timed_out=True)
                    raise BatchTimeoutError(
                        f"{self.__name__}(): no result within timeout={w.timeout:g} s "
                        f"(this call's example is dropped; the other calls of its batch carry on)")
        except BatchTimeoutError:
            raise
        except BaseException:
            with q.cond:  # interrupted (Ctrl-C) while waiting: out of the queue, leadership handed on
                if w.state not in (_DONE, _GONE):
                    self._give_up_locked(q, w, timed_out=False)
            raise
        if w.state == _LEAD:
            return self._lead(q, w, deadline)
        if w.error is not None:
            raise _copy_error(w.error)
        return w.result

    @staticmethod
    def _give_up_locked(q: _Queue, w: _Waiter, timed_out: bool) -> None:
        """``w`` stops waiting (its timeout, an interrupt): a pending one leaves the queue (a leading one
        hands the lead on), a running one's row will be dropped."""
        if w.state in (_PENDING, _LEAD):
            q.pending.remove(w)
            if w.state == _LEAD:
                q.promote_locked()
        w.state = _GONE
        q.timeouts += timed_out


    def _lead(self, q: _Queue, w: _Waiter, deadline: float | None) -> Any:
        collect_until = time.monotonic() + self.max_wait
        try:
            with q.cond:
                while True:
                    now = time.monotonic()
                    if (len(q.pending) >= self.max_batch or q.running == 0
                            or (now >= collect_until and q.running < _MAX_RUNNING)):
                        break
                    if deadline is not None and now >= deadline:
                        self._give_up_locked(q, w, timed_out=True)
                        raise BatchTimeoutError(
                            f"{self.__name__}(): no result within timeout={w.timeout:g} s "
                            "(its batch had not started; the other calls wait for the next one)")
                    until = collect_until if now < collect_until else now + _SLICE_S  # else: a batch must end
                    if deadline is not None:
                        until = min(until, deadline)
                    q.cond.wait(min(_SLICE_S, max(0.0, until - now)))
                batch = q.pending[: self.max_batch]
                del q.pending[: self.max_batch]
                now = time.monotonic()
                for b in batch:
                    b.state = _TAKEN
                    q.waited += now - b.t0
                q.running += 1
                q.promote_locked()
        except BaseException:
            with q.cond:
                if w.state == _LEAD:  # interrupted while collecting: the lead goes to the next pending call
                    self._give_up_locked(q, w, timed_out=False)
            raise
        return self._run(q, w, batch)

    def _run(self, q: _Queue, w: _Waiter, batch: list[_Waiter]) -> Any:
        size = next(s for s in self.sizes if s >= len(batch)) if len(batch) > 1 else 1
        try:
            if len(batch) == 1:
                results = [self._runner.alone(w.args, w.kwargs)]
            else:
                results = self._runner.batch([(b.args, b.kwargs) for b in batch], size)
        except Exception as error:
            with q.cond:
                q.finished_locked()
                q.failed += 1
                self._count_batch_locked(q, len(batch), size)
                woken = [b for b in batch if b is not w and b.state == _TAKEN]
                for b in woken:
                    b.error, b.state = error, _DONE
            for b in woken:  # after the lock: a woken caller that calls again must not wait for it
                b.gate.release()
            raise
        except BaseException:
            with q.cond:  # this thread was interrupted: the others go back to the queue, unharmed
                q.finished_locked()
                others = [b for b in batch if b is not w and b.state == _TAKEN]
                for b in others:
                    b.state = _PENDING
                q.pending[:0] = others
                if others and not q.leading:
                    q.leading = True
                    q.promote_locked()
            raise
        with q.cond:
            q.finished_locked()
            self._count_batch_locked(q, len(batch), size)
            woken = []
            for b, r in zip(batch, results):
                if b is not w and b.state == _TAKEN:
                    b.result, b.state = r, _DONE
                    woken.append(b)
        for b in woken:  # after the lock: a woken caller that calls again must not wait for it
            b.gate.release()
        return results[batch.index(w)]

    def _count_batch_locked(self, q: _Queue, n: int, size: int) -> None:
        if n == 1:
            q.alone += 1
            return
        q.batches += 1
        q.examples += n
        q.padded += size - n
        q.sizes[n] = q.sizes.get(n, 0) + 1

    # -- observing, warming up ----------------------------------------------------------------------------------
    def batch_info(self) -> BatchInfo:
        """A snapshot of the counters (see BatchInfo)."""
        with self._queues_lock:
            queues = list(self._queues.values())
            fallback = self._fallback
        totals = dict(calls=0, batches=0, alone=0, examples=0, padded=0, timeouts=0, failed=0)
        waited = 0.0
        sizes: dict[int, int] = {}
        for q in queues:
            with q.cond:
                for field in totals:
                    totals[field] += getattr(q, field)
                waited += q.waited
                for n, count in q.sizes.items():
                    sizes[n] = sizes.get(n, 0) + count
        batches = totals["batches"]
        compiles = self._runner.one.cache_info().compiles + self._runner.many.cache_info().compiles
        return BatchInfo(self.__name__, totals["calls"] + fallback, batches, totals["alone"],
                         totals["examples"] / batches if batches else 0.0, totals["padded"], waited,
                         totals["timeouts"], totals["failed"], fallback, tuple(sorted(sizes.items())), compiles)

    def warmup(self, specs: Iterable[Any], workers: int = 1, strict: bool = False,
               progress: Any = None) -> Any:
        """Compiles, for each spec of one example (a tuple of positional arguments, or ``ftjit.Spec``; arrays
        may be ``jax.ShapeDtypeStruct``), the example's own signature and the batched program at every size
        of ``sizes``, so that no call of traffic compiles. Returns one WarmupReport (see
        ``JitFunction.warmup``)."""
        return self._runner.warmup(specs, workers, strict, progress)

    def clear_cache(self) -> None:
        """Drops the compiled programs (the example's and every batch size's); queued calls carry on."""
        self._runner.one.clear_cache()
        self._runner.many.clear_cache()

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
            to_host: bool = True, timeout: float | None = None, static_argnums: int | Sequence[int] = (),
            static_argnames: str | Sequence[str] = (), **jit_options: Any) -> Any:
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
    rows each read back to the host took 24 times as long as one copy of the batch: docs/behaviour.md). ``timeout`` (seconds)
    bounds each call's wait for its result (``BatchTimeoutError``). Other keywords go to ``ftjit.jit``
    (``cache``, ``compile_timeout``, ``explain_misses``, ...). Usable as ``@batched(max_batch=32)``.

    Thread-safety: see the module docstring of ftjit._batched; ``batch_info()`` is a snapshot.
    """
    statics_n = (static_argnums,) if isinstance(static_argnums, int) else tuple(static_argnums)
    statics_s = (static_argnames,) if isinstance(static_argnames, str) else tuple(static_argnames)

    def make(f: Callable[..., Any]) -> BatchedFunction:
        return BatchedFunction(f, max_batch=max_batch, max_wait=max_wait, sizes=sizes, to_host=to_host,
                               timeout=timeout, static_argnums=statics_n, static_argnames=statics_s, **jit_options)

    return make if fn is None else make(fn)
