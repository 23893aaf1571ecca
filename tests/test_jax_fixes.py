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

import dataclasses
import enum
import functools
import re
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

import jax  # a hard dependency: its absence must fail, not skip
import jax.numpy as jnp  # noqa: E402

import ftjit  # noqa: E402
import ftjit._jax  # noqa: E402
from test_jax import assert_same, counted  # noqa: E402


def both(body):
    """(jax.jit of one counted copy of body, ftjit.jit of another), fresh cache."""
    fj, ff = counted(body), counted(body)
    return fj, jax.jit(fj), ff, ftjit.jit(ff, cache=ftjit.FunctionCache())


def run_script(script: str, env: dict | None = None) -> str:
    """Runs `script` in a fresh interpreter; returns its stdout (fails on errors)."""
    import os

    full_env = dict(os.environ, **(env or {}))
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, timeout=240, env=full_env
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.strip()


# -- 1. the hooks are right even when first built inside a trace -----------

HOOKS_BUILT_IN_A_TRACE = """
    import jax, jax.numpy as jnp, numpy as np
    import ftjit, ftjit._jax

    assert ftjit._jax._hooks is None
    @jax.jit
    def outer(x):
        # The process's first ftjit.jit, created while jax.jit traces: the
        # hooks are built now, with a tracer as jnp.zeros(())'s type.
        return ftjit.jit(lambda y: y * 2)(x)

    assert float(outer(1.5)) == 3.0
    hooks = ftjit._jax._jax_hooks()
    array_type = type(jnp.zeros(()))
    assert not issubclass(array_type, jax.core.Tracer)
    assert hooks["plain_types"] == (array_type, np.ndarray), hooks["plain_types"]
    assert hooks["aval_types"] == (array_type,), hooks["aval_types"]
    assert hooks["signature_hooks"].committed_types == (array_type,)

    inner = ftjit.jit(lambda x: x + 1)
    jinner = jax.jit(lambda x: x + 1)
    want = jax.lax.cond(True, lambda x: jinner(x), lambda x: x, 1.0)
    got = jax.lax.cond(True, lambda x: inner(x), lambda x: x, 1.0)
    assert float(got) == float(want) == 2.0
    assert inner.cache_info().size == 0   # tracers are never cached
    assert float(inner(1.0)) == 2.0 and inner.cache_info().compiles == 1
    print("ok")
"""


@pytest.mark.thread_unsafe(reason="spawns an interpreter; slow to repeat 8x")
def test_hooks_first_built_inside_a_jit_trace_know_the_concrete_array_type():
    assert run_script(HOOKS_BUILT_IN_A_TRACE) == "ok"


def test_concrete_array_type_inside_a_trace_is_not_a_tracer():
    seen = []

    def body(x):
        seen.append(ftjit._jax.concrete_array_type())
        return x

    jax.jit(body)(1.0)
    assert seen == [type(jnp.zeros(()))]
    assert not issubclass(seen[0], jax.core.Tracer)


# -- 2. any active trace defers to jax.jit, closed-over tracers included ----


def test_closed_over_tracers_under_jit_grad_vmap_match_jax_jit():
    for outer, arg, want in (
        (jax.jit, 3.0, 6.0),
        (jax.grad, 3.0, 2.0),
        (jax.vmap, jnp.arange(3.0), [0.0, 2.0, 4.0]),
    ):
        results = []
        for make in (jax.jit, ftjit.jit):
            results.append(outer(lambda a: make(lambda x: x * a)(2.0))(arg))
        np.testing.assert_array_equal(np.asarray(results[0]), np.asarray(want))
        assert_same(results[1], results[0])


def test_a_cached_signature_called_inside_a_trace_is_staged_like_jax_jit():
    fj, jj, ff, jf = both(lambda x: x * 2)
    outcomes = []
    for inner, fun in ((jj, fj), (jf, ff)):
        assert float(inner(2.0)) == 4.0  # compiled at top level
        staged = []

        def outer(a):
            r = inner(2.0)  # concrete arguments, but a trace is active
            staged.append(isinstance(r, jax.core.Tracer))
            return r * a

        assert float(jax.jit(outer)(3.0)) == 12.0
        assert float(jax.grad(outer)(3.0)) == 4.0
        outcomes.append((staged, fun.tracer.count))
    # Under jax.jit the inner call is staged out (its jaxpr reused: no
    # retrace); under grad, with no tangent, JAX evaluates it eagerly.
    assert outcomes[1] == outcomes[0] == ([True, False], 1)
    info = jf.cache_info()
    assert (info.size, info.compiles, info.hits, info.misses) == (1, 1, 0, 1)


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


# -- 4. JAX's registry before duck-typed arrays; no partial leaf state ------


class Scaled:
    """A registered pytree node that also has .dtype/.shape (as array wrappers do)."""

    def __init__(self, value, scale):
        self.value, self.scale = value, scale

    dtype = property(lambda self: self.value.dtype)
    shape = property(lambda self: self.value.shape)


jax.tree_util.register_pytree_node(Scaled, lambda s: ((s.value,), s.scale), lambda scale, c: Scaled(c[0], scale))


def test_registered_node_with_dtype_and_shape_is_a_pytree_not_a_leaf():
    fj, jj, ff, jf = both(lambda s: s.value * s.scale)
    x = np.arange(3, dtype=np.float32)
    for scale in (2, 3, 3):
        assert_same(jf(Scaled(x, scale)), jj(Scaled(x, scale)))
    assert ff.tracer.count == fj.tracer.count == 2  # the static aux data is in the signature
    assert jf._signature_of(Scaled(x, 2)).count("float32[3]") == 1


class OddInt(int):
    """An int subclass with array-like attributes whose shape is not all ints."""

    dtype = np.dtype(np.int32)
    shape = (2, "x")


def test_rejected_array_like_leaves_no_partial_dims():
    fj, jj, ff, jf = both(lambda x: x + 1)
    for value in (OddInt(3), 3, OddInt(4)):
        assert_same(jf(value), jj(value))
    # OddInt is a weak int leaf, the very signature of 3: one compile.
    assert ff.tracer.count == fj.tracer.count == 1
    assert jf._signature_of(OddInt(3)) == jf._signature_of(3)
    assert jf.cache_info().compiles == 1


# -- 5. committed placement is in the signature ----------------------------

PLACEMENT = """
    import jax, jax.numpy as jnp, numpy as np, ftjit
    d0, d1 = jax.devices()

    def run(make):
        traces = []
        def f(x):
            traces.append(1)
            return x * 2
        g = make(f)
        x = jnp.arange(4.0)
        with jax.default_device(d1):
            on_d1_uncommitted = jnp.arange(4.0)
        calls = [
            x,                                       # uncommitted, device 0
            jax.device_put(x, d0),                   # committed to device 0
            jax.device_put(x, d1),                   # committed to device 1
            jax.device_put(x, d1),                   # an equal, new sharding
            on_d1_uncommitted,                       # may move: like x
            np.arange(4.0, dtype=np.float32),        # like x
        ]
        outs = [g(a) for a in calls]
        return g, [(sorted(d.id for d in r.devices()), r.committed, np.asarray(r).tolist()) for r in outs], len(traces)

    _, want, want_traces = run(jax.jit)
    jf, got, got_traces = run(ftjit.jit)
    assert got == want, (got, want)
    assert got_traces == want_traces, (got_traces, want_traces)
    info = jf.cache_info()
    print(want[2][0], want[2][1], info.compiles, info.hits, got_traces)
    # The same through the public fallbacks (placement read via the public
    # properties; without the concrete Array class, via jax.Array).
    import ftjit._jax
    for fast in (ftjit._jax.FAST_PATHS - {"placement"}, frozenset()):
        ftjit._jax._hooks = ftjit._jax.build_hooks(fast)
        jf, got, got_traces = run(ftjit.jit)
        assert got == want, (fast, got, want)
        assert (jf.cache_info().compiles, jf.cache_info().hits) == (info.compiles, info.hits), fast
"""


@pytest.mark.thread_unsafe(reason="spawns an interpreter; slow to repeat 8x")
def test_committed_arrays_on_another_device_recompile_like_jax_jit():
    out = run_script(PLACEMENT, env={"XLA_FLAGS": "--xla_force_host_platform_device_count=2"})
    # The device-1 result is on device 1 and committed; 3 placements compiled
    # (uncommitted, device 0, device 1), the other 3 calls hit.
    assert out == "[1] True 3 3 1"


def test_committed_single_device_array_hits_and_shows_its_placement():
    fj, jj, ff, jf = both(lambda x: x + 1)
    committed = jax.device_put(jnp.ones(3), jax.devices()[0])
    for x in (committed, jax.device_put(jnp.ones(3), jax.devices()[0]), jnp.ones(3), np.ones(3, np.float32)):
        assert_same(jf(x), jj(x))
    info = jf.cache_info()
    assert (info.compiles, info.hits) == (2, 2)
    # Printed as explanations print it (the device, not the sharding's repr).
    name = "counted.<locals>.fun"
    assert jf._signature_of(committed) == f"{name}(float32[3]@cpu:0)"
    assert jf._signature_of(jnp.ones(3)) == f"{name}(float32[3])"
    assert sorted(s.signature for s in jf.signatures()) == [f"{name}(float32[3])", f"{name}(float32[3]@cpu:0)"]


# -- 6. every fast path has a tested public fallback -----------------------

FEATURES = sorted(ftjit._jax.FAST_PATHS)


def _fallback_in_use(hooks, missing):
    sig = hooks["signature_hooks"]
    fast = ftjit._jax._jax_hooks()
    return {
        "array_type": hooks["plain_types"] == (np.ndarray,) and sig.committed_types == (jax.Array,),
        "aval": hooks["aval_types"] == () and fast["aval_types"] != (),
        "context": isinstance(sig.context, functools.partial) and sig.context is not fast["signature_hooks"].context
        and sig.extras != fast["signature_hooks"].extras,
        "placement": (sig.committed_attr, sig.sharding_attr) == ("committed", "sharding"),
        "probe": sig.probe is not fast["signature_hooks"].probe and sig.probe_ok is True,
        "registry": hooks["custom_namedtuple"] is ftjit._jax._every_namedtuple
        and fast["custom_namedtuple"] is not ftjit._jax._every_namedtuple,
    }[missing]


@pytest.mark.thread_unsafe(reason="swaps the process-wide JAX hooks")
@pytest.mark.parametrize("missing", FEATURES + ["all"])
def test_public_fallbacks_match_jax_jit(monkeypatch, missing):
    fast = frozenset() if missing == "all" else ftjit._jax.FAST_PATHS - {missing}
    hooks = ftjit._jax.build_hooks(fast)
    for feature in FEATURES if missing == "all" else [missing]:
        assert _fallback_in_use(hooks, feature), feature
    monkeypatch.setattr(ftjit._jax, "_hooks", hooks)

    # Results, dtypes, weak types and trace counts.
    fj, jj, ff, jf = both(lambda x, y: x * y)
    calls = [
        (jnp.ones(3), 2.0),
        (np.ones(3, np.float32), 2),
        (jnp.ones(3), jnp.float32(2)),
        (jax.device_put(jnp.ones(3), jax.devices()[0]), 2.0),
        (1, True),
        (jnp.ones(3), 2.0),
    ]
    for args in calls:
        assert_same(jf(*args), jj(*args))
    assert ff.tracer.count == fj.tracer.count
    assert jf.cache_info().compiles == len({jf._signature_of(*a) for a in calls}) == 5
    assert jf._signature_of(*calls[3]).endswith("(float32[3]@cpu:0, float)")  # committed placement
    # Tracing configs recompile (the context).
    with jax.enable_x64(True):
        assert_same(jf(1.0, 2.0), jj(1.0, 2.0))
        assert jf(1.0, 2.0).dtype == jnp.float64
    with jax.numpy_dtype_promotion("strict"):
        with pytest.raises(Exception) as want:
            jj(jnp.ones(2, jnp.float32), jnp.ones(2, jnp.bfloat16))
        with pytest.raises(type(want.value)):
            jf(jnp.ones(2, jnp.float32), jnp.ones(2, jnp.bfloat16))
    assert ff.tracer.count == fj.tracer.count
    # Active traces defer (the probe), closed-over tracers included.
    assert float(jax.jit(lambda a: ftjit.jit(lambda x: x * a)(2.0))(3.0)) == 6.0
    assert float(jax.grad(lambda a: jf(a, 3.0))(2.0)) == 3.0
    # jax.disable_jit (the context's jax_disable_jit item), on a cached signature.
    assert float(jf(2.0, 3.0)) == 6.0
    before = jf.cache_info()
    with jax.disable_jit():
        assert jf(2.0, 3.0) == 6.0 and type(jf(2.0, 3.0)) is float
    after = jf.cache_info()
    assert (after.size, after.hits, after.misses) == (before.size, before.hits, before.misses)


def test_public_context_names_cover_every_readable_trace_context_config():
    # The public fallback reads configs by name through jax.config: it must
    # know every config of the installed JAX's trace context that it can read
    # (a JAX release adding one makes this fail: add it to the list).
    from jax._src import config as jax_config

    names_fn = getattr(getattr(jax_config, "config_ext", None), "trace_context_names", None)
    if names_fn is None:
        pytest.skip("this JAX has no trace_context_names()")
    readable = [n for n in names_fn() if ftjit._jax._readable(jax.config, n)]
    assert readable, "no config of the trace context is readable through jax.config"
    assert [n for n in readable if n not in ftjit._jax.PUBLIC_CONTEXT_NAMES] == []


def test_public_fallback_keys_on_jax_random_seed_offset():
    # One of the configs the public fallback missed before: a stale executable
    # would ignore the new offset.
    from jax._src import config as jax_config

    hooks = ftjit._jax.build_hooks(frozenset())
    context = hooks["signature_hooks"].context
    before = context()
    with jax_config.random_seed_offset(7):  # the thread-local override
        assert context() != before
    assert context() == before


@pytest.mark.thread_unsafe(reason="swaps the process-wide JAX hooks")
def test_without_any_trace_probe_every_call_defers_to_jax_jit(monkeypatch):
    monkeypatch.setattr(ftjit._jax, "_private_trace_probe", lambda: None)
    monkeypatch.setattr(ftjit._jax, "_public_trace_probe", lambda: (None, None, None))
    with pytest.warns(RuntimeWarning, match="no API ftjit knows for detecting an active trace"):
        hooks = ftjit._jax.build_hooks()
    monkeypatch.setattr(ftjit._jax, "_hooks", hooks)
    jf = ftjit.jit(lambda x, a: x * a)
    assert float(jf(2.0, 3.0)) == 6.0
    # A closed-over tracer, which only a probe could have seen: still right.
    assert float(jax.jit(lambda a: ftjit.jit(lambda x: x * a)(2.0))(3.0)) == 6.0
    assert float(jax.grad(lambda a: jf(a, 3.0))(2.0)) == 3.0
    info = jf.cache_info()
    assert (info.compiles, info.size) == (0, 0)  # nothing cached: all through jax.jit


# -- 6b. configs of jax.jit's key that trace_context() leaves out ----------

SET_MESH = """
    import jax, jax.numpy as jnp, numpy as np, ftjit, ftjit._jax
    from jax.sharding import Mesh, PartitionSpec as P
    d0, d1 = jax.devices()
    # Equal abstract meshes (one axis "x" of size 1) on different devices:
    # trace_context() sees no difference, jax.jit keys on the concrete mesh.
    meshes = [Mesh(np.array([d0]), ("x",)), Mesh(np.array([d1]), ("x",))]

    def run(wrap):
        traces = []
        def f(a):
            traces.append(1)
            return jax.lax.with_sharding_constraint(a * 2, P("x"))
        g = wrap(f)
        out = []
        for m in meshes + meshes:
            with jax.set_mesh(m):
                y = g(np.arange(4.0, dtype=np.float32))
                out.append((sorted(d.id for d in y.devices()), np.asarray(y).tolist()))
        return g, out, len(traces)

    _, want, want_traces = run(jax.jit)
    jf, got, got_traces = run(ftjit.jit)
    assert got == want and got_traces == want_traces, (got, want, got_traces, want_traces)
    info = jf.cache_info()
    print(want[0][0], want[1][0], info.compiles, info.hits, got_traces)
    ftjit._jax._hooks = ftjit._jax.build_hooks(frozenset())  # the public fallbacks
    jf, got, got_traces = run(ftjit.jit)
    assert got == want, ("public", got, want)
    assert (jf.cache_info().compiles, jf.cache_info().hits) == (info.compiles, info.hits)
"""


@pytest.mark.thread_unsafe(reason="spawns an interpreter; slow to repeat 8x")
def test_concrete_mesh_of_set_mesh_is_keyed_like_jax_jit():
    out = run_script(SET_MESH, env={"XLA_FLAGS": "--xla_force_host_platform_device_count=2"})
    # Device 0 then device 1; two compiles (one per concrete mesh), two hits,
    # and one trace: like jax.jit, the trace is shared (equal abstract meshes).
    assert out == "[0] [1] 2 2 1"


def test_compiler_option_configs_recompile_like_jax_jit():
    from jax._src import config as jax_config

    fj, jj, ff, jf = both(lambda x: x * 2)
    x = jnp.arange(3.0)
    for fn in (jj, jf):
        fn(x)
        with jax_config.optimization_level("O1"):
            fn(x)
            fn(x)
        with jax_config.memory_fitting_level("O0"):
            fn(x)
        fn(x)
    assert fj.tracer.count == ff.tracer.count
    info = jf.cache_info()
    assert (info.compiles, info.hits) == (3, 2)
    sig = ftjit._jax._jax_hooks()["signature_hooks"]
    import importlib

    modules = [importlib.import_module(m) for m in ftjit._jax._EXTRA_CONFIG_MODULES]
    assert [arg for _, arg in sig.extras] == [
        next(getattr(m, name) for m in modules if hasattr(m, name)) for name in ftjit._jax.JIT_KEY_EXTRA_CONFIGS]


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


# -- 10. int/float/complex subclasses are leaves ---------------------------


class Color(enum.IntEnum):
    RED = 1
    GREEN = 2


class Meters(float):
    pass


class Phase(complex):
    pass


@pytest.mark.parametrize("value, base", [(Color.GREEN, 2), (Meters(2.5), 2.5), (Phase(1 + 2j), 1 + 2j)])
def test_scalar_subclasses_are_leaves_like_jax_jit(value, base):
    fj, jj, ff, jf = both(lambda x: x * 2)
    for v in (value, base, value):
        assert_same(jf(v), jj(v))
    assert ff.tracer.count == fj.tracer.count == 1
    assert jf._signature_of(value) == jf._signature_of(base)


# -- 11. module-style pytrees, other tracing configs, lower() --------------


@jax.tree_util.register_pytree_with_keys_class
class Linear:
    """A flax/equinox-style layer: arrays are children, config is aux data."""

    def __init__(self, w, b, activation="relu"):
        self.w, self.b, self.activation = w, b, activation

    def tree_flatten_with_keys(self):
        keys = jax.tree_util.GetAttrKey
        return ((keys("w"), self.w), (keys("b"), self.b)), self.activation

    @classmethod
    def tree_unflatten(cls, activation, children):
        return cls(*children, activation=activation)

    def __call__(self, x):
        y = x @ self.w + self.b
        return jax.nn.relu(y) if self.activation == "relu" else jnp.tanh(y)


@functools.partial(jax.tree_util.register_dataclass, data_fields=["layers"], meta_fields=["name"])
@dataclasses.dataclass
class MLP:
    layers: list
    name: str = "mlp"


def _apply(model, x):
    for layer in model.layers:
        x = layer(x)
    return x


def _mlp(seed, activation="relu", name="mlp"):
    rng = np.random.default_rng(seed)
    layer = lambda i, o, act: Linear(  # noqa: E731
        jnp.asarray(rng.standard_normal((i, o)), jnp.float32), jnp.zeros(o, jnp.float32), act
    )
    return MLP([layer(4, 8, "relu"), layer(8, 2, activation)], name)


def test_module_style_pytrees_trace_and_recompile_like_jax_jit():
    fj, jj, ff, jf = both(_apply)
    x = np.ones((3, 4), np.float32)
    counts = []
    for model in (_mlp(0), _mlp(1), _mlp(2, activation="tanh"), _mlp(3, name="other"), _mlp(4)):
        assert_same(jf(model, x), jj(model, x))
        assert_same(jf(model=model, x=x), jj(model=model, x=x))
        counts.append((ff.tracer.count, fj.tracer.count))
    # New weights: no retrace; a static field of a nested module or of the
    # outer module: a retrace. Positional and keyword calls trace separately.
    assert counts == [(2, 2), (2, 2), (4, 4), (6, 6), (6, 6)]
    assert jf.cache_info().compiles == 6


def test_dtype_promotion_config_recompiles_like_jax_jit():
    fj, jj, ff, jf = both(lambda x, y: x + y)
    a, b = jnp.ones(2, jnp.float32), jnp.ones(2, jnp.bfloat16)
    outcomes = []
    for fn, fun in ((jj, fj), (jf, ff)):
        out = [fn(a, b).dtype]
        with jax.numpy_dtype_promotion("strict"):
            with pytest.raises(jax.numpy.TypePromotionError if hasattr(jnp, "TypePromotionError") else Exception) as e:
                fn(a, b)
            out.append((type(e.value), str(e.value)))
            out.append(fn(a, a).dtype)
        out.append(fn(a, b).dtype)
        out.append(fun.tracer.count)
        outcomes.append(out)
    assert outcomes[1] == outcomes[0]
    assert outcomes[0][-1] == 3
    assert jf.cache_info().compiles == 2  # the failed strict trace is not cached


def _lowered_fun(x, n, *, y, mode):
    return (x * n + y) if mode == "add" else (x * n - y)


def test_lower_with_keywords_statics_and_shape_dtype_structs_matches_jax_jit():
    jj = jax.jit(_lowered_fun, static_argnums=1, static_argnames="mode")
    jf = ftjit.jit(_lowered_fun, static_argnums=1, static_argnames="mode", cache=ftjit.FunctionCache())
    spec = jax.ShapeDtypeStruct((3,), jnp.float32)
    for mode in ("add", "sub"):
        want = jj.lower(spec, 2, y=spec, mode=mode)
        got = jf.lower(spec, 2, y=spec, mode=mode)
        assert isinstance(got, jax.stages.Lowered)
        assert got.as_text() == want.as_text()
        x, y = np.arange(3, dtype=np.float32), np.ones(3, np.float32)
        assert_same(got.compile()(x, y=y), want.compile()(x, y=y))
        with pytest.raises(Exception) as want_err:
            want.compile()(np.ones(4, np.float32), y=y)
        with pytest.raises(type(want_err.value)) as got_err:
            got.compile()(np.ones(4, np.float32), y=y)
        assert str(got_err.value) == str(want_err.value)
    assert jf.cache_info().size == 0  # lowering does not touch the cache
    # The cache warmed with ShapeDtypeStructs serves concrete calls.
    assert jf.precompile(spec, 2, y=spec, mode="add") is True
    assert jf.precompile(spec, 2, y=spec, mode="add") is False
    x = np.arange(3, dtype=np.float32)
    assert_same(jf(x, 2, y=x, mode="add"), jj(x, 2, y=x, mode="add"))
    info = jf.cache_info()
    assert (info.compiles, info.hits, info.size) == (1, 1, 1)


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


# -- an explicit compiler=JaxCompiler(...) keys and strips the statics its jax.jit uses --


def _scale(a, n):
    return a * n


@pytest.mark.parametrize("make", [
    lambda: ftjit.jit(_scale, static_argnums=1, compiler=ftjit.JaxCompiler(), cache=ftjit.FunctionCache()),
    lambda: ftjit.jit(_scale, compiler=ftjit.JaxCompiler((1,)), cache=ftjit.FunctionCache()),
    lambda: ftjit.jit(_scale, compiler=ftjit.JaxCompiler((), ("n",)), cache=ftjit.FunctionCache()),
    lambda: ftjit.jit(_scale, static_argnums=1, compiler=ftjit.JaxCompiler((1,)), cache=ftjit.FunctionCache()),
], ids=["statics-on-jit", "argnums-on-compiler", "argnames-on-compiler", "both-equal"])
def test_explicit_jax_compiler_with_statics_matches_jax_jit(make):
    jf = make()
    x = jnp.arange(3.0)
    for n in (3, 3, 4):
        assert_same(jf(x, n), jax.jit(_scale, static_argnums=1)(x, n))
    info = jf.cache_info()
    assert (info.compiles, info.hits) == (2, 1)
    assert [s.signature for s in jf.signatures()].count("_scale(float32[3], 3)") == 1


def test_explicit_jax_compiler_statics_that_differ_from_jits_are_a_value_error():
    with pytest.raises(ValueError, match=r"^ftjit\.jit: static_argnums=\(0,\) differs from the compiler's "
                                         r"static_argnums=\(1,\); give it to one of them"):
        ftjit.jit(_scale, static_argnums=0, compiler=ftjit.JaxCompiler((1,)))
    with pytest.raises(ValueError, match=r"^ftjit\.jit: keep_unused=False differs from the compiler's keep_unused=True"):
        ftjit.jit(_scale, compiler=ftjit.JaxCompiler(jit_options=(("keep_unused", True),)), keep_unused=False)


def test_explicit_jax_compiler_takes_donation_like_the_default():
    jf = ftjit.jit(lambda a: a + 1, compiler=ftjit.JaxCompiler(), donate_argnums=0, cache=ftjit.FunctionCache())
    y = jnp.arange(3.0)
    assert_same(jf(y), jnp.arange(1.0, 4.0))
    assert y.is_deleted()


class _CountingJax(ftjit.JaxCompiler):
    __slots__ = ("calls",)

    def __init__(self, *args):
        super().__init__(*args)
        self.calls = 0

    def __call__(self, fun, args, kwargs):
        self.calls += 1
        return super().__call__(fun, args, kwargs)


def test_jax_compiler_subclass_keeps_its_own_call_and_statics():
    comp = _CountingJax((1,))
    jf = ftjit.jit(_scale, compiler=comp, cache=ftjit.FunctionCache())
    x = jnp.arange(3.0)
    assert_same(jf(x, 2), jax.jit(_scale, static_argnums=1)(x, 2))
    assert_same(jf(x, 2), jax.jit(_scale, static_argnums=1)(x, 2))
    assert comp.calls == 1 and jf.cache_info().compiles == 1
    with pytest.raises(TypeError, match=r"^ftjit\.jit: donate_argnums cannot be added to a _CountingJax \(a JaxCompiler "
                                        r"subclass\): pass them to its JaxCompiler constructor \(jit_options\)$"):
        ftjit.jit(_scale, compiler=_CountingJax((1,)), donate_argnums=0)
    with pytest.raises(ValueError, match=r"differs from the compiler's static_argnums=\(\)"):
        ftjit.jit(_scale, static_argnums=1, compiler=_CountingJax())


def test_jax_compiler_equality_plain_by_options_subclasses_by_identity():
    plain, sub = ftjit.JaxCompiler((1,)), _CountingJax((1,))
    assert plain == ftjit.JaxCompiler((1,)) and hash(plain) == hash(ftjit.JaxCompiler((1,)))
    assert plain != sub and sub != plain  # symmetric: a subclass never shares a plain one's entries
    assert sub == sub and sub != _CountingJax((1,))  # each may count its own compiles
    x = jnp.arange(3.0)
    first, second = _CountingJax((1,)), _CountingJax((1,))
    cache = ftjit.FunctionCache()
    ftjit.jit(_scale, compiler=first, cache=cache)(x, 2)
    ftjit.jit(_scale, compiler=second, cache=cache)(x, 2)
    assert (first.calls, second.calls) == (1, 1)


def test_numpy_integers_as_static_argnums_like_jax_jit():
    x = jnp.arange(3.0)
    for argnums in (np.int64(1), np.array([1]), (np.int32(1),)):
        jf = ftjit.jit(_scale, static_argnums=argnums, cache=ftjit.FunctionCache())
        assert_same(jf(x, 5), jax.jit(_scale, static_argnums=argnums)(x, 5))
        assert jf.signatures()[0].signature == "_scale(float32[3], 5)"


def test_equal_list_and_dict_options_share_entries():
    cache = ftjit.FunctionCache()

    def inc(a):
        return a + 1

    pairs = [
        (dict(donate_argnums=[0]), dict(donate_argnums=[0])),
        (dict(compiler_options={"xla_cpu_enable_fast_math": False}),
         dict(compiler_options={"xla_cpu_enable_fast_math": False})),
    ]
    for first, second in pairs:
        a = ftjit.jit(inc, cache=cache, **first)
        b = ftjit.jit(inc, cache=cache, **second)
        assert_same(a(jnp.arange(3.0)), jnp.arange(1.0, 4.0))
        assert_same(b(jnp.arange(3.0)), jnp.arange(1.0, 4.0))
        info = b.cache_info()
        assert (info.compiles, info.hits) == (1, 1), (first, info)
    # Different values (or a list vs a tuple) stay apart.
    assert ftjit.JaxCompiler(jit_options=(("donate_argnums", [0]),)) != ftjit.JaxCompiler(
        jit_options=(("donate_argnums", [1]),))
    assert ftjit.JaxCompiler(jit_options=(("donate_argnums", [0]),)) != ftjit.JaxCompiler(
        jit_options=(("donate_argnums", (0,)),))


def test_public_fallback_hooks_built_inside_a_trace_still_key_the_mesh():
    # The hooks are built once per process, possibly by a jit() created inside
    # a trace (where get_mesh() raises): the mesh getter must still be there.
    outside = ftjit._jax.build_hooks(frozenset())["signature_hooks"].extras
    seen = []

    def body(x):
        seen.append(ftjit._jax.build_hooks(frozenset())["signature_hooks"].extras)
        return x

    jax.make_jaxpr(body)(1.0)
    assert len(outside) == 1 and len(seen) == 1 and len(seen[0]) == 1
    getter, arg = seen[0][0]
    assert getter(arg) == outside[0][0](outside[0][1])


# -- precompile/warmup of a ShapeDtypeStruct with a sharding -------------------


def test_precompiled_sharded_spec_is_keyed_as_a_committed_array():
    """A ShapeDtypeStruct with a sharding stands for arrays committed to it:
    its entry serves such calls, and an uncommitted call compiles its own,
    with jax.jit's uncommitted output (not one committed where the spec was)."""
    from jax.sharding import SingleDeviceSharding

    (dev,) = jax.devices()[:1]
    spec = jax.ShapeDtypeStruct((4,), jnp.float32, sharding=SingleDeviceSharding(dev))
    jf = ftjit.jit(lambda x: x * 2, cache=ftjit.FunctionCache())
    assert jf.precompile(spec) is True
    [info] = jf.signatures()
    assert info.signature.endswith("<lambda>(float32[4]@cpu:0)"), info.signature
    assert jf.precompile(spec) is False
    committed = jf(jax.device_put(jnp.ones(4, jnp.float32), dev))  # the warmed entry
    assert (jf.cache_info().compiles, jf.cache_info().hits) == (1, 1)
    assert committed.committed and committed.tolist() == [2.0] * 4
    plain = jf(np.ones(4, np.float32))  # uncommitted: another signature, as in jax.jit
    want = jax.jit(lambda x: x * 2)(np.ones(4, np.float32))
    assert jf.cache_info().compiles == 2
    assert plain.committed is want.committed is False
    unplaced = jax.ShapeDtypeStruct((4,), jnp.float32)  # no sharding: the uncommitted entry
    assert jf.precompile(unplaced) is False
    report = jf.warmup([(jax.ShapeDtypeStruct((8,), jnp.float32, sharding=SingleDeviceSharding(dev)),)])
    assert report.ok and [r.compiled for r in report.results] == [True]
    jf(jax.device_put(jnp.ones(8, jnp.float32), dev))
    assert (jf.cache_info().compiles, jf.cache_info().hits) == (3, 2)


SHARDED_SPEC = """
import jax, jax.numpy as jnp, numpy as np, ftjit
from jax.sharding import NamedSharding, PartitionSpec as P, SingleDeviceSharding
d0, d1 = jax.devices()
f = lambda x: x * 2
jf = ftjit.jit(f, cache=ftjit.FunctionCache())
jf.precompile(jax.ShapeDtypeStruct((4,), jnp.float32, sharding=SingleDeviceSharding(d1)))
r = jf(np.ones(4, np.float32))                      # not placed: compiles for the default device
j = jax.jit(f)(np.ones(4, np.float32))
out = [sorted(d.id for d in r.devices()), r.committed, sorted(d.id for d in j.devices()), j.committed]
jax.jit(jnp.add)(r, jax.device_put(jnp.ones(4), d0))  # usable with device-0 arrays, as jax.jit's
r1 = jf(jax.device_put(jnp.ones(4), d1))            # the precompiled entry
out += [sorted(d.id for d in r1.devices()), jf.cache_info().compiles, jf.cache_info().hits]
ns = NamedSharding(jax.make_mesh((2,), ("x",)), P("x"))
jf.precompile(jax.ShapeDtypeStruct((4,), jnp.float32, sharding=ns))
y = jf(jax.device_put(np.ones(4, np.float32), ns))
out += [y.sharding == ns, jf.cache_info().compiles, jf.cache_info().hits]
print(*out)
"""


@pytest.mark.thread_unsafe(reason="spawns an interpreter; slow to repeat 8x")
def test_precompiled_sharded_spec_on_two_devices():
    out = run_script(SHARDED_SPEC, env={"XLA_FLAGS": "--xla_force_host_platform_device_count=2"})
    assert out == "[0] False [0] False [1] 2 1 True 3 2"


# -- namedtuples registered as custom pytree nodes ------------------------------

from typing import NamedTuple  # noqa: E402


class _Scaled(NamedTuple):
    """A namedtuple registered with its own flatten: `n` is aux data (static)."""

    x: object
    n: object


jax.tree_util.register_pytree_node(_Scaled, lambda p: ((p.x,), p.n), lambda n, ch: _Scaled(ch[0], n))


class _Plain(NamedTuple):
    x: object
    n: object


@pytest.mark.parametrize("fast", ["fast", "public"])
def test_namedtuple_registered_as_a_custom_node_is_flattened_by_its_registration(fast, monkeypatch):
    """JAX honours a namedtuple's registration over its namedtuple handling
    (the aux field is static: a new value retraces); so does ftjit, with the
    private registry check and with the public fallback."""
    if fast == "public":
        monkeypatch.setattr(ftjit._jax, "_hooks", ftjit._jax.build_hooks(frozenset()))
    body = lambda p: p.x * (p.n if isinstance(p.n, int) else 1)  # noqa: E731
    fj, ff = counted(body), counted(body)
    jj, jf = jax.jit(fj), ftjit.jit(ff, cache=ftjit.FunctionCache())
    calls = [_Scaled(jnp.ones(2), 2), _Scaled(jnp.ones(2), 3), _Scaled(jnp.ones(2), "a"), _Scaled(jnp.ones(2), 3)]
    for a in calls:
        assert_same(jf(a), jj(a))
    assert ff.tracer.count == fj.tracer.count == 3
    assert (jf.cache_info().compiles, jf.cache_info().hits) == (3, 1)
    assert sorted(s.signature.split("(", 1)[1] for s in jf.signatures()) == [
        f"PyTreeDef(CustomNode(_Scaled[{n}], [*]))(float32[2]))" for n in (2, 3, "a")
    ]
    # A plain namedtuple is still all leaves, keyed by its type.
    plain = ftjit.jit(lambda p: p.x + p.n, cache=ftjit.FunctionCache())
    assert_same(plain(_Plain(jnp.ones(2), 2.0)), jax.jit(lambda p: p.x + p.n)(_Plain(jnp.ones(2), 2.0)))
    assert_same(plain(_Plain(jnp.ones(2), 5.0)), jax.jit(lambda p: p.x + p.n)(_Plain(jnp.ones(2), 5.0)))
    assert plain.cache_info().compiles == 1


# -- jax_debug_nans / jax_debug_infs report as jax.jit does ---------------------


@pytest.mark.parametrize("first", ["nan_first", "cached_first"])
def test_debug_nans_raises_floating_point_error_naming_the_op(first):
    """A NaN in the output under jax_debug_nans is a FloatingPointError naming
    the op (jax.jit re-runs de-optimised), on the compiling call and on hits,
    not JAX's internal exception; the entry stays cached."""
    f = counted(lambda x: jnp.log(x))
    jf = ftjit.jit(f, cache=ftjit.FunctionCache())
    with jax.debug_nans(True):
        if first == "cached_first":
            assert float(jf(2.0)) == pytest.approx(0.6931472)
        for _ in range(2):
            with pytest.raises(FloatingPointError, match=r"^invalid value \(nan\) encountered in log($|\n)"):
                jf(-1.0)
        assert float(jf(1.0)) == 0.0
    info = jf.cache_info()
    assert (info.compiles, info.failures, info.size) == (1, 0, 1)


def test_debug_infs_raises_like_jax_jit():
    jj, jf = jax.jit(lambda x: 1 / x), ftjit.jit(lambda x: 1 / x, cache=ftjit.FunctionCache())
    with jax.debug_infs(True):
        with pytest.raises(ZeroDivisionError) as want:
            jj(0.0)
        with pytest.raises(ZeroDivisionError) as got:
            jf(0.0)
    assert str(got.value) == str(want.value)


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
