"""What the core keeps alive, and for how long: compiler contexts, per-thread
memos, and registrations seen at once.

The core keeps some Python objects outside the GC's sight (interned contexts,
per-thread memos). Each test drops everything that uses such an object, then
checks with a weak reference that the object dies, which it did not before
(contexts lived for the process, per-thread memos for the thread's life even
after it ended, and a namedtuple registered after first use was not seen).
"""

import collections
import gc
import os
import subprocess
import sys
import threading
import weakref

import pytest

import ftjit
from helpers import (ContextCompiler, ThreadContextCompiler, child_env, classes_can_die, gc_collect_until, run_script,
                     run_threads, weak_executable)


class _Config:
    """A per-model context value: hashable by a key, with a payload."""

    def __init__(self, key, payload=b""):
        self.key, self.payload = key, payload

    def __eq__(self, other):
        return isinstance(other, _Config) and other.key == self.key

    def __hash__(self):
        return hash(self.key)


@pytest.mark.thread_unsafe(reason="counts the process-wide interned contexts")
def test_a_context_dies_with_the_last_signature_using_it():
    """Five models, each with its own config as the compiler context: once a
    model's function is gone, its config is collected, although this
    thread's memo saw it last; the process keeps nothing of it."""
    comp = ThreadContextCompiler()
    # This thread's memo moves onto a context a live function keeps: what
    # it held before (another test's, perhaps used by nothing else) goes now,
    # not during the count below.
    comp.local.cur = ("baseline", 0)
    baseline = ftjit.jit(lambda x: x, compiler=comp, cache=ftjit.FunctionCache())
    baseline(1.0)
    baseline(2.0)
    before = ftjit._core._interned_contexts()
    refs, fns = [], []
    for i in range(5):
        cfg = _Config(("model", i), payload=bytes(1 << 20))
        refs.append(weakref.ref(cfg))
        comp.local.cur = cfg
        fn = ftjit.jit(lambda x: x, compiler=comp, cache=ftjit.FunctionCache())
        assert fn(1.0) == 1.0 and fn(2.0) == 2.0
        fns.append(fn)
        del cfg
    assert comp.calls == 1 + 5  # the baseline, then one per model
    assert ftjit._core._interned_contexts() == before + 5
    comp.local.cur = ("baseline", 0)  # the compiler itself lets go of the last model's config
    del fns
    ftjit.clear_caches()
    assert gc_collect_until(lambda: all(r() is None for r in refs)), [r() is not None for r in refs]
    assert ftjit._core._interned_contexts() <= before  # clear_caches() dropped even the baseline's signatures
    assert baseline(3.0) == 3.0


class _TupleContextCompiler(ThreadContextCompiler):
    """A compiler whose context is a tuple of this thread's ``cur`` objects,
    built afresh on every call (as JAX's is): the items are the same objects
    call after call, so the thread's memo reuses the canonical context."""

    def context(self):
        return (getattr(self.local, "cur", None), "mode")


@pytest.mark.thread_unsafe(reason="waits for the process-wide interned contexts to go")
@pytest.mark.parametrize("compiler_type", [ThreadContextCompiler, _TupleContextCompiler])
@pytest.mark.parametrize("caller", ["this thread", "a thread that stays alive"])
def test_the_context_of_dropped_functions_dies_though_a_thread_saw_it_last(compiler_type, caller):
    """The issue's case: five functions, each with its own context object
    (a large config), called once each; then everything is dropped. No
    context may outlive its functions: not through the calling thread's memo
    of its last context, even while that thread lives on and never calls
    again (a context object as it is, or one item of a fresh tuple each call,
    which the memo remembers by identity)."""
    comp = compiler_type()
    refs, fns = [], []
    for i in range(5):
        cfg = _Config(("model", i), payload=bytes(1 << 20))
        refs.append(weakref.ref(cfg))
        fns.append((cfg, ftjit.jit(lambda x, i=i: x + i, compiler=comp, cache=ftjit.FunctionCache())))
        del cfg

    def call_each():
        for i, (cfg, fn) in enumerate(fns):
            comp.local.cur = cfg
            assert fn(1.0) == 1.0 + i and fn(2.0) == 2.0 + i  # the second call: a hit through the memo
        comp.local.cur = None

    if caller == "this thread":
        call_each()
        done = None
    else:
        called, done = threading.Event(), threading.Event()

        def worker():
            call_each()
            called.set()
            done.wait(30)  # alive, idle: makes no further call

        t = threading.Thread(target=worker, daemon=True)
        t.start()
        assert called.wait(30)
    assert comp.calls == 5
    fns.clear()
    ftjit.clear_caches()
    try:
        assert gc_collect_until(lambda: all(r() is None for r in refs)), [r() is not None for r in refs]
    finally:
        if done is not None:
            done.set()
            t.join(30)
            assert not t.is_alive()


@pytest.mark.thread_unsafe(reason="runs its own 8 threads in rounds; 8 copies at once only slow 2 cores")
def test_a_context_that_functions_in_many_threads_drop_together_is_dropped_once():
    """Functions of one context made, called and dropped in 8 threads at
    once, round after round: the context dies and is interned again each
    round, and its object loses exactly the references the core took.
    The last user's release once decremented first and re-checked under the
    table's lock; a lookup could count the context in between, use it and
    release it itself, and both threads then dropped it: a double
    Py_DECREF (a segfault in pytest-run-parallel on 3.13t)."""
    ctx = ("shared", object())
    comp = ContextCompiler()
    comp.cur = ctx  # one context object for every thread and call
    before = sys.getrefcount(ctx)
    rounds, n = 1000, 8
    barrier = threading.Barrier(n)

    def work(i):
        for _ in range(rounds):
            jf = ftjit.jit(lambda x: x + 1, compiler=comp, cache=ftjit.FunctionCache())
            assert jf(1.0) == 2.0 and jf(2) == 3 and jf(3) == 4  # two signatures: a miss, a miss, a hit
            info = jf.cache_info()
            assert (info.misses, info.hits, info.compiles) == (2, 1, 2)
            del jf  # this thread's signatures release the context now
            barrier.wait(30)  # all threads' releases, then all next lookups, at once

    run_threads(n, work, timeout=120)
    assert sys.getrefcount(ctx) == before


def test_a_context_whose_eq_raises_fails_only_its_own_calls():
    """Contexts are interned process-wide and compared with ==: a broken
    __eq__ must not make an unrelated context of equal hash fail."""

    class Broken(_Config):
        def __eq__(self, other):
            if other is self:
                return True
            raise ValueError("broken __eq__")

        __hash__ = _Config.__hash__

    comp = ThreadContextCompiler()
    bad = Broken(("same", "hash"))
    comp.local.cur = bad
    f = ftjit.jit(lambda x: x, compiler=comp, cache=ftjit.FunctionCache())
    assert f(1.0) == 1.0  # interned: the memo hands its calls the same object
    comp.local.cur = _Config(("same", "hash"))  # equal hash, a good __eq__
    g = ftjit.jit(lambda x: x + 1, compiler=comp, cache=ftjit.FunctionCache())
    assert g(1.0) == 2.0
    comp.local.cur = _Config(("same", "hash"))  # a fresh equal one: found by == among the candidates
    assert g(2.0) == 3.0
    assert comp.calls == 2
    comp.local.cur = bad
    assert f(3.0) == 3.0


@pytest.mark.thread_unsafe(reason="starts 50 threads of its own")
def test_short_lived_threads_leave_no_memos_behind():
    """Each of 50 short-lived threads calls with its own context (held by its
    memo of the last context) and arrays of its own dtype (its hash memo):
    when the threads are gone and the functions cleared, nothing of theirs
    is alive."""
    import numpy as np

    comp = ThreadContextCompiler()
    fn = ftjit.jit(lambda x: x, compiler=comp, cache=ftjit.FunctionCache())
    refs = []
    lock = threading.Lock()

    def one(i):
        cfg = _Config(("thread", i))
        with lock:
            refs.append(weakref.ref(cfg))
        comp.local.cur = cfg
        assert fn(np.zeros(2, np.float32)).shape == (2,)

    for i in range(50):
        t = threading.Thread(target=one, args=(i,))
        t.start()
        t.join(30)
        assert not t.is_alive()
    assert len(refs) == 50
    fn.clear_cache()
    assert gc_collect_until(lambda: all(r() is None for r in refs)), sum(r() is not None for r in refs)


@pytest.mark.thread_unsafe(reason="starts 50 threads of its own; clears every cache in the process")
def test_short_lived_threads_keep_no_namedtuple_type_alive():
    """50 threads each flatten a namedtuple type of their own: none stays alive
    once the threads are gone and jax.clear_caches() dropped JAX's caches and
    ftjit's entries (as with jax.jit: JAX's own caches hold the types until then)."""
    jax = pytest.importorskip("jax")  # the JAX compiler asks JAX's registry about each namedtuple type
    if not classes_can_die():
        pytest.skip("classes are immortal on this interpreter once threads have started (3.13t)")
    fn = ftjit.jit(lambda t: t, cache=ftjit.FunctionCache())
    refs = []

    def one(i):
        Point = collections.namedtuple(f"Point{i}", "x y")
        refs.append(weakref.ref(Point))
        fn(Point(1.0, 2.0))

    for i in range(50):
        t = threading.Thread(target=one, args=(i,))
        t.start()
        t.join(30)
    jax.clear_caches()
    assert gc_collect_until(lambda: all(r() is None for r in refs)), sum(r() is not None for r in refs)


def test_a_namedtuple_registered_after_its_first_use_is_flattened_by_its_registration():
    """The registry is asked on every call: a namedtuple type registered as a
    custom pytree node after this thread flattened it as a namedtuple is
    flattened by the registration from then on, as jax.jit does."""
    jax = pytest.importorskip("jax")
    Pair = collections.namedtuple("Pair", "a b")

    def ident(p):
        return p

    fn = ftjit.jit(ident)
    assert fn._signature_of(Pair(1.0, 2.0)) == f"{ident.__qualname__}(Pair(float, float))"
    assert float(fn(Pair(1.0, 2.0)).b) == 2.0
    jax.tree_util.register_pytree_node(Pair, lambda p: ((p.a,), "only-a"), lambda aux, ch: Pair(ch[0], None))
    sig = fn._signature_of(Pair(1.0, 2.0))
    assert sig.startswith(f"{ident.__qualname__}(") and sig.count("float") == 1 and "only-a" in sig, sig
    out = fn(Pair(1.0, 2.0))
    assert out.b is None and float(out.a) == 1.0


# Measures, in a fresh interpreter, what glibc's heap still holds per
# jitted function once every function is gone: only the C++ core allocates
# there (Python objects live in CPython's own allocator: obmalloc arenas on
# 3.11, mimalloc on free-threaded builds), and the same loop without ftjit
# is the control. Two patterns: create-call-drop one at a time (a server
# jitting a closure per request), and a burst of them alive at once,
# measured after a first burst of the same size has grown every table to
# its size, and a one-at-a-time round has let it settle.
_HEAP_SCRIPT = r"""
import ctypes, gc, sys
import ftjit

libc = ctypes.CDLL(None)
class _Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
libc.mallinfo2.restype = _Mallinfo2

def heap():
    m = libc.mallinfo2()
    return m.uordblks + m.hblkhd

def cycle(n, with_ftjit, burst):
    alive = []
    for i in range(n):
        def f(x, i=i):
            return x + i
        if with_ftjit:
            g = ftjit.jit(f, compiler=lambda f, a, k: f)
            assert g(1.0) == 1.0 + i
        else:
            g = (lambda f, a, k: f)(f, (1.0,), {})
            assert g(1.0) == 1.0 + i
        if burst:
            alive.append(g)
        del g, f
    del alive
    ftjit.clear_caches()
    gc.collect()
    gc.collect()

N = int(sys.argv[1])
out = []
for with_ftjit in (False, True):
    cycle(N, with_ftjit, burst=True)   # tables grow to their size
    cycle(N, with_ftjit, burst=False)
    for burst in (False, True):
        before = heap()
        cycle(N, with_ftjit, burst)
        out.append((heap() - before) / N)
print(" ".join(f"{v:.1f}" for v in out))
"""


@pytest.mark.thread_unsafe(reason="runs a subprocess that measures its own heap; one at a time is enough")
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mallinfo2 is glibc's")
def test_a_jitted_function_that_is_dropped_leaves_no_memory_behind():
    """10,000 functions jitted, called once and dropped, one at a time and
    all at once: glibc's heap keeps under 50 bytes per function, as the same
    loop without ftjit does. (It kept ~1,650 bytes per function on 3.13t:
    nanobind makes every function object immortal there, and the weakref
    callback of each jitted function was one, holding its entries' memory;
    and on 3.11 the registries of live entries held dead ones until the next
    jit() swept them.)"""
    proc = subprocess.run([sys.executable, "-c", _HEAP_SCRIPT, "10000"], capture_output=True, text=True,
                          timeout=600, env=child_env())
    assert proc.returncode == 0, proc.stderr
    control_one, control_burst, ftjit_one, ftjit_burst = map(float, proc.stdout.split())
    assert control_one < 50 and control_burst < 50, proc.stdout  # the measurement itself is sound
    assert ftjit_one < 50, f"{ftjit_one} bytes per function kept (one at a time; control {control_one})"
    assert ftjit_burst < 50, f"{ftjit_burst} bytes per function kept (a burst; control {control_burst})"


@pytest.mark.thread_unsafe(reason="counts the core's live objects, which every thread's functions change")
def test_closures_dropped_from_many_threads_leave_no_core_object_behind():
    """16 threads, released together, each jit, call and drop 100 closures (half with a FunctionCache of their
    own, a third kept in a reference cycle) while another thread collects garbage: once they are all dead and
    the threads have ended, the core's live objects are back to their counts before (entries, stores, batch
    queues exactly; nothing retired and unfreed; the threads' indices given back). This is the invariant the
    stress scenario churn now checks on many cores, where RSS alone moved with the allocator (issue 53)."""
    ftjit._core._thread_index()  # this thread's own index, taken before the first count
    before = ftjit._core._live_counts(True)
    shared = ftjit.FunctionCache(capacity=8)
    stop = threading.Event()
    dropped = []

    def compiler(fun, args, kwargs):
        return weak_executable(fun)  # the cache holds executables: one holding fun would keep it alive

    def collector():
        while not stop.wait(0.002):
            gc.collect()

    def work(i):
        refs = []
        for n in range(100):
            payload = bytes(1024)

            def f(x, k, n=n, payload=payload):
                return x * n + k

            own = ftjit.FunctionCache(capacity=2) if n % 2 else None
            jf = ftjit.jit(f, static_argnums=1, compiler=compiler, cache=own or shared)
            for x in (1, 2.0, 3):
                assert jf(x, n % 3) == x * n + n % 3
            if n % 3 == 0:
                f.cycle = (f, jf)
            refs.append(weakref.ref(jf))
            del f, jf, own
        return refs

    gc_thread = threading.Thread(target=collector)
    gc_thread.start()
    try:
        for refs in run_threads(16, work, timeout=120):
            dropped.extend(refs)
    finally:
        stop.set()
        gc_thread.join(30)
    assert not gc_thread.is_alive()
    assert gc_collect_until(lambda: all(r() is None for r in dropped)), "a dropped jitted closure is still alive"
    del shared
    keys = ("entries", "stores", "batch_queues", "retired", "thread_indices_held")
    after = {}

    def settled():
        after.update(ftjit._core._live_counts(True))
        return all(after[k] == (0 if k == "retired" else before[k]) for k in keys)

    assert gc_collect_until(settled), {k: (before[k], after[k]) for k in keys}
    assert after["caches"] == before["caches"]


# 8 threads hit 6 signatures of a function whose cache holds 2: entries are
# evicted while other threads are inside their executables (which yield to
# keep them there). In a fresh interpreter (the live counts are the whole
# process's): every result is checked, every call counted once, and
# afterwards no entry or retired object is left; a forked child then calls.
_EVICTED_UNDER_HITS = r"""
import gc, os, sys, time
import ftjit, ftjit._core as core
sys.path.insert(0, os.environ["FTJIT_TESTS"])
from helpers import CountingCompiler, run_threads

def work(x, k):
    time.sleep(0)  # another thread runs while this call is in flight
    return x * 10 + k

jf = ftjit.jit(work, compiler=CountingCompiler(), cache=ftjit.FunctionCache(capacity=2), static_argnums=1)
calls = 300

def worker(t):
    for i in range(calls):
        k = (t + i) % 6
        assert jf(i, k) == i * 10 + k
    return calls

assert sum(run_threads(8, worker, timeout=120)) == 8 * calls
info = jf.cache_info()
assert info.hits + info.misses + info.waits == 8 * calls, info  # every call counted once
assert info.evictions > 0, info
del jf
gc.collect()
live = core._live_counts(reclaim=True)
assert (live["entries"], live["retired"]) == (0, 0), live
pid = os.fork()
if pid == 0:
    jg = ftjit.jit(lambda x: x + 1, compiler=CountingCompiler())
    os._exit(0 if jg(1) == 2 and jg(2) == 3 else 1)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0
print("ok")
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="forks")
def test_entries_evicted_while_threads_are_inside_them_are_freed_once():
    assert run_script(_EVICTED_UNDER_HITS, env={"FTJIT_TESTS": os.path.dirname(__file__)}) == "ok"
