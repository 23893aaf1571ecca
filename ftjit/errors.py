"""ftjit's error classes. Each subclasses the builtin a caller would catch.

No shared state; no locks.
"""

from __future__ import annotations

__all__ = [
    "UnhashableStaticArgumentError",
    "UnsupportedArgumentError",
    "RecursiveCompileError",
    "CompileCycleError",
    "CompileTimeoutError",
    "RecompileLimitError",
    "BatchTimeoutError",
]


class UnhashableStaticArgumentError(TypeError, ValueError):
    """A static argument has no usable ``__hash__``.

    Both a ``TypeError`` and a ``ValueError``, so code written against either
    (JAX has raised both over its history) catches it. The message names the
    argument's position or name; the original error is the ``__cause__``.
    """


class UnsupportedArgumentError(TypeError):
    """A dynamic argument is not an array, scalar, or pytree of them.

    The message names the argument (and the path inside it) and suggests
    marking it static with ``static_argnums``/``static_argnames``.
    """


class RecursiveCompileError(RecursionError):
    """A thread re-entered the compile of the very signature it is compiling."""


class CompileCycleError(RecursionError):
    """Compiles in several threads wait on each other in a cycle.

    Raised in one of the threads of the cycle instead of deadlocking them all.
    """


class CompileTimeoutError(TimeoutError):
    """A thread gave up waiting for another thread's compile (``compile_timeout``).

    The compile itself carries on; later calls use its result.
    """


class RecompileLimitError(RuntimeError):
    """A function hit ``max_signatures`` with ``on_excess="raise"``.

    Raised instead of compiling a new signature; the message explains how the
    call differs from the closest cached signature.
    """


class BatchTimeoutError(TimeoutError):
    """A call of an ``ftjit.batched`` function waited longer than its ``timeout`` for its result.

    Raised in that caller alone: its example leaves the queue (or its row is
    dropped, when its batch already runs); the other calls carry on.
    """
