"""What ftjit reports about compiles: cache_info()'s compile and wait times,
signatures() (each cached signature as text, with its hits and compile time),
ftjit.stats() (every live jitted function: rows, totals, a table, a dict),
and the log records of compiles, failed compiles and waits (logger "ftjit").

Every test builds its own FunctionCache and fresh functions. Functions whose
names show up in process-wide places (logs, stats()) get a unique name per
test run (helpers.unique_name), so parallel copies of a test never see each
other's records. Thread tests start on a Barrier (helpers.run_threads), join
with a timeout and re-raise worker exceptions.
"""

import json
import logging
import re
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import ftjit
from helpers import (
    CountingCompiler,
    LogCapture,
    child_env,
    gated_compiler,
    gc_collect_until,
    named,
    run_threads,
    unique_name,
    z,
)

pytestmark = pytest.mark.timeout(120)

INFO = logging.INFO
DEBUG = logging.DEBUG


def f(x, n):
    """Module-level, so its qualname is exactly 'f'."""
    return x * n


def fresh(prefix="fn", body=lambda x: x + 1):
    """A new function object with a unique name; returns (function, name)."""
    name = unique_name(prefix)

    def fun(*args, **kwargs):
        return body(*args, **kwargs)

    return named(fun, name), name


# --- cache_info(): compile and wait times -------------------------------------


def test_cache_info_compile_seconds_total():
    comp = CountingCompiler(delay=0.1)
    jf = ftjit.jit(lambda x: x * 2, compiler=comp, cache=ftjit.FunctionCache())
    info0 = jf.cache_info()
    assert type(info0.compile_seconds) is float and type(info0.wait_seconds) is float
    assert info0.compile_seconds == 0.0 and info0.wait_seconds == 0.0
    t0 = time.monotonic()
    assert jf(z(3)).shape == (3,)
    call_seconds = time.monotonic() - t0
    info1 = jf.cache_info()
    # The compile (with its 0.1 s sleep) lies within the call that ran it:
    # seconds, not another unit, on the clock time.monotonic() reads.
    assert 0.1 <= info1.compile_seconds <= call_seconds
    jf(z(3))  # a hit adds no compile time
    assert jf.cache_info().compile_seconds == info1.compile_seconds
    jf(z(4))
    info2 = jf.cache_info()
    assert info2.compile_seconds >= info1.compile_seconds + 0.1
    assert info2.wait_seconds == 0.0
    assert (info2.hits, info2.misses, info2.compiles, info2.waits) == (1, 2, 2, 0)
    # The per-signature compile times add up to the total.
    assert sum(s.compile_seconds for s in jf.signatures()) == pytest.approx(info2.compile_seconds, abs=1e-6)


def test_cache_info_wait_seconds_for_waiter_of_slow_compile():
    comp, started, held = gated_compiler(lambda: jf.cache_info().waits >= 1)
    jf = ftjit.jit(lambda x: x + 1.0, compiler=comp, cache=ftjit.FunctionCache())

    def target(i):
        if i == 1:
            assert started.wait(10)
        t0 = time.monotonic()
        r = jf(z(4))
        return r, time.monotonic() - t0

    (r0, compiling_call), (r1, waiting_call) = run_threads(2, target)
    assert np.array_equal(r0, np.ones(4, np.float32)) and np.array_equal(r1, np.ones(4, np.float32))
    info = jf.cache_info()
    assert comp.calls == 1
    assert (info.misses, info.compiles, info.waits, info.hits) == (1, 1, 1, 0)
    # Nested intervals on one clock: the hold within the compile within the
    # compiling call; the wait within the waiting call.
    assert len(held) == 1
    assert held[0] <= info.compile_seconds <= compiling_call
    assert 0.0 < info.wait_seconds <= waiting_call


# --- signatures() -------------------------------------------------------------


def test_signatures_module_level_function_exact_string():
    comp = CountingCompiler()
    jf = ftjit.jit(f, static_argnames="n", compiler=comp, cache=ftjit.FunctionCache())
    assert jf.signatures() == []
    out = jf(np.ones((8, 128), np.float32), n=3)
    assert np.array_equal(out, np.full((8, 128), 3, np.float32))
    sigs = jf.signatures()
    assert len(sigs) == 1
    info = sigs[0]
    assert isinstance(info, ftjit.SignatureInfo)
    assert info.signature == "f(float32[8,128], n=3)"
    assert info.hits == 0  # the first call compiled; not a hit
    assert type(info.compile_seconds) is float and info.compile_seconds >= 0.0
    jf(np.ones((8, 128), np.float32), n=3)
    jf(np.ones((8, 128), np.float32), n=3)
    assert [(s.signature, s.hits) for s in jf.signatures()] == [("f(float32[8,128], n=3)", 2)]


def test_signatures_newest_compile_first():
    """signatures() lists the latest compile first; hits do not reorder it
    (40 signatures: more than a hash table's iteration order keeps by luck)."""
    def g(x):
        return x

    jf = ftjit.jit(g, compiler=CountingCompiler(), cache=ftjit.FunctionCache())
    for n in range(1, 41):
        jf(z(n))
    jf(z(1))  # a hit on the oldest
    q = g.__qualname__
    assert [s.signature for s in jf.signatures()] == [f"{q}(float32[{n}])" for n in range(40, 0, -1)]
    assert [s.hits for s in jf.signatures()] == [0] * 39 + [1]


def test_signatures_use_qualname_and_print_scalars():
    def g(x, n):
        return x

    comp = CountingCompiler()
    jf = ftjit.jit(g, static_argnames="n", compiler=comp, cache=ftjit.FunctionCache())
    q = g.__qualname__
    assert q.endswith("<locals>.g")
    jf(1.5, n=1)
    jf(2, n=1)
    jf(True, n=1)
    jf(1j, n=1)
    jf((z(3, dtype=np.float64),), n=1)
    jf(z(2, 2, dtype=np.int32), n="a")
    jf(2, n=1)
    jf(3, n=1)  # same signature as 2: a hit
    got = {s.signature: s.hits for s in jf.signatures()}
    assert got == {
        f"{q}(float, n=1)": 0,
        f"{q}(int, n=1)": 2,
        f"{q}(bool, n=1)": 0,
        f"{q}(complex, n=1)": 0,
        f"{q}((float64[3],), n=1)": 0,
        f"{q}(int32[2,2], n='a')": 0,
    }
    assert comp.calls == 6
    assert jf.cache_info().hits == 2


def test_signature_hits_exact_under_concurrent_hits():
    comp = CountingCompiler()
    jf = ftjit.jit(lambda x: x, compiler=comp, cache=ftjit.FunctionCache())
    jf(z(5))
    jf(z(6))
    per_thread = 200

    def target(i):
        a = z(5)
        for _ in range(per_thread):
            jf(a)

    run_threads(8, target)
    hits = {s.signature.split("(", 1)[1]: s.hits for s in jf.signatures()}
    assert hits == {"float32[5])": 8 * per_thread, "float32[6])": 0}
    assert jf.cache_info().hits == 8 * per_thread
    assert comp.calls == 2


# --- ftjit.stats() ------------------------------------------------------------


def _row(stats, name):
    rows = [r for r in stats.functions if r.name == name]
    assert len(rows) == 1, [r.name for r in stats.functions if name in r.name]
    return rows[0]


def test_stats_row_matches_cache_info_and_is_consistent():
    fun, name = fresh("stats_fn")
    comp = CountingCompiler(delay=0.02)
    jf = ftjit.jit(fun, compiler=comp, cache=ftjit.FunctionCache())
    jf(1.0)
    jf(1.0)
    jf(2)
    s = ftjit.stats()
    assert isinstance(s, ftjit.Stats)
    row = _row(s, name)
    assert isinstance(row, ftjit.FunctionStats)
    assert tuple(row[1:]) == tuple(jf.cache_info())
    assert (row.hits, row.misses, row.compiles, row.size, row.failures) == (1, 2, 2, 2, 0)
    assert row.compile_seconds >= 0.04
    # Sorted by compile time, largest first; top(n) is a prefix.
    secs = [r.compile_seconds for r in s.functions]
    assert secs == sorted(secs, reverse=True)
    assert s.top(3) == s.functions[:3]
    assert s.top(len(s.functions) + 5) == s.functions
    # Totals over the same snapshot.
    t = s.totals
    assert isinstance(t, ftjit.FunctionStats)
    assert t.name == f"TOTAL ({len(s.functions)} function{'' if len(s.functions) == 1 else 's'})"
    for field in ("hits", "misses", "compiles", "waits", "evictions", "size", "failures"):
        assert getattr(t, field) == sum(getattr(r, field) for r in s.functions), field
    assert t.compile_seconds == pytest.approx(sum(r.compile_seconds for r in s.functions))
    assert t.compile_seconds >= row.compile_seconds


def test_stats_total_row_counts_functions_in_words():
    """The totals row says "1 function", "2 functions", "0 functions": run
    in a fresh interpreter, where no other test's functions are alive."""
    code = """
import ftjit
def names():
    return ftjit.stats().totals.name
out = [names()]
f = ftjit.jit(lambda x: x, compiler=lambda fun, a, k: fun)
f(1)
out.append(names())
g = ftjit.jit(lambda x: x + 1, compiler=lambda fun, a, k: fun)
g(1)
out.append(names())
print(out)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=child_env())
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(["TOTAL (0 functions)", "TOTAL (1 function)", "TOTAL (2 functions)"])


def test_stats_as_dict_is_json_serializable():
    fun, name = fresh("stats_json")
    jf = ftjit.jit(fun, compiler=CountingCompiler(), cache=ftjit.FunctionCache())
    jf(z(2))
    s = ftjit.stats()
    d = s.as_dict(top=len(s.functions))
    back = json.loads(json.dumps(d))
    assert back["totals"]["name"] == s.totals.name
    mine = [r for r in back["functions"] if r["name"] == name]
    assert len(mine) == 1
    assert mine[0] == dict(_row(s, name)._asdict())
    assert set(mine[0]) == set(ftjit.FunctionStats._fields)
    assert len(s.as_dict(top=1)["functions"]) == min(1, len(s.functions))


def test_stats_str_table_contains_names():
    fun, name = fresh("stats_str")
    jf = ftjit.jit(fun, compiler=CountingCompiler(), cache=ftjit.FunctionCache())
    jf(z(2))
    jf(z(2))
    s = ftjit.stats()
    row = _row(s, name)
    text = str(s)
    assert "compile s" in text and "function" in text.splitlines()[0]
    assert s.totals.name in text
    for r in s.top(10):
        assert r.name in text
    # A table of just this function's row.
    mine = ftjit.Stats((row,), row._replace(name="TOTAL (1 function)"))
    lines = str(mine).splitlines()
    assert lines[0].split()[0] == "function"
    body = [ln for ln in lines if ln.startswith(name)]
    assert len(body) == 1
    assert body[0].split()[:8] == [name, "1", "1", "1", "0", "0", "1", "0"]
    assert "TOTAL (1 function)" in lines[-1]


def test_stats_str_lists_the_top_10_by_compile_time():
    """str(stats) lists the 10 functions that spent longest compiling, then
    the totals. Checked on rows whose compile times are given, not measured:
    on a loaded machine other tests' functions may well compile slower."""
    rows = [ftjit.FunctionStats(f"fn{i}", 0, 1, 1, 0, 0, 1, 0, float(i), 0.0) for i in range(12)]
    rows.sort(key=lambda r: r.compile_seconds, reverse=True)
    total = ftjit.FunctionStats("TOTAL (12 functions)", 0, 12, 12, 0, 0, 12, 0, 66.0, 0.0)
    text = str(ftjit.Stats(tuple(rows), total))
    listed = [line.split()[0] for line in text.splitlines()[2:] if line.split() and not line.startswith("-")]
    assert listed == [f"fn{i}" for i in range(11, 1, -1)] + ["TOTAL"]
    # A real snapshot: a function is in the text exactly when it ranks in the top 10.
    fun, name = fresh("stats_slow")
    jf = ftjit.jit(fun, compiler=CountingCompiler(delay=0.05), cache=ftjit.FunctionCache())
    jf(z(2))
    s = ftjit.stats()
    rank = s.functions.index(_row(s, name))
    assert (name in str(s)) == (rank < 10)


def test_stats_drop_dead_functions():
    fun, name = fresh("stats_dead")
    jf = ftjit.jit(fun, compiler=CountingCompiler(), cache=ftjit.FunctionCache())
    jf(z(2))
    _row(ftjit.stats(), name)
    del jf, fun
    assert gc_collect_until(lambda: all(r.name != name for r in ftjit.stats().functions))


# --- logging: compiles, failed compiles, waits --------------------------------


_COMPILED = re.compile(r"^compiled (?P<sig>.+) in (?P<secs>\d+\.\d{3}) s \(thread (?P<thread>.+)\)$")


def test_compile_logs_one_info_record_with_signature_seconds_thread():
    fun, name = fresh("log_fn")
    comp = CountingCompiler(delay=0.05)
    jf = ftjit.jit(fun, compiler=comp, cache=ftjit.FunctionCache())
    with LogCapture(name) as cap:
        jf(z(8, 128))
        jf(z(8, 128))
        jf(3)
    recs = cap.records
    assert [r.levelno for r in recs] == [INFO, INFO]
    assert all(r.name == "ftjit" for r in recs)
    parsed = [_COMPILED.match(r.getMessage()) for r in recs]
    assert all(parsed), [r.getMessage() for r in recs]
    assert [m["sig"] for m in parsed] == [f"{name}(float32[8,128])", f"{name}(int)"]
    me = threading.current_thread().name
    assert [m["thread"] for m in parsed] == [me, me]
    by_sig = {s.signature: s.compile_seconds for s in jf.signatures()}
    for m in parsed:
        secs = float(m["secs"])
        assert secs >= 0.05 - 0.0005
        assert secs == pytest.approx(by_sig[m["sig"]], abs=0.0006)


def test_failed_compile_logs_info_with_error():
    fun, name = fresh("log_fail")
    comp = CountingCompiler(fail=ValueError("no kernel for size 3"))
    jf = ftjit.jit(fun, compiler=comp, cache=ftjit.FunctionCache())
    with LogCapture(name) as cap:
        with pytest.raises(ValueError, match="^no kernel for size 3$"):
            jf(z(3))
    msgs = cap.messages()
    assert [r.levelno for r in cap.records] == [INFO]
    m = re.match(
        rf"^compile of {re.escape(name)}\(float32\[3\]\) failed after \d+\.\d{{3}} s "
        rf"\(thread {re.escape(threading.current_thread().name)}\): ValueError: no kernel for size 3$",
        msgs[0],
    )
    assert m, msgs
    assert jf.cache_info().failures == 1


def test_waiter_logs_debug_waited_record():
    fun, name = fresh("log_wait")
    comp, started, _ = gated_compiler(lambda: jf.cache_info().waits >= 1)
    jf = ftjit.jit(fun, compiler=comp, cache=ftjit.FunctionCache())

    def target(i):
        if i == 1:
            assert started.wait(10)
        return jf(z(4))

    with LogCapture(name) as cap:
        run_threads(2, target)
    debug = [r for r in cap.records if r.levelno == DEBUG]
    info = [r for r in cap.records if r.levelno == INFO]
    assert len(info) == 1
    assert _COMPILED.match(info[0].getMessage())["thread"] == "ftjit-test-0"
    assert len(debug) == 1
    m = re.match(
        rf"^waited (?P<secs>\d+\.\d{{3}}) s for {re.escape(name)}\(float32\[4\]\), "
        r"compiled by another thread \(thread ftjit-test-1\)$",
        debug[0].getMessage(),
    )
    assert m, debug[0].getMessage()
    # The logged wait is cache_info().wait_seconds, rounded to 3 decimals.
    assert float(m["secs"]) == pytest.approx(jf.cache_info().wait_seconds, abs=0.0006)
    assert comp.calls == 1
