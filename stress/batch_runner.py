"""A JAX-free way for ``ftjit.BatchedFunction`` to run batches (its ``runner``), so that the batching protocol
(queues, leaders and followers, timeouts, errors, interrupts) runs where JAX is not installed: under
ThreadSanitizer, in the stress suite and in tests.

``fn`` takes one example (a number, or anything ``fn`` accepts: its first leaf, as the core flattens it, is what
a batch stacks); a batch is one call of a jitted function of the stacked examples, a tuple, padded to its size
with the first example: compiled once per (size, signature) by ``ftjit.jit`` with an identity compiler, so
compile-once and the cache hold as with JAX. Hooks let a test hold a batch (``gate``), fail one (``fail_when``:
a predicate of the examples), or interrupt it. The runner protocol (``alone``, ``batch``, ``row``, ``fallback``,
``per_call``): see cpp/batch/batcher.cc.

Shared state: ``batches`` (the examples of every batch run, in order) and ``calls_alone`` are guarded by
``lock``; ``per_call`` is never written here (a dict: signatures whose calls run alone).
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Optional, Sequence

import ftjit

__all__ = ["RowsRunner"]


def _identity_compiler(fun: Callable[..., Any], args: tuple, kwargs: dict) -> Callable[..., Any]:
    return fun


class RowsRunner:
    """A BatchedFunction's runner without JAX (see the module docstring)."""

    def __init__(self, fn: Callable[..., Any], cache: Optional[ftjit.FunctionCache] = None,
                 gate: Optional[threading.Event] = None,
                 fail_when: Optional[Callable[[Sequence[Any]], bool]] = None) -> None:
        self.fn = fn
        self.gate = gate
        self.fail_when = fail_when
        self.lock = threading.Lock()
        self.batches: list[tuple[Any, ...]] = []  # guarded by lock
        self.calls_alone = 0  # guarded by lock
        self.per_call: dict[Any, None] = {}
        cache = cache if cache is not None else ftjit.FunctionCache()
        self.one = ftjit.jit(fn, compiler=_identity_compiler, cache=cache)

        def rows(stacked: tuple) -> list[Any]:
            return [fn(x) for x in stacked]

        rows.__name__ = rows.__qualname__ = f"rows_of_{getattr(fn, '__name__', 'fn')}"
        self.many = ftjit.jit(rows, compiler=_identity_compiler, cache=cache)

    def alone(self, args: tuple, kwargs: dict) -> Any:
        with self.lock:
            self.calls_alone += 1
        return self.one(*args, **kwargs)

    def fallback(self, args: tuple, kwargs: dict) -> Any:
        return self.one(*args, **kwargs)

    def batch(self, key: Any, args: tuple, kwargs: dict, columns: list, size: int) -> list[Any]:
        xs = tuple(columns[0])
        with self.lock:
            self.batches.append(xs)
        if self.gate is not None:
            self.gate.wait(60)
        if self.fail_when is not None and self.fail_when(xs):
            raise ValueError(f"a batch of {list(xs)} failed")
        return self.many(xs + (xs[0],) * (size - len(xs)))

    def row(self, out: Any, i: int) -> Any:
        return out[i]

    def clear(self) -> None:
        self.one.clear_cache()
        self.many.clear_cache()

    def warmup(self, specs: Any, workers: int, strict: bool, progress: Any) -> Any:
        return self.one.warmup(specs, workers=workers, strict=strict, progress=progress)
