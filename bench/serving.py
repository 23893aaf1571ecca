"""Where a served request's time goes: the load generator's ceiling, the HTTP front's, the app's, the model's.

Run it as ``.venv/bin/python -m bench.serving [--clients 16] [--seconds 5] [--runs 3] [--batch] [--front F]
[--load-processes N]``. Each row
is ``examples/load.py``'s generator (``run_load``, every answer checked) in this process against a server in
a child process, on a unix socket where the platform has them, else on a loopback port:

- ``client ceiling``: GET /healthz against a canned responder (raw sockets, one thread per connection,
  the same bytes for every request): what the generator itself can send and check;
- ``front, bare app``: serve.py's front (``--front``, default serve.py's: granian's ``serve.GranianFront`` or
  waitress's ``serve.make_server``, with their settings and as many threads as clients) around a WSGI app that
  answers the same bytes: the front's ceiling;
- ``serve.py /healthz``: the whole app on its trivial route (routing, metrics);
- ``serve.py /predict``: one example per request (``--batch`` serves it through ``ftjit.batched``); both
  ``serve.py`` rows on that front.

Then, in this process, from ``--clients`` threads at once: the app's own CPU per request without HTTP (its
WSGI callable, /healthz and /predict), and the model's call alone (what the library costs), in a tight loop and
after parsing a request each time (on JAX's CPU backend, work between calls lets its executor thread sleep). Prints the medians
of ``--runs`` runs, with the range, and the load average; ``--out PATH`` also writes the table there.
docs/serving.md ("Where a request's time goes") quotes it.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from typing import Any, Callable

import numpy as np

from examples import load, serve
from examples.demo import ServerProcess
from examples.serve_metrics import RequestMetrics

ANSWER = b'{"ok": true}'
RESPONSE = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
            % (len(ANSWER), ANSWER))  # fmt: skip


def bare_app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(ANSWER)))])
    return [ANSWER]


def _canned(connection: socket.socket) -> None:
    """Answers every request head (up to a blank line) on ``connection`` with RESPONSE, until it closes."""
    buffer = b""
    with connection:
        while chunk := connection.recv(65536):
            buffer += chunk
            heads = buffer.count(b"\r\n\r\n")
            if heads:
                buffer = buffer[buffer.rindex(b"\r\n\r\n") + 4:]
                connection.sendall(RESPONSE * heads)


def _listen(unix_socket: str | None) -> socket.socket:
    if unix_socket is not None:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(unix_socket)
    else:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", 0))
    listener.listen(1024)
    return listener


class _BareApp:
    """A WSGI app answering ANSWER, with what serve.make_server reads of serve.App."""

    max_body_bytes, stopping, metrics = 1024, False, RequestMetrics()  # what the fronts read of serve.App

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        return bare_app(environ, start_response)


def serve_trivial(kind: str, unix_socket: str | None, threads: int) -> None:
    """A trivial row's server, in a child process: prints serve.py's "serving on" line, then serves until
    stopped (SIGTERM ends the process). "bare" and "bare-granian" are serve.py's own fronts (serve.make_server,
    serve.GranianFront: the same settings) around a bare app; "canned" answers on raw sockets."""
    if kind == "bare-granian":
        front = serve.GranianFront(_BareApp(), threads=threads, unix_socket=unix_socket)  # type: ignore[arg-type]
        serve.serve_granian(front, announce=lambda where: f"serving on {where}")
        return
    if kind == "canned":
        listener = _listen(unix_socket)
        run: Callable[[], None] = lambda: _accept_canned(listener)  # noqa: E731
    else:
        server, listener = serve.make_server(_BareApp(), threads=threads, unix_socket=unix_socket)  # type: ignore[arg-type]
        run = server.run
    shown = f"unix:{unix_socket}" if unix_socket else f"http://127.0.0.1:{listener.getsockname()[1]}"
    print(f"serving on {shown}", flush=True)
    run()


def _accept_canned(listener: socket.socket) -> None:
    while True:
        connection, _ = listener.accept()
        threading.Thread(target=_canned, args=(connection,), daemon=True).start()


def _trivial(kind: str, unix_socket: str | None, threads: int) -> ServerProcess:
    return ServerProcess("--threads", str(threads), unix_socket=unix_socket,
                         command=[sys.executable, "-m", "bench.serving", "--child", kind])  # fmt: skip


def http_rows(clients: int, seconds: float, batch: bool, front: str | None = None,
              processes: int = 1) -> list[tuple[str, float, float, float]]:  # fmt: skip
    """(row, req/s, p50 ms, p99 ms) of each HTTP row, one run, on ``front`` (None: serve.py's default), the load's
    threads split across ``processes``. Raises RuntimeError for a row with an error or a wrong answer."""
    rows = []
    front = front or serve.default_front()
    extra = ["--front", front, *(["--batch", "--max-batch", str(max(clients, 2))] if batch else [])]
    bare = "bare-granian" if front == "granian" else "bare"
    for name, start, route in (
        ("client ceiling (canned responder)", lambda path: _trivial("canned", path, clients), "healthz"),
        (f"front, bare app ({front})", lambda path: _trivial(bare, path, clients), "healthz"),
        ("serve.py GET /healthz", lambda path: ServerProcess("--threads", str(clients), *extra, unix_socket=path),
         "healthz"),
        ("serve.py POST /predict, 1 example" + (" (--batch)" if batch else ""),
         lambda path: ServerProcess("--threads", str(clients), *extra, unix_socket=path), "predict"),
    ):  # fmt: skip
        with tempfile.TemporaryDirectory(prefix="ftjit-bench-") as folder:
            path = os.path.join(folder, "s.sock") if hasattr(socket, "AF_UNIX") else None
            server = start(path)  # stops its child itself if it raises
            try:
                report = load.run_load(server.port, threads=clients, requests=None, seconds=seconds, progress=False,
                                       unix_socket=path, route=route, max_batch=1, processes=processes)  # fmt: skip
            finally:
                server.stop()
        if report.errors or report.wrong or not report.requests:
            raise RuntimeError(f"{name}: {report.errors} errors, {report.wrong} wrong: {report.first_error}")
        rows.append((name, report.rps, report.p50_ms, report.p99_ms))
    return rows


def _rate(threads: int, seconds: float, call: Callable[[], Any]) -> float:
    """Calls per second of ``call`` from ``threads`` threads at once (started on a barrier) for ``seconds``."""
    barrier, counts, errors = threading.Barrier(threads + 1), [0] * threads, []
    stop = threading.Event()

    def work(i: int) -> None:
        barrier.wait()
        n = 0
        try:
            while not stop.is_set():
                for _ in range(16):
                    call()
                n += 16
        except BaseException as exc:  # a failed call makes no figure: re-raised below
            errors.append(exc)
            stop.set()
        counts[i] = n

    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    barrier.wait()
    t0 = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for worker in workers:
        worker.join()
    if errors:
        raise errors[0]
    return sum(counts) / (time.perf_counter() - t0)


def process_rows(clients: int, seconds: float, batch: bool) -> list[tuple[str, float, float, float]]:
    """(row, calls/s, µs per call in one thread, nan) of the in-process rows, one run."""
    model = (serve.BatchedModel if batch else serve.Model)(max_batch=max(clients, 2))
    model.warm()
    app = serve.App(model)
    x = load.make_request(0, 0, 1)
    body = json.dumps({"inputs": x.tolist()}).encode()

    def answered(status: str, headers: Any) -> None:
        if status != "200 OK":
            raise RuntimeError(f"the app answered {status}: a row times only right answers")

    def healthz() -> None:
        app({"REQUEST_METHOD": "GET", "PATH_INFO": "/healthz", "wsgi.input": io.BytesIO()}, answered)

    def predict() -> None:
        environ = {"REQUEST_METHOD": "POST", "PATH_INFO": "/predict", "wsgi.input": io.BytesIO(body),
                   "CONTENT_LENGTH": str(len(body)), "CONTENT_TYPE": "application/json"}  # fmt: skip
        app(environ, answered)

    rows = []
    kind = "ftjit.batched" if batch else "ftjit.jit"
    for name, call in (("app GET /healthz, no HTTP", healthz), ("app POST /predict, no HTTP", predict),
                       (f"the model's call, {kind}", lambda: model.predict(x)),
                       (f"the model's call, {kind}, after a JSON parse",
                        lambda: model.predict(serve.parse_inputs(body, model.max_batch)))):
        one = _rate(1, seconds / 2, call)
        rows.append((name, _rate(clients, seconds, call), 1e6 / one, float("nan")))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.serving", description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=16, help="load threads, server threads (default: 16)")
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds a row (default: 5)")
    parser.add_argument("--runs", type=int, default=3, help="runs of every row; medians printed (default: 3)")
    parser.add_argument("--batch", action="store_true", help="serve.py --batch (ftjit.batched) for /predict")
    parser.add_argument("--load-processes", type=int, default=1, metavar="N",
                        help="split the load's threads across N processes (load.py --processes; default: 1)")
    parser.add_argument("--front", choices=serve.FRONTS,
                        help="serve.py's front for the HTTP rows (default: serve.py's default here)")
    parser.add_argument("--out", metavar="PATH", help="also write the table to PATH")
    parser.add_argument("--child", choices=("canned", "bare", "bare-granian"), help=argparse.SUPPRESS)
    parser.add_argument("--unix-socket", help=argparse.SUPPRESS)
    parser.add_argument("--port", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=16, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        serve_trivial(args.child, args.unix_socket, args.threads)
        return 0
    if args.clients < 1 or args.seconds <= 0 or args.runs < 1 or not 1 <= args.load_processes <= args.clients:
        parser.error("need --clients >= 1, --seconds > 0, --runs >= 1, 1 <= --load-processes <= --clients")
    front = args.front or serve.default_front()
    if front == "granian" and (why := serve.granian_unavailable()):
        parser.error(why)
    runs: dict[str, list[tuple[float, float, float]]] = {}
    # Every run's HTTP rows first: the in-process rows start JAX's backend in this process, and an accelerator
    # such as a TPU serves one process at a time, so no server child could start after them.
    for rows in (lambda *a: http_rows(*a, front=front, processes=args.load_processes), process_rows):
        for run in range(args.runs):
            kind = "in-process" if rows is process_rows else "HTTP"
            print(f"bench.serving: {kind} rows, run {run + 1}/{args.runs}", file=sys.stderr, flush=True)
            for name, *figures in rows(args.clients, args.seconds, args.batch):
                runs.setdefault(name, []).append(tuple(figures))  # type: ignore[arg-type]
    gil = getattr(sys, "_is_gil_enabled", lambda: True)()
    lines = [
        f"# bench.serving: {args.clients} clients (and server threads), load in {args.load_processes} process(es), "
        f"{args.seconds:g} s a row, median of {args.runs} run(s) [range]; the front: {front}",
        f"# {platform.python_implementation()} {platform.python_version()}"
        f"{' free-threaded' if sysconfig.get_config_var('Py_GIL_DISABLED') else ''}, GIL {'on' if gil else 'off'}, "
        f"{os.cpu_count()} cores, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} at the end",
        f"{'row':48s} {'per second':>22s} {'p50 ms':>7s} {'p99 ms':>7s}   (in-process rows: µs a call, 1 thread)",
    ]  # fmt: skip
    for name, figures in runs.items():
        rates = [f[0] for f in figures]
        rate = f"{statistics.median(rates):,.0f} [{min(rates):,.0f}-{max(rates):,.0f}]"
        if np.isnan(figures[0][2]):
            lines.append(f"{name:48s} {rate:>22s} {statistics.median(f[1] for f in figures):>10.1f} µs")
        else:
            p50, p99 = (statistics.median(f[i] for f in figures) for i in (1, 2))
            lines.append(f"{name:48s} {rate:>22s} {p50:7.2f} {p99:7.2f}")
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as out:
            out.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
