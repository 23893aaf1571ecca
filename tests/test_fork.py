"""Fork: a child process gets a working ftjit, whatever the parent's threads
were doing when it forked.

At fork time only the forking thread lives on in the child. Compiles that
other threads of the parent had in flight will never be published there, and
locks they held (or that a free-threaded PyMutex had handed to a parked
waiter) stay held. Each case below runs in a fresh interpreter that sets up
the parent's state, forks, and checks in the child (one line of output per
case) that every signature compiles exactly once, nothing hangs (the child
has an alarm; the parent waits with a timeout) and the cache and LRU counts
stay exact.
"""

import os
import subprocess
import sys
import sysconfig

import pytest

from helpers import child_env

#: ThreadSanitizer cannot follow threads started in the child of a
#: multi-threaded fork ("dup thread with used id"): the cases need those.
UNDER_TSAN = "--with-thread-sanitizer" in (sysconfig.get_config_var("CONFIG_ARGS") or "")

# Safe to run in several threads at once: each run is its own interpreter
# (which imports ftjit but not jax, so 8 at once stay cheap).
pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork"),
    pytest.mark.skipif(UNDER_TSAN, reason="ThreadSanitizer cannot follow threads started after a multi-threaded fork"),
]

FORK_CASES = r"""
import gc, os, signal, sys, threading, time, warnings
import ftjit
warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: fork() of a multi-threaded process

def wait_until(pred, what):
    deadline = time.monotonic() + 30
    while not pred():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.002)

class InFlight:
    # f's signature float is being compiled by thread 'owner' (held until
    # release()), and thread 'waiter' waits for it: the parent's state at fork.
    def __init__(self):
        self.calls = []
        self.started, self.released = threading.Event(), threading.Event()
        self.cache = ftjit.FunctionCache(8)
        self.f = ftjit.jit(lambda x: x, compiler=self.comp, cache=self.cache)
        self.owner = threading.Thread(target=lambda: self.f(1.0), name="owner")
        self.owner.start()
        self.started.wait(30)
        self.waiter = threading.Thread(target=lambda: self.f(1.0), name="waiter")
        self.waiter.start()
        wait_until(lambda: self.f.cache_info().waits == 1 and ftjit._core._waiting_threads() == 1, "the waiter")

    def comp(self, fun, args, kwargs):
        self.calls.append(threading.current_thread().name)
        if len(self.calls) == 1:
            self.started.set()
            self.released.wait(60)
        return lambda x: x + 1

    def finish(self, others=0):
        self.released.set()
        self.owner.join(30)
        self.waiter.join(30)
        i = self.f.cache_info()
        assert (self.f(5.0), i.compiles, i.misses, i.size, self.cache.size(), self.calls) == \
            (6.0, 1, 1, 1, 1 + others, ["owner"]), (i, self.calls)

def fork(name, body):
    pid = os.fork()
    if pid == 0:
        signal.alarm(20)  # a hang must not hang the test
        try:
            print(name, *body(), flush=True)
            os._exit(0)
        except BaseException as e:
            print(name, "FAILED", type(e).__name__, e, flush=True)
            os._exit(1)
    deadline = time.monotonic() + 30
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            print(name, "HUNG", flush=True)
            return
        time.sleep(0.01)
    if status != 0:
        print(name, "child status", status, flush=True)

def counts(s):
    i = s.f.cache_info()
    # The child's own compiles: the parent's counters at fork were 0 compiles, 1 miss.
    return (i.compiles, i.misses - 1, i.size, s.cache.size(), s.calls[1:])

def main_thread():
    s = InFlight()
    def child():
        before = (s.f.cache_info().size, s.cache.size())  # the orphan is gone, not pinned in the LRU
        return (*before, s.f(1.0), s.f(2.0), *counts(s))
    fork("main-thread", child)
    s.finish()

def new_thread():
    s = InFlight()
    def child():
        out = []
        t = threading.Thread(target=lambda: out.append((s.f(1.0), s.f(2.0))), name="child-thread")
        t.start()
        t.join(10)
        return (*out[0], *counts(s))
    fork("new-thread", child)
    s.finish()

def reused_thread_id():
    # A thread of the child may get the pthread id of the parent's compiling
    # thread (glibc hands the dead threads' stacks, and so their ids, to new
    # threads): it must not be taken for that compile's owner.
    s = InFlight()
    owner_id = s.owner.ident
    def child():
        stop = threading.Event()
        found = []
        threads = []
        def run():
            if threading.get_ident() == owner_id:
                found.append(s.f(1.0))
                s.calls[1:] = ["the thread with the owner's id" for name in s.calls[1:]
                               if name == threading.current_thread().name]
            stop.wait(10)
        for i in range(16):  # kept alive, so that each takes a new stack
            threads.append(threading.Thread(target=run, name=f"child-{i}"))
            threads[-1].start()
            if threads[-1].ident == owner_id:
                wait_until(lambda: found, "the call")
                break
        stop.set()
        for t in threads:
            t.join(10)
        return (bool(found), *found, *counts(s))
    fork("reused-thread-id", child)
    s.finish()

def clear_caches():
    s = InFlight()
    def child():
        ftjit.clear_caches()
        s.f.clear_cache()
        s.cache.clear()
        return (s.f(1.0), *counts(s))
    fork("clear-caches", child)
    s.finish()

def drop_function():
    # h, compiled in the parent, dies in the child. (f itself cannot: the
    # frames of the parent's lost threads, which CPython leaks in the child,
    # hold it.)
    import weakref
    s = InFlight()
    h = ftjit.jit(lambda x: x, compiler=lambda fun, args, kwargs: fun, cache=s.cache)
    h(1.0)
    def child():
        nonlocal h
        before = (s.cache.size(), s.cache._functions())  # h's entry; f's orphan is gone
        fun = weakref.ref(h.__wrapped__)
        h = None
        gc.collect()
        return (*before, fun() is None, s.cache.size(), s.cache._functions())
    fork("drop-function", child)
    s.finish(others=1)

def held_locks():
    # A thread of the parent holds every lock a call of f takes (as a parked
    # PyMutex waiter that was handed them would) while the parent forks.
    s = InFlight()
    holder = threading.Thread(target=ftjit._core._debug_hold_locks, args=(s.f, 1.0))
    holder.start()
    time.sleep(0.2)
    fork("held-locks", lambda: (s.f(1.0), s.f(2.0), *counts(s)))
    holder.join(30)
    s.finish()

def fork_inside_compile():
    # The forking thread's own compile goes on in the child; a second thread
    # of the child asking for the same signature waits for it, and does not
    # compile it again.
    calls = []
    parent = os.getpid()
    def comp(fun, args, kwargs):
        calls.append(threading.current_thread().name)
        if len(calls) == 1 and os.getpid() == parent:
            pid = os.fork()
            if pid == 0:
                signal.alarm(20)
                out = []
                t = threading.Thread(target=lambda: out.append(g(2.0)), name="second")
                t.start()
                wait_until(lambda: g.cache_info().waits == 1, "the second thread to wait")
                comp.child = (t, out)
            else:
                os.waitpid(pid, 0)
        return lambda x: x * 10
    comp.child = None
    g = ftjit.jit(lambda x: x, compiler=comp)
    r = g(3.0)
    if comp.child is not None:  # the child
        t, out = comp.child
        t.join(10)
        i = g.cache_info()
        print("fork-inside-compile", r, *out, i.compiles, i.misses, i.waits, calls, flush=True)
        os._exit(0)
    assert r == 30.0 and g.cache_info().compiles == 1

main_thread()
new_thread()
reused_thread_id()
clear_caches()
drop_function()
held_locks()
fork_inside_compile()
print("parent done", flush=True)
"""


def test_fork_gives_the_child_working_caches():
    proc = subprocess.Popen([sys.executable, "-c", FORK_CASES], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, env=child_env())
    try:
        out, err = proc.communicate(timeout=150)
    finally:
        proc.kill()
    assert proc.returncode == 0, (out, err[-3000:])
    # Each child line: results, then (compiles, the child's misses, f's entries,
    # the cache's entries, the compiler's calls in the child).
    assert out.splitlines() == [
        "main-thread 0 0 2.0 3.0 1 1 1 1 ['MainThread']",
        "new-thread 2.0 3.0 1 1 1 1 ['child-thread']",
        "reused-thread-id True 2.0 1 1 1 1 [\"the thread with the owner's id\"]",
        "clear-caches 2.0 1 1 1 1 ['MainThread']",
        "drop-function 1 2 True 0 1",
        "held-locks 2.0 3.0 1 1 1 1 ['MainThread']",
        "fork-inside-compile 30.0 20.0 1 1 1 ['MainThread']",
        "parent done",
    ], (out, err[-3000:])
