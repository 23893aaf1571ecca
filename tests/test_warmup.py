"""warmup() and ftjit.Spec: compiling a list of signatures ahead of traffic,
in worker threads (or in the caller's thread when its tracing context would
not carry over to them), the report (results in spec order, errors without
raising, strict=True), and the progress bar.

Every test builds its own FunctionCache and fresh functions. Functions whose
names show up in process-wide places (logs, stats()) get a unique name per
test run (helpers.unique_name), so parallel copies of a test never see each
other's records. Thread tests start on a Barrier (helpers.run_threads), join
with a timeout and re-raise worker exceptions.
"""

import _thread
import logging
import re
import signal
import threading
import time
import warnings

import numpy as np
import pytest

import ftjit
from helpers import CountingCompiler, LogCapture, fresh1, named, run_threads, unique_name, wait_for, z

pytestmark = pytest.mark.timeout(120)


# --- warmup(): results, duplicates, errors ------------------------------------


def test_warmup_results_in_order_then_hits():
    name = unique_name("warm")

    def fun(x, n):
        return x * n

    named(fun, name)
    comp = CountingCompiler(delay=0.02)
    jf = ftjit.jit(fun, static_argnames="n", compiler=comp, cache=ftjit.FunctionCache())
    specs = [(z(4), 2), ftjit.Spec((z(4),), {"n": 3}), (z(2, 2, dtype=np.int32), 2), (1.5, 2)]
    report = jf.warmup(specs, workers=2)
    assert isinstance(report, ftjit.WarmupReport)
    assert report.ok and report.errors == ()
    assert [r.signature for r in report.results] == [
        f"{name}(float32[4], 2)",
        f"{name}(float32[4], n=3)",
        f"{name}(int32[2,2], 2)",
        f"{name}(float, 2)",
    ]
    assert all(isinstance(r, ftjit.WarmupResult) for r in report.results)
    assert all(r.compiled and r.error is None and r.seconds >= 0.02 for r in report.results)
    # A report is the sequence of its results: len, iteration and indexing.
    assert len(report) == 4
    assert list(report) == list(report.results)
    assert report[0] is report.results[0] and report[-1].signature == f"{name}(float, 2)"
    assert comp.calls == 4
    assert comp.exec_calls == 0  # nothing executed
    info = jf.cache_info()
    assert (info.compiles, info.hits) == (4, 0)
    # Real calls of those signatures are hits.
    assert np.array_equal(jf(np.ones(4, np.float32), 2), np.full(4, 2, np.float32))
    assert np.array_equal(jf(np.ones(4, np.float32), n=3), np.full(4, 3, np.float32))
    assert jf(1.5, 2) == 3.0
    assert comp.calls == 4
    assert jf.cache_info().hits == 3
    text = str(report)
    for r in report.results:
        assert r.signature in text
    assert "compiled" in text
    assert text.splitlines()[-1].startswith("warmup: 4/4 ok")
    assert "2 worker(s)" in text.splitlines()[-1]
    # Warming again: everything is cached already.
    again = jf.warmup(specs)
    assert [r.compiled for r in again.results] == [False] * 4
    assert "cached" in str(again)
    assert comp.calls == 4


def test_warmup_duplicates_compile_once():
    comp = CountingCompiler(delay=0.1)
    jf = ftjit.jit(lambda x: x, compiler=comp, cache=ftjit.FunctionCache())
    specs = [(z(1),), (z(1),), (z(2),), (z(1),)]
    report = jf.warmup(specs, workers=4)
    assert report.ok
    assert comp.calls == 2
    assert jf.cache_info().compiles == 2
    assert sum(report.results[i].compiled for i in (0, 1, 3)) == 1
    assert report.results[2].compiled
    sigs = [r.signature for r in report.results]
    assert sigs[0] == sigs[1] == sigs[3] != sigs[2]
    serial = ftjit.jit(lambda x: x, compiler=CountingCompiler(), cache=ftjit.FunctionCache())
    rep = serial.warmup(specs, workers=1)
    assert [r.compiled for r in rep.results] == [True, False, True, False]


def _picky_compiler(bad_sizes, delay=0.0):
    inner = CountingCompiler(delay=delay)

    def compiler(fun, args, kwargs):
        size = args[0].shape[0]
        if size in bad_sizes:
            raise bad_sizes[size]
        return inner(fun, args, kwargs)

    return compiler, inner


def test_warmup_reports_errors_without_raising():
    compiler, inner = _picky_compiler({3: ValueError("bad size 3")})
    jf = ftjit.jit(lambda x: x, compiler=compiler, cache=ftjit.FunctionCache())
    specs = [(z(1),), (z(3),), (object(),), (z(2),)]
    report = jf.warmup(specs, workers=2)
    assert not report.ok
    res = report.results
    assert [r.error is None for r in res] == [True, False, False, True]
    assert [r.compiled for r in res] == [True, False, False, True]
    assert isinstance(res[1].error, ValueError) and str(res[1].error) == "bad size 3"
    assert isinstance(res[2].error, ftjit.UnsupportedArgumentError)
    assert report.errors == (res[1], res[2])
    assert inner.calls == 2
    text = str(report)
    assert "ValueError: bad size 3" in text
    assert "UnsupportedArgumentError" in text
    assert text.splitlines()[-1].startswith("warmup: 2/4 ok")


def test_warmup_strict_raises_first_error_in_spec_order_after_all_ran():
    compiler, inner = _picky_compiler({3: ValueError("bad size 3"), 5: KeyError("bad size 5")}, delay=0.05)
    jf = ftjit.jit(lambda x: x, compiler=compiler, cache=ftjit.FunctionCache())
    specs = [(z(1),), (z(5),), (z(3),), (z(2),), (z(4),)]
    with pytest.raises(KeyError, match=r"^'bad size 5'$"):  # str(KeyError) is the repr of its key
        jf.warmup(specs, workers=3, strict=True)
    assert inner.calls == 3  # every good spec still ran
    assert jf.cache_info().compiles == 3
    specs2 = [(z(1),), (z(3),), (z(5),)]
    with pytest.raises(ValueError, match="^bad size 3$"):
        jf.warmup(specs2, workers=1, strict=True)


def test_warmup_lets_a_keyboard_interrupt_through():
    class Interrupting:
        def __hash__(self):
            raise KeyboardInterrupt

    comp = CountingCompiler()
    jf = ftjit.jit(lambda x, s: x, static_argnums=1, compiler=comp, cache=ftjit.FunctionCache())
    with pytest.raises(KeyboardInterrupt):
        jf.warmup([(1.0, 1), (1.0, Interrupting()), (1.0, 2)], progress=False)
    assert comp.calls == 1


# --- specs and workers --------------------------------------------------------


@pytest.mark.parametrize("workers, error", [(0, ValueError), (-1, ValueError), (True, TypeError), (1.0, TypeError),
                                             ("2", TypeError)])
def test_warmup_invalid_workers(workers, error):
    comp = CountingCompiler()
    jf = ftjit.jit(lambda x: x, compiler=comp, cache=ftjit.FunctionCache())
    with pytest.raises(error) as info:
        jf.warmup([(z(1),)], workers=workers)
    assert type(info.value) is error and str(info.value) == f"workers must be a positive int, got {workers!r}"
    assert comp.calls == 0


@pytest.mark.parametrize("args, kwargs, message", [
    ((np.ones(3),), {}, "ftjit.Spec: args must be a tuple of positional arguments, got ndarray (one argument x is "
                        "Spec((x,)))"),
    (([1],), {}, "ftjit.Spec: args must be a tuple of positional arguments, got list (one argument x is Spec((x,)))"),
    (((1,), None), {}, "ftjit.Spec: kwargs must be a mapping of str to arguments, got None"),
    (((1,), {1: 2}), {}, "ftjit.Spec: kwargs must be a mapping of str to arguments, got {1: 2}"),
])
def test_spec_validates_its_fields(args, kwargs, message):
    with pytest.raises(TypeError) as info:
        ftjit.Spec(*args, **kwargs)
    assert str(info.value) == message


def test_warmup_rejects_bad_spec():
    comp = CountingCompiler()
    jf = ftjit.jit(lambda x: x, compiler=comp, cache=ftjit.FunctionCache())
    with pytest.raises(TypeError) as info:
        jf.warmup([z(1)])
    assert str(info.value) == (
        f"a warmup spec must be a tuple of positional arguments or ftjit.Spec(args, kwargs), got {z(1)!r}"
    )
    assert comp.calls == 0


def test_warmup_jax_shape_dtype_structs():
    import jax
    fun, name = fresh1("warm_jax", body=lambda x: x * 2 + 1)
    jf = ftjit.jit(fun, cache=ftjit.FunctionCache())
    sizes = [4, 8, 16, 32]
    specs = [(jax.ShapeDtypeStruct((n,), np.float32),) for n in sizes]
    report = jf.warmup(specs, workers=2)
    assert report.ok, str(report)
    assert [r.signature for r in report.results] == [f"{name}(float32[{n}])" for n in sizes]
    assert all(r.compiled for r in report.results)
    info = jf.cache_info()
    assert (info.compiles, info.misses, info.hits) == (4, 4, 0)
    out = jf(np.ones(8, np.float32))
    np.testing.assert_array_equal(np.asarray(out), np.full(8, 3, np.float32))
    info = jf.cache_info()
    assert (info.compiles, info.misses, info.hits) == (4, 4, 1)
    assert {s.signature for s in jf.signatures()} == {f"{name}(float32[{n}])" for n in sizes}


def test_warmup_workers_run_in_parallel():
    """workers=4 runs 4 compiles at once (they meet at a 4-party barrier, which
    a serial warm-up could never pass); workers=1 runs them one at a time."""
    specs = [(z(i + 1),) for i in range(8)]

    def run(workers):
        lock = threading.Lock()
        state = {"now": 0, "peak": 0}
        barrier = threading.Barrier(workers, timeout=30)

        def meet(fun, args, kwargs):
            with lock:
                state["now"] += 1
                state["peak"] = max(state["peak"], state["now"])
            try:
                barrier.wait()  # BrokenBarrierError after 30 s if fewer run at once
            finally:
                with lock:
                    state["now"] -= 1

        comp = CountingCompiler(on_compile=meet)
        jf = ftjit.jit(lambda x: x, compiler=comp, cache=ftjit.FunctionCache())
        report = jf.warmup(specs, workers=workers)
        assert report.ok, report
        assert comp.calls == 8 and report.workers == workers
        return state["peak"]

    assert run(1) == 1
    assert run(4) == 4


@pytest.mark.thread_unsafe(reason="records warnings (process-global warning filters)")
def test_warmup_under_a_thread_local_jax_config_compiles_in_this_thread():
    # Worker threads do not inherit jax.enable_x64(); warming there would
    # compile float32 signatures for float64 traffic.
    import jax
    fun, name = fresh1("warm_x64", body=lambda x: x * 2)
    jf = ftjit.jit(fun, cache=ftjit.FunctionCache())
    specs = [(np.ones(n),) for n in (1, 2, 3)]
    with jax.enable_x64(True):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            report = jf.warmup(specs, workers=2, progress=False)
        messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
        assert len(messages) == 1, messages
        assert messages[0].startswith(f"warmup of {name}: this thread's tracing context")
        assert messages[0].endswith("(workers=2 ignored)")
        assert caught[0].filename == __file__
        assert report.ok and report.workers == 1
        assert [r.signature for r in report.results] == [f"{name}(float64[{n}])" for n in (1, 2, 3)]
        outs = [jf(*spec) for spec in specs]
    assert [str(o.dtype) for o in outs] == ["float64"] * 3
    info = jf.cache_info()
    assert (info.compiles, info.hits) == (3, 3)


def test_warmup_with_the_default_config_uses_its_workers():
    import jax  # noqa: F401
    fun, name = fresh1("warm_plain")
    jf = ftjit.jit(fun, cache=ftjit.FunctionCache())
    assert ftjit._warmup._same_context_in_a_new_thread(jf)
    report = jf.warmup([(z(n),) for n in (1, 2, 3)], workers=2, progress=False)
    assert report.ok and report.workers == 2


# --- the progress bar ---------------------------------------------------------


def _bar(label, done, total, width=30):
    filled = width * done // total
    return f"\r{label} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}"


@pytest.mark.parametrize("workers", [1, 3])
def test_warmup_progress_bar_on_a_stream_draws_every_count_then_a_newline(workers):
    import io

    fun, name = fresh1("warm_bar")
    comp = CountingCompiler()
    jf = ftjit.jit(fun, compiler=comp, cache=ftjit.FunctionCache())
    out = io.StringIO()
    report = jf.warmup([(z(1),), (z(2),), (z(3),)], workers=workers, progress=out)
    assert report.ok and comp.calls == 3
    # Counts are taken under the bar's lock, so they come out 1, 2, 3 whichever worker finishes first.
    assert out.getvalue() == "".join(_bar(f"warmup {name}", k, 3) for k in (1, 2, 3)) + "\n"


def test_warmup_progress_rejects_what_is_not_a_bool_none_or_stream():
    comp = CountingCompiler()
    jf = ftjit.jit(lambda x: x, compiler=comp, cache=ftjit.FunctionCache())
    with pytest.raises(TypeError, match=r"^progress must be True, False, None or a writable text stream, got 'yes'$"):
        jf.warmup([(z(1),)], progress="yes")
    assert comp.calls == 0


@pytest.mark.thread_unsafe(reason="capsys and a patched sys.stderr are process-global")
def test_warmup_progress_true_draws_on_stderr_none_only_on_a_terminal(capsys, monkeypatch):
    import io
    import sys

    specs = [(z(1),), (z(2),), (z(3),)]

    def warm(progress):
        fun, name = fresh1("warm_tty")
        jf = ftjit.jit(fun, compiler=CountingCompiler(), cache=ftjit.FunctionCache())
        assert jf.warmup(specs, workers=2, progress=progress).ok
        return name

    assert not sys.stderr.isatty()  # pytest's capture: not a terminal
    warm(None)
    warm(False)
    assert capsys.readouterr() == ("", "")
    name = warm(True)
    assert capsys.readouterr() == ("", "".join(_bar(f"warmup {name}", k, 3) for k in (1, 2, 3)) + "\n")

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    name = warm(None)
    assert terminal.getvalue() == "".join(_bar(f"warmup {name}", k, 3) for k in (1, 2, 3)) + "\n"
    warm(False)
    assert terminal.getvalue().count("\n") == 1


class _FailingStream:
    def __init__(self, tag="stream closed"):
        self.writes = 0
        self.tag = tag

    def write(self, text):
        self.writes += 1
        raise OSError(self.tag)

    def flush(self):
        pass


@pytest.mark.parametrize("workers", [1, 2])
def test_warmup_survives_a_progress_stream_that_fails(workers):
    comp = CountingCompiler()
    jf = ftjit.jit(lambda x: x, compiler=comp, cache=ftjit.FunctionCache())
    tag = unique_name("closed")  # this copy's records only, when copies run in parallel
    stream = _FailingStream(tag)
    with LogCapture(tag) as cap:
        report = jf.warmup([(z(n),) for n in (1, 2, 3)], workers=workers, progress=stream)
    assert report.ok and [r.compiled for r in report.results] == [True, True, True]
    assert comp.calls == 3
    assert stream.writes == 1  # the bar is dropped after its first failure
    assert cap.messages(logging.WARNING) == [f"warmup: progress bar disabled, its stream failed: OSError('{tag}')"]


# --- SavedSpec: a specs file's signatures, never at the program's expense ------


def _saved_guarded(max_signatures):
    comp = CountingCompiler()
    jf = ftjit.jit(lambda x: x * 2, compiler=comp, cache=ftjit.FunctionCache(), max_signatures=max_signatures,
                   on_excess="raise")
    return jf, comp


def test_saved_specs_warm_after_the_programs_own_and_only_into_the_room_left():
    """The program's own specs compile first wherever they stand in the list;
    saved ones then fill only the room max_signatures leaves (one here), a
    saved one already cached is "cached", and a saved spec counts against
    the limit only when a call uses it."""
    jf, comp = _saved_guarded(3)
    saved = [ftjit.SavedSpec((z(64),)), ftjit.SavedSpec((z(4),)), ftjit.SavedSpec((z(1),))]
    report = jf.warmup([saved[0], (z(1),), saved[1], (z(2),), saved[2]], workers=1)
    assert [(r.compiled, r.skipped, r.error) for r in report] == [
        (True, None, None),  # the room left after the program's own two
        (True, None, None),
        (False, "no room under max_signatures beside the program's own signatures and other saved specs", None),
        (True, None, None),
        (False, None, None),  # cached: the program's own
    ]
    assert report.ok and "skipped: no room under max_signatures" in str(report)
    assert comp.calls == 3
    assert jf.cache_info().size == 3
    # float32[4] was skipped: traffic compiles it (the third counted signature).
    assert np.array_equal(jf(np.ones(4, np.float32)), np.full(4, 2, np.float32))
    assert comp.calls == 4
    # float32[64] was warmed but never counted: its first call counts it, past the limit.
    with pytest.raises(ftjit.RecompileLimitError, match=r"past max_signatures=3"):
        jf(np.ones(64, np.float32))
    info = jf.cache_info()
    assert (info.size, info.compiles, info.failures) == (3, 4, 1)
    assert comp.calls == 4  # the refusal compiled nothing


@pytest.mark.parametrize("workers", [1, 4])
def test_a_stale_saved_spec_never_takes_a_buckets_slot(workers):
    """issue 34 §2: a server restarted with fewer buckets than its specs file
    names. The stale signature comes first in the list; the buckets still
    get every slot, the stale spec is skipped, and every bucket's call hits."""
    jf, comp = _saved_guarded(2)
    report = jf.warmup([ftjit.SavedSpec((z(64),)), (z(1),), (z(2),)], workers=workers)
    assert [(r.compiled, r.skipped is not None) for r in report] == [(False, True), (True, False), (True, False)]
    for n in (1, 2):
        assert np.array_equal(jf(np.ones(n, np.float32)), np.full(n, 2, np.float32))
    info = jf.cache_info()
    assert (info.size, info.compiles, info.hits, info.failures) == (2, 2, 2, 0)
    assert sorted(s.signature for s in jf.signatures()) == sorted(
        [jf._signature_of(z(1)), jf._signature_of(z(2))])  # the stale one is not cached: never saved again


def test_saved_specs_reserve_their_room_exactly_under_parallel_workers():
    """Four workers warm eight saved specs into three free slots at once:
    exactly three compile (the room is reserved, not read then taken)."""
    jf, comp = _saved_guarded(3)
    report = jf.warmup([ftjit.SavedSpec((z(n),)) for n in range(1, 9)], workers=4)
    assert sum(r.compiled for r in report) == 3
    assert sum(r.skipped is not None for r in report) == 5
    assert comp.calls == 3 and jf.cache_info().size == 3


def test_a_herd_adopts_a_saved_spec_once():
    """Twelve threads call a warmed saved spec's signature at once: one
    adopts it (counted against the limit, no compile: a hit, as the
    signature was compiled), the others wait for that or hit."""
    jf, comp = _saved_guarded(4)
    assert jf.warmup([ftjit.SavedSpec((z(3),))]).results[0].compiled
    before = jf.cache_info()
    out = run_threads(12, lambda i: jf(np.full(3, i, np.float32)))
    assert [o.tolist() for o in out] == [[2.0 * i] * 3 for i in range(12)]
    info = jf.cache_info()
    assert comp.calls == 1 and info.compiles == 1
    assert info.misses == before.misses
    assert info.hits + info.waits == 12 and info.hits >= 1
    assert info.size == 1


def test_a_herd_on_a_saved_spec_past_the_limit_all_get_the_refusal():
    """The limit filled after a saved spec was warmed: its adoption is
    refused as a compile past it would be, and every thread of the herd
    gets RecompileLimitError; the saved entry is dropped."""
    jf, comp = _saved_guarded(2)
    assert jf.warmup([ftjit.SavedSpec((z(3),))]).results[0].compiled
    jf(np.ones(1, np.float32))
    jf(np.ones(2, np.float32))

    def call(i):
        try:
            jf(np.ones(3, np.float32))
        except ftjit.RecompileLimitError as exc:
            return type(exc)
        return None

    assert run_threads(12, call) == [ftjit.RecompileLimitError] * 12
    info = jf.cache_info()
    assert (info.size, info.compiles) == (2, 3) and comp.calls == 3
    assert info.failures >= 1


def test_precompile_adopts_a_saved_spec_without_compiling():
    jf, comp = _saved_guarded(2)
    assert jf.warmup([ftjit.SavedSpec((z(3),))]).results[0].compiled
    assert jf.precompile(z(3)) is False  # adopted: compiled already, now counted
    jf(np.ones(1, np.float32))
    with pytest.raises(ftjit.RecompileLimitError):
        jf(np.ones(2, np.float32))  # the adopted one counts: 2 of 2
    assert comp.calls == 2


# --- oversized shapes, Ctrl-C -------------------------------------------------------


class _Described:
    """An array spec for a compiler without JAX: dtype and shape only."""

    def __init__(self, shape, dtype=np.float32):
        self.shape, self.dtype = shape, np.dtype(dtype)


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        ((2**40, 2**40), r"float32\[1099511627776,1099511627776\], whose size in bytes does not fit in a signed "
                         r"64-bit integer: no array can have it \(XLA would abort the process compiling it\)"),
        ((2**61, 2), r"float32\[2305843009213693952,2\], whose size in bytes does not fit"),  # elements fit, bytes not
        ((4, -1), r"float32\[4,-1\], whose dimension -1 is negative"),
    ],
)
def test_a_spec_no_array_can_have_is_refused_before_compiling(shape, message):
    comp = CountingCompiler()
    jf = ftjit.jit(lambda x: x, compiler=comp, cache=ftjit.FunctionCache())
    with pytest.raises(ValueError, match=r"^Argument 'x' has the shape " + message):
        jf.precompile(_Described(shape))
    report = jf.warmup([(_Described(shape),)])
    assert isinstance(report.results[0].error, ValueError)
    assert comp.calls == 0 and jf.cache_info().size == 0


def test_an_oversized_jax_spec_is_refused_instead_of_aborting():
    """jax.ShapeDtypeStruct((2**40, 2**40)) made XLA abort the process (SIGABRT)."""
    jax = pytest.importorskip("jax")
    jf = ftjit.jit(lambda x: x + 1, cache=ftjit.FunctionCache())
    with pytest.raises(ValueError, match=r"float32\[1099511627776,1099511627776\], whose size in bytes"):
        jf.precompile(jax.ShapeDtypeStruct((2**40, 2**40), np.float32))
    assert jf.cache_info().size == 0


def test_the_report_lists_at_most_100_results_then_says_how_many_more():
    comp = CountingCompiler()
    jf = ftjit.jit(lambda x: x, compiler=comp, cache=ftjit.FunctionCache())
    report = jf.warmup([(z(n),) for n in range(1, 251)] + [ftjit.BrokenSpec("f(?)", ValueError("gone"))])
    lines = str(report).splitlines()
    assert len(report) == 251 and len(lines) == 2 + 100 + 2
    assert [line.split()[0].rpartition(".")[2] for line in lines[2:102]] == [
        f"<lambda>(float32[{n}])" for n in range(1, 101)]
    assert lines[-2] == "... and 151 more (1 of them errors): WarmupReport.results has them all"
    assert lines[-1].startswith("warmup: 250/251 ok in ")


@pytest.mark.parametrize(("fun", "shape", "dtype", "message"), [
    (lambda x: x.astype(np.complex64), (2**51,), np.int8,
     r"complex64\[2251799813685248\] \(the result of convert_element_type\) would take 18014398509481984 bytes"),
    (lambda x: (x.astype(np.float32) * 2).sum(), (2**52,), np.int8,
     r"float32\[4503599627370496\] \(a value of convert_element_type\) would take 18014398509481984 bytes"),
    (lambda x: x, (2**54,), np.int8, r"int8\[18014398509481984\] \(an argument\) would take 18014398509481984 bytes"),
], ids=["result", "intermediate", "argument"])  # fmt: skip
def test_a_program_value_past_8_pib_is_refused_after_tracing_and_before_xla(fun, shape, dtype, message):
    """The JAX compiler checks every value of the traced program, not only
    the arguments (whose bytes must fit in 64 bits, above): an int8[2**61]
    argument cast to float32 made XLA abort the process (SIGABRT, "overflow
    in static extent product"). Such a spec is an error of its report line
    and of precompile(); the process lives (tests/test_specs.py checks the
    abort case itself in a child process)."""
    jax = pytest.importorskip("jax")
    jf = ftjit.jit(fun, cache=ftjit.FunctionCache())
    spec = jax.ShapeDtypeStruct(shape, dtype)
    tail = (r", more than the 9007199254740992 \(8 PiB\) ftjit compiles a value of: not compiled \(no device holds "
            r"that much, and XLA aborts the process compiling larger ones\). Is a dimension wrong\?")
    with pytest.raises(ValueError, match="^" + message + tail):  # (JAX adds a note on its traceback filtering)
        jf.precompile(spec)
    (result,) = jf.warmup([(spec,)])
    assert type(result.error) is ValueError and re.fullmatch(message + tail, str(result.error))
    with pytest.raises(ValueError, match="^" + message):
        jf.warmup([(spec,)], strict=True)
    assert jf.cache_info().size == 0 and jf.cache_info().failures == 3


@pytest.mark.thread_unsafe(reason="delivers SIGINT to the main thread")
def test_ctrl_c_returns_from_a_multi_worker_warmup_while_a_compile_is_stuck():
    """issue 34 §7: the warm-up's workers were a ThreadPoolExecutor, whose
    shutdown waits for a stuck compile. Ctrl-C now returns at once: the
    interrupt arrives while the compile is held (until the test lets it
    go), and the compile then finishes in the background and serves calls."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals are only delivered to the main thread")
    started, release = threading.Event(), threading.Event()

    def hook(fun, args, kwargs):
        if args[0].shape == (1,):
            started.set()
            assert release.wait(60)

    comp = CountingCompiler(on_compile=hook)
    jf = ftjit.jit(lambda x: x, compiler=comp, cache=ftjit.FunctionCache())

    def poke():
        if started.wait(10):
            _thread.interrupt_main()

    old_handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    poker = threading.Thread(target=poke, daemon=True)
    interrupted = held_when_interrupted = False
    try:
        poker.start()
        try:
            jf.warmup([(z(n),) for n in (1, 2, 3, 4)], workers=2)
        except KeyboardInterrupt:
            interrupted = True
            held_when_interrupted = not release.is_set()
        if not interrupted:
            try:
                poker.join(15)
                time.sleep(0.5)
            except KeyboardInterrupt:
                pass
    finally:
        release.set()
        poker.join(15)
        signal.signal(signal.SIGINT, old_handler)
    assert interrupted, "KeyboardInterrupt did not end the warm-up"
    assert held_when_interrupted, "the warm-up returned only when the stuck compile did"
    assert wait_for(lambda: jf.cache_info().compiles >= 1, 30)  # the stuck compile finished in the background
    jf(np.ones(1, np.float32))
    info = jf.cache_info()
    assert info.hits + info.waits >= 1 and comp.calls == info.compiles
