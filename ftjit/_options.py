"""Checking and resolving ftjit.jit()'s options, before anything is built.

Three kinds of work, in the order jit() does them:

* values: ``as_tuple``/``as_int`` normalise static positions and names,
  ``check_callable`` and ``check_guard_options`` refuse bad input with
  jax.jit's words where it has some;
* the JAX compiler's own options: ``adopt_jax_compiler`` merges an explicit
  ``JaxCompiler``'s statics and jax.jit options with those given to jit();
* names and positions: ``resolve_static`` turns static_argnums and
  static_argnames into each other through the function's signature, as
  jax.jit does, and ``check_static`` applies jax.jit's range and name checks
  for custom compilers.

Pure functions of their arguments: no shared state, no locks. Nothing here
imports the C++ core, so these checks run (and fail) before the core is touched.
"""

from __future__ import annotations

import inspect
import math
import numbers
import operator
from typing import Any, Callable, NamedTuple, Sequence, Union

import numpy as np

from ._jax import JaxCompiler, resolves_negative_static_argnums


def check_guard_options(compile_timeout: Any, max_signatures: Any, on_excess: Any, explain_misses: Any) -> int | None:
    """Checks the serving guards' values; returns max_signatures as an int (or None)."""
    if compile_timeout is not None:
        if isinstance(compile_timeout, (bool, np.bool_)) or not isinstance(compile_timeout, numbers.Real):
            raise TypeError(f"compile_timeout must be a number of seconds or None, got {compile_timeout!r}")
        if not compile_timeout > 0:  # type: ignore[operator]  # NaN too
            raise ValueError(f"compile_timeout must be a positive number of seconds or None, got {compile_timeout!r}")
    if max_signatures is not None:
        as_index = as_int(max_signatures)
        if isinstance(max_signatures, bool) or as_index is None:
            raise TypeError(f"max_signatures must be an int or None, got {max_signatures!r}")
        if as_index < 1:
            raise ValueError(f"max_signatures must be a positive int or None, got {max_signatures!r}")
        if as_index > 2**63 - 1:  # the core keeps the limit in a signed 64-bit int (SignatureLimit)
            raise ValueError(f"max_signatures must be an int from 1 to 2**63 - 1, or None, got {max_signatures!r}")
        max_signatures = as_index
    if on_excess not in ("warn", "raise"):
        raise ValueError(f'on_excess must be "warn" or "raise", got {on_excess!r}')
    if explain_misses is not None and not isinstance(explain_misses, bool):
        raise TypeError(f"explain_misses must be a bool or None, got {explain_misses!r}")
    return max_signatures


class StaticArgs(NamedTuple):
    """Where a function's static arguments are, resolved through its signature."""

    sig: inspect.Signature | None  #: the function's signature (None when inspect cannot tell)
    argnums: tuple[int, ...]  #: static positions, as the core keys them
    argnames: tuple[str, ...]  #: static keyword names
    given_argnums: tuple[int, ...] | None  #: static_argnums as given (None: not given), for pickling
    given_argnames: tuple[str, ...] | None  #: static_argnames as given (None: not given), for pickling
    arg_names: tuple[str, ...]  #: names of the parameters that can be passed by position


def static_args(fun: Callable[..., Any], static_argnums: Any, static_argnames: Any, jax_compiled: bool) -> StaticArgs:
    """Resolves static_argnums/static_argnames for ``fun`` as jax.jit does.

    As in jax.jit, an explicit empty value counts as given (nothing is then
    inferred from the other through the signature); only None is "not
    given". ``jax_compiled``: the function is compiled by JAX, whose reading
    of negative positions depends on its version.
    """
    nums_given = static_argnums is not None
    names_given = static_argnames is not None
    argnums = as_tuple(static_argnums, int, "static_argnums")
    argnames = as_tuple(static_argnames, str, "static_argnames")
    sig = signature_of(fun)
    resolved_nums, resolved_names = resolve_static(sig, argnums, argnames, nums_given, names_given)
    if jax_compiled and any(i < 0 for i in resolved_nums):
        resolved_nums = jax_negative_argnums(sig, resolved_nums)
    arg_names: tuple[str, ...] = ()
    if sig is not None:
        kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        arg_names = tuple(p.name for p in sig.parameters.values() if p.kind in kinds)
    # As given, but as plain tuples: an iterator or a numpy array would
    # pickle differently from what it meant here.
    return StaticArgs(
        sig,
        resolved_nums,
        resolved_names,
        argnums if nums_given else None,
        argnames if names_given else None,
        arg_names,
    )


def as_int(value: Any) -> int | None:
    """``operator.index(value)`` (so numpy integers count, as in jax.jit), or None; bools are not positions."""
    if isinstance(value, (bool, np.bool_)):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def as_tuple(value: Union[int, str, Sequence[Any], None], kind: type, what: str) -> tuple:
    if value is None:
        return ()
    if kind is int and as_int(value) is not None:
        single: tuple[Any, ...] = (as_int(value),)
        check_positions(single, what)
        return single
    if kind is str and isinstance(value, str):
        return (value,)
    try:
        items = tuple(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{what} must be {kind.__name__} or a sequence of {kind.__name__}, got {value!r}") from None
    out = []
    for item in items:
        converted = as_int(item) if kind is int else item if isinstance(item, str) else None
        if converted is None:
            raise TypeError(f"{what} must contain only {kind.__name__} values, got {item!r}")
        out.append(converted)
    if kind is int:
        check_positions(tuple(out), what)
    return tuple(out)


def check_positions(positions: tuple[Any, ...], what: str) -> None:
    """Argument positions must fit a C int (as in jax.jit, whose C++ takes them as such)."""
    for p in positions:
        if not -(2**31) <= p < 2**31:
            raise ValueError(f"{what} must hold argument positions (ints between -2**31 and 2**31 - 1), got {p}")


def seconds(timeout: Any) -> float:
    """compile_timeout for the core: 0.0 for none; beyond a float (10**400) is forever too."""
    if timeout is None:
        return 0.0
    try:
        return float(timeout)
    except OverflowError:
        return math.inf


def check_static(sig: inspect.Signature | None, name: str, argnums: tuple[int, ...], argnames: tuple[str, ...]) -> None:
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


def adopt_jax_compiler(
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


def resolve_static(
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


def jax_negative_argnums(sig: inspect.Signature | None, argnums: tuple[int, ...]) -> tuple[int, ...]:
    """Negative static_argnums as the installed JAX reads them (see
    _jax.resolves_negative_static_argnums): from jax 0.12 on, positions among
    the function's positional parameters (when it has no *args), which the
    core then keys as such; before, left negative (counted from the end of
    each call's positional arguments, which the core does too)."""
    if sig is None or not resolves_negative_static_argnums():
        return argnums
    params = list(sig.parameters.values())
    if any(p.kind == inspect.Parameter.VAR_POSITIONAL for p in params):
        return argnums
    n = sum(p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD) for p in params)
    # Out of range stays as given: jax.jit then refuses it, in its words.
    return tuple(i + n if -n <= i < 0 else i for i in argnums) if n > 0 else argnums


def signature_of(fun: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return inspect.signature(fun)
    except (TypeError, ValueError):
        return None


def name_of(fun: Callable[..., Any]) -> str:
    for attr in ("__qualname__", "__name__"):
        name = getattr(fun, attr, None)
        if isinstance(name, str):
            return name
    return type(fun).__name__


def check_callable(fun: object) -> None:
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
