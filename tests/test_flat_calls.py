"""Flatten once: an executable that takes the leaves ftjit flattened.

With the JAX compiler each compiled signature's executable is jaxlib's C++
call of the compiled program rebuilt for flat leaves (``_jax_calls._flat_call``),
called with the leaves the core collected while building the signature, so
a custom node's flatten function runs once per call, not twice. The one way
this could go wrong without an error is an order of leaves other than JAX's
(same-shaped arrays silently swapped), so most tests here pass arrays of one
shape whose values say where they went, in every arrangement of keywords,
dict insertion orders, statics and nodes, and compare with jax.jit.
Also: the entries that keep calling with the arguments. The protocol itself
(``CompilerHooks.executable_for``), with a compiler of our own and no JAX:
tests/test_executable_for.py.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
from typing import NamedTuple

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import ftjit
import ftjit._jax_calls
from helpers import run_threads


def _vals(n, shape=(3,)):
    """n same-shaped arrays, the i-th full of 10**i: a swap shows in the sum's digits."""
    return [jnp.full(shape, 10.0**i, jnp.float32) for i in range(n)]


def _weights(tree):
    """Each leaf times a distinct prime: sum() then says which leaf went where."""
    primes = [2, 3, 5, 7, 11, 13, 17, 19]
    leaves = jax.tree_util.tree_leaves(tree)
    return sum(p * x for p, x in zip(primes, leaves))


def _same(a, b):
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)


def _takes_leaves(jf):
    return [s.takes_leaves for s in jf.signatures()]


def test_keywords_in_any_order_reach_the_parameters_they_name():
    def f(a, b, *, c, d):
        return a * 1 + b * 2 + c * 3 + d * 4, a - d

    jf = ftjit.jit(f, cache=ftjit.FunctionCache())
    jj = jax.jit(f)
    a, b, c, d = _vals(4)
    names = {"c": c, "d": d}
    for order in itertools.permutations("cd"):
        kwargs = {k: names[k] for k in order}
        _same(jf(a, b, **kwargs), jj(a, b, **kwargs))
    for order in itertools.permutations("bcd"):
        kwargs = {k: {"b": b, "c": c, "d": d}[k] for k in order}
        _same(jf(a, **kwargs), jj(a, **kwargs))
    # f(a, b, c=, d=) in both orders is one signature; b by keyword is another.
    assert jf.cache_info().compiles == 2
    assert _takes_leaves(jf) == [True, True]


def test_dicts_in_any_insertion_order_and_nested_containers():
    def f(tree):
        return _weights(tree)

    jf = ftjit.jit(f, cache=ftjit.FunctionCache())
    jj = jax.jit(f)
    v = _vals(6)
    keys = ["b", "a", "c"]
    for order in itertools.permutations(keys):
        d = {k: v[keys.index(k)] for k in order}
        tree = (d, [v[3], None, (v[4],)], {"z": {"y": v[5]}})
        _same(jf(tree), jj(tree))
    assert jf.cache_info().compiles == 1 and _takes_leaves(jf) == [True]


class Pair(NamedTuple):
    second: jax.Array
    first: jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Params:
    w: jax.Array
    b: jax.Array
    scale: float = dataclasses.field(metadata=dict(static=True), default=1.0)


class Reversed:
    """A registered node whose children are its fields in reverse order."""

    def __init__(self, x, y, z):
        self.x, self.y, self.z = x, y, z


FLATTENS = []  # one entry per call of Reversed's flatten function
FLATTENS_LOCK = threading.Lock()


def _flatten_reversed(r):
    with FLATTENS_LOCK:
        FLATTENS.append(1)
    return (r.z, r.y, r.x), None


jax.tree_util.register_pytree_node(Reversed, _flatten_reversed, lambda _, c: Reversed(c[2], c[1], c[0]))


def test_namedtuples_dataclasses_and_custom_nodes_keep_their_children_s_order():
    def f(p, params, r):
        return _weights((p, params, r)) * params.scale, r.x - r.z

    jf = ftjit.jit(f, cache=ftjit.FunctionCache())
    jj = jax.jit(f)
    v = _vals(7)
    args = (Pair(v[0], v[1]), Params(v[2], v[3], 2.0), Reversed(v[4], v[5], v[6]))
    for _ in range(3):
        _same(jf(*args), jj(*args))
    args2 = (Pair(v[1], v[0]), Params(v[3], v[2], 2.0), Reversed(v[6], v[4], v[5]))
    _same(jf(*args2), jj(*args2))
    assert jf.cache_info().compiles == 1 and _takes_leaves(jf) == [True]


@pytest.mark.thread_unsafe(reason="counts calls of a module-level flatten function")
def test_a_custom_node_is_flattened_once_per_call():
    jf = ftjit.jit(lambda r: r.x + r.y * 2 + r.z * 3, cache=ftjit.FunctionCache())
    r = Reversed(*_vals(3))
    jf(r)  # compiles (JAX's trace flattens it too)
    FLATTENS.clear()
    for _ in range(5):
        jf(r)
    assert len(FLATTENS) == 5  # once per call: the executable takes the leaves
    # The store's path (a thread's call object off): twice without flat calls, ftjit's walk, then jaxlib's.
    ftjit._jax_calls.FLAT_CALLS = ftjit._jax_calls.THREAD_CALLS = False
    try:
        jf2 = ftjit.jit(lambda r: r.x + r.y * 2 + r.z * 3, cache=ftjit.FunctionCache())
        jf2(r)
        FLATTENS.clear()
        for _ in range(5):
            jf2(r)
    finally:
        ftjit._jax_calls.FLAT_CALLS = ftjit._jax_calls.THREAD_CALLS = True
    assert len(FLATTENS) == 10 and _takes_leaves(jf2) == [False]


def test_statics_among_the_arguments_are_left_out_of_the_leaves():
    def f(a, n, b, *, mode, c):
        return (a * n + b * 10 + c * 100) if mode == "sum" else (a - b - c)

    jf = ftjit.jit(f, static_argnums=1, static_argnames="mode", cache=ftjit.FunctionCache())
    jj = jax.jit(f, static_argnums=1, static_argnames="mode")
    a, b, c = _vals(3)
    for kwargs in ({"mode": "sum", "c": c}, {"c": c, "mode": "sum"}, {"c": c, "mode": "diff"}):
        _same(jf(a, 3, b, **kwargs), jj(a, 3, b, **kwargs))
    assert jf.cache_info().compiles == 2 and _takes_leaves(jf) == [True, True]


def test_python_scalars_and_numpy_leaves_are_leaves_too():
    def f(x, s, arr, flag):
        return x * s + arr, flag

    jf = ftjit.jit(f, cache=ftjit.FunctionCache())
    jj = jax.jit(f)
    args = (jnp.ones(3), 2.5, np.arange(3, dtype=np.float32), True)
    _same(jf(*args), jj(*args))
    args = (jnp.ones(3), 4.0, np.arange(3, dtype=np.float32) * 2, False)
    _same(jf(*args), jj(*args))
    assert jf.cache_info().compiles == 1 and _takes_leaves(jf) == [True]


def test_no_leaves_at_all():
    jf = ftjit.jit(lambda n: jnp.arange(n), static_argnums=0, cache=ftjit.FunctionCache())
    _same(jf(3), jnp.arange(3))
    _same(jf(3), jnp.arange(3))
    assert _takes_leaves(jf) == [True]


def test_donated_keyword_argument_is_donated_by_its_leaf():
    def f(a, b):
        return a + b

    jf = ftjit.jit(f, donate_argnames="b", cache=ftjit.FunctionCache())
    a, b = jnp.ones(3), jnp.full(3, 2.0)
    _same(jf(b=b, a=a), jnp.full(3, 3.0))
    assert _takes_leaves(jf) == [True]
    assert b.is_deleted() and not a.is_deleted()
    b2 = jnp.full(3, 5.0)
    _same(jf(a=a, b=b2), jnp.full(3, 6.0))  # the hit, keywords the other way round
    assert b2.is_deleted() and not a.is_deleted()


def test_a_precompiled_spec_makes_an_entry_the_calls_use_with_their_leaves():
    def f(d):
        return d["x"] * 1 + d["y"] * 2

    jf = ftjit.jit(f, cache=ftjit.FunctionCache())
    spec = jax.ShapeDtypeStruct((3,), jnp.float32)
    assert jf.precompile({"y": spec, "x": spec}) is True
    x, y = _vals(2)
    _same(jf({"y": y, "x": x}), x + y * 2)
    assert jf.cache_info().compiles == 1 and _takes_leaves(jf) == [True]


def test_host_callbacks_take_the_leaves_through_jax_s_python_call(capfd):
    def f(a, b):
        jax.debug.print("a={a} b={b}", a=a[0], b=b[0])
        return a - b

    jf = ftjit.jit(f, cache=ftjit.FunctionCache())
    a, b = _vals(2)
    _same(jf(b=b, a=a), a - b)
    _same(jf(b=b, a=a), a - b)
    jax.effects_barrier()
    assert capfd.readouterr().out == "a=1.0 b=10.0\n" * 2
    assert _takes_leaves(jf) == [True]


class Computed:
    """A node whose flatten makes a new leaf on every call: JAX's leaves are
    then not the objects ftjit flattened, so the entry keeps the arguments."""

    def __init__(self, x):
        self.x = x


def _flatten_computed(c):
    # A new array each time (JAX also flattens non-array stand-ins: kept as they are).
    return ((c.x * 1 if isinstance(c.x, jax.Array) else c.x),), None


jax.tree_util.register_pytree_node(Computed, _flatten_computed, lambda _, ch: Computed(ch[0]))


def test_an_entry_whose_leaves_jax_would_not_give_keeps_calling_with_the_arguments():
    jf = ftjit.jit(lambda c, y: c.x + y, cache=ftjit.FunctionCache())
    x, y = _vals(2)
    _same(jf(Computed(x), y), x + y)
    _same(jf(Computed(y), x), x + y)
    assert _takes_leaves(jf) == [False]


@pytest.mark.thread_unsafe(reason="switches a module-level flag of ftjit._jax")
def test_flat_calls_can_be_turned_off_and_give_the_same_results():
    def f(d, *, k):
        return d["a"] * 1 + d["b"] * 2 + k * 3

    a, b, k = _vals(3)
    results = []
    for flat in (True, False):
        ftjit._jax_calls.FLAT_CALLS = flat
        try:
            jf = ftjit.jit(f, cache=ftjit.FunctionCache())
            results.append(jf({"b": b, "a": a}, k=k))
        finally:
            ftjit._jax_calls.FLAT_CALLS = True
        assert _takes_leaves(jf) == [flat]
    _same(*results)


def test_threads_calling_one_entry_each_get_their_own_leaves():
    def f(x, y, *, z):
        return x * 1 + y * 2 + z * 3

    jf = ftjit.jit(f, cache=ftjit.FunctionCache())
    results = {}

    def work(i):
        x, y, z = (jnp.full((3,), float(i * 100 + j), jnp.float32) for j in range(3))
        for _ in range(50):
            out = jf(x, z=z, y=y) if i % 2 else jf(y=y, z=z, x=x)
        results[i] = float(out[0])

    run_threads(8, work)
    assert results == {i: (i * 100) * 1 + (i * 100 + 1) * 2 + (i * 100 + 2) * 3 for i in range(8)}
    assert jf.cache_info().compiles == 2 and _takes_leaves(jf) == [True, True]
