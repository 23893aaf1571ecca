"""fn.warmup(specs, workers=N): compile many signatures in parallel threads, before traffic arrives.

Read top to bottom: the spec and report types, the progress bar, warmup()
itself with its worker threads, and the check that worker threads would
compile the same signatures as the calling thread (thread-local JAX config).

Shared state: none at module level. Within one warmup(), the worker threads
share the progress bar, whose counter and drawing are guarded by its
_lock (a leaf: only the stream write runs under it), and _run_each's
result list and counters, guarded by its condition's lock (a leaf: no
compile, write or callback runs under it). Each spec compiles through
fn.precompile (a SavedSpec through fn._precompile_saved), so compile-once
against live traffic is the core's to keep.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import sys
import threading
import time
import warnings
from typing import Any, Iterable, Iterator, Mapping, Sequence, TextIO

logger = logging.getLogger("ftjit")


@dataclasses.dataclass(frozen=True)
class Spec:
    """One call to warm up: positional and keyword arguments (values or jax.ShapeDtypeStruct)."""

    args: tuple = ()
    kwargs: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.args, tuple):
            raise TypeError(
                f"ftjit.Spec: args must be a tuple of positional arguments, got {type(self.args).__name__} "
                f"(one argument x is Spec((x,)))"
            )
        if not isinstance(self.kwargs, Mapping) or not all(isinstance(k, str) for k in self.kwargs):
            raise TypeError(f"ftjit.Spec: kwargs must be a mapping of str to arguments, got {self.kwargs!r}")

    @staticmethod
    def of(spec: Any) -> "Spec | BrokenSpec":
        if isinstance(spec, (Spec, BrokenSpec)):
            return spec
        if isinstance(spec, tuple):
            return Spec(spec, {})
        raise TypeError(
            f"a warmup spec must be a tuple of positional arguments or ftjit.Spec(args, kwargs), got {spec!r}"
        )


class SavedSpec(Spec):
    """A spec saved by an earlier run (``ftjit.load_specs(...).for_function(fn)``
    gives these). ``warmup()`` compiles the program's own specs first, then
    these, and only into the room ``max_signatures`` leaves: a saved spec's
    signature is not counted against the limit until a call (or a
    ``precompile``) uses it, so a stale one never takes a signature the
    program needs. One that finds no room is reported as skipped."""


@dataclasses.dataclass(frozen=True)
class BrokenSpec:
    """A spec that could not be rebuilt (ftjit.load_specs): warming it up
    compiles nothing and reports ``error`` for ``signature``, so that a start
    from a stale or damaged specs file goes on and says what it skipped."""

    signature: str
    error: Exception


@dataclasses.dataclass(frozen=True)
class WarmupResult:
    signature: str
    seconds: float
    compiled: bool  # False: it was cached already (or compiled by another thread meanwhile), or skipped
    error: BaseException | None
    #: Why a SavedSpec was not compiled although nothing failed (no room under max_signatures), else None.
    skipped: str | None = None

    def shown(self) -> tuple[str, str]:
        """(signature, outcome) as a report shows them: printable (see ``printable``) and each cut to
        ``MAX_TEXT`` characters, since a specs file's signatures and errors may hold any text of any length.
        The outcome is "compiled", "cached", "skipped: why", or the error as "Type: message"."""
        what = "compiled" if self.compiled else "cached"
        if self.skipped is not None:
            what = f"skipped: {self.skipped}"
        if self.error is not None:
            what = f"{type(self.error).__name__}: {cut(str(self.error))}"
        # Cut before escaping too: escaping a file's megabytes only to cut them would cost as much again.
        return cut(printable(cut(self.signature))), cut(printable(cut(what)))


@dataclasses.dataclass(frozen=True)
class WarmupReport:
    """What warmup() did, in the order of the specs."""

    results: tuple[WarmupResult, ...]
    wall_seconds: float
    workers: int

    def __len__(self) -> int:
        """The number of specs warmed up (one result each)."""
        return len(self.results)

    def __iter__(self) -> Iterator[WarmupResult]:
        """The results, in the order of the specs."""
        return iter(self.results)

    def __getitem__(self, index: int) -> WarmupResult:
        """The result of the spec at ``index``."""
        return self.results[index]

    @property
    def ok(self) -> bool:
        return all(r.error is None for r in self.results)

    @property
    def errors(self) -> tuple[WarmupResult, ...]:
        return tuple(r for r in self.results if r.error is not None)

    def __str__(self) -> str:
        """A table, one line per result (the first MAX_REPORT_ROWS, then one
        line for the rest), then a summary line. Each result is shown as
        ``WarmupResult.shown`` gives it: text that is not printable (a line
        break, a terminal escape, a lone surrogate: a specs file's signature
        may hold any) escaped as ``repr`` escapes it, so that a result is one
        line and the table prints on a strict UTF-8 stream, and cut to
        MAX_TEXT characters, so that the table's size is bounded by its
        number of rows whatever a file holds."""
        rows = [("signature", "seconds", "result")]
        for r in self.results[:MAX_REPORT_ROWS]:
            signature, what = r.shown()
            rows.append((signature, f"{r.seconds:.3f}", what))
        w0 = max(len(r[0]) for r in rows)
        w1 = max(len(r[1]) for r in rows)
        lines = [f"{a.ljust(w0)}  {b.rjust(w1)}  {c}" for a, b, c in rows]
        lines.insert(1, f"{'-' * w0}  {'-' * w1}  ------")
        more = self.results[MAX_REPORT_ROWS:]
        if more:
            errors = sum(r.error is not None for r in more)
            lines.append(f"... and {len(more)} more ({errors} of them errors): WarmupReport.results has them all")
        n_ok = sum(r.error is None for r in self.results)
        lines.append(
            f"warmup: {n_ok}/{len(self.results)} ok in {self.wall_seconds:.2f} s with {self.workers} worker(s)"
        )
        return "\n".join(lines)


#: The most results WarmupReport's text lists, one line each; one more line counts the rest.
MAX_REPORT_ROWS = 100
#: The most characters of one text a report shows (a signature, an error's message): a specs file's
#: signature may be megabytes, and a table pads every row to its longest.
MAX_TEXT = 1000


def cut(text: str, limit: int = MAX_TEXT) -> str:
    """``text``, or its first characters and how many more there were, in at most about ``limit`` characters."""
    if len(text) <= limit:
        return text
    return f"{text[:limit - 40]}... ({len(text) - (limit - 40)} more characters)"


def printable(text: str) -> str:
    """``text`` with each character that is not printable (line breaks, tabs,
    terminal escapes, format characters, lone surrogates) written as ``repr``
    writes it: ``\\n``, ``\\x1b``, ``\\ud800``."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class _Progress:
    """A one-line progress bar (``label [####....] done/total``), ended by a newline once every spec is done.

    ``progress``: None draws on stderr only when stderr is a terminal; True
    always draws on stderr; False never draws; a writable text stream (an
    object with ``write``) always draws on that stream.
    """

    def __init__(self, total: int, label: str, progress: Any):
        self.total = total
        self.label = label
        self.stream: TextIO | None = _progress_stream(progress)
        self.done = 0
        self._lock = threading.Lock()  # guards done and the drawing

    def step(self) -> None:
        failure = None
        with self._lock:
            self.done += 1
            if self.stream is None:
                return
            width = 30
            filled = width * self.done // max(self.total, 1)
            try:
                self.stream.write(
                    f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total}"
                )
                if self.done == self.total:
                    self.stream.write("\n")
                self.stream.flush()
            except Exception as exc:  # noqa: BLE001 - a broken stream must not lose the report
                self.stream = None
                failure = exc
        if failure is not None:
            logger.warning("warmup: progress bar disabled, its stream failed: %r", failure)


def _progress_stream(progress: Any) -> TextIO | None:
    """Where the bar is drawn, or None (see _Progress); TypeError for anything but bool, None or a stream."""
    if progress is None:
        stderr = sys.stderr
        isatty = getattr(stderr, "isatty", None)
        return stderr if isatty is not None and isatty() else None
    if progress is True:
        return sys.stderr
    if progress is False:
        return None
    if callable(getattr(progress, "write", None)):
        return progress
    raise TypeError(f"progress must be True, False, None or a writable text stream, got {progress!r}")


def warmup(
    fn: Any,
    specs: Iterable[Any],
    workers: int,
    strict: bool,
    progress: bool | None | TextIO,
) -> WarmupReport:
    """Compiles each spec's signature into ``fn``'s cache, ``workers`` at a time.

    Specs are tuples of positional arguments, ``ftjit.Spec(args, kwargs)``, or
    ``ftjit.SavedSpec`` (from a specs file); arguments may be concrete or
    ``jax.ShapeDtypeStruct``. Nothing is executed. XLA compiles release the
    GIL, so several workers overlap them. The program's own specs are
    compiled first, then the saved ones, into the room ``max_signatures``
    leaves (see SavedSpec). Errors are collected in the report; with
    ``strict=True`` the first one (in spec order) is raised after all specs
    ran. ``progress`` draws a one-line bar: None (default) on stderr when it
    is a terminal, True always on stderr, False never, or a text stream to
    draw on. A KeyboardInterrupt in the calling thread ends the warm-up at
    once, even while a worker is stuck in a compile (which finishes in its
    daemon thread, and serves later calls). Thread-safe, and compile-once
    holds against concurrent calls of ``fn``. The body of JitFunction.warmup,
    which declares the parameters and their defaults and passes each one.
    """
    if not isinstance(workers, int) or isinstance(workers, bool):
        raise TypeError(f"workers must be a positive int, got {workers!r}")
    if workers < 1:
        raise ValueError(f"workers must be a positive int, got {workers!r}")
    items: Sequence[Spec | BrokenSpec] = [Spec.of(s) for s in specs]
    bar = _Progress(len(items), f"warmup {getattr(fn, '__name__', 'fn')}", progress)

    def run(spec: Spec | BrokenSpec) -> WarmupResult:
        t0 = time.perf_counter()
        if isinstance(spec, BrokenSpec):
            bar.step()
            return WarmupResult(spec.signature, 0.0, False, spec.error)
        try:
            signature = fn._signature_of(*spec.args, **spec.kwargs)
        except Exception as exc:  # a KeyboardInterrupt ends the warm-up instead
            bar.step()
            return WarmupResult(f"<{type(exc).__name__}>", 0.0, False, exc)
        skipped = None
        try:
            if isinstance(spec, SavedSpec):
                outcome = fn._precompile_saved(*spec.args, **spec.kwargs)
                compiled = outcome == 1
                if outcome < 0:
                    skipped = "no room under max_signatures beside the program's own signatures and other saved specs"
            else:
                compiled = fn.precompile(*spec.args, **spec.kwargs)
            error = None
        except Exception as exc:
            compiled, error = False, exc
        bar.step()
        return WarmupResult(signature, time.perf_counter() - t0, bool(compiled), error, skipped)

    if workers > 1 and len(items) > 1 and not _same_context_in_a_new_thread(fn):
        warnings.warn(
            f"warmup of {getattr(fn, '__name__', 'fn')}: this thread's tracing context (e.g. a thread-local "
            "jax config such as jax.enable_x64(), which worker threads do not inherit) differs from a new "
            f"thread's, so the specs are compiled in this thread, one at a time (workers={workers} ignored)",
            RuntimeWarning,
            stacklevel=2,  # the caller of JitFunction.warmup (a nanobind method: no frame of its own)
        )
        workers = 1
    t0 = time.perf_counter()
    results: list[WarmupResult | None] = [None] * len(items)
    # The program's own specs first, then the saved ones into the room those leave.
    own = [i for i, spec in enumerate(items) if not isinstance(spec, SavedSpec)]
    saved = [i for i, spec in enumerate(items) if isinstance(spec, SavedSpec)]
    for phase in (own, saved):
        done = _run_each(run, [items[i] for i in phase], workers)
        for i, result in zip(phase, done):
            results[i] = result
    report = WarmupReport(tuple(r for r in results if r is not None), time.perf_counter() - t0, workers)
    if strict and report.errors:
        raise report.errors[0].error  # type: ignore[misc]
    return report


def _run_each(run: Any, items: Sequence[Any], workers: int) -> list[WarmupResult]:
    """``[run(item) for item in items]``, ``workers`` at a time.

    With more than one worker, in daemon threads that this thread waits for
    in 0.1 s slices: a KeyboardInterrupt here returns at once (the workers
    take no further item; one stuck in a compile finishes in the
    background). Not a ThreadPoolExecutor: its threads are joined when it
    is shut down and again at interpreter exit, so a stuck compile would
    hold the warm-up, and then the process, until it ended."""
    if workers == 1 or len(items) <= 1:
        return [run(item) for item in items]
    results: list[Any] = [None] * len(items)
    cond = threading.Condition()
    taken = finished = 0  # guarded by cond
    stop = False  # guarded by cond

    def work() -> None:
        nonlocal taken, finished
        while True:
            with cond:
                if stop or taken == len(items):
                    return
                i = taken
                taken += 1
            try:
                result: Any = run(items[i])
            except BaseException as exc:  # noqa: BLE001 - e.g. SystemExit in a compile: reported, never lost
                result = WarmupResult("<warmup worker>", 0.0, False, exc)
            with cond:
                results[i] = result
                finished += 1
                cond.notify_all()

    for k in range(min(workers, len(items))):
        threading.Thread(target=work, name=f"ftjit-warmup-{k}", daemon=True).start()
    try:
        with cond:
            while finished < len(items):
                cond.wait(0.1)
    except BaseException:
        with cond:
            stop = True
        raise
    return results


def _same_context_in_a_new_thread(fn: Any) -> bool:
    """Whether a worker thread would compile the signatures this thread's
    calls use: the context the core keys calls on is equal here and in a new
    thread (JAX's thread-local config, e.g. ``jax.enable_x64()``, is not
    inherited)."""
    try:
        mine = fn._current_context()
        if mine is None:
            return True
        with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="ftjit-warmup") as probe:
            theirs = probe.submit(fn._current_context).result()
        return bool(mine == theirs)
    except Exception:  # noqa: BLE001 - unknown: the safe choice is this thread
        return False
