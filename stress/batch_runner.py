"""A JAX-free way for ``ftjit.BatchedFunction`` to run batches (its ``runner``), so that the batching protocol
(queues, leaders and followers, timeouts, errors, interrupts) runs where JAX is not installed: under
ThreadSanitizer, in the stress suite and in tests.

``fn`` takes one example (a number, or anything ``fn`` accepts); a batch is one call of a jitted function of
the stacked examples, a tuple, padded to its size with the first example: compiled once per (size, signature)
by ``ftjit.jit`` with an identity compiler, so compile-once and the cache hold as with JAX. Hooks let a test
hold a batch (``gate``), fail one (``fail_when``: a predicate of the examples), or interrupt it.

Shared state: ``batches`` (the examples of every batch run, in order) and ``calls`` are guarded by ``lock``.
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

    def batch(self, examples: Sequence[tuple[tuple, dict]], size: int) -> list[Any]:
        xs = tuple(args[0] for args, _ in examples)
        with self.lock:
            self.batches.append(xs)
        if self.gate is not None:
            self.gate.wait(60)
        if self.fail_when is not None and self.fail_when(xs):
            raise ValueError(f"a batch of {list(xs)} failed")
        out = self.many(xs + (xs[0],) * (size - len(xs)))
        return out[: len(xs)]

    def warmup(self, specs: Any, workers: int, strict: bool, progress: Any) -> Any:
        return self.one.warmup(specs, workers=workers, strict=strict, progress=progress)
