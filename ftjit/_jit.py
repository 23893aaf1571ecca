"""ftjit.jit() and the Python side of JitFunction, around the C++ core.

jit() checks and resolves its options (ftjit/_options.py), picks the
compiler (_choose_compiler) and builds the core object (_construct); below
it, the methods that JitFunction gets from Python (lower, warmup,
signatures, pickling...), and clear_caches/disable_jit.

Shared state: _DEFAULT_CACHE (a FunctionCache: its own locks, see
cpp/function_cache.h) and _jax_integration, written once under _jax_lock
(the only lock taken here, and never while calling into the core or JAX
beyond the one-time integration). Everything else is per call.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import os
import sys
import threading
import types
import weakref
from typing import Any, Callable, Iterator, NamedTuple, ParamSpec, Sequence, TextIO, TypeVar, overload

import numpy as np

# Names from the submodules themselves, never from ftjit/__init__.py (which imports this module).
from ._options import (
    StaticArgs,
    adopt_jax_compiler,
    as_tuple,
    check_callable,
    check_guard_options,
    check_static,
    name_of,
    seconds,
    static_args,
)
from ._core import _after_fork_in_child, _disable_jit_enter, _disable_jit_exit, _make_jit_function, _set_python_types
from ._core import clear_caches as _core_clear_caches
from ._jax import BoundJaxCompiler, JaxCompiler, JaxIntegration, integrate as _integrate_with_jax, jax_jit
from ._jax import _identity
from ._observe import Describer, GuardedCompiler, compiling_ahead, on_compile, on_wait, placement_label
from .errors import (
    CompileCycleError,
    CompileTimeoutError,
    RecursiveCompileError,
    UnhashableStaticArgumentError,
    UnsupportedArgumentError,
)
from ._warmup import warmup as _warmup_impl

__all__ = ["jit", "JitFunction", "FunctionCache", "CacheInfo", "clear_caches", "disable_jit"]

P = ParamSpec("P")
R = TypeVar("R")

from ._core import FunctionCache, JitFunction  # noqa: E402 - classes (types for checkers), not variables

# In a forked child, compiles that the parent's other threads had in flight
# are compiled afresh instead of waited for forever (see cpp/compile_latch.h).
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class CacheInfo(NamedTuple):
    """Snapshot of one jitted function's cache counters (see ``cache_info()``)."""

    hits: int  #: calls served by an entry that was ready
    misses: int  #: calls that inserted a new entry and ran the compiler
    compiles: int  #: successful compiles
    waits: int  #: calls that waited for another thread's compile
    evictions: int  #: entries of this function evicted by the LRU
    size: int  #: entries of this function in the cache now
    failures: int  #: compiles that raised
    compile_seconds: float  #: total time spent compiling
    wait_seconds: float  #: total time spent waiting for other threads' compiles


_DEFAULT_CACHE = FunctionCache(4096)


def default_cache() -> FunctionCache:
    """The process-wide cache used when ``jit(cache=None)``."""
    return _DEFAULT_CACHE


class _IdentityKey:
    """A compiler in the options key, by identity and without keeping it alive.

    The key lives in the cache for as long as the function does (C++, out of
    the GC's sight), so a compiler held there that refers back to the
    function (a bound method of the object that owns the jitted function, a
    compiler given a reference to its wrapper) would keep both alive for
    good. Identity is all such a compiler is compared by, and an object that
    died can never be identical to a new one, so nothing is lost by holding
    it weakly: while a wrapper holds the compiler, equal keys find each other.
    Objects that cannot be weakly referenced are held.
    """

    __slots__ = ("_refs", "_hash", "_forgetters")

    def __init__(self, *objs: object):
        # When a referent dies, no wrapper of these entries is alive (each
        # holds its compiler) and no new key can equal this one: the entries
        # are dropped (see when_dead), so that dead keys do not pile up in
        # the cache (an object's bound-method compiler per object would add
        # one per object, with the ids, and so the hashes, reused).
        forgetters: list[Callable[[], Any]] = []

        def dead(_: Any, forgetters: list = forgetters) -> None:
            while forgetters:
                forgetters.pop()()

        self._forgetters = forgetters
        self._refs = tuple(_weak_or_strong(o, dead) for o in objs)
        self._hash = hash(tuple(id(o) for o in objs))

    def when_dead(self, forget: Callable[[], Any]) -> None:
        """Calls `forget` once a referent dies (now, if one is dead already)."""
        if self._targets() is None:
            forget()
        else:
            self._forgetters.append(forget)

    def _targets(self) -> tuple | None:
        out = tuple(ref() for ref in self._refs)
        return None if any(o is None for o in out) else out

    def __eq__(self, other: object) -> bool:
        if other is self:
            return True
        if type(other) is not _IdentityKey:
            return False
        mine, theirs = self._targets(), other._targets()
        return (mine is not None and theirs is not None and len(mine) == len(theirs)
                and all(a is b for a, b in zip(mine, theirs)))

    def __hash__(self) -> int:
        return self._hash


def _weak_or_strong(obj: object, callback: Callable[[Any], None]) -> Callable[[], Any]:
    try:
        return weakref.ref(obj, callback)
    except TypeError:
        return lambda: obj


def _ready_counter(jf: Any) -> Callable[[], int]:
    """jf._ready_count through a weak reference (the compiler it is given to
    is held by jf: a strong one would be a cycle through every wrapper)."""
    ref = weakref.ref(jf)

    def ready_count() -> int:
        alive = ref()
        return alive._ready_count() if alive is not None else 0

    return ready_count


def _compiler_key(compiler: Any) -> object:
    """The compiler as the options key holds it: by value when it compares
    by value (a plain JaxCompiler: its options), else by identity, weakly
    (see _IdentityKey); a bound method is its (object, function) pair, the
    two things bound methods are compared by."""
    if isinstance(compiler, types.MethodType):
        return _IdentityKey(compiler.__self__, compiler.__func__)
    try:
        hash(compiler)
    except TypeError:
        return _IdentityKey(compiler)
    if type(compiler).__eq__ is object.__eq__ or (isinstance(compiler, JaxCompiler) and type(compiler) is not JaxCompiler):
        return _IdentityKey(compiler)
    return compiler


# Code for _call_from_frame: one call expression, renamed per call site.
_CALL_CODE = compile("_ftjit_fn(*_ftjit_args, **_ftjit_kwargs)", "<ftjit>", "eval")


def _call_from_frame(frame: Any, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` called from a frame that the warnings module
    takes for ``frame`` (same file, line, module globals and warning registry).

    jax.jit warns with a ``stacklevel`` that points at its caller; creating
    it through this frame makes its warnings point at the line that called
    ftjit.jit, filtered and de-duplicated as if that line had called jax.jit.
    In a traceback this frame shows as that line, in ``<ftjit.jit>``.
    """
    lineno = getattr(frame, "f_lineno", None)
    if lineno is None:
        return fn(*args, **kwargs)
    code = _CALL_CODE.replace(co_filename=frame.f_code.co_filename, co_firstlineno=lineno, co_name="<ftjit.jit>")
    return eval(code, frame.f_globals, {"_ftjit_fn": fn, "_ftjit_args": args, "_ftjit_kwargs": kwargs})


class _NotGiven:
    """The default of jit's ``fun``: ``jit(static_argnums=1)`` is the
    decorator factory, while ``jit(None)`` is a non-callable (a TypeError,
    as in jax.jit)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<fun not given>"


_NOT_GIVEN: Any = _NotGiven()


@overload
def jit(
    fun: Callable[P, R],
    /,
    *,
    static_argnums: int | Sequence[int] | None = ...,
    static_argnames: str | Sequence[str] | None = ...,
    compiler: Callable[..., Any] | None = ...,
    cache: FunctionCache | None = ...,
    donate_argnums: int | Sequence[int] | None = ...,
    donate_argnames: str | Sequence[str] | None = ...,
    compile_timeout: float | None = ...,
    max_signatures: int | None = ...,
    on_excess: str = ...,
    explain_misses: bool | None = ...,
    **jax_options: Any,
) -> JitFunction[P, R]: ...
@overload
def jit(
    *,
    static_argnums: int | Sequence[int] | None = ...,
    static_argnames: str | Sequence[str] | None = ...,
    compiler: Callable[..., Any] | None = ...,
    cache: FunctionCache | None = ...,
    donate_argnums: int | Sequence[int] | None = ...,
    donate_argnames: str | Sequence[str] | None = ...,
    compile_timeout: float | None = ...,
    max_signatures: int | None = ...,
    on_excess: str = ...,
    explain_misses: bool | None = ...,
    **jax_options: Any,
) -> Callable[[Callable[P, R]], JitFunction[P, R]]: ...
def jit(
    fun: Any = _NOT_GIVEN,
    /,
    *,
    static_argnums: int | Sequence[int] | None = None,
    static_argnames: str | Sequence[str] | None = None,
    compiler: Callable[..., Any] | None = None,
    cache: FunctionCache | None = None,
    donate_argnums: int | Sequence[int] | None = None,
    donate_argnames: str | Sequence[str] | None = None,
    compile_timeout: float | None = None,
    max_signatures: int | None = None,
    on_excess: str = "warn",
    explain_misses: bool | None = None,
    **jax_options: Any,
) -> Any:
    """Wraps ``fun`` so that each new call signature is compiled exactly once.

    Usable as ``@jit``, ``@jit(static_argnums=1)`` or ``jit(f, ...)``.

    ``compiler(fun, args, kwargs) -> executable`` runs once per new signature
    with the call's full arguments; the executable is then called as
    ``executable(*args, **kwargs)`` for this and every later call of that
    signature. ``compiler=None`` uses JAX (``ftjit.JaxCompiler``), which also
    takes ``donate_argnums``/``donate_argnames`` and any other ``jax.jit``
    keyword (``jax_options``), passed through to ``jax.jit``. ``cache`` is the
    FunctionCache to use (the process-wide default when None).

    Serving guards: ``compile_timeout`` (seconds) bounds how long a call
    waits for another thread's compile (``CompileTimeoutError``; the compile
    carries on). ``max_signatures=N`` with ``on_excess="warn"`` warns once
    when a call would compile past N distinct signatures, and with
    ``"raise"`` raises ``RecompileLimitError`` instead of compiling.
    ``explain_misses=True`` logs (logger "ftjit", INFO) how each new
    signature differs from the closest cached one; None follows
    ``ftjit.set_explain_misses()``.

    Thread-safety: a JitFunction may be called from any number of threads at
    once. Exactly one thread compiles a given signature; the others wait with
    the GIL released (answering Ctrl-C) and share the result or the error.
    """
    if "fun" in jax_options:
        # `fun` is positional-only, as in jax.jit (whose message this is).
        raise TypeError("jit() got some positional-only arguments passed as keyword arguments: 'fun'")
    # Plain tuples at once (None stays "not given"): an iterator must not be
    # used up by a check, by a decorator factory's first use, or by pickling.
    if static_argnums is not None:
        static_argnums = as_tuple(static_argnums, int, "static_argnums")
    if static_argnames is not None:
        static_argnames = as_tuple(static_argnames, str, "static_argnames")
    if fun is _NOT_GIVEN:
        return functools.partial(
            jit,
            static_argnums=static_argnums,
            static_argnames=static_argnames,
            compiler=compiler,
            cache=cache,
            donate_argnums=donate_argnums,
            donate_argnames=donate_argnames,
            compile_timeout=compile_timeout,
            max_signatures=max_signatures,
            on_excess=on_excess,
            explain_misses=explain_misses,
            **jax_options,
        )
    check_callable(fun)
    max_signatures = check_guard_options(compile_timeout, max_signatures, on_excess, explain_misses)
    user_compiler = compiler
    if isinstance(compiler, JaxCompiler):
        compiler, static_argnums, static_argnames, jax_options = adopt_jax_compiler(
            compiler, static_argnums, static_argnames, donate_argnums, donate_argnames, jax_options)
        donate_argnums = donate_argnames = None  # now in jax_options (or equal to the subclass's own)
    static = static_args(
        fun, static_argnums, static_argnames, jax_compiled=compiler is None or isinstance(compiler, JaxCompiler))
    if cache is None:
        cache = _DEFAULT_CACHE
    elif not isinstance(cache, FunctionCache):
        raise TypeError(f"cache must be an ftjit.FunctionCache, got {type(cache).__name__}")
    donate = {"donate_argnums": donate_argnums, "donate_argnames": donate_argnames}
    compiler, jitted = _choose_compiler(fun, compiler, static, donate, jax_options, sys._getframe(1))
    pickle_options = {
        "static_argnums": static.given_argnums,
        "static_argnames": static.given_argnames,
        "compiler": user_compiler,
        **donate,
        "compile_timeout": compile_timeout,
        "max_signatures": max_signatures,
        "on_excess": on_excess,
        "explain_misses": explain_misses,
        **jax_options,
    }
    return _construct(fun, compiler, jitted, cache, static, compile_timeout, max_signatures, on_excess,
                      explain_misses, pickle_options)


def _choose_compiler(
    fun: Callable[..., Any],
    compiler: Any,
    static: StaticArgs,
    donate: dict[str, Any],
    jax_options: dict[str, Any],
    caller: Any,
) -> tuple[Any, Any]:
    """The compiler to use, and (for the default JAX compiler) its one
    jax.jit object for ``fun``, created as if from ``caller``'s line."""
    if compiler is None:
        options_for_jax = dict(jax_options)
        options_for_jax.update((key, value) for key, value in donate.items() if value is not None)
        compiler = JaxCompiler(static.argnums, static.argnames, tuple(sorted(options_for_jax.items())))
        # Created here, once, like jax.jit at decoration: jax validates and
        # warns now, at the caller's line, and never again for this function.
        return compiler, _call_from_frame(caller, jax_jit(), fun, **compiler.jit_kwargs())
    if not callable(compiler):
        raise TypeError(f"compiler must be callable as compiler(fun, args, kwargs), got {compiler!r}")
    extra = sorted(jax_options) + [key for key, value in donate.items() if value is not None]
    if extra:
        raise TypeError(f"ftjit.jit: {', '.join(extra)} only apply to the default (JAX) compiler")
    if not isinstance(compiler, JaxCompiler):
        check_static(static.sig, name_of(fun), static.argnums, static.argnames)
    return compiler, None


def _construct(
    fun: Callable[..., Any],
    compiler: Any,
    jitted: Any,
    cache: FunctionCache,
    static: StaticArgs,
    compile_timeout: float | None,
    max_signatures: int | None,
    on_excess: str,
    explain_misses: bool | None,
    pickle_options: dict[str, Any],
) -> Any:
    """Builds the JitFunction: the compiler behind its guards, the core
    object with the compiler protocol's hooks, and the wrapper attributes."""
    argnums, argnames = static.argnums, static.argnames
    compiler_key = _compiler_key(compiler)
    options = (
        tuple(sorted(set(argnums))),
        tuple(sorted(set(argnames))),
        compiler_key,
        max_signatures,
        on_excess if max_signatures is not None else None,
    )
    name = name_of(fun)
    describer = Describer(argnums, argnames, static.arg_names, use_jax=isinstance(compiler, JaxCompiler))
    context_fn = getattr(compiler, "context", None)
    describer.context = context_fn if callable(context_fn) else None
    describer.context_names = getattr(compiler, "context_names", None) if describer.context is not None else None
    # The JAX compiler's context hook also probes for an active trace and
    # jax_disable_jit (those calls go to jax.jit), and keys committed arrays
    # on their placement (see cpp/signature.h).
    core_context = getattr(compiler, "signature_hooks", None) or context_fn
    # JAX compilers run under jax's traceback boundary (see _integrate_jax).
    guarded_type = _integrate_jax() if isinstance(compiler, JaxCompiler) else GuardedCompiler
    guarded = guarded_type(
        compiler.bind(fun, jitted) if jitted is not None and isinstance(compiler, JaxCompiler) else compiler,
        name,
        describer,
        max_signatures,
        on_excess,
        explain_misses,
    )
    # The optional compiler protocol (see JaxCompiler): hooks the core uses.
    fallback_maker = getattr(compiler, "fallback", None)
    jf: JitFunction[Any, Any] = _make_jit_function(  # type: ignore[assignment]
        fun=fun,
        compiler=guarded,
        cache=cache,
        static_argnums=argnums,
        static_argnames=argnames,
        arg_names=static.arg_names,
        name=name,
        options=options,
        pickle_options=pickle_options,
        pytree_flatten=getattr(compiler, "pytree_flatten", None),
        custom_namedtuple=getattr(compiler, "custom_namedtuple", None),
        redo_types=getattr(compiler, "redo_types", None),
        context_fn=core_context,
        strip_static=bool(getattr(compiler, "strip_static", False)),
        jax_style_errors=bool(getattr(compiler, "jax_style_errors", False)),
        fallback=jitted if jitted is not None else fallback_maker(fun) if callable(fallback_maker) else None,
        fallback_types=getattr(compiler, "fallback_types", None),
        plain_types=getattr(compiler, "plain_types", None),
        aval_types=getattr(compiler, "aval_types", None),
        compile_timeout=seconds(compile_timeout),
        on_compile=on_compile,
        on_wait=on_wait,
    )
    # Wrappers of one function with equal options share its entries, so the
    # guard counts for all of them (the first wrapper's state while it lives).
    guarded.share_state(jf._shared_state(guarded.state))
    if max_signatures is not None:
        guarded.ready_count = _ready_counter(jf)
    if isinstance(compiler_key, _IdentityKey):
        compiler_key.when_dead(jf._entries_forgetter())
    functools.update_wrapper(jf, fun)
    if static.sig is not None:
        # As on a jax.jit function: the attribute itself, not only what
        # inspect.signature() derives through __wrapped__.
        jf.__signature__ = static.sig
    return jf


def _jax_jitted(self: Any, method: str) -> Any:
    """The ``jax.jit`` of this function with its options (the JAX compiler only)."""
    compiler = self._compiler.inner
    make = getattr(compiler, "jax_jit", None)
    if make is None:
        raise TypeError(f"{method}() needs the JAX compiler; this function uses {compiler!r}")
    return make(self._fun)


def _lower(self: Any, *args: Any, **kwargs: Any) -> Any:
    """``jax.stages.Lowered`` for these arguments (the JAX compiler only).

    Thread-safe; does not touch the cache.
    """
    return _jax_jitted(self, "lower").lower(*args, **kwargs)


def _trace(self: Any, *args: Any, **kwargs: Any) -> Any:
    """``jax.stages.Traced`` for these arguments (the JAX compiler only). Does not touch the cache."""
    return _jax_jitted(self, "trace").trace(*args, **kwargs)


def _eval_shape(self: Any, *args: Any, **kwargs: Any) -> Any:
    """Output shapes/dtypes (``jax.ShapeDtypeStruct`` pytree) without compiling (the JAX compiler only)."""
    return _jax_jitted(self, "eval_shape").eval_shape(*args, **kwargs)


def _cache_size(self: Any) -> int:
    """Number of signatures of this function in the cache now (jax.jit's ``_cache_size``)."""
    return self.cache_info().size


def _precompile(self: Any, *args: Any, **kwargs: Any) -> bool:
    """Compiles the signature of these arguments into the cache, executing nothing.

    Arguments may be concrete values or ``jax.ShapeDtypeStruct`` (anything
    with ``.dtype``/``.shape``). Returns True if this call compiled it, False
    if it was cached already (or compiled meanwhile by another thread, which
    this call then waited for). Thread-safe; compile-once holds. A compile
    asked for ahead of traffic is not logged as a miss (explain_misses).
    """
    with compiling_ahead():
        return self._precompile(*args, **kwargs)


class SignatureInfo(NamedTuple):
    """One cached, compiled signature of a function (see ``signatures()``)."""

    signature: str  #: readable, e.g. "f(float32[8,128], n=3)"
    hits: int  #: calls served by this entry from the cache
    compile_seconds: float


def _signatures(self: Any) -> list[SignatureInfo]:
    """The compiled signatures now cached for this function, readable, with hits and compile time.

    Newest first: ordered by when each compile finished, the latest first
    (hits do not reorder them). A snapshot; entries may be added or evicted
    concurrently.
    """
    return [SignatureInfo(*row) for row in self._cached_signatures()]


def _warmup(self: Any, specs: Any, workers: int = 1, strict: bool = False, progress: bool | TextIO | None = None) -> Any:
    """Compiles a list of signatures in ``workers`` threads; returns a WarmupReport (see ftjit._warmup)."""
    return _warmup_impl(self, specs, workers=workers, strict=strict, progress=progress)


_core_clear_cache = JitFunction.clear_cache  # the C++ method: drops this function's entries


def _clear_cache(self: Any) -> None:
    """Drops this function's compiled entries; the next call of each
    signature compiles again. With the JAX compiler, also clears what
    jax.jit's ``clear_cache()`` clears (the function's trace caches), so the
    next compile traces the function again, as jax.jit does.

    Thread-safe; compiles in progress finish and serve their waiters, but
    their entries are not kept.
    """
    # jax's trace caches first: a compile racing with this call then either
    # finds its entry dropped below or traces afresh, never re-caches a stale trace.
    inner = getattr(self._compiler, "inner", None)
    if isinstance(inner, BoundJaxCompiler):  # other compilers may be shared by many functions
        inner.clear_cache()
    _core_clear_cache(self)


class _JaxBoundaryMethod:
    """A JitFunction method that, on a function compiled by JAX, runs as jax's
    traceback boundary (see _integrate_jax), as jax.jit's own methods do: a
    tracing error then shows the caller's frame, then the user's function,
    with this method's frame and ftjit's and jax's below it hidden.
    Other compilers' errors keep their tracebacks untouched.
    """

    def __init__(self, impl: Callable[..., Any]):
        functools.update_wrapper(self, impl)  # type: ignore[arg-type]  # a descriptor, not a function
        self.impl = impl
        self.boundary_impl: Callable[..., Any] | None = None  # set once by _integrate_jax

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self.impl
        jax_compiled = _jax_guarded_type is not None and type(obj._compiler) is _jax_guarded_type
        return types.MethodType((self.boundary_impl or self.impl) if jax_compiled else self.impl, obj)


for _name, _impl in (("lower", _lower), ("trace", _trace), ("eval_shape", _eval_shape), ("precompile", _precompile),
                     ("clear_cache", _clear_cache), ("signatures", _signatures), ("warmup", _warmup)):
    # Named as the user calls them (messages such as "warmup() got an
    # unexpected keyword argument", help(), tracebacks).
    _impl.__name__ = _name
    _impl.__qualname__ = f"JitFunction.{_name}"
    _impl.__code__ = _impl.__code__.replace(co_name=_name, co_qualname=f"JitFunction.{_name}") \
        if sys.version_info >= (3, 11) else _impl.__code__.replace(co_name=_name)
del _name, _impl


def _function_name(fun: Any) -> str:
    """The name jax gives a function: its ``__name__``, through unnamed ``functools.partial`` layers."""
    name = getattr(fun, "__name__", None)
    if isinstance(name, str):
        return name
    if isinstance(fun, functools.partial):
        return _function_name(fun.func)
    return "<unnamed function>"


def _getstate(self: Any) -> dict[str, Any]:
    """What jax.jit's ``__getstate__()`` reports of the function (its name), for code that reads it."""
    return {"function_name": _function_name(self._fun)}


_core_reduce = JitFunction.__reduce__  # the C++ method: (rebuild, (fun, options))


def _reduce(self: Any) -> Any:
    """Pickles by reference when this very object is reachable by its module
    and qualified name (the decorated form, ``@ftjit.jit`` on a module-level
    function), as ``functools.lru_cache`` wrappers do; otherwise by value:
    the wrapped function (itself by reference) and the options, rebuilt by
    ftjit.jit on unpickling."""
    name = getattr(self, "__qualname__", None)
    module = sys.modules.get(getattr(self, "__module__", None) or "")
    if isinstance(name, str) and module is not None and "<locals>" not in name:
        found: Any = module
        for part in name.split("."):
            found = getattr(found, part, None)
        if found is self:
            return name
    return _core_reduce(self)


def _copy(self: Any) -> Any:
    """A jitted function is immutable: copies are itself, as for Python functions."""
    return self


def _deepcopy(self: Any, memo: dict) -> Any:
    return self


_BOUNDARY_METHODS = {
    "lower": _JaxBoundaryMethod(_lower),
    "trace": _JaxBoundaryMethod(_trace),
    "eval_shape": _JaxBoundaryMethod(_eval_shape),
    "precompile": _JaxBoundaryMethod(_precompile),
}
_PLAIN_METHODS: dict[str, Any] = {
    "clear_cache": _clear_cache,
    "_cache_size": _cache_size,
    "signatures": _signatures,
    "warmup": _warmup,
    "__copy__": _copy,
    "__deepcopy__": _deepcopy,
    "__reduce__": _reduce,
    "__getstate__": _getstate,
    # Generic for type checkers (JitFunction[P, R], see _core.pyi); subscriptable at run time too.
    "__class_getitem__": classmethod(types.GenericAlias),
}
for _name, _method in {**_BOUNDARY_METHODS, **_PLAIN_METHODS}.items():
    setattr(JitFunction, _name, _method)
del _name, _method


_jax_lock = threading.Lock()
_jax_guarded_type: type | None = None  # written once under _jax_lock, then read without it
_jax_integration: JaxIntegration | None = None  # written once under _jax_lock; keeps the clear_caches hook alive


def _integrate_jax() -> type:
    """Once per process, at the first JAX-compiled jit(): hooks ftjit into
    JAX (see ``_integrate_with_jax``) and returns the GuardedCompiler type to use.

    Tracing errors then show the frames jax.jit's show: ftjit's files are
    excluded like jax's, and ftjit's topmost frames (the compiler the core
    calls, lower/trace/eval_shape/precompile) become jax's traceback boundary,
    below which frames are filtered. ``jax.clear_caches()`` also clears ftjit.
    """
    global _jax_guarded_type, _jax_integration
    guarded_type = _jax_guarded_type
    if guarded_type is not None:
        return guarded_type
    with _jax_lock:
        if _jax_guarded_type is None:
            package_dir = os.path.dirname(os.path.abspath(__file__))
            _jax_integration = _integrate_with_jax(package_dir, _core_clear_caches)
            boundary = api_boundary
            for method in _BOUNDARY_METHODS.values():
                method.boundary_impl = boundary(method.impl)
            # Published last: a function of this type finds its methods' boundaries set.
            _jax_guarded_type = type(
                "JaxGuardedCompiler",
                (GuardedCompiler,),
                {
                    "__call__": boundary(GuardedCompiler.__call__),
                    # the boundary is one more frame between the warning and its caller
                    "warn_stacklevel": GuardedCompiler.warn_stacklevel + (
                        _jax_integration.api_boundary is not _identity),
                    "__module__": __name__,
                },
            )
        return _jax_guarded_type


def api_boundary(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` as JAX's traceback-filtering boundary (jax's own ``api_boundary``,
    behind a feature check; ``fn`` itself before JAX is integrated or without
    it): the frames below it are filtered from tracing errors, as below
    jax.jit's. Applied to a jitted function's compile path and to its
    lower/trace/eval_shape/precompile methods."""
    integration = _jax_integration
    return integration.api_boundary(fn) if integration is not None else fn


def _python_namespace(self: Any) -> dict[str, Any]:
    """A jitted function's ``__globals__``: the namespace of the module that
    defines its Python-level API (this one), as a Python wrapper function of
    this module would have. Tools that recognise JAX-wrapped functions by the
    ``api_boundary`` their wrappers are defined with (chex's is_traceable)
    then see a jitted function for what it is; ``isinstance(f,
    jax.stages.Wrapped)`` (JAX's protocol) holds too."""
    return globals()


JitFunction.__globals__ = property(_python_namespace)  # type: ignore[attr-defined]


def _rebuild(fun: Callable[..., Any], options: dict) -> Any:
    """Unpickling: jit ``fun`` again with the pickled options (default cache)."""
    return jit(fun, **options)


def clear_caches() -> None:
    """Drops the compiled entries of every live jitted function.

    Thread-safe; compiles in progress finish and serve their waiters, but
    their entries are not kept.
    """
    _core_clear_caches()


@contextlib.contextmanager
def disable_jit() -> Iterator[None]:
    """Calls jitted functions as plain Python inside the block.

    Affects the current thread only: other threads keep dispatching through
    their caches. Nestable.
    """
    _disable_jit_enter()
    try:
        yield
    finally:
        _disable_jit_exit()


_set_python_types(
    UnhashableStaticArgumentError,
    UnsupportedArgumentError,
    RecursiveCompileError,
    CompileCycleError,
    CompileTimeoutError,
    CacheInfo,
    _rebuild,
    copy.copy,
    np.ndarray,
    np.generic,
    placement_label,
)
