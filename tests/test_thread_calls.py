"""The JAX compiler's call object of the whole function per thread
(CompilerHooks.thread_call, issue 55's stage 2): a hit is one call into the
thread's jaxlib call object, the store is the second level behind its miss,
and the rules that keep that sound: exact counts, statics and node data it
may keep, re-entrant calls, a miss that raises, clear_cache(),
jax.clear_caches() and fork.

Thread tests start on a Barrier (helpers.run_threads), join with a timeout
and re-raise worker exceptions.
"""

import subprocess
import sys
import threading

import numpy as np

import pytest

import ftjit
import ftjit._jax_calls
from helpers import child_env, run_script, run_threads

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

pytestmark = pytest.mark.timeout(300)

SAMPLE_EVERY = 64  # ThreadCall::kSampleEvery
MAX_DROPS = 8  # ThreadCall::kMaxDrops


def state(jf):
    return jf._thread_call_state()


def test_a_hit_is_one_call_into_the_threads_call_object_and_counted_exactly():
    jf = ftjit.jit(lambda x, y: x + y)
    x = jnp.arange(4.0)
    for _ in range(10):
        out = jf(x, x)
    assert np.asarray(out).tolist() == [0.0, 2.0, 4.0, 6.0]
    s = state(jf)
    assert s["enabled"] is True and s["made"] is True
    assert (s["calls"], s["to_core"], s["drops"], s["bypass"]) == (10, 1, 0, False)
    info = jf.cache_info()
    assert (info.hits, info.misses, info.compiles) == (9, 1, 1)


def _store_path_only(jf, args, expected):
    assert np.asarray(jf(*args)).tolist() == expected
    assert np.asarray(jf(*args)).tolist() == expected
    assert (state(jf)["enabled"], state(jf)["calls"]) == (False, 0)
    info = jf.cache_info()
    assert (info.hits, info.misses, info.compiles) == (1, 1, 1)


def test_the_off_switch(monkeypatch):
    monkeypatch.setattr(ftjit._jax_calls, "THREAD_CALLS", False)
    _store_path_only(ftjit.jit(lambda x: x + 1), (jnp.ones(2),), [2.0, 2.0])


def test_negative_static_argnums_keep_a_function_on_the_stores_path():
    def f(*a):  # positional varargs: a negative static position resolves per call, by the number of arguments
        return a[0] * a[-1]

    _store_path_only(ftjit.jit(f, static_argnums=-1), (jnp.ones(2), 3), [3.0, 3.0])


def test_per_signature_hits_are_sampled_and_the_functions_stay_exact():
    jf = ftjit.jit(lambda x: x * 3)
    x = jnp.ones(2)
    calls = 1 + 3 * SAMPLE_EVERY + 5
    for _ in range(calls):
        jf(x)
    info = jf.cache_info()
    assert (info.hits, info.misses, info.compiles) == (calls - 1, 1, 1)
    # The first call compiles; every 64th call (the 64th, 128th, 192nd) finds its entry and counts 64.
    assert [s.hits for s in jf.signatures()] == [3 * SAMPLE_EVERY]


def test_counts_stay_exact_across_threads():
    jf = ftjit.jit(lambda x, y: x * y)
    x = jnp.arange(3.0)
    jf(x, x)
    n, k = 8, 300

    def work(i):
        for _ in range(k):
            assert np.asarray(jf(x, x)).tolist() == [0.0, 1.0, 4.0]

    run_threads(n, work, timeout=120)
    info = jf.cache_info()
    assert (info.hits, info.misses, info.compiles, info.waits) == (n * k, 1, 1, 0)


def test_builtin_statics_are_keyed_by_the_call_object_by_position_and_by_name():
    jf = ftjit.jit(lambda x, n: x * n, static_argnums=1)
    x = jnp.ones(2)
    for n in (2, 3, 2, 3, 2):
        assert np.asarray(jf(x, n)).tolist() == [float(n)] * 2
    assert (state(jf)["to_core"], state(jf)["drops"]) == (2, 0)
    assert np.asarray(jf(x, n=2)).tolist() == [2.0, 2.0]
    assert np.asarray(jf(x, n=2)).tolist() == [2.0, 2.0]
    assert (state(jf)["to_core"], state(jf)["drops"]) == (3, 0)  # by name: the call object's own key
    assert np.asarray(jf(x, True)).tolist() == [1.0, 1.0]  # True is not 1 for a static
    assert jf.cache_info().misses == len(jf.signatures())


def test_a_static_whose_eq_calls_the_same_function():
    """Such a static never reaches the call object (only builtin statics do): its calls take the store's path,
    whose map compares outside its lock, and the call made from inside __eq__ is served as any other."""
    x = jnp.ones(2)
    inner = []

    class Key:
        def __init__(self, v):
            self.v = v

        def __hash__(self):
            return 7

        def __eq__(self, other):
            inner.append(np.asarray(jf(x, 1)).tolist())  # re-enters the same function
            return isinstance(other, Key) and other.v == self.v

    jf = ftjit.jit(lambda a, k: a + (k if isinstance(k, int) else k.v), static_argnums=1)
    assert np.asarray(jf(x, Key(1))).tolist() == [2.0, 2.0]
    assert np.asarray(jf(x, Key(1))).tolist() == [2.0, 2.0]
    assert np.asarray(jf(x, Key(2))).tolist() == [3.0, 3.0]
    assert inner and all(r == [2.0, 2.0] for r in inner)
    info = jf.cache_info()
    assert info.compiles == 3  # Key(1), 1 (from __eq__), Key(2)
    s = state(jf)
    assert s["to_core"] == 1 and s["calls"] == len(inner)  # only the int calls went through the call object


def test_a_node_whose_flatten_calls_the_same_function_inside_the_call_object():
    """jaxlib flattens the arguments inside the thread's call object: a call made from there takes the store's
    path (the object is never entered twice)."""
    seen = []

    class Box:
        def __init__(self, a):
            self.a = a

    def flatten(b):
        if not seen:
            seen.append(None)
            seen.append(np.asarray(jf(jnp.full(2, 5.0))).tolist())
        return (b.a,), None

    jax.tree_util.register_pytree_node(Box, flatten, lambda aux, children: Box(children[0]))
    jf = ftjit.jit(lambda t: jax.tree_util.tree_leaves(t)[0] * 2)
    x = jnp.ones(2)
    assert np.asarray(jf(Box(x))).tolist() == [2.0, 2.0]
    assert np.asarray(jf(Box(x))).tolist() == [2.0, 2.0]
    assert seen[1] == [10.0, 10.0]
    assert jf.cache_info().compiles == 2


def test_node_data_that_is_no_builtin_value_is_dropped_then_bypassed():
    class Meta:
        def __eq__(self, other):
            return isinstance(other, Meta)

        def __hash__(self):
            return 1

    class Node:
        def __init__(self, a):
            self.a = a

    jax.tree_util.register_pytree_node(Node, lambda n: ((n.a,), Meta()), lambda aux, ch: Node(ch[0]))
    jf = ftjit.jit(lambda t: t.a + 1)
    x = jnp.ones(2)
    for _ in range(MAX_DROPS + 4):
        assert np.asarray(jf(Node(x))).tolist() == [2.0, 2.0]
    s = state(jf)
    assert (s["drops"], s["bypass"], s["to_core"], s["calls"]) == (MAX_DROPS, True, MAX_DROPS, MAX_DROPS)
    info = jf.cache_info()
    assert (info.hits, info.misses, info.compiles) == (MAX_DROPS + 3, 1, 1)


def test_a_miss_that_raises_replaces_the_threads_call_object():
    def f(x):
        if x.shape[0] == 3:
            raise ValueError("three")
        return x + 1

    jf = ftjit.jit(f)
    assert np.asarray(jf(jnp.ones(2))).tolist() == [2.0, 2.0]
    first = state(jf)["call"]
    with pytest.raises(ValueError, match="^three"):
        jf(jnp.ones(3))
    assert state(jf)["made"] is False
    assert np.asarray(jf(jnp.ones(2))).tolist() == [2.0, 2.0]
    s = state(jf)
    assert s["made"] is True and s["call"] is not first
    with pytest.raises(ValueError, match="^three"):  # raised again: no signature kept that skips the core
        jf(jnp.ones(3))
    assert np.asarray(jf(jnp.ones(2))).tolist() == [2.0, 2.0]
    info = jf.cache_info()
    assert (info.compiles, info.failures, info.misses) == (1, 2, 3)


def test_clear_cache_then_a_recompile_in_every_thread():
    jf = ftjit.jit(lambda x: x - 1)
    x = jnp.ones(2)
    n = 6
    barrier = threading.Barrier(n)

    def work(i):
        assert np.asarray(jf(x)).tolist() == [0.0, 0.0]
        before = state(jf)["call"]
        barrier.wait(60)
        if i == 0:
            jf.clear_cache()
        barrier.wait(60)
        assert np.asarray(jf(x)).tolist() == [0.0, 0.0]
        after = state(jf)["call"]
        return before is not None and after is not None and after is not before

    assert run_threads(n, work, timeout=120) == [True] * n
    info = jf.cache_info()
    assert (info.compiles, info.misses, info.hits + info.waits) == (2, 2, n * 2 - 2)
    assert len(jf.signatures()) == 1


@pytest.mark.thread_unsafe(reason="jax.clear_caches() clears every function's caches, other threads' tests' too")
def test_jax_clear_caches_racing_hits():
    jf = ftjit.jit(lambda x: x * 2 + 1)
    x = jnp.arange(3.0)
    assert np.asarray(jf(x)).tolist() == [1.0, 3.0, 5.0]

    def work(i):
        if i == 0:
            for _ in range(40):
                jax.clear_caches()
            return
        for _ in range(400):
            assert np.asarray(jf(x)).tolist() == [1.0, 3.0, 5.0]

    run_threads(5, work, timeout=240)
    before = jf.cache_info()
    assert before.compiles == before.misses >= 1  # jax.clear_caches() clears ftjit's caches too
    jax.clear_caches()
    assert np.asarray(jf(x)).tolist() == [1.0, 3.0, 5.0]
    assert np.asarray(jf(x)).tolist() == [1.0, 3.0, 5.0]
    info = jf.cache_info()
    assert (info.compiles, info.misses, info.hits) == (before.compiles + 1, before.misses + 1, before.hits + 1)


def test_eager_mode_goes_to_the_fallback_through_the_call_object():
    jf = ftjit.jit(lambda x: x + 1)
    x = jnp.ones(2)
    jf(x)
    with jax.disable_jit():
        out = jf(x)
    assert np.asarray(out).tolist() == [2.0, 2.0]
    s = state(jf)
    assert (s["calls"], s["to_core"]) == (2, 2)
    info = jf.cache_info()
    assert (info.hits, info.misses, info.compiles) == (0, 1, 1)


@pytest.mark.parametrize("bound", ["max_signatures", "cache capacity"])
def test_each_threads_call_object_keeps_what_the_store_may_at_most(bound):
    if bound == "max_signatures":
        jf = ftjit.jit(lambda x: x + 1, max_signatures=3, on_excess="raise", cache=ftjit.FunctionCache())
    else:
        jf = ftjit.jit(lambda x: x + 1, cache=ftjit.FunctionCache(3))
    for _ in range(2):
        for n in (1, 2, 3):
            assert np.asarray(jf(jnp.ones(n))).tolist() == [2.0] * n
    assert state(jf)["to_core"] == 3  # all three kept
    if bound == "max_signatures":
        with pytest.raises(ftjit.RecompileLimitError):
            jf(jnp.ones(4))
        jf.clear_cache()
        for n in (1, 2, 3):
            jf(jnp.ones(n))
        assert state(jf)["to_core"] == 7  # a fresh object after the clear
        return
    jf(jnp.ones(4))  # a fourth: the object drops its least recently used, (1,)
    assert state(jf)["to_core"] == 4
    jf(jnp.ones(2))
    assert state(jf)["to_core"] == 4
    assert np.asarray(jf(jnp.ones(1))).tolist() == [2.0]
    assert state(jf)["to_core"] == 5


def test_a_callback_outside_a_call_is_an_error():
    with pytest.raises(RuntimeError, match="a thread_call call object called its miss outside of a call"):
        ftjit._core._thread_call_miss(1)
    with pytest.raises(RuntimeError, match="a thread_call call object called its eager outside of a call"):
        ftjit._core._thread_call_eager(1)


def test_thread_call_needs_context_in_executable():
    with pytest.raises(TypeError, match=r"^CompilerHooks.thread_call needs context_in_executable"):
        ftjit.CompilerHooks(thread_call=lambda miss, eager, nums, names, capacity: None)


FORK_INSIDE_A_THREAD_CALLS_MISS = """
import logging, os, signal, sys, threading, warnings
warnings.simplefilter("ignore")  # fork() of a multi-threaded process
import jax, jax.numpy as jnp, numpy as np
import ftjit

inside, go = threading.Event(), threading.Event()
parent_objects = []


class Stall(logging.Handler):
    # Holds the parent thread in its compile's log line: inside its call object's miss, after JAX compiled.
    def emit(self, record):
        if record.threadName == "parent" and record.getMessage().startswith("compiled"):
            inside.set()
            go.wait(60)


logging.getLogger("ftjit").addHandler(Stall())
logging.getLogger("ftjit").setLevel(logging.INFO)
f = ftjit.jit(lambda v: v * 2)
x = jnp.ones(3)
f(x)

def parent_thread():
    f(x)
    parent_objects.append(f._thread_call_state()["call"])
    with jax.default_matmul_precision("highest"):
        f(x)  # its call object misses this context: the core compiles it, this thread inside the object's miss

t = threading.Thread(target=parent_thread, name="parent", daemon=True)
t.start()
assert inside.wait(60)
pid = os.fork()
if pid == 0:  # only the forking thread lives on; the next thread here takes the parent thread's index
    signal.alarm(60)  # a hang ends the child (its exit code is the signal's)
    out = []

    def child_thread():
        with jax.default_matmul_precision("highest"):
            out.append(np.asarray(f(x)).tolist())
        s = f._thread_call_state()
        out.append(s["made"] and s["call"] is not parent_objects[0])

    c = threading.Thread(target=child_thread)
    c.start()
    c.join(50)
    os._exit(0 if out == [[2.0, 2.0, 2.0], True] and np.asarray(f(x)).tolist() == [2.0, 2.0, 2.0] else 3)
go.set()
t.join(60)
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status), parent_objects[0] is not None)
"""


def test_a_forked_child_inherits_no_call_object_a_parent_thread_was_inside():
    import os

    if not hasattr(os, "fork"):
        pytest.skip("needs os.fork")
    assert run_script(FORK_INSIDE_A_THREAD_CALLS_MISS) == "child 0 True"


FIRST_CALL_DEFERS = """
import sys, warnings
warnings.simplefilter("error", RuntimeWarning)  # a failed check of the call objects would warn
import jax, jax.numpy as jnp, ftjit
f = ftjit.jit(lambda x: x + 1)
x = jnp.ones(2)
if sys.argv[1] == "disable_jit":
    with jax.disable_jit():
        first = f(x)
else:
    first = jax.jit(lambda y: f(y))(x)
assert first.tolist() == [2.0, 2.0]
assert f._thread_call_state()["made"] is False  # not made for a call that defers
for _ in range(3):
    assert f(x).tolist() == [2.0, 2.0]
g = ftjit.jit(lambda x: x * 2)
assert g(x).tolist() == [2.0, 2.0]
print(f._thread_call_state()["made"], g._thread_call_state()["made"], f._thread_call_state()["bypass"])
"""


@pytest.mark.parametrize("mode", ["disable_jit", "trace"])
def test_a_first_call_that_defers_leaves_the_call_objects_on(mode):
    """The process-wide checks of jaxlib's call objects run at a thread's first call that makes one: never
    under jax.disable_jit() or inside a trace, where they would fail and turn the objects off for good."""
    out = subprocess.run([sys.executable, "-c", FIRST_CALL_DEFERS, mode], capture_output=True, text=True,
                         timeout=240, env=child_env())
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip() == "True True False"
