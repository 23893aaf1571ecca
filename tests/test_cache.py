"""FunctionCache: capacity, sharing, the LRU bound, clearing, and entries
leaving the cache when their function dies."""

import functools
import gc
import weakref

import numpy as np
import pytest

import ftjit
from helpers import CountingCompiler, gc_collect_until, run_threads, wait_for, weak_executable


class ExeCompiler(CountingCompiler):
    """A CountingCompiler that keeps weak references to its executables."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.exe_refs = []

    def _executable(self, fun):
        exe = super()._executable(fun)
        self.exe_refs.append(weakref.ref(exe))
        return exe


# --------------------------------------------------------------------------
# FunctionCache basics


def test_default_capacity():
    cache = ftjit.FunctionCache()
    assert cache.capacity() == 4096
    assert cache.size() == 0


@pytest.mark.parametrize("capacity", [1, 2, 100, 10**6])
def test_capacity_argument(capacity):
    assert ftjit.FunctionCache(capacity).capacity() == capacity
    assert ftjit.FunctionCache(capacity=capacity).capacity() == capacity


@pytest.mark.parametrize("capacity", [0, -1, -4096, -(10**30)])
def test_capacity_below_one_is_value_error(capacity):
    message = f"^FunctionCache capacity must be at least 1, got {capacity}$"
    with pytest.raises(ValueError, match=message):
        ftjit.FunctionCache(capacity)
    with pytest.raises(ValueError, match=message):
        ftjit.FunctionCache(capacity=capacity)


@pytest.mark.parametrize("capacity, type_name", [(True, "bool"), (1.5, "float"), ("8", "str"), (None, "NoneType")])
def test_capacity_of_another_type_is_type_error(capacity, type_name):
    with pytest.raises(TypeError, match=f"^FunctionCache capacity must be an int, got {type_name}$"):
        ftjit.FunctionCache(capacity)


def test_capacity_accepts_numpy_integers_and_huge_ints():
    assert ftjit.FunctionCache(np.int64(3)).capacity() == 3
    assert ftjit.FunctionCache(10**30).capacity() == 2**63 - 1


def test_size_counts_entries_of_all_functions():
    cache = ftjit.FunctionCache()
    comp = CountingCompiler()
    f = ftjit.jit(lambda x: x + 1, compiler=comp, cache=cache)
    g = ftjit.jit(lambda x: x + 2, compiler=comp, cache=cache)
    assert f(1.0) == 2.0
    assert f(np.ones(2))[0] == 2.0
    assert g(1.0) == 3.0
    assert cache.size() == 3
    assert f.cache_info().size == 2
    assert g.cache_info().size == 1
    assert comp.calls == 3


def test_function_cache_clear_empties_it():
    cache = ftjit.FunctionCache()
    comp = CountingCompiler()
    f = ftjit.jit(lambda x: x + 1, compiler=comp, cache=cache)
    g = ftjit.jit(lambda x: x + 2, compiler=comp, cache=cache)
    f(1.0), g(1.0), g(1)
    assert cache.size() == 3
    cache.clear()
    assert cache.size() == 0
    assert f.cache_info().size == 0 and g.cache_info().size == 0
    assert f(1.0) == 2.0 and g(1.0) == 3.0
    assert comp.calls == 5
    assert cache.size() == 2


def test_function_cache_clear_only_affects_that_cache():
    c1, c2 = ftjit.FunctionCache(), ftjit.FunctionCache()
    comp = CountingCompiler()
    f = ftjit.jit(lambda x: x + 1, compiler=comp, cache=c1)
    g = ftjit.jit(lambda x: x + 2, compiler=comp, cache=c2)
    f(1.0), g(1.0)
    c1.clear()
    assert (c1.size(), c2.size()) == (0, 1)
    assert g(5.0) == 7.0
    assert comp.calls == 2


# --------------------------------------------------------------------------
# Sharing


def test_two_wrappers_share_entries():
    cache = ftjit.FunctionCache()
    comp = CountingCompiler()

    def f(x, n):
        return x * n

    jf1 = ftjit.jit(f, static_argnums=1, compiler=comp, cache=cache)
    jf2 = ftjit.jit(f, static_argnums=1, compiler=comp, cache=cache)
    assert jf1(2.0, 3) == 6.0
    assert comp.calls == 1
    assert jf2(4.0, 3) == 12.0  # the second wrapper's first call is a hit
    assert comp.calls == 1
    assert jf2.cache_info().hits == 1
    assert cache.size() == 1


def test_wrappers_with_different_options_do_not_share():
    cache = ftjit.FunctionCache()
    c1, c2 = CountingCompiler(), CountingCompiler()

    def f(x, n):
        return x * n

    a = ftjit.jit(f, compiler=c1, cache=cache)
    b = ftjit.jit(f, compiler=c2, cache=cache)  # another compiler
    c = ftjit.jit(f, static_argnums=1, compiler=c1, cache=cache)  # other statics
    assert a(2.0, 3.0) == 6.0
    assert b(2.0, 3.0) == 6.0
    assert (c1.calls, c2.calls) == (1, 1)
    assert c(2.0, 3) == 6.0
    assert (c1.calls, c2.calls) == (2, 1)


def test_wrappers_with_different_caches_do_not_share():
    comp = CountingCompiler()

    def f(x):
        return x

    a = ftjit.jit(f, compiler=comp, cache=ftjit.FunctionCache())
    b = ftjit.jit(f, compiler=comp, cache=ftjit.FunctionCache())
    a(1.0), b(1.0)
    assert comp.calls == 2


def test_default_cache_shared_by_wrappers():
    comp = CountingCompiler()

    def f(x):
        return x + 1

    a = ftjit.jit(f, compiler=comp)
    b = ftjit.jit(f, compiler=comp, cache=None)
    assert a(1.0) == 2.0
    assert b(2.0) == 3.0
    assert comp.calls == 1
    assert b.cache_info().hits == 1


def test_entries_survive_wrapper_death_while_function_lives():
    # Entries belong to the function: a later wrapper with the same options
    # and cache finds them.
    cache = ftjit.FunctionCache()
    comp = CountingCompiler()

    def f(x):
        return x * 5

    jf = ftjit.jit(f, compiler=comp, cache=cache)
    assert jf(1.0) == 5.0
    r = weakref.ref(jf)
    del jf
    assert gc_collect_until(lambda: r() is None)
    assert cache.size() == 1
    assert ftjit.jit(f, compiler=comp, cache=cache)(2.0) == 10.0
    assert comp.calls == 1


# --------------------------------------------------------------------------
# LRU


def test_lru_capacity_two_three_signatures():
    cache = ftjit.FunctionCache(capacity=2)
    comp = CountingCompiler()
    jf = ftjit.jit(lambda x, k: x + k, static_argnums=1, compiler=comp, cache=cache)
    assert jf(1.0, 1) == 2.0
    assert jf(1.0, 2) == 3.0
    assert jf(1.0, 3) == 4.0
    assert comp.calls == 3
    assert cache.size() <= 2
    assert cache.size() == 2
    info = jf.cache_info()
    assert info.evictions == 1
    assert info.size == 2
    # Signature 1 was the least recently used: it compiles again.
    assert jf(5.0, 1) == 6.0
    assert comp.calls == 4
    assert cache.size() == 2
    assert jf.cache_info().evictions == 2


def test_lru_capacity_one():
    cache = ftjit.FunctionCache(capacity=1)
    comp = CountingCompiler()
    jf = ftjit.jit(lambda x: x * 2, compiler=comp, cache=cache)
    for i in range(3):
        assert jf(1.0) == 2.0
        assert jf(1) == 2
        assert cache.size() == 1
    assert comp.calls == 6
    info = jf.cache_info()
    assert info.evictions == 5
    assert info.size == 1
    assert jf(7) == 14  # the resident one is a hit
    assert comp.calls == 6


def test_lru_bound_shared_across_functions():
    cache = ftjit.FunctionCache(capacity=3)
    comp = CountingCompiler()
    f = ftjit.jit(lambda x, k: x + k, static_argnums=1, compiler=comp, cache=cache)
    g = ftjit.jit(lambda x, k: x - k, static_argnums=1, compiler=comp, cache=cache)
    for k in range(3):
        assert f(10.0, k) == 10.0 + k
    for k in range(3):
        assert g(10.0, k) == 10.0 - k
    assert cache.size() == 3
    fi, gi = f.cache_info(), g.cache_info()
    assert fi.evictions + gi.evictions == 3
    assert fi.size + gi.size == 3
    assert fi.evictions == 3 and fi.size == 0  # f's entries were the oldest
    assert gi.evictions == 0 and gi.size == 3


def test_lru_many_signatures():
    cache = ftjit.FunctionCache(capacity=8)
    comp = CountingCompiler()
    jf = ftjit.jit(lambda x: x.shape, compiler=comp, cache=cache)
    for n in range(50):
        assert jf(np.zeros(n)) == (n,)
    assert cache.size() == 8
    info = jf.cache_info()
    assert (info.misses, info.compiles, info.evictions, info.size) == (50, 50, 42, 8)


def test_eviction_releases_executable():
    cache = ftjit.FunctionCache(capacity=1)
    comp = ExeCompiler()
    jf = ftjit.jit(lambda x: x, compiler=comp, cache=cache)
    jf(1.0)
    jf(1)  # evicts the float entry
    assert gc_collect_until(lambda: comp.exe_refs[0]() is None)
    assert comp.exe_refs[1]() is not None


def test_eviction_while_compiling_other_signature():
    # Capacity 1 and two signatures compiling at once (each compile is held
    # until the other caller of each signature waits on it, so both are in
    # progress together, pinned over capacity): both succeed, nobody compiles
    # twice, and the bound is restored afterwards by one eviction.
    cache = ftjit.FunctionCache(capacity=1)

    def hook(fun, args, kwargs):
        if not wait_for(lambda: jf.cache_info().waits >= 2, 30):
            raise AssertionError(f"only {jf.cache_info().waits} of 2 callers waited")

    comp = CountingCompiler(on_compile=hook)
    jf = ftjit.jit(lambda x, k: x + k, static_argnums=1, compiler=comp, cache=cache)
    assert run_threads(4, lambda i: jf(1.0, i % 2)) == [1.0, 2.0, 1.0, 2.0]
    assert comp.calls == 2
    info = jf.cache_info()
    assert cache.size() == info.size == 1
    assert (info.misses, info.compiles, info.waits, info.hits, info.evictions) == (2, 2, 2, 0, 1)


# --------------------------------------------------------------------------
# clear_cache / clear_caches


def test_clear_cache_recompiles():
    cache = ftjit.FunctionCache()
    comp = CountingCompiler()
    jf = ftjit.jit(lambda x: x + 1, compiler=comp, cache=cache)
    assert jf(1.0) == 2.0
    jf.clear_cache()
    assert jf.cache_info().size == 0
    assert cache.size() == 0
    assert jf(1.0) == 2.0
    assert comp.calls == 2
    assert jf(2.0) == 3.0
    assert comp.calls == 2


def test_clear_cache_only_that_function():
    cache = ftjit.FunctionCache()
    comp = CountingCompiler()
    f = ftjit.jit(lambda x: x + 1, compiler=comp, cache=cache)
    g = ftjit.jit(lambda x: x + 2, compiler=comp, cache=cache)
    f(1.0), g(1.0)
    f.clear_cache()
    assert (f.cache_info().size, g.cache_info().size, cache.size()) == (0, 1, 1)
    assert g(3.0) == 5.0
    assert comp.calls == 2


def test_clear_cache_releases_executables():
    comp = ExeCompiler()
    jf = ftjit.jit(lambda x: x, compiler=comp, cache=ftjit.FunctionCache())
    jf(1.0)
    assert comp.exe_refs[0]() is not None
    jf.clear_cache()
    assert gc_collect_until(lambda: comp.exe_refs[0]() is None)


def test_clear_cache_on_empty_is_fine():
    jf = ftjit.jit(lambda x: x, compiler=CountingCompiler(), cache=ftjit.FunctionCache())
    jf.clear_cache()
    jf.clear_cache()
    assert jf.cache_info().size == 0


@pytest.mark.thread_unsafe(reason="clear_caches() clears every function in the process")
def test_clear_caches_clears_every_live_function():
    comp = CountingCompiler()
    c1, c2 = ftjit.FunctionCache(), ftjit.FunctionCache()
    f = ftjit.jit(lambda x: x + 1, compiler=comp, cache=c1)
    g = ftjit.jit(lambda x: x + 2, compiler=comp, cache=c2)
    h = ftjit.jit(lambda x: x + 3, compiler=comp)  # the default cache
    assert (f(1.0), g(1.0), h(1.0)) == (2.0, 3.0, 4.0)
    assert comp.calls == 3
    ftjit.clear_caches()
    assert (c1.size(), c2.size()) == (0, 0)
    assert (f.cache_info().size, g.cache_info().size, h.cache_info().size) == (0, 0, 0)
    assert (f(1.0), g(1.0), h(1.0)) == (2.0, 3.0, 4.0)
    assert comp.calls == 6


# --------------------------------------------------------------------------
# Function death


def _populate(cache, comp, n_sigs=3):
    """Create a jitted function with n_sigs entries; return weakrefs only."""

    def f(x, k):
        return x + k

    jf = ftjit.jit(f, static_argnums=1, compiler=comp, cache=cache)
    for k in range(n_sigs):
        assert jf(1.0, k) == 1.0 + k
    return weakref.ref(f), weakref.ref(jf), jf


def test_function_death_removes_its_entries():
    cache = ftjit.FunctionCache()
    comp = CountingCompiler()
    fun_ref, jf_ref, jf = _populate(cache, comp, 3)
    assert cache.size() == 3
    del jf
    assert gc_collect_until(lambda: fun_ref() is None), "the cache keeps the function alive"
    assert jf_ref() is None
    assert gc_collect_until(lambda: cache.size() == 0), cache.size()


def test_function_death_leaves_other_functions_entries():
    cache = ftjit.FunctionCache()
    comp = CountingCompiler()
    fun_ref, _, jf = _populate(cache, comp, 3)
    other = ftjit.jit(lambda x: x * 2, compiler=comp, cache=cache)
    assert other(1.0) == 2.0 and other(1) == 2
    assert cache.size() == 5
    del jf
    assert gc_collect_until(lambda: fun_ref() is None)
    assert gc_collect_until(lambda: cache.size() == 2), cache.size()
    assert other(3.0) == 6.0
    assert comp.calls == 5
    assert other.cache_info().size == 2


def test_function_death_in_cycle_removes_entries():
    cache = ftjit.FunctionCache()
    comp = CountingCompiler()

    def make():
        def f(x):
            return x + 1

        jf = ftjit.jit(f, compiler=comp, cache=cache)
        jf(1.0), jf(1), jf(np.ones(2))
        f.jf = jf  # f -> jf -> f
        return weakref.ref(f)

    fun_ref = make()
    assert cache.size() == 3
    assert gc_collect_until(lambda: fun_ref() is None)
    assert gc_collect_until(lambda: cache.size() == 0), cache.size()


def test_function_death_releases_executables_and_static_args():
    cache = ftjit.FunctionCache()
    comp = ExeCompiler()

    class Static:
        pass

    def make():
        def f(x, s):
            return x

        jf = ftjit.jit(f, static_argnums=1, compiler=comp, cache=cache)
        s = Static()
        assert jf(1.0, s) == 1.0
        return weakref.ref(f), weakref.ref(s), jf

    fun_ref, static_ref, jf = make()
    assert static_ref() is not None  # kept by the cache key
    assert comp.exe_refs[0]() is not None  # kept by the cache
    del jf
    assert gc_collect_until(lambda: fun_ref() is None)
    assert gc_collect_until(lambda: static_ref() is None)
    assert gc_collect_until(lambda: comp.exe_refs[0]() is None)
    assert cache.size() == 0


def test_many_functions_die():
    cache = ftjit.FunctionCache()
    comp = CountingCompiler()
    refs = []
    for _ in range(20):
        fun_ref, _, jf = _populate(cache, comp, 2)
        refs.append(fun_ref)
        del jf
    assert gc_collect_until(lambda: all(r() is None for r in refs))
    assert gc_collect_until(lambda: cache.size() == 0), cache.size()
    assert comp.calls == 40


def test_cache_dies_with_its_functions():
    comp = CountingCompiler()
    cache = ftjit.FunctionCache()
    fun_ref, _, jf = _populate(cache, comp, 2)
    cache_ref = weakref.ref(cache) if _weakrefable(cache) else None
    del cache
    # The function keeps its cache usable.
    assert jf(1.0, 0) == 1.0
    assert jf(1.0, 9) == 10.0
    del jf
    assert gc_collect_until(lambda: fun_ref() is None)
    if cache_ref is not None:
        assert gc_collect_until(lambda: cache_ref() is None)


def test_cache_object_death_frees_executables_while_the_function_lives():
    # The cache's map holds the function's entries, which hold the cache's
    # core: dropping the cache object and its wrappers must free the
    # executables even though the function itself lives on.
    comp = ExeCompiler()

    def f(x):
        return x

    for _ in range(3):
        cache = ftjit.FunctionCache(8)
        jf = ftjit.jit(f, compiler=comp, cache=cache)
        assert jf(1.0) == 1.0
        del jf, cache
    assert comp.calls == 3
    assert gc_collect_until(lambda: all(r() is None for r in comp.exe_refs)), [
        r() is not None for r in comp.exe_refs
    ]


def test_cache_object_dropped_before_its_wrappers():
    # Wrappers keep their cache alive and usable; the executables of every
    # function in it go with the last wrapper, though the functions live on.
    comp = ExeCompiler()

    def f(x):
        return x

    def g(x):
        return x * 2

    cache = ftjit.FunctionCache(4)
    jf = ftjit.jit(f, compiler=comp, cache=cache)
    jg = ftjit.jit(g, compiler=comp, cache=cache)
    assert (jf(1.0), jg(1.0)) == (1.0, 2.0)
    cache_ref = weakref.ref(cache) if _weakrefable(cache) else None
    del cache
    assert (jf(2.0), jg(np.ones(2))[0]) == (2.0, 2.0)
    assert comp.calls == 3
    del jf
    # g's wrapper still holds the cache: f's entry stays for a new wrapper.
    assert jg._cache.size() == 3
    assert ftjit.jit(f, compiler=comp, cache=jg._cache)(3.0) == 3.0
    assert comp.calls == 3
    del jg
    assert gc_collect_until(lambda: all(r() is None for r in comp.exe_refs)), [
        r() is not None for r in comp.exe_refs
    ]
    if cache_ref is not None:
        assert gc_collect_until(lambda: cache_ref() is None)


def _weakrefable(obj):
    try:
        weakref.ref(obj)
        return True
    except TypeError:
        return False


# --------------------------------------------------------------------------
# Callables other than functions


class SlotsCallable:
    __slots__ = ()

    def __call__(self, x):
        return x * 7


def test_non_weakrefable_callable():
    fun = SlotsCallable()
    with pytest.raises(TypeError):
        weakref.ref(fun)
    comp = CountingCompiler()
    cache = ftjit.FunctionCache()
    jf = ftjit.jit(fun, compiler=comp, cache=cache)
    assert jf(1.0) == 7.0
    assert jf(2.0) == 14.0
    assert comp.calls == 1
    assert jf(np.ones(2))[1] == 7.0
    assert comp.calls == 2
    assert cache.size() == 2
    jf.clear_cache()
    assert jf(3.0) == 21.0
    assert comp.calls == 3


def test_non_weakrefable_callable_threads():
    comp = CountingCompiler(delay=0.05)
    jf = ftjit.jit(SlotsCallable(), compiler=comp, cache=ftjit.FunctionCache())
    assert run_threads(8, lambda i: jf(float(i))) == [7.0 * i for i in range(8)]
    assert comp.calls == 1


def test_callable_object_and_partial():
    class Adder:
        def __init__(self, k):
            self.k = k

        def __call__(self, x):
            return x + self.k

    comp = CountingCompiler()
    cache = ftjit.FunctionCache()
    a = ftjit.jit(Adder(3), compiler=comp, cache=cache)
    p = ftjit.jit(functools.partial(lambda k, x: x * k, 4), compiler=comp, cache=cache)
    assert a(1.0) == 4.0 and a(2.0) == 5.0
    assert p(1.0) == 4.0 and p(2.0) == 8.0
    assert comp.calls == 2


def test_bound_method_as_function():
    class A:
        def __init__(self, k):
            self.k = k

        def add(self, x):
            return x + self.k

    comp = CountingCompiler()
    jf = ftjit.jit(A(10.0).add, compiler=comp, cache=ftjit.FunctionCache())
    assert jf(1.0) == 11.0
    assert jf(2.0) == 12.0
    assert comp.calls == 1


def test_executable_holding_weak_ref_helper():
    # The helper used by the death tests does not keep the function alive.
    def f(x):
        return x

    exe = weak_executable(f)
    r = weakref.ref(f)
    assert exe(3) == 3
    del f
    gc.collect()
    assert r() is None


# --------------------------------------------------------------------------
# Counters


def test_cache_info_counters():
    comp = CountingCompiler()
    jf = ftjit.jit(lambda x: x, compiler=comp, cache=ftjit.FunctionCache())

    def counts():
        i = jf.cache_info()
        return (i.hits, i.misses, i.compiles, i.waits, i.evictions, i.size)

    assert counts() == (0, 0, 0, 0, 0, 0)
    jf(1.0)
    assert counts() == (0, 1, 1, 0, 0, 1)
    jf(2.0)
    assert counts() == (1, 1, 1, 0, 0, 1)
    jf(np.ones(3))
    assert counts() == (1, 2, 2, 0, 0, 2)
    jf(np.zeros(3))
    jf(3.0)
    assert counts() == (3, 2, 2, 0, 0, 2)


def test_cache_info_failed_compile_counts_miss_not_compile():
    comp = CountingCompiler(fail=ValueError("nope"))
    jf = ftjit.jit(lambda x: x, compiler=comp, cache=ftjit.FunctionCache())
    with pytest.raises(ValueError, match="^nope$"):
        jf(1.0)
    i = jf.cache_info()
    assert (i.misses, i.compiles, i.size) == (1, 0, 0)


def test_cache_info_executable_error_counts_hit():
    def f(x):
        raise KeyError("inside")

    comp = CountingCompiler()
    jf = ftjit.jit(f, compiler=comp, cache=ftjit.FunctionCache())
    for _ in range(3):
        with pytest.raises(KeyError):
            jf(1.0)
    i = jf.cache_info()
    assert (i.hits, i.misses, i.compiles, i.size) == (2, 1, 1, 1)
    assert comp.calls == 1


def test_disable_jit_bypasses_cache():
    comp = CountingCompiler()
    jf = ftjit.jit(lambda x: x * 2, compiler=comp, cache=ftjit.FunctionCache())
    with ftjit.disable_jit():
        assert jf(1.0) == 2.0
        assert jf("ab") == "abab"  # no signature, so no invalid-leaf error
    assert comp.calls == 0
    i = jf.cache_info()
    assert (i.hits, i.misses, i.size) == (0, 0, 0)
    assert jf(1.0) == 2.0
    assert comp.calls == 1


def test_disable_jit_restored_after_exception_and_nesting():
    comp = CountingCompiler()
    jf = ftjit.jit(lambda x: x * 2, compiler=comp, cache=ftjit.FunctionCache())
    with pytest.raises(ZeroDivisionError):
        with ftjit.disable_jit():
            1 / 0
    assert jf(1.0) == 2.0
    assert comp.calls == 1
    with ftjit.disable_jit():
        with ftjit.disable_jit():
            assert jf(np.ones(2))[0] == 2.0
        assert jf(np.ones(3))[0] == 2.0  # still disabled in the outer block
    assert comp.calls == 1
    assert jf(np.ones(3))[0] == 2.0
    assert comp.calls == 2


def test_gc_in_static_eq_while_other_function_dies_in_cycle():
    # The garbage collector runs the dying function's weakref callback (which
    # removes its entries from the same cache) in the middle of a lookup.
    cache = ftjit.FunctionCache()
    comp = CountingCompiler()
    dying_refs = []

    def make_garbage():
        def g(x, k):
            return x + k

        jg = ftjit.jit(g, static_argnums=1, compiler=comp, cache=cache)
        for k in range(4):
            jg(1.0, k)
        g.cycle = jg  # only the collector frees g and jg
        dying_refs.append(weakref.ref(g))

    class Collider:
        def __init__(self, v):
            self.v = v

        def __hash__(self):
            return 31

        def __eq__(self, other):
            if other is self:
                return True
            make_garbage()
            junk = [[] for _ in range(1000)]
            del junk
            gc.collect(0)  # the new garbage is young: collected (and called back) here
            return isinstance(other, Collider) and self.v == other.v

    jf = ftjit.jit(lambda x, c: x + c.v, static_argnums=1, compiler=comp, cache=cache)
    for v in range(6):
        assert jf(1.0, Collider(v)) == 1.0 + v
    for v in range(6):
        assert jf(2.0, Collider(v)) == 2.0 + v
    assert jf.cache_info().size == 6
    assert jf.cache_info().compiles == 6
    assert dying_refs
    assert gc_collect_until(lambda: all(r() is None for r in dying_refs))
    assert gc_collect_until(lambda: cache.size() == 6), cache.size()


def test_non_weakrefable_callable_entries_leave_the_shared_cache_with_the_wrapper():
    # A callable that cannot be weakly referenced gets a private entry map;
    # its entries still count in the shared LRU and must leave it when the
    # JitFunction holding that map dies.
    cache = ftjit.FunctionCache()
    comp = CountingCompiler()
    other = ftjit.jit(lambda x: x, compiler=comp, cache=cache)
    other(1.0)
    jf = ftjit.jit(SlotsCallable(), compiler=comp, cache=cache)
    assert jf(1.0) == 7.0
    assert jf(np.ones(2))[0] == 7.0
    assert cache.size() == 3
    del jf
    assert cache.size() == 1
    assert other.cache_info().size == 1


class _SlotsAdd:
    __slots__ = ()

    def __call__(self, x, k):
        return x + k.v


@pytest.mark.parametrize("callable_kind", ["function", "not_weakrefable"])
@pytest.mark.parametrize(
    "clear",
    [
        "clear_cache",
        "cache.clear",
        pytest.param(
            "clear_caches",
            marks=pytest.mark.thread_unsafe(reason="clear_caches() clears every function in the process"),
        ),
    ],
)
def test_clear_between_insert_and_lru_link_leaves_no_orphan(callable_kind, clear):
    # A miss inserts its entry in the function's map, then links it into the
    # shared LRU. Here a clear_cache() runs in between: the lookup's last
    # reference to an older signature (dropped right after the insert) owns
    # the only reference to a static argument whose __del__ clears the cache.
    # The LRU must not keep (and count) an entry that no map holds.
    cache = ftjit.FunctionCache()
    comp = CountingCompiler()
    cleared = []
    eq_calls = []

    class Key:
        def __init__(self, v, clear_on_del):
            self.v = v
            self.clear_on_del = clear_on_del

        def __hash__(self):
            return 17  # every Key collides: the lookup of B compares with A

        def __eq__(self, other):
            if other is self:
                return True
            if self.clear_on_del:
                eq_calls.append(other.v)
                # The first comparison is the lock-free probe; the second is
                # the insert's: clearing there leaves A's last reference with
                # the insert, which drops it just after inserting B.
                if len(eq_calls) == 2:
                    do_clear()
            return isinstance(other, Key) and self.v == other.v

        def __del__(self):
            if self.clear_on_del and not cleared:
                cleared.append(self.v)
                do_clear()  # runs after B's insert, before its LRU link

    def do_clear():
        if clear == "clear_cache":
            jf.clear_cache()
        elif clear == "cache.clear":
            cache.clear()
        else:
            ftjit.clear_caches()

    fun = (lambda x, k: x + k.v) if callable_kind == "function" else _SlotsAdd()
    jf = ftjit.jit(fun, static_argnums=1, compiler=comp, cache=cache)
    assert jf(1.0, Key(1, clear_on_del=True)) == 2.0
    assert jf(1.0, Key(2, clear_on_del=False)) == 3.0
    assert cleared == [1]
    assert eq_calls == [2, 2]
    assert comp.calls == 2
    # B's entry was removed from the map by the clear in A's __del__; the
    # shared LRU agrees.
    assert jf.cache_info().size == 0
    assert cache.size() == 0
    assert jf(1.0, Key(2, clear_on_del=False)) == 3.0
    assert comp.calls == 3
    assert jf.cache_info().size == cache.size() == 1


# --------------------------------------------------------------------------
# The compiler in the cache's key: held by value only when it compares by value


class _OwnsItsJit:
    """Jits its own method with its own bound-method compiler: the natural
    way to give a model its compile step."""

    def __init__(self, cache):
        self.compiles = 0
        self.fn = ftjit.jit(self.impl, compiler=self.compile, cache=cache)

    def impl(self, x):
        return x + 1

    def compile(self, fun, args, kwargs):
        self.compiles += 1
        return lambda x: x + 1  # an executable that does not hold the function (as JAX's do not)


@pytest.mark.parametrize("shared", [True, False], ids=["default_cache", "private_cache"])
def test_bound_method_compiler_of_the_owner_does_not_keep_it_alive(shared):
    cache = ftjit.default_cache() if shared else ftjit.FunctionCache()
    m = _OwnsItsJit(cache)
    assert m.fn(1.0) == 2.0 and m.fn(2.0) == 3.0 and m.compiles == 1
    r = weakref.ref(m)
    del m
    assert gc_collect_until(lambda: r() is None), "the cache kept the compiler (and its object) alive"


def test_compiler_referring_to_its_wrapper_does_not_keep_the_function_alive():
    def make():
        def f(x):
            return x * 2

        def comp(fun, args, kwargs):
            return lambda x: x * 2  # does not hold the function

        jf = ftjit.jit(f, compiler=comp, cache=ftjit.default_cache())
        comp.owner = jf  # compiler -> wrapper -> function
        assert jf(2.0) == 4.0
        return weakref.ref(f)

    r = make()
    assert gc_collect_until(lambda: r() is None), "the cache kept the compiler (and its function) alive"


def test_unhashable_compiler_referring_to_its_wrapper_is_freed():
    class Unhashable:
        __hash__ = None

        def __init__(self):
            self.calls = 0

        def __call__(self, fun, args, kwargs):
            self.calls += 1
            return lambda x: x  # does not hold the function

    def make():
        def f(x):
            return x

        comp = Unhashable()
        jf = ftjit.jit(f, compiler=comp)
        comp.owner = jf
        assert jf(1.0) == 1.0 and comp.calls == 1
        return weakref.ref(f)

    r = make()
    assert gc_collect_until(lambda: r() is None)


def test_bound_method_compilers_share_entries_while_their_object_lives():
    """Bound methods are equal when their object and function are: wrappers
    made one after another (the previous one gone) still share compiles."""
    cache = ftjit.FunctionCache()

    class Model:
        def __init__(self):
            self.compiles = 0

        def compile(self, fun, args, kwargs):
            self.compiles += 1
            return fun

    def f(x):
        return x + 1

    m, other = Model(), Model()
    for _ in range(3):
        jf = ftjit.jit(f, compiler=m.compile, cache=cache)  # a new bound method each time
        assert jf(1.0) == 2.0
        del jf
        gc.collect()
    assert m.compiles == 1
    assert ftjit.jit(f, compiler=other.compile, cache=cache)(1.0) == 2.0  # another object: not equal
    assert (m.compiles, other.compiles) == (1, 1)


def test_identity_compared_compiler_shares_entries_only_while_alive():
    """A compiler compared by identity (a plain function or instance) is
    shared by wrappers that hold it; a new one is a new key."""
    cache = ftjit.FunctionCache()

    def f(x):
        return x + 1

    class Compiler:  # compared by identity; its executables do not hold it
        def __init__(self):
            self.calls = 0

        def __call__(self, fun, args, kwargs):
            self.calls += 1
            return lambda x: x + 1

    comp = Compiler()
    a = ftjit.jit(f, compiler=comp, cache=cache)
    del a
    gc.collect()
    b = ftjit.jit(f, compiler=comp, cache=cache)  # the same, still alive: shares
    assert b(1.0) == 2.0
    c = ftjit.jit(f, compiler=comp, cache=cache)
    assert c(1.0) == 2.0 and comp.calls == 1
    other = Compiler()
    assert ftjit.jit(f, compiler=other, cache=cache)(1.0) == 2.0 and other.calls == 1
    assert cache._functions() == 2 and cache.size() == 2
    del b, c, comp
    assert gc_collect_until(lambda: cache._functions() == 1), "the dead compiler's entries stayed"
    assert cache.size() == 1  # only `other`'s entry is left


def test_per_object_compilers_leave_no_entries_behind():
    """A module-level function jitted per object with that object's
    bound-method compiler: once each object dies, its entries leave the cache
    (they can never be found again), so the cache does not grow."""
    cache = ftjit.FunctionCache()

    def step(x):
        return x + 1

    class Model:
        def compile(self, fun, args, kwargs):
            return lambda x: x + 1

    for _ in range(300):
        m = Model()
        assert ftjit.jit(step, compiler=m.compile, cache=cache)(1.0) == 2.0
        del m
    assert gc_collect_until(lambda: cache._functions() == 0), cache._functions()
    assert cache.size() == 0


def test_value_compared_compiler_is_kept_and_shared_across_wrapper_lifetimes():
    """A compiler with value equality may be a new equal object per wrapper:
    the key holds it, so a wrapper made per request still hits."""
    cache = ftjit.FunctionCache()
    calls = []

    class ByValue:
        def __init__(self, level):
            self.level = level

        def __eq__(self, other):
            return isinstance(other, ByValue) and other.level == self.level

        def __hash__(self):
            return hash(self.level)

        def __call__(self, fun, args, kwargs):
            calls.append(self.level)
            return fun

    def f(x):
        return x + 1

    for _ in range(3):
        assert ftjit.jit(f, compiler=ByValue(2), cache=cache)(1.0) == 2.0
        gc.collect()
    assert calls == [2]
