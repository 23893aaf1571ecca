"""A bounded load generator for examples/serve.py that checks every answer and prints one report.

``--threads`` threads (one keep-alive connection each) send ``POST /predict``
requests with random batch sizes (1..max_batch, seeded) until ``--requests``
were sent or ``--seconds`` passed, whichever comes first. Every answer is
compared with a float64 numpy reference of the same MLP (a wrong answer
counts apart from errors). The requests (up to ``POOL`` distinct ones) and
their references are made before the clock starts, and an answer whose bytes
equal one already verified for its request is checked by a lookup: the
client's own work per request stays small, so that it is not what caps the
rate (``--route healthz``, the trivial route, measures that ceiling). Then it reads the server's ``/stats`` and prints
the report that ``examples/demo.py`` prints too (``report_rows``). Only
servers on this machine are accepted: on a loopback address, or on a unix
socket (``--unix-socket PATH``, for ``serve.py --unix-socket PATH``).

Run it as ``.venv/bin/python examples/load.py --port 8000 --threads 8 --requests 2000``.
"""

from __future__ import annotations

import argparse
import dataclasses
import http.client
import ipaddress
import json
import os
import socket
import sys
import threading
import time
from typing import Any, Callable, Sequence

import numpy as np

if __package__ in (None, ""):  # run as a script: make the ``examples`` package importable
    # Appended, not first: the clone's root holds the source tree's ftjit/ too, which must not shadow an
    # ftjit installed into this interpreter's environment (pip install '/path/to/ftjit[serve]').
    sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from examples.serve import DEFAULT_MAX_BATCH, DEFAULT_SEED, N_INPUTS, forward, make_weights

#: Tolerances of the check against the numpy reference.
RTOL, ATOL = 1e-4, 1e-5
#: Seconds a request (connect, send, answer) may take before it counts as an error.
REQUEST_TIMEOUT = 30.0
#: LoadReport.stopped_by: every request of the count was sent, or the time limit came first.
STOPPED_BY_COUNT, STOPPED_BY_TIME = "request count", "time limit"


@dataclasses.dataclass(frozen=True)
class LoadReport:
    """What a load run did and saw."""

    requests: int  #: requests sent (answered or not)
    errors: int  #: requests without a well-formed 200 answer (transport errors, other statuses, bad JSON)
    wrong: int  #: 200 answers that disagree with the numpy reference
    threads: int
    seconds: float  #: wall time of the run
    rps: float  #: requests per second
    p50_ms: float  #: median request latency
    p99_ms: float
    max_ms: float
    first_error: str | None  #: the first error or wrong answer, for diagnosis
    stopped_by: str  #: which limit ended the run: STOPPED_BY_COUNT or STOPPED_BY_TIME
    stats: dict[str, Any] | None  #: the server's /stats after the run, None if it did not answer
    route: str = "predict"  #: what each request asked for: "predict" or "healthz" (ROUTES)
    processes: int = 1  #: processes the threads were split across

    @property
    def compiles(self) -> int | None:
        """The server's compiles of the MLP after the run (None under ``serve.py --jit jax``: not counted)."""
        info = None if self.stats is None else self.stats["function"]["cache_info"]
        return None if info is None else info["compiles"]


def reference_forward(weights: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """The served MLP (``serve.forward``) in float64 numpy: the reference that answers are checked against."""
    return forward({k: v.astype(np.float64) for k, v in weights.items()}, np.asarray(x, np.float64))


def check_loopback(host: str) -> None:
    """Raises ValueError unless every address ``host`` resolves to is a loopback address."""
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except socket.gaierror as exc:
        raise ValueError(f"cannot resolve host {host!r}: {exc}") from None
    outside = sorted(a for a in addresses if not ipaddress.ip_address(a.split("%")[0]).is_loopback)
    if outside:
        raise ValueError(
            f"refusing to load {host!r}: it resolves to non-loopback address(es) {', '.join(outside)}; "
            "this load generator only targets servers on this machine (127.0.0.1, ::1, localhost)"
        )


class UnixHTTPConnection(http.client.HTTPConnection):
    """An HTTP connection over the unix socket file ``path`` (its Host header says ``localhost``)."""

    def __init__(self, path: str, timeout: float = REQUEST_TIMEOUT):
        super().__init__("localhost", timeout=timeout)
        self.unix_socket = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.unix_socket)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def connector(host: str, port: int | None, unix_socket: str | None = None,
              timeout: float = REQUEST_TIMEOUT) -> Callable[[], http.client.HTTPConnection]:  # fmt: skip
    """A maker of new connections to the server: over ``unix_socket`` if given, else to ``host:port``,
    which must be a loopback address (ValueError otherwise)."""
    if unix_socket is not None:
        return lambda: UnixHTTPConnection(unix_socket, timeout=timeout)
    check_loopback(host)
    return lambda: http.client.HTTPConnection(host, port, timeout=timeout)


def fetch_json(host: str, port: int | None, path: str, timeout: float = REQUEST_TIMEOUT,
               unix_socket: str | None = None) -> tuple[int, Any]:  # fmt: skip
    """``GET path`` on a loopback server (or the one on ``unix_socket``): (status, decoded JSON body)."""
    connection = connector(host, port, unix_socket, timeout)()
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def make_request(seed: int, index: int, max_batch: int) -> np.ndarray:
    """Request ``index``'s float32 input batch: the same for a given (seed, index), whichever thread sends it."""
    rng = np.random.default_rng((seed, index))
    return rng.standard_normal((int(rng.integers(1, max_batch + 1)), N_INPUTS)).astype(np.float32)


class _Progress:
    """Progress on a stream (stderr by default): on a terminal a ``done/total`` counter redrawn in place
    at most every 0.1 s, elsewhere (a pipe, a CI log) a line every ``LINE_INTERVAL`` s; then a final line.
    Thread-safe."""

    LINE_INTERVAL = 2.0

    def __init__(self, total: int | None, enabled: bool, stream: Any = None, tty: bool | None = None):
        self.total, self.enabled = total, enabled
        self.stream = sys.stderr if stream is None else stream
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)()) if tty is None else tty
        self._lock = threading.Lock()  # guards _last and the drawing
        self._t0 = time.monotonic()
        self._last = 0.0 if self.tty else self._t0  # off a terminal, the first line comes one interval in

    def start(self) -> None:
        """The load starts now: its time counts from here (making requests, or processes, came before)."""
        with self._lock:
            self._t0 = time.monotonic()
            self._last = 0.0 if self.tty else self._t0

    def update(self, done: int, final: bool = False) -> None:
        if not self.enabled:
            return
        with self._lock:
            now = time.monotonic()
            if not final and now - self._last < (0.1 if self.tty else self.LINE_INTERVAL):
                return
            self._last = now
            text = f"load: {done}{'' if self.total is None else f'/{self.total}'} requests, {now - self._t0:.1f} s"
            if self.tty:
                self.stream.write(f"\r{text}" + ("\n" if final else ""))
            else:
                self.stream.write(text + (" (done)" if final else "") + "\n")
            self.stream.flush()


#: Distinct requests made before the clock starts (``run_load(distinct=...)``; as many as the run sends, if fewer):
#: ``make_request(seed, i, ...)`` for i < POOL, dealt round-robin to the threads. Each thread sends its own in turn
#: and keeps the answers it verified.
POOL = 1024
#: Requests a thread claims from the run's budget at a time (one lock acquisition per claim, not per request).
CLAIM = 16
#: Right answers kept per request, at most (distinct bytes: one per program that answered it, in practice).
VERIFIED_KEPT = 8
#: ``--route``: what each request asks for. healthz is the trivial route: the client's and the front's ceiling.
ROUTES = ("predict", "healthz")
_HEALTHY = b'{"ok": true}'


@dataclasses.dataclass(frozen=True)
class _Prepared:
    """One pool request, made before the clock starts: its body and its float64 reference answer."""

    index: int
    body: bytes
    expected: np.ndarray


def _prepare(seed: int, indices: Sequence[int], max_batch: int, weights64: dict[str, np.ndarray]) -> list[_Prepared]:
    out = []
    for i in indices:
        x = make_request(seed, i, max_batch)
        out.append(_Prepared(i, json.dumps({"inputs": x.tolist()}).encode(), forward(weights64, x.astype(np.float64))))
    return out


class _Budget:
    """The run's request count, claimed by the threads CLAIM at a time: the threads that are free keep sending
    until it is spent, as when they took requests one by one, at a lock acquisition per CLAIM requests."""

    def __init__(self, requests: int | None):
        self._lock = threading.Lock()
        self._left = requests  # guarded by _lock; None: no count limit

    def claim(self) -> int | None:
        """How many requests the caller may send next (0: the count is spent; None: no count limit)."""
        with self._lock:
            if self._left is None:
                return None
            granted = min(CLAIM, self._left)
            self._left -= granted
            return granted


class _Worker:
    """One load thread's own state: nothing in it is shared while the load runs, so the hot loop takes no lock.

    An answer is checked as it comes: by a set lookup when its bytes equal an answer already verified for
    the same request (the usual case: a bucket's program answers a request alike each time), else in full
    (parsed and compared with the reference), and then kept as verified."""

    def __init__(self, prepared: list[_Prepared]):
        self.prepared = prepared
        self.verified: list[set[bytes]] = [set() for _ in prepared]
        self.latencies: list[float] = []
        self.sent = 0  #: read by the progress thread (an int attribute: each read sees a whole value)
        self.errors = self.wrong = 0
        self.first_error: tuple[float, str] | None = None  # (when, what)

    def error(self, what: str, wrong: bool = False) -> None:
        if wrong:
            self.wrong += 1
        else:
            self.errors += 1
        if self.first_error is None:
            self.first_error = (time.monotonic(), what)


def _check_answer(status: int, body: bytes, expected: np.ndarray) -> tuple[str | None, bool]:
    """(error description or None, whether it is a wrong answer rather than an error)."""
    if status != 200:
        return f"HTTP {status}: {body[:200]!r}", False
    try:
        outputs = np.asarray(json.loads(body)["outputs"], dtype=np.float64)
    except (ValueError, KeyError, TypeError) as exc:
        return f"malformed answer ({type(exc).__name__}: {exc}): {body[:200]!r}", False
    if outputs.shape != expected.shape:
        return f"wrong answer: shape {outputs.shape}, expected {expected.shape}", True
    if not np.allclose(outputs, expected, rtol=RTOL, atol=ATOL):
        return f"wrong answer: differs from the reference by up to {np.max(np.abs(outputs - expected)):.3g}", True
    return None, False


def _check_health(status: int, body: bytes) -> tuple[str | None, bool]:
    if status == 200 and body == _HEALTHY:
        return None, False
    return f"HTTP {status} from /healthz: {body[:200]!r}", False


def _run_worker(worker: _Worker, budget: _Budget, connect: Callable[[], http.client.HTTPConnection], route: str,
                deadline: float | None) -> None:  # fmt: skip
    """Sends requests over one keep-alive connection (reopened after an error) until the run's count is spent
    or the deadline passed."""
    connection: http.client.HTTPConnection | None = None
    prepared, verified, latencies, n = worker.prepared, worker.verified, worker.latencies, len(worker.prepared)
    predict = route == "predict"
    headers = {"Content-Type": "application/json"}
    clock = time.perf_counter
    claimed: int | None = 0
    while True:
        if deadline is not None and time.monotonic() >= deadline:
            break
        if claimed == 0:
            claimed = budget.claim()
            if claimed == 0:
                break
        if claimed is not None:
            claimed -= 1
        k = worker.sent % n
        t0 = clock()
        try:
            connection = connection or connect()
            if predict:
                connection.request("POST", "/predict", prepared[k].body, headers)
            else:
                connection.request("GET", "/healthz")
            response = connection.getresponse()
            answer = response.read()
        except (OSError, http.client.HTTPException) as exc:
            latencies.append(clock() - t0)
            worker.sent += 1
            worker.error(f"{type(exc).__name__}: {exc}")
            if connection is not None:
                connection.close()
            connection = None
            continue
        latencies.append(clock() - t0)
        worker.sent += 1
        if response.will_close:
            connection.close()
            connection = None
        if not predict:
            error, wrong = _check_health(response.status, answer)
        elif response.status == 200 and answer in verified[k]:
            continue
        else:
            try:
                error, wrong = _check_answer(response.status, answer, prepared[k].expected)
            except Exception as exc:  # noqa: BLE001 - a sent request is always judged
                error, wrong = f"answer not checkable ({type(exc).__name__}: {exc})", False
            if error is None and len(verified[k]) < VERIFIED_KEPT:
                verified[k].add(answer)
        if error is not None:
            worker.error(error, wrong)
    if connection is not None:
        connection.close()


@dataclasses.dataclass(frozen=True)
class _Part:
    """What one process's load threads did (``_run_part``): ``run_load`` adds the parts up."""

    sent: int
    errors: int
    wrong: int
    first_error: tuple[float, str] | None  #: (when, on the system's monotonic clock; what)
    latencies: np.ndarray  #: seconds, one per request sent


def _make_workers(thread_ids: Sequence[int], threads: int, pool: int, seed: int, max_batch: int, weights_seed: int,
                  route: str) -> list[_Worker]:  # fmt: skip
    """The workers of the load threads ``thread_ids`` of ``threads`` in all: request i of the pool goes to thread
    i % threads, whichever process runs it, so that a run's requests do not depend on how it is split."""
    if route != "predict":
        return [_Worker([_Prepared(i, b"", np.empty(0))]) for i in thread_ids]
    weights64 = {k: v.astype(np.float64) for k, v in make_weights(weights_seed).items()}
    return [_Worker(_prepare(seed, range(i, max(pool, threads), threads), max_batch, weights64)) for i in thread_ids]


def _run_part(workers: list[_Worker], budget: _Budget, connect: Callable[[], http.client.HTTPConnection], route: str,
              deadline: float | None, on_progress: Callable[[int], None]) -> _Part:  # fmt: skip
    """Runs ``workers`` in a thread each until the budget is spent or the deadline passed; ``on_progress`` gets
    the requests sent so far every 0.1 s, from another thread."""
    done, died = threading.Event(), []

    def report_progress() -> None:
        while not done.wait(0.1):
            on_progress(sum(w.sent for w in workers))

    def body(worker: _Worker) -> None:
        try:
            _run_worker(worker, budget, connect, route, deadline)
        except BaseException as exc:  # a bug here: counted as an error, never a pass
            died.append((time.monotonic(), f"a load thread died: {type(exc).__name__}: {exc}"))
            raise

    threads_ = [threading.Thread(target=body, args=(w,), name=f"load-{i}") for i, w in enumerate(workers)]
    reporter = threading.Thread(target=report_progress, name="load-progress", daemon=True)
    for thread in threads_:
        thread.start()
    reporter.start()
    for thread in threads_:
        thread.join()
    done.set()
    reporter.join()
    # A load thread that died (a bug in this tool) is said first, before any error of the server's.
    firsts = [*died, *sorted(w.first_error for w in workers if w.first_error is not None)]
    return _Part(sent=sum(w.sent for w in workers), errors=sum(w.errors for w in workers) + len(died),
                 wrong=sum(w.wrong for w in workers), first_error=firsts[0] if firsts else None,
                 latencies=np.fromiter((t for w in workers for t in w.latencies), np.float64))  # fmt: skip


def _child(pipe: Any, counts: Any, index: int, where: tuple[str, int | None, str | None], thread_ids: Sequence[int],
           threads: int, pool: int, share: int | None, seconds: float | None, seed: int, max_batch: int,
           weights_seed: int, route: str) -> None:  # fmt: skip
    """A load process of ``run_load(processes=N)``: makes its workers, says "ready", waits for the run's start
    (a time on the system's monotonic clock, which every process shares), runs, and sends its ``_Part`` back."""
    try:
        workers = _make_workers(thread_ids, threads, pool, seed, max_batch, weights_seed, route)
        pipe.send("ready")
        start = pipe.recv()
        deadline = None if seconds is None else start + seconds

        def on_progress(sent: int) -> None:
            counts[index] = sent

        part = _run_part(workers, _Budget(share), connector(*where), route, deadline, on_progress)
        counts[index] = part.sent
        pipe.send(part)
    except BaseException as exc:  # said to the parent, which counts it as an error
        pipe.send(f"a load process died: {type(exc).__name__}: {exc}")
        raise


#: Seconds a load process may take to start (a fresh interpreter importing numpy and JAX) and make its requests.
PROCESS_START_TIMEOUT = 300.0


def _run_processes(processes: int, where: tuple[str, int | None, str | None], threads: int, pool: int,
                   requests: int | None, seconds: float | None, seed: int, max_batch: int, weights_seed: int,
                   route: str, bar: _Progress) -> tuple[list[_Part], float]:  # fmt: skip
    """``run_load``'s threads split across ``processes`` child processes (spawned: a fork of a process that runs
    JAX's threads is not safe): the parts and the wall time from the common start to the last part."""
    import multiprocessing.connection

    context = multiprocessing.get_context("spawn")
    counts = context.Array("q", processes, lock=False)  # requests sent by each process: the progress line's
    shares = [None if requests is None else requests // processes + (p < requests % processes)
              for p in range(processes)]  # fmt: skip
    pipes, children = [], []
    try:
        for p in range(processes):
            mine, theirs = context.Pipe()
            child = context.Process(target=_child, name=f"load-process-{p}", daemon=True, args=(
                theirs, counts, p, where, range(p, threads, processes), threads, pool, shares[p], seconds, seed,
                max_batch, weights_seed, route))  # fmt: skip
            child.start()
            theirs.close()
            pipes.append(mine)
            children.append(child)
        for pipe, child in zip(pipes, children):
            if not pipe.poll(PROCESS_START_TIMEOUT):
                raise RuntimeError(f"{child.name} did not start in {PROCESS_START_TIMEOUT:g} s")
            said = pipe.recv()
            if said != "ready":
                raise RuntimeError(said)
        start = time.monotonic()
        bar.start()
        for pipe in pipes:
            pipe.send(start)
        parts: list[_Part] = []
        waiting = list(pipes)
        while waiting:
            bar.update(sum(counts))
            for pipe in multiprocessing.connection.wait(waiting, timeout=0.1):
                waiting.remove(pipe)
                said = pipe.recv()
                if isinstance(said, str):  # the process died: its requests are unknown, the run is an error
                    said = _Part(sent=counts[pipes.index(pipe)], errors=1, wrong=0, first_error=(start, said),
                                 latencies=np.empty(0))  # fmt: skip
                parts.append(said)
        elapsed = time.monotonic() - start
    except EOFError:  # a process ended without a word (killed)
        raise RuntimeError("a load process ended without its report") from None
    finally:
        for pipe in pipes:  # a child still waiting for the start, or still sending, is not waited for
            pipe.close()
        deadline = time.monotonic() + 30
        for child in children:
            child.join(max(0.0, deadline - time.monotonic()))
            if child.is_alive():
                child.kill()
                child.join(10)
    return parts, elapsed


def run_load(port: int | None, threads: int = 8, requests: int | None = 2000, seconds: float | None = 60.0,
             seed: int = 0, max_batch: int = DEFAULT_MAX_BATCH, host: str = "127.0.0.1",
             progress: bool | None = None, weights_seed: int = DEFAULT_SEED,
             unix_socket: str | None = None, route: str = "predict", distinct: int = POOL,
             processes: int = 1) -> LoadReport:  # fmt: skip
    """Loads ``host:port`` (or the server on ``unix_socket``, if given) from ``threads`` threads until
    ``requests`` were sent or ``seconds`` passed.

    At least one of ``requests`` and ``seconds`` must be given. ``progress``:
    None or True reports on stderr, False not. ``weights_seed`` must match
    the server's weights for answers to check out. ``route``: "predict"
    (the model, every answer checked against a float64 numpy reference) or
    "healthz" (the trivial route: each answer must be 200 ``{"ok": true}``).
    ``distinct``: how many distinct requests to make (at least one per thread).
    ``processes``: the threads are split across that many processes (1: this
    one), each with its share of ``requests``, all started at once once every
    one has made its requests: past one process's ceiling, and the same
    requests and checks. Raises ValueError for a non-loopback host or bad limits.
    """
    connect = connector(host, port, unix_socket)
    if threads < 1 or (requests is not None and requests < 1) or (seconds is not None and seconds <= 0) or distinct < 1:
        raise ValueError(f"need threads >= 1, requests >= 1, seconds > 0, distinct >= 1; "
                         f"got {threads}, {requests}, {seconds}, {distinct}")
    if requests is None and seconds is None:
        raise ValueError("give a request count, a time limit or both")
    if route not in ROUTES:
        raise ValueError(f"route must be one of {', '.join(ROUTES)}; got {route!r}")
    if not 1 <= processes <= threads:
        raise ValueError(f"processes must be between 1 and the threads ({threads}); got {processes}")
    pool = distinct if requests is None else min(distinct, requests)
    bar = _Progress(requests, progress is None or bool(progress))
    if processes == 1:
        workers = _make_workers(range(threads), threads, pool, seed, max_batch, weights_seed, route)
        t0 = time.monotonic()
        bar.start()
        parts = [_run_part(workers, _Budget(requests), connect, route, None if seconds is None else t0 + seconds,
                           bar.update)]  # fmt: skip
        elapsed = time.monotonic() - t0
    else:
        parts, elapsed = _run_processes(processes, (host, port, unix_socket), threads, pool, requests, seconds, seed,
                                        max_batch, weights_seed, route, bar)  # fmt: skip
    sent = sum(part.sent for part in parts)
    firsts = sorted(part.first_error for part in parts if part.first_error is not None)
    bar.update(sent, final=True)
    try:
        status, stats = fetch_json(host, port, "/stats", unix_socket=unix_socket)
    except (OSError, http.client.HTTPException, ValueError):
        status, stats = None, None
    ms = np.concatenate([part.latencies for part in parts]) * 1e3
    return LoadReport(
        requests=sent, errors=sum(part.errors for part in parts), wrong=sum(part.wrong for part in parts),
        threads=threads, seconds=elapsed, rps=sent / elapsed if elapsed > 0 else 0.0,
        p50_ms=float(np.percentile(ms, 50)) if sent else 0.0, p99_ms=float(np.percentile(ms, 99)) if sent else 0.0,
        max_ms=float(ms.max()) if sent else 0.0, first_error=firsts[0][1] if firsts else None,
        # The count, if all of it was sent; else the time limit (or a thread that died: an error already).
        stopped_by=STOPPED_BY_COUNT if requests is not None and sent == requests else STOPPED_BY_TIME,
        stats=stats if status == 200 else None, route=route, processes=processes,
    )  # fmt: skip


def report_rows(report: LoadReport) -> list[tuple[str, str, str]]:
    """The report as (measure, value with its unit, meaning) rows: the load run's, then what the
    server's /stats said after it. ``format_rows`` prints them under a header."""
    rows = [
        ("requests", str(report.requests), "sent, answered or not"),
        ("route", f"/{report.route}", "POST /predict: the model; GET /healthz: the trivial route (the ceiling)"),
        ("load threads", str(report.threads), "client threads, one keep-alive connection each"
         + (f", in {report.processes} processes" if report.processes > 1 else "")),
        ("stopped by", report.stopped_by, "which limit ended the load (--requests or --seconds)"),
        ("load time", f"{report.seconds:.2f} s", "wall clock, first request to last answer"),
        ("throughput", f"{report.rps:.1f} req/s", "requests / load time"),
        ("latency p50", f"{report.p50_ms:.2f} ms", "median, from sending a request to its whole answer"),
        ("latency p99", f"{report.p99_ms:.2f} ms", "99 in 100 requests took at most this"),
        ("latency max", f"{report.max_ms:.2f} ms", "the slowest request"),
        ("errors", str(report.errors), "requests without a well-formed 200 answer"),
        ("wrong answers", str(report.wrong), "200 answers that differ from a float64 numpy reference"),
    ]  # fmt: skip
    if report.stats is None:
        return rows + [("server stats", "none", "the server's /stats did not answer")]
    info, warmup, buckets = report.stats["function"]["cache_info"], report.stats["warmup"], report.stats["buckets"]
    workers = None if warmup is None else warmup["workers"]
    if workers is None:
        compile_meaning, warmup_row = "sum of the compiles' times", ("server warm-up", "none", "the server did not warm up")
    else:
        compile_meaning = ("sum of the compiles' times" if workers == 1 else
                           f"a sum over {workers} parallel warm-up workers, not wall clock")  # fmt: skip
        warmup_row = ("server warm-up", f"{warmup['wall_seconds']:.3f} s",
                      f"wall clock of its warm-up ({workers} worker{'s' * (workers > 1)}), before listening")  # fmt: skip
    if info is None:  # serve.py --jit jax: jax.jit keeps no counters that /stats could report
        cache_rows = [("compiles", "n/a", "the server runs jax.jit (--jit jax): no compile, hit or wait counts")]
    else:
        cache_rows = [
            ("compiles", str(info["compiles"]), "the server's compiles of the model (one per bucket)"),
            ("hits", str(info["hits"]), "model calls that found their bucket compiled"),
            ("waits", str(info["waits"]), "model calls that waited for another thread's compile"),
            ("compile time", f"{info['compile_seconds']:.3f} s", compile_meaning),
        ]  # fmt: skip
    gil = report.stats["gil_enabled"]
    return rows + [
        ("buckets", str(len(buckets)), "batch sizes the server pads to: " + ", ".join(map(str, buckets))),
        *cache_rows,
        warmup_row,
        ("server GIL", "enabled" if gil else "disabled", "the GIL in the server process, after the load"),
    ]  # fmt: skip


HEADER = ("measure", "value", "meaning")


def format_rows(rows: Sequence[tuple[str, str, str]]) -> str:
    """A text table of (measure, value, meaning) rows under a header row; values right-aligned."""
    widths = [max(len(row[i]) for row in (HEADER, *rows)) for i in range(3)]
    rule = "  ".join("-" * w for w in widths)

    def line(row: Sequence[str]) -> str:
        return f"{row[0].ljust(widths[0])}  {row[1].rjust(widths[1])}  {row[2]}".rstrip()

    header = f"{HEADER[0].ljust(widths[0])}  {HEADER[1].ljust(widths[1])}  {HEADER[2]}"
    return "\n".join([header, rule, *(line(row) for row in rows), rule])


def main(argv: list[str] | None = None) -> int:
    """The command line; exit code 1 if no request was sent, or any failed or was answered wrongly."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", help="server address, loopback only (default: 127.0.0.1)")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--port", type=int, help="server port")
    where.add_argument("--unix-socket", metavar="PATH", help="the server's unix socket (serve.py --unix-socket PATH)")
    parser.add_argument("--threads", type=int, default=8, help="concurrent connections (default: 8)")
    parser.add_argument("--requests", type=int, default=2000, help="total requests to send (default: 2000)")
    parser.add_argument("--seconds", type=float, default=60.0, help="time limit in seconds (default: 60)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random batches (default: 0)")
    parser.add_argument("--max-batch", type=int, default=DEFAULT_MAX_BATCH, help="largest batch to send")
    parser.add_argument("--processes", type=int, default=1,
                        help="split the threads across this many processes, past one process's ceiling (default: 1)")
    parser.add_argument("--route", choices=ROUTES, default="predict",
                        help="predict (default): the model, every answer checked; healthz: the trivial route, "
                             "for the client's and the server front's ceiling")  # fmt: skip
    args = parser.parse_args(argv)
    if args.unix_socket is not None and args.host is not None:
        parser.error("argument --host: not allowed with argument --unix-socket")
    try:
        report = run_load(args.port, args.threads, args.requests, args.seconds, args.seed, args.max_batch,
                          args.host or "127.0.0.1", unix_socket=args.unix_socket, route=args.route,
                          processes=args.processes)  # fmt: skip
    except ValueError as exc:
        parser.error(str(exc))
    print(format_rows(report_rows(report)))
    if report.first_error is not None:
        print(f"first error: {report.first_error}")
    return 0 if report.requests > 0 and report.errors == 0 and report.wrong == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
