"""The JAX compiler against jax.jit, for the gaps an audit found: hooks built
inside a trace, closed-over tracers, jax.disable_jit, registered nodes with
.dtype/.shape, committed placement, the public fallbacks of every
fast path, warnings, positional-only ``fun``, the static __eq__ error,
int/float/complex subclasses, module-style pytrees, other tracing configs,
and ``lower`` with keywords, statics and ShapeDtypeStructs.

Each test runs the same code under ``jax.jit`` and ``ftjit.jit`` and asserts
the same outcome (results, trace counts, errors, warnings). JAX caches traces
per function object, so the two sides use separate functions."""

from __future__ import annotations

import functools
import re
import subprocess
import sys
import warnings

import numpy as np
import pytest

import jax  # a hard dependency: its absence must fail, not skip
import jax.numpy as jnp  # noqa: E402

import ftjit  # noqa: E402
import ftjit._jax  # noqa: E402
from helpers import run_script  # noqa: E402


# -- 3. jax.disable_jit() --------------------------------------------------


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


# -- 7. device=/backend= warn as jax.jit warns -----------------------------


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


# -- 8. fun is positional-only ---------------------------------------------


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


# -- 9. a static argument whose __eq__ raises ------------------------------


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


# -- max_signatures counts committed placements as the core does -----------

MAX_SIGNATURES_PER_DEVICE = """
    import os
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=3"
    import jax, jax.numpy as jnp
    import ftjit

    @ftjit.jit(max_signatures=2, on_excess="raise")
    def f(x):
        return x + 1

    devices = jax.devices()
    assert len(devices) == 3, devices
    for d in devices[:2]:
        f(jax.device_put(jnp.ones(2), d))
    try:
        f(jax.device_put(jnp.ones(2), devices[2]))
    except ftjit.RecompileLimitError as e:
        print(str(e).split("(differs from the closest cached one by: ")[1].split(")")[0])
    print(f.cache_info().compiles)
    print(sorted(s.signature for s in f.signatures()))
"""


@pytest.mark.thread_unsafe(reason="spawns an interpreter; slow to repeat 8x")
def test_max_signatures_counts_arrays_committed_to_different_devices():
    out = run_script(MAX_SIGNATURES_PER_DEVICE).splitlines()
    assert len(out) == 3, out
    assert re.fullmatch(r"argument 'x': float32\[2\]@cpu:[01] -> float32\[2\]@cpu:2", out[0]), out
    assert out[1] == "2"
    # signatures() prints placements as the explanation does.
    assert out[2] == "['f(float32[2]@cpu:0)', 'f(float32[2]@cpu:1)']", out


# -- invalid arguments: jax.jit's exception types, ftjit's messages -------------


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


# -- JAX drop-in: rebinding, the backend, hijax, tokens, specs, JitTest's words ------------


def _run(code):
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
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


def test_tokens_pass_through_as_in_jax_jit():
    @ftjit.jit
    def noop(arr, token):
        return arr, token

    token = jax.lax.create_token()
    arr, out = noop(jnp.ones(3), token)
    assert type(out) is type(token) and out is not token
    assert arr.tolist() == [1.0, 1.0, 1.0]


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


def test_a_bad_input_names_its_path_in_jax_jit_words_and_ftjit_words():
    def f(x):
        return x

    with pytest.raises(TypeError, match=r"^Error interpreting argument to .* as an abstract array\. The problematic "
                                        r"value is of type str and was passed to the function at path x\[0\]\['k'\]\. "
                                        r"\(ftjit: argument 'x\[0\]\['k'\]' \(positional argument 0\) of .*f\(\) is of "
                                        r"type str, which is not a valid argument type"):
        ftjit.jit(f)([{"k": "foo"}])


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
    chex = pytest.importorskip("chex")
    from chex._src import asserts_internal

    assert asserts_internal.is_traceable(jf) and not asserts_internal.is_traceable(lambda x: x)
    with pytest.raises(ValueError, match="must not wrap JAX-transformed function"):
        chex.assert_max_traces(jf, 1)
