"""ftjit.jit(): option checking and name/position resolution around the C++ core."""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import math
import numbers
import operator
import os
import sys
import threading
import types
import weakref
from typing import Any, Callable, Iterator, NamedTuple, ParamSpec, Sequence, TextIO, TypeVar, Union, overload

import numpy as np

from . import _core, _jax, _observe
from . import errors
from ._jax import JaxCompiler
from ._warmup import warmup as _warmup_impl

__all__ = ["jit", "JitFunction", "FunctionCache", "CacheInfo", "clear_caches", "disable_jit"]

P = ParamSpec("P")
R = TypeVar("R")

from ._core import FunctionCache, JitFunction  # noqa: E402 - classes (types for checkers), not variables

# In a forked child, compiles that the parent's other threads had in flight
# are compiled afresh instead of waited for forever (see cpp/compile_latch.h).
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_core._after_fork_in_child)


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


def _as_int(value: Any) -> int | None:
    """``operator.index(value)`` (so numpy integers count, as in jax.jit), or None; bools are not positions."""
    if isinstance(value, (bool, np.bool_)):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def _as_tuple(value: Union[int, str, Sequence[Any], None], kind: type, what: str) -> tuple:
    if value is None:
        return ()
    if kind is int and _as_int(value) is not None:
        single: tuple[Any, ...] = (_as_int(value),)
        _check_positions(single, what)
        return single
    if kind is str and isinstance(value, str):
        return (value,)
    try:
        items = tuple(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{what} must be {kind.__name__} or a sequence of {kind.__name__}, got {value!r}") from None
    out = []
    for item in items:
        converted = _as_int(item) if kind is int else item if isinstance(item, str) else None
        if converted is None:
            raise TypeError(f"{what} must contain only {kind.__name__} values, got {item!r}")
        out.append(converted)
    if kind is int:
        _check_positions(tuple(out), what)
    return tuple(out)


def _check_positions(positions: tuple[Any, ...], what: str) -> None:
    """Argument positions must fit a C int (as in jax.jit, whose C++ takes them as such)."""
    for p in positions:
        if not -(2**31) <= p < 2**31:
            raise ValueError(f"{what} must hold argument positions (ints between -2**31 and 2**31 - 1), got {p}")


def _seconds(timeout: Any) -> float:
    """compile_timeout for the core: 0.0 for none; beyond a float (10**400) is forever too."""
    if timeout is None:
        return 0.0
    try:
        return float(timeout)
    except OverflowError:
        return math.inf


def _check_static(sig: inspect.Signature | None, name: str, argnums: tuple[int, ...], argnames: tuple[str, ...]) -> None:
    """jax.jit's checks of the static options against the signature (for
    custom compilers; on the JAX path jax.jit itself makes them)."""
    if sig is None:
        return
    params = list(sig.parameters.values())
    kinds = {p.kind for p in params}
    if inspect.Parameter.VAR_POSITIONAL not in kinds:
        n = sum(p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD) for p in params)
        if any(not -n <= i < n for i in argnums):
            raise ValueError(f"ftjit.jit: {name}() has static_argnums={argnums}, but only accepts {n} positional "
                             "arguments.")
    # Names that cannot be passed by keyword: positional-only ones and *args.
    positional = sorted(set(argnames) & {p.name for p in params if p.kind in (
        inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.VAR_POSITIONAL)})
    if positional:
        raise ValueError(f"ftjit.jit: {name}() has invalid argnames {positional} in static_argnames: these are "
                         "positional-only.")
    if inspect.Parameter.VAR_KEYWORD not in kinds:
        named = {p.name for p in params if p.kind in (
            inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)}
        unknown = sorted(set(argnames) - named)
        if unknown:
            raise ValueError(f"ftjit.jit: {name}() has invalid argnames {unknown} in static_argnames: it does not "
                             "take these arguments by keyword.")


def _adopt_jax_compiler(
    compiler: JaxCompiler,
    static_argnums: Any,
    static_argnames: Any,
    donate_argnums: Any,
    donate_argnames: Any,
    jax_options: dict[str, Any],
) -> tuple[JaxCompiler | None, Any, Any, dict[str, Any]]:
    """An explicit ``compiler=JaxCompiler(...)``: its statics and jax.jit
    options are the function's (the core strips exactly the statics that
    its jax.jit treats as static, so the two can never differ).

    A plain JaxCompiler becomes the default path with the options of both
    (returned compiler None); a subclass (which may override ``__call__``)
    is kept, and options given to ftjit.jit must then equal its own. Either
    way, a value given to both that differs is a ValueError.
    """

    plain = type(compiler) is JaxCompiler

    def merged(what: str, given: Any, own: tuple) -> Any:
        if own == () and plain:
            return given  # the plain compiler's default: not given (None lets jit infer it from the other)
        if given is None:
            return own  # as its jax.jit gets them (an explicit () infers nothing there either)
        if given != own:  # both tuples: jit() normalised `given` on entry
            raise ValueError(
                f"ftjit.jit: {what}={given!r} differs from the compiler's {what}={own!r}; "
                f"give it to one of them (ftjit.jit(..., {what}=...) or JaxCompiler({what}=...))"
            )
        return given

    static_argnums = merged("static_argnums", static_argnums, compiler.static_argnums)
    static_argnames = merged("static_argnames", static_argnames, compiler.static_argnames)
    own = dict(compiler.jit_options)
    given = dict(jax_options)
    if donate_argnums is not None:
        given["donate_argnums"] = donate_argnums
    if donate_argnames is not None:
        given["donate_argnames"] = donate_argnames
    for key, value in given.items():
        if key in own and own[key] != value:
            raise ValueError(
                f"ftjit.jit: {key}={value!r} differs from the compiler's {key}={own[key]!r}; give it to one of them"
            )
    if plain:
        return None, static_argnums, static_argnames, {**own, **given}
    if any(key not in own for key in given):
        extra = ", ".join(sorted(key for key in given if key not in own))
        raise TypeError(
            f"ftjit.jit: {extra} cannot be added to a {type(compiler).__name__} (a JaxCompiler subclass): "
            "pass them to its JaxCompiler constructor (jit_options)"
        )
    return compiler, static_argnums, static_argnames, {}


def _resolve_static(
    sig: inspect.Signature | None, argnums: tuple[int, ...], argnames: tuple[str, ...], nums_given: bool, names_given: bool
) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """Resolves static names <-> positions through the signature, as jax.jit does."""
    if sig is None or (nums_given and names_given) or not (nums_given or names_given):
        return argnums, argnames
    params = list(sig.parameters.values())
    pos_or_kw = inspect.Parameter.POSITIONAL_OR_KEYWORD
    if nums_given:
        names = tuple(p.name for i, p in enumerate(params) if p.kind == pos_or_kw and i in argnums)
        return argnums, names
    nums = tuple(i for i, p in enumerate(params) if p.kind == pos_or_kw and p.name in argnames)
    return nums, argnames


def _jax_negative_argnums(sig: inspect.Signature | None, argnums: tuple[int, ...]) -> tuple[int, ...]:
    """Negative static_argnums as the installed JAX reads them (see
    _jax.resolves_negative_static_argnums): from jax 0.12 on, positions among
    the function's positional parameters (when it has no *args), which the
    core then keys as such; before, left negative (counted from the end of
    each call's positional arguments, which the core does too)."""
    if sig is None or not _jax.resolves_negative_static_argnums():
        return argnums
    params = list(sig.parameters.values())
    if any(p.kind == inspect.Parameter.VAR_POSITIONAL for p in params):
        return argnums
    n = sum(p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD) for p in params)
    # Out of range stays as given: jax.jit then refuses it, in its words.
    return tuple(i + n if -n <= i < 0 else i for i in argnums) if n > 0 else argnums


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


def _signature_of(fun: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return inspect.signature(fun)
    except (TypeError, ValueError):
        return None


def _name_of(fun: Callable[..., Any]) -> str:
    for attr in ("__qualname__", "__name__"):
        name = getattr(fun, attr, None)
        if isinstance(name, str):
            return name
    return type(fun).__name__


class _NotGiven:
    """The default of jit's ``fun``: ``jit(static_argnums=1)`` is the
    decorator factory, while ``jit(None)`` is a non-callable (a TypeError,
    as in jax.jit)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<fun not given>"


_NOT_GIVEN: Any = _NotGiven()


def _check_callable(fun: object) -> None:
    # Each message starts with jax.jit's own words, which code and tests match on.
    if isinstance(fun, staticmethod):
        raise TypeError(
            "staticmethod arguments are not supported: ftjit.jit got a staticmethod object; apply "
            "@staticmethod on top of @ftjit.jit (outermost), not under it."
        )
    if isinstance(fun, classmethod):
        raise TypeError(
            "Expected a callable value, got a classmethod object: apply @classmethod on top of "
            "@ftjit.jit (outermost), not under it."
        )
    if not callable(fun):
        raise TypeError(f"Expected a callable value, got {fun!r} of type {type(fun).__name__}: "
                        "ftjit.jit wraps functions")
    if inspect.isgeneratorfunction(fun) or inspect.isasyncgenfunction(fun):
        raise TypeError(f"Expected a function, got a generator function: ftjit.jit cannot jit {fun!r} "
                        "(calling it returns a generator, which cannot be compiled)")


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
        static_argnums = _as_tuple(static_argnums, int, "static_argnums")
    if static_argnames is not None:
        static_argnames = _as_tuple(static_argnames, str, "static_argnames")
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
    _check_callable(fun)
    if compile_timeout is not None:
        if isinstance(compile_timeout, (bool, np.bool_)) or not isinstance(compile_timeout, numbers.Real):
            raise TypeError(f"compile_timeout must be a number of seconds or None, got {compile_timeout!r}")
        if not compile_timeout > 0:  # NaN too
            raise ValueError(f"compile_timeout must be a positive number of seconds or None, got {compile_timeout!r}")
    if max_signatures is not None:
        if isinstance(max_signatures, bool) or _as_int(max_signatures) is None:
            raise TypeError(f"max_signatures must be an int or None, got {max_signatures!r}")
        max_signatures = _as_int(max_signatures)
        if max_signatures < 1:  # type: ignore[operator]
            raise ValueError(f"max_signatures must be a positive int or None, got {max_signatures!r}")
    if on_excess not in ("warn", "raise"):
        raise ValueError(f'on_excess must be "warn" or "raise", got {on_excess!r}')
    if explain_misses is not None and not isinstance(explain_misses, bool):
        raise TypeError(f"explain_misses must be a bool or None, got {explain_misses!r}")
    user_compiler = compiler
    if isinstance(compiler, JaxCompiler):
        compiler, static_argnums, static_argnames, jax_options = _adopt_jax_compiler(
            compiler, static_argnums, static_argnames, donate_argnums, donate_argnames, jax_options)
        donate_argnums = donate_argnames = None  # now in jax_options (or equal to the subclass's own)
    # As jax.jit: an explicit empty value counts as given (nothing is then
    # inferred from the other through the signature); only None is "not given".
    nums_given = static_argnums is not None
    names_given = static_argnames is not None
    argnums = _as_tuple(static_argnums, int, "static_argnums")
    argnames = _as_tuple(static_argnames, str, "static_argnames")
    # As given (None stays "not given"), but as plain tuples: an iterator or
    # a numpy array would pickle differently from what it meant here.
    given_argnums = argnums if nums_given else None
    given_argnames = argnames if names_given else None
    sig = _signature_of(fun)
    argnums, argnames = _resolve_static(sig, argnums, argnames, nums_given, names_given)
    if (compiler is None or isinstance(compiler, JaxCompiler)) and any(i < 0 for i in argnums):
        argnums = _jax_negative_argnums(sig, argnums)
    if cache is None:
        cache = _DEFAULT_CACHE
    elif not isinstance(cache, FunctionCache):
        raise TypeError(f"cache must be an ftjit.FunctionCache, got {type(cache).__name__}")
    jitted = None  # the JAX compiler's one jax.jit object for `fun`
    if compiler is None:
        options_for_jax = dict(jax_options)
        if donate_argnums is not None:
            options_for_jax["donate_argnums"] = donate_argnums
        if donate_argnames is not None:
            options_for_jax["donate_argnames"] = donate_argnames
        compiler = JaxCompiler(argnums, argnames, tuple(sorted(options_for_jax.items())))
        # Created here, once, like jax.jit at decoration: jax validates and
        # warns now, at the caller's line, and never again for this function.
        jitted = _call_from_frame(sys._getframe(1), _jax.jax_jit(), fun, **compiler.jit_kwargs())
    else:
        if not callable(compiler):
            raise TypeError(f"compiler must be callable as compiler(fun, args, kwargs), got {compiler!r}")
        extra = sorted(jax_options) + (["donate_argnums"] if donate_argnums is not None else [])
        extra += ["donate_argnames"] if donate_argnames is not None else []
        if extra:
            raise TypeError(f"ftjit.jit: {', '.join(extra)} only apply to the default (JAX) compiler")
        if not isinstance(compiler, JaxCompiler):
            _check_static(sig, _name_of(fun), argnums, argnames)
    arg_names: tuple[str, ...] = ()
    if sig is not None:
        kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        arg_names = tuple(p.name for p in sig.parameters.values() if p.kind in kinds)
    compiler_key = _compiler_key(compiler)
    options = (
        tuple(sorted(set(argnums))),
        tuple(sorted(set(argnames))),
        compiler_key,
        max_signatures,
        on_excess if max_signatures is not None else None,
    )
    pickle_options = {
        "static_argnums": given_argnums,
        "static_argnames": given_argnames,
        "compiler": user_compiler,
        "donate_argnums": donate_argnums,
        "donate_argnames": donate_argnames,
        "compile_timeout": compile_timeout,
        "max_signatures": max_signatures,
        "on_excess": on_excess,
        "explain_misses": explain_misses,
        **jax_options,
    }
    name = _name_of(fun)
    describer = _observe.Describer(argnums, argnames, arg_names, use_jax=isinstance(compiler, JaxCompiler))
    context_fn = getattr(compiler, "context", None)
    describer.context = context_fn if callable(context_fn) else None
    describer.context_names = getattr(compiler, "context_names", None) if describer.context is not None else None
    # The JAX compiler's context hook also probes for an active trace and
    # jax_disable_jit (those calls go to jax.jit), and keys committed arrays
    # on their placement (see cpp/signature.h).
    core_context = getattr(compiler, "signature_hooks", None) or context_fn
    # JAX compilers run under jax's traceback boundary (see _integrate_jax).
    guarded_type = _integrate_jax() if isinstance(compiler, JaxCompiler) else _observe.GuardedCompiler
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
    jf: JitFunction[Any, Any] = _core._make_jit_function(  # type: ignore[assignment]
        fun=fun,
        compiler=guarded,
        cache=cache,
        static_argnums=argnums,
        static_argnames=argnames,
        arg_names=arg_names,
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
        compile_timeout=_seconds(compile_timeout),
        on_compile=_observe.on_compile,
        on_wait=_observe.on_wait,
    )
    # Wrappers of one function with equal options share its entries, so the
    # guard counts for all of them (the first wrapper's state while it lives).
    guarded.share_state(jf._shared_state(guarded.state))
    if max_signatures is not None:
        guarded.ready_count = _ready_counter(jf)
    if isinstance(compiler_key, _IdentityKey):
        compiler_key.when_dead(jf._entries_forgetter())
    functools.update_wrapper(jf, fun)
    if sig is not None:
        # As on a jax.jit function: the attribute itself, not only what
        # inspect.signature() derives through __wrapped__.
        jf.__signature__ = sig
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
    this call then waited for). Thread-safe; compile-once holds.
    """
    return self._precompile(*args, **kwargs)


class SignatureInfo(NamedTuple):
    """One cached, compiled signature of a function (see ``signatures()``)."""

    signature: str  #: readable, e.g. "f(float32[8,128], n=3)"
    hits: int  #: calls served by this entry from the cache
    compile_seconds: float


def _signatures(self: Any) -> list[SignatureInfo]:
    """The compiled signatures now cached for this function, readable, with hits and compile time.

    A snapshot; entries may be added or evicted concurrently.
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
    if isinstance(inner, _jax.BoundJaxCompiler):  # other compilers may be shared by many functions
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
_jax_integration: _jax.JaxIntegration | None = None  # written once under _jax_lock; keeps the clear_caches hook alive


def _integrate_jax() -> type:
    """Once per process, at the first JAX-compiled jit(): hooks ftjit into
    JAX (see ``_jax.integrate``) and returns the GuardedCompiler type to use.

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
            _jax_integration = _jax.integrate(package_dir, _core.clear_caches)
            boundary = api_boundary
            for method in _BOUNDARY_METHODS.values():
                method.boundary_impl = boundary(method.impl)
            # Published last: a function of this type finds its methods' boundaries set.
            _jax_guarded_type = type(
                "JaxGuardedCompiler",
                (_observe.GuardedCompiler,),
                {
                    "__call__": boundary(_observe.GuardedCompiler.__call__),
                    # the boundary is one more frame between the warning and its caller
                    "warn_stacklevel": _observe.GuardedCompiler.warn_stacklevel + (
                        _jax_integration.api_boundary is not _jax._identity),
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
    _core.clear_caches()


@contextlib.contextmanager
def disable_jit() -> Iterator[None]:
    """Calls jitted functions as plain Python inside the block.

    Affects the current thread only: other threads keep dispatching through
    their caches. Nestable.
    """
    _core._disable_jit_enter()
    try:
        yield
    finally:
        _core._disable_jit_exit()


_core._set_python_types(
    errors.UnhashableStaticArgumentError,
    errors.UnsupportedArgumentError,
    errors.RecursiveCompileError,
    errors.CompileCycleError,
    errors.CompileTimeoutError,
    CacheInfo,
    _rebuild,
    copy.copy,
    np.ndarray,
    np.generic,
    _observe.placement_label,
)
