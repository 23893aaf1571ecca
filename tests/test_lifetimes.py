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
import threading
import weakref

import pytest

import ftjit
from helpers import classes_can_die, gc_collect_until, run_threads


class _Config:
    """A per-model context value: hashable by a key, with a payload."""

    def __init__(self, key, payload=b""):
        self.key, self.payload = key, payload

    def __eq__(self, other):
        return isinstance(other, _Config) and other.key == self.key

    def __hash__(self):
        return hash(self.key)


class _ContextCompiler:
    """A compiler whose context is this thread's ``cur`` (a threading.local)."""

    def __init__(self):
        self.local = threading.local()
        self.calls = 0

    def context(self):
        return getattr(self.local, "cur", None)

    def __call__(self, fun, args, kwargs):
        self.calls += 1
        return fun


@pytest.mark.thread_unsafe(reason="counts the process-wide interned contexts")
def test_a_context_dies_with_the_last_signature_using_it():
    """Five models, each with its own config as the compiler context: once a
    model's function is gone (and this thread's memo moved on), its config is
    collected; the process keeps nothing of it."""
    comp = _ContextCompiler()
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
    comp.local.cur = ("plain", 0)
    other = ftjit.jit(lambda x: x, compiler=comp, cache=ftjit.FunctionCache())
    other(1.0)  # this thread's memo moves on from the last model's config
    del fns
    ftjit.clear_caches()
    assert gc_collect_until(lambda: all(r() is None for r in refs)), [r() is not None for r in refs]
    assert ftjit._core._interned_contexts() <= before + 1  # ("plain", 0), still used by `other`


def test_a_context_whose_eq_raises_fails_only_its_own_calls():
    """Contexts are interned process-wide and compared with ==: a broken
    __eq__ must not make an unrelated context of equal hash fail."""

    class Broken(_Config):
        def __eq__(self, other):
            if other is self:
                return True
            raise ValueError("broken __eq__")

        __hash__ = _Config.__hash__

    comp = _ContextCompiler()
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

    comp = _ContextCompiler()
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
