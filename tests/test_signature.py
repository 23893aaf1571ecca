"""Signature semantics: what makes two calls share a compiled entry.

Each test counts compiler calls on its own FunctionCache: a call with a new
signature compiles once, a call with a known signature compiles nothing, and
every result is computed from the call's real values."""

import collections
import gc
import weakref
import re
import sysconfig
import time

import numpy as np
import pytest

import ftjit
from helpers import CountingCompiler, run_threads

FREE_THREADED = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))


def make(fun, **options):
    comp = CountingCompiler()
    jf = ftjit.jit(fun, compiler=comp, cache=ftjit.FunctionCache(), **options)
    return jf, comp


# --------------------------------------------------------------------------
# Static arguments


def test_static_by_type_int_bool_float_are_three_signatures():
    jf, comp = make(lambda x, n: (x * n, type(n)), static_argnums=1)
    assert jf(2.0, 1) == (2.0, int)
    assert jf(2.0, True) == (2.0, bool)
    assert jf(2.0, 1.0) == (2.0, float)
    assert comp.calls == 3
    # And each is found again.
    assert jf(3.0, 1) == (3.0, int)
    assert jf(3.0, True) == (3.0, bool)
    assert jf(3.0, 1.0) == (3.0, float)
    assert comp.calls == 3


def test_static_values_distinguish_signatures():
    jf, comp = make(lambda x, n: x * n, static_argnums=1)
    assert jf(2.0, 3) == 6.0
    assert jf(2.0, 4) == 8.0
    assert jf(5.0, 3) == 15.0
    assert jf(5.0, 4) == 20.0
    assert comp.calls == 2


class Key:
    def __init__(self, v):
        self.v = v

    def __hash__(self):
        return hash(self.v)

    def __eq__(self, other):
        return isinstance(other, Key) and self.v == other.v


class OtherKey(Key):
    """Same hash and (cross-type) equality as Key, but a different type."""


def test_static_by_hash_and_eq():
    jf, comp = make(lambda x, k: k, static_argnums=1)
    k1, k1b, k2 = Key(1), Key(1), Key(2)
    assert jf(1.0, k1) is k1
    # An equal key is the same signature; the executable gets THIS call's key.
    assert jf(1.0, k1b) is k1b
    assert comp.calls == 1
    assert jf(1.0, k2) is k2
    assert comp.calls == 2


def test_static_equal_values_of_different_types_are_different_signatures():
    jf, comp = make(lambda x, k: type(k), static_argnums=1)
    a, b = Key(1), OtherKey(1)
    assert a == b and hash(a) == hash(b)
    assert jf(1.0, a) is Key
    assert jf(1.0, b) is OtherKey
    assert comp.calls == 2


def test_static_argnums_int_and_sequences_equivalent():
    for spec in (1, (1,), [1]):
        jf, comp = make(lambda x, s: x * len(s), static_argnums=spec)
        assert jf(2.0, "abc") == 6.0  # a str is only valid as a static argument
        assert jf(3.0, "abc") == 9.0
        assert jf(3.0, "ab") == 6.0
        assert comp.calls == 2, spec


def test_static_argnums_several():
    jf, comp = make(lambda a, b, c: a * len(b) + len(c), static_argnums=(1, 2))
    assert jf(1.0, "xx", "yyy") == 5.0
    assert jf(2.0, "xx", "yyy") == 7.0
    assert jf(2.0, "x", "yyy") == 5.0
    assert comp.calls == 2


def test_static_argnames_str_and_sequences():
    for spec in ("s", ("s",), ["s"]):
        jf, comp = make(lambda x, s: x * len(s), static_argnames=spec)
        assert jf(2.0, s="abc") == 6.0
        assert jf(3.0, s="abc") == 9.0
        assert comp.calls == 1, spec


def test_negative_static_argnums_resolved_against_call():
    jf, comp = make(lambda x, n: x * n, static_argnums=-1)
    assert jf(2.0, 3) == 6.0
    assert jf(2.0, 4) == 8.0  # n is static: new signature
    assert jf(5.0, 4) == 20.0
    assert comp.calls == 2


def test_negative_static_argnums_with_varargs():
    # -1 is the last positional argument of each call, as in JAX.
    def f(*xs):
        *dyn, tag = xs
        return sum(dyn) + len(tag)

    jf, comp = make(f, static_argnums=-1)
    assert jf(1.0, "a") == 2.0
    assert jf(1.0, 2.0, "bb") == 5.0  # here 2.0 is dynamic and "bb" static
    assert jf(3.0, 4.0, "bb") == 9.0
    assert comp.calls == 2
    with pytest.raises(ftjit.UnsupportedArgumentError):
        jf("not static", "a")


def test_negative_static_argnums_minus_two():
    jf, comp = make(lambda a, b, c: a * len(b) + c, static_argnums=-2)
    assert jf(1.0, "xyz", 1.0) == 4.0
    assert jf(2.0, "xyz", 5.0) == 11.0
    assert comp.calls == 1


def test_static_argnums_also_makes_keyword_form_static():
    # static_argnums=1 for def f(x, n): f(x, n=...) is static too.
    def f(x, n):
        return x * len(n)

    jf, comp = make(f, static_argnums=1)
    assert jf(2.0, n="abc") == 6.0  # would be an invalid leaf if dynamic
    assert jf(3.0, n="abc") == 9.0
    assert jf(3.0, n="ab") == 6.0
    assert jf(2.0, "abcd") == 8.0
    assert comp.calls == 3
    assert jf(4.0, "abcd") == 16.0
    assert jf(4.0, n="ab") == 8.0
    assert comp.calls == 3


def test_static_argnames_also_makes_positional_form_static():
    def f(x, n):
        return x * len(n)

    jf, comp = make(f, static_argnames="n")
    assert jf(2.0, "abc") == 6.0  # would be an invalid leaf if dynamic
    assert jf(3.0, "abc") == 9.0
    assert jf(3.0, "ab") == 6.0
    assert comp.calls == 2
    # The keyword form is static too, but f(x, n) and f(x, n=n) are different
    # signatures (as in jax.jit): the first keyword call compiles, the next hits.
    assert jf(2.0, n="abc") == 6.0
    assert comp.calls == 3
    assert jf(2.0, n="ab") == 4.0
    assert comp.calls == 4
    assert jf(5.0, n="ab") == 10.0
    assert comp.calls == 4


def test_static_keyword_only_argument():
    def f(x, *, mode):
        return x + 1 if mode == "inc" else x - 1

    jf, comp = make(f, static_argnames="mode")
    assert jf(1.0, mode="inc") == 2.0
    assert jf(1.0, mode="dec") == 0.0
    assert jf(5.0, mode="inc") == 6.0
    assert comp.calls == 2


def test_unhashable_static_argument_positional():
    jf, comp = make(lambda x, n: x, static_argnums=1)
    with pytest.raises(ftjit.UnhashableStaticArgumentError) as ei:
        jf(1.0, [1, 2])
    assert isinstance(ei.value, TypeError) and isinstance(ei.value, ValueError)
    assert "static argument 1" in str(ei.value)
    assert comp.calls == 0


def test_unhashable_static_argument_keyword():
    jf, comp = make(lambda x, n: x, static_argnames="n")
    with pytest.raises(ftjit.UnhashableStaticArgumentError) as ei:
        jf(1.0, n={"a": 1})
    assert isinstance(ei.value, TypeError) and isinstance(ei.value, ValueError)
    assert "'n'" in str(ei.value)
    assert comp.calls == 0


def test_unhashable_static_argument_custom_hash_none():
    class NoHash:
        __hash__ = None

    jf, comp = make(lambda x, n: x, static_argnums=1)
    with pytest.raises(ftjit.UnhashableStaticArgumentError):
        jf(1.0, NoHash())
    # The function still works afterwards.
    assert jf(1.0, 3) == 1.0
    assert comp.calls == 1


class EqError(Exception):
    pass


def test_static_eq_raises_propagates_exact_exception():
    raised = []

    class BadEq:
        def __init__(self, v):
            self.v = v

        def __hash__(self):
            return 12345

        def __eq__(self, other):
            if other is self:
                return True
            e = EqError(f"eq {self.v}")
            raised.append(e)
            raise e

    jf, comp = make(lambda x, k: x + k.v, static_argnums=1)
    a = BadEq(1)
    assert jf(1.0, a) == 2.0
    assert comp.calls == 1
    with pytest.raises(EqError) as ei:
        jf(1.0, BadEq(2))
    assert raised and ei.value is raised[-1]
    # The cache stays usable.
    assert jf(3.0, a) == 4.0
    assert comp.calls == 1


def test_static_eq_raises_cache_stays_usable():
    class BadEq:
        def __init__(self, v):
            self.v = v

        def __hash__(self):
            return 777

        def __eq__(self, other):
            if other is self:
                return True
            raise EqError("nope")

    def f(x, k):
        return x * 10 if isinstance(k, int) else x + k.v

    jf, comp = make(f, static_argnums=1)
    a = BadEq(1)
    assert jf(1.0, a) == 2.0
    for _ in range(3):
        with pytest.raises(EqError, match="^nope$"):
            jf(1.0, BadEq(2))
    assert jf(2.0, a) == 3.0  # the stored entry is still found
    assert jf(2.0, 5) == 20.0  # and new entries can be added
    assert jf(3.0, 5) == 30.0
    assert comp.calls == 2
    info = jf.cache_info()
    assert info.size == 2


# --------------------------------------------------------------------------
# Dynamic arguments: pytrees


def test_tuple_and_list_are_different_nodes():
    jf, comp = make(lambda t: t[0] + t[1])
    assert jf((1.0, 2.0)) == 3.0
    assert jf([1.0, 2.0]) == 3.0
    assert comp.calls == 2
    assert jf((3.0, 4.0)) == 7.0
    assert jf([5.0, 6.0]) == 11.0
    assert comp.calls == 2


def test_arity_is_part_of_signature():
    jf, comp = make(lambda t: sum(t))
    assert jf((1.0,)) == 1.0
    assert jf((1.0, 2.0)) == 3.0
    assert jf(()) == 0
    assert comp.calls == 3


def test_dict_keys_sorted():
    jf, comp = make(lambda d: d["a"] - d["b"])
    assert jf({"a": 5.0, "b": 2.0}) == 3.0
    assert jf({"b": 1.0, "a": 10.0}) == 9.0  # insertion order does not matter
    assert comp.calls == 1
    assert jf({"a": 1.0, "b": 1.0, "c": 1.0}) == 0.0  # different key set
    assert comp.calls == 2


def test_dict_different_keys_different_signatures():
    jf, comp = make(lambda d: sum(d.values()))
    assert jf({"a": 1.0}) == 1.0
    assert jf({"b": 1.0}) == 1.0
    assert comp.calls == 2


def test_dict_leaf_types_follow_sorted_keys():
    # {'a': int, 'b': float} and {'b': int, 'a': float} are different.
    jf, comp = make(lambda d: (type(d["a"]), type(d["b"])))
    assert jf({"a": 1, "b": 2.0}) == (int, float)
    assert jf({"b": 2.0, "a": 3}) == (int, float)
    assert comp.calls == 1
    assert jf({"b": 2, "a": 3.0}) == (float, int)
    assert comp.calls == 2


def test_none_is_a_node():
    jf, comp = make(lambda x, y: x if y is None else x + y)
    assert jf(1.0, None) == 1.0
    assert jf(2.0, None) == 2.0
    assert comp.calls == 1
    assert jf(2.0, 3.0) == 5.0
    assert comp.calls == 2


def test_none_and_empty_tuple_differ():
    jf, comp = make(lambda t: t)
    assert jf(None) is None
    assert jf(()) == ()
    assert jf([]) == []
    assert jf({}) == {}
    assert comp.calls == 4


def test_nested_structures():
    def f(tree):
        a, (b, c) = tree["x"], tree["y"]
        return a + b + c["z"]

    jf, comp = make(f)
    assert jf({"x": 1.0, "y": [2.0, {"z": 3.0}]}) == 6.0
    assert jf({"y": [20.0, {"z": 30.0}], "x": 10.0}) == 60.0
    assert comp.calls == 1
    assert jf({"x": 1.0, "y": (2.0, {"z": 3.0})}) == 6.0  # list -> tuple
    assert comp.calls == 2


Point = collections.namedtuple("Point", ["x", "y"])
Point2 = collections.namedtuple("Point2", ["x", "y"])


def test_namedtuple_is_node_keyed_by_type():
    jf, comp = make(lambda p: p[0] * p[1])
    assert jf(Point(2.0, 3.0)) == 6.0
    assert jf(Point(4.0, 5.0)) == 20.0
    assert comp.calls == 1
    assert jf(Point2(2.0, 3.0)) == 6.0  # same fields, other type
    assert comp.calls == 2
    assert jf((2.0, 3.0)) == 6.0  # a plain tuple
    assert comp.calls == 3


def test_namedtuple_executable_gets_the_namedtuple():
    jf, comp = make(lambda p: (type(p), p.x + p.y))
    assert jf(Point(1.0, 2.0)) == (Point, 3.0)


def test_kwargs_sorted_by_name():
    jf, comp = make(lambda a, b: a - b)
    assert jf(a=5.0, b=1.0) == 4.0
    assert jf(b=1.0, a=7.0) == 6.0
    assert comp.calls == 1


def test_kwargs_sorted_with_different_leaf_types():
    jf, comp = make(lambda a, b: (type(a), type(b)))
    assert jf(a=1, b=2.0) == (int, float)
    assert jf(b=2.0, a=1) == (int, float)
    assert comp.calls == 1
    assert jf(b=1, a=2.0) == (float, int)
    assert comp.calls == 2


def test_positional_vs_keyword_and_var_kwargs():
    def f(x, **kw):
        return x + sum(kw.values())

    jf, comp = make(f)
    assert jf(1.0, p=2.0, q=3.0) == 6.0
    assert jf(1.0, q=3.0, p=2.0) == 6.0
    assert comp.calls == 1
    assert jf(1.0, p=2.0) == 3.0
    assert comp.calls == 2
    assert jf(1.0, r=2.0) == 3.0
    assert comp.calls == 3


# --------------------------------------------------------------------------
# Leaves


def test_numpy_arrays_by_dtype_and_shape():
    jf, comp = make(lambda x: float(x.sum()))
    assert jf(np.ones(3)) == 3.0
    assert jf(np.arange(3.0)) == 3.0  # same dtype and shape, other values
    assert comp.calls == 1
    assert jf(np.ones(4)) == 4.0  # shape
    assert comp.calls == 2
    assert jf(np.ones(3, np.float32)) == 3.0  # dtype
    assert comp.calls == 3
    assert jf(np.ones((3, 1))) == 3.0  # rank
    assert comp.calls == 4
    assert jf(np.ones((1, 3))) == 3.0
    assert comp.calls == 5
    assert jf(np.ones(3, np.int32)) == 3.0
    assert comp.calls == 6
    assert jf(np.full(3, 2.0)) == 6.0
    assert jf(np.full((3, 1), 2.0)) == 6.0
    assert comp.calls == 6


def test_zero_size_and_zero_dim_arrays():
    jf, comp = make(lambda x: x.shape)
    assert jf(np.zeros((0,))) == (0,)
    assert jf(np.zeros((0, 3))) == (0, 3)
    assert jf(np.zeros((3, 0))) == (3, 0)
    assert jf(np.zeros(())) == ()
    assert comp.calls == 4
    assert jf(np.ones((0, 3))) == (0, 3)
    assert comp.calls == 4


class Duck:
    """Array-like leaf: anything with dtype and shape."""

    def __init__(self, dtype, shape, weak_type=None):
        self.dtype = np.dtype(dtype)
        self.shape = shape
        if weak_type is not None:
            self.weak_type = weak_type


def test_duck_typed_leaf_by_dtype_and_shape():
    jf, comp = make(lambda x: (x.dtype, x.shape))
    d1, d2 = Duck("float32", (2, 3)), Duck("float32", (2, 3))
    assert jf(d1) == (np.dtype("float32"), (2, 3))
    assert jf(d2) == (np.dtype("float32"), (2, 3))
    assert comp.calls == 1
    assert jf(Duck("float32", (3, 2))) == (np.dtype("float32"), (3, 2))
    assert comp.calls == 2
    assert jf(Duck("int8", (2, 3))) == (np.dtype("int8"), (2, 3))
    assert comp.calls == 3


def test_duck_executable_gets_the_call_object():
    jf, comp = make(lambda x: x)
    d1, d2 = Duck("float32", (2,)), Duck("float32", (2,))
    assert jf(d1) is d1
    assert jf(d2) is d2
    assert comp.calls == 1


def test_duck_weak_type_is_part_of_signature():
    jf, comp = make(lambda x: getattr(x, "weak_type", None))
    assert jf(Duck("float32", (2,), weak_type=True)) is True
    assert jf(Duck("float32", (2,), weak_type=True)) is True
    assert comp.calls == 1
    assert jf(Duck("float32", (2,), weak_type=False)) is False
    assert comp.calls == 2


def test_duck_and_numpy_array_with_same_dtype_shape_share_signature():
    jf, comp = make(lambda x: x.shape)
    assert jf(np.zeros((2, 3), np.float32)) == (2, 3)
    assert jf(Duck("float32", (2, 3), weak_type=False)) == (2, 3)
    assert comp.calls == 1


def test_numpy_scalars_by_dtype():
    jf, comp = make(lambda x: x * 2)
    assert jf(np.float32(1.5)) == np.float32(3.0)
    assert jf(np.float32(2.5)) == np.float32(5.0)
    assert comp.calls == 1
    assert jf(np.float64(1.5)) == 3.0
    assert comp.calls == 2
    assert jf(np.int32(3)) == 6
    assert jf(np.int64(3)) == 6
    assert comp.calls == 4
    assert type(jf(np.float32(1.0))) is np.float32


def test_numpy_scalar_same_signature_as_0d_array():
    jf, comp = make(lambda x: float(x) + 1)
    assert jf(np.float32(1.0)) == 2.0
    assert jf(np.array(2.0, np.float32)) == 3.0
    assert comp.calls == 1


def test_python_scalars_weak_and_distinct():
    jf, comp = make(lambda x: (type(x), x * 2))
    assert jf(1) == (int, 2)
    assert jf(1.0) == (float, 2.0)
    assert jf(True) == (bool, 2)
    assert jf(1j) == (complex, 2j)
    assert comp.calls == 4
    assert jf(5) == (int, 10)
    assert jf(2.5) == (float, 5.0)
    assert jf(False) == (bool, 0)
    assert jf(3j) == (complex, 6j)
    assert comp.calls == 4


def test_python_float_differs_from_numpy_float64():
    jf, comp = make(lambda x: type(x))
    assert jf(1.0) is float
    assert jf(np.float64(1.0)) is np.float64  # weak vs strong
    assert comp.calls == 2


def test_python_int_differs_from_numpy_int():
    jf, comp = make(lambda x: type(x))
    assert jf(1) is int
    assert jf(np.int64(1)) is np.int64
    assert comp.calls == 2


def test_same_signature_different_values_uses_real_values():
    jf, comp = make(lambda x, y: x * y + 1)
    assert jf(1.0, 2.0) == 3.0
    assert jf(2.0, 3.0) == 7.0
    assert jf(-1.5, 4.0) == -5.0
    assert comp.calls == 1
    a = np.arange(4.0)
    np.testing.assert_array_equal(jf(a, a), a * a + 1)
    b = np.arange(4.0) + 10
    np.testing.assert_array_equal(jf(b, b), b * b + 1)
    assert comp.calls == 2


def test_mixed_leaves_in_one_tree():
    def f(tree):
        return float(tree["arr"].sum()) + tree["s"] + len(tree["l"])

    jf, comp = make(f)
    assert jf({"arr": np.ones(2), "s": 1.0, "l": [1, 2]}) == 5.0
    assert jf({"arr": np.zeros(2), "s": 2.0, "l": [3, 4]}) == 4.0
    assert comp.calls == 1
    assert jf({"arr": np.zeros(2), "s": 2, "l": [3, 4]}) == 4.0  # float -> int
    assert comp.calls == 2


@pytest.mark.parametrize("bad", ["a string", object(), b"bytes", {1, 2}],
                         ids=["str", "object", "bytes", "set"])
def test_unsupported_leaf_positional(bad):
    def f(x, label):
        return x

    jf, comp = make(f)
    with pytest.raises(ftjit.UnsupportedArgumentError) as ei:
        jf(1.0, bad)
    msg = str(ei.value)
    assert "static_argnames" in msg
    assert "label" in msg or re.search(r"\b1\b", msg), msg
    assert comp.calls == 0


@pytest.mark.parametrize("bad", ["a string", object()], ids=["str", "object"])
def test_unsupported_leaf_keyword(bad):
    def f(x, label):
        return x

    jf, comp = make(f)
    with pytest.raises(ftjit.UnsupportedArgumentError) as ei:
        jf(1.0, label=bad)
    msg = str(ei.value)
    assert "static_argnames" in msg
    assert "label" in msg
    assert comp.calls == 0


def test_unsupported_leaf_nested():
    jf, comp = make(lambda tree: tree)
    with pytest.raises(ftjit.UnsupportedArgumentError) as ei:
        jf(tree={"a": [1.0, "nested string"]})
    assert "static_argnames" in str(ei.value)
    assert "tree" in str(ei.value)
    assert comp.calls == 0


def test_unsupported_leaf_does_not_poison_cache():
    jf, comp = make(lambda x: x)
    with pytest.raises(ftjit.UnsupportedArgumentError):
        jf("s")
    assert jf(1.0) == 1.0
    assert jf(2.0) == 2.0
    assert comp.calls == 1
    assert jf.cache_info().size == 1


def test_static_str_is_fine():
    jf, comp = make(lambda x, name: f"{name}={x}", static_argnames="name")
    assert jf(1.0, name="a") == "a=1.0"
    assert jf(2.0, name="a") == "a=2.0"
    assert comp.calls == 1


# --------------------------------------------------------------------------
# More edge cases


def test_dict_non_string_keys_sorted():
    jf, comp = make(lambda d: d[1] - d[2])
    assert jf({2: 1.0, 1: 5.0}) == 4.0
    assert jf({1: 7.0, 2: 1.0}) == 6.0
    assert comp.calls == 1


class _ReprKey:
    """A dict key with a Python __repr__ (runs while the error message is built)."""

    def __repr__(self):
        return "K()"

    def __lt__(self, other):
        return id(self) < id(other)


@pytest.mark.parametrize(
    "arg, where",
    [
        ({1: 1.0, "a": 2.0}, "'d' (positional argument 0)"),
        ({"k": {1: 1.0, "a": 2.0}}, "'d['k']' (positional argument 0)"),
        ({_ReprKey(): {1: 1.0, "a": 2.0}}, "'d[K()]' (positional argument 0)"),
    ],
)
def test_dict_keys_that_cannot_be_sorted(arg, where):
    jf, comp = make(lambda d: d)
    with pytest.raises(TypeError) as info:
        jf(arg)
    assert str(info.value) == (
        f"the keys of a dict argument {where} cannot be sorted; dict keys of a jitted "
        "function's arguments must be mutually comparable (e.g. all str)"
    )
    cause = info.value.__cause__
    assert type(cause) is TypeError
    assert str(cause) == "'<' not supported between instances of 'str' and 'int'"
    assert comp.calls == 0


def test_non_contiguous_array_same_signature_as_contiguous():
    jf, comp = make(lambda x: float(x.sum()))
    assert jf(np.ones((3, 4))[:, ::2]) == 6.0
    assert jf(np.ones((3, 2))) == 6.0
    assert jf(np.asfortranarray(np.ones((3, 2)))) == 6.0
    assert comp.calls == 1


def test_static_argnames_through_var_kwargs():
    def f(x, **kw):
        return x * len(kw["mode"])

    jf, comp = make(f, static_argnames="mode")
    assert jf(1.0, mode="abc") == 3.0
    assert jf(2.0, mode="abc") == 6.0
    assert jf(2.0, mode="ab") == 4.0
    assert comp.calls == 2


def test_static_argument_with_default_not_passed():
    jf, comp = make(lambda x, n=2: x * n, static_argnums=1)
    assert jf(1.0) == 2.0
    assert jf(3.0) == 6.0
    assert comp.calls == 1
    assert jf(1.0, 3) == 3.0
    assert comp.calls == 2


def test_static_and_dynamic_keywords_in_any_order():
    def f(x, *, a, b):
        return x * a + len(b)

    jf, comp = make(f, static_argnames="b")
    assert jf(1.0, b="ss", a=2.0) == 4.0
    assert jf(1.0, a=3.0, b="ss") == 5.0
    assert comp.calls == 1
    assert jf(1.0, a=3.0, b="sss") == 6.0
    assert comp.calls == 2


def test_static_eq_not_implemented_means_not_equal():
    class NoEq:
        def __hash__(self):
            return 5

        def __eq__(self, other):
            return NotImplemented

    jf, comp = make(lambda x, k: k, static_argnums=1)
    a, b = NoEq(), NoEq()
    assert jf(1.0, a) is a
    assert jf(1.0, b) is b  # falls back to identity: a different signature
    assert jf(2.0, a) is a
    assert comp.calls == 2


def test_static_hash_collision_but_unequal():
    class Collide:
        def __init__(self, v):
            self.v = v

        def __hash__(self):
            return 1

        def __eq__(self, other):
            return isinstance(other, Collide) and self.v == other.v

    jf, comp = make(lambda x, k: x + k.v, static_argnums=1)
    for v in range(10):
        assert jf(1.0, Collide(v)) == 1.0 + v
    for v in range(10):
        assert jf(2.0, Collide(v)) == 2.0 + v
    assert comp.calls == 10
    assert jf.cache_info().size == 10


def test_deeply_nested_argument_is_not_a_crash():
    # A RecursionError before any compile, never a crash. 100_000 levels is
    # past every CPython's limit: the recursion limit (3.11), the C recursion
    # limit (3.12, 3.13) and, from 3.14 on, the C stack (8 MB by default;
    # flattening 100_000 levels needs more than 16 MB, measured on 3.11).
    t = 1.0
    for _ in range(100_000):
        t = [t]
    jf, comp = make(lambda x: 0)
    with pytest.raises(RecursionError) as info:
        jf(t)
    assert type(info.value) is RecursionError
    # "maximum recursion depth exceeded" before 3.14, "Stack overflow (used N kB)" from 3.14.
    assert re.fullmatch(
        r"(maximum recursion depth exceeded|Stack overflow \(used \d+ kB\))"
        r" while flattening the arguments of a jitted function",
        str(info.value),
    ), str(info.value)
    assert comp.calls == 0
    assert jf.cache_info().misses == 0


def test_equal_static_values_hit_through_both_lookup_paths():
    """A hit is decided without Python when the statics are identical or exact
    builtin values (int, float, str, bytes, tuples of them), and through
    __eq__ otherwise: distinct-but-equal objects of every kind hit, unequal
    ones miss, and hits are counted on both paths."""
    comp = CountingCompiler()
    jf = ftjit.jit(lambda x, s: x, static_argnums=1, compiler=comp, cache=ftjit.FunctionCache())

    class Box:
        def __init__(self, v):
            self.v = v

        def __eq__(self, other):
            return isinstance(other, Box) and self.v == other.v

        def __hash__(self):
            return hash(self.v)

    def fresh(kind):
        # A new object equal to the last one of its kind (never the same object).
        return {
            "int": int("12345678901234567890"),
            "float": float("2.5"),
            "str": "".join(["ab", "cd"]),
            "bytes": bytes([1, 2, 3]),
            "tuple": (int("300"), "".join(["x", "y"]), (float("1.5"),)),
            "mixed_tuple": tuple([1, 2.0]),
            "box": Box(7),
        }[kind]

    kinds = ["int", "float", "str", "bytes", "tuple", "mixed_tuple", "box"]
    for kind in kinds:
        assert fresh(kind) is not fresh(kind)
        for _ in range(3):
            assert jf(1.0, fresh(kind)) == 1.0
    assert comp.calls == len(kinds)
    info = jf.cache_info()
    assert (info.misses, info.hits) == (len(kinds), 2 * len(kinds))
    # Equal under == across types inside a tuple: one signature, as before.
    assert jf(1.0, (1.0, 2)) == 1.0
    assert comp.calls == len(kinds)
    # Unequal values of the same kinds miss.
    for other in (int("12345678901234567891"), 2.25, "abce", b"\x01\x02", (300, "xz", (1.5,)), Box(8)):
        jf(1.0, other)
    assert comp.calls == len(kinds) + 6
    # 1, True and 1.0 stay three signatures on the Python-free path too.
    before = comp.calls
    for s in (1, True, 1.0, 1, True, 1.0):
        jf(1.0, s)
    assert comp.calls == before + 3


# --- aval types: properties read through their getter directly -------------


class _Aval:
    def __init__(self, dtype, shape, weak_type=False):
        self.dtype = np.dtype(dtype)
        self.shape = shape
        self.weak_type = weak_type


class _AvalCompiler(CountingCompiler):
    """A compiler whose array type's dtype/shape come from ``.aval`` (as jax
    Arrays do) and whose ``placed`` attribute is its committed flag; with
    ``in_place``, it says the aval getter returns a field (aval_fields)."""

    def __init__(self, array_type, in_place=False):
        super().__init__()
        self.aval_types = (array_type,)
        self.aval_fields = (array_type,) if in_place else ()
        self.context_hooks = ftjit.ContextHooks(committed_types=(array_type,), committed_attr="placed",
                                                sharding_attr="where")

    def hooks(self, fun):
        return ftjit.CompilerHooks(context=self.context_hooks, aval_types=self.aval_types,
                                   aval_fields=self.aval_fields)


def _make_aval_array_type():
    class AvalArray:
        def __init__(self, aval, placed=False, where=None):
            self._aval, self._placed, self._where = aval, placed, where

        @property
        def aval(self):
            return self._aval

        @property
        def placed(self):
            return self._placed

        @property
        def where(self):
            return self._where

    return AvalArray


def _aval_jit(array_type=None, in_place=False):
    """(array type, its counting compiler, an identity function jitted with it)."""
    array_type = array_type or _make_aval_array_type()
    comp = _AvalCompiler(array_type, in_place)
    return array_type, comp, ftjit.jit(lambda x: x, compiler=comp, cache=ftjit.FunctionCache())


def _short_signatures(jf, with_hits=False):
    rows = [(s.signature.split(".<locals>.")[-1], s.hits) for s in jf.signatures()]
    return sorted(rows if with_hits else [sig for sig, _ in rows])


def test_aval_type_signature_reads_aval_and_placement():
    AvalArray, comp, jf = _aval_jit()
    f32 = AvalArray(_Aval(np.float32, (4,)))
    jf(f32)
    jf(AvalArray(_Aval(np.float32, (4,))))
    assert comp.calls == 1
    jf(AvalArray(_Aval(np.int32, (4,))))
    jf(AvalArray(_Aval(np.float32, (4,), weak_type=True)))
    jf(AvalArray(_Aval(np.float32, (4,)), placed=True, where="dev0"))
    jf(AvalArray(_Aval(np.float32, (4,)), placed=True, where="dev0"))
    jf(AvalArray(_Aval(np.float32, (4,)), placed=True, where="dev1"))
    assert comp.calls == 5
    assert _short_signatures(jf, with_hits=True) == sorted([
        ("<lambda>(float32[4])", 1), ("<lambda>(int32[4])", 0), ("<lambda>(float32[4]{weak})", 0),
        ("<lambda>(float32[4]@dev0)", 1), ("<lambda>(float32[4]@dev1)", 0)])


def test_aval_type_patched_after_jit_is_read_through_the_new_attribute():
    # The core calls the property getters directly while the type is
    # unmodified; patching the class (this test's own) afterwards must be
    # seen on the next call.
    AvalArray, comp, jf = _aval_jit()
    x = AvalArray(_Aval(np.float32, (4,)))
    jf(x)
    AvalArray.aval = property(lambda self: _Aval(np.int8, (2, 2)))
    jf(x)
    AvalArray.placed = property(lambda self: True)
    AvalArray.where = property(lambda self: "patched")
    jf(x)
    assert comp.calls == 3
    assert _short_signatures(jf) == sorted([
        "<lambda>(float32[4])", "<lambda>(int8[2,2])", "<lambda>(int8[2,2]@patched)"])


def test_aval_type_with_custom_getattribute_takes_the_generic_lookup():
    AvalArray = _make_aval_array_type()

    class Logged(AvalArray):
        seen = []

        def __getattribute__(self, name):
            if name in ("aval", "placed"):
                type(self).seen.append(name)
            return super().__getattribute__(name)

    _, comp, jf = _aval_jit(Logged)
    jf(Logged(_Aval(np.float32, (3,))))
    jf(Logged(_Aval(np.float32, (3,))))
    assert comp.calls == 1
    assert Logged.seen == ["aval", "placed"] * 2


# The aval getter of an aval type is learned as a stored field: once 8
# getter calls (StoredField::kSightings) found their result in one word of
# the instance, and in no other, the core reads that word instead of calling.


def _slotted_aval_type(getter):
    calls = []  # not a class attribute: setting one would change the type (its version tag)

    class SlottedArray:
        __slots__ = ("_aval", "_other", "placed", "where")

        def __init__(self, aval, other=None):
            self._aval, self._other, self.placed, self.where = aval, other, False, None

        @property
        def aval(self):
            calls.append(1)
            return getter(self)

    return SlottedArray, calls


def test_an_aval_held_in_one_slot_is_read_in_place_after_eight_getter_calls():
    Slotted, calls = _slotted_aval_type(lambda self: self._aval)
    _, comp, jf = _aval_jit(Slotted, in_place=True)
    shapes = [(n,) for n in range(1, 31)]
    arrays = [Slotted(_Aval(np.float32, s)) for s in shapes]
    for a in arrays[:7]:
        assert jf(a) is a
    assert jf._avals_read_in_place() == (False,)
    for a in arrays[7:]:
        assert jf(a) is a
    assert jf._avals_read_in_place() == (True,)
    # A GIL build reads the slot: the last 22 calls called no getter. A
    # free-threaded one only compares the slot with the avals the thread read
    # lately (another thread could free what it holds): each new aval is
    # still asked of the getter.
    assert len(calls) == (30 if FREE_THREADED else 8)
    assert comp.calls == 30
    assert _short_signatures(jf) == sorted(f"<lambda>(float32[{n}])" for n in range(1, 31))
    # An aval read lately is found by the slot alone, on either build.
    before = len(calls)
    for _ in range(10):
        assert jf(arrays[-1]) is arrays[-1]
    assert len(calls) == before
    # The slot is what the getter reads: a new value there is seen.
    arrays[0]._aval = _Aval(np.int8, (2, 2))
    jf(arrays[0])
    assert comp.calls == 31 and "<lambda>(int8[2,2])" in _short_signatures(jf)
    # An empty slot goes to the getter, whose AttributeError the call raises.
    empty = Slotted.__new__(Slotted)
    empty.placed, empty.where = False, None
    before = len(calls)
    with pytest.raises(AttributeError, match="_aval"):
        jf(empty)
    assert len(calls) == before + 1


def test_an_aval_slot_set_by_another_thread_while_calls_read_it():
    # The read in place must never use an aval the setter just dropped: on a
    # free-threaded build the slot is only compared with the thread's memo,
    # on a GIL build read under the GIL. Both avals' signatures, nothing else.
    Slotted, _ = _slotted_aval_type(lambda self: self._aval)
    _, comp, jf = _aval_jit(Slotted, in_place=True)
    for n in range(1, 10):
        jf(Slotted(_Aval(np.float32, (n,))))
    assert jf._avals_read_in_place() == (True,)
    a = Slotted(_Aval(np.float32, (3,)))
    deadline = time.monotonic() + 1.0

    def work(t):
        n = 0
        while time.monotonic() < deadline:
            if t == 0:
                a._aval = _Aval(np.float32, (3,)) if n % 2 else _Aval(np.int32, (3,))
            else:
                assert jf(a) is a
            n += 1
        return n

    setter_sets, calls = run_threads(2, work, timeout=30)
    assert setter_sets > 0 and calls > 0
    assert set(_short_signatures(jf)) >= {"<lambda>(float32[3])"}
    assert set(_short_signatures(jf)) <= {f"<lambda>(float32[{n}])" for n in range(1, 10)} | {"<lambda>(int32[3])"}


def test_a_getter_the_compiler_does_not_vouch_for_is_never_read_in_place():
    # A memoising getter: eight calls would find its result in one slot, and
    # a fresh instance's slot is still empty. Only aval_fields opts in.
    def memoised(self):
        if self._other is None:
            self._other = self._aval
        return self._other

    Slotted, calls = _slotted_aval_type(memoised)
    _, comp, jf = _aval_jit(Slotted)
    for n in range(1, 21):
        a = Slotted(_Aval(np.float32, (n,)))
        assert jf(a) is a
    assert jf._avals_read_in_place() == (False,)
    assert (len(calls), comp.calls) == (20, 20)


@pytest.mark.parametrize("how", ["computed", "held twice"])
def test_an_aval_not_held_in_exactly_one_slot_is_always_asked_of_the_getter(how):
    if how == "computed":
        Slotted, calls = _slotted_aval_type(lambda self: _Aval(self._aval.dtype, self._aval.shape))
    else:
        Slotted, calls = _slotted_aval_type(lambda self: self._aval)
    _, comp, jf = _aval_jit(Slotted, in_place=True)
    for n in range(1, 21):
        aval = _Aval(np.float32, (n,))
        a = Slotted(aval, other=aval if how == "held twice" else None)
        assert jf(a) is a
    assert len(calls) == 20
    assert comp.calls == 20
    assert jf._avals_read_in_place() == (False,)


def test_threads_learning_one_aval_slot_at_once_keep_every_signature_exact():
    Slotted, calls = _slotted_aval_type(lambda self: self._aval)
    _, comp, jf = _aval_jit(Slotted, in_place=True)
    n_threads, per_thread = 8, 40

    def work(t):
        for i in range(per_thread):
            a = Slotted(_Aval(np.float32, (i % 10 + 1, t + 1)))
            assert jf(a) is a

    run_threads(n_threads, work, timeout=60)
    assert comp.calls == n_threads * 10
    assert _short_signatures(jf) == sorted(f"<lambda>(float32[{i},{t}])" for i in range(1, 11)
                                           for t in range(1, n_threads + 1))
    info = jf.cache_info()
    assert (info.hits, info.misses) == (n_threads * (per_thread - 10), n_threads * 10)
    assert jf._avals_read_in_place() == (True,)
    assert len(calls) >= 8  # one getter call per sighting (threads mid-sighting may add any number)


def test_more_dtypes_than_the_intern_table_holds():
    # The core interns up to 256 dtype objects process-wide (pinned, no
    # reference counting on the hot path); past that, dtypes are owned
    # references. Both kinds must key, compare and stay alive correctly.
    AvalArray = _make_aval_array_type()
    comp = _AvalCompiler(AvalArray)
    jf = ftjit.jit(lambda x: x, compiler=comp, cache=ftjit.FunctionCache(capacity=1000))  # no eviction
    dtypes = [np.dtype([(f"f{i}", np.float32)]) for i in range(300)]
    arrays = [AvalArray(_Aval(d, (2,))) for d in dtypes]
    for a in arrays:
        assert jf(a) is a
    del dtypes
    for a in arrays:
        assert jf(a) is a
    assert comp.calls == 300
    info = jf.cache_info()
    assert (info.hits, info.misses) == (300, 300)


def test_more_contexts_than_the_intern_table_holds():
    # Contexts are interned process-wide up to 256; later ones are owned
    # references. Either way equal contexts hit and distinct ones compile.
    state = {"ctx": None}

    class CtxCompiler(CountingCompiler):
        def hooks(self, fun):
            return ftjit.CompilerHooks(context=ftjit.ContextHooks(context=lambda: state["ctx"]))

    comp = CtxCompiler()
    jf = ftjit.jit(lambda x: x + 1, compiler=comp, cache=ftjit.FunctionCache(capacity=1000))
    for round_ in range(2):
        for i in range(300):
            state["ctx"] = ("test-context", i, object.__name__ * (i % 3))  # fresh equal tuples
            assert jf(1.0) == 2.0
    assert comp.calls == 300
    info = jf.cache_info()
    assert (info.hits, info.misses) == (300, 300)


@pytest.mark.parametrize("hook", ["context", "ContextHooks"])
def test_unhashable_context_is_a_typeerror_naming_the_context(hook):
    """A compiler's context is part of every signature: an unhashable one is a
    TypeError that says so (the hash's own error as its cause), not cached."""

    class ListContext(CountingCompiler):
        pass

    if hook == "context":
        ListContext.context = lambda self: ["mode", 1]
    else:
        ListContext.hooks = lambda self, fun: ftjit.CompilerHooks(
            context=ftjit.ContextHooks(context=lambda: ["mode", 1]))
    comp = ListContext()
    jf = ftjit.jit(lambda x: x + 1, compiler=comp, cache=ftjit.FunctionCache())
    for _ in range(2):
        with pytest.raises(TypeError, match=r"^the compiler's context\(\) returned an unhashable value; it is part "
                                            r"of every call's signature, so it must be hashable \(e\.g\. a tuple "
                                            r"instead of a list\)$") as info:
            jf(1.0)
        assert isinstance(info.value.__cause__, TypeError)
        assert "unhashable type: 'list'" in str(info.value.__cause__)
    assert comp.calls == 0 and jf.cache_info().misses == 0


@pytest.mark.parametrize("attr", ["plain_types", "aval_types"])
def test_the_core_keeps_its_own_copy_of_a_compilers_type_lists(attr):
    """The core borrows type pointers from a compiler's plain_types and
    aval_types: it owns a tuple copy, so that a list the compiler mutates
    afterwards cannot leave it a pointer to a type that died."""
    if attr == "aval_types":
        ArrayType = _make_aval_array_type()
        comp = _AvalCompiler(ArrayType)
        make = lambda t: t(_Aval(np.float32, (4,)))  # noqa: E731
    else:
        class ArrayType:
            dtype = np.dtype(np.float32)
            shape = (4,)

        comp = CountingCompiler()
        make = lambda t: t()  # noqa: E731
    types = [ArrayType]
    given = ftjit.CompilerHooks(**{attr: types})
    comp.hooks = lambda fun: given
    jf = ftjit.jit(lambda x: x, compiler=comp, cache=ftjit.FunctionCache())
    ref = weakref.ref(ArrayType)
    types.clear()
    del ArrayType
    gc.collect()
    assert ref() is not None, "the jitted function's copy must keep the type alive"
    x = make(ref())
    assert jf(x) is x and jf(x) is x
    assert comp.calls == 1
    assert _short_signatures(jf) == ["<lambda>(float32[4])"]


def test_hot_path_comparison_of_statics_cannot_fail_at_the_recursion_limit():
    """The hit path compares static ints under a lock, where nothing may
    fail or leave an error set: at the recursion limit too (where
    PyObject_RichCompareBool raises RecursionError)."""
    big, same = 10**30, int("1" + "0" * 30)
    assert big == same and big is not same
    probe = ftjit._core._debug_fast_equals_at_recursion_limit
    assert probe(big, same) == ("equal", False)
    assert probe(big, same + 1) == ("not equal", False)
    assert probe("a" * 40, "".join(["a"] * 40)) == ("equal", False)
    assert probe((1, big), (1, same)) == ("equal", False)
