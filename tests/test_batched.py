"""ftjit.batched: many threads, one example each, one call of a batch.

The protocol (queues, leaders and followers, timeouts, errors, interrupts, a dropped function) is tested
without JAX through stress.batch_runner's RowsRunner, whose batch is one jitted call of the stacked examples:
these run under ThreadSanitizer too (dev.sh tsan-ft). The JAX path: tests/test_batched_jax.py.

Thread tests start on a Barrier (helpers.run_threads), join with a timeout and re-raise worker exceptions.
"""

import _thread
import os
import subprocess
import sys
import sysconfig
import threading
import time
import weakref

import pytest

import ftjit
from ftjit._batched import BatchedFunction
from helpers import child_env, gc_collect_until, run_threads
from stress.batch_runner import RowsRunner

#: ThreadSanitizer cannot follow threads started in the child of a multi-threaded fork (tests/test_fork.py).
UNDER_TSAN = "--with-thread-sanitizer" in (sysconfig.get_config_var("CONFIG_ARGS") or "")

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
# --- issue 51 ---------------------------------------------------------------------------------------------------


def test_examples_that_never_finish_hold_only_their_own_callers():
    """Finding 2: two batches that never finish filled the two running slots, and every later call of their
    signature timed out, forever. A run that has gone ten times the function's mean (at least 1 s) no longer
    holds its slot: later calls are answered, and the stuck ones' callers alone wait."""
    forever = threading.Event()
    b, runner = _batched(_held(forever), max_wait=0.01)
    try:
        assert [b(i) for i in range(1, 6)] == [2, 4, 6, 8, 10]  # a history: runs take microseconds
        stuck = [_in_background(b, -1)]
        _wait_for(lambda: b.batch_info().calls == 6, "the first stuck call")
        stuck.append(_in_background(b, -2))
        _wait_for(lambda: b.batch_info().calls == 7, "the second")
        _wait_for(lambda: runner.calls_alone == 5 + 2, "both stuck calls to run")
        start = time.monotonic()
        assert b.call(7, timeout=5) == 14
        assert run_threads(8, lambda i: b.call(10 + i, timeout=5), timeout=30) == [2 * (10 + i) for i in range(8)]
        assert time.monotonic() - start < 5
        info = b.batch_info()
        assert info.timeouts == 0 and info.calls == 16
    finally:
        forever.set()
    assert [j() for j in stuck] == [-2, -4]
    assert b._queues == {}


@pytest.mark.thread_unsafe(reason="counts the process's live batch queues")
def test_a_call_that_raises_or_times_out_leaves_no_queue_behind():
    """Finding 3: when a call raised (its own error, a timeout), its queue stayed in the function's dict: 858
    raising calls of distinct shapes kept 858 closed queues, after clear_cache() too. Nothing outlives a call."""
    import numpy as np

    def picky(x):
        if x.shape[0] % 2:
            raise ValueError(f"odd length {x.shape[0]}")
        return x * 2

    b, _ = _batched(picky, max_wait=0.001)
    before = ftjit._core._live_counts()["batch_queues"]
    for n in range(1, 201):
        if n % 2:
            with pytest.raises(ValueError, match=f"odd length {n}"):
                b(np.ones(n, np.float32))
        else:
            assert b(np.ones(n, np.float32)).tolist() == [2.0] * n
    assert b._queues == {}
    out = run_threads(16, lambda i: repr(_outcome(lambda: b(np.ones(i % 4 + 1, np.float32)))), timeout=60)
    assert out == [repr(_outcome(lambda: picky(np.ones(i % 4 + 1, np.float32)))) for i in range(16)]
    assert b._queues == {}
    release = threading.Event()
    held, _ = _batched(_held(release))
    first = _in_background(held, -1)
    _wait_for(lambda: held.batch_info().calls == 1, "the first call")
    for i in range(20):
        with pytest.raises(ftjit.BatchTimeoutError):
            held.call(100 + i, timeout=0.01)  # behind the running call
    release.set()
    assert first() == -2
    assert held._queues == {} and b._queues == {}
    assert ftjit._core._live_counts()["batch_queues"] == before


def _outcome(call):
    try:
        return call().tolist()
    except Exception as error:  # noqa: BLE001 - compared
        return (type(error).__name__, str(error))




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


def _poisoned(release: threading.Event):
    """fn(x) = 2x; a negative x holds its call until `release`; x == 13 raises, alone as in a batch."""
    held = _held(release)

    def double_or_fail(x):
        if x == 13:
            raise ValueError(f"13 is poisoned (got {x!r})")
        return held(x)

    return double_or_fail


def test_a_failed_batch_runs_again_example_by_example_and_each_caller_gets_its_own_outcome():
    """Issue 45, finding 6: one bad example failed its whole batch, so clean callers raised another caller's
    error. Now the failed batch's examples run alone, each in its caller's thread: the poisoned caller raises
    exactly what a lone call of it raises, every other caller gets its own result."""
    release = threading.Event()
    fn = _poisoned(release)
    b, runner = _batched(fn)
    holder = _in_background(b, -1)
    _wait_for(lambda: b.batch_info().calls == 1, "the holding call")
    joins = {x: _in_background(b, x) for x in (11, 12, 13, 14, 15)}
    _wait_for(lambda: b.batch_info().calls == 6, "five calls queued")
    release.set()
    assert holder() == -2
    for x in (11, 12, 14, 15):
        assert joins[x]() == 2 * x
    with pytest.raises(ValueError) as caught:
        joins[13]()
    with pytest.raises(ValueError) as alone:
        fn(13)
    assert (type(caught.value), str(caught.value)) == (type(alone.value), str(alone.value)) == (
        ValueError, "13 is poisoned (got 13)")
    assert [sorted(xs) for xs in runner.batches] == [[11, 12, 13, 14, 15]]  # one batch tried, then each alone
    info = b.batch_info()
    assert (info.calls, info.batches, info.retried, info.failed_batches) == (6, 0, 5, 2)  # the batch and 13 alone
    assert runner.calls_alone == 1 + 5


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
    """The main thread leads a batch that cannot start yet (a call holds the device); Ctrl-C (a real
    _thread.interrupt_main, sent once the call waits in its queue) ends its wait, and the queue goes on.

    It relies on Python's default SIGINT handler (interrupt_main does nothing under SIG_IGN or SIG_DFL, and a
    custom handler may not raise): it checks the handler it finds is that one, so that one left behind by
    another test fails here by name, not as "DID NOT RAISE" (issue 47)."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals are only delivered to the main thread")
    import signal

    found = signal.getsignal(signal.SIGINT)
    assert found is signal.default_int_handler, f"SIGINT's handler is {found!r}, not Python's default"
    release = threading.Event()
    b, runner = _batched(_held(release))
    first = _in_background(b, -1)
    _wait_for(lambda: b.batch_info().calls == 1, "the first call")

    def interrupt_once_waiting():
        _wait_for(lambda: b.batch_info().calls == 2, "the main thread's call in its queue")
        time.sleep(0.05)
        _thread.interrupt_main()

    poker = threading.Thread(target=interrupt_once_waiting, daemon=True)
    start = time.monotonic()
    try:
        poker.start()
        with pytest.raises(KeyboardInterrupt):
            b(5)  # waits 10 s for company (max_wait) unless interrupted
        assert time.monotonic() - start < 5.0
    finally:
        poker.join(30)
        try:  # an interrupt that missed the call must not reach pytest
            for _ in range(10):
                time.sleep(0.01)
        except KeyboardInterrupt:
            pass
    after = [_in_background(b, i) for i in (1, 2)]
    _wait_for(lambda: b.batch_info().calls == 4, "two more calls")
    release.set()
    assert first() == -2
    assert [j() for j in after] == [2, 4]
    assert runner.batches == [(1, 2)]  # the interrupted call's example never ran
    assert b.batch_info().interrupted == 1


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


# --- issue 45: no state a signal or a fork can leave held ------------------------------------------------------


def _slow_double(x):
    time.sleep(0.0002)  # a call takes a moment, as a device's does: others queue meanwhile
    return 2 * x


@pytest.mark.thread_unsafe(reason="interrupts the main thread")
@pytest.mark.timeout(300)
def test_ctrl_c_at_random_points_wedges_no_caller():
    """Finding 4: a KeyboardInterrupt landing inside the queue's Python `with lock:` leaked the lock, or one
    landing at the entry of a leader left `running`/`leading` set: every caller of the signature then waited
    forever (4 of 4 runs, after 117 to 2,019 real interrupts). The protocol is one C++ call now, which a signal
    can only end at a signal check or in the runner, each leaving the queue in order: 2,000 interrupts at random
    points of the main thread's calls, while 8 threads call too, leave every other call answered exactly.

    The SIGINT handler raises KeyboardInterrupt, as Python's does, while the main thread is in a call (armed),
    and counts the interrupt otherwise: one landing on the test's own loop (its backward jump is outside any
    try) would end the test, not test the library. The handler found is put back."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals are only delivered to the main thread")
    import random
    import signal

    b, runner = _batched(_slow_double, max_batch=8, max_wait=0.0005)
    stop = threading.Event()

    def worker(i):
        done = 0
        while not stop.is_set():
            x = i * 1_000_000 + done
            assert b.call(x, timeout=30) == 2 * x
            done += 1
        return done

    state = {"armed": False, "stray": 0}

    def handler(signum, frame):
        if state["armed"]:
            raise KeyboardInterrupt
        state["stray"] += 1

    rng = random.Random(45)
    interrupts = 2000

    def interrupter():
        for _ in range(interrupts):
            time.sleep(rng.uniform(0, 0.002))
            _thread.interrupt_main()

    old = signal.signal(signal.SIGINT, handler)
    try:
        workers = [_in_background(worker, i) for i in range(8)]
        poker = threading.Thread(target=interrupter, daemon=True)
        answered = interrupted = 0
        poker.start()
        while poker.is_alive():
            try:
                x = -(answered + 1)
                state["armed"] = True
                out = b.call(x, timeout=30)
                state["armed"] = False
                assert out == 2 * x
                answered += 1
            except KeyboardInterrupt:
                state["armed"] = False
                interrupted += 1
        poker.join(30)
        for _ in range(10):  # signal handlers run: the last interrupt lands here if still pending
            time.sleep(0.01)
    finally:
        state["armed"] = False
        signal.signal(signal.SIGINT, old)
    stop.set()
    done = [j(60) for j in workers]
    assert interrupted >= 100 and all(d > 0 for d in done), (interrupted, done)
    # Nothing is left held: a fresh burst of concurrent calls is answered, and every queue goes once idle.
    assert run_threads(16, lambda i: b.call(7 + i, timeout=30), timeout=60) == [2 * (7 + i) for i in range(16)]
    assert b._queues == {}
    info = b.batch_info()
    assert info.timeouts == 0 and info.failed_batches == 0 and 1 <= info.interrupted <= interrupted
    # Each call counted once: an interrupted one too, unless the interrupt landed before it reached the core
    # (in the Python around it); one that the interrupt ended after its result is counted but not answered.
    answered_all = answered + sum(done) + 16
    assert answered_all + info.interrupted <= info.calls <= answered_all + interrupted


FORK_CHILD = r"""
import os, sys, threading, time, warnings
sys.path.insert(0, sys.argv[1])
warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: fork() of a multi-threaded process
from ftjit._batched import BatchedFunction
from stress.batch_runner import RowsRunner

def slow_double(x):
    time.sleep(0.0005)
    return 2 * x

runner = RowsRunner(slow_double)
b = BatchedFunction(slow_double, max_batch=8, max_wait=0.0005, sizes=None, to_host=False, timeout=None,
                    static_argnums=(), static_argnames=(), runner=runner)
stop = threading.Event()

def worker(i):
    k = 0
    while not stop.is_set():
        assert b(i * 100000 + k) == 2 * (i * 100000 + k)
        k += 1

threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(8)]
for t in threads:
    t.start()
children = []
for n in range(int(sys.argv[2])):
    time.sleep(0.003 * (n % 5))  # forks land at varied points of the workers' calls
    pid = os.fork()
    if pid == 0:  # only this thread lives on: the parent's queues hold waiters that do not exist here
        try:
            ok = all(b.call(x, timeout=10) == 2 * x for x in range(20))
            both = [None, None]
            ts = [threading.Thread(target=lambda j=j: both.__setitem__(j, b.call(j, timeout=10))) for j in (0, 1)]
            for t in ts:
                t.start()
            for t in ts:
                t.join(20)
            os._exit(0 if ok and both == [0, 2] else 3)
        except BaseException as error:
            sys.stderr.write(f"child: {type(error).__name__}: {error}\n")
            os._exit(4)
    children.append(pid)
codes = []
for pid in children:
    deadline = time.monotonic() + 60
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            codes.append(os.waitstatus_to_exitcode(status))
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            codes.append("hung")
            break
        time.sleep(0.01)
stop.set()
for t in threads:
    t.join(30)
print(codes.count(0), len(codes), [c for c in codes if c != 0])
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.skipif(UNDER_TSAN, reason="ThreadSanitizer cannot follow threads started after a multi-threaded fork")
@pytest.mark.thread_unsafe(reason="forks a process of many threads")
@pytest.mark.timeout(300)
def test_a_forked_child_starts_with_no_queue_of_its_parent():
    """Finding 5: a child inherited `running`/`leading` from the parent's threads, which do not exist there, so
    its calls hung (18 of 18 children). A queue of the parent is closed in the child (the fork generation), and
    the child's calls make their own: 20 children forked while 8 threads call, each answers alone and batched."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", FORK_CHILD, root, "20"], capture_output=True, text=True,
                          timeout=240, env=child_env())
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.split()[:2] == ["20", "20"], done.stdout + done.stderr
