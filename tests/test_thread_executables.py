"""ThreadExecutables and context_in_executable, without JAX: executables the
core copies per thread, that check the compiler's context themselves.

CopyCompiler (stress.copy_compiler, which the stress suite's reentrant_copies
scenario uses too) plays jaxlib's part: each copy caches, per context it has
served, what the core's miss returned, and calls the miss for any other; the
context is per thread (threading.local, as JAX's thread-local configs are).
So the core's side of the protocol is tested here, and under ThreadSanitizer
(dev.sh tsan-ft runs this file): the hit path reads no context, a context
change compiles once under a herd, a thread's copy is its own and is reused
by the next thread on its index, copies die with their entries, misses are
explained with the context that changed, and eager mode calls the fallback.

Thread tests start on a Barrier (helpers.run_threads), join with a timeout
and re-raise worker exceptions.
"""

import gc
import threading
import weakref

import pytest

import ftjit
from helpers import LogCapture, explanations, gc_collect_until, run_threads, unique_name
from stress.copy_compiler import CopyCompiler

pytestmark = pytest.mark.timeout(120)


def _jitted(comp, name=None, **options):
    def f(x):
        return x + 1

    if name:
        f.__name__ = f.__qualname__ = name
    return ftjit.jit(f, compiler=comp, cache=ftjit.FunctionCache(), **options)


def test_hits_read_no_context_and_call_the_threads_own_copy():
    comp = CopyCompiler()
    jf = _jitted(comp)
    assert jf(1) == ("A", 2)  # compiled; this thread's own copy made (its first call misses)
    reads = comp.context_reads
    assert (comp.compiles, len(comp.copies), comp.misses) == (1, 1, 1)
    for i in range(50):
        assert jf(i) == ("A", i + 1)
    assert comp.context_reads == reads  # the hit path read no context
    assert (comp.compiles, len(comp.copies), comp.misses, comp.served) == (1, 1, 1, 50)
    info = jf.cache_info()
    assert (info.hits, info.misses, info.compiles, info.size) == (50, 1, 1, 1)
    assert [s.hits for s in jf.signatures()] == [50]


def test_a_context_change_compiles_once_and_then_hits_in_each_context():
    """The copy misses the new context; the core reads it, compiles that
    context's signature and sends this thread there. Switching back costs
    one miss of the copy, and no compile."""
    comp = CopyCompiler()
    jf = _jitted(comp)
    assert jf(1) == ("A", 2)
    comp.set_context("B")
    assert jf(1) == ("B", 2)  # the copy of A misses; the core compiles B
    assert comp.compiles == 2
    for _ in range(5):
        assert jf(1) == ("B", 2)  # straight to B's copy
    comp.set_context("A")
    assert jf(1) == ("A", 2)
    for _ in range(5):
        assert jf(1) == ("A", 2)
    assert comp.compiles == 2
    info = jf.cache_info()
    assert (info.compiles, info.misses, info.size) == (2, 2, 2)
    assert info.hits == 11  # the 13 calls but the 2 that compiled, each counted once
    assert sorted(s.hits for s in jf.signatures()) == [5, 6]


def test_twelve_threads_entering_a_new_context_at_once_compile_it_once():
    comp = CopyCompiler()
    jf = _jitted(comp)
    assert jf(0) == ("A", 1)

    def call(i):
        comp.set_context("B")
        return [jf(i) for _ in range(20)]

    out = run_threads(12, call)
    assert out == [[("B", i + 1)] * 20 for i in range(12)]
    assert comp.compiles == 2
    info = jf.cache_info()
    assert (info.compiles, info.misses, info.size) == (2, 2, 2)
    assert info.hits + info.waits == 12 * 20 + 0 - 1  # one call compiled; the rest hit or waited
    # A copy of each entry per thread that called it (the main thread's of A, each worker's of A and of B).
    assert len(comp.copies) <= 1 + 2 * 12


def test_a_miss_explanation_names_the_context_that_changed():
    comp = CopyCompiler()
    name = unique_name("ctx")
    jf = _jitted(comp, name=name, explain_misses=True)
    with LogCapture(name) as cap:
        jf(1)
        comp.set_context("B")
        jf(1)
    assert explanations(cap, name) == ["tracing context mode: 'A' -> 'B'"]


def test_eager_mode_calls_the_fallback_counting_nothing():
    comp = CopyCompiler()
    jf = _jitted(comp)
    jf(1)
    before = jf.cache_info()
    comp.eager_mode = True
    try:
        assert jf(5) == ("eager", 6)
    finally:
        comp.eager_mode = False
    assert jf.cache_info() == before
    assert jf(5) == ("A", 6)


def test_copies_die_with_their_entries_on_clear_cache():
    comp = CopyCompiler()
    jf = _jitted(comp)
    all_called = threading.Barrier(4)

    def work(i):
        out = [jf(i) for _ in range(3)]
        all_called.wait(30)  # four threads alive at once: four indices, four copies
        return out

    run_threads(4, work)
    assert comp.live_copies() == 4
    jf.clear_cache()
    assert gc_collect_until(lambda: comp.live_copies() == 0), "a copy outlived clear_cache()"
    assert jf(1) == ("A", 2)
    assert comp.compiles == 2


def test_a_threads_copies_pass_to_the_next_thread_on_its_index():
    """Thread per request: each new thread takes the lowest free index and
    finds the copy the last thread of that index left in its slot; copies
    stay at most one per index, however many threads come and go."""
    comp = CopyCompiler()
    jf = _jitted(comp)
    jf(0)
    indices = {ftjit._core._thread_index()}

    def request(i):
        assert jf(i) == ("A", i + 1)
        indices.add(ftjit._core._thread_index())

    for i in range(40):
        t = threading.Thread(target=request, args=(i,))
        t.start()
        t.join(30)
        assert not t.is_alive()
    assert comp.compiles == 1
    # One copy per index the threads held (usually two: the main thread's, and the lowest free one).
    assert len(comp.copies) == len(indices) and comp.misses == len(indices)  # each copy's first call missed
    assert len(indices) < 40


def test_many_threads_share_one_function_with_contexts_changing_and_clears_racing():
    """Twelve threads call one function with their own arguments, each
    switching between two contexts; another clears the cache now and then.
    Every result is the right program's for the caller's context now."""
    comp = CopyCompiler()
    jf = _jitted(comp)
    stop = threading.Event()

    def work(i):
        if i == 12:
            while not stop.is_set():
                jf.clear_cache()
                stop.wait(0.005)
            return None
        try:
            for k in range(300):
                mode = "A" if (k // 7 + i) % 2 else "B"
                comp.set_context(mode)
                assert jf(i * 1000 + k) == (mode, i * 1000 + k + 1)
        finally:
            if i == 0:
                stop.set()
        return None

    run_threads(13, work, timeout=120)
    stop.set()
    info = jf.cache_info()
    assert info.size <= 2
    assert comp.compiles == info.compiles


def test_a_copy_whose_call_failed_is_made_afresh():
    """A copy keeps a context it failed in as uncached (jaxlib does): the
    core drops this thread's copy after an error, so the next call gets a
    fresh one instead of the slow path for good."""
    comp = CopyCompiler()

    def f(x):
        if x < 0:
            raise ValueError("negative")
        return x

    jf = ftjit.jit(f, compiler=comp, cache=ftjit.FunctionCache())
    assert jf(1) == ("A", 1)
    made, misses = len(comp.copies), comp.misses
    with pytest.raises(ValueError, match="negative"):
        jf(-1)  # served by this thread's copy, whose program raises
    assert jf(2) == ("A", 2)
    assert len(comp.copies) == made + 1 and comp.misses == misses + 1  # a fresh copy, whose first call missed
    assert comp.compiles == 1
    info = jf.cache_info()
    assert (info.hits, info.misses) == (2, 1)


class _FlakyKey:
    """A context item equal by name, whose __eq__ raises once after ``fail_once()``."""

    _fail = threading.local()

    def __init__(self, name):
        self.name = name

    @classmethod
    def fail_once(cls):
        cls._fail.armed = True

    def __hash__(self):
        return hash(self.name)

    def __eq__(self, other):
        if getattr(self._fail, "armed", False):
            self._fail.armed = False
            raise RuntimeError("flaky __eq__")
        return isinstance(other, _FlakyKey) and other.name == self.name

    def __repr__(self):
        return f"_FlakyKey({self.name!r})"


class _TupleContextCopyCompiler(CopyCompiler):
    """CopyCompiler whose context is a fresh tuple of the thread's value on
    every call (as JAX's is), so the thread's memo reuses its interned one."""

    def context(self):
        with self.lock:
            self.context_reads += 1
        return ("mode", getattr(self.local, "value", "A"))


def test_a_context_interned_twice_still_reaches_its_entrys_copy():
    """Equal contexts can be interned apart: two threads interning at once,
    or, as here, an interning lookup whose __eq__ raised (taken as "not
    equal"). A copy's miss under the second one is its entry's own context
    all the same: the copy runs its program and caches it. (It compared the
    interned contexts by identity, went back to the same entry, and called
    the same copy's miss again, until RecursionError.)"""
    comp = _TupleContextCopyCompiler()
    jf = _jitted(comp)
    comp.set_context(_FlakyKey("B"))
    assert jf(1) == (_FlakyKey("B"), 2)

    def other(i):
        comp.set_context(_FlakyKey("B"))  # equal, another object
        _FlakyKey.fail_once()  # this thread's interning compares it with the first one: a duplicate
        return [jf(2), jf(3)]

    assert run_threads(1, other) == [[(_FlakyKey("B"), 3), (_FlakyKey("B"), 4)]]
    assert comp.compiles == 1
    info = jf.cache_info()
    assert (info.compiles, info.misses, info.size) == (1, 1, 1)


# --- issue 40's findings (the JAX ones: tests/test_jax_copies.py) -------------------


def test_an_evicted_entrys_copies_die_though_the_thread_redirected_to_it_ended():
    """Finding 4: a thread under context B called A's arguments (compiled
    under A), so its slot of A redirects to B, and ended. B is evicted: its
    copies go with it at once (the redirect held a reference to B's copy
    until that thread called A again, which it never does)."""
    comp = CopyCompiler()
    jf = ftjit.jit(lambda x, *pad: x + 1, compiler=comp, cache=ftjit.FunctionCache(3))
    assert jf(1) == ("A", 2)

    def in_b(i):
        comp.set_context("B")
        # The first call compiles B; the second finds it listed and redirects; the third goes straight to B.
        return [jf(1) for _ in range(3)]

    assert run_threads(1, in_b) == [[("B", 2)] * 3]
    assert comp.live_copies_of("B") >= 1  # the thread's own (the old core also made one shared)
    # Here A's copy's first call; in the thread A's copy (twice: the second sets the redirect) and B's.
    assert comp.compiles == 2 and comp.misses == 4
    before = jf.cache_info().evictions
    k = 2
    while any("B" in str(s) for s in _contexts_cached(jf)):  # fill the cache (A kept warm) until B goes
        jf(1)
        jf(1, *[0] * k)  # another signature each time
        k += 1
        assert k < 50
    assert jf.cache_info().evictions > before
    assert jf(1) == ("A", 2)
    assert gc_collect_until(lambda: comp.live_copies_of("B") == 0), "an evicted entry's copy outlived it"


def _contexts_cached(jf):
    return [sig.context for sig in jf._signatures()]


def test_threads_past_sixteen_have_their_own_copies_and_redirects():
    """Finding 5: twenty-four threads alive at once call, under context B,
    arguments compiled under A. Each has its own copy of each entry and its
    own redirect A -> B: after its first call, every call is served by its
    copy of B (no miss), however many threads (the old core shared one copy
    and had no redirect past sixteen threads: every call missed)."""
    comp = CopyCompiler()
    jf = _jitted(comp)
    assert jf(0) == ("A", 1)
    all_in, warm = threading.Barrier(24), threading.Barrier(25)
    go = threading.Event()
    calls = 50

    def work(i):
        if i == 24:  # counts between the rounds
            warm.wait(30)
            counts.append((comp.misses, comp.served))
            go.set()
            return None
        comp.set_context("B")
        out = [jf(0)]  # the first call takes the thread's index
        all_in.wait(30)  # twenty-four threads hold one at once
        out += [jf(0) for _ in range(2)]  # each thread's redirect set, its copies made
        warm.wait(30)
        go.wait(30)
        out += [jf(0) for _ in range(calls)]
        return ftjit._core._thread_index(), out

    counts = []
    results = run_threads(25, work, timeout=120)[:24]
    assert [out for _, out in results] == [[("B", 1)] * (calls + 3)] * 24
    assert len({index for index, _ in results}) == 24  # one index each
    assert comp.compiles == 2
    assert len(comp.copies) == 1 + 2 * 24  # the main thread's of A; each thread's of A and of B
    # Each thread's copy of A missed on its first call or two (the one that finds B compiled, or waits
    # for it; then one that finds it listed and sets the redirect), its copy of B on its first.
    misses, served = counts[0]
    assert 1 + 2 * 24 <= misses <= 1 + 3 * 24
    # Then every call goes straight to the thread's own copy of B, which serves it.
    assert (comp.misses, comp.served) == (misses, served + 24 * calls)


# --- CompilerHooks.thread_call without JAX (and under ThreadSanitizer) ------------------------------------


def test_thread_calls_serve_hits_and_the_core_counts_them_exactly():
    comp = CopyCompiler(thread_calls=True)
    jf = _jitted(comp)
    for i in range(20):
        assert jf(i) == ("A", i + 1)
    assert (comp.compiles, comp.misses, comp.served, len(comp.copies)) == (1, 1, 19, 0)  # no copy: own_miss served
    comp.set_context("B")
    assert jf(1) == ("B", 2) and jf(2) == ("B", 3)
    assert (comp.compiles, comp.misses, comp.served) == (2, 2, 20)
    info = jf.cache_info()
    assert (info.hits, info.misses, info.compiles, info.size) == (20, 2, 2, 2)
    s = jf._thread_call_state()
    assert (s["calls"], s["to_core"], s["drops"]) == (22, 2, 0)


def test_thread_calls_twelve_threads_entering_a_new_context_compile_it_once():
    comp = CopyCompiler(thread_calls=True)
    jf = _jitted(comp)
    assert jf(0) == ("A", 1)

    def call(i):
        comp.set_context("B")
        return [jf(i) for _ in range(20)]

    assert run_threads(12, call) == [[("B", i + 1)] * 20 for i in range(12)]
    assert comp.compiles == 2
    info = jf.cache_info()
    assert (info.compiles, info.misses) == (2, 2)
    assert info.hits + info.waits == 12 * 20 - 1


def test_thread_calls_racing_clear_cache():
    comp = CopyCompiler(thread_calls=True)
    jf = _jitted(comp)
    stop = threading.Event()

    def work(i):
        if i == 0:
            for _ in range(30):
                jf.clear_cache()
            stop.set()
            return None
        n = 0
        while not stop.is_set() or n < 50:
            assert jf(i) == ("A", i + 1)
            n += 1
        return n

    counts = run_threads(6, work, timeout=120)
    info = jf.cache_info()
    assert info.compiles == info.misses >= 1
    assert info.hits + info.misses + info.waits == sum(counts[1:])
    jf.clear_cache()
    assert jf(1) == ("A", 2) and jf(1) == ("A", 2)
    after = jf.cache_info()
    assert (after.compiles, after.hits) == (info.compiles + 1, info.hits + 1)


def test_thread_calls_statics_that_are_not_builtin_take_the_stores_path():
    comp = CopyCompiler(thread_calls=True)

    class Key:
        def __init__(self, v):
            self.v = v

        def __hash__(self):
            return hash(self.v)

        def __eq__(self, other):
            return isinstance(other, Key) and other.v == self.v

    jf = ftjit.jit(lambda x, k: x + (k if isinstance(k, int) else k.v), compiler=comp, static_argnums=1,
                   cache=ftjit.FunctionCache())
    assert jf(1, 2) == ("A", 3) and jf(1, 2) == ("A", 3)
    assert jf(1, Key(5)) == ("A", 6) and jf(1, Key(5)) == ("A", 6)
    s = jf._thread_call_state()
    assert (s["calls"], s["to_core"]) == (2, 1)  # only the int static went through the call object
    assert len(comp.copies) == 1  # the Key calls ran their entry's copy, on the store's path
    info = jf.cache_info()
    assert (info.hits, info.misses, info.compiles) == (2, 2, 2)


def test_thread_calls_clear_cache_empties_the_call_objects_of_threads_that_ended():
    """What a thread's call object kept goes at clear_cache(), from the clearing thread: a thread that ended
    would never call again to replace its object."""
    comp = CopyCompiler(thread_calls=True)
    jf = _jitted(comp)
    alive = threading.Barrier(3)

    def work(i):
        out = [jf(i) for _ in range(3)]
        alive.wait(30)  # alive at once: three indices, three call objects
        return out

    run_threads(3, work)
    assert len(comp.call_caches) == 3 and all(len(c) == 1 for c in comp.call_caches)
    jf.clear_cache()
    assert all(len(c) == 0 for c in comp.call_caches)
    assert jf(1) == ("A", 2)
    assert comp.compiles == 2 and jf.cache_info().misses == 2
