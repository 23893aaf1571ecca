"""A threaded HTTP JSON inference server for a small JAX MLP, dispatched through ``ftjit.jit``.

Every request thread calls one jitted function at once. Batch sizes are
bucketed up to powers of two (zero-padded), so a handful of signatures cover
all traffic; every bucket is compiled by ``JitFunction.warmup`` before the
server accepts a connection.

The application is one transport-independent core, ``App.handle(method,
path, headers, read_body) -> Response``, also exposed as a WSGI callable
(``App.__call__``). Two servers carry it:

* ``--server stdlib`` (the default): ``InferenceServer``, an
  ``http.server.HTTPServer`` with a bounded pool of connection threads
  (``--max-connections``; a connection over the limit is answered 503 and
  closed), a listen backlog of 128, a deadline for each request to arrive
  (``--request-timeout``, answered 408) and an idle keep-alive timeout
  (``--idle-timeout``).
* ``--server waitress``: the same ``App`` as a WSGI application under
  waitress (``pip install 'ftjit[serve]'`` or ``pip install waitress``), with
  ``--threads`` worker threads and ``--max-connections`` open connections.

Endpoints (methods other than those listed get 405 with an ``Allow``
header; the query string is ignored; every answer but ``/metrics`` is JSON):

* ``POST /predict`` with ``Content-Type: application/json`` and
  ``{"inputs": [[16 floats], ...]}`` answers ``{"outputs": [[4 floats],
  ...]}`` (one row per input row). Bad input gets 400 and ``{"error":
  "..."}``, another Content-Type 415, a batch larger than ``max_batch`` or
  an oversized body 413, a missing Content-Length 411.
* ``GET /healthz`` answers ``{"ok": true}`` once the model is warmed up.
* ``GET /stats`` answers ``ftjit.stats()`` plus the MLP's ``cache_info()``,
  ``signatures()``, buckets and warmup results, as JSON.
* ``GET /metrics`` answers the same counters and per-endpoint request
  counts and latency histograms in the Prometheus text format 0.0.4.

Run it as ``python examples/serve.py --port 8000 --max-batch 32``; SIGINT or
SIGTERM shuts it down cleanly (exit code 0): requests being answered are
answered first. Events are logged one line each through ``logging`` (logger
``serve``; the access log, ``--access-log``, is ``serve.access``). In-process,
use ``make_server()`` or ``serve_in_thread()``. docs/serving.md has the
details and measurements.
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import io
import json
import logging
import math
import queue
import re
import signal
import socket
import sys
import threading
import time
import urllib.parse
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, HTTPServer
from types import FrameType, ModuleType
from typing import Any, Callable, Iterable, Iterator, Mapping, NamedTuple

import numpy as np

import ftjit

logger = logging.getLogger("serve")
access_logger = logging.getLogger("serve.access")

N_INPUTS = 16
N_HIDDEN = 64
N_OUTPUTS = 4
DEFAULT_MAX_BATCH = 32
DEFAULT_SEED = 0

#: Seconds an idle keep-alive connection is kept open (``--idle-timeout``).
IDLE_TIMEOUT = 30.0
#: Seconds a request (line, headers and body) may take to arrive, and its answer to be sent (``--request-timeout``).
REQUEST_TIMEOUT = 10.0
#: Connections open at once (``--max-connections``); the stdlib server runs one thread per open connection.
MAX_CONNECTIONS = 256
#: waitress's worker threads (``--threads``); it reads requests in one I/O thread, so these only run the app.
WSGI_THREADS = 8
#: The listen backlog: connections the kernel queues before accept(). The stdlib default, 5, overflowed
#: (connection resets) at 200 concurrent clients; Linux caps it at net.core.somaxconn (4096 by default).
LISTEN_BACKLOG = 128
#: The servers ``--server`` picks from.
SERVERS = ("stdlib", "waitress")


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



# --- the application: routes, metrics, one core for both servers ---------------------------------------------

#: The endpoints and the methods each allows (HEAD: a GET answered without its body).
ROUTES: dict[str, tuple[str, ...]] = {
    "/predict": ("POST",),
    "/healthz": ("GET", "HEAD"),
    "/stats": ("GET", "HEAD"),
    "/metrics": ("GET", "HEAD"),
}

JSON_TYPE = "application/json"
#: The Prometheus text exposition format's Content-Type.
METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: Upper bounds (seconds) of the request latency histogram's buckets; +Inf is added.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

# Metric label values are bounded: any other path is "other", any other method "OTHER".
_METHOD_LABELS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"})
_CONTENT_LENGTH = re.compile(r"[0-9]+")


class Response(NamedTuple):
    """What the app answers: status, headers (Content-Type and Content-Length included) and body.

    ``close``: the connection cannot carry another request, because a body
    the client declared was left unread (a stream transport must close it).
    """

    status: HTTPStatus
    headers: tuple[tuple[str, str], ...]
    body: bytes
    close: bool = False


def make_response(
    status: HTTPStatus,
    payload: Any,
    head: bool = False,
    headers: tuple[tuple[str, str], ...] = (),
    content_type: str = JSON_TYPE,
) -> Response:
    """A response whose body is ``payload`` as JSON (bytes or str as they are); ``head``: the headers only."""
    if isinstance(payload, bytes):
        data = payload
    elif isinstance(payload, str):
        data = payload.encode()
    else:
        data = json.dumps(payload, allow_nan=False).encode()
    all_headers = (("Content-Type", content_type), ("Content-Length", str(len(data))), *headers)
    return Response(status, all_headers, b"" if head else data)


def error_response(status: HTTPStatus, message: str, head: bool = False, **kwargs: Any) -> Response:
    """``{"error": message}`` with ``status``."""
    return make_response(status, {"error": message}, head=head, **kwargs)


def request_path(target: str) -> str:
    """The percent-decoded path of a request target: query and fragment dropped, ``http://host/p`` read as ``/p``."""
    path = target.split("?", 1)[0].split("#", 1)[0]
    if not path.startswith("/") and "://" in path:  # absolute-form (RFC 9112 3.2.2), as sent to proxies
        path = urllib.parse.urlsplit(path).path or "/"
    return urllib.parse.unquote(path, errors="replace")


def _prom_escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _prom_labels(labels: Iterable[tuple[str, str]]) -> str:
    text = ",".join(f'{name}="{_prom_escape(value)}"' for name, value in labels)
    return "{" + text + "}" if text else ""


def _prom_value(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


@dataclasses.dataclass(frozen=True)
class MetricFamily:
    """One metric in the text exposition: name, type, help and its samples ``(suffix, labels, value)``."""

    name: str
    type: str  # "counter", "gauge" or "histogram"
    help: str
    samples: tuple[tuple[str, tuple[tuple[str, str], ...], float], ...]

    def render(self) -> str:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.type}"]
        lines += [f"{self.name}{suffix}{_prom_labels(labels)} {_prom_value(v)}" for suffix, labels, v in self.samples]
        return "\n".join(lines)


class Metrics:
    """Request counts and latency histograms, by endpoint, method and status code.

    Thread-safe: every update and the snapshot taken by ``families()`` hold
    one lock, so a scrape sees a consistent cut (the counts agree with the
    histograms' ``_count``). Holding it is a few dict operations per request.
    """

    def __init__(self, buckets: tuple[float, ...] = LATENCY_BUCKETS):
        self.buckets = buckets
        self._lock = threading.Lock()  # guards the three dicts below
        self._requests: dict[tuple[str, str, str], int] = {}  # (handler, method, code) -> requests
        self._bucket_counts: dict[str, list[int]] = {}  # handler -> requests per bucket (not cumulative; last: +Inf)
        self._sums: dict[str, float] = {}  # handler -> total seconds

    def observe(self, handler: str, method: str, status: int, seconds: float) -> None:
        """Counts one answered request of ``handler`` (an endpoint or "other") that took ``seconds``."""
        method = method if method in _METHOD_LABELS else "OTHER"
        index = bisect.bisect_left(self.buckets, seconds)  # the first bucket with seconds <= its bound
        key = (handler, method, str(int(status)))
        with self._lock:
            self._requests[key] = self._requests.get(key, 0) + 1
            counts = self._bucket_counts.get(handler)
            if counts is None:
                counts = self._bucket_counts[handler] = [0] * (len(self.buckets) + 1)
                self._sums[handler] = 0.0
            counts[index] += 1
            self._sums[handler] += seconds

    def families(self) -> list[MetricFamily]:
        """The request counter and the latency histogram, as a snapshot."""
        with self._lock:
            requests = sorted(self._requests.items())
            histograms = sorted((h, list(c), self._sums[h]) for h, c in self._bucket_counts.items())
        counter = MetricFamily(
            "http_requests_total",
            "counter",
            "HTTP requests answered by the app, by endpoint (handler), method and status code.",
            tuple(
                ("", (("handler", h), ("method", m), ("code", c)), n) for (h, m, c), n in requests
            ),
        )
        samples: list[tuple[str, tuple[tuple[str, str], ...], float]] = []
        for handler, counts, total in histograms:
            cumulative = 0
            for bound, n in zip((*self.buckets, math.inf), counts):
                cumulative += n
                le = "+Inf" if math.isinf(bound) else repr(bound)
                samples.append(("_bucket", (("handler", handler), ("le", le)), cumulative))
            samples.append(("_sum", (("handler", handler),), total))
            samples.append(("_count", (("handler", handler),), cumulative))
        histogram = MetricFamily(
            "http_request_duration_seconds",
            "histogram",
            "Seconds from a request's headers reaching the app to its answer being ready, by endpoint.",
            tuple(samples),
        )
        return [counter, histogram]


#: The served function's ``cache_info()`` fields exported, as (metric, field, type, help).
_FTJIT_METRICS = (
    ("ftjit_cache_hits_total", "hits", "counter", "Calls of the jitted function served by a compiled cache entry."),
    ("ftjit_cache_misses_total", "misses", "counter", "Calls that found no cache entry and ran the compiler."),
    ("ftjit_compiles_total", "compiles", "counter", "Successful compiles."),
    ("ftjit_compile_failures_total", "failures", "counter", "Compiles that raised."),
    ("ftjit_compile_waits_total", "waits", "counter", "Calls that waited for another thread's compile of their signature."),
    ("ftjit_compile_seconds_total", "compile_seconds", "counter", "Seconds spent compiling."),
    ("ftjit_compile_wait_seconds_total", "wait_seconds", "counter", "Seconds calls spent waiting for other threads' compiles."),
    ("ftjit_cache_evictions_total", "evictions", "counter", "Cache entries of the function evicted by the LRU."),
    ("ftjit_cache_entries", "size", "gauge", "Cache entries (compiled signatures) of the function now."),
)  # fmt: skip


class App:
    """The server's logic, independent of any transport: ``handle()``, and the same as a WSGI application.

    Thread-safe: any number of threads call ``handle`` (or the WSGI callable)
    at once; the model is read-only after warmup and ``metrics`` locks.
    ``transport_metrics``, when set (by the stdlib server), adds that
    server's own metric families to ``/metrics``.
    """

    def __init__(self, model: Model, max_body_bytes: int | None = None):
        self.model = model
        #: The largest /predict body read: a full batch of long decimal floats, with room to spare.
        self.max_body_bytes = 1024 + model.max_batch * N_INPUTS * 32 if max_body_bytes is None else max_body_bytes
        self.metrics = Metrics()
        self.transport_metrics: Callable[[], list[MetricFamily]] | None = None

    def handle(
        self, method: str, path: str, headers: Mapping[str, str], read_body: Callable[[int], bytes]
    ) -> Response:
        """The answer to one request, counted in ``metrics``.

        ``path`` is the decoded path (see ``request_path``), ``headers`` maps
        lower-case names to values, and ``read_body(n)`` returns up to ``n``
        bytes of the body; it is called at most once, only for ``POST
        /predict`` after the headers were checked. What ``read_body`` raises
        (a timeout, a reset connection) propagates, and the request is then
        not counted: the transport answers, or cannot.
        """
        t0 = time.perf_counter()
        consumed = False

        def read_once(n: int) -> bytes:
            nonlocal consumed
            consumed = True
            return read_body(n)

        response = self._route(method, path, headers, read_once)
        if not consumed and headers.get("content-length", "0").strip() not in ("", "0"):
            response = response._replace(close=True)
        self.metrics.observe(path if path in ROUTES else "other", method, response.status, time.perf_counter() - t0)
        return response

    def _route(
        self, method: str, path: str, headers: Mapping[str, str], read_body: Callable[[int], bytes]
    ) -> Response:
        head = method == "HEAD"
        allowed = ROUTES.get(path)
        if allowed is None:
            return error_response(HTTPStatus.NOT_FOUND, f"no such path: {path}", head)
        if method not in allowed:
            allow = ", ".join(allowed)
            return error_response(
                HTTPStatus.METHOD_NOT_ALLOWED,
                f"method {method} is not allowed on {path} (allowed: {allow})",
                head,
                headers=(("Allow", allow),),
            )
        if path == "/predict":
            return self._predict(headers, read_body)
        if path == "/healthz":
            ready = self.model.ready
            return make_response(HTTPStatus.OK if ready else HTTPStatus.SERVICE_UNAVAILABLE, {"ok": ready}, head)
        if path == "/stats":
            return make_response(HTTPStatus.OK, self.model.stats(), head)
        return make_response(HTTPStatus.OK, self.render_metrics(), head, content_type=METRICS_TYPE)

    def _predict(self, headers: Mapping[str, str], read_body: Callable[[int], bytes]) -> Response:
        content_type = headers.get("content-type")
        if content_type is None or content_type.split(";", 1)[0].strip().lower() != JSON_TYPE:
            got = "none" if content_type is None else repr(content_type)
            return error_response(
                HTTPStatus.UNSUPPORTED_MEDIA_TYPE, f"Content-Type must be {JSON_TYPE}, got {got}"
            )
        length_header = headers.get("content-length")
        if length_header is None:
            return error_response(HTTPStatus.LENGTH_REQUIRED, "a Content-Length header is required")
        if not _CONTENT_LENGTH.fullmatch(length_header.strip()):
            return error_response(HTTPStatus.BAD_REQUEST, f"bad Content-Length: {length_header!r}")
        length = int(length_header)
        if length > self.max_body_bytes:
            return error_response(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body of {length} bytes exceeds {self.max_body_bytes}"
            )
        body = read_body(length)
        if len(body) != length:
            return error_response(HTTPStatus.BAD_REQUEST, "body ended before Content-Length bytes")._replace(close=True)
        try:
            x = parse_inputs(body, self.model.max_batch)
        except BadRequest as exc:
            return error_response(exc.status, str(exc))
        try:
            outputs = self.model.predict(x)
        except Exception as exc:
            logger.exception("POST /predict: the model raised")  # a bug: one traceback, the client gets 500
            return error_response(HTTPStatus.INTERNAL_SERVER_ERROR, f"{type(exc).__name__}: {exc}")
        if not np.isfinite(outputs).all():
            return error_response(HTTPStatus.UNPROCESSABLE_ENTITY, "the model's outputs are not finite for these inputs")
        return make_response(HTTPStatus.OK, {"outputs": outputs.tolist()})

    def metric_families(self) -> list[MetricFamily]:
        """What ``/metrics`` shows: the served function's ftjit counters, then requests, then the transport's."""
        fn = self.model.fn
        info = fn.cache_info()
        label = (("function", fn.__name__),)
        families = [
            MetricFamily(name, kind, text, (("", label, getattr(info, field)),))
            for name, field, kind, text in _FTJIT_METRICS
        ]
        families.append(
            MetricFamily(
                "ftjit_live_functions",
                "gauge",
                "Live jitted functions in the process (ftjit.stats()).",
                (("", (), len(ftjit.stats().functions)),),
            )
        )
        families += self.metrics.families()
        if self.transport_metrics is not None:
            families += self.transport_metrics()
        return families

    def render_metrics(self) -> str:
        """The Prometheus text exposition (format 0.0.4) of ``metric_families()``."""
        return "\n".join(family.render() for family in self.metric_families()) + "\n"

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        """The WSGI application (PEP 3333): the same ``handle``."""
        headers = {
            key[5:].replace("_", "-").lower(): value for key, value in environ.items() if key.startswith("HTTP_")
        }
        for key in ("CONTENT_TYPE", "CONTENT_LENGTH"):
            if environ.get(key):
                headers[key.replace("_", "-").lower()] = environ[key]
        # PATH_INFO is already percent-decoded, as latin-1 (PEP 3333): read its bytes as UTF-8, as request_path does.
        path = environ.get("PATH_INFO", "").encode("latin-1").decode("utf-8", "replace") or "/"
        response = self.handle(environ["REQUEST_METHOD"], path, headers, environ["wsgi.input"].read)
        start_response(f"{response.status.value} {response.status.phrase}", list(response.headers))
        return [response.body]


# --- the stdlib server: http.server with a bounded pool, deadlines and one log line per event -------------------


def _peer(client_address: Any) -> str:
    if isinstance(client_address, tuple) and len(client_address) >= 2:
        return f"{client_address[0]}:{client_address[1]}"
    return str(client_address)


class _DeadlineReader(io.RawIOBase):
    """The raw stream under a connection's buffered ``rfile``: each recv waits until ``deadline``
    (a ``time.monotonic()`` value) when one is set, else ``wait`` seconds (None: forever).

    Used by the connection's one thread only. A request trickling in a byte
    at a time still ends at its deadline: the timeout is not renewed by each
    byte, as a plain socket timeout would be.
    """

    def __init__(self, sock: socket.socket):
        self._sock = sock
        self.deadline: float | None = None
        self.wait: float | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self.deadline is None:
            timeout = self.wait
        else:
            timeout = self.deadline - time.monotonic()
            if timeout <= 0:
                raise TimeoutError("the request's deadline passed")
        self._sock.settimeout(timeout)
        return self._sock.recv_into(buffer)


class _HeaderView(Mapping[str, str]):
    """http.server's parsed headers as App.handle takes them: lower-case names, repeated fields joined
    by ", " (RFC 9110 5.3), each read when asked for (most requests ask for two of them)."""

    def __init__(self, message: Any):
        self._message = message

    def __getitem__(self, name: str) -> str:
        values = self._message.get_all(name)
        if values is None:
            raise KeyError(name)
        return ", ".join(values)

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys(key.lower() for key in self._message.keys()))

    def __len__(self) -> int:
        return sum(1 for _ in self)


#: What each phase of a connection is called in the log.
_PHASES = {
    "request line": "waiting for the request line",
    "headers": "reading the headers",
    "body": "reading the body",
    "response": "sending the answer",
    "idle": "idle between requests",
}


class _Handler(BaseHTTPRequestHandler):
    """One connection's requests (HTTP/1.1 keep-alive), in the pool thread that serves the connection.

    http.server parses the request line and headers; everything else is
    ``App.handle``'s. Errors of the network (a timeout, a reset) end the
    connection with one log line, never a traceback.
    """

    server: InferenceServer
    protocol_version = "HTTP/1.1"
    # What a request that states no version (an HTTP/0.9 one, or garbage) is answered as: with a
    # status line and headers, so that even a malformed request gets a readable JSON status.
    default_request_version = "HTTP/1.1"
    server_version = "ftjit-serve"
    # Headers and body go out in two writes; with Nagle's algorithm the second
    # waits for the client's delayed ACK (~40 ms per request).
    disable_nagle_algorithm = True

    def setup(self) -> None:
        super().setup()  # TCP_NODELAY, wfile; its rfile is replaced by one that keeps deadlines
        self.rfile.close()
        self._reader = _DeadlineReader(self.connection)
        self._buffered = io.BufferedReader(self._reader)
        self.rfile = self._buffered
        self._peer = _peer(self.client_address)
        self._phase = "request line"
        self._t0 = time.perf_counter()
        self.requestline = ""

    def handle(self) -> None:
        server = self.server
        reader = self._reader
        # A connection's first request must arrive within request_timeout of the accept.
        reader.deadline = server.accept_time(self.connection) + server.request_timeout
        self.close_connection = False
        first = True
        while not self.close_connection:
            if not first:
                # Idle (keep-alive) for up to idle_timeout; then the request has request_timeout to arrive.
                self._phase = "idle"
                reader.deadline, reader.wait = None, server.idle_timeout
                try:
                    if not self._buffered.peek(1):
                        return  # the client closed the connection
                except TimeoutError:
                    logger.debug("%s: idle for %g s: closed", self._peer, server.idle_timeout)
                    return
                except ConnectionError as exc:
                    self._disconnected(exc)
                    return
                reader.deadline = time.monotonic() + server.request_timeout
            first = False
            self.handle_one_request()

    def handle_one_request(self) -> None:
        """Reads one request, answers it (or answers why not); network errors end the connection."""
        self._phase = "request line"
        self._t0 = time.perf_counter()
        self.command, self.requestline, self.request_version = "", "", "HTTP/1.1"
        try:
            self.raw_requestline = self.rfile.readline(65537)
            if not self.raw_requestline:
                self.close_connection = True  # closed by the client before a new request: not an event
                return
            self._phase = "headers"
            if len(self.raw_requestline) > 65536:
                self.send_error(HTTPStatus.REQUEST_URI_TOO_LONG)
                return
            if not self.parse_request():
                return  # answered by send_error
            self._answer(self._dispatch())
        except TimeoutError:
            self._timed_out()
        except ConnectionError as exc:
            self._disconnected(exc)

    def _dispatch(self) -> Response:
        headers = _HeaderView(self.headers)
        path = request_path(self.path)
        if "transfer-encoding" in headers:
            # Only Content-Length bodies are read: a chunked one would be left on the connection.
            self.close_connection = True
            response = error_response(
                HTTPStatus.NOT_IMPLEMENTED,
                "Transfer-Encoding is not supported: send the body with a Content-Length",
                self.command == "HEAD",
            )
            self._count(response.status, path)
            return response

        def read_body(n: int) -> bytes:
            self._phase = "body"
            return self.rfile.read(n)

        return self.server.app.handle(self.command, path, headers, read_body)

    def _answer(self, response: Response, timeout: float | None = None) -> None:
        self._phase = "response"
        if response.close:
            self.close_connection = True
        self.connection.settimeout(self.server.request_timeout if timeout is None else timeout)
        self.send_response(response.status)
        for name, value in response.headers:
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if response.body:
            self.wfile.write(response.body)

    def _count(self, status: HTTPStatus, path: str | None = None) -> None:
        """Counts an answer given here rather than by App.handle in the app's request metrics."""
        handler = path if path in ROUTES else "other"
        self.server.app.metrics.observe(handler, self.command or "OTHER", status, time.perf_counter() - self._t0)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """Answers a request http.server could not parse (request line, version, headers) with JSON, and closes."""
        status = HTTPStatus(code)
        text = message or status.phrase
        logger.info("%s: %d %s: %s", self._peer, status.value, status.phrase, text)
        self.close_connection = True
        self._count(status)
        self._answer(error_response(status, text, self.command == "HEAD"))

    def _timed_out(self) -> None:
        self.close_connection = True
        self.server.count("timeouts")
        timeout = self.server.request_timeout
        if self._phase == "response":
            logger.warning("%s: answer not sent within %g s: connection closed", self._peer, timeout)
            return
        logger.warning(
            "%s: request not received within %g s (%s): answered 408, connection closed",
            self._peer, timeout, _PHASES[self._phase],
        )  # fmt: skip
        response = error_response(HTTPStatus.REQUEST_TIMEOUT, f"the request did not arrive within {timeout:g} s")
        self._count(response.status)
        try:
            self._answer(response, timeout=min(1.0, timeout))
        except OSError:
            pass  # gone or not reading: the connection is closed anyway

    def _disconnected(self, exc: BaseException) -> None:
        self.close_connection = True
        self.server.count("disconnects")
        logger.info("%s: client disconnected (%s) %s", self._peer, type(exc).__name__, _PHASES[self._phase])

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.access_log:
            access_logger.info("%s %s", self._peer, format % args)

    def log_error(self, format: str, *args: Any) -> None:
        logger.warning("%s: %s", self._peer, format % args)


class InferenceServer(HTTPServer):
    """An ``http.server.HTTPServer`` serving an ``App`` from a bounded pool of connection threads.

    Each open connection is served by one pool thread for as long as it stays
    open (keep-alive). At most ``max_connections`` are open at once: one
    accepted past that is answered 503 and closed by a helper thread, without
    taking a pool thread. Pool threads start on demand and are reused; there
    are never more than ``max_connections`` of them. A request must arrive
    within ``request_timeout`` seconds (counted from the accept for a
    connection's first request, from its first byte for later ones), or it
    is answered 408 and its connection closed; an idle keep-alive connection
    is closed after ``idle_timeout`` seconds. The listen backlog is
    ``LISTEN_BACKLOG``.

    ``server_close()`` (after ``shutdown()``) wakes the threads of idle
    connections, lets the requests being answered finish, and joins every
    pool thread; one still running after ``close_timeout`` seconds is left
    behind (a daemon) and named in ``hung_handlers`` instead of hanging the
    shutdown.

    Members and what guards them: ``_open``, ``_workers``, ``_counters``,
    ``_rejecter`` by ``_lock``; ``_jobs`` and ``_rejects`` are thread-safe
    queues; the settings are fixed after ``__init__``. Invariant, under
    ``_lock``: ``len(_workers) >= len(_open)`` (every open connection has a
    pool thread serving it or about to), so a queued connection never waits
    for a busy thread.
    """

    request_queue_size = LISTEN_BACKLOG
    close_timeout = 30.0
    #: Connections refused at once and waiting for their 503; past that, closed without one.
    reject_queue_size = 64

    def __init__(
        self,
        address: tuple[str, int],
        model: Model,
        access_log: bool = False,
        max_connections: int = MAX_CONNECTIONS,
        request_timeout: float = REQUEST_TIMEOUT,
        idle_timeout: float = IDLE_TIMEOUT,
    ):
        _check_limits(max_connections, request_timeout, idle_timeout)
        self.model = model
        self.app = App(model)
        self.app.transport_metrics = self._metric_families
        self.max_body_bytes = self.app.max_body_bytes
        self.access_log = access_log
        self.max_connections = max_connections
        self.request_timeout = request_timeout
        self.idle_timeout = idle_timeout
        self._lock = threading.Lock()
        self._open: dict[socket.socket, float] = {}  # accepted, not yet closed -> accept time (monotonic)
        self._workers: set[threading.Thread] = set()
        self._counters = {"rejected": 0, "timeouts": 0, "disconnects": 0}
        self._rejecter: threading.Thread | None = None
        self._started = 0  # pool threads ever started, for their names
        # (socket, client address) to serve, or None: the pool thread taking it exits.
        self._jobs: queue.SimpleQueue[tuple[socket.socket, Any] | None] = queue.SimpleQueue()
        self._rejects: queue.Queue[socket.socket | None] = queue.Queue(self.reject_queue_size)
        self.hung_handlers: list[str] = []  # set by server_close()
        super().__init__(address, _Handler)

    @property
    def port(self) -> int:
        """The bound port (useful with port 0)."""
        return self.server_address[1]

    def accept_time(self, connection: socket.socket) -> float:
        """When ``connection`` was accepted (``time.monotonic()``)."""
        with self._lock:
            return self._open.get(connection, time.monotonic())

    def worker_threads(self) -> int:
        """Pool threads alive now (never more than ``max_connections``)."""
        with self._lock:
            return len(self._workers)

    def count(self, what: str) -> None:
        """Adds one to a transport counter: "rejected", "timeouts" or "disconnects"."""
        with self._lock:
            self._counters[what] += 1

    def process_request(self, request: Any, client_address: Any) -> None:
        # In the serving thread: admit the connection to the pool, or refuse it.
        accepted = time.monotonic()
        thread = None
        with self._lock:
            full = len(self._open) >= self.max_connections
            if not full:
                self._open[request] = accepted
                if len(self._workers) < len(self._open):
                    self._started += 1
                    thread = threading.Thread(target=self._work, name=f"serve-worker-{self._started}", daemon=True)
                    self._workers.add(thread)
        if full:
            self._refuse(request, client_address)
            return
        if thread is not None:
            try:
                thread.start()
            except BaseException as exc:  # e.g. "can't start new thread": never joinable, so not ours to join
                with self._lock:
                    self._workers.discard(thread)
                logger.error("%s: dropped: no thread to serve it (%s: %s)", _peer(client_address), type(exc).__name__, exc)
                self.shutdown_request(request)
                return
        self._jobs.put((request, client_address))

    def _work(self) -> None:
        """A pool thread: serves connections one after the other until it takes None."""
        me = threading.current_thread()
        idle_name = me.name
        try:
            while (job := self._jobs.get()) is not None:
                request, client_address = job
                # Named after the connection while serving it, for hung_handlers and thread dumps.
                me.name = f"connection-{client_address[1] if isinstance(client_address, tuple) else ''}"
                try:
                    self.finish_request(request, client_address)
                except Exception:
                    self.handle_error(request, client_address)
                finally:
                    self.shutdown_request(request)
                    me.name = idle_name
        finally:
            with self._lock:
                self._workers.discard(me)

    def _refuse(self, request: socket.socket, client_address: Any) -> None:
        """Answers 503 and closes, in the rejecter thread (closing with the request unread would reset it)."""
        self.count("rejected")
        logger.warning(
            "%s: refused: %d connections open (--max-connections): answered 503",
            _peer(client_address), self.max_connections,
        )  # fmt: skip
        with self._lock:
            if self._rejecter is None:
                self._rejecter = threading.Thread(target=self._reject_loop, name="serve-rejecter", daemon=True)
                self._rejecter.start()
        try:
            self._rejects.put_nowait(request)
        except queue.Full:
            request.close()

    def _reject_loop(self) -> None:
        response = error_response(
            HTTPStatus.SERVICE_UNAVAILABLE, f"too many connections (the limit is {self.max_connections}); retry later"
        )
        head = "".join(f"{name}: {value}\r\n" for name, value in response.headers)
        data = (
            f"HTTP/1.1 503 Service Unavailable\r\n{head}Retry-After: 1\r\nConnection: close\r\n\r\n".encode()
            + response.body
        )
        while (sock := self._rejects.get()) is not None:
            try:
                sock.settimeout(1.0)
                sock.sendall(data)
                sock.shutdown(socket.SHUT_WR)
                # Read what the client sent until it closes, for up to 1 s: closing with
                # unread bytes would reset the connection, and could lose the 503.
                deadline = time.monotonic() + 1.0
                while (left := deadline - time.monotonic()) > 0:
                    sock.settimeout(left)
                    if not sock.recv(65536):
                        break
            except OSError:
                pass
            finally:
                sock.close()

    def shutdown_request(self, request: Any) -> None:
        with self._lock:
            self._open.pop(request, None)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """One line for a network error, one traceback for anything else (a bug)."""
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError):
            logger.info("%s: connection error (%s: %s)", _peer(client_address), type(exc).__name__, exc)
        else:
            logger.error("%s: unexpected error serving the connection", _peer(client_address), exc_info=exc)

    def server_close(self) -> None:
        with self._lock:
            open_connections = list(self._open)
            workers = list(self._workers)
            rejecter = self._rejecter
        for connection in open_connections:
            try:
                # Ends the wait for a next request; a request being answered still gets its reply.
                connection.shutdown(socket.SHUT_RD)
            except OSError:
                pass
        super().server_close()
        for _ in workers:
            self._jobs.put(None)
        if rejecter is not None:
            self._rejects.put(None)
        deadline = time.monotonic() + self.close_timeout
        for thread in workers + ([rejecter] if rejecter is not None else []):
            thread.join(max(0.0, deadline - time.monotonic()))
        self.hung_handlers = sorted(t.name for t in workers if t.is_alive())

    def _metric_families(self) -> list[MetricFamily]:
        with self._lock:
            open_now, workers, counters = len(self._open), len(self._workers), dict(self._counters)

        def one(name: str, kind: str, text: str, value: int) -> MetricFamily:
            return MetricFamily(name, kind, text, (("", (), value),))

        return [
            one("serve_connections_open", "gauge", "Connections open now (being served or about to be).", open_now),
            one("serve_connections_max", "gauge", "The limit of open connections (--max-connections).", self.max_connections),
            one("serve_worker_threads", "gauge", "Connection threads in the pool (at most --max-connections).", workers),
            one("serve_connections_rejected_total", "counter", "Connections refused with 503: --max-connections were open.", counters["rejected"]),
            one("serve_request_timeouts_total", "counter", "Requests not received, or answers not sent, within --request-timeout.", counters["timeouts"]),
            one("serve_client_disconnects_total", "counter", "Connections the client reset in the middle of a request or answer.", counters["disconnects"]),
        ]  # fmt: skip


def _host(server: InferenceServer | WaitressServer) -> str:
    """The bound address, as text."""
    host = server.server_address[0]
    return host if isinstance(host, str) else bytes(host).decode()


def _check_limits(max_connections: int, request_timeout: float, idle_timeout: float) -> None:
    if isinstance(max_connections, bool) or not isinstance(max_connections, int) or max_connections < 1:
        raise ValueError(f"max_connections must be a positive int, got {max_connections!r}")
    for name, value in (("request_timeout", request_timeout), ("idle_timeout", idle_timeout)):
        if not (isinstance(value, (int, float)) and value > 0 and math.isfinite(value)):
            raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")


# --- the same App under waitress, a maintained threaded WSGI server -----------------------------------------------


class AtMostEvery(logging.Filter):
    """A logging filter that lets one record through per ``seconds`` and drops the rest.

    The next record it lets through says how many it dropped. waitress warns
    "Task queue depth is N" on ``waitress.queue`` each time a request waits
    for a busy worker: under load that is nearly every request (4,001 lines
    for 4,000 requests at 200 clients), which is one signal, not 4,001
    events. ``WaitressServer`` puts one of these (10 s) on that logger.
    """

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self.seconds = seconds
        self._clock = clock
        self._lock = threading.Lock()  # waitress's worker threads log at once
        self._last: float | None = None
        self._dropped = 0

    def filter(self, record: logging.LogRecord) -> bool:
        now = self._clock()
        with self._lock:
            if self._last is not None and now - self._last < self.seconds:
                self._dropped += 1
                return False
            self._last, dropped, self._dropped = now, self._dropped, 0
        if dropped:
            record.msg = f"{record.getMessage()} ({dropped} more like it in the last {self.seconds:g} s not logged)"
            record.args = ()
        return True


_queue_filter_lock = threading.Lock()


def _quiet_waitress_queue() -> None:
    """One AtMostEvery(10 s) on ``waitress.queue``, however many servers are made (in any threads)."""
    queue_logger = logging.getLogger("waitress.queue")
    with _queue_filter_lock:
        if not any(isinstance(f, AtMostEvery) for f in queue_logger.filters):
            queue_logger.addFilter(AtMostEvery(10.0))


class WaitressServer:
    """The ``App`` as a WSGI application under waitress (optional: ``pip install waitress``).

    waitress reads requests in one I/O thread (an asyncore-style loop) and
    hands each complete one to a fixed pool of ``threads`` worker threads, so
    a slow or idle client holds no worker thread; at most ``max_connections``
    connections are accepted at once (more wait in the listen backlog), and a
    connection with no activity for ``idle_timeout`` seconds is closed.
    waitress has no deadline for a whole request to arrive (its timeout is
    renewed by every byte) and answers the errors it finds itself (a bad
    request line, a body over ``max_body_bytes``) in text/plain, not JSON.

    The same interface as ``InferenceServer``: ``serve_forever()``,
    ``shutdown()`` (from another thread), then ``server_close()``, which
    lets the requests being answered finish, flushes their answers and joins
    the workers. waitress itself has no graceful stop (its ``close()`` drops
    answers still buffered), so ``server_close`` drives waitress's loop to
    drain them: that part reads waitress's attributes (``active_channels``,
    a channel's ``requests`` and ``total_outbufs_len``) and is checked
    against waitress 3.x by the tests.
    """

    close_timeout = 30.0

    def __init__(
        self,
        address: tuple[str, int],
        model: Model,
        access_log: bool = False,
        max_connections: int = MAX_CONNECTIONS,
        idle_timeout: float = IDLE_TIMEOUT,
        threads: int = WSGI_THREADS,
    ):
        from waitress.server import create_server  # optional: the "serve" extra

        _check_limits(max_connections, REQUEST_TIMEOUT, idle_timeout)
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError(f"threads must be a positive int, got {threads!r}")
        _quiet_waitress_queue()
        self.model = model
        self.app = App(model)
        self.max_body_bytes = self.app.max_body_bytes
        self.threads = threads
        self.max_connections = max_connections
        self.hung_handlers: list[str] = []  # set by server_close()
        self._stop = threading.Event()
        self._stopped = threading.Event()
        application: Callable[..., Any] = _AccessLog(self.app) if access_log else self.app
        self._server = create_server(
            application,
            host=address[0],
            port=address[1],
            threads=threads,
            connection_limit=max_connections,
            channel_timeout=idle_timeout,
            backlog=LISTEN_BACKLOG,
            max_request_body_size=self.max_body_bytes,
            ident="ftjit-serve",
            asyncore_use_poll=True,  # select() cannot watch file descriptors past 1023
            clear_untrusted_proxy_headers=True,
        )
        self.server_address = (self._server.effective_host, int(self._server.effective_port))

    @property
    def port(self) -> int:
        """The bound port (useful with port 0)."""
        return self.server_address[1]

    def serve_forever(self) -> None:
        """Runs waitress's loop until ``shutdown()``; then stops accepting connections."""
        from waitress import wasyncore

        server = self._server
        try:
            while not self._stop.is_set():
                wasyncore.loop(timeout=1.0, map=server._map, use_poll=True, count=1)
        finally:
            # Stop listening, but keep the trigger that wakes the loop: server_close() still runs it.
            wasyncore.dispatcher.close(server)
            self._stopped.set()

    def shutdown(self) -> None:
        """Stops ``serve_forever()`` and waits for it to return; call it from another thread."""
        self._stop.set()
        self._server.pull_trigger()
        self._stopped.wait()

    def server_close(self) -> None:
        """Answers the requests received (flushing their answers), closes every connection, joins the workers."""
        from waitress import wasyncore

        server = self._server
        deadline = time.monotonic() + self.close_timeout
        if not self._stopped.is_set():  # never served: nothing in flight
            wasyncore.dispatcher.close(server)
        while server.active_channels and time.monotonic() < deadline:
            for channel in list(server.active_channels.values()):
                if not channel.requests and not channel.total_outbufs_len:
                    channel.will_close = True  # idle, or its answers are sent: the loop closes it
            wasyncore.loop(timeout=0.05, map=server._map, use_poll=True, count=1)
        dispatcher = server.task_dispatcher
        dispatcher.shutdown(cancel_pending=True, timeout=max(0.0, deadline - time.monotonic()))
        self.hung_handlers = sorted(f"waitress-{n}" for n in dispatcher.threads)
        server.trigger.close()
        wasyncore.close_all(server._map)


class _AccessLog:
    """A WSGI middleware logging one line per request to ``serve.access`` (``--access-log``)."""

    def __init__(self, app: Callable[..., Any]):
        self.app = app

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        status_line: list[str] = []

        def recording_start_response(status: str, headers: list[tuple[str, str]], *exc_info: Any) -> Any:
            status_line.append(status)
            return start_response(status, headers, *exc_info)

        result = self.app(environ, recording_start_response)
        access_logger.info(
            "%s:%s \"%s %s\" %s",
            environ.get("REMOTE_ADDR", "-"), environ.get("REMOTE_PORT", "-"), environ.get("REQUEST_METHOD"),
            environ.get("PATH_INFO"), status_line[0].split(" ", 1)[0] if status_line else "-",
        )  # fmt: skip
        return result


# --- running it ----------------------------------------------------------------------------------------------------


def make_server(
    host: str = "127.0.0.1",
    port: int = 0,
    max_batch: int = DEFAULT_MAX_BATCH,
    warmup_workers: int = 4,
    access_log: bool = False,
    server: str = "stdlib",
    max_connections: int = MAX_CONNECTIONS,
    request_timeout: float = REQUEST_TIMEOUT,
    idle_timeout: float = IDLE_TIMEOUT,
    threads: int = WSGI_THREADS,
) -> tuple[InferenceServer | WaitressServer, Model]:
    """Builds the model, warms every bucket, then binds the server (not yet serving).

    ``server`` is "stdlib" (``InferenceServer``; ``threads`` unused) or
    "waitress" (``WaitressServer``; ``request_timeout`` unused: see its
    docstring). Raises RuntimeError when a bucket fails to compile,
    ValueError for a bad setting, and ImportError for waitress when it is
    not installed. The warmup report is ``model.warmup_report``.
    """
    if server not in SERVERS:
        raise ValueError(f"server must be one of {', '.join(SERVERS)}, got {server!r}")
    _check_limits(max_connections, request_timeout, idle_timeout)
    if server == "waitress":
        import waitress  # noqa: F401 - fail before the warmup, not after
    model = Model(max_batch=max_batch)
    report = model.warm(workers=warmup_workers)
    if not report.ok:
        raise RuntimeError(f"warmup failed:\n{report}")
    if server == "waitress":
        return WaitressServer((host, port), model, access_log, max_connections, idle_timeout, threads), model
    return InferenceServer((host, port), model, access_log, max_connections, request_timeout, idle_timeout), model


@dataclasses.dataclass
class RunningServer:
    """A server serving in a background thread (see ``serve_in_thread``)."""

    server: InferenceServer | WaitressServer
    model: Model
    thread: threading.Thread

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def url(self) -> str:
        return f"http://{_host(self.server)}:{self.port}"

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
    server: str = "stdlib",
    max_connections: int = MAX_CONNECTIONS,
    request_timeout: float = REQUEST_TIMEOUT,
    idle_timeout: float = IDLE_TIMEOUT,
    threads: int = WSGI_THREADS,
) -> RunningServer:
    """``make_server`` then ``serve_forever`` in a background thread; returns once it accepts connections."""
    bound, model = make_server(
        host, port, max_batch, warmup_workers, access_log, server, max_connections, request_timeout, idle_timeout, threads
    )
    thread = threading.Thread(target=bound.serve_forever, name=f"serve-{bound.port}")
    thread.start()
    return RunningServer(bound, model, thread)


def main(argv: list[str] | None = None) -> int:
    """The command line: warm up, serve until SIGINT/SIGTERM, shut down cleanly."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    parser.add_argument("--port", type=int, default=8000, help="port to bind; 0 picks a free one (default: 8000)")
    parser.add_argument("--max-batch", type=int, default=DEFAULT_MAX_BATCH, help="largest batch accepted")
    parser.add_argument("--warmup-workers", type=int, default=4, help="threads compiling the buckets at start-up")
    parser.add_argument("--server", choices=SERVERS, default="stdlib", help="the HTTP server (default: stdlib)")
    parser.add_argument(
        "--max-connections", type=int, default=MAX_CONNECTIONS,
        help=f"connections open at once; stdlib: also its thread limit, 503 past it (default: {MAX_CONNECTIONS})",
    )  # fmt: skip
    parser.add_argument(
        "--request-timeout", type=float, default=REQUEST_TIMEOUT,
        help=f"seconds a request may take to arrive, else 408 (stdlib only; default: {REQUEST_TIMEOUT:g})",
    )  # fmt: skip
    parser.add_argument(
        "--idle-timeout", type=float, default=IDLE_TIMEOUT,
        help=f"seconds an idle keep-alive connection stays open (default: {IDLE_TIMEOUT:g})",
    )  # fmt: skip
    parser.add_argument(
        "--threads", type=int, default=WSGI_THREADS, help=f"waitress worker threads (default: {WSGI_THREADS})"
    )
    parser.add_argument("--access-log", action="store_true", help="log every request (logger serve.access)")
    parser.add_argument(
        "--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"), help="(default: INFO)"
    )
    args = parser.parse_args(argv)
    # One line per record. The root logger stays at WARNING (JAX's INFO notices are not this server's);
    # the server's own loggers, ftjit's (one INFO line per compile) and waitress's get --log-level.
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    for name in ("serve", "ftjit", "waitress"):
        logging.getLogger(name).setLevel(args.log_level)

    try:
        server, model = make_server(
            args.host, args.port, args.max_batch, args.warmup_workers, args.access_log, args.server,
            args.max_connections, args.request_timeout, args.idle_timeout, args.threads,
        )  # fmt: skip
    except ImportError as exc:
        print(f"serve.py: --server {args.server} needs {exc.name}: pip install 'ftjit[serve]'", file=sys.stderr)
        return 1
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
    host, port = _host(server), server.port
    logger.info(
        "%s server: --max-connections %d, --idle-timeout %g s, %s",
        args.server, args.max_connections, args.idle_timeout,
        f"--threads {args.threads}" if args.server == "waitress" else f"--request-timeout {args.request_timeout:g} s",
    )  # fmt: skip
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
