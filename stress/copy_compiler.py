"""A JAX-free compiler whose executables are ThreadExecutables: copies per thread that check a context themselves.

It plays jaxlib's part without JAX (so the core's side of the protocol runs under ThreadSanitizer, where JAX is
not installed): ``compile(fun, args, kwargs)`` returns a Program of ``fun`` and the context it was compiled
under; each thread's copy caches, per context it has served, what the core's miss returned, and calls the miss
for any other. The context is per thread (``set_context``; "A" until a thread sets one), as JAX's thread-local
configs are. A compile under a context in ``fail_in`` raises ValueError, as a trace that JAX refuses does.
Counts compiles, copies made (weakly), calls served from a copy's own cache, its misses and context reads.
With ``thread_calls=True`` it also plays a call object of the whole function per thread
(``CompilerHooks.thread_call``): keyed by context, static values and argument types, it keeps what the
core's miss returned (up to ``capacity`` signatures) and serves later calls of that key itself.

Shared state: the counters and ``copies`` are guarded by ``lock``; the context is thread-local; a copy's cache
is its own thread's (a copy is only called by the thread holding it); a thread call object's cache is guarded by
its own lock (the core clears it from the clearing thread, as jaxlib's).
"""

from __future__ import annotations

import gc
import threading
import weakref
from collections import OrderedDict
from typing import Any, Callable, Iterable

import ftjit

__all__ = ["CopyCompiler", "Program"]


class Program:
    """A compiled program: ``fun``, compiled under ``context``; callable (the compiler protocol's check)."""

    __slots__ = ("fun", "context")

    def __init__(self, fun: Callable[..., Any], context: Any) -> None:
        self.fun, self.context = fun, context

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fun(*args, **kwargs)


class CopyCompiler:
    """See the module docstring. ``eager_mode`` makes every copy call its eager callback (jax.disable_jit)."""

    def __init__(self, fail_in: Iterable[Any] = (), thread_calls: bool = False) -> None:
        self.thread_calls = thread_calls
        self.local = threading.local()
        self.eager_mode = False
        self.fail_in = frozenset(fail_in)
        self.lock = threading.Lock()
        self.compiles = 0  # guarded by lock
        self.copies: list[weakref.ref[Any]] = []  # guarded by lock: every copy made
        self.served = 0  # guarded by lock
        self.misses = 0  # guarded by lock
        self.context_reads = 0  # guarded by lock
        self.call_caches: list[OrderedDict[Any, Any]] = []  # guarded by lock: each thread call object's cache

    # -- the compiler's context: per thread, "A" unless a thread says otherwise
    def set_context(self, value: Any) -> None:
        self.local.value = value

    def current(self) -> Any:
        return getattr(self.local, "value", "A")

    def context(self) -> Any:
        with self.lock:
            self.context_reads += 1
        return self.current()

    def hooks(self, fun: Callable[..., Any]) -> ftjit.CompilerHooks:
        return ftjit.CompilerHooks(context=self.context, context_names="mode", executable_for=self.executable_for,
                                   context_in_executable=True, fallback=self.fallback(fun),
                                   thread_call=self.thread_call if self.thread_calls else None)

    def fallback(self, fun: Callable[..., Any]) -> Callable[..., Any]:
        def eager(*args: Any, **kwargs: Any) -> Any:
            return ("eager", fun(*args, **kwargs))

        return eager

    def __call__(self, fun: Callable[..., Any], args: tuple, kwargs: dict) -> Program:
        context = self.current()
        with self.lock:
            self.compiles += 1
        if context in self.fail_in:
            raise ValueError(f"cannot compile under context {context!r}")
        return Program(fun, context)

    def executable_for(self, program: Program, args: tuple, kwargs: dict, leaves: tuple) -> ftjit.ThreadExecutables:
        compiler = self

        def own_miss(*args: Any, **kwargs: Any) -> tuple[Any, Any, bool]:
            return (program.context, program.fun(*args, **kwargs)), ("data of", program.context, program), False

        def make(miss: Callable[..., Any], eager: Callable[..., Any]) -> Callable[..., Any]:
            cache: dict[Any, Any] = {}

            def copy(*args: Any, **kwargs: Any) -> Any:
                if compiler.eager_mode:
                    return eager(*args, **kwargs)
                context = compiler.current()
                data = cache.get(context)
                if data is not None:
                    with compiler.lock:
                        compiler.served += 1
                    assert data[:2] == ("data of", program.context), (data, program.context)
                    return (program.context, program.fun(*args, **kwargs))
                with compiler.lock:
                    compiler.misses += 1
                out, data, drop = miss(*args, **kwargs)
                if not drop:
                    cache[context] = data
                return out

            copy.made_for = program.context  # type: ignore[attr-defined]  # the context of the program it runs
            with compiler.lock:
                compiler.copies.append(weakref.ref(copy))
            return copy

        return ftjit.ThreadExecutables(make, own_miss, False)

    def thread_call(self, miss: Callable[..., Any], eager: Callable[..., Any], static_argnums: tuple,
                    static_argnames: tuple, capacity: int) -> Callable[..., Any]:
        """A call object of the whole function for one thread (CompilerHooks.thread_call)."""
        compiler = self
        cache: OrderedDict[Any, Any] = OrderedDict()
        cache_lock = threading.Lock()  # as jaxlib's cache lock: the core clears it from any thread

        def call(*args: Any, **kwargs: Any) -> Any:
            if compiler.eager_mode:
                return eager(*args, **kwargs)
            key = (compiler.current(),
                   tuple((i, a) if i in static_argnums else type(a) for i, a in enumerate(args)),
                   tuple(sorted((k, v if k in static_argnames else type(v)) for k, v in kwargs.items())))
            with cache_lock:
                data = cache.get(key)
                if data is not None:
                    cache.move_to_end(key)
            if data is not None:
                with compiler.lock:
                    compiler.served += 1
                program = data[2]
                return (program.context, program.fun(*args, **kwargs))
            with compiler.lock:
                compiler.misses += 1
            out, data, drop = miss(*args, **kwargs)
            if not drop and data is not None:
                with cache_lock:
                    cache[key] = data
                    while len(cache) > capacity:
                        cache.popitem(last=False)
            return out

        def clear_cache() -> None:
            with cache_lock:
                cache.clear()

        call._clear_cache = clear_cache  # type: ignore[attr-defined]  # as jaxlib's: the core calls it on clear_cache()
        with compiler.lock:
            compiler.call_caches.append(cache)
        return call

    def live_copies(self) -> int:
        gc.collect()
        return sum(r() is not None for r in self.copies)

    def live_copies_of(self, context: Any) -> int:
        """Copies alive of the program compiled under ``context``."""
        gc.collect()
        return sum(r() is not None and getattr(r(), "made_for", None) == context for r in self.copies)
