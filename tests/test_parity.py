"""Drop-in parity with jax.jit: every scenario here runs the same code under
jax.jit and under ftjit.jit (each with its own, freshly defined Python
functions) and asserts the same outcome: result (values, dtypes, weak types,
shardings), exception type (ftjit's may be a subclass) and message where the
message is jax's own, warning categories, messages and counts, trace counts.

Covers every keyword of the installed jax.jit, decoration-time validation,
the methods (lower/compile/trace/eval_shape/_cache_size/clear_cache),
ftjit inside JAX (rebinding jax.jit to ftjit.jit, no device touched before
the first call), disable_jit, donation, static-argument errors, memory
(closures freed), ordered effects, tokens and hijax state. Where ftjit adds
to jax.jit's error message, the tests also check ftjit's words.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import itertools
import re
import os
import subprocess
import sys
import threading
import traceback
import warnings
import weakref
from typing import Any, Callable

import numpy as np
import pytest

import jax  # a hard dependency: its absence must fail, not skip
import jax.numpy as jnp  # noqa: E402
from jax.experimental import io_callback  # noqa: E402
from jax.sharding import SingleDeviceSharding  # noqa: E402

import ftjit  # noqa: E402
from helpers import child_env, gc_collect_until, require_module, run_threads  # noqa: E402

JITS = [pytest.param(jax.jit, id="jax"), pytest.param(ftjit.jit, id="ftjit")]

DEVICE = jax.devices()[0]
SHARDING = SingleDeviceSharding(DEVICE)
DEVICE_WARNING = "backend and device argument on jit is deprecated"
IGNORE_DEVICE_WARNING = pytest.mark.filterwarnings(f"ignore:{DEVICE_WARNING}:DeprecationWarning")


# --- the yardstick: run a scenario under both jits, compare outcomes ------------


def _leaf(v: Any) -> Any:
    """A comparable stand-in for an array leaf (type, dtype, shape, weak type, values)."""
    if isinstance(v, jax.Array):
        return ("Array", str(v.dtype), v.shape, bool(v.weak_type), np.asarray(v).tolist())
    if isinstance(v, (np.ndarray, np.generic)):
        return (type(v).__name__, str(v.dtype), np.shape(v), np.asarray(v).tolist())
    return v


def normalize(tree: Any) -> Any:
    return jax.tree_util.tree_map(_leaf, tree)


def first_line(exc: BaseException) -> str:
    text = str(exc)
    return text.splitlines()[0] if text else ""


@dataclasses.dataclass
class Outcome:
    """How one run of a scenario ended."""

    value: Any = None  # normalized return value (None if it raised)
    error: BaseException | None = None
    warnings: list = dataclasses.field(default_factory=list)  # [(category, first line)]


def run_scenario(scenario: Callable[[Callable], Any], jit: Callable) -> Outcome:
    out = Outcome()
    try:
        out.value = normalize(scenario(jit))
    except Exception as e:  # noqa: BLE001 - compared by the caller
        out.error = e
    return out


def run_scenario_recording_warnings(scenario: Callable[[Callable], Any], jit: Callable) -> Outcome:
    """run_scenario, also recording every warning (process-global: thread-unsafe)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = run_scenario(scenario, jit)
    out.warnings = [(w.category, str(w.message).splitlines()[0]) for w in caught]
    return out


def assert_same_outcome(want: Outcome, got: Outcome, messages: bool = True) -> None:
    """ftjit's outcome `got` matches jax.jit's `want`."""
    if want.error is None:
        if got.error is not None:
            raise AssertionError(f"jax.jit returned {want.value!r}, ftjit.jit raised {got.error!r}") from got.error
        assert got.value == want.value
    else:
        assert got.error is not None, f"jax.jit raised {want.error!r}, ftjit.jit returned {got.value!r}"
        assert isinstance(got.error, type(want.error)), (
            f"ftjit.jit raised {type(got.error).__name__}, not an instance of jax.jit's "
            f"{type(want.error).__name__}: {got.error!r} vs {want.error!r}"
        )
        if messages:
            assert first_line(got.error) == first_line(want.error)
    assert got.warnings == want.warnings


def both(scenario: Callable[[Callable], Any], *, messages: bool = True):
    """Runs ``scenario(jit)`` with jax.jit, then with ftjit.jit; asserts equal outcomes.

    ``scenario`` must define its functions inside (fresh objects per jit).
    Returns (jax's Outcome, ftjit's Outcome). Thread-safe.
    """
    # One call site for both runs: jax records the Python stack, this line
    # included, in each program's source-location metadata (compiled.as_text()).
    want, got = (run_scenario(scenario, jit) for jit in (jax.jit, ftjit.jit))
    assert_same_outcome(want, got, messages)
    return want, got


def both_recording_warnings(scenario: Callable[[Callable], Any], *, messages: bool = True):
    """``both``, also comparing the warnings (category, first line, count). Thread-unsafe."""
    want, got = (run_scenario_recording_warnings(scenario, jit) for jit in (jax.jit, ftjit.jit))
    assert_same_outcome(want, got, messages)
    return want, got


def test_both_detects_a_mismatch():
    """The yardstick itself can fail: different values, errors or error types are caught."""
    with pytest.raises(AssertionError):
        assert_same_outcome(Outcome(value=1), Outcome(value=2))
    with pytest.raises(AssertionError):
        assert_same_outcome(Outcome(error=ValueError("x")), Outcome(value=1))
    with pytest.raises(AssertionError):
        assert_same_outcome(Outcome(error=ValueError("x")), Outcome(error=TypeError("x")))
    with pytest.raises(AssertionError):
        assert_same_outcome(Outcome(error=ValueError("x")), Outcome(error=ValueError("y")))
    with pytest.raises(AssertionError):
        assert_same_outcome(Outcome(value=1, warnings=[(UserWarning, "w")]), Outcome(value=1))
    assert_same_outcome(Outcome(error=ValueError("x")), Outcome(error=ftjit.UnhashableStaticArgumentError("x")))


# --- keywords -----------------------------------------------------------------

KEYWORD_CASES = {
    "static_argnums": dict(static_argnums=1),
    "static_argnames": dict(static_argnames="y"),
    "donate_argnums": dict(donate_argnums=0),
    "donate_argnames": dict(donate_argnames="x"),
    "in_shardings": dict(in_shardings=SHARDING),
    "out_shardings": dict(out_shardings=SHARDING),
    "keep_unused": dict(keep_unused=True),
    "device": dict(device=DEVICE),
    "backend": dict(backend=DEVICE.platform),
    "inline": dict(inline=True),
    "compiler_options": dict(compiler_options={"xla_embed_ir_in_executable": True}),
}


def test_keyword_table_covers_every_keyword_of_the_installed_jax_jit():
    params = inspect.signature(jax.jit).parameters
    keywords = {name for name, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert keywords == set(KEYWORD_CASES)
    assert [p.kind for p in params.values()][0] is inspect.Parameter.POSITIONAL_ONLY


def _keyword_scenario(kwargs: dict) -> Callable[[Callable], Any]:
    def scenario(jit):
        def f(x, y, unused):
            return x * 2 + y

        jf = jit(f, **kwargs)
        rows = []
        for n, y in [(3, 1.0), (3, 2.0), (4, 1.0)]:
            x = jnp.arange(float(n))
            out = jf(x, y, jnp.zeros(2))
            rows.append((out, out.sharding, x.is_deleted()))
        lowered = jf.lower(jnp.arange(3.0), 1.0, jnp.zeros(2))
        main = lowered.as_text().split("func.func public @main(")[1].split("->")[0]
        return {
            "rows": rows,
            "cache_size": jf._cache_size(),
            "main_params": main.count("%arg"),
            "text": lowered.as_text(),
        }

    return scenario


@IGNORE_DEVICE_WARNING
@pytest.mark.parametrize("name", sorted(KEYWORD_CASES))
def test_each_keyword_gives_jax_jits_results_program_and_cache_size(name):
    want, _ = both(_keyword_scenario(KEYWORD_CASES[name]))
    assert want.error is None
    donated = name.startswith("donate")
    assert [row[2] for row in want.value["rows"]] == [donated] * 3
    assert want.value["main_params"] == {"keep_unused": 3, "static_argnums": 1, "static_argnames": 1}.get(name, 2)
    assert want.value["cache_size"] == (3 if name.startswith("static") else 2)


@IGNORE_DEVICE_WARNING
@pytest.mark.parametrize("name", sorted(KEYWORD_CASES))
def test_each_keyword_is_part_of_the_cache_key(name):
    """Two ftjit wrappers of one function in one cache share entries only when
    their jax.jit options are equal: options that change the program never
    reuse another wrapper's executable."""

    def f(x, y, unused):
        return x * 2 + y

    cache = ftjit.FunctionCache()
    plain = ftjit.jit(f, cache=cache)
    same = ftjit.jit(f, cache=cache)
    other = ftjit.jit(f, cache=cache, **KEYWORD_CASES[name])
    plain(jnp.arange(3.0), 1.0, jnp.zeros(2))
    same(jnp.arange(3.0), 1.0, jnp.zeros(2))
    assert (same.cache_info().hits, cache.size()) == (1, 1)  # equal options share
    other(jnp.arange(3.0), 1.0, jnp.zeros(2))
    info = other.cache_info()
    assert (info.misses, info.hits, info.compiles, cache.size()) == (1, 0, 1, 2)


def test_keep_unused_changes_the_compiled_program_per_wrapper():
    """keep_unused=False drops the unused parameter (a deleted array there is
    fine); keep_unused=True keeps it. Wrappers of one function with the other
    setting ran first: none reuses the other's program."""

    def scenario(jit):
        def f(x, y):
            return x * 2

        results = []
        for keep in (False, True, False, True):
            dead = jnp.ones(3)
            dead.delete()
            try:
                jit(f, keep_unused=keep)(jnp.ones(3), dead)
                results.append((keep, "ran"))
            except RuntimeError as e:
                results.append((keep, first_line(e)))
        return results

    want, _ = both(scenario)
    deleted = "Array has been deleted with shape=float32[3]."
    assert want.value == [(False, "ran"), (True, deleted), (False, "ran"), (True, deleted)]


@pytest.mark.parametrize("keep", [False, True])
def test_donated_unused_argument_is_deleted_only_when_kept(keep):
    # A fresh function per wrapper: jax.jit's own trace cache lets a
    # keep_unused=True wrapper inherit the donation decision of an earlier
    # keep_unused=False wrapper of the same function.
    def scenario(jit):
        def f(x, y):
            return x * 2

        y = jnp.ones(3)
        out = jit(f, keep_unused=keep, donate_argnums=1)(jnp.ones(3), y)
        return out, y.is_deleted()

    want, _ = both(scenario)
    assert want.value[1] is keep


def test_compiler_options_reach_xla_per_wrapper():
    """An unknown XLA option fails only the wrapper that has it, with XLA's error."""

    def scenario(jit):
        def f(x):
            return x + 1

        ok = jit(f)(jnp.ones(2))
        bad = jit(f, compiler_options={"ftjit_parity_no_such_option": 1})
        try:
            bad(jnp.ones(2))
            failed = None
        except Exception as e:  # noqa: BLE001 - compared
            failed = (type(e).__name__, first_line(e))
        again = jit(f)(jnp.ones(2))
        return ok, failed, again

    want, _ = both(scenario)
    assert want.value[1] == ("JaxRuntimeError", "INVALID_ARGUMENT: No such compile option: 'ftjit_parity_no_such_option'")


@pytest.mark.thread_unsafe(reason="records warnings (process-global warning filters)")
@pytest.mark.parametrize("kwargs", [dict(device=DEVICE), dict(backend=DEVICE.platform)], ids=["device", "backend"])
def test_device_and_backend_warn_once_at_decoration(kwargs):
    def make(jit):
        def f(x):
            return x * 3

        return jit(f, **kwargs)

    def decorate(jit):
        return callable(make(jit))

    def use(jit):
        jf = make(jit)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            outs = [jf(jnp.ones(2)), jf(jnp.ones(2)), jf(jnp.ones(3)), jf.lower(jnp.ones(4)).as_text() != ""]
        return outs, len(caught)

    want, _ = both_recording_warnings(decorate)
    assert [category for category, _ in want.warnings] == [DeprecationWarning]
    assert want.warnings[0][1].startswith(DEVICE_WARNING)
    # decorated once (one warning), then called, recompiled and lowered: none
    want, _ = both_recording_warnings(use)
    assert [category for category, _ in want.warnings] == [DeprecationWarning]
    assert want.value[1] == 0


@pytest.mark.thread_unsafe(reason="records warnings (process-global filters)")
def test_device_deprecation_warns_once_at_the_caller_like_jax_jit():
    device = jax.devices()[0]

    def record(make):
        def fun(x):
            return x * 2

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn = make(fun, device=device)  # the one line both warn at
            for x in (1.0, jnp.ones(3), np.ones(2, np.int32)):
                fn(x)
            fn.lower(2.0)
            fn(1.0)
        return [(w.category, str(w.message), w.filename, w.lineno) for w in caught]

    want = record(jax.jit)
    got = record(ftjit.jit)
    assert len(want) == 1 and want[0][0] is DeprecationWarning
    assert want[0][2] == __file__
    assert got == want


# --- decoration-time validation --------------------------------------------------


def _f():
    def f(x, y):
        return x + y

    return f


def _generator():
    def g(x):
        yield x

    return g


def _async_generator():
    async def g(x):
        yield x

    return g


def _varargs():
    def f(*args):
        return args[0]

    return f


def _kwargs():
    def f(**kwargs):
        return kwargs["a"]

    return f


# (id, scenario, jax's exception type or None, compare messages)
DECORATION_CASES = [
    ("not_callable", lambda jit: jit(3), TypeError, False),
    ("none", lambda jit: jit(None), TypeError, False),
    ("generator_function", lambda jit: jit(_generator()), TypeError, False),
    ("staticmethod_object", lambda jit: jit(staticmethod(_f())), TypeError, False),
    ("classmethod_object", lambda jit: jit(classmethod(_f())), TypeError, False),
    ("fun_as_keyword", lambda jit: jit(fun=_f()), TypeError, False),
    ("unknown_keyword", lambda jit: jit(_f(), no_such_keyword=1), TypeError, True),
    ("static_argnums_out_of_range", lambda jit: jit(_f(), static_argnums=5), ValueError, True),
    ("static_argnums_negative_out_of_range", lambda jit: jit(_f(), static_argnums=-5), ValueError, True),
    ("static_argnames_not_in_signature", lambda jit: jit(_f(), static_argnames="z"), ValueError, True),
    ("donate_argnums_out_of_range", lambda jit: jit(_f(), donate_argnums=5), ValueError, True),
    ("donate_argnames_not_in_signature", lambda jit: jit(_f(), donate_argnames="z"), ValueError, True),
    ("static_and_donated_argnums", lambda jit: jit(_f(), static_argnums=0, donate_argnums=0), ValueError, True),
    ("static_and_donated_argnames", lambda jit: jit(_f(), static_argnames="x", donate_argnames="x"), ValueError, True),
    ("static_argnums_donated_argnames", lambda jit: jit(_f(), static_argnums=1, donate_argnames="y"), ValueError, True),
    ("static_argnames_donated_argnums", lambda jit: jit(_f(), static_argnames="x", donate_argnums=0), ValueError, True),
    ("static_argnums_not_int", lambda jit: jit(_f(), static_argnums="x"), TypeError, False),
    ("static_argnames_not_str", lambda jit: jit(_f(), static_argnames=1), TypeError, False),
    ("bad_in_shardings", lambda jit: jit(_f(), in_shardings=3), TypeError, True),
    ("bad_out_shardings", lambda jit: jit(_f(), out_shardings=3), TypeError, True),
    ("device_and_backend", lambda jit: jit(_f(), device=DEVICE, backend=DEVICE.platform), ValueError, True),
    # accepted by both
    ("static_argnums_into_varargs", lambda jit: callable(jit(_varargs(), static_argnums=3)), None, True),
    ("static_argnames_into_kwargs", lambda jit: callable(jit(_kwargs(), static_argnames="a")), None, True),
    ("negative_static_argnums", lambda jit: callable(jit(_f(), static_argnums=-1)), None, True),
    ("builtin_function", lambda jit: callable(jit(len)), None, True),
    # no `fun` at all is the decorator factory (None is not "no fun": it is a non-callable)
    ("factory_without_arguments", lambda jit: callable(jit()(_f())), None, True),
    ("factory_with_keywords", lambda jit: callable(jit(static_argnums=1)(_f())), None, True),
    # jax.jit accepts it and fails at the call (it returns no JAX type); ftjit may refuse it earlier
    ("async_generator_function_called", lambda jit: jit(_async_generator())(1.0), TypeError, False),
]


# Cases that cannot run 8-way parallel, and why.
_DECORATION_THREAD_UNSAFE = {
    # inspect.signature(len) parses the text signature with ast; CPython 3.11's
    # AST recursion counter is shared by threads ("SystemError: AST constructor
    # recursion depth mismatch", raised on jax.jit's side in one CI run).
    "builtin_function": "inspect.signature of a builtin uses ast, whose recursion counter races on CPython 3.11",
}


@IGNORE_DEVICE_WARNING
@pytest.mark.parametrize("scenario, error, messages", [
    pytest.param(*c[1:], id=c[0], marks=[pytest.mark.thread_unsafe(reason=_DECORATION_THREAD_UNSAFE[c[0]])]
                 if c[0] in _DECORATION_THREAD_UNSAFE else [])
    for c in DECORATION_CASES
])
def test_decoration_time_validation_as_jax_jit(scenario, error, messages):
    want, got = both(scenario, messages=messages)
    if error is None:
        assert want.error is None and want.value is True
    else:
        assert type(want.error) is error
        assert isinstance(got.error, error)
        assert str(got.error)  # ftjit says why


def test_fun_keyword_is_rejected_like_jax_jit():
    def fun(x, n):
        return x * n

    with pytest.raises(TypeError) as want:
        jax.jit(fun=fun)
    with pytest.raises(TypeError) as got:
        ftjit.jit(fun=fun)
    assert str(got.value) == str(want.value)
    deco = ftjit.jit(static_argnums=1, cache=ftjit.FunctionCache())
    assert float(deco(fun)(2.0, 3)) == 6.0


@pytest.mark.parametrize("make, phrase", [
    (lambda jit: jit(3), "Expected a callable value"),
    (lambda jit: jit(staticmethod(lambda x: x)), "staticmethod arguments are not supported"),
    (lambda jit: jit(static_argnums=(0,))(classmethod(lambda cls, x: x)), "Expected a callable value"),
])
def test_decoration_errors_carry_jax_jit_words(make, phrase):
    for jit in (jax.jit, ftjit.jit):
        with pytest.raises(TypeError, match=re.escape(phrase)):
            make(jit)


def test_a_generator_function_is_refused_in_jax_jit_words():
    def gen(x):
        yield x

    with pytest.raises(TypeError, match=r"^Expected a function, got a generator function: ftjit\.jit cannot jit "):
        ftjit.jit(gen)


_NOT_WEAKREFABLE = """
import sys
import jax, ftjit

class Doubler:
    __slots__ = ()  # no __weakref__: jax.jit caches its functions by weak reference

    def __call__(self, x):
        return x * 2

jit = {"jax": jax.jit, "ftjit": ftjit.jit}[sys.argv[1]]
jf = jit(Doubler())
print("decorated", flush=True)
try:
    jf(1.0)
except TypeError as e:
    print("TypeError:", e, flush=True)
"""


@pytest.mark.parametrize("name", ["jax", "ftjit"])
def test_a_callable_that_is_not_weakrefable_fails_the_call_as_with_jax_jit(name):
    """jax.jit accepts it and raises TypeError at the call. (jax.jit of such a
    callable a second time in one process crashes the interpreter, so each
    jit runs in its own process, and ftjit must not jax.jit it twice.)"""
    proc = subprocess.run(
        [sys.executable, "-c", _NOT_WEAKREFABLE, name], capture_output=True, text=True, timeout=240, env=child_env()
    )
    assert (proc.returncode, proc.stdout) == (
        0,
        "decorated\nTypeError: cannot create weak reference to 'Doubler' object\n",
    ), proc.stderr[-2000:]


def test_static_argnames_resolve_to_positions_and_back_as_jax_jit():
    def scenario(jit):
        traces = []

        def f(x, n):
            traces.append(n)
            return x * n

        by_name = jit(f, static_argnames="n")
        by_num = jit(f, static_argnums=1)
        outs = [by_name(1.0, 2), by_name(1.0, n=2), by_num(1.0, 3), by_num(1.0, n=3), by_name(1.0, 2)]
        return outs, traces

    want, _ = both(scenario)
    assert want.value[1] == [2, 2, 3, 3]


def test_negative_static_argnums_follow_the_installed_jax():
    """jax 0.12 reads static_argnums=-1 of f(x, scale=2.0) as `scale`; earlier
    releases count from the end of each call's positional arguments. ftjit
    follows whichever JAX is installed: same results, same error types."""
    import jax
    import jax.numpy as jnp

    def f(x, scale=2.0):
        return x * scale

    def outcomes(jit):
        g = jit(f, static_argnums=-1)
        out = []
        for call in (lambda: g(jnp.ones(2)), lambda: g(3.0), lambda: g(3.0, 4.0), lambda: g(jnp.ones(2), 5.0)):
            try:
                out.append(np.asarray(call()).tolist())
            except ValueError as e:  # an unhashable static (jax: ValueError; ftjit's is a ValueError too)
                out.append(("ValueError", type(e).__name__ == "UnhashableStaticArgumentError" or "hashable" in str(e)))
        return out

    ours, theirs = outcomes(ftjit.jit), outcomes(jax.jit)
    assert ours == theirs
    assert ours[1:] == [6.0, 12.0, [5.0, 5.0]]
    assert ours[0] == ([2.0, 2.0] if ftjit._jax.resolves_negative_static_argnums() else ("ValueError", True))


def test_explicit_empty_static_side_infers_nothing_as_jax_jit():
    # jax.jit infers the other side only from a side left None: with
    # static_argnums=() given, n passed positionally stays dynamic (traced).
    def scenario(jit):
        traces = []

        def f(x, n):
            traces.append(type(n).__name__ == "int")
            return x * n

        g = jit(f, static_argnums=(), static_argnames="n")
        h = jit(f, static_argnums=1, static_argnames=())
        outs = [g(1.0, 2), g(1.0, 3), g(1.0, n=4), h(1.0, 5), h(1.0, n=6), h(1.0, n=7)]
        return outs, traces

    want, _ = both(scenario)
    # g: positional n traced (one trace for 2 and 3), keyword n static;
    # h: positional n static, keyword n traced (one trace for 6 and 7).
    assert want.value[1] == [False, True, True, False]


def test_decorator_form_as_jax_jit():
    def scenario(jit):
        @jit(static_argnames="n", donate_argnums=0)
        def f(x, n):
            return x * n

        x = jnp.ones(3)
        return f(x, n=4), x.is_deleted(), f.__name__

    want, _ = both(scenario)
    assert want.value[1:] == (True, "f")


def test_wrapper_attributes_as_jax_jit():
    def scenario(jit):
        def f(x, y=2.0):
            """Doc of f."""
            return x * y

        jf = jit(f)
        return (
            jf.__name__,
            jf.__qualname__.rsplit(".", 1)[-1],
            jf.__module__,
            jf.__doc__,
            jf.__wrapped__ is f,
            str(inspect.signature(jf)),
            isinstance(jf, jax.stages.Wrapped),
            weakref.ref(jf)() is jf,
            type(jf.__get__(object(), object)).__name__,
        )

    want, _ = both(scenario)
    assert want.value == ("f", "f", __name__, "Doc of f.", True, "(x, y=2.0)", True, True, "method")


def test_getstate_names_the_function_as_jax_jit_does():
    def my_function():
        return None

    named = functools.partial(my_function)
    named.__name__ = "my_partial"
    cases = [(my_function, "my_function"), (functools.partial(my_function), "my_function"),
             (functools.partial(functools.partial(my_function)), "my_function"), (named, "my_partial"),
             (lambda: my_function(), "<lambda>")]
    for fun, name in cases:
        assert ftjit.jit(fun).__getstate__()["function_name"] == name
        assert jax.jit(fun).__getstate__()["function_name"] == name


def test_repr_survives_a_function_whose_repr_raises():
    class Callable:
        def __call__(self):
            return None

        def __repr__(self):
            raise ValueError("invalid repr")

    jf = ftjit.jit(Callable(), compiler=lambda fun, a, k: fun)
    assert repr(jf) == "<ftjit.JitFunction>"
    del jf.__wrapped__
    assert repr(jf) == "<ftjit.JitFunction>"


def test_tools_that_ask_is_this_jitted_see_a_jitted_function():
    """JAX's protocol for jitted functions (jax.stages.Wrapped) holds, and
    chex's is_traceable, which recognises wrappers by the api_boundary their
    module defines, sees one: chex.assert_max_traces then refuses the wrong
    wrapper order, as for jax.jit."""
    jf = ftjit.jit(lambda x: x)
    assert isinstance(jf, jax.stages.Wrapped) and isinstance(jax.jit(lambda x: x), jax.stages.Wrapped)
    assert "api_boundary" in jf.__globals__ and jf.__globals__["api_boundary"] is ftjit._jit.api_boundary
    chex = require_module("chex", "this test asks chex what it sees of a jitted function")
    from chex._src import asserts_internal

    assert asserts_internal.is_traceable(jf) and not asserts_internal.is_traceable(lambda x: x)
    with pytest.raises(ValueError, match="must not wrap JAX-transformed function"):
        chex.assert_max_traces(jf, 1)


# (id, call, jax's exception type, compare messages: Python's own binding errors)
CALL_ERROR_CASES = [
    ("missing_argument", lambda jf: jf(), TypeError, True),
    ("too_many_arguments", lambda jf: jf(1.0, 2.0, 3.0), TypeError, True),
    ("unknown_keyword", lambda jf: jf(1.0, z=3.0), TypeError, True),
    ("duplicate_argument", lambda jf: jf(1.0, x=3.0), TypeError, True),
    ("string_argument", lambda jf: jf("a"), TypeError, False),
    ("object_argument", lambda jf: jf(object()), TypeError, False),
    ("shape_dtype_struct_argument", lambda jf: jf(jax.ShapeDtypeStruct((2,), jnp.float32)), TypeError, False),
    ("int_overflow", lambda jf: jf(2**40), OverflowError, False),
]


@pytest.mark.parametrize("call, error, messages", [c[1:] for c in CALL_ERROR_CASES], ids=[c[0] for c in CALL_ERROR_CASES])
def test_bad_calls_raise_jax_jits_error_types(call, error, messages):
    def scenario(jit):
        def f(x, y=2.0):
            return x * y

        return call(jit(f))

    want, _ = both(scenario, messages=messages)
    assert type(want.error) is error


def test_a_bad_input_names_its_path_in_jax_jit_words_and_ftjit_words():
    def f(x):
        return x

    with pytest.raises(TypeError, match=r"^Error interpreting argument to .* as an abstract array\. The problematic "
                                        r"value is of type str and was passed to the function at path x\[0\]\['k'\]\. "
                                        r"\(ftjit: argument 'x\[0\]\['k'\]' \(positional argument 0\) of .*f\(\) is of "
                                        r"type str, which is not a valid argument type"):
        ftjit.jit(f)([{"k": "foo"}])


def test_calling_with_a_shape_dtype_struct_is_a_type_error_as_in_jax_jit():
    spec = jax.ShapeDtypeStruct((2, 3), jnp.int32)
    with pytest.raises(TypeError) as theirs:
        jax.jit(lambda d: d)({"a": [1.0, spec]})
    f = ftjit.jit(lambda d: d)
    with pytest.raises(TypeError) as ours:
        f({"a": [1.0, spec]})
    assert type(ours.value) is TypeError
    assert str(ours.value).startswith(str(theirs.value))  # jax.jit's words, then ftjit's hint
    assert str(ours.value) == ("Argument 'd['a'][1]' of shape int32[2,3] of type <class 'jax.ShapeDtypeStruct'> is "
                               "not a valid JAX type. (A jax.ShapeDtypeStruct describes an argument: pass it to "
                               "precompile() or warmup(), and call with an array.)")
    assert f.precompile({"a": [1.0, spec]}) is True  # where a spec is what is asked for


def test_unsortable_dict_keys_are_a_value_error_as_in_jax_jit():
    arg = {1: 1.0, "a": 2.0}
    with pytest.raises(ValueError):
        jax.jit(lambda d: d)(arg)
    with pytest.raises(ValueError) as info:
        ftjit.jit(lambda d: d, cache=ftjit.FunctionCache())(arg)
    assert str(info.value) == (
        "Comparator raised exception while sorting pytree dictionary keys: "  # jax.jit's words
        "the keys of a dict argument 'd' (positional argument 0) cannot be sorted; dict keys of a "
        "jitted function's arguments must be mutually comparable (e.g. all str)"
    )
    assert type(info.value.__cause__) is TypeError


def test_object_with_jax_array_is_a_value_error_as_in_jax_jit():
    class Convertible:
        def __jax_array__(self):
            return jnp.ones(2)

    with pytest.raises(ValueError, match="__jax_array__"):
        jax.jit(lambda x: x)(Convertible())
    jf = ftjit.jit(lambda x: x, cache=ftjit.FunctionCache())
    with pytest.raises(ValueError) as info:
        jf(Convertible())
    assert str(info.value) == (
        "argument 'x' (positional argument 0) of test_object_with_jax_array_is_a_value_error_as_in_jax_jit."
        "<locals>.<lambda>() is of type Convertible, which defines __jax_array__: JAX no longer converts "
        "such objects implicitly. Convert it with jax.numpy.asarray() before the call, or register its "
        "type as a pytree."
    )
    assert jf.cache_info().misses == 0


# --- methods ---------------------------------------------------------------------


def _method_fun():
    def f(x, y, *, n, s):
        return {"a": x * y * n, "b": x.sum() + s.sum()}

    return f


METHOD_ARGS = (jnp.arange(6.0).reshape(2, 3), 2.0)
METHOD_KWARGS = dict(n=3, s=jnp.ones(2))


def test_lower_compile_as_text_compiler_ir_cost_analysis_as_jax_jit():
    def scenario(jit):
        jf = jit(_method_fun(), static_argnames="n")
        lowered = jf.lower(*METHOD_ARGS, **METHOD_KWARGS)
        compiled = lowered.compile()
        cost = compiled.cost_analysis()
        return {
            "lowered_type": type(lowered),
            "compiled_type": type(compiled),
            "text": lowered.as_text(),
            "hlo": lowered.as_text(dialect="hlo"),
            "ir": str(lowered.compiler_ir("stablehlo")),
            "lowered_cost": lowered.cost_analysis(),
            "args_info": str(lowered.args_info),
            "out_info": str(lowered.out_info),
            "compiled_text": compiled.as_text(),  # op metadata names the user's frames
            "compiled_cost": None if cost is None else sorted(cost.items()),
            "in_tree": compiled.in_tree,
            "result": compiled(*METHOD_ARGS, s=METHOD_KWARGS["s"]),
            "cache_size": jf._cache_size(),  # lowering does not fill the call cache
        }

    want, _ = both(scenario)
    assert want.value["lowered_type"] is jax.stages.Lowered
    assert want.value["compiled_type"] is jax.stages.Compiled
    assert want.value["cache_size"] == 0
    assert want.value["result"]["b"] == _leaf(jnp.float32(17.0))


# (id, call, jax's exception type or None)
COMPILED_MISMATCH_CASES = [
    ("missing_keyword", lambda c: c(*METHOD_ARGS), TypeError),
    ("static_passed_again", lambda c: c(*METHOD_ARGS, **METHOD_KWARGS), TypeError),
    ("extra_positional", lambda c: c(*METHOD_ARGS, 5.0, s=METHOD_KWARGS["s"]), TypeError),
    ("dtype", lambda c: c(METHOD_ARGS[0].astype(jnp.int32), 2.0, s=METHOD_KWARGS["s"]), TypeError),
    ("shape", lambda c: c(jnp.ones(3), 2.0, s=METHOD_KWARGS["s"]), TypeError),
    ("strong_for_weak_type", lambda c: c(METHOD_ARGS[0], jnp.float32(2.0), s=METHOD_KWARGS["s"]), None),
]


@pytest.mark.parametrize("call, error", [c[1:] for c in COMPILED_MISMATCH_CASES], ids=[c[0] for c in COMPILED_MISMATCH_CASES])
def test_compiled_called_with_a_mismatch_raises_jax_jits_error(call, error):
    def scenario(jit):
        return call(jit(_method_fun(), static_argnames="n").lower(*METHOD_ARGS, **METHOD_KWARGS).compile())

    want, _ = both(scenario)
    assert (want.error is None) if error is None else (type(want.error) is error)


def test_trace_and_eval_shape_as_jax_jit():
    def scenario(jit):
        jf = jit(_method_fun(), static_argnames="n")
        traced = jf.trace(*METHOD_ARGS, **METHOD_KWARGS)
        shapes = jf.eval_shape(*METHOD_ARGS, **METHOD_KWARGS)
        specs = jf.eval_shape(jax.ShapeDtypeStruct((5, 3), jnp.float16), 2.0, n=1, s=jax.ShapeDtypeStruct((2,), jnp.float16))
        return {
            "type": type(traced),
            "jaxpr": str(traced.jaxpr),
            "out_info": str(traced.out_info),
            "lowered": traced.lower().as_text(),
            "shapes": str(shapes),
            "specs": str(specs),
            "cache_size": jf._cache_size(),
        }

    want, _ = both(scenario)
    assert want.value["type"] is jax.stages.Traced
    assert want.value["cache_size"] == 0
    assert want.value["specs"] == str({"a": jax.ShapeDtypeStruct((5, 3), jnp.float16), "b": jax.ShapeDtypeStruct((), jnp.float16)})


def test_cache_size_clear_cache_and_trace_counts_as_jax_jit():
    """_cache_size counts cached signatures; clear_cache empties it and the
    next call traces again (so it sees changed globals), as with jax.jit."""

    def scenario(jit):
        traces = []
        factor = {"k": 2.0}

        def g(x):
            traces.append(getattr(x, "shape", None))
            return x * factor["k"]

        jg = jit(g)
        rows = [(jg._cache_size(), len(traces))]
        for arg in (1.0, 2.0, jnp.ones(2)):
            rows.append((jg(arg), jg._cache_size(), len(traces)))
        factor["k"] = 5.0
        rows.append((jg(1.0), jg._cache_size(), len(traces)))  # cached: old constant
        jg.clear_cache()
        rows.append((jg._cache_size(), len(traces)))
        rows.append((jg(1.0), jg._cache_size(), len(traces)))  # traced again: new constant
        jg.lower(jnp.ones(3))
        jg.trace(jnp.ones(4))
        jg.eval_shape(jnp.ones(5))
        rows.append((jg._cache_size(), len(traces)))
        return rows

    want, _ = both(scenario)
    assert want.value[0] == (0, 0)
    assert [row[-2:] for row in want.value[1:]] == [(1, 1), (1, 1), (2, 2), (2, 2), (0, 2), (1, 3), (1, 6)]
    assert want.value[4][0][4] == 2.0  # the cached program kept the old constant
    assert want.value[6][0][4] == 5.0  # retraced after clear_cache


@pytest.mark.thread_unsafe(reason="jax.clear_caches() clears every cache in the process")
def test_jax_clear_caches_clears_jitted_functions_as_jax_jit():
    def scenario(jit):
        traces = []
        factor = {"k": 2.0}

        def g(x):
            traces.append(1)
            return x * factor["k"]

        jg = jit(g)
        rows = [jg(1.0), jg(jnp.ones(2))]
        factor["k"] = 7.0
        jax.clear_caches()
        rows.append((jg._cache_size(), len(traces)))
        rows.append((jg(1.0), jg._cache_size(), len(traces)))
        return rows

    want, _ = both(scenario)
    assert want.value[2] == (0, 2)
    assert want.value[3][0][4] == 7.0 and want.value[3][1:] == (1, 3)


@pytest.mark.thread_unsafe(reason="jax.clear_caches() clears every cache in the process")
def test_jax_clear_caches_also_clears_functions_of_other_compilers():
    """jax.clear_caches() calls ftjit.clear_caches(), which drops every ftjit entry."""
    from helpers import CountingCompiler

    ftjit.jit(lambda x: x)(1.0)  # a JAX-compiled ftjit function: ftjit is hooked into jax
    comp = CountingCompiler()
    jf = ftjit.jit(lambda x: x + 1, compiler=comp, cache=ftjit.FunctionCache())
    assert (jf(1), jf(1), comp.calls, jf._cache_size()) == (2, 2, 1, 1)
    jax.clear_caches()
    assert jf._cache_size() == 0
    assert (jf(1), comp.calls, jf._cache_size()) == (2, 2, 1)


# --- ftjit inside JAX: the hooks that hide it, and their fallbacks ---------------------

PACKAGE_DIR = os.path.dirname(os.path.abspath(ftjit.__file__))


def test_ftjit_is_hooked_into_jax_once_per_process():
    """The first JAX-compiled ftjit.jit registers ftjit with jax's traceback
    filter, source-location recorder and cache registry; later ones do not."""
    from jax._src import source_info_util, traceback_util, util

    jfs = [ftjit.jit(lambda x: x) for _ in range(3)]
    hooks = ftjit._jit._jax_integration
    assert hooks is not None
    assert hooks[:3] == (traceback_util.api_boundary, True, True)
    assert traceback_util._exclude_paths.count(PACKAGE_DIR) == 1
    assert source_info_util._exclude_paths.count(PACKAGE_DIR + os.sep) == 1
    assert [name for cache, name in util._caches.items() if cache is hooks.clear_caches_hook] == ["ftjit.clear_caches"]
    # The compile of a JAX-compiled function runs under jax's traceback
    # boundary; lower/trace/eval_shape are its jax.jit's own (jax's
    # boundaries), reached from methods the C++ type defines once for all.
    from helpers import CountingCompiler

    other = ftjit.jit(lambda x: x, compiler=CountingCompiler())
    boundary_code = traceback_util.api_boundary(len).__code__
    for method in ("lower", "trace", "eval_shape"):
        assert type(vars(ftjit.JitFunction)[method]).__name__ == "nb_method"
        assert getattr(jfs[0]._hooks, method) == getattr(jfs[0]._hooks.fallback, method)
        assert getattr(other._hooks, method) is None
    assert jfs[0]._compiler.__code__ is boundary_code
    assert type(other._compiler) is CountingCompiler


class _Recorder:
    """Stands in for one of jax's private modules (see ftjit._jax.integrate)."""

    def __init__(self, *names, fail=False):
        self.calls = []
        for name in names:
            setattr(self, name, self._record(name, fail))

    def _record(self, name, fail):
        def register(*args):
            self.calls.append((name, *args))
            if fail:
                raise AttributeError("this JAX changed its API")

        return register


def test_integrate_registers_ftjit_through_each_api_it_finds():
    cleared = []
    tb, si = _Recorder("register_exclusion", "api_boundary"), _Recorder("register_exclusion")
    util = _Recorder("register_cache")
    modules = {"traceback_util": tb, "source_info_util": si, "util": util}
    got = ftjit._jax.integrate("/pkg/ftjit", lambda: cleared.append(1), modules)
    assert got[:3] == (tb.api_boundary, True, True)
    assert tb.calls == [("register_exclusion", "/pkg/ftjit")]
    assert si.calls == [("register_exclusion", "/pkg/ftjit" + os.sep)]  # a prefix that cannot match /pkg/ftjit_extras
    assert util.calls == [("register_cache", got.clear_caches_hook, "ftjit.clear_caches")]
    got.clear_caches_hook.cache_clear()
    assert cleared == [1]
    assert (got.clear_caches_hook.cache_info(), got.clear_caches_hook.cache_keys()) == (None, [])
    weakref.ref(got.clear_caches_hook)  # jax's registry holds caches weakly


@pytest.mark.parametrize("missing", ["modules", "attributes", "failing"])
def test_integrate_falls_back_to_registering_nothing(missing):
    """A JAX without these private APIs (or whose registration raises): nothing
    is registered, and the boundary is the identity (ftjit's frames then show)."""
    if missing == "modules":
        modules = {}
    elif missing == "attributes":
        modules = {"traceback_util": _Recorder(), "source_info_util": _Recorder(), "util": _Recorder()}
    else:
        modules = {
            "traceback_util": _Recorder("register_exclusion", fail=True),
            "source_info_util": _Recorder("register_exclusion", fail=True),
            "util": _Recorder("register_cache", fail=True),
        }
    got = ftjit._jax.integrate("/pkg/ftjit", lambda: None, modules)
    assert got[1:] == (False, False, None)
    assert got.api_boundary(len) is len


_WITHOUT_JAX_HOOKS = """
import traceback
import jax, jax.numpy as jnp
import ftjit

real = ftjit._jax.integrate
# a JAX without the APIs (ftjit._jit calls integrate under this name)
ftjit._jit._integrate_with_jax = lambda package_dir, clear: real(package_dir, clear, {})
traces = []
factor = {"k": 2.0}

def g(x):
    traces.append(1)
    return x * factor["k"]

jg = ftjit.jit(g)
print("integration", ftjit._jit._jax_integration[1:], flush=True)
print("calls", float(jg(1.0)), float(jg(1.0)), len(traces), flush=True)
factor["k"] = 3.0
jax.clear_caches()  # ftjit is not registered: its entry stays
print("after jax.clear_caches", jg._cache_size(), float(jg(1.0)), flush=True)
jg.clear_cache()  # needs none of the hooks
print("after clear_cache", jg._cache_size(), float(jg(1.0)), len(traces), flush=True)
print("lower", jg.lower(jnp.ones(2)).compile()(jnp.ones(2)).tolist(), flush=True)

def bad(x):
    return x.reshape(7)

for use in (lambda: ftjit.jit(bad)(jnp.ones(4)), lambda: ftjit.jit(bad).lower(jnp.ones(4))):
    try:
        use()
    except TypeError as e:
        print("frames", [fr.name for fr in traceback.extract_tb(e.__traceback__)][2:5], flush=True)
"""


def test_ftjit_works_without_jaxs_private_hooks():
    """The fallback, end to end in a fresh process: results, clear_cache and
    lower are unchanged; jax.clear_caches() leaves ftjit alone; tracebacks
    show ftjit's frames (the hooks are what hide them)."""
    proc = subprocess.run([sys.executable, "-c", _WITHOUT_JAX_HOOKS], capture_output=True, text=True, timeout=240,
                          env=child_env())
    assert (proc.returncode, proc.stdout.splitlines()) == (
        0,
        [
            "integration (False, False, None)",
            "calls 2.0 2.0 1",
            "after jax.clear_caches 1 2.0",
            "after clear_cache 0 3.0 2",
            "lower [3.0, 3.0]",
            "frames ['__call__', 'bad', 'meth']",  # BoundJaxCompiler (no boundary hides it), the function
            "frames ['bad', 'meth', '_reshape']",  # lower: jax.jit's own, reached from a nanobind method (no frame)
        ],
    ), proc.stderr[-3000:]


@pytest.mark.parametrize("how", ["call", "precompile"])
def test_other_compilers_errors_keep_their_tracebacks(how):
    """jax's traceback boundary is for the JAX compiler only: another
    compiler's error keeps every frame and gets no note from jax."""
    ftjit.jit(lambda x: x)  # ftjit is hooked into jax

    def compiler(fun, args, kwargs):
        raise ValueError("no compiler today")

    jf = ftjit.jit(lambda x: x, compiler=compiler, cache=ftjit.FunctionCache())
    with pytest.raises(ValueError) as info:
        jf(1.0) if how == "call" else jf.precompile(1.0)
    frames = [name for _, name in _frames(info.value)]
    assert frames[-2:] == ["test_other_compilers_errors_keep_their_tracebacks", "compiler"]  # the caller, the compiler
    assert getattr(info.value, "__notes__", None) is None


@pytest.mark.thread_unsafe(reason="records warnings (process-global warning filters)")
def test_max_signatures_warning_points_at_the_calling_line_through_jaxs_boundary():
    """The JAX compiler runs under jax's traceback boundary (one more frame):
    the warning still names the line that called the function."""
    jf = ftjit.jit(lambda x: x * 2, cache=ftjit.FunctionCache(), max_signatures=1)
    jf(jnp.ones(1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = sys._getframe().f_lineno + 1
        jf(jnp.ones(2))
    assert [(w.category, w.filename, w.lineno) for w in caught] == [(RuntimeWarning, __file__, line)]


def _run(code):
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=child_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip()


@pytest.mark.thread_unsafe(reason="spawns an interpreter; slow to repeat 8x")
def test_rebinding_jax_jit_to_ftjit_jit_works():
    """`jax.jit = ftjit.jit`, the usual way to make a library use ftjit,
    must not make ftjit call itself: it uses JAX's own jit, found where JAX
    defines it. A functools.partial of the rebound name (chex's wrappers) too."""
    out = _run(
        "import functools, jax, jax.numpy as jnp, ftjit\n"
        "jax.jit = ftjit.jit\n"
        "f = jax.jit(lambda x: x * 2)\n"
        "g = functools.partial(jax.jit, static_argnums=1)(lambda x, n: x * n)\n"
        "print(float(f(1.0)), float(g(jnp.ones(()), 3)), type(f).__name__, f.cache_info().compiles)\n")
    assert out == "2.0 3.0 JitFunction 1"


@pytest.mark.thread_unsafe(reason="spawns an interpreter; slow to repeat 8x")
def test_decorating_touches_no_device():
    """Nothing may start the XLA backend before the first call: device
    settings made after a module-level @ftjit.jit (jax_num_cpu_devices,
    XLA_FLAGS, jax.distributed.initialize) must still take effect."""
    out = _run(
        "import os, jax, numpy as np, ftjit\n"
        "@ftjit.jit\n"
        "def f(x):\n"
        "    return x * 2\n"
        "g = ftjit.jit(lambda x, n: x * n, static_argnums=1)\n"
        "jax.config.update('jax_num_cpu_devices', 4)\n"
        "print(len(jax.devices()), f(np.ones(2)).tolist(), g(np.ones(2), 3).tolist())\n")
    assert out == "4 [2.0, 2.0] [3.0, 3.0]"
    out = _run(
        "import os, jax, numpy as np, ftjit\n"
        "f = ftjit.jit(lambda x: x + 1)\n"
        "os.environ['XLA_FLAGS'] = '--xla_force_host_platform_device_count=3'\n"
        "print(len(jax.devices()), f(np.zeros(2)).tolist())\n")
    assert out == "3 [1.0, 1.0]"


# --- disable_jit -----------------------------------------------------------------


def _disable_jit_scenario(disabled: Callable[[], Any]) -> Callable[[Callable], Any]:
    def scenario(jit):
        seen = []

        def g(x):
            seen.append(type(x).__name__)
            return x + 1

        jg = jit(g)
        with disabled():
            inside = jg(np.float32(1.0))
            inside_array = jg(np.ones(2, np.float32))
        after = jg(np.float32(1.0))
        return (type(inside).__name__, inside), (type(inside_array).__name__, inside_array), after, seen

    return scenario


def test_jax_disable_jit_runs_the_python_function_eagerly():
    want, got = both(_disable_jit_scenario(jax.disable_jit))
    assert want.value[0] == ("float32", _leaf(np.float32(2.0)))
    assert want.value[1][0] == "ndarray"
    assert want.value[3] == ["float32", "ndarray", "DynamicJaxprTracer"]


@pytest.mark.thread_unsafe(reason="jax.config.update('jax_disable_jit') is process-global")
def test_jax_disable_jit_config_runs_the_python_function_eagerly():
    import contextlib

    @contextlib.contextmanager
    def config_disabled():
        jax.config.update("jax_disable_jit", True)
        try:
            yield
        finally:
            jax.config.update("jax_disable_jit", False)

    want, _ = both(_disable_jit_scenario(config_disabled))
    assert want.value[3] == ["float32", "ndarray", "DynamicJaxprTracer"]


@pytest.mark.parametrize("cached", [False, True], ids=["uncached", "cached"])
def test_jax_disable_jit_runs_python_like_jax_jit(cached):
    def body(x):
        seen.append(type(x))
        return x * 2

    outcomes = []
    for make in (jax.jit, ftjit.jit):
        seen = []
        fn = make(body)
        if cached:
            fn(1.5)
        seen.clear()
        with jax.disable_jit():
            out = fn(1.5)
            text = fn("ab")  # any argument: f is just called
        outcomes.append((out, type(out), text, list(seen)))
        if make is ftjit.jit:
            assert fn.cache_info().compiles == (1 if cached else 0)
            assert float(fn(1.5)) == 3.0  # and jit is back afterwards
    assert outcomes[1] == outcomes[0] == (3.0, float, "abab", [float, str])


def test_precompile_inside_disable_jit_says_why():
    jf = ftjit.jit(lambda x: x, cache=ftjit.FunctionCache())
    with jax.disable_jit():
        with pytest.raises(TypeError) as info:
            jf.precompile(jnp.ones(2))
    assert str(info.value) == (
        "cannot precompile test_precompile_inside_disable_jit_says_why.<locals>.<lambda>() here: the call "
        "would take the compiler's fallback path, which is not cached (e.g. tracers among the arguments, "
        "a JAX trace active, or jax.disable_jit() on)"
    )
    assert jf.precompile(jnp.ones(2)) is True


# --- donation --------------------------------------------------------------------


def test_donated_inputs_are_deleted_as_with_jax_jit():
    def scenario(jit):
        def f(a, b, tree):
            return a + b, {k: v * 2 for k, v in tree.items()}

        jf = jit(f, donate_argnums=(0, 2))
        jg = jit(lambda a, b: a + b, donate_argnames="b")
        a, b, tree = jnp.ones(3), jnp.ones(3), {"p": jnp.ones(2), "q": jnp.zeros(2)}
        out = jf(a, b, tree)
        a2, b2 = jnp.ones(3), jnp.ones(3)
        out2 = jg(a2, b2)
        a3, b3 = jnp.ones(3), jnp.ones(3)
        out3 = jg(a3, b=b3)
        np_in = np.ones(3, np.float32)
        out4 = jf(np_in, np_in, {"p": np.ones(2, np.float32), "q": np.ones(2, np.float32)})
        return (
            out,
            [a.is_deleted(), b.is_deleted(), tree["p"].is_deleted(), tree["q"].is_deleted()],
            out2,
            [a2.is_deleted(), b2.is_deleted()],
            out3,
            [a3.is_deleted(), b3.is_deleted()],
            out4,
        )

    want, _ = both(scenario)
    assert want.value[1] == [True, False, True, True]
    assert want.value[3] == [False, True] and want.value[5] == [False, True]


def test_reusing_a_donated_buffer_raises_jax_jits_error():
    def scenario(jit):
        jf = jit(lambda x: x * 2, donate_argnums=0)
        x = jnp.ones(3)
        jf(x)
        return jf(x)

    want, got = both(scenario)
    # Word for word what jax.jit says on the backend in use, whatever that is: "INVALID_ARGUMENT: Invalid buffer
    # passed to Execute() ... Buffer has been deleted or donated." (jax 0.10, CPU), "Array has been deleted with
    # shape=float32[3]." (jax 0.12), "INVALID_ARGUMENT: ... Donation requested for invalid buffer" (a TPU).
    assert want.error is not None
    assert str(got.error) == str(want.error)


@pytest.mark.thread_unsafe(reason="records warnings (process-global warning filters)")
def test_unusable_donation_warns_as_jax_jit():
    """One warning per compiled signature (and one per lower), none per hit."""

    def scenario(jit):
        def f(x):
            return x.sum()

        jf = jit(f, donate_argnums=0)
        xs = [jnp.arange(3.0) for _ in range(3)]
        outs = [jf(x) for x in xs]
        outs.append(jf(jnp.arange(4.0)))
        jf.lower(jnp.arange(5.0))
        return outs, [x.is_deleted() for x in xs]

    want, _ = both_recording_warnings(scenario)
    assert [w[0] for w in want.warnings] == [UserWarning] * 3
    assert [w[1] for w in want.warnings] == [
        f"Some donated buffers were not usable: float32[{n}]." for n in (3, 4, 5)
    ]
    assert want.value[1] == [False, False, False]


def test_donation_inside_an_outer_jit_is_ignored_as_with_jax_jit():
    def scenario(jit):
        jf = jit(lambda x: x * 2, donate_argnums=0)
        x = jnp.arange(3.0)
        out = jax.jit(lambda y: jf(y) + 1)(x)
        x_donated_by_outer = jnp.arange(3.0)
        out2 = jax.jit(lambda y: jf(y) + 1, donate_argnums=0)(x_donated_by_outer)
        return out, x.is_deleted(), out2, x_donated_by_outer.is_deleted()

    want, _ = both(scenario)
    assert want.value[1] is False and want.value[3] is True


@pytest.mark.parametrize("transform", ["grad", "vmap", "scan"])
def test_donation_under_transformations_as_with_jax_jit(transform):
    def scenario(jit):
        jf = jit(lambda x: x * 2, donate_argnums=0)
        x = jnp.arange(3.0)
        if transform == "grad":
            out = jax.grad(lambda v: jf(v).sum())(x)
        elif transform == "vmap":
            out = jax.vmap(jf)(x)
        else:
            out = jax.lax.scan(lambda c, v: (c + jf(v), None), 0.0, x)[0]
        return out, x.is_deleted()

    both(scenario)


# --- errors ----------------------------------------------------------------------


@pytest.mark.parametrize("how", ["positional", "keyword"])
def test_unhashable_static_argument_is_a_value_error_and_a_type_error(how):
    def scenario(jit):
        jf = jit(lambda x, s: x * len(s), static_argnums=1)
        return jf(1.0, [1, 2]) if how == "positional" else jf(1.0, s=[1, 2])

    want, got = both(scenario, messages=False)
    assert type(want.error) is ValueError and not isinstance(want.error, TypeError)
    assert isinstance(got.error, ValueError) and isinstance(got.error, TypeError)
    for error in (want.error, got.error):
        assert "Non-hashable static arguments are not supported" in str(error)
    assert "list" in str(got.error)


_unique_hashes = itertools.count(0x5EED0000)


def failing_eq_class():
    """A fresh class whose instances hash alike (a hash no other run uses:
    jax's process-wide caches keep statics they saw, and would compare a new
    one against them) and whose __eq__ raises."""
    value = next(_unique_hashes)

    class FailingEq:
        def __hash__(self):
            return value

        def __eq__(self, other):
            raise RuntimeError("parity: __eq__ failed")

    return FailingEq


class FailingHash:
    def __hash__(self):
        raise RuntimeError("parity: __hash__ failed")


def test_static_argument_whose_eq_raises_is_reported_as_jax_reports_it():
    def scenario(jit):
        failing_eq = failing_eq_class()
        jf = jit(lambda x, s: x + 1, static_argnums=1)
        jf(1.0, failing_eq())
        return jf(1.0, failing_eq())

    want, got = both(scenario)
    assert type(want.error) is ValueError
    assert first_line(want.error).startswith("static arguments should be comparable using __eq__.")
    for error in (want.error, got.error):
        lines = str(error).strip().splitlines()
        assert lines[-1] == "RuntimeError: parity: __eq__ failed"
        assert any(line.strip().startswith("File ") and line.endswith("in __eq__") for line in lines)
    assert got.error.__cause__ is want.error.__cause__ is None


class EqRaises:
    """Equal to an EqRaises of the same value; comparing different values raises.

    (JAX's trace cache is per code object, shared by the threads of
    pytest --parallel-threads: equal values there must compare fine.)
    """

    def __init__(self, v):
        self.v = v

    def __hash__(self):
        return 7

    def __eq__(self, other):
        if type(other) is EqRaises and other.v == self.v:
            return True
        raise RuntimeError("cannot compare")


def test_static_eq_error_is_jax_jits_exception():
    # Local functions: jax.jit's cache is per function object, and other
    # threads (pytest --parallel-threads) must not share it.
    def scale_under_jax(x, s):
        return x * s.v

    def scale_under_ftjit(x, s):
        return x * s.v

    errors = []
    for fn in (
        jax.jit(scale_under_jax, static_argnums=1),
        ftjit.jit(scale_under_ftjit, static_argnums=1, cache=ftjit.FunctionCache()),
    ):
        assert float(fn(2.0, EqRaises(3))) == 6.0
        try:
            fn(2.0, EqRaises(4))  # the same line for both: their messages carry the stack
        except Exception as e:  # noqa: BLE001
            errors.append(e)
    want, got = errors
    assert type(got) is type(want) is ValueError
    assert str(got) == str(want)
    assert str(want).startswith("static arguments should be comparable using __eq__.")
    assert str(want).endswith("RuntimeError: cannot compare")
    assert (got.__cause__, got.__context__, got.__suppress_context__) == (None, None, False)
    assert (want.__cause__, want.__context__, want.__suppress_context__) == (None, None, False)


def test_static_eq_error_with_a_custom_compiler_is_the_original():
    jf = ftjit.jit(lambda x, s: x * s.v, static_argnums=1, compiler=lambda f, a, k: f, cache=ftjit.FunctionCache())
    assert jf(2.0, EqRaises(3)) == 6.0
    with pytest.raises(RuntimeError, match="^cannot compare$") as info:
        jf(2.0, EqRaises(4))
    assert info.value.__cause__ is None


def test_static_argument_whose_hash_raises_propagates_as_with_jax_jit():
    def scenario(jit):
        return jit(lambda x, s: x + 1, static_argnums=1)(1.0, FailingHash())

    want, _ = both(scenario)
    assert type(want.error) is RuntimeError and str(want.error) == "parity: __hash__ failed"


def test_trace_errors_are_jax_jits_and_the_next_call_retraces():
    def scenario(jit):
        traces = []

        def f(x):
            traces.append(1)
            return x.reshape(7)

        jf = jit(f)
        errors = []
        for _ in range(2):
            try:
                jf(jnp.ones(4))
            except TypeError as e:
                errors.append(first_line(e))
        return errors, len(traces)

    want, _ = both(scenario)
    assert len(want.value[0]) == 2 and want.value[1] == 2


def _frames(error: BaseException) -> list:
    return [(os.path.basename(fr.filename), fr.name) for fr in traceback.extract_tb(error.__traceback__)]


TRACEBACK_USES = {
    "call": lambda jf: jf(jnp.ones(4)),
    "call_again": lambda jf: (_swallow(jf, jnp.ones(4)), jf(jnp.ones(4))),  # retraced, filtered again
    "precompiled": lambda jf: (jf.precompile if hasattr(jf, "precompile") else jf.lower)(jnp.ones(4)),
    "lower": lambda jf: jf.lower(jnp.ones(4)),
    "trace": lambda jf: jf.trace(jnp.ones(4)),
    "eval_shape": lambda jf: jf.eval_shape(jnp.ones(4)),
}


def _swallow(jf, *args):
    try:
        jf(*args)
    except TypeError:
        pass


@pytest.mark.parametrize("how", sorted(TRACEBACK_USES))
def test_trace_error_tracebacks_show_the_same_frames_as_jax_jit(how):
    """jax.jit hides its own frames from tracebacks (and from the op metadata of
    the program), and says so once, in a note; ftjit.jit's machinery must be as
    invisible."""

    def scenario(jit):
        def f(x):
            return x.reshape(7)

        try:
            TRACEBACK_USES[how](jit(f))
        except TypeError as e:
            return _frames(e), getattr(e, "__notes__", [])

    want, _ = both(scenario)
    frames, notes = want.value
    names = [name for _, name in frames]
    assert names[names.index("scenario") + 1 :][-4:] == ["f", "meth", "_reshape", "_compute_newshape"]
    assert not any(path.startswith(("pjit.py", "api.py")) for path, _ in frames)
    assert len(notes) == 1 and "JAX has removed its internal frames" in notes[0]


# --- memory ----------------------------------------------------------------------


class Held:
    """Captured in a jitted function's closure; weakref-able."""

    def __init__(self):
        self.scale = 3.0
        self.offset = np.ones(3, np.float32)


def _use_call(jf):
    jf(jnp.ones(3))
    jf(jnp.ones(3))
    jf(jnp.ones(3, jnp.int32))


def _use_failing_trace(jf):
    with pytest.raises(TypeError):
        jf(jnp.ones(4))


MEMORY_USES = {
    "never_called": lambda jf: None,
    "calls": _use_call,
    "lower_compile": lambda jf: jf.lower(jnp.ones(3)).compile()(jnp.ones(3)),
    "trace": lambda jf: jf.trace(jnp.ones(3)),
    "eval_shape": lambda jf: jf.eval_shape(jnp.ones(3)),
    "grad": lambda jf: jax.grad(lambda v: jf(v).sum())(jnp.ones(3)),
    "vmap": lambda jf: jax.vmap(jf)(jnp.ones((2, 3))),
    "outer_jit": lambda jf: jax.jit(lambda v: jf(v) * 2)(jnp.ones(3)),
    "failing_trace": _use_failing_trace,
    "clear_cache": lambda jf: (_use_call(jf), jf.clear_cache()),
}


@pytest.mark.parametrize("jit", JITS)
@pytest.mark.parametrize("use", sorted(MEMORY_USES))
def test_closure_is_freed_once_function_and_wrapper_are_dropped(jit, use):
    def make():
        held = Held()

        def f(x):
            return x.reshape(3) * held.scale + held.offset

        return weakref.ref(held), f

    held_ref, f = make()
    jf = jit(f)
    wrapper_ref = weakref.ref(jf)
    MEMORY_USES[use](jf)
    assert held_ref() is not None
    del f, jf
    assert gc_collect_until(lambda: held_ref() is None and wrapper_ref() is None), (
        f"after {use}: closure object alive={held_ref() is not None}, wrapper alive={wrapper_ref() is not None}"
    )


# --- effects and tokens ----------------------------------------------------------


def test_ordered_debug_callbacks_run_in_program_order():
    def scenario(jit):
        log = []
        lock = threading.Lock()

        def record(tag, v):
            with lock:
                log.append((tag, float(v)))

        def f(x):
            jax.debug.callback(record, "a", x, ordered=True)
            y = x * 2
            jax.debug.callback(record, "b", y, ordered=True)
            return y

        jf = jit(f)
        outs = [jf(float(i)) for i in range(3)]
        jax.effects_barrier()
        plain = list(log)
        outs.append(jax.vmap(jf)(jnp.arange(2.0)))
        jax.effects_barrier()
        vmapped = log[len(plain):]
        outs.append(jax.grad(jf)(3.0))
        jax.effects_barrier()
        return outs, plain, vmapped, log[len(plain) + len(vmapped):]

    want, _ = both(scenario)
    _, plain, vmapped, grad = want.value
    assert plain == [("a", 0.0), ("b", 0.0), ("a", 1.0), ("b", 2.0), ("a", 2.0), ("b", 4.0)]
    assert vmapped == [("a", 0.0), ("a", 1.0), ("b", 0.0), ("b", 2.0)]
    assert grad == [("a", 3.0), ("b", 6.0)]


def test_ordered_debug_print_output_as_jax_jit(capfd):
    outputs = {}
    for name, jit in [("jax", jax.jit), ("ftjit", ftjit.jit)]:

        def p(x):
            jax.debug.print("x={x}", x=x, ordered=True)
            jax.debug.print("y={y}", y=x + 1, ordered=True)
            return x * 2

        jp = jit(p)
        results = [float(jp(1.0)), float(jp(2.0)), float(jp(jnp.float32(3.0)))]
        jax.effects_barrier()
        outputs[name] = (results, capfd.readouterr().out)
    assert outputs["ftjit"] == outputs["jax"]
    assert outputs["jax"] == ([2.0, 4.0, 6.0], "x=1.0\ny=2.0\nx=2.0\ny=3.0\nx=3.0\ny=4.0\n")


def test_ordered_io_callback_called_repeatedly():
    def scenario(jit):
        seen = []

        def io(v):
            seen.append(float(v))
            return np.float32(len(seen))

        def h(x):
            return io_callback(io, jax.ShapeDtypeStruct((), jnp.float32), x, ordered=True) + x

        jh = jit(h)
        outs = [jh(jnp.float32(i)) for i in range(4)]
        jax.effects_barrier()  # every callback has run (on a TPU they may still be running when the calls return)
        return outs, seen, jh._cache_size()

    want, _ = both(scenario)
    assert want.value[1:] == ([0.0, 1.0, 2.0, 3.0], 1)
    assert [o[4] for o in want.value[0]] == [1.0, 3.0, 5.0, 7.0]


@pytest.mark.parametrize("transform", ["vmap", "grad"])
def test_ordered_io_callback_under_transformations_fails_as_with_jax_jit(transform):
    def scenario(jit):
        def h(x):
            return io_callback(lambda v: v, jax.ShapeDtypeStruct((), jnp.float32), x, ordered=True) * 2

        jh = jit(h)
        if transform == "vmap":
            return jax.vmap(jh)(jnp.arange(2.0, dtype=jnp.float32))
        return jax.grad(jh)(jnp.float32(2.0))

    want, _ = both(scenario)
    assert type(want.error) is ValueError


@pytest.mark.parametrize("jit", JITS)
def test_ordered_io_callback_from_four_threads(jit):
    """Four threads call a function with an ordered io_callback 10 times each:
    every callback runs exactly once, each thread's callbacks run in its call
    order, and each call gets its own callback's result."""
    lock = threading.Lock()
    seen = []

    def io(tid, v):
        with lock:
            seen.append((int(tid), float(v)))
            return np.float32(len(seen))

    def h(tid, x):
        return io_callback(io, jax.ShapeDtypeStruct((), jnp.float32), tid, x, ordered=True) + 0 * x

    jh = jit(h)
    jh(jnp.int32(-1), jnp.float32(0))  # compile before the threads start

    def worker(t):
        return [float(jh(jnp.int32(t), jnp.float32(i))) for i in range(10)]

    results = run_threads(4, worker, timeout=120)
    jax.effects_barrier()
    assert len(seen) == 41
    for t in range(4):
        assert [v for tid, v in seen if tid == t] == [float(i) for i in range(10)]
        assert results[t] == sorted(results[t])
    assert sorted(sum(results, [])) == [float(n) for n in range(2, 42)]
    assert jh._cache_size() == 1
    if jit is ftjit.jit:
        info = jh.cache_info()
        assert (info.compiles, info.hits) == (1, 40)


def test_tokens_pass_through_as_in_jax_jit():
    @ftjit.jit
    def noop(arr, token):
        return arr, token

    token = jax.lax.create_token()
    arr, out = noop(jnp.ones(3), token)
    assert type(out) is type(token) and out is not token
    assert arr.tolist() == [1.0, 1.0, 1.0]


def test_hijax_box_closed_over_and_passed_as_argument_matches_jax_jit():
    hijax = pytest.importorskip("jax._src.hijax")
    if not hasattr(hijax, "Box"):
        pytest.skip("this JAX has no hijax Box")

    def run(jit):
        box = hijax.Box(jnp.ones(2))

        def close(x):
            box.set(box.get() + x)
            return box.get() * 2

        def arg(b, x):
            b.set(b.get() + x)
            return b.get()

        f, g = jit(close), jit(arg)
        b = hijax.Box(jnp.zeros(2))
        return (f(jnp.ones(2)).tolist(), f(jnp.ones(2)).tolist(), box.get().tolist(),
                g(b, jnp.ones(2)).tolist(), g(b, jnp.ones(2)).tolist(), b.get().tolist())

    assert run(ftjit.jit) == run(jax.jit) == ([4.0, 4.0], [6.0, 6.0], [3.0, 3.0], [1.0, 1.0], [2.0, 2.0],
                                              [2.0, 2.0])
