"""ftjit.jit(), clear_caches() and disable_jit(), around the C++ core.

jit() checks and resolves its options (ftjit._options), picks the
compiler (_choose_compiler), reads its hooks (ftjit._hooks.hooks_of) and
builds the JitFunction (_construct): the core's C++ type, which defines
every method of a jitted function. Below: the records the core returns
(CacheInfo, SignatureInfo), the one-time integration with JAX, and
_rebuild, which unpickles a jitted function.

Shared state: _DEFAULT_CACHE (a FunctionCache: its own locks, see
the core's FunctionCache) and _jax_integration, written once under _jax_lock
(the only lock taken here, and never while calling into the core or JAX
beyond the one-time integration). Everything else is per call.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import sys
import threading
import types
import weakref
from typing import Any, Callable, Iterator, NamedTuple, ParamSpec, Sequence, TypeVar, overload

# Names from the submodules themselves, never from the package ftjit (whose __init__ imports this module).
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
from ._core import _after_fork_in_child, _disable_jit_enter, _disable_jit_exit, _make_jit_function
from ._core import clear_caches as _core_clear_caches
from ._hooks import hooks_of
from ._jax import JaxCompiler, JaxIntegration, integrate as _integrate_with_jax, jax_jit

__all__ = ["jit", "JitFunction", "FunctionCache", "CacheInfo", "SignatureInfo", "clear_caches", "disable_jit"]

P = ParamSpec("P")
R = TypeVar("R")

from ._core import FunctionCache, JitFunction  # noqa: E402 - classes (types for checkers), not variables

# In a forked child, compiles that the parent's other threads had in flight
# are compiled afresh instead of waited for forever (see the core's CompileLatch).
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


class SignatureInfo(NamedTuple):
    """One cached, compiled signature of a function (see ``JitFunction.signatures()``)."""

    signature: str  #: readable, e.g. "f(float32[8,128], n=3)"
    hits: int  #: calls served by this entry from the cache
    compile_seconds: float
    #: whether its executable is called with the leaves ftjit flattened (the
    #: arguments flattened once; ``CompilerHooks.executable_for``), not with
    #: the arguments
    takes_leaves: bool = False


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
    ``explain_misses=True`` logs (logger "ftjit.misses", WARNING) how each new
    signature differs from the closest cached one; None follows
    ``ftjit.set_explain_misses()``.

    Thread-safety: a JitFunction may be called from any number of threads at
    once. Exactly one thread compiles a given signature; the others wait with
    the GIL released (answering Ctrl-C) and share the result or the error.
    """
    if "fun" in jax_options:
        # `fun` is positional-only, as in jax.jit (whose message this is).
        raise TypeError("jit() got some positional-only arguments passed as keyword arguments: 'fun'")
    given = {name: value for name, value in locals().items() if name in _KEYWORDS}  # jit's keywords, as passed
    # Plain tuples at once (None stays "not given"): an iterator must not be
    # used up by a check, by a decorator factory's first use, or by pickling.
    if static_argnums is not None:
        given["static_argnums"] = static_argnums = as_tuple(static_argnums, int, "static_argnums")
    if static_argnames is not None:
        given["static_argnames"] = static_argnames = as_tuple(static_argnames, str, "static_argnames")
    if fun is _NOT_GIVEN:
        return functools.partial(jit, **given, **jax_options)
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
    # What unpickling passes to jit() again (the default cache's, not this one).
    pickle_options = {
        **given,
        "static_argnums": static.given_argnums,
        "static_argnames": static.given_argnames,
        "compiler": user_compiler,
        "cache": None,
        **donate,
        "max_signatures": max_signatures,
        **jax_options,
    }
    return _construct(fun, compiler, jitted, cache, static, compile_timeout, max_signatures, on_excess,
                      explain_misses, pickle_options)


# jit()'s own keywords (the rest are jax.jit's), from its one definition.
_KEYWORDS = frozenset(
    p.name for p in inspect.signature(jit).parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY)


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
    # One object the compile runs through and one set of hooks, for JAX
    # bound to this function and its one jax.jit.
    compiling = compiler.bind(fun, jitted) if jitted is not None and isinstance(compiler, JaxCompiler) else compiler
    hooks = hooks_of(compiling, fun)
    compile_fn = compiling
    if isinstance(compiler, JaxCompiler):
        _integrate_jax()
        compile_fn = api_boundary(compiling.__call__)  # under jax's traceback boundary, as jax.jit's compile
    jf: JitFunction[Any, Any] = _make_jit_function(  # type: ignore[assignment]
        fun=fun,
        compile=compile_fn,
        hooks=hooks,
        cache=cache,
        static_argnums=argnums,
        static_argnames=argnames,
        arg_names=static.arg_names,
        name=name,
        options=options,
        pickle_options=pickle_options,
        compile_timeout=seconds(compile_timeout),
        max_signatures=-1 if max_signatures is None else max_signatures,
        raise_on_excess=on_excess == "raise",
        explain_misses=-1 if explain_misses is None else int(bool(explain_misses)),
    )
    if isinstance(compiler_key, _IdentityKey):
        compiler_key.when_dead(jf._store_forgetter())
    functools.update_wrapper(jf, fun)
    # What a specs file's reader takes of this function's saved signatures at most (SavedSpecs.for_function):
    # in its attribute dict, as the wrapper attributes above (the core's type declares no such attribute).
    setattr(jf, "_max_signatures", max_signatures)
    if static.sig is not None:
        # As on a jax.jit function: the attribute itself, not only what
        # inspect.signature() derives through __wrapped__.
        jf.__signature__ = static.sig
    return jf


_jax_lock = threading.Lock()
_jax_integration: JaxIntegration | None = None  # written once under _jax_lock; keeps the clear_caches hook alive


def _integrate_jax() -> JaxIntegration:
    """Once per process, at the first JAX-compiled jit(): hooks ftjit into
    JAX (see ``_integrate_with_jax``).

    Tracing errors then show the frames jax.jit's show: ftjit's files are
    excluded like jax's, and the compile the core calls runs under jax's
    traceback boundary, below which frames are filtered (lower/trace/
    eval_shape are the function's jax.jit's own). ``jax.clear_caches()``
    also clears ftjit.
    """
    global _jax_integration
    integration = _jax_integration
    if integration is not None:
        return integration
    with _jax_lock:
        if _jax_integration is None:
            package_dir = os.path.dirname(os.path.abspath(__file__))
            _jax_integration = _integrate_with_jax(package_dir, _core_clear_caches)
        return _jax_integration


def api_boundary(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` as JAX's traceback-filtering boundary (jax's own ``api_boundary``,
    behind a feature check; ``fn`` itself before JAX is integrated or without
    it): the frames below it are filtered from tracing errors, as below
    jax.jit's. Applied to a JAX-compiled function's compile. (Its name in
    this module's namespace is what chex's is_traceable looks for in a
    jitted function's __globals__.)"""
    integration = _jax_integration
    return integration.api_boundary(fn) if integration is not None else fn


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
