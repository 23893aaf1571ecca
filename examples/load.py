"""A bounded load generator for examples/serve.py, checking every answer against numpy.

``--threads`` threads (one keep-alive connection each) send ``POST /predict``
requests with random batch sizes (1..max_batch, seeded) until ``--requests``
requests were sent or ``--seconds`` passed, whichever comes first. Every
answer is compared with a float64 numpy reference of the same MLP (weights
and forward function imported from serve.py); a wrong answer counts as an
error of its own. Only loopback servers are accepted.

Run it as ``python examples/load.py --port 8000 --threads 8 --requests 2000``.
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
import urllib.parse
from typing import Any, Sequence

import numpy as np

if __package__ in (None, ""):  # run as a script: make the ``examples`` package importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from examples.serve import DEFAULT_MAX_BATCH, DEFAULT_SEED, N_INPUTS, make_weights, reference_forward

#: Tolerances of the check against the numpy reference.
RTOL = 1e-4
ATOL = 1e-5

#: Seconds a request (connect, send, answer) may take before it counts as an error.
REQUEST_TIMEOUT = 30.0

#: LoadReport.stopped_by: every request of the count was sent, or the time limit came first.
STOPPED_BY_COUNT = "request count"
STOPPED_BY_TIME = "time limit"


@dataclasses.dataclass(frozen=True)
class LoadReport:
    """What a load run did and saw."""

    requests: int  #: requests sent (answered or not)
    errors: int  #: requests without a well-formed 200 answer (transport errors, other statuses, bad JSON)
    wrong: int  #: 200 answers that disagree with the numpy reference
    rows: int  #: input rows sent in all requests
    threads: int
    seconds: float  #: wall time of the run
    rps: float  #: requests per second
    p50_ms: float  #: median request latency
    p99_ms: float
    max_ms: float
    compiles: int | None  #: the server's compiles of the MLP after the run (from /stats), None if unavailable
    first_error: str | None  #: a description of the first error or wrong answer, for diagnosis
    stopped_by: str = STOPPED_BY_COUNT  #: which limit ended the run: STOPPED_BY_COUNT or STOPPED_BY_TIME


def check_loopback(host: str) -> None:
    """Raises ValueError unless every address ``host`` resolves to is a loopback address."""
    try:
        infos = socket.getaddrinfo(host, None)
    except socket.gaierror as exc:
        raise ValueError(f"cannot resolve host {host!r}: {exc}") from None
    addresses = {info[4][0] for info in infos}
    outside = sorted(a for a in addresses if not ipaddress.ip_address(a.split("%")[0]).is_loopback)
    if outside:
        raise ValueError(
            f"refusing to load {host!r}: it resolves to non-loopback address(es) {', '.join(outside)}; "
            "this load generator only targets servers on this machine (127.0.0.1, ::1, localhost)"
        )


def fetch_json(host: str, port: int, path: str, timeout: float = REQUEST_TIMEOUT) -> tuple[int, Any]:
    """``GET path`` on a loopback server: (status, decoded JSON body)."""
    check_loopback(host)
    connection = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def make_request(seed: int, index: int, max_batch: int) -> np.ndarray:
    """Request ``index``'s float32 input batch: the same for a given (seed, index), whichever thread sends it."""
    rng = np.random.default_rng((seed, index))
    rows = int(rng.integers(1, max_batch + 1))
    return rng.standard_normal((rows, N_INPUTS)).astype(np.float32)


class _Progress:
    """Progress of a load run on a stream (stderr by default).

    On a terminal, a ``done/total`` counter redrawn in place at most every
    0.1 s; elsewhere (a pipe, a CI log), a plain line at most every
    ``LINE_INTERVAL`` seconds, so long runs are not silent. Both end with a
    final line. Thread-safe.
    """

    LINE_INTERVAL = 2.0

    def __init__(self, total: int | None, enabled: bool, stream: Any = None, tty: bool | None = None):
        self.total = total
        self.enabled = enabled
        self.stream = sys.stderr if stream is None else stream
        self.tty = _isatty(self.stream) if tty is None else tty
        self._lock = threading.Lock()  # guards _last and the drawing
        self._t0 = time.monotonic()
        self._last = self._t0 if not self.tty else 0.0  # off a TTY, the first line comes one interval in

    def update(self, done: int, final: bool = False) -> None:
        if not self.enabled:
            return
        with self._lock:
            now = time.monotonic()
            interval = 0.1 if self.tty else self.LINE_INTERVAL
            if not (final or now - self._last >= interval):
                return
            self._last = now
            total = "" if self.total is None else f"/{self.total}"
            text = f"load: {done}{total} requests, {now - self._t0:.1f} s"
            if self.tty:
                self.stream.write(f"\r{text}" + ("\n" if final else ""))
            else:
                self.stream.write(text + ("" if not final else " (done)") + "\n")
            self.stream.flush()


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


class _Run:
    """Shared state of one load run: the request budget, the deadline and the tallies."""

    def __init__(self, requests: int | None, deadline: float | None, progress: _Progress):
        self._lock = threading.Lock()  # guards everything below
        self._budget = requests
        self._deadline = deadline
        self._next = 0
        self.latencies: list[float] = []
        self.errors = 0
        self.wrong = 0
        self.rows = 0
        self.first_error: str | None = None
        self.stopped_by: str | None = None  # the limit that first refused a request
        self.progress = progress

    def take(self) -> int | None:
        """The index of the next request to send, or None when the budget or the time is spent."""
        with self._lock:
            if self._budget is not None and self._next >= self._budget:
                self.stopped_by = self.stopped_by or STOPPED_BY_COUNT
                return None
            if self._deadline is not None and time.monotonic() >= self._deadline:
                self.stopped_by = self.stopped_by or STOPPED_BY_TIME
                return None
            index = self._next
            self._next += 1
            return index

    def taken(self) -> int:
        """How many requests take() handed out."""
        with self._lock:
            return self._next

    def record(self, latency: float, rows: int, error: str | None, wrong: bool) -> None:
        with self._lock:
            self.latencies.append(latency)
            self.rows += rows
            if error is not None:
                if wrong:
                    self.wrong += 1
                else:
                    self.errors += 1
                if self.first_error is None:
                    self.first_error = error
            done = len(self.latencies)
        self.progress.update(done)


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
        worst = float(np.max(np.abs(outputs - expected)))
        return f"wrong answer: differs from the reference by up to {worst:.3g}", True
    return None, False


def _worker(run: _Run, host: str, port: int, seed: int, max_batch: int, weights: dict[str, np.ndarray]) -> None:
    """Sends requests over one keep-alive connection (reopened after an error) until the run is over."""
    connection: http.client.HTTPConnection | None = None
    try:
        while (index := run.take()) is not None:
            x = make_request(seed, index, max_batch)
            expected = reference_forward(weights, x)
            body = json.dumps({"inputs": x.tolist()}).encode()
            t0 = time.perf_counter()
            try:
                if connection is None:
                    connection = http.client.HTTPConnection(host, port, timeout=REQUEST_TIMEOUT)
                connection.request("POST", "/predict", body, {"Content-Type": "application/json"})
                response = connection.getresponse()
                answer = response.read()
                latency = time.perf_counter() - t0
                if response.will_close:
                    connection.close()
                    connection = None
            except (OSError, http.client.HTTPException) as exc:
                run.record(time.perf_counter() - t0, len(x), f"{type(exc).__name__}: {exc}", False)
                if connection is not None:
                    connection.close()
                    connection = None
                continue
            try:
                error, wrong = _check_answer(response.status, answer, expected)
            except Exception as exc:  # noqa: BLE001 - a taken request is always recorded
                error, wrong = f"answer not checkable ({type(exc).__name__}: {exc})", False
            run.record(latency, len(x), error, wrong)
    finally:
        if connection is not None:
            connection.close()


def run_load(
    port: int,
    threads: int = 8,
    requests: int | None = 2000,
    seconds: float | None = 60.0,
    seed: int = 0,
    max_batch: int = DEFAULT_MAX_BATCH,
    host: str = "127.0.0.1",
    progress: bool | None = None,
    weights_seed: int = DEFAULT_SEED,
) -> LoadReport:
    """Loads ``host:port`` from ``threads`` threads until ``requests`` were sent or ``seconds`` passed.

    At least one of ``requests`` and ``seconds`` must be given. ``progress``
    reports on stderr: None or True, a counter on a terminal and a plain
    line every 2 s elsewhere; False, nothing.
    ``weights_seed`` must match the server's weights for answers to check out.
    Raises ValueError for a non-loopback host or bad limits.
    """
    check_loopback(host)
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    if requests is None and seconds is None:
        raise ValueError("give a request count, a time limit or both")
    if requests is not None and requests < 1:
        raise ValueError(f"requests must be >= 1, got {requests}")
    if seconds is not None and seconds <= 0:
        raise ValueError(f"seconds must be > 0, got {seconds}")
    weights = make_weights(weights_seed)
    bar = _Progress(requests, progress is None or bool(progress))
    t0 = time.monotonic()
    run = _Run(requests, None if seconds is None else t0 + seconds, bar)
    workers = [
        threading.Thread(target=_worker, args=(run, host, port, seed, max_batch, weights), name=f"load-{i}")
        for i in range(threads)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    elapsed = time.monotonic() - t0
    # A worker that died (a bug here) leaves the request it had taken
    # unrecorded: count it as an error rather than let the run pass without it.
    lost = run.taken() - len(run.latencies)
    if lost:
        run.errors += lost
        run.first_error = run.first_error or f"{lost} request(s) taken by a load thread that died"
    bar.update(len(run.latencies), final=True)

    try:
        status, server_stats = fetch_json(host, port, "/stats")
        compiles = server_stats["function"]["cache_info"]["compiles"] if status == 200 else None
    except (OSError, http.client.HTTPException, ValueError, KeyError):
        compiles = None
    latencies_ms = np.asarray(run.latencies) * 1e3
    sent = len(run.latencies)
    return LoadReport(
        requests=sent,
        errors=run.errors,
        wrong=run.wrong,
        rows=run.rows,
        threads=threads,
        seconds=elapsed,
        rps=sent / elapsed if elapsed > 0 else 0.0,
        p50_ms=float(np.percentile(latencies_ms, 50)) if sent else 0.0,
        p99_ms=float(np.percentile(latencies_ms, 99)) if sent else 0.0,
        max_ms=float(latencies_ms.max()) if sent else 0.0,
        compiles=compiles,
        first_error=run.first_error,
        stopped_by=run.stopped_by or STOPPED_BY_COUNT,
    )


def format_rows(rows: Sequence[tuple[str, str]]) -> str:
    """A two-column (metric, value) text table."""
    width = max(len(name) for name, _ in rows)
    value_width = max(len(value) for _, value in rows)
    rule = f"{'-' * width}  {'-' * value_width}"
    return "\n".join([rule] + [f"{name.ljust(width)}  {value.rjust(value_width)}" for name, value in rows] + [rule])


def report_rows(report: LoadReport) -> list[tuple[str, str]]:
    """The report's metrics as (name, value) rows."""
    return [
        ("requests", str(report.requests)),
        ("rows", str(report.rows)),
        ("threads", str(report.threads)),
        ("seconds", f"{report.seconds:.2f}"),
        ("stopped by", report.stopped_by),
        ("req/s", f"{report.rps:.1f}"),
        ("p50 ms", f"{report.p50_ms:.2f}"),
        ("p99 ms", f"{report.p99_ms:.2f}"),
        ("max ms", f"{report.max_ms:.2f}"),
        ("errors", str(report.errors)),
        ("wrong answers", str(report.wrong)),
        ("server compiles", "?" if report.compiles is None else str(report.compiles)),
    ]


def format_table(report: LoadReport) -> str:
    """The report as a text table (plus its first error, if any)."""
    table = format_rows(report_rows(report))
    return table if report.first_error is None else f"{table}\nfirst error: {report.first_error}"


def main(argv: list[str] | None = None) -> int:
    """The command line; exit code 1 if any request failed or was answered wrongly."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--url", help="server URL, e.g. http://127.0.0.1:8000 (loopback only)")
    target.add_argument("--port", type=int, help="server port on 127.0.0.1")
    parser.add_argument("--threads", type=int, default=8, help="concurrent connections (default: 8)")
    parser.add_argument("--requests", type=int, default=2000, help="total requests to send (default: 2000)")
    parser.add_argument("--seconds", type=float, default=60.0, help="time limit in seconds (default: 60)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random batches (default: 0)")
    parser.add_argument("--max-batch", type=int, default=DEFAULT_MAX_BATCH, help="largest batch to send")
    args = parser.parse_args(argv)

    if args.url is not None:
        parsed = urllib.parse.urlsplit(args.url)
        if parsed.scheme != "http" or parsed.hostname is None:
            parser.error(f"--url must look like http://127.0.0.1:8000, got {args.url!r}")
        host, port = parsed.hostname, parsed.port or 80
    else:
        host, port = "127.0.0.1", args.port
    try:
        report = run_load(port, args.threads, args.requests, args.seconds, args.seed, args.max_batch, host=host)
    except ValueError as exc:
        parser.error(str(exc))
    print(format_table(report))
    return 0 if report.requests > 0 and report.errors == 0 and report.wrong == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
