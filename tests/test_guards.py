"""Recompile guards: max_signatures (how many signatures a function may have
cached; past it, on_excess="warn" warns once and "raise" refuses the compile,
either way naming what differs from the closest cached signature),
compile_timeout (how long a caller waits on another thread's compile), and the
validation of these options.

The guard counts the function's cached entries in the core (cpp/jit/guard.cc
over cpp/store/entry_store.h), so it counts exactly what the cache keys, by
the cache's own equality; the last section checks that it keeps nothing
alive.

Every test builds its own FunctionCache and fresh functions. Functions whose
names show up in process-wide places (logs, stats()) get a unique name per
test run (helpers.unique_name), so parallel copies of a test never see each
other's records. Thread tests start on a Barrier (helpers.run_threads), join
with a timeout and re-raise worker exceptions.
"""

import gc
import re
import threading
import time
import warnings
import weakref

import numpy as np
import pytest

import ftjit
from helpers import (
    ContextCompiler,
    CountingCompiler,
    LogCapture,
    classes_can_die,
    explanations,
    fresh1,
    gated_compiler,
    gc_collect_until,
    named,
    run_threads,
    unique_name,
    wait_for,
    z,
)

pytestmark = pytest.mark.timeout(120)


# --- max_signatures, on_excess="warn" -----------------------------------------


@pytest.mark.thread_unsafe(reason="warnings.catch_warnings is process-global")
def test_max_signatures_warn_once_and_still_compiles():
    comp = CountingCompiler()
    jf = ftjit.jit(lambda x: x + 1, compiler=comp, cache=ftjit.FunctionCache(), max_signatures=2)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        jf(z(1))
        jf(z(2))
        jf(z(1))
        assert [x for x in w if issubclass(x.category, RuntimeWarning)] == []
        out = jf(z(3))
        assert np.array_equal(out, np.ones(3, np.float32))
        rw = [x for x in w if issubclass(x.category, RuntimeWarning)]
        assert len(rw) == 1
        assert "max_signatures=2" in str(rw[0].message)
        assert comp.calls == 3
        jf(z(4))
        jf(z(5))
        assert len([x for x in w if issubclass(x.category, RuntimeWarning)]) == 1
    assert comp.calls == 5
    assert jf.cache_info().compiles == 5


@pytest.mark.thread_unsafe(reason="pytest.warns is process-global")
def test_max_signatures_warn_with_pytest_warns():
    comp = CountingCompiler()
    jf = ftjit.jit(lambda x: x * 2, compiler=comp, cache=ftjit.FunctionCache(), max_signatures=1, on_excess="warn")
    jf(1.0)
    with pytest.warns(RuntimeWarning, match=r"max_signatures=1"):
        assert jf(z(2)).shape == (2,)
    assert comp.calls == 2


@pytest.mark.thread_unsafe(reason="warnings.catch_warnings is process-global")
def test_max_signatures_warn_once_with_the_miss_explanation():
    """on_excess="warn" (the default) warns exactly once, past N, and the
    warning says what differs from the closest cached signature: the argument
    path and the old -> new dtype/shape. Explanations need not be switched on."""
    fun, name = fresh1("limit_warn_explain", body=lambda x: x)
    comp = CountingCompiler()
    jf = ftjit.jit(fun, compiler=comp, cache=ftjit.FunctionCache(), max_signatures=2, explain_misses=False)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        jf({"a": z(1)})
        jf({"a": z(2)})
        jf({"a": z(1)})  # a hit
        assert [x for x in w if issubclass(x.category, RuntimeWarning)] == []
        jf({"a": z(2, dtype=np.int32)})  # the third signature: past N=2
        jf({"a": z(4)})
        jf({"a": z(5, dtype=np.int64)})
        jf({"a": z(2, dtype=np.int32)})  # a hit
    runtime = [x for x in w if issubclass(x.category, RuntimeWarning)]
    assert len(runtime) == 1, [str(x.message) for x in runtime]
    # Both cached signatures differ by one leaf; the closer one (same shape) is named.
    assert str(runtime[0].message) == (
        f"{name}() is compiling a signature past max_signatures=2 (differs from the closest cached one by: "
        "argument 'x'['a']: float32[2] -> int32[2]); raise the limit or make the varying argument static/bucketed"
    )
    assert comp.calls == 5


@pytest.mark.thread_unsafe(reason="warnings.catch_warnings is process-global")
def test_max_signatures_warn_concurrent_exactly_one_warning():
    limit, extra = 2, 4
    comp = CountingCompiler(delay=0.05)
    jf = ftjit.jit(lambda x: x, compiler=comp, cache=ftjit.FunctionCache(), max_signatures=limit)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        run_threads(limit + extra, lambda i: jf(z(i + 1)))
    rw = [x for x in w if issubclass(x.category, RuntimeWarning) and "max_signatures" in str(x.message)]
    assert len(rw) == 1
    assert comp.calls == limit + extra


def test_max_signatures_warning_turned_into_an_error_leaves_nothing_counted():
    """With warnings as errors, the excess call raises the RuntimeWarning and
    compiles nothing; it must not count as a signature, and the next excess
    call raises it again (it was never shown as a warning)."""
    comp = CountingCompiler()
    jf = ftjit.jit(lambda x: x, compiler=comp, cache=ftjit.FunctionCache(), max_signatures=1, on_excess="warn")
    jf(z(1))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        for _ in range(2):
            with pytest.raises(RuntimeWarning, match=r"is compiling a signature past max_signatures=1"):
                jf(z(2))
    assert comp.calls == 1 and jf.cache_info().size == 1
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        jf(z(2))  # now shown as a warning, and compiled
    assert [str(x.message).split(" (")[0] for x in w if issubclass(x.category, RuntimeWarning)] == [
        f"{jf.__qualname__}() is compiling a signature past max_signatures=1"]
    assert comp.calls == 2 and jf.cache_info().size == 2


# --- max_signatures, on_excess="raise" ----------------------------------------


def test_max_signatures_raise():
    fun, name = fresh1("limit_raise", body=lambda x: x * 3)
    comp = CountingCompiler()
    jf = ftjit.jit(fun, compiler=comp, cache=ftjit.FunctionCache(), max_signatures=2, on_excess="raise")
    jf(z(2))
    jf(z(3))
    assert comp.calls == 2
    with pytest.raises(ftjit.RecompileLimitError) as ei:
        jf(z(5))
    assert isinstance(ei.value, RuntimeError)
    msg = str(ei.value)
    assert "max_signatures=2" in msg
    assert name in msg
    assert re.search(r"argument 'x': float32\[[23]\] -> float32\[5\]", msg), msg
    assert comp.calls == 2  # not compiled
    with pytest.raises(ftjit.RecompileLimitError):
        jf(z(5))  # still refused, still not compiled
    assert comp.calls == 2
    # Already-compiled signatures keep working, as hits.
    hits0 = jf.cache_info().hits
    assert np.array_equal(jf(np.ones(2, np.float32)), np.full(2, 3, np.float32))
    assert np.array_equal(jf(np.ones(3, np.float32)), np.full(3, 3, np.float32))
    assert jf.cache_info().hits == hits0 + 2
    assert comp.calls == 2
    assert sorted(s.signature for s in jf.signatures()) == sorted([f"{name}(float32[2])", f"{name}(float32[3])"])


def test_max_signatures_failed_compile_frees_the_slot():
    comp = CountingCompiler(fail=ValueError("broken"))
    jf = ftjit.jit(lambda x: x, compiler=comp, cache=ftjit.FunctionCache(), max_signatures=1, on_excess="raise")
    with pytest.raises(ValueError, match="^broken$"):
        jf(z(1))
    comp.fail = None
    jf(z(2))  # the failed signature did not use up the only slot
    assert comp.calls == 2
    with pytest.raises(ftjit.RecompileLimitError):
        jf(z(1))
    assert comp.calls == 2


def test_max_signatures_counts_cached_signatures():
    """The limit bounds distinct cached signatures: f(x) and f(x=x) are two
    (signatures() lists both), so with max_signatures=1 the second must not compile."""
    fun, name = fresh1("limit_kw")
    comp = CountingCompiler()
    jf = ftjit.jit(fun, compiler=comp, cache=ftjit.FunctionCache(), max_signatures=1, on_excess="raise")
    a = z(3)
    jf(a)
    with pytest.raises(ftjit.RecompileLimitError, match=r"arguments passed as \(x\) -> \(x=\)"):
        jf(x=a)
    assert [s.signature for s in jf.signatures()] == [f"{name}(float32[3])"]
    assert comp.calls == 1


def test_max_signatures_raise_concurrent_misses_admit_exactly_n():
    limit, extra = 3, 3
    comp = CountingCompiler(delay=0.1)
    jf = ftjit.jit(lambda x: x, compiler=comp, cache=ftjit.FunctionCache(), max_signatures=limit, on_excess="raise")

    def target(i):
        try:
            jf(z(i + 1))
            return "ok"
        except ftjit.RecompileLimitError:
            return "raised"

    out = run_threads(limit + extra, target)
    assert out.count("ok") == limit, out
    assert out.count("raised") == extra, out
    assert comp.calls == limit
    info = jf.cache_info()
    assert info.compiles == limit and info.size == limit
    admitted = [i for i, r in enumerate(out) if r == "ok"]
    refused = [i for i, r in enumerate(out) if r == "raised"]
    for i in admitted:
        jf(z(i + 1))
    for i in refused:
        with pytest.raises(ftjit.RecompileLimitError):
            jf(z(i + 1))
    assert comp.calls == limit
    assert jf.cache_info().hits == limit


def test_max_signatures_counts_a_signature_recompiled_after_a_clear_while_its_first_compile_failed():
    """A compiles K (held); clear_cache() drops A's entry, so C compiles K
    again; A's compile then fails and C's succeeds: K is cached, so it counts,
    and max_signatures=1 refuses a second signature."""
    started, release = threading.Event(), threading.Event()
    calls = []
    lock = threading.Lock()

    def compiler(fun, args, kwargs):
        with lock:
            n = len(calls)
            calls.append(args)
        if n == 0:
            started.set()
            assert release.wait(30)
            raise ValueError("A fails")
        return fun

    jf = ftjit.jit(lambda x: x, compiler=compiler, cache=ftjit.FunctionCache(), max_signatures=1, on_excess="raise")
    outcomes = {}

    def call(name, x):
        try:
            outcomes[name] = jf(x)
        except Exception as e:  # noqa: BLE001 - examined below
            outcomes[name] = e

    a = threading.Thread(target=call, args=("A", 1.0))
    a.start()
    assert started.wait(30)
    jf.clear_cache()  # A's entry goes; its compile carries on
    c = threading.Thread(target=call, args=("C", 2.0))  # same signature (float)
    c.start()
    assert wait_for(lambda: len(calls) == 2, 30)  # C is compiling too
    release.set()
    for t in (a, c):
        t.join(30)
        assert not t.is_alive()
    assert type(outcomes["A"]) is ValueError and str(outcomes["A"]) == "A fails"
    assert outcomes["C"] == 2.0
    assert [s.signature for s in jf.signatures()] == [f"{jf.__qualname__}(float)"]
    with pytest.raises(ftjit.RecompileLimitError, match=r"would compile a signature past max_signatures=1"):
        jf(3)
    assert len(calls) == 2


# --- max_signatures: the count belongs to the function's cached entries -------


def test_max_signatures_counts_for_every_wrapper_sharing_the_entries():
    """Two ftjit.jit wrappers of one function with equal options share its
    cache entries, so they share the limit: what one compiled counts for the other."""
    comp = CountingCompiler()
    cache = ftjit.FunctionCache()

    def f(x):
        return x

    w1 = ftjit.jit(f, compiler=comp, cache=cache, max_signatures=1, on_excess="raise")
    w2 = ftjit.jit(f, compiler=comp, cache=cache, max_signatures=1, on_excess="raise")
    assert w1(1.0) == 1.0
    assert w2(2.0) == 2.0  # the same signature: a hit, whichever wrapper
    with pytest.raises(ftjit.RecompileLimitError, match=r"would compile a signature past max_signatures=1"):
        w2(3)
    with pytest.raises(ftjit.RecompileLimitError, match=r"would compile a signature past max_signatures=1"):
        w1(3)
    assert comp.calls == 1
    # A wrapper with other options has entries (and a limit) of its own.
    w3 = ftjit.jit(f, compiler=comp, cache=cache, max_signatures=2, on_excess="raise")
    assert w3(3) == 3 and comp.calls == 2


def test_max_signatures_count_outlives_the_wrappers():
    """The count belongs to the function's cached entries: a wrapper made per
    request (then dropped) cannot reset it while the signatures stay cached."""
    comp = CountingCompiler()
    cache = ftjit.FunctionCache()

    def f(x):
        return x

    for i, arg in enumerate([1.0, 2, 3.0, 4]):
        w = ftjit.jit(f, compiler=comp, cache=cache, max_signatures=1, on_excess="raise")
        if i == 0 or isinstance(arg, float):
            assert w(arg) == arg  # the first signature (float), then hits
        else:
            with pytest.raises(ftjit.RecompileLimitError, match=r"would compile a signature past max_signatures=1"):
                w(arg)
        del w
        gc.collect()
    assert comp.calls == 1 and cache.size() == 1


# --- a static whose repr raises -----------------------------------------------


class _UnprintableStatic:
    """Hashable by value; its __repr__ raises."""

    def __init__(self, k):
        self.k = k

    def __hash__(self):
        return hash(self.k)

    def __eq__(self, other):
        return isinstance(other, _UnprintableStatic) and other.k == self.k

    def __repr__(self):
        raise RuntimeError("no repr")


@pytest.mark.parametrize(
    "options",
    [dict(), dict(explain_misses=True), dict(max_signatures=4, on_excess="raise")],
    ids=["default", "explaining", "guarded"],
)
def test_a_static_whose_repr_raises_never_fails_the_call(options):
    name = unique_name("unprintable")

    def fun(x, s):
        return x * s.k

    jf = ftjit.jit(named(fun, name), static_argnums=1, compiler=CountingCompiler(), cache=ftjit.FunctionCache(),
                   **options)
    with LogCapture(name) as cap:
        assert jf(2.0, _UnprintableStatic(3)) == 6.0
        assert jf(2.0, _UnprintableStatic(4)) == 8.0
        assert jf(2.0, _UnprintableStatic(3)) == 6.0
    assert jf.cache_info().compiles == 2
    if options.get("explain_misses"):
        assert explanations(cap, name) == [
            "static 's': <unprintable _UnprintableStatic> -> <unprintable _UnprintableStatic>"
            " (unequal values with the same repr)"
        ]


# --- compile_timeout ----------------------------------------------------------


def test_compile_timeout_waiter_gives_up_and_compile_carries_on():
    """The compile is held until the waiter has given up (up to 30 s), so a
    waiter that ignored compile_timeout would get the compile's result, not
    CompileTimeoutError."""
    timeout = 0.3
    fun, name = fresh1("timeout_fn", body=lambda x: x + 2)
    started, release = threading.Event(), threading.Event()

    def hook(fun, args, kwargs):
        started.set()
        release.wait(30)

    comp = CountingCompiler(on_compile=hook)
    jf = ftjit.jit(fun, compiler=comp, cache=ftjit.FunctionCache(), compile_timeout=timeout)

    def target(i):
        if i == 0:
            return jf(np.ones(4, np.float32))
        assert started.wait(10)
        t0 = time.monotonic()
        try:
            jf(np.ones(4, np.float32))
        except ftjit.CompileTimeoutError as e:
            return e, time.monotonic() - t0, release.is_set()
        finally:
            release.set()
        return None, time.monotonic() - t0, True

    first, (err, elapsed, released_first) = run_threads(2, target, timeout=60)
    assert np.array_equal(first, np.full(4, 3, np.float32))
    assert type(err) is ftjit.CompileTimeoutError, (err, elapsed)
    assert isinstance(err, TimeoutError)
    assert not released_first  # it gave up while the compile was still held
    assert elapsed >= timeout, elapsed  # and not before its timeout
    assert str(err) == (
        f"gave up after compile_timeout=0.3 s waiting for {name}(float32[4]), which another thread is "
        "compiling; the compile carries on and later calls will use it"
    )
    # The compile carried on; a later call uses it.
    assert np.array_equal(jf(np.ones(4, np.float32)), np.full(4, 3, np.float32))
    assert comp.calls == 1
    info = jf.cache_info()
    assert (info.compiles, info.misses, info.waits, info.hits, info.failures) == (1, 1, 1, 1, 0)
    assert info.wait_seconds >= timeout


def test_compile_timeout_not_hit_when_compile_is_quick_enough():
    comp, started, _ = gated_compiler(lambda: jf.cache_info().waits >= 1)
    jf = ftjit.jit(lambda x: x * 2, compiler=comp, cache=ftjit.FunctionCache(), compile_timeout=10.0)

    def target(i):
        if i == 1:
            assert started.wait(10)
        return jf(np.ones(2, np.float32))

    out = run_threads(2, target)
    assert all(np.array_equal(r, np.full(2, 2, np.float32)) for r in out)
    assert comp.calls == 1
    assert jf.cache_info().waits == 1


def test_compile_timeout_does_not_limit_the_compiling_thread():
    comp = CountingCompiler(delay=0.2)
    jf = ftjit.jit(lambda x: x, compiler=comp, cache=ftjit.FunctionCache(), compile_timeout=0.05)
    assert jf(1.0) == 1.0
    assert comp.calls == 1


# --- option validation --------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"max_signatures": 0}, ValueError, "max_signatures must be a positive int or None, got 0"),
        ({"max_signatures": -1}, ValueError, "max_signatures must be a positive int or None, got -1"),
        ({"max_signatures": 1.5}, TypeError, "max_signatures must be an int or None, got 1.5"),
        ({"max_signatures": 2.0}, TypeError, "max_signatures must be an int or None, got 2.0"),
        ({"max_signatures": True}, TypeError, "max_signatures must be an int or None, got True"),
        # The core keeps the limit in a signed 64-bit int: past it, the range (not nanobind's "incompatible
        # function arguments").
        ({"max_signatures": 2**63}, ValueError,
         "max_signatures must be an int from 1 to 2**63 - 1, or None, got 9223372036854775808"),
        ({"max_signatures": 2**70}, ValueError,
         "max_signatures must be an int from 1 to 2**63 - 1, or None, got 1180591620717411303424"),
        ({"max_signatures": 2, "on_excess": "boom"}, ValueError, "on_excess must be \"warn\" or \"raise\", got 'boom'"),
        ({"on_excess": "boom"}, ValueError, "on_excess must be \"warn\" or \"raise\", got 'boom'"),
        ({"compile_timeout": 0}, ValueError, "compile_timeout must be a positive number of seconds or None, got 0"),
        ({"compile_timeout": -1}, ValueError, "compile_timeout must be a positive number of seconds or None, got -1"),
        ({"compile_timeout": -0.5}, ValueError, "compile_timeout must be a positive number of seconds or None, got -0.5"),
        ({"compile_timeout": float("nan")}, ValueError,
         "compile_timeout must be a positive number of seconds or None, got nan"),
        ({"compile_timeout": True}, TypeError, "compile_timeout must be a number of seconds or None, got True"),
        ({"compile_timeout": "1"}, TypeError, "compile_timeout must be a number of seconds or None, got '1'"),
    ],
)
def test_invalid_guard_options(kwargs, error, message):
    comp = CountingCompiler()
    with pytest.raises(error) as info:
        ftjit.jit(lambda x: x, compiler=comp, cache=ftjit.FunctionCache(), **kwargs)
    assert type(info.value) is error and str(info.value) == message


def test_the_largest_max_signatures_is_accepted_and_counts_as_no_limit_in_practice():
    comp = CountingCompiler()
    jf = ftjit.jit(lambda x: x, compiler=comp, cache=ftjit.FunctionCache(), max_signatures=2**63 - 1,
                   on_excess="raise")
    assert [jf(x) for x in (1.0, 2, True)] == [1.0, 2, True]
    assert comp.calls == 3


def test_numpy_int_max_signatures_and_infinite_compile_timeout_are_accepted():
    comp = CountingCompiler()
    fun, name = fresh1("np_limit", body=lambda x: x)
    jf = ftjit.jit(fun, compiler=comp, cache=ftjit.FunctionCache(), max_signatures=np.int64(1),
                   on_excess="raise", compile_timeout=float("inf"))
    assert jf(1.0) == 1.0
    with pytest.raises(ftjit.RecompileLimitError) as info:
        jf(z(2))
    assert str(info.value) == (
        f"{name}() would compile a signature past max_signatures=1 (differs from the closest cached one by: "
        "argument 'x': float -> float32[2]); raise the limit or make the varying argument static/bucketed"
    )
    assert comp.calls == 1


def test_valid_guard_options_accepted():
    comp = CountingCompiler()
    for kwargs in ({"max_signatures": 1}, {"on_excess": "raise"}, {"compile_timeout": 0.01}, {"compile_timeout": 3}):
        jf = ftjit.jit(lambda x: x, compiler=comp, cache=ftjit.FunctionCache(), **kwargs)
        assert jf(1.0) == 1.0


# --- the count and evictions ------------------------------------------------------


class _ValueStatic(_UnprintableStatic):
    """Hashable by value, with the default repr (which shows the address)."""

    __repr__ = object.__repr__


# An evicted signature compiled again counts once: its own LRU slot evicts nothing it could count against
def test_max_signatures_counts_equal_statics_once_whatever_their_repr():
    # An equal static (a new object, so a new default repr) is the same
    # signature: recompiling it after an eviction is not a new signature.
    cache = ftjit.FunctionCache(1)
    comp = CountingCompiler()
    jf = ftjit.jit(lambda x, m: x * m.k, static_argnums=1, compiler=comp, cache=cache, max_signatures=1,
                   on_excess="raise")
    other = ftjit.jit(lambda x: x, compiler=comp, cache=cache)
    assert jf(1.0, _ValueStatic(2)) == 2.0
    assert other(1.0) == 1.0  # evicts jf's only entry
    assert jf.cache_info().size == 0
    assert jf(1.0, _ValueStatic(2)) == 2.0
    assert comp.calls == 3
    with pytest.raises(ftjit.RecompileLimitError):
        jf(1.0, _ValueStatic(3))


# --- the guard keeps nothing alive ---------------------------------------------


# The guard keeps nothing alive: it counts the cache's entries, which a clear drops
def test_shared_guard_state_does_not_keep_a_static_arguments_class_alive():
    """The guard counts the function's cached entries and remembers nothing
    else: a class used as a static argument's type, which itself holds the
    jitted function, is collected once nothing else refers to it. (The
    compiled entry holds the static value itself, as jax.jit's cache does;
    it is cleared first.)"""
    cache = ftjit.FunctionCache()

    class Key:
        pass

    Key.jf = ftjit.jit(lambda x, k: x, static_argnums=1, compiler=CountingCompiler(), cache=cache, max_signatures=4)
    assert Key.jf(1.0, Key()) == 1.0
    Key.jf.clear_cache()
    r = weakref.ref(Key)
    del Key
    if classes_can_die():  # not on 3.13t, where classes become immortal (see helpers)
        assert gc_collect_until(lambda: r() is None), "the static argument's class was kept alive"


# The guard keeps nothing alive: no context value
def test_guard_state_holds_no_context_value():
    """The guard remembers no context value: one that refers to the jitted
    function (here, an instance of a class holding it) is collected once its
    entries are cleared."""
    comp = ContextCompiler()
    filler = ftjit.jit(lambda x: x, compiler=comp, cache=ftjit.FunctionCache(), explain_misses=False)
    for i in range(300):  # past the core's process-wide table of remembered contexts (256)
        comp.cur = ("fill", i)
        filler(1.0)

    class Model:
        pass

    Model.f = ftjit.jit(lambda x: x, compiler=comp, cache=ftjit.FunctionCache(), max_signatures=4)
    comp.cur = Model()
    assert Model.f(1.0) == 1.0
    comp.cur = ("other",)
    filler(1.0)  # this thread's memo of the last context moves on
    Model.f.clear_cache()
    r = weakref.ref(Model)
    del Model
    if classes_can_die():  # not on 3.13t, where classes become immortal (see helpers)
        assert gc_collect_until(lambda: r() is None), "the guard kept a context value (and its class) alive"


# The guard keeps nothing alive: no int or str subclass context value
def test_guard_holds_no_int_or_str_subclass_context_value():
    import enum

    comp = ContextCompiler()
    filler = ftjit.jit(lambda x: x, compiler=comp, cache=ftjit.FunctionCache(), explain_misses=False)
    for i in range(300):  # past the core's process-wide table of remembered contexts (256)
        comp.cur = ("fill", i)
        filler(1.0)

    class Phase(enum.IntEnum):
        TRAIN = 1

    Phase.f = ftjit.jit(lambda x: x, compiler=comp, cache=ftjit.FunctionCache(), max_signatures=4)
    comp.cur = (Phase.TRAIN,)
    assert Phase.f(1.0) == 1.0
    comp.cur = ("other",)
    filler(1.0)
    Phase.f.clear_cache()
    r = weakref.ref(Phase)
    del Phase
    if classes_can_die():  # not on 3.13t, where classes become immortal (see helpers)
        assert gc_collect_until(lambda: r() is None), "the guard kept an IntEnum context value (and its class) alive"


def test_max_signatures_an_eviction_keeps_the_count_and_a_clear_gives_it_back():
    """Issue 52: an eviction gave its signature's slot back, so a recompile storm on a cache smaller than
    max_signatures (or one that other functions' traffic keeps full) never reached the limit. An evicted
    signature now keeps its count, and takes it back when it returns (it may compile again); clear_cache(), the
    operator's own reset, gives every slot back."""
    comp = CountingCompiler()
    jf = ftjit.jit(lambda x: x, compiler=comp, cache=ftjit.FunctionCache(capacity=1), max_signatures=2,
                   on_excess="raise")
    jf(z(1))
    jf(z(2))  # evicts float32[1], which keeps its count
    assert jf.cache_info().evictions == 1 and jf.cache_info().size == 1
    with pytest.raises(ftjit.RecompileLimitError, match="max_signatures=2"):
        jf(z(3))
    assert comp.calls == 2
    jf(z(1))  # a counted signature returns: compiled again, its count taken back (float32[2] evicted, kept)
    assert comp.calls == 3 and jf.cache_info().evictions == 2
    with pytest.raises(ftjit.RecompileLimitError):
        jf(z(3))
    jf(z(2))
    assert comp.calls == 4
    jf.clear_cache()
    jf(z(3))  # a clear gave the slots back
    jf(z(4))
    with pytest.raises(ftjit.RecompileLimitError):
        jf(z(5))
    assert comp.calls == 6


def test_max_signatures_evictions_from_other_functions_traffic_keep_the_count():
    """Another function's traffic evicts this one's signatures from a shared cache: they keep counting."""
    cache = ftjit.FunctionCache(capacity=2)
    guarded = ftjit.jit(lambda x: x, compiler=CountingCompiler(), cache=cache, max_signatures=2, on_excess="raise")
    other = ftjit.jit(lambda x: x + 1, compiler=CountingCompiler(), cache=cache)
    guarded(z(1))
    guarded(z(2))
    for n in range(3, 9):
        other(z(n))  # fills the cache: guarded's two entries are evicted
    assert guarded.cache_info().size == 0 and guarded.cache_info().evictions == 2
    with pytest.raises(ftjit.RecompileLimitError):
        guarded(z(3))
    guarded(z(1))
    guarded(z(2))
