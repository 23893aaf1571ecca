"""A threaded HTTP JSON inference server for a small JAX MLP, dispatched through ``ftjit.jit``.

Only the standard library's ``http.server.ThreadingHTTPServer`` is used: every
connection gets its own thread, and all of them call one jitted function at
once. Batch sizes are bucketed up to powers of two (zero-padded), so a handful
of signatures cover all traffic; every bucket is compiled by
``JitFunction.warmup`` before the server accepts a connection.

Endpoints:

* ``POST /predict`` with ``{"inputs": [[16 floats], ...]}`` answers
  ``{"outputs": [[4 floats], ...]}`` (one row per input row). Bad input gets
  400 and ``{"error": "..."}``; a batch larger than ``max_batch`` gets 413.
* ``GET /healthz`` answers ``{"ok": true}`` once the model is warmed up.
* ``GET /stats`` answers ``ftjit.stats()`` plus the MLP's ``cache_info()``,
  ``signatures()``, buckets and warmup results, as JSON.

Run it as ``python examples/serve.py --port 8000 --max-batch 32``; SIGINT or
SIGTERM shuts it down cleanly (exit code 0). In-process, use
``make_server()`` or ``serve_in_thread()``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import signal
import socket
import sys
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType, ModuleType
from typing import Any

import numpy as np

import ftjit

N_INPUTS = 16
N_HIDDEN = 64
N_OUTPUTS = 4
DEFAULT_MAX_BATCH = 32
DEFAULT_SEED = 0

#: Seconds an idle keep-alive connection is kept open before its thread ends it.
IDLE_TIMEOUT = 30.0


def make_weights(seed: int = DEFAULT_SEED) -> dict[str, np.ndarray]:
    """The MLP's float32 weights, drawn from a fixed-seed generator (scaled by 1/sqrt(fan-in))."""
    rng = np.random.default_rng(seed)
    return {
        "w1": (rng.standard_normal((N_INPUTS, N_HIDDEN)) / math.sqrt(N_INPUTS)).astype(np.float32),
        "b1": (0.1 * rng.standard_normal(N_HIDDEN)).astype(np.float32),
        "w2": (rng.standard_normal((N_HIDDEN, N_OUTPUTS)) / math.sqrt(N_HIDDEN)).astype(np.float32),
        "b2": (0.1 * rng.standard_normal(N_OUTPUTS)).astype(np.float32),
    }


def forward(params: dict[str, Any], x: Any, xp: ModuleType = np) -> Any:
    """The MLP, ``relu(x @ w1 + b1) @ w2 + b2``, written against the array module ``xp``."""
    hidden = xp.maximum(x @ params["w1"] + params["b1"], 0)
    return hidden @ params["w2"] + params["b2"]


def reference_forward(weights: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """``forward`` in float64 numpy: the reference that served answers are checked against."""
    params64 = {name: value.astype(np.float64) for name, value in weights.items()}
    return forward(params64, np.asarray(x, dtype=np.float64))


def mlp(params: dict[str, Any], x: Any) -> Any:
    """``forward`` in ``jax.numpy``: the function the server runs through ``ftjit.jit``."""
    import jax.numpy as jnp

    return forward(params, x, jnp)


def batch_buckets(max_batch: int) -> tuple[int, ...]:
    """The padded batch sizes: powers of two below ``max_batch``, then ``max_batch`` itself."""
    if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
        raise ValueError(f"max_batch must be a positive int, got {max_batch!r}")
    sizes = []
    size = 1
    while size < max_batch:
        sizes.append(size)
        size *= 2
    sizes.append(max_batch)
    return tuple(sizes)


class BadRequest(ValueError):
    """A client error, answered with ``status`` and ``{"error": message}``."""

    def __init__(self, message: str, status: HTTPStatus = HTTPStatus.BAD_REQUEST):
        super().__init__(message)
        self.status = status


class Model:
    """The MLP jitted with ftjit, its parameters on the device, and its batch buckets.

    ``predict`` is thread-safe: any number of request threads call the one
    JitFunction at once. Each Model jits into its own ``ftjit.FunctionCache``,
    so several models in one process (tests, the demo) count compiles apart.
    """

    def __init__(self, max_batch: int = DEFAULT_MAX_BATCH, seed: int = DEFAULT_SEED, fun: Any = None):
        """``fun`` replaces ``mlp`` (same arguments and result), e.g. a fresh copy that no JAX cache has seen."""
        import jax.numpy as jnp

        self.max_batch = max_batch
        self.buckets = batch_buckets(max_batch)
        self.weights = make_weights(seed)
        self.params = {name: jnp.asarray(value) for name, value in self.weights.items()}
        self.fn = ftjit.jit(mlp if fun is None else fun, cache=ftjit.FunctionCache())
        self.warmup_report: ftjit.WarmupReport | None = None

    @property
    def ready(self) -> bool:
        """True once every bucket compiled without error."""
        return self.warmup_report is not None and self.warmup_report.ok

    def warm(self, workers: int = 4) -> ftjit.WarmupReport:
        """Compiles every bucket's signature (``jax.ShapeDtypeStruct`` specs) in ``workers`` threads."""
        import jax

        param_specs = {name: jax.ShapeDtypeStruct(v.shape, v.dtype) for name, v in self.params.items()}
        specs = [(param_specs, jax.ShapeDtypeStruct((size, N_INPUTS), np.float32)) for size in self.buckets]
        self.warmup_report = self.fn.warmup(specs, workers=workers)
        return self.warmup_report

    def bucket_for(self, rows: int) -> int:
        """The smallest bucket holding ``rows`` rows."""
        for size in self.buckets:
            if rows <= size:
                return size
        raise ValueError(f"batch of {rows} rows exceeds max_batch={self.max_batch}")

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Outputs for a float32 ``(rows, N_INPUTS)`` batch: padded to its bucket, then trimmed."""
        rows = x.shape[0]
        padded = np.zeros((self.bucket_for(rows), N_INPUTS), dtype=np.float32)
        padded[:rows] = x
        return np.asarray(self.fn(self.params, padded))[:rows]

    def stats(self) -> dict[str, Any]:
        """``ftjit.stats()`` and this model's function counters, signatures, buckets and warmup, JSON-ready."""
        snapshot = ftjit.stats()
        report = self.warmup_report
        return {
            "ftjit": snapshot.as_dict(top=len(snapshot.functions)),
            "function": {
                "name": self.fn.__name__,
                "cache_info": self.fn.cache_info()._asdict(),
                "signatures": [info._asdict() for info in self.fn.signatures()],
            },
            "buckets": list(self.buckets),
            "warmup": None
            if report is None
            else {
                "ok": report.ok,
                "wall_seconds": report.wall_seconds,
                "workers": report.workers,
                "results": [
                    {
                        "signature": r.signature,
                        "seconds": r.seconds,
                        "compiled": r.compiled,
                        "error": None if r.error is None else f"{type(r.error).__name__}: {r.error}",
                    }
                    for r in report.results
                ],
            },
        }


def parse_inputs(body: bytes, max_batch: int) -> np.ndarray:
    """The ``(rows, N_INPUTS)`` float32 batch of a ``/predict`` body; raises BadRequest when it is not one."""
    try:
        payload = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequest(f"body is not valid JSON: {exc}") from None
    except (ValueError, RecursionError) as exc:  # a huge int literal; nesting too deep
        raise BadRequest(f"body cannot be read as JSON: {type(exc).__name__}") from None
    if not isinstance(payload, dict) or "inputs" not in payload:
        raise BadRequest('body must be a JSON object {"inputs": [[...], ...]}')
    inputs = payload["inputs"]
    if not isinstance(inputs, list) or not inputs:
        raise BadRequest('"inputs" must be a non-empty list of rows')
    if len(inputs) > max_batch:
        raise BadRequest(
            f"batch of {len(inputs)} rows exceeds max_batch={max_batch}", HTTPStatus.REQUEST_ENTITY_TOO_LARGE
        )
    for i, row in enumerate(inputs):
        if not isinstance(row, list) or len(row) != N_INPUTS:
            raise BadRequest(f"inputs[{i}] must be a list of {N_INPUTS} numbers")
        if not all(type(v) in (int, float) for v in row):
            raise BadRequest(f"inputs[{i}] must contain only numbers")
    try:
        with np.errstate(over="ignore"):
            x = np.array(inputs, dtype=np.float32)
    except OverflowError:  # an int beyond float64 (e.g. 10**309)
        raise BadRequest("inputs must be finite float32 numbers") from None
    if not np.isfinite(x).all():
        raise BadRequest("inputs must be finite float32 numbers")
    return x


class _Handler(BaseHTTPRequestHandler):
    """One connection's requests (HTTP/1.1 keep-alive); runs in that connection's thread."""

    server: InferenceServer
    protocol_version = "HTTP/1.1"
    timeout = IDLE_TIMEOUT
    # Headers and body go out in two writes; with Nagle's algorithm the second
    # waits for the client's delayed ACK (~40 ms per request).
    disable_nagle_algorithm = True

    def do_GET(self) -> None:
        model = self.server.model
        if self.path == "/healthz":
            status = HTTPStatus.OK if model.ready else HTTPStatus.SERVICE_UNAVAILABLE
            self._reply(status, {"ok": model.ready})
        elif self.path == "/stats":
            self._reply(HTTPStatus.OK, model.stats())
        else:
            self._reply(HTTPStatus.NOT_FOUND, {"error": f"no such path: {self.path}"})

    def do_POST(self) -> None:
        if self.path != "/predict":
            self._reply(HTTPStatus.NOT_FOUND, {"error": f"no such path: {self.path}"})
            return
        try:
            x = parse_inputs(self._read_body(), self.server.model.max_batch)
        except BadRequest as exc:
            self._reply(exc.status, {"error": str(exc)})
            return
        try:
            outputs = self.server.model.predict(x)
        except Exception as exc:
            self._reply(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"{type(exc).__name__}: {exc}"})
            return
        if not np.isfinite(outputs).all():
            error = "the model's outputs are not finite for these inputs"
            self._reply(HTTPStatus.UNPROCESSABLE_ENTITY, {"error": error})
            return
        self._reply(HTTPStatus.OK, {"outputs": outputs.tolist()})

    def _read_body(self) -> bytes:
        """The request body; a missing, bad or oversized Content-Length raises BadRequest (and ends the connection)."""
        length_header = self.headers.get("Content-Length")
        if length_header is None:
            self.close_connection = True
            raise BadRequest("a Content-Length header is required", HTTPStatus.LENGTH_REQUIRED)
        try:
            length = int(length_header)
        except ValueError:
            length = -1
        if length < 0:
            self.close_connection = True
            raise BadRequest(f"bad Content-Length: {length_header!r}")
        if length > self.server.max_body_bytes:
            # The body stays unread, so the connection cannot carry another request.
            self.close_connection = True
            raise BadRequest(
                f"body of {length} bytes exceeds {self.server.max_body_bytes}", HTTPStatus.REQUEST_ENTITY_TOO_LARGE
            )
        body = self.rfile.read(length)
        if len(body) != length:
            self.close_connection = True
            raise BadRequest("body ended before Content-Length bytes")
        return body

    def _reply(self, status: HTTPStatus, payload: dict[str, Any]) -> None:
        data = json.dumps(payload, allow_nan=False).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.access_log:
            super().log_message(format, *args)


class InferenceServer(ThreadingHTTPServer):
    """A ThreadingHTTPServer bound to a warmed-up Model.

    ``server_close()`` (after ``shutdown()``) wakes the threads of idle
    keep-alive connections and joins every connection thread, so a clean
    shutdown leaves no request half-answered; a thread still running after
    ``close_timeout`` seconds is left behind (a daemon) and named in
    ``hung_handlers`` instead of hanging the shutdown.
    """

    # server_close() joins the connection threads itself, with a deadline
    # (ThreadingMixIn's own join has none); daemons, so a hung one cannot
    # keep the process alive.
    daemon_threads = True
    block_on_close = False
    close_timeout = 30.0

    def __init__(self, address: tuple[str, int], model: Model, access_log: bool = False):
        self.model = model
        self.access_log = access_log
        self.max_body_bytes = 1024 + model.max_batch * N_INPUTS * 32
        self._connections: set[socket.socket] = set()
        self._handlers: set[threading.Thread] = set()
        self._connections_lock = threading.Lock()  # guards _connections and _handlers
        self.hung_handlers: list[str] = []  # set by server_close()
        super().__init__(address, _Handler)

    @property
    def port(self) -> int:
        """The bound port (useful with port 0)."""
        return self.server_address[1]

    def process_request(self, request: Any, client_address: Any) -> None:
        # ThreadingMixIn's, with the thread registered before it starts, so
        # that server_close() sees every connection thread.
        thread = threading.Thread(
            target=self.process_request_thread,
            args=(request, client_address),
            name=f"connection-{client_address[1] if isinstance(client_address, tuple) else ''}",
            daemon=True,
        )
        with self._connections_lock:
            self._connections.add(request)
            self._handlers.add(thread)
        try:
            thread.start()
        except BaseException:  # e.g. "can't start new thread": never joinable, so not ours to join
            with self._connections_lock:
                self._handlers.discard(thread)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._connections_lock:
                self._handlers.discard(threading.current_thread())

    def shutdown_request(self, request: Any) -> None:
        with self._connections_lock:
            self._connections.discard(request)
        super().shutdown_request(request)

    def server_close(self) -> None:
        with self._connections_lock:
            open_connections = list(self._connections)
        for connection in open_connections:
            try:
                # Ends the wait for a next request; a request being answered still gets its reply.
                connection.shutdown(socket.SHUT_RD)
            except OSError:
                pass
        super().server_close()
        deadline = time.monotonic() + self.close_timeout
        with self._connections_lock:
            handlers = list(self._handlers)
        for thread in handlers:
            thread.join(max(0.0, deadline - time.monotonic()))
        self.hung_handlers = sorted(t.name for t in handlers if t.is_alive())


def make_server(
    host: str = "127.0.0.1",
    port: int = 0,
    max_batch: int = DEFAULT_MAX_BATCH,
    warmup_workers: int = 4,
    access_log: bool = False,
) -> tuple[InferenceServer, Model]:
    """Builds the model, warms every bucket, then binds the server (not yet serving).

    Raises RuntimeError when a bucket fails to compile. The warmup report is
    ``model.warmup_report``.
    """
    model = Model(max_batch=max_batch)
    report = model.warm(workers=warmup_workers)
    if not report.ok:
        raise RuntimeError(f"warmup failed:\n{report}")
    return InferenceServer((host, port), model, access_log=access_log), model


@dataclasses.dataclass
class RunningServer:
    """A server serving in a background thread (see ``serve_in_thread``)."""

    server: InferenceServer
    model: Model
    thread: threading.Thread

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stops serving, closes every connection and joins the serving and
        connection threads; raises TimeoutError naming what still runs after
        ``timeout`` seconds (instead of hanging)."""
        deadline = time.monotonic() + timeout
        stopper = threading.Thread(target=self.server.shutdown, name="server-shutdown", daemon=True)
        stopper.start()
        stopper.join(timeout)
        self.thread.join(max(0.0, deadline - time.monotonic()))
        self.server.close_timeout = max(0.0, deadline - time.monotonic())
        self.server.server_close()
        stuck = ([self.thread.name] if self.thread.is_alive() else []) + self.server.hung_handlers
        if stuck:
            raise TimeoutError(f"still running {timeout} s after shutdown: {', '.join(stuck)}")

    def __enter__(self) -> "RunningServer":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()


def serve_in_thread(
    host: str = "127.0.0.1",
    port: int = 0,
    max_batch: int = DEFAULT_MAX_BATCH,
    warmup_workers: int = 4,
    access_log: bool = False,
) -> RunningServer:
    """``make_server`` then ``serve_forever`` in a background thread; returns once it accepts connections."""
    server, model = make_server(host, port, max_batch, warmup_workers, access_log)
    thread = threading.Thread(target=server.serve_forever, name=f"serve-{server.port}")
    thread.start()
    return RunningServer(server, model, thread)


def main(argv: list[str] | None = None) -> int:
    """The command line: warm up, serve until SIGINT/SIGTERM, shut down cleanly."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    parser.add_argument("--port", type=int, default=8000, help="port to bind; 0 picks a free one (default: 8000)")
    parser.add_argument("--max-batch", type=int, default=DEFAULT_MAX_BATCH, help="largest batch accepted")
    parser.add_argument("--warmup-workers", type=int, default=4, help="threads compiling the buckets at start-up")
    parser.add_argument("--access-log", action="store_true", help="log every request to stderr")
    args = parser.parse_args(argv)

    try:
        server, model = make_server(args.host, args.port, args.max_batch, args.warmup_workers, args.access_log)
    except (ValueError, RuntimeError, OSError) as exc:
        print(f"serve.py: {exc}", file=sys.stderr)
        return 1
    print(model.warmup_report, flush=True)

    def stop(signum: int, frame: FrameType | None) -> None:
        # shutdown() waits for serve_forever() to return, and serve_forever()
        # runs in this (the main) thread, so it must be called from another one.
        print(f"{signal.Signals(signum).name}: shutting down", flush=True)
        threading.Thread(target=server.shutdown, name="shutdown").start()

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    host, port = server.server_address[:2]
    print(f"serving on http://{host}:{port}", flush=True)
    server.serve_forever()
    server.server_close()
    if server.hung_handlers:
        print(f"serve.py: connection threads still running after {server.close_timeout:g} s, left behind: "
              f"{', '.join(server.hung_handlers)}", file=sys.stderr, flush=True)
        return 1
    print("server stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
