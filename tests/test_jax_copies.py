"""The JAX compiler's executables per thread (ThreadExecutables over jaxlib's
C++ call object): the hit path reads no JAX config, the call object checks
jax.jit's own key, and ftjit's compile-once machinery serves its misses.

Thread tests start on a Barrier (helpers.run_threads), join with a timeout
and re-raise worker exceptions.
"""

import dataclasses
import gc
import os
import threading
import weakref

import numpy as np

import pytest

import ftjit
import ftjit._jax_calls
from helpers import gc_collect_until, run_script, run_threads

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

pytestmark = pytest.mark.timeout(300)


class _StorePath(ftjit.JaxCompiler):
    """The JAX compiler without a call object of the whole function per thread (test_thread_calls.py tests
    those): every call reaches the core, which calls the copies. Per function, so tests here run in many
    threads at once (no global switch flipped)."""

    def hooks(self, fun):
        return dataclasses.replace(super().hooks(fun), thread_call=None)


def jit(fun, **options):
    return ftjit.jit(fun, compiler=_StorePath(), **options)


def _counting_copies(monkeypatch):
    """Records a weak reference to every copy the JAX compiler's ThreadExecutables make."""
    made = []
    real = ftjit._jax_calls._copies

    def copies(compiled, params, takes_leaves):
        found = real(compiled, params, takes_leaves)
        if found is None:
            return None

        def make(miss, eager):
            copy = found.make(miss, eager)
            made.append(weakref.ref(copy))
            return copy

        return found._replace(make=make)

    monkeypatch.setattr(ftjit._jax_calls, "_copies", copies)
    return made


def test_the_jax_compilers_executables_are_thread_executables():
    jf = jit(lambda x, y: x + y)
    x = jnp.arange(4.0)
    assert np.asarray(jf(x, x)).tolist() == [0.0, 2.0, 4.0, 6.0]
    found = ftjit._jax_calls.executable_for(*_compiled_and_args(x))
    assert isinstance(found, ftjit.ThreadExecutables) and found.takes_leaves is True


def _compiled_and_args(x):
    compiled = jax.jit(lambda a, b: a + b).lower(x, x).compile()
    return compiled, (x, x), {}, (x, x)


@pytest.mark.thread_unsafe(reason="patches the JAX compiler's module to count its copies")
def test_twelve_threads_entering_enable_x64_at_once_compile_once(monkeypatch):
    made = _counting_copies(monkeypatch)
    jf = jit(lambda x: x * 3 + 1, cache=ftjit.FunctionCache())
    assert np.asarray(jf(np.arange(4))).dtype == np.int32
    assert jf.cache_info().compiles == 1

    def call(i):
        with jax.enable_x64(True):
            out = np.asarray(jf(np.arange(4) + i))
        return out.dtype, out.tolist()

    out = run_threads(12, call)
    assert out == [(np.dtype(np.int64), [(k + i) * 3 + 1 for k in range(4)]) for i in range(12)]
    info = jf.cache_info()
    assert (info.compiles, info.misses, info.size, info.failures) == (2, 2, 2, 0)
    assert info.hits + info.waits == 11  # the 12 calls but the one that compiled
    # Each thread runs copies of its own: one per signature it called (the main thread's of the first).
    assert len(made) <= 1 + 2 * 12


@pytest.mark.thread_unsafe(reason="patches the JAX compiler's module to count its copies")
def test_copies_die_with_clear_cache_while_threads_still_hold_their_indices(monkeypatch):
    made = _counting_copies(monkeypatch)
    jf = jit(lambda x: x + 1, cache=ftjit.FunctionCache())
    x = jnp.arange(3.0)
    all_called = threading.Barrier(4)

    def work(i):
        out = [jf(x) for _ in range(5)]
        all_called.wait(30)  # alive at once: four indices, four copies
        return out

    run_threads(4, work)
    assert len(made) == 4
    jf.clear_cache()
    assert gc_collect_until(lambda: all(r() is None for r in made)), "a copy outlived clear_cache()"
    assert np.asarray(jf(x)).tolist() == [1.0, 2.0, 3.0]
    assert jf.cache_info().compiles == 2


def test_disable_jit_runs_the_function_eagerly_through_the_copy():
    traces = []

    def f(x):
        traces.append(type(x).__name__)
        return x * 2

    jf = jit(f, cache=ftjit.FunctionCache())
    x = jnp.arange(3.0)
    jf(x)
    jf(x)
    before = jf.cache_info()
    with jax.disable_jit():
        out = jf(x)
    assert np.asarray(out).tolist() == [0.0, 2.0, 4.0]
    assert traces[-1] == "ArrayImpl"  # run eagerly, on the array itself (not traced)
    assert jf.cache_info() == before  # nothing counted


def test_a_call_inside_a_trace_goes_to_jax_jit_with_concrete_arguments():
    """A JAX trace active in the thread changes jax.jit's key (trace_state):
    the copy misses and ftjit calls the function's jax.jit, which stages it
    into the trace (closed-over tracers are never compiled into an entry)."""
    jf = jit(lambda x: x + 1, cache=ftjit.FunctionCache())
    x = jnp.arange(3.0)
    jf(x)

    def outer(y):
        return jf(x) * y  # concrete x, inside outer's trace

    assert np.asarray(jax.jit(outer)(2.0)).tolist() == [2.0, 4.0, 6.0]
    info = jf.cache_info()
    assert (info.compiles, info.size) == (1, 1)


TRACE_CONTEXT_ONLY = """
    import jaxlib._jax as _jax
    records = {}
    Base = _jax.config.Config

    class Recording(Base):  # sees every config jax makes, with its flags (include_in_jaxpr_eqn_ctx: jax 0.12)
        def __init__(self, name, value, *, include_in_jit_key=False, include_in_trace_context=False, **rest):
            super().__init__(name, value, include_in_jit_key=include_in_jit_key,
                             include_in_trace_context=include_in_trace_context, **rest)
            records[name] = (include_in_jit_key, include_in_trace_context)

    _jax.config.Config = Recording
    import jax, ftjit._jax_hooks as h
    print(sorted(n for n, (key, trace) in records.items() if trace and not key))
    print(sorted(h.unkeyed_names(h._jax_version())))
    print(sorted(n for n, (key, trace) in records.items() if key and not trace and n != "trace_state"))
    print(sorted(h._extra_name(e.arg) for e in h.build_hooks()["context_hooks"].extras))
    print(h._jax_version() <= h.NEWEST_CHECKED_JAX)
"""


@pytest.mark.thread_unsafe(reason="spawns an interpreter")
def test_the_configs_in_only_one_of_trace_context_and_jax_jits_key_are_the_documented_ones():
    """Against the running JAX: what trace_context() has and jax.jit's key has
    not is what the core leaves out (unkeyed); what the key has and
    trace_context() has not (trace_state aside: the probe defers active traces)
    is what it keys on as extras. A JAX release that moves a config fails this:
    check it, then raise NEWEST_CHECKED_JAX."""
    trace_only, unkeyed, key_only, extras, checked = run_script(TRACE_CONTEXT_ONLY).splitlines()
    assert checked == "True", f"jax {jax.__version__} is newer than ftjit._jax_hooks.NEWEST_CHECKED_JAX"
    assert trace_only == unkeyed
    assert key_only == extras


@pytest.mark.parametrize("version, gumbel_unkeyed", [
    ((0, 10, 2), True), ((0, 12, 0, 1), True), ((0, 12, 1), False), ((0, 13, 0), False)])
def test_unkeyed_configs_follow_the_jax_release(version, gumbel_unkeyed):
    names = ftjit._jax_hooks.unkeyed_names(version)
    assert ("jax_high_dynamic_range_gumbel" in names) is gumbel_unkeyed
    assert "jax_disable_jit" in names
    # Past the newest release checked, nothing else is left out of the key (the safe side).
    assert (names == {"jax_disable_jit"}) is (version > ftjit._jax_hooks.NEWEST_CHECKED_JAX)


@pytest.mark.thread_unsafe(reason="replaces jax.__version__ for a moment")
@pytest.mark.parametrize("text, numbers", [
    ("0.10.2", (0, 10, 2)), ("0.12.0.1", (0, 12, 0, 1)), ("0.13.0.dev20261201", (0, 13, 0)), ("0.14rc1", (0, 14))])
def test_the_jax_release_is_read_from_its_version_text(monkeypatch, text, numbers):
    monkeypatch.setattr(jax, "__version__", text)
    assert ftjit._jax_hooks._jax_version() == numbers


def _traces_under_a_config_change(state):
    """Traces of jax.jit and of ftjit.jit of one function, called before and
    under a change of ``state`` alone; and ftjit's compiles."""
    traces = {"jax": 0, "ftjit": 0}

    def make(side):
        def f(x):
            traces[side] += 1
            return x + 1

        return f

    jj, jf = jax.jit(make("jax")), jit(make("ftjit"), cache=ftjit.FunctionCache())
    x = jnp.arange(3.0)
    jj(x), jf(x)
    with state(not state.value):
        jj(x), jf(x)
    return traces, jf.cache_info().compiles


def test_a_config_outside_jax_jits_key_recompiles_nothing_as_with_jax_jit():
    """jax_mutable_array_checks is in trace_context() but not in jax.jit's key
    (in every JAX release checked): changing it alone recompiles neither
    jax.jit nor ftjit.jit."""
    from jax._src import config as jax_config

    traces, compiles = _traces_under_a_config_change(jax_config.mutable_array_checks)
    assert (traces, compiles) == ({"jax": 1, "ftjit": 1}, 1)
    gc.collect()


def test_jax_high_dynamic_range_gumbel_recompiles_as_with_the_running_jax_jit():
    """jax_high_dynamic_range_gumbel left jax.jit's key out until jax 0.12.1,
    which keys on it: ftjit.jit recompiles exactly when jax.jit does."""
    from jax._src import config as jax_config

    traces, compiles = _traces_under_a_config_change(jax_config.use_high_dynamic_range_gumbel)
    assert traces["ftjit"] == traces["jax"] == compiles
    keyed = "jax_high_dynamic_range_gumbel" not in ftjit._jax_hooks.unkeyed_names(ftjit._jax_hooks._jax_version())
    assert compiles == (2 if keyed else 1)
    gc.collect()


# --- issue 40's findings: each a regression test that failed at a5adb19 ----------

REENTRANT_HANDLER = """
    import logging
    import numpy as np, jax, jax.numpy as jnp
    import ftjit
    ftjit._jax_calls.THREAD_CALLS = False  # the copies: every call reaches the core (this process only)

    jf = ftjit.jit(lambda x: x + jnp.ones((2, 3), x.dtype))
    x = np.ones(3, np.float32)
    jf(x)
    busy = []

    class Handler(logging.Handler):
        def emit(self, record):  # runs inside the outer call, on its thread
            if busy:
                return
            busy.append(1)
            try:
                with jax.numpy_rank_promotion("raise"):
                    jf(x)
            except ValueError:
                busy.append("raised")

    logging.getLogger("ftjit").addHandler(Handler())
    logging.getLogger("ftjit").setLevel(logging.INFO)
    with jax.enable_x64(True):
        out = jf(x)
    print(out.dtype, np.asarray(out).tolist(), busy)
"""


@pytest.mark.thread_unsafe(reason="spawns an interpreter")
def test_a_logging_handler_calling_under_another_config_cannot_free_the_copy_an_outer_call_runs():
    """Finding 1: the outer call (under x64) runs this thread's copy, whose
    miss compiles and logs; the handler calls the same function on the same
    thread under another config, which fails and drops the thread's copy of
    that entry. The outer call holds its copy until it returns (it was
    borrowed: a segfault under PYTHONMALLOC=debug)."""
    out = run_script(REENTRANT_HANDLER, env={"PYTHONMALLOC": "debug"})
    assert out == "float32 [[2.0, 2.0, 2.0], [2.0, 2.0, 2.0]] [1, 'raised']"


def _gumbel_globally(on):
    jax.config.update("jax_high_dynamic_range_gumbel", on)


@pytest.mark.thread_unsafe(reason="changes a JAX config for the whole process")
def test_a_config_outside_jax_jits_key_gives_one_answer_in_every_thread_as_with_jax_jit():
    """Finding 2: after jax_high_dynamic_range_gumbel changes (globally), a
    thread that never called the function (a new one, and twenty alive at
    once: more than the old core's sixteen shards) gets the program jax.jit
    gives, as the main thread does; with key-array arguments too. Up to jax
    0.12.0 that is the program compiled before (the config is not in jax.jit's
    key: nothing recompiles); from 0.12.1, the new one (one recompile each)."""

    def f(x):
        return jax.random.gumbel(jax.random.key(0), (3,)) + x

    def g(key, x):
        return jax.random.gumbel(key, (3,)) + x

    jf, jg = jit(f, cache=ftjit.FunctionCache()), jit(g, cache=ftjit.FunctionCache())
    jj = jax.jit(f)
    x, key = np.zeros(3, np.float32), jax.random.key(1)
    before_f, before_g, before_jax = (np.asarray(jf(x)).tolist(), np.asarray(jg(key, x)).tolist(),
                                      np.asarray(jj(x)).tolist())
    assert before_f == before_jax
    _gumbel_globally(True)
    try:
        changed = (np.asarray(jax.jit(lambda v: f(v))(x)).tolist(),  # new functions trace under the new value
                   np.asarray(jax.jit(lambda k, v: g(k, v))(key, x)).tolist())
        assert changed[0] != before_f  # (so the test can tell the programs apart)
        keyed = np.asarray(jj(x)).tolist() == changed[0]  # jax.jit recompiled: its key holds the config
        assert keyed or np.asarray(jj(x)).tolist() == before_jax
        all_in = threading.Barrier(20)

        def call(i):
            first = np.asarray(jf(x)).tolist()  # the first call takes the thread's index
            all_in.wait(30)  # twenty threads hold one at once
            return (first, np.asarray(jg(key, x)).tolist(), np.asarray(jj(x)).tolist())

        out = run_threads(20, call, timeout=120)
        here = (np.asarray(jf(x)).tolist(), np.asarray(jg(key, x)).tolist(), np.asarray(jj(x)).tolist())
    finally:
        _gumbel_globally(False)
    want = (changed[0], changed[1], changed[0]) if keyed else (before_f, before_g, before_jax)
    assert out == [want] * 20
    assert here == want
    assert (jf.cache_info().compiles, jg.cache_info().compiles) == ((2, 2) if keyed else (1, 1))


@pytest.mark.thread_unsafe(reason="resets the JAX compiler's once-per-process check")
def test_the_copies_check_passes_under_a_transfer_guard_and_a_failure_is_said_once(monkeypatch):
    """Finding 3: the check that jaxlib's call objects can be copied per
    thread ran with a host-to-device transfer, which jax.transfer_guard
    ("disallow") refuses: copies were then off for the whole process,
    silently. It runs on a device array under the guard "allow" now; and a
    check that does fail says so once."""
    monkeypatch.setattr(ftjit._jax_calls, "_copy_parts_cache", [])
    x = jnp.arange(3.0)
    with jax.transfer_guard("disallow"):
        jf = jit(lambda v: v * 2, cache=ftjit.FunctionCache())
        y = jf(x)
        assert ftjit._jax_calls._copy_parts_cache[0] is not None
        assert isinstance(ftjit._jax_calls.executable_for(*_compiled_and_args(x)), ftjit.ThreadExecutables)
    # Read after the guard: on an accelerator a read to the host is a transfer it refuses (on the CPU it is none).
    assert np.asarray(y).tolist() == [0.0, 2.0, 4.0]
    monkeypatch.setattr(ftjit._jax_calls, "_copy_parts_cache", [])
    monkeypatch.setattr(ftjit._jax_calls, "_copies_work", lambda parts: "the check's reason")
    with pytest.warns(RuntimeWarning, match=r"per-thread call objects .* failed ftjit's check, so every thread calls "
                                            r"one shared call object .*: the check's reason"):
        assert ftjit._jax_calls._copy_parts() is None
    assert ftjit._jax_calls._copy_parts() is None  # said once


FORK_INSIDE_A_COPYS_MISS = """
import logging, os, signal, sys, threading, warnings
warnings.simplefilter("ignore")  # fork() of a multi-threaded process
import jax, jax.numpy as jnp, numpy as np
import ftjit
ftjit._jax_calls.THREAD_CALLS = False  # the copies: every call reaches the core (this process only)

inside, go = threading.Event(), threading.Event()


class Stall(logging.Handler):
    # Holds the parent thread in its compile's log line: inside the copy's miss, after JAX traced and compiled
    # (a fork inside a trace would leave JAX's own trace cache waiting on a dead thread, jax.jit's as much).
    def emit(self, record):
        if record.threadName == "parent" and record.getMessage().startswith("compiled"):
            inside.set()
            go.wait(60)


logger = logging.getLogger("ftjit")
logger.addHandler(Stall())
logger.setLevel(logging.INFO)
f = ftjit.jit(lambda v: v * 2)
x = jnp.ones(3)
f(x)

def parent_thread():
    f(x)  # this thread's copy (its index: 1), the default context
    with jax.default_matmul_precision("highest"):
        f(x)  # the copy misses that context: the core compiles it, this thread inside the copy's miss

t = threading.Thread(target=parent_thread, name="parent", daemon=True)
t.start()
assert inside.wait(60)
pid = os.fork()
if pid == 0:  # only the forking thread lives on; the next thread here takes index 1
    signal.alarm(60)  # a hang ends the child (its exit code is the signal's)
    out = []

    def child_thread():
        with jax.default_matmul_precision("highest"):
            out.append(np.asarray(f(x)).tolist())

    c = threading.Thread(target=child_thread)
    c.start()
    c.join(50)
    os._exit(0 if out == [[2.0, 2.0, 2.0]] else 3)
go.set()
t.join(60)
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_inherits_no_copy_a_parent_thread_was_inside():
    """Issue 46, finding 1: a thread of the child took a parent thread's index and with it that thread's copy;
    the parent thread was inside the copy's miss at the fork, so the child's call waited forever in jaxlib (or
    took it for its own recursion). A child now starts with no copy, redirect or in-flight count of another
    thread: its thread makes a copy of its own."""
    assert run_script(FORK_INSIDE_A_COPYS_MISS) == "child 0"
