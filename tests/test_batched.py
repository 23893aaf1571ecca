"""ftjit.batched: many threads, one example each, one call of a batch.

The protocol (queues, leaders and followers, timeouts, errors, interrupts, a dropped function) is tested
without JAX through stress.batch_runner's RowsRunner, whose batch is one jitted call of the stacked examples:
these run under ThreadSanitizer too (dev.sh tsan-ft). The JAX path: tests/test_batched_jax.py.

Thread tests start on a Barrier (helpers.run_threads), join with a timeout and re-raise worker exceptions.
"""

import _thread
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
    # The default sizes, through the JAX-free runner (this file runs under tsan-ft, which has no JAX).
    assert _batched(lambda x: x, max_batch=64)[0].sizes == (1, 2, 4, 8, 16, 32, 64)
    assert _batched(lambda x: x, max_batch=48)[0].sizes == (1, 2, 4, 8, 16, 32, 48)
