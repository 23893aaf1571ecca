"""The default (JAX) compiler: results equal jax.jit's, traced once per
signature, statics stripped, pytrees through JAX's registry, tracers deferred
to JAX, donation, lowering/precompiling, the private fast path's fallback."""

from __future__ import annotations

import collections
import dataclasses
import threading
import time

import numpy as np
import pytest

import jax  # a hard dependency: its absence must fail, not skip
import jax.numpy as jnp  # noqa: E402

import ftjit  # noqa: E402
import ftjit._jax  # noqa: E402
from helpers import run_threads  # noqa: E402


class TraceCounter:
    """Wraps a function body, counting how often JAX traces it (thread-safe)."""

    def __init__(self, body, sleep=0.0):
        self.body = body
        self.sleep = sleep
        self.lock = threading.Lock()
        self.count = 0

    def __call__(self, *args, **kwargs):
        with self.lock:
            self.count += 1
        if self.sleep:
            time.sleep(self.sleep)
        return self.body(*args, **kwargs)


def counted(body, sleep=0.0):
    """A fresh Python function (own cache entries) whose traces are counted in .tracer."""
    tracer = TraceCounter(body, sleep)

    def fun(*args, **kwargs):
        return tracer(*args, **kwargs)

    fun.tracer = tracer
    return fun


def assert_same(a, b):
    """Equal pytrees of jax Arrays: structure, dtype, weak type, shape, values."""
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    assert ta == tb
    for x, y in zip(la, lb):
        assert isinstance(x, jax.Array) and isinstance(y, jax.Array)
        assert (x.dtype, x.shape, x.weak_type) == (y.dtype, y.shape, y.weak_type)
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def add(x, y):
    return x + y


ARGS = [
    (1, 2),
    (1.5, 2),
    (True, False),
    (1j, 2.0),
    (np.float32(1), 2),
    (np.int8(3), 300),
    (np.ones(3, np.float32), 1.0),
    (np.arange(4, dtype=np.int64), np.int32(2)),
    (jnp.ones(3), jnp.ones(3, jnp.int32)),
    (jnp.asarray(2.0), 1),
    (np.ones((2, 3), np.float16), np.ones((3,), np.float32)),
]


@pytest.mark.parametrize("args", ARGS, ids=lambda a: "-".join(type(v).__name__ for v in a))
def test_results_dtypes_weak_types_equal_jax_jit(args):
    got = ftjit.jit(add, cache=ftjit.FunctionCache())(*args)
    want = jax.jit(add)(*args)
    assert_same(got, want)


def test_output_pytrees_equal_jax_jit():
    def fun(x, y):
        return {"sum": x + y, "pair": (x * 2, [y - 1, None]), "scalar": 3.0}

    args = (np.ones(2, np.float32), 4)
    assert_same(ftjit.jit(fun, cache=ftjit.FunctionCache())(*args), jax.jit(fun)(*args))


def test_python_scalars_weak_typed_and_distinct_signatures():
    fun = counted(lambda x: x * 2)
    jf = ftjit.jit(fun, cache=ftjit.FunctionCache())
    for v in (1, 2.0, True, 1j, 3, 4.0):
        assert_same(jf(v), jax.jit(lambda x: x * 2)(v))
    assert fun.tracer.count == 4  # int, float, bool, complex
    assert jf.cache_info().compiles == 4


def test_five_equal_calls_trace_once_numpy_and_jax_arrays_share_a_signature():
    fun = counted(lambda x: x + 1)
    jf = ftjit.jit(fun, cache=ftjit.FunctionCache())
    jf(np.zeros(4, np.float32))
    for i in range(4):
        x = jnp.full(4, i, jnp.float32) if i % 2 else np.full(4, i, np.float32)
        np.testing.assert_array_equal(np.asarray(jf(x)), np.full(4, i + 1, np.float32))
    assert fun.tracer.count == 1
    info = jf.cache_info()
    assert (info.compiles, info.misses, info.hits) == (1, 1, 4)


def test_enable_x64_is_part_of_the_signature():
    fun = counted(lambda x: x * 2)
    jf = ftjit.jit(fun, cache=ftjit.FunctionCache())
    assert jf(1.0).dtype == jnp.float32
    with jax.enable_x64(True):
        out = jf(1.0)
        assert out.dtype == jnp.float64
        assert_same(out, jax.jit(lambda x: x * 2)(1.0))
        jf(1.0)
    assert jf(1.0).dtype == jnp.float32
    assert fun.tracer.count == 2
    info = jf.cache_info()
    assert (info.compiles, info.hits) == (2, 2)


def test_static_args_stripped_and_keyed_by_value():
    fun = counted(lambda x, n, *, scale: x * n * scale)
    jf = ftjit.jit(fun, static_argnums=1, static_argnames="scale", cache=ftjit.FunctionCache())
    jj = jax.jit(lambda x, n, *, scale: x * n * scale, static_argnums=1, static_argnames="scale")
    x = np.arange(3, dtype=np.float32)
    for n, scale in [(2, 3), (2, 3), (5, 3), (2, 4), (2, 3)]:
        assert_same(jf(x, n, scale=scale), jj(x, n, scale=scale))
    assert fun.tracer.count == 3
    assert jf.cache_info().hits == 2


def test_static_argnames_resolve_to_positions_as_in_jax():
    fun = counted(lambda x, n: x * n)
    jf = ftjit.jit(fun, static_argnames="n", cache=ftjit.FunctionCache())
    x = np.ones(2, np.float32)
    assert_same(jf(x, 3), jax.jit(lambda x, n: x * n, static_argnames="n")(x, 3))
    assert_same(jf(x, n=3), jax.jit(lambda x, n: x * n, static_argnames="n")(x, n=3))
    assert fun.tracer.count == 2  # positional and keyword are two signatures (as in jax.jit)


def test_static_strings_and_objects_are_fine_as_statics():
    def fun(x, mode):
        return x + 1 if mode == "inc" else x - 1

    jf = ftjit.jit(fun, static_argnames="mode", cache=ftjit.FunctionCache())
    assert float(jf(1.0, mode="inc")) == 2.0
    assert float(jf(1.0, mode="dec")) == 0.0


def test_keyword_order_does_not_matter():
    fun = counted(lambda a, b: a - b)
    jf = ftjit.jit(fun, cache=ftjit.FunctionCache())
    assert float(jf(a=5.0, b=2.0)) == 3.0
    assert float(jf(b=2.0, a=5.0)) == 3.0
    assert fun.tracer.count == 1


@pytest.mark.parametrize("bad", ["text", object(), b"bytes"], ids=["str", "object", "bytes"])
def test_unsupported_leaves_are_type_errors_naming_the_argument(bad):
    jf = ftjit.jit(lambda x, y: y, cache=ftjit.FunctionCache())
    with pytest.raises(TypeError, match=r"'y'.*static_argnames"):
        jf(1.0, bad)
    with pytest.raises(TypeError, match=r"'y'.*static_argnames"):
        jf(1.0, y=bad)


Point = collections.namedtuple("Point", ["x", "y"])


class Pair:
    def __init__(self, a, b):
        self.a, self.b = a, b


jax.tree_util.register_pytree_node(Pair, lambda p: ((p.a, p.b), None), lambda _, c: Pair(*c))


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Params:
    w: jax.Array
    b: jax.Array
    name: str = dataclasses.field(default="p", metadata={"static": True})


def test_registered_pytrees_go_through_jax_registry():
    def fun(p, q, params):
        return p.x * q.a + q.b + (params.w @ params.b).sum()

    x = np.ones(3, np.float32)
    params = Params(w=jnp.ones((2, 3)), b=jnp.arange(3.0))
    args = (Point(x, 2.0), Pair(x, x * 2), params)
    fc = counted(fun)
    jf = ftjit.jit(fc, cache=ftjit.FunctionCache())
    assert_same(jf(*args), jax.jit(fun)(*args))
    jf(Point(x + 1, 3.0), Pair(x, x), Params(w=jnp.zeros((2, 3)), b=jnp.ones(3)))
    assert fc.tracer.count == 1
    # A different static field of the dataclass is a different tree: retrace.
    jf(Point(x, 2.0), Pair(x, x), Params(w=jnp.ones((2, 3)), b=jnp.ones(3), name="q"))
    assert fc.tracer.count == 2
    # A different leaf shape inside the registered node: retrace.
    x4 = np.ones(4, np.float32)
    jf(Point(x4, 2.0), Pair(x4, x4), params)
    assert fc.tracer.count == 3


def test_pytree_outputs_of_registered_types():
    def fun(x):
        return Point(x, x + 1)

    out = ftjit.jit(fun, cache=ftjit.FunctionCache())(np.ones(2, np.float32))
    assert isinstance(out, Point)
    assert_same(out, jax.jit(fun)(np.ones(2, np.float32)))


def test_tracers_defer_to_jax_never_cached():
    jsin = ftjit.jit(jnp.sin, cache=ftjit.FunctionCache())
    assert float(jax.grad(lambda x: jsin(x))(1.0)) == pytest.approx(float(jnp.cos(1.0)), rel=1e-6)
    np.testing.assert_allclose(np.asarray(jax.vmap(jsin)(jnp.arange(3.0))), np.sin(np.arange(3.0)), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(jax.jit(lambda x: jsin(x) * 2)(0.5)), 2 * np.sin(0.5), rtol=1e-6)

    def body(carry, x):
        return carry + jsin(x), None

    total, _ = jax.lax.scan(body, 0.0, jnp.arange(4.0))
    np.testing.assert_allclose(float(total), np.sin(np.arange(4.0)).sum(), rtol=1e-6)
    info = jsin.cache_info()
    assert (info.size, info.compiles, info.misses) == (0, 0, 0)
    # Outside a transformation it caches as usual.
    jsin(1.0)
    assert jsin.cache_info().compiles == 1


def test_tracer_in_a_pytree_defers_to_jax():
    jf = ftjit.jit(lambda d: d["a"] * d["b"], cache=ftjit.FunctionCache())
    g = jax.grad(lambda a: jf({"a": a, "b": 3.0}))(2.0)
    assert float(g) == 3.0
    assert jf.cache_info().size == 0


def test_donation_consumes_the_buffer_and_executes_once():
    fun = counted(lambda x: x * 2)
    jf = ftjit.jit(fun, donate_argnums=0, cache=ftjit.FunctionCache())
    x = jnp.arange(4.0)
    y = jf(x)
    assert x.is_deleted()
    np.testing.assert_array_equal(np.asarray(y), np.arange(4.0) * 2)
    x2 = jnp.ones(4)
    y2 = jf(x2)
    assert x2.is_deleted()
    np.testing.assert_array_equal(np.asarray(y2), np.full(4, 2.0))
    assert fun.tracer.count == 1
    # Reusing the donated buffer fails as under jax.jit (same type and message).
    jj = jax.jit(lambda x: x * 2, donate_argnums=0)
    x3 = jnp.ones(4)
    jj(x3)
    with pytest.raises(Exception) as want:
        jj(x3)
    with pytest.raises(type(want.value)) as got:
        jf(x)
    # jax.jit's message, with the array's shape: "... deleted or donated ..." (jax 0.10) or
    # "Array has been deleted with shape=float32[4]." (jax 0.12).
    assert str(got.value) == str(want.value)


def test_donate_argnames():
    jf = ftjit.jit(lambda a, b: a + b, donate_argnames="b", cache=ftjit.FunctionCache())
    a, b = jnp.ones(3), jnp.ones(3)
    jf(a, b=b)
    assert b.is_deleted() and not a.is_deleted()


def test_herd_of_16_threads_traces_once():
    fun = counted(lambda x: x * 3 + 1, sleep=0.3)
    jf = ftjit.jit(fun, cache=ftjit.FunctionCache())

    def call(i):
        x = np.full(5, i, np.float32)
        return np.asarray(jf(x))

    results = run_threads(16, call, timeout=60)
    for i, out in enumerate(results):
        np.testing.assert_array_equal(out, np.full(5, 3 * i + 1, np.float32))
    assert fun.tracer.count == 1
    info = jf.cache_info()
    assert (info.compiles, info.misses) == (1, 1)
    assert info.hits + info.waits == 15


def test_lower_returns_jax_lowered():
    jf = ftjit.jit(add, cache=ftjit.FunctionCache())
    lowered = jf.lower(np.ones(3, np.float32), 2.0)
    assert isinstance(lowered, jax.stages.Lowered)
    assert lowered.as_text() == jax.jit(add).lower(np.ones(3, np.float32), 2.0).as_text()
    compiled = lowered.compile()
    np.testing.assert_array_equal(np.asarray(compiled(np.ones(3, np.float32), 2.0)), np.full(3, 3.0))
    assert jf.cache_info().size == 0  # lowering does not touch the cache


def test_precompile_with_shape_dtype_structs_then_calls_hit():
    fun = counted(lambda x, y: x @ y)
    jf = ftjit.jit(fun, cache=ftjit.FunctionCache())
    spec = (jax.ShapeDtypeStruct((2, 3), jnp.float32), jax.ShapeDtypeStruct((3,), jnp.float32))
    assert jf.precompile(*spec) is True
    assert jf.precompile(*spec) is False
    assert fun.tracer.count == 1
    out = jf(np.ones((2, 3), np.float32), np.arange(3, dtype=np.float32))
    np.testing.assert_array_equal(np.asarray(out), np.full(2, 3.0, np.float32))
    info = jf.cache_info()
    assert (info.compiles, info.hits, fun.tracer.count) == (1, 1, 1)
    assert [s.signature for s in jf.signatures()] == [f"{fun.__qualname__}(float32[2,3], float32[3])"]


def test_public_fallback_when_fast_path_is_off(monkeypatch):
    monkeypatch.setattr(ftjit._jax, "FAST_PATH", False)
    jf = ftjit.jit(add, cache=ftjit.FunctionCache())
    assert_same(jf(np.ones(3, np.float32), 1.0), jax.jit(add)(np.ones(3, np.float32), 1.0))
    compiled = jax.jit(add).lower(1.0, 2.0).compile()
    assert ftjit._jax.fast_callable(compiled) is compiled


def test_public_fallback_when_private_api_is_missing(monkeypatch):
    """A JAX without Compiled._executable.create_cpp_call: the public Compiled is used."""
    compiled = jax.jit(add).lower(np.ones(2, np.float32), 1.0).compile()

    class NoCppCall:
        def __getattr__(self, name):
            raise AttributeError(name)

    monkeypatch.setattr(compiled, "_executable", NoCppCall())
    assert ftjit._jax.fast_callable(compiled) is compiled
    monkeypatch.undo()  # Compiled.__call__ itself needs the real executable
    np.testing.assert_array_equal(np.asarray(compiled(np.ones(2, np.float32), 1.0)), np.full(2, 2.0))


def test_fast_path_is_used_on_this_jax():
    """On the installed JAX the private C++ callable exists (else the fast path silently degraded)."""
    compiled = jax.jit(add).lower(1.0, 2.0).compile()
    call = ftjit._jax.fast_callable(compiled)
    assert call is not compiled
    assert float(call(1.0, 2.0)) == 3.0


def test_two_wrappers_of_one_function_share_compiles():
    fun = counted(lambda x: x - 1)
    cache = ftjit.FunctionCache()
    a = ftjit.jit(fun, cache=cache)
    b = ftjit.jit(fun, cache=cache)
    a(np.ones(2, np.float32))
    b(np.ones(2, np.float32))
    assert fun.tracer.count == 1
    assert (a.cache_info().compiles, b.cache_info().compiles, b.cache_info().hits) == (1, 1, 1)
    # Different jax options compile separately (JAX may reuse its own trace).
    c = ftjit.jit(fun, cache=cache, donate_argnums=0)
    c(jnp.ones(2))
    assert (c.cache_info().compiles, a.cache_info().compiles, cache.size()) == (1, 1, 2)


def test_executable_errors_propagate_and_entry_stays():
    jf = ftjit.jit(lambda x: x + 1, cache=ftjit.FunctionCache())
    x = jnp.ones(2)
    jf(x)
    x.delete()
    with pytest.raises(RuntimeError, match="deleted"):
        jf(x)
    assert jf.cache_info().size == 1
    assert float(jf(jnp.ones(2))[0]) == 2.0


def test_trace_errors_propagate_and_are_not_cached():
    fun = counted(lambda x: x.reshape(7))
    jf = ftjit.jit(fun, cache=ftjit.FunctionCache())
    for _ in range(2):
        with pytest.raises(TypeError):
            jf(np.ones(4, np.float32))
    assert fun.tracer.count == 2
    info = jf.cache_info()
    assert (info.size, info.failures, info.compiles) == (0, 2, 0)


def test_signatures_stay_exact_across_shared_avals():
    """jax Arrays output by one computation share their abstract value, and the
    core remembers the last few it read per thread. Twelve shapes (more than
    it remembers), weak and strong scalars, and chained outputs, visited twice
    in interleaved order: one trace per distinct (shape, dtype, weak type),
    every result equal to jax.jit's."""
    fun = counted(lambda x: x * 2)
    ours = ftjit.jit(fun)
    theirs = jax.jit(lambda x: x * 2)
    make = jax.jit(lambda n: jnp.zeros(n) + 1, static_argnums=0)
    arrays = [make(n) for n in range(1, 13)]
    arrays += [jnp.asarray(1.0), jnp.float32(1.0), jnp.asarray(1, jnp.int32)]
    assert arrays[12].weak_type and not arrays[13].weak_type
    for _ in range(2):
        for x in arrays[::2] + arrays[1::2]:
            assert_same(ours(x), theirs(x))
    assert fun.tracer.count == len(arrays)
    assert ours._cache_size() == len(arrays)
    # Outputs fed back in (the aval of each output is shared): one more trace
    # per shape only, none for the chained calls after the first.
    y = arrays[3]
    for _ in range(5):
        y = ours(y)
    np.testing.assert_array_equal(np.asarray(y), np.full(4, 32.0, np.float32))
    assert fun.tracer.count == len(arrays)
