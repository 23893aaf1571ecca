"""ftjit.batched: many threads, one example each, one call of a batch.

The protocol (queues, leaders and followers, timeouts, errors, interrupts, a dropped function) is tested
without JAX through stress.batch_runner's RowsRunner, whose batch is one jitted call of the stacked examples:
these run under ThreadSanitizer too (dev.sh tsan-ft). Then the JAX path: 64 threads with exact results,
shapes and statics batched apart, the warm-up of every size.

Thread tests start on a Barrier (helpers.run_threads), join with a timeout and re-raise worker exceptions.
"""

import _thread
import gc
import threading
import time
import weakref

import pytest

import ftjit
from ftjit._batched import BatchedFunction
from helpers import gc_collect_until, run_threads
from stress.batch_runner import RowsRunner

pytestmark = pytest.mark.timeout(120)


def _held(release: threading.Event):
    """fn(x) = 2x; a negative x holds its call until `release` (so that calls queue behind it)."""

    def double(x):
        if x < 0:
            assert release.wait(60), "never released"
        return 2 * x

    return double


def _batched(fn, max_wait=10.0, max_batch=16, runner_options=None, **options):
    runner = RowsRunner(fn, **(runner_options or {}))
    b = BatchedFunction(fn, max_batch=max_batch, max_wait=max_wait, sizes=None, to_host=False, timeout=None,
                        static_argnums=(), static_argnames=(), runner=runner, **options)
    return b, runner


def _wait_for(predicate, what, seconds=30.0):
    end = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.002)


def _in_background(fn, *args, **kwargs):
    """Runs fn in a daemon thread; returns a join() that gives its result or raises its exception."""
    box = {}

    def body():
        try:
            box["out"] = fn(*args, **kwargs)
        except BaseException as error:  # noqa: BLE001 - handed to join()
            box["error"] = error

    t = threading.Thread(target=body, daemon=True)
    t.start()

    def join(timeout=30.0):
        t.join(timeout)
        assert not t.is_alive(), "the call did not return"
        if "error" in box:
            raise box["error"]
        return box["out"]

    return join


# --- the protocol, without JAX -------------------------------------------------------------------------------


def test_a_lone_call_is_not_held_back():
    """Nothing forming and nothing running: the call goes at once, whatever max_wait (10 s here)."""
    b, runner = _batched(lambda x: 2 * x, max_wait=10.0)
    start = time.monotonic()
    assert [b(i) for i in range(5)] == [0, 2, 4, 6, 8]
    assert time.monotonic() - start < 5.0  # held back, it would take 50 s
    info = b.batch_info()
    assert (info.calls, info.alone, info.batches, info.padded_rows, info.timeouts) == (5, 5, 0, 0, 0)
    assert runner.batches == []


def test_calls_arriving_while_one_runs_form_one_batch_that_starts_when_it_ends():
    release = threading.Event()
    b, runner = _batched(_held(release), max_batch=16, max_wait=10.0)
    first = _in_background(b, -1)
    _wait_for(lambda: b.batch_info().calls == 1, "the first call")
    waiting = [_in_background(b, i) for i in range(1, 11)]
    _wait_for(lambda: b.batch_info().calls == 11, "ten calls queued")
    assert runner.batches == []  # nothing ran while the device (the first call) was busy
    release.set()
    assert first() == -2
    assert [j() for j in waiting] == [2 * i for i in range(1, 11)]
    assert len(runner.batches) == 1 and sorted(runner.batches[0]) == list(range(1, 11))
    info = b.batch_info()
    assert (info.calls, info.alone, info.batches, info.padded_rows) == (11, 1, 1, 16 - 10)
    assert info.sizes == ((10, 1),) and info.mean_batch_size == 10.0
    assert runner.many.cache_info().compiles == 1  # the size-16 program, once


def test_a_full_batch_starts_without_waiting_for_the_running_one():
    release = threading.Event()
    b, runner = _batched(_held(release), max_batch=4, max_wait=10.0)
    first = _in_background(b, -1)
    _wait_for(lambda: b.batch_info().calls == 1, "the first call")
    joins = [_in_background(b, i) for i in range(1, 5)]  # max_batch of them: the batch starts at once
    assert [j() for j in joins] == [2, 4, 6, 8]
    assert not release.is_set()
    release.set()
    assert first() == -2
    assert b.batch_info().sizes == ((4, 1),)


def test_a_batchs_error_reaches_its_callers_only():
    """Two signatures (ints, floats) queue behind calls that hold them; the float batch fails: each float
    caller raises the batch's error type (its own copy), each int caller gets its result."""
    release = threading.Event()
    b, runner = _batched(_held(release), runner_options=dict(fail_when=lambda xs: isinstance(xs[0], float)))
    holders = [_in_background(b, -1), _in_background(b, -1.0)]
    _wait_for(lambda: b.batch_info().calls == 2, "the two holding calls")
    ints = [_in_background(b, i) for i in range(1, 6)]
    floats = [_in_background(b, i + 0.5) for i in range(1, 6)]
    _wait_for(lambda: b.batch_info().calls == 12, "ten calls queued")
    release.set()
    assert [h() for h in holders] == [-2, -2.0]
    assert [j() for j in ints] == [2, 4, 6, 8, 10]
    errors = []
    for j in floats:
        with pytest.raises(ValueError, match=r"a batch of \[.*\] failed") as caught:
            j()
        errors.append(caught.value)
    assert len({id(e) for e in errors}) == 5  # each caller raised its own copy
    info = b.batch_info()
    assert (info.batches, info.failed_batches) == (2, 1)


def test_a_timeout_fails_that_caller_alone():
    """A pending call (leader) gives up while the device is busy; a follower gives up while its batch runs
    (its row is dropped); everyone else gets the right answer."""
    release, gate = threading.Event(), threading.Event()
    b, runner = _batched(_held(release), runner_options=dict(gate=gate))
    first = _in_background(b, -1)
    _wait_for(lambda: b.batch_info().calls == 1, "the first call")
    with pytest.raises(ftjit.BatchTimeoutError, match=r"double\(\): no result within timeout=0.2 s"):
        b.call(7, timeout=0.2)  # pending behind the running call
    leader = _in_background(b, 1)
    _wait_for(lambda: b.batch_info().calls == 3, "a leader")
    quitter = _in_background(b.call, 2, timeout=0.5)
    _wait_for(lambda: b.batch_info().calls == 4, "a follower")
    release.set()
    assert first() == -2
    _wait_for(lambda: len(runner.batches) == 1, "the batch to start")
    with pytest.raises(ftjit.BatchTimeoutError):
        quitter()  # its batch is held at the gate
    gate.set()
    assert leader() == 2
    info = b.batch_info()
    assert (info.timeouts, info.batches) == (2, 1)
    assert runner.batches == [(1, 2)]


@pytest.mark.thread_unsafe(reason="interrupts the main thread")
def test_a_waiting_call_answers_ctrl_c_and_the_queue_goes_on():
    release = threading.Event()
    b, runner = _batched(_held(release))
    first = _in_background(b, -1)
    _wait_for(lambda: b.batch_info().calls == 1, "the first call")
    timer = threading.Timer(0.3, _thread.interrupt_main)
    timer.start()
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        b(5)  # the main thread leads a batch that cannot start yet: Ctrl-C ends its wait
    assert time.monotonic() - start < 5.0
    after = [_in_background(b, i) for i in (1, 2)]
    _wait_for(lambda: b.batch_info().calls == 4, "two more calls")
    release.set()
    assert first() == -2
    assert [j() for j in after] == [2, 4]
    assert runner.batches == [(1, 2)]  # the interrupted call's example never ran


def test_a_leader_interrupted_in_its_batch_hands_its_followers_back():
    """Ctrl-C (any BaseException that is no Exception) in the thread running a batch: its followers go back
    to the queue and one of them runs them; the interrupted thread alone raises."""
    release = threading.Event()
    interrupts = []

    def interrupt_once(xs):
        if not interrupts:
            interrupts.append(xs)
            raise KeyboardInterrupt
        return False

    b, runner = _batched(_held(release), runner_options=dict(fail_when=interrupt_once))
    first = _in_background(b, -1)
    _wait_for(lambda: b.batch_info().calls == 1, "the first call")
    joins = [_in_background(b, i) for i in range(1, 5)]
    _wait_for(lambda: b.batch_info().calls == 5, "four calls queued")
    release.set()
    assert first() == -2
    outcomes = []
    for i, j in enumerate(joins, start=1):
        try:
            outcomes.append(j())
        except KeyboardInterrupt:
            outcomes.append("interrupted")
    assert outcomes.count("interrupted") == 1
    assert sorted(o for o in outcomes if o != "interrupted") == sorted(2 * i for i in range(1, 5) if
                                                                       outcomes[i - 1] != "interrupted")
    assert len(runner.batches) == 2 and len(runner.batches[1]) == 3  # the three others, again


def test_a_batched_function_dropped_while_calls_wait_finishes_them_and_dies():
    release = threading.Event()
    b, runner = _batched(_held(release))
    ref = weakref.ref(b)
    holder = [b]
    first = _in_background(lambda: holder[0](-1))
    _wait_for(lambda: ref().batch_info().calls == 1, "the first call")
    joins = [_in_background(holder[0], i) for i in range(1, 4)]
    _wait_for(lambda: ref().batch_info().calls == 4, "three calls queued")
    del b, holder[:]
    release.set()
    assert first() == -2
    assert [j() for j in joins] == [2, 4, 6]
    del joins, first
    assert gc_collect_until(lambda: ref() is None), "the batched function outlived its calls"


def test_many_threads_get_their_own_answers_and_every_call_is_counted_once():
    b, runner = _batched(lambda x: 3 * x + 1, max_batch=8, max_wait=0.002)

    def work(i):
        return [b(i * 100 + k) for k in range(40)]

    out = run_threads(24, work, timeout=120)
    assert out == [[3 * (i * 100 + k) + 1 for k in range(40)] for i in range(24)]
    info = b.batch_info()
    assert info.calls == 24 * 40
    assert info.alone + sum(n * count for n, count in info.sizes) == info.calls
    assert info.timeouts == info.failed_batches == 0
    assert all(len(xs) <= 8 for xs in runner.batches)
    assert runner.many.cache_info().compiles <= len(b.sizes)  # once per size at most


def test_options_are_checked():
    for bad, message in ((dict(max_batch=0), "max_batch must be an int >= 1, got 0"),
                         (dict(max_wait=-1), r"max_wait must be a number of seconds in \[0, 60\], got -1"),
                         (dict(sizes=(1, 4, 2), max_batch=4), "sizes must increase"),
                         (dict(sizes=(1, 2), max_batch=4), "the largest size must be max_batch=4"),
                         (dict(timeout=0), "timeout must be a finite number of seconds > 0, or None, got 0")):
        with pytest.raises(ValueError, match=message):
            ftjit.batched(lambda x: x, **bad)
    with pytest.raises(TypeError, match="batched\\(\\) needs a callable, got 3"):
        ftjit.batched(3)
    assert ftjit.batched(lambda x: x, max_batch=64).sizes == (1, 2, 4, 8, 16, 32, 64)
    assert ftjit.batched(lambda x: x, max_batch=48).sizes == (1, 2, 4, 8, 16, 32, 48)


# --- with JAX ----------------------------------------------------------------------------------------------


jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402


def _mlp():
    w1 = np.arange(16 * 8, dtype=np.float32).reshape(16, 8) / 100
    w2 = np.arange(8 * 4, dtype=np.float32).reshape(8, 4) / 10

    def mlp(x):
        return jnp.tanh(x @ w1) @ w2

    return mlp


@pytest.mark.thread_unsafe(reason="runs 64 threads of its own and compiles every batch size: 8 copies at once are "
                                  "512 threads and eight times the compiles, a minute of CI for nothing more")
@pytest.mark.parametrize("to_host", [False, True])
def test_64_threads_get_exact_results(to_host):
    mlp = _mlp()
    predict = ftjit.batched(mlp, max_batch=64, to_host=to_host, cache=ftjit.FunctionCache())
    xs = [np.full(16, i / 64, np.float32) for i in range(64)]
    want = [np.asarray(jax.jit(mlp)(x)) for x in xs]

    def work(i):
        return [predict(xs[i]) for _ in range(10)]

    out = run_threads(64, work, timeout=120)
    for i, rows in enumerate(out):
        for row in rows:
            assert isinstance(row, np.ndarray) if to_host else isinstance(row, jax.Array)
            np.testing.assert_allclose(np.asarray(row), want[i], rtol=1e-6)
    info = predict.batch_info()
    assert info.calls == 640 and info.alone + sum(n * c for n, c in info.sizes) == 640
    assert info.failed_batches == info.timeouts == 0


def test_shapes_and_statics_are_batched_apart():
    def scale(x, k):
        return x * k

    predict = ftjit.batched(scale, static_argnums=1, max_wait=0.005, cache=ftjit.FunctionCache())

    def work(i):
        x = np.full(8 if i % 2 else 4, i, np.float32)
        k = 2 if i % 4 < 2 else 3
        return [np.asarray(predict(x, k)).tolist() for _ in range(5)]

    out = run_threads(16, work, timeout=120)
    for i, rows in enumerate(out):
        assert rows == [[i * (2 if i % 4 < 2 else 3)] * (8 if i % 2 else 4)] * 5
    # Every batch program compiled has one shape and one static: never a mix.
    for sig in predict._runner.many.signatures():
        assert ("float32[" in sig.signature) and (", 2)" in sig.signature or ", 3)" in sig.signature)


def test_warmup_compiles_every_size_and_traffic_compiles_nothing():
    mlp = _mlp()
    predict = ftjit.batched(mlp, max_batch=16, cache=ftjit.FunctionCache())
    report = predict.warmup([(jax.ShapeDtypeStruct((16,), jnp.float32),)])
    assert report.ok and len(report) == 1 + 4  # the example's signature, then sizes 2, 4, 8, 16
    one, many = predict._runner.one.cache_info(), predict._runner.many.cache_info()
    assert (one.compiles, many.compiles) == (1, 4)

    def work(i):
        return [np.asarray(predict(np.full(16, i, np.float32))) for _ in range(10)]

    run_threads(32, work, timeout=120)
    assert (predict._runner.one.cache_info().compiles, predict._runner.many.cache_info().compiles) == (1, 4)


def test_a_call_inside_a_trace_is_not_batched():
    predict = ftjit.batched(lambda x: x + 1, cache=ftjit.FunctionCache())
    out = jax.jit(lambda y: predict(y) * 2)(jnp.arange(3.0))
    assert np.asarray(out).tolist() == [2.0, 4.0, 6.0]
    assert predict.batch_info().fallback == 1


def test_stats_and_batch_info_name_the_function():
    def classify(x):
        return x.sum()

    predict = ftjit.batched(classify, cache=ftjit.FunctionCache())
    predict(np.ones(3, np.float32))
    info = predict.batch_info()
    assert info.name == "classify" and info.calls == 1
    assert any(b.name == "classify" and b.calls == 1 for b in ftjit.stats().batched)
    gc.collect()
