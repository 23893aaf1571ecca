"""A JSON inference server for a small JAX MLP: ftjit.jit in a threaded WSGI app, served by granian or waitress.

The front's threads all call one jitted function at once: granian's (HTTP in Rust; its free-threaded mode
runs the app in threads of this process) where the GIL is off, else waitress's (``--front``; docs/serving.md,
"Fronts"). The ftjit parts are marked ``# ftjit:``: jit once with a recompile guard (``Model``), compile
every batch bucket before the port opens (``Model.warm``, ``main``), pad batches to their bucket so that
traffic only meets compiled signatures, answer the guard's ``RecompileLimitError`` with a JSON error
(``App.predict``), report ``ftjit.stats()`` on ``/stats`` and ``/metrics``, and keep the compiled signatures
in a file for the next start (``save_specs``). HTTP is granian's or waitress's, metrics are
prometheus_client's (``ftjit[serve]``). ``--jit jax`` serves the same model, buckets and padding through
``jax.jit`` instead (``JaxModel``), for comparison; ``--unix-socket PATH`` listens on a unix socket instead
of TCP (for a machine where no internet socket, not even loopback, may be opened).

``--batch`` merges concurrent requests that carry one example each into one call of the model over a batch
(``ftjit.batched``: ``BatchedModel``), with a histogram of batch sizes on ``/metrics``.

Run it as ``.venv/bin/python examples/serve.py --port 8000 [--front granian|waitress] [--threads 8]
[--max-batch 32] [--batch] [--warmup-workers 4] [--specs FILE] [--compile-cache DIR] [--jit ftjit|jax]``
(or ``--unix-socket PATH`` instead of ``--port``); SIGTERM or SIGINT stops it. docs/serving.md is its manual.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import json
import logging
import math
import os
import pathlib
import signal
import socket
import stat
import sys
import threading
import time
from http import HTTPStatus
from typing import Any, Callable, Iterable

import jax
import jax.numpy as jnp
import numpy as np
import prometheus_client
import waitress

import ftjit

if __package__ in (None, ""):  # run as a script: make the ``examples`` package importable (as demo.py does)
    sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from examples.serve_metrics import BatchCollector, FtjitCollector, RequestMetrics  # noqa: E402

logger = logging.getLogger("serve")

N_INPUTS, N_HIDDEN, N_OUTPUTS = 16, 64, 4
DEFAULT_MAX_BATCH, DEFAULT_SEED = 32, 0
#: waitress's settings; docs/serving.md says why. Worker threads: each answers one request at a time.
THREADS = 8
#: Open connections. waitress's default, 100, is too small: with 200 keep-alive clients, 100 would wait.
#: Once this many are open (idle keep-alive ones included), waitress accepts no new one until some close.
CONNECTION_LIMIT = 1000
#: Seconds an idle connection stays open (waitress's default, 120): with the limit, what a crowd of idle
#: clients can lock new ones out for. docs/serving.md says how to size both.
CHANNEL_TIMEOUT = 120.0
#: The most bytes of a request's line and headers (waitress's default: 256 KiB): this app's requests carry a few
#: hundred, and a proxy's or a tracer's headers a few KiB more. A client that sends them slowly still holds its
#: connection as long as it likes: docs/serving.md, "Slow clients".
MAX_HEADER_BYTES = 16 * 1024
#: Connections the kernel queues before waitress accepts them (waitress's default: enough for 200 at once).
BACKLOG = 1024
#: Open files the server needs besides its connections: the listener, waitress's trigger pipe, logs, the specs
#: file, JAX's compilation cache and runtime (9 in all here, idle on the CPU; an accelerator's runtime opens more).
FILES_BESIDE_CONNECTIONS = 128


def make_weights(seed: int = DEFAULT_SEED) -> dict[str, np.ndarray]:
    """The MLP's float32 weights, drawn from a fixed-seed generator (scaled by 1/sqrt(fan-in))."""
    rng = np.random.default_rng(seed)
    return {
        "w1": (rng.standard_normal((N_INPUTS, N_HIDDEN)) / math.sqrt(N_INPUTS)).astype(np.float32),
        "b1": (0.1 * rng.standard_normal(N_HIDDEN)).astype(np.float32),
        "w2": (rng.standard_normal((N_HIDDEN, N_OUTPUTS)) / math.sqrt(N_HIDDEN)).astype(np.float32),
        "b2": (0.1 * rng.standard_normal(N_OUTPUTS)).astype(np.float32),
    }


def forward(params: dict[str, Any], x: Any, xp: Any = np) -> Any:
    """The MLP, ``relu(x @ w1 + b1) @ w2 + b2``, written against the array module ``xp``."""
    return xp.maximum(x @ params["w1"] + params["b1"], 0) @ params["w2"] + params["b2"]


def mlp(params: dict[str, Any], x: Any) -> Any:
    """``forward`` in ``jax.numpy``: the function the server runs through ``ftjit.jit``.

    Its matmuls are float32 on every backend (a TPU's default passes bfloat16), so answers match load.py's
    float64 reference there too."""
    with jax.default_matmul_precision("highest"):
        return forward(params, x, jnp)


def batch_buckets(max_batch: int) -> tuple[int, ...]:
    """The padded batch sizes: the powers of two below ``max_batch``, then ``max_batch`` itself."""
    return tuple(2**i for i in range(max_batch.bit_length()) if 2**i < max_batch) + (max_batch,)


def gil_enabled() -> bool:
    """Whether the GIL is enabled in this process now (always, before CPython 3.13)."""
    return sys._is_gil_enabled() if hasattr(sys, "_is_gil_enabled") else True


class Model:
    """The MLP, jitted once; every worker thread calls ``predict`` at once. ``fun`` replaces ``mlp``;
    ``max_signatures`` defaults to the number of buckets. Each Model has its own ``ftjit.FunctionCache``,
    so that several in one process (tests, the demo) count their compiles apart."""

    jit = "ftjit"  #: what jits ``fun`` (``--jit``; ``JaxModel``'s is "jax")

    def __init__(self, max_batch: int = DEFAULT_MAX_BATCH, fun: Callable[..., Any] = mlp,
                 max_signatures: int | None = None, seed: int = DEFAULT_SEED):  # fmt: skip
        self.max_batch, self.buckets = max_batch, batch_buckets(max_batch)
        self.weights = make_weights(seed)
        self.params = {name: jnp.asarray(value) for name, value in self.weights.items()}
        self.fn = self._jit(fun, len(self.buckets) if max_signatures is None else max_signatures)
        self.warmup_report: Any = None  # ftjit.WarmupReport (JaxModel: CallWarmup) once warmed up
        self.ready = False  # warmed up, every bucket compiled if asked: /healthz answers 200 (App.route)
        #: bucket -> why its signature could not be compiled (at the warm-up or in a request): /healthz then
        #: answers 503 and names it. Written by the warm-up and by worker threads (a dict item store is atomic).
        self.failed_buckets: dict[int, str] = {}

    def _jit(self, fun: Callable[..., Any], max_signatures: int) -> Any:
        """``fun`` jitted once, for every thread (``JaxModel`` jits it with jax.jit instead)."""
        # ftjit: one jitted function for all threads. Padding makes one signature per bucket; a signature past
        # them (an unpadded batch, another dtype: a bug) raises RecompileLimitError instead of compiling.
        return ftjit.jit(fun, cache=ftjit.FunctionCache(), max_signatures=max_signatures, on_excess="raise")

    def warm(self, workers: int = 4, buckets: bool = True, saved: ftjit.SavedSpecs | None = None) -> ftjit.WarmupReport:
        """Compiles every bucket's signature from shapes alone (if ``buckets``) and those ``saved`` by a previous run
        (``ftjit.load_specs``), ``workers`` at a time. A saved one that fails is only a line of the report."""
        spec = lambda shape: jax.ShapeDtypeStruct(shape, np.float32)  # noqa: E731
        params = {name: spec(value.shape) for name, value in self.weights.items()}
        specs = [(params, spec((b, N_INPUTS))) for b in self.buckets] if buckets else []
        # ftjit: compile before traffic, in parallel threads (XLA releases the GIL while it compiles). The
        # buckets come first; the saved specs (ftjit.SavedSpec) only fill the room max_signatures leaves and
        # count against it once a request uses them, so a stale file can never take a bucket's signature.
        report = self.fn.warmup(specs + (saved.for_function(self.fn) if saved else []), workers=workers)
        for bucket, result in zip(self.buckets if buckets else (), report.results):
            if result.error is not None:
                self.failed_buckets[bucket] = f"{type(result.error).__name__}: {result.error}"
        self.warmup_report, self.ready = report, not self.failed_buckets
        return report

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Outputs for a float32 ``(rows, N_INPUTS)`` batch: zero-padded to its bucket, then trimmed."""
        bucket = next(b for b in self.buckets if b >= len(x))
        padded = np.zeros((bucket, N_INPUTS), np.float32)
        padded[: len(x)] = x
        try:
            return np.asarray(self.fn(self.params, padded))[: len(x)]  # ftjit: a hit, once the bucket is warm
        except ftjit.RecompileLimitError as exc:  # a bucket the guard will never let compile: unhealthy
            self.failed_buckets[bucket] = f"{type(exc).__name__}: {exc}"
            raise

    def stats(self) -> dict[str, Any]:
        """``ftjit.stats()`` and this model's counters, signatures, buckets and warm-up, JSON-ready."""
        snapshot, report = ftjit.stats(), self.warmup_report
        return {
            "jit": self.jit,
            "ftjit": snapshot.as_dict(top=len(snapshot.functions)),  # every live jitted function
            "function": {"name": self.fn.__name__, "cache_info": self.fn.cache_info()._asdict(),
                         "signatures": [info._asdict() for info in self.fn.signatures()]},
            "buckets": list(self.buckets),
            "warmup": None if not report else {  # None: nothing was warmed up
                "ok": report.ok, "wall_seconds": report.wall_seconds, "workers": report.workers,
                "results": [{"signature": r.shown()[0], "seconds": r.seconds, "compiled": r.compiled,
                             "error": None if r.error is None else r.shown()[1]} for r in report]},
            "gil_enabled": gil_enabled(),
        }  # fmt: skip


@dataclasses.dataclass(frozen=True)
class CallWarmup:
    """``JaxModel.warm``'s report: the seconds of each bucket's first call (its compile, under jax.jit)."""

    seconds: dict[int, float]  #: bucket -> seconds of its call
    wall_seconds: float

    def __len__(self) -> int:
        return len(self.seconds)

    def __str__(self) -> str:
        calls = ", ".join(f"{bucket}: {s:.3f} s" for bucket, s in self.seconds.items())
        return f"warmup: {len(self)} bucket(s) called once each through jax.jit in {self.wall_seconds:.2f} s ({calls})"


class JaxModel(Model):
    """The same MLP, weights, buckets and padding (``predict``), jitted by ``jax.jit`` instead: ``--jit jax``,
    to compare with. jax.jit has no recompile guard (``max_signatures`` is ignored: padding alone keeps the
    signatures to the buckets), no warm-up from shapes, and no counters that /stats could report."""

    jit = "jax"

    def _jit(self, fun: Callable[..., Any], max_signatures: int) -> Any:
        return jax.jit(fun)

    def warm(self, workers: int = 4, buckets: bool = True, saved: ftjit.SavedSpecs | None = None) -> Any:
        """Calls the function once per bucket (if ``buckets``), in turn, on zeros: jax.jit compiles at a
        signature's first call. ``workers`` does not apply, and ``saved`` must be None (specs are ftjit's)."""
        assert saved is None, "a specs file is ftjit's: --specs needs --jit ftjit"
        seconds, start = {}, time.perf_counter()
        for bucket in self.buckets if buckets else ():
            t0 = time.perf_counter()
            jax.block_until_ready(self.fn(self.params, np.zeros((bucket, N_INPUTS), np.float32)))
            seconds[bucket] = time.perf_counter() - t0
        self.warmup_report, self.ready = CallWarmup(seconds, time.perf_counter() - start), True
        return self.warmup_report

    def stats(self) -> dict[str, Any]:
        """What /stats can say of a jax.jit function: no ftjit numbers (null), the buckets and the warm-up's calls."""
        report = self.warmup_report
        return {
            "jit": self.jit, "ftjit": None,
            "function": {"name": self.fn.__name__, "cache_info": None, "signatures": None},
            "buckets": list(self.buckets),
            "warmup": None if not report else {  # None: nothing was warmed up
                "ok": True, "wall_seconds": report.wall_seconds, "workers": 1,
                "results": [{"bucket": bucket, "seconds": s} for bucket, s in report.seconds.items()]},
            "gil_enabled": gil_enabled(),
        }  # fmt: skip


class BatchedModel(Model):
    """``--batch``: a request of one example is one call of ``ftjit.batched``, merged with the concurrent
    requests' calls into one call of the MLP over a batch (``BatchedModel.predict_one``); a request of several
    rows goes through ``Model.predict``'s buckets as before. The weights are constants of the program (the
    example is the only argument a batch stacks)."""

    def __init__(self, max_batch: int = DEFAULT_MAX_BATCH, fun: Callable[..., Any] = mlp,
                 max_signatures: int | None = None, seed: int = DEFAULT_SEED, batch_wait: float = 0.001):  # fmt: skip
        super().__init__(max_batch, fun, max_signatures, seed)
        params = self.params

        def predict_one(x: Any) -> Any:  # one example: float32[N_INPUTS] -> float32[N_OUTPUTS]
            return fun(params, x)

        # ftjit: the example's function; concurrent requests' calls share one call of jax.vmap of it
        self.one = ftjit.batched(predict_one, max_batch=max_batch, max_wait=batch_wait, to_host=True,
                                 cache=ftjit.FunctionCache())  # fmt: skip

    def warm(self, workers: int = 4, buckets: bool = True, saved: ftjit.SavedSpecs | None = None) -> ftjit.WarmupReport:
        """``Model.warm``, then the one-example signature and every batch size of ``ftjit.batched``."""
        report = super().warm(workers, buckets, saved)
        if buckets:
            one = self.one.warmup([(jax.ShapeDtypeStruct((N_INPUTS,), np.float32),)], workers=workers)
            if not one.ok:
                self.failed_buckets[1] = "; ".join(f"{type(r.error).__name__}: {r.error}" for r in one.errors)
            report = ftjit.WarmupReport(report.results + one.results, report.wall_seconds + one.wall_seconds,
                                        workers)
        self.warmup_report, self.ready = report, not self.failed_buckets
        return report

    def predict(self, x: np.ndarray) -> np.ndarray:
        if len(x) == 1:
            return self.one(x[0])[None]  # ftjit: one example, batched with the other requests' examples
        return super().predict(x)

    def stats(self) -> dict[str, Any]:
        out = super().stats()
        out["batched"] = dataclasses.asdict(self.one.batch_info())
        return out


class HTTPError(Exception):
    """An error answer of the app's own: ``status``, ``{"error": message}`` as JSON, extra ``headers``."""

    def __init__(self, status: int, message: str, headers: Iterable[tuple[str, str]] = ()):
        super().__init__(message)
        self.status, self.headers = status, list(headers)


#: The endpoints and the methods each allows (HEAD: the GET's status and headers, no body).
ROUTES = {"/predict": ("POST",), "/healthz": ("GET", "HEAD"), "/stats": ("GET", "HEAD"), "/metrics": ("GET", "HEAD")}
JSON = "application/json"
HEALTHY, UNHEALTHY = json.dumps({"ok": True}).encode(), json.dumps({"ok": False}).encode()  #: /healthz's answers
#: Metric labels stay bounded: any other path is "other", any other method "OTHER".
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"})
#: "200 OK" and the like, made once (HTTPStatus(status) per request was a tenth of a /healthz request's time).
STATUS_LINES = {int(status): f"{int(status)} {status.phrase}" for status in HTTPStatus}


def parse_inputs(body: bytes, max_batch: int) -> np.ndarray:
    """The float32 ``(rows, N_INPUTS)`` batch of a ``/predict`` body; raises HTTPError 400 or 413."""
    try:
        inputs = json.loads(body)["inputs"]
    except (ValueError, RecursionError, TypeError, KeyError):  # not JSON or UTF-8, too deep, no "inputs"
        raise HTTPError(400, f'the body must be JSON {{"inputs": [[{N_INPUTS} numbers], ...]}}') from None
    if not isinstance(inputs, list) or not inputs or not all(
        isinstance(row, list) and len(row) == N_INPUTS and all(type(v) in (int, float) for v in row) for row in inputs
    ):
        raise HTTPError(400, f'"inputs" must be a non-empty list of rows of {N_INPUTS} numbers')
    if len(inputs) > max_batch:
        raise HTTPError(413, f"batch of {len(inputs)} rows exceeds max_batch={max_batch}")
    try:
        with np.errstate(over="ignore"):
            x = np.array(inputs, dtype=np.float32)
        if np.isfinite(x).all():
            return x
    except OverflowError:  # an int beyond float64
        pass
    raise HTTPError(400, "inputs must be finite float32 numbers")


class App:
    """The WSGI application: routes, JSON in and out, request metrics. waitress's workers call it at once."""

    def __init__(self, model: Model):
        self.model = model
        self.stopping = False  # set by serve() on SIGTERM or SIGINT: /healthz answers 503 from then on
        #: The largest /predict body (a full batch of long decimal numbers, with room): more is answered 413.
        self.max_body_bytes = 1024 + model.max_batch * N_INPUTS * 32
        self.registry = registry = prometheus_client.CollectorRegistry()
        if model.jit == "ftjit":  # under --jit jax no ftjit function lives: no ftjit series at all
            registry.register(FtjitCollector())
        if isinstance(model, BatchedModel):
            registry.register(BatchCollector(model))
        self.metrics = RequestMetrics()  # no lock per request: see its docstring
        registry.register(self.metrics)

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        method, path = environ["REQUEST_METHOD"], environ.get("PATH_INFO") or "/"
        t0 = time.perf_counter()
        tally = self.metrics.started()
        try:
            (status, body, content_type), headers = self.route(method, path, environ), []
        except HTTPError as exc:
            status, body, content_type = exc.status, json.dumps({"error": str(exc)}).encode(), JSON
            headers = exc.headers
        except BaseException:  # a bug: waitress answers 500 (and logs the traceback), counted as such here
            self.metrics.finished(tally, path if path in ROUTES else "other", method if method in METHODS else "OTHER",
                                  "500", time.perf_counter() - t0)  # fmt: skip
            raise
        self.metrics.finished(tally, path if path in ROUTES else "other", method if method in METHODS else "OTHER",
                              str(status), time.perf_counter() - t0)  # fmt: skip
        headers = [*headers, ("Content-Type", content_type), ("Content-Length", str(len(body)))]
        start_response(STATUS_LINES[status], headers)
        return [b"" if method == "HEAD" else body]

    def route(self, method: str, path: str, environ: dict[str, Any]) -> tuple[int, bytes, str]:
        """(status, body, Content-Type) of one request; raises HTTPError for the app's own errors."""
        allowed = ROUTES.get(path)
        if allowed is None:
            raise HTTPError(404, f"no such path: {path}")
        if method not in allowed:
            allow = ", ".join(allowed)
            raise HTTPError(405, f"method {method} is not allowed on {path} (allowed: {allow})", [("Allow", allow)])
        if path == "/predict":
            return 200, self.predict(environ), JSON
        if path == "/healthz":
            # 200: listening, warmed up, and no bucket's signature failed to compile (at the warm-up or, with
            # --no-bucket-warmup, in a request); else 503, naming the failed buckets.
            failed = dict(self.model.failed_buckets)
            ok = self.model.ready and not self.stopping and not failed
            if failed:
                body = json.dumps({"ok": ok, "failed_buckets": {str(b): e for b, e in failed.items()}}).encode()
            else:
                body = HEALTHY if ok else UNHEALTHY
            return (200 if ok else 503), body, JSON
        if path == "/stats":
            return 200, json.dumps(self.model.stats()).encode(), JSON
        return 200, prometheus_client.generate_latest(self.registry), prometheus_client.CONTENT_TYPE_LATEST

    def predict(self, environ: dict[str, Any]) -> bytes:
        content_type = environ.get("CONTENT_TYPE", "")
        if content_type.split(";", 1)[0].strip().lower() != JSON:
            raise HTTPError(415, f"Content-Type must be {JSON}, got {content_type or 'none'}")
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            raise HTTPError(400, "Content-Length must be a number of bytes") from None
        if length > self.max_body_bytes:  # waitress refuses it before the app; granian leaves it to the app
            raise HTTPError(413, f"the body's {length} bytes exceed {self.max_body_bytes}")
        x = parse_inputs(environ["wsgi.input"].read(length), self.model.max_batch)
        try:
            outputs = self.model.predict(x)
        except ftjit.RecompileLimitError as exc:  # ftjit: the guard refused to compile a signature in a request
            logger.error("POST /predict: %s", exc)
            raise HTTPError(500, str(exc)) from None
        if not np.isfinite(outputs).all():
            raise HTTPError(422, "the model's outputs are not finite for these inputs")
        return json.dumps({"outputs": outputs.tolist()}).encode()


class ListenError(OSError):
    """The server could not open its port or socket (``main`` says so and exits 1): an OSError raised while
    listening, told apart from any raised once it serves."""


def remove_stale_socket(path: str) -> None:
    """Removes a socket file at ``path`` that nothing listens on (left by a server that was killed). One that a
    server answers on, or a file of another kind, is left alone: an OSError says why the start fails."""
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISSOCK(os.stat(path).st_mode):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                try:
                    probe.connect(path)
                except ConnectionRefusedError:  # stale: no listener behind it
                    os.unlink(path)
                else:
                    raise OSError(errno.EADDRINUSE, f"a server is listening on {path}")


def listen_unix(path: str) -> socket.socket:
    """A unix socket listening at ``path``, mode 0600 (this user only, like waitress's ``unix_socket`` setting,
    which is not used: the socket is ours, handed to waitress like the TCP one, so that the stop can close it).
    A stale socket file there is replaced (``remove_stale_socket``)."""
    remove_stale_socket(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(path)
        os.chmod(path, 0o600)
        listener.listen(BACKLOG)
    except OSError:
        listener.close()
        raise
    return listener


def make_server(app: App, host: str = "127.0.0.1", port: int = 0, threads: int = THREADS,
                unix_socket: str | None = None, connection_limit: int = CONNECTION_LIMIT,
                channel_timeout: float = CHANNEL_TIMEOUT) -> tuple[Any, socket.socket]:  # fmt: skip
    """waitress serving ``app`` on a listening socket of our own, which is returned with it: TCP on
    ``host:port``, or the unix socket file ``unix_socket`` if given (``listen_unix``)."""
    try:
        listener = listen_unix(unix_socket) if unix_socket else socket.create_server((host, port), backlog=BACKLOG)
    except OSError as exc:
        raise ListenError(*exc.args) from None
    server = waitress.create_server(
        # waitress counts its own listener and trigger pipe against connection_limit: --connection-limit 2 accepted
        # no connection at all. So the two are added here, and connection_limit connections are accepted.
        app, sockets=[listener], threads=threads, connection_limit=connection_limit + 2,
        channel_timeout=channel_timeout,
        cleanup_interval=cleanup_interval(channel_timeout),  # else idle connections are closed every 30 s only
        backlog=BACKLOG,
        max_request_header_size=MAX_HEADER_BYTES,  # more gets waitress's own 431
        max_request_body_size=app.max_body_bytes,  # a bigger body gets waitress's own 413, unread
        asyncore_use_poll=True)  # select() cannot watch file descriptors past 1023  # fmt: skip
    return server, listener


def fit_open_files(connection_limit: int) -> str | None:
    """Raises this process's soft limit of open files (``ulimit -n``) to fit ``connection_limit`` connections and
    FILES_BESIDE_CONNECTIONS more, up to its hard limit; why it cannot, else None. Past the limit, waitress's
    accept() fails at once and its loop spins on it, logging each failure (a CPU core and a flood of tracebacks)."""
    try:
        import resource
    except ImportError:  # not POSIX: nothing to raise
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = connection_limit + FILES_BESIDE_CONNECTIONS
    if soft == resource.RLIM_INFINITY or soft >= need:
        return None
    if hard != resource.RLIM_INFINITY and hard < need:
        return (f"--connection-limit {connection_limit} needs {need} open files ({FILES_BESIDE_CONNECTIONS} besides "
                f"the connections), but the hard limit (ulimit -Hn) is {hard}: lower --connection-limit to "
                f"{max(1, hard - FILES_BESIDE_CONNECTIONS)} or less, or raise the hard limit")
    resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    logger.info("raised the limit of open files (ulimit -n) from %d to %d for --connection-limit %d", soft, need,
                connection_limit)
    return None


def cleanup_interval(channel_timeout: float) -> int:
    """waitress's ``cleanup_interval`` for a ``channel_timeout``: the seconds between its sweeps for idle
    connections, which close only then. A tenth of the timeout, from 1 s to waitress's default 30 s, so that an
    idle connection closes between ``channel_timeout`` and 10% (at most 30 s) plus a second after it (the
    loop's own timeout); waitress's 30 s alone kept a connection of --channel-timeout 2 open for 30 s."""
    return max(1, min(30, int(channel_timeout / 10)))


def serve(server: Any, listener: socket.socket, app: App, announce: str = "") -> int:
    """Runs waitress in this (the main) thread until SIGTERM or SIGINT; returns the exit code. ``announce``
    is printed once the signals are handled: a client that signals on seeing it stops the server cleanly.

    The signal closes the port (and removes a unix socket's file), then waitress's own stop runs: its
    loop ends and its workers finish the requests they are running, writing their answers, for up to
    5 s (requests still waiting for a worker are cancelled). 1 if a request was still in the app then,
    else 0. A second signal is ignored, so that it cannot cut the stop short; that stop is bounded by
    waitress's 5 s anyway."""

    def stop(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        app.stopping = True
        if listener.family == socket.AF_UNIX:
            with contextlib.suppress(OSError):
                os.unlink(listener.getsockname())
        listener.close()
        logger.info("%s: stopping; answering the requests being served", signal.Signals(signum).name)
        raise KeyboardInterrupt  # what waitress's run() stops on

    with contextlib.suppress(KeyboardInterrupt):  # the signal came before waitress's loop started: none in flight
        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        if announce:
            print(announce, flush=True)
        server.run()
    left = app.metrics.in_progress()
    if left:
        logger.error("%d request(s) still in the app 5 s after the signal: their answers are lost", left)
        return 1
    print("server stopped", flush=True)
    return 0


#: serve.py's HTTP fronts: granian (HTTP in Rust; its free-threaded mode runs the app in threads of this process)
#: and waitress (pure Python). docs/serving.md, "Fronts", compares them.
FRONTS = ("granian", "waitress")
#: Seconds the stop waits for the requests in flight (waitress's own bound; granian's is serve.py's watchdog).
STOP_SECONDS = 5.0


def granian_unavailable() -> str | None:
    """Why granian cannot be serve.py's front in this process, or None if it can."""
    if gil_enabled():
        # On a GIL build granian's workers are processes: the app, its warm-up, the stop and the specs would live
        # in a child, apart from this process's. serve.py keeps one process: waitress serves GIL builds.
        return ("--front granian needs a free-threaded Python with the GIL off (there granian's workers are "
                "threads of this process); this one has the GIL on: use --front waitress")
    try:
        import granian.server  # noqa: F401
    except ImportError:
        return "--front granian needs granian: pip install 'ftjit[serve]' (or granian>=2.7.9)"
    return None


def default_front() -> str:
    """granian where it can serve (``granian_unavailable``), else waitress."""
    return "granian" if granian_unavailable() is None else "waitress"


class GranianFront:
    """granian serving ``app`` from this process: one worker, a thread of this process (granian's free-threaded
    mode, which it calls experimental), whose ``threads`` blocking threads call the app at once; HTTP/1.1 is
    parsed in Rust, not in Python. serve.py's settings map onto granian's:

    - ``connection_limit``: granian's backpressure, which holds one permit per open connection (idle keep-alive
      ones included): past it, a new connection waits in the backlog until one closes;
    - ``channel_timeout``: its HTTP/1 header read timeout, which closes a connection that sends no complete
      request head for that long, idle keep-alive ones and slow senders alike;
    - MAX_HEADER_BYTES: its read buffer, which bounds a request's head loosely (measured: a head of 24,000 bytes
      was answered, one of 32,768 got granian's own 431); the body's bound is the app's (``App.predict``: 413
      from the Content-Length, before reading);
    - a unix socket is made mode 0600, after ``remove_stale_socket``.

    ``run`` serves until SIGTERM or SIGINT (``serve_granian``)."""

    def __init__(self, app: App, host: str = "127.0.0.1", port: int = 0, threads: int = THREADS,
                 unix_socket: str | None = None, connection_limit: int = CONNECTION_LIMIT,
                 channel_timeout: float = CHANNEL_TIMEOUT):  # fmt: skip
        from granian.constants import HTTPModes, Interfaces
        from granian.http import HTTP1Settings
        from granian.log import LogLevels
        from granian.server import MTServer

        address = host
        try:
            if unix_socket:
                remove_stale_socket(unix_socket)
            else:  # granian takes a numeric address only, and its bind fails with a Rust backtrace: checked here
                family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
                address = sockaddr[0]
                if port:
                    socket.create_server((address, port), family=family).close()
        except OSError as exc:
            raise ListenError(*exc.args) from None
        self.app, self.unix_socket, self.host, self.port = app, unix_socket, address, port
        self.server = MTServer(
            "examples.serve:App",  # a name only: run() hands granian this app, nothing is imported
            address=address, port=port, uds=pathlib.Path(unix_socket) if unix_socket else None, uds_permissions=0o600,
            interface=Interfaces.WSGI, http=HTTPModes.http1, websockets=False, workers=1,
            blocking_threads=threads, blocking_threads_idle_timeout=600, backlog=BACKLOG,
            backpressure=connection_limit,
            http1_settings=HTTP1Settings(header_read_timeout=int(channel_timeout * 1000),
                                         max_buffer_size=MAX_HEADER_BYTES),
            log_level=LogLevels.warning)  # fmt: skip

    def listening(self) -> bool:
        """Whether granian's socket accepts connections yet. granian binds it before its worker starts, but the
        worker calls listen(): until then a client is refused."""
        fd = getattr(self.server, "_sfd", None)  # the listener granian made (a private name: probe if gone)
        if fd is not None:
            with socket.socket(fileno=os.dup(fd)) as listener:
                return bool(listener.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN))
        if self.unix_socket:
            family, address = socket.AF_UNIX, self.unix_socket
        else:
            family, address = socket.AF_INET6 if ":" in self.host else socket.AF_INET, (self.host, self.port)
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            return probe.connect_ex(address) == 0

    def where(self) -> str:
        """Where it listens, once listening: ``unix:PATH`` or ``http://HOST:PORT`` (the port a port 0 got)."""
        if self.unix_socket:
            return f"unix:{self.unix_socket}"
        port = self.port
        fd = getattr(self.server, "_sfd", None)  # the listener granian made (a private name: fall back if gone)
        if port == 0 and fd is not None:
            with socket.socket(fileno=os.dup(fd)) as listener:
                port = listener.getsockname()[1]
        return f"http://[{self.host}]:{port}" if ":" in self.host else f"http://{self.host}:{port}"


def _collect_granians_loop() -> None:
    """Collects the asyncio loop that granian's stopped worker leaves behind, without its known complaint.

    granian 2.7 does not close its worker thread's loop, and the loop's self-pipe is closed under it: its
    ``__del__`` then raises ValueError ("Invalid file descriptor: -1"), printed as "Exception ignored" with a
    traceback at whatever collection finds it. It is collected here, where that one error is expected; any
    other goes to the usual hook."""
    import gc

    usual = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        if not (isinstance(unraisable.exc_value, ValueError) and "Invalid file descriptor" in str(unraisable.exc_value)
                and "BaseEventLoop.__del__" in repr(unraisable.object)):  # fmt: skip
            usual(unraisable)

    sys.unraisablehook = hook
    try:
        gc.collect()
    finally:
        sys.unraisablehook = usual


def serve_granian(front: GranianFront, announce: Callable[[str], str] | None = None,
                  on_stuck: Callable[[], Any] = lambda: None) -> int:
    """Runs ``front`` in this (the main) thread until SIGTERM or SIGINT; returns the exit code. Once it listens
    (accepts connections) and the signals are handled, ``announce(front.where())`` is printed, if given.

    The signal makes /healthz answer 503; granian then stops accepting (new connections are refused), answers
    the requests in flight, closes idle connections and returns: 0, once every request left the app. A second
    signal is ignored. If requests are still in the app STOP_SECONDS after the signal (a call that never ends),
    it says so, calls ``on_stuck`` (the specs' write) and ends the process with exit code 1: granian's worker
    thread cannot be stopped from outside, and waiting for it would hang the stop."""
    app, server = front.app, front.server
    stopped = threading.Event()

    def watchdog() -> None:
        if stopped.wait(STOP_SECONDS):
            return
        try:
            left = app.metrics.in_progress()
            if left:
                logger.error("%d request(s) still in the app %g s after the signal: their answers are lost", left,
                             STOP_SECONDS)  # fmt: skip
            else:
                logger.error("granian did not stop %g s after the signal", STOP_SECONDS)
            on_stuck()
        finally:  # whatever on_stuck raised: the process ends (the main thread may wait on granian for good)
            logging.shutdown()
            os._exit(1)

    def stop(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        app.stopping = True
        logger.info("%s: stopping; answering the requests being served", signal.Signals(signum).name)
        threading.Thread(target=watchdog, name="serve-stop-watchdog", daemon=True).start()
        server.signal_handler_interrupt()

    def announce_when_listening() -> None:
        deadline = time.monotonic() + 120
        while not front.listening():
            if stopped.is_set() or time.monotonic() > deadline:
                return
            time.sleep(0.002)
        if announce:
            print(announce(front.where()), flush=True)

    def started() -> None:  # granian's startup hook: its socket is bound, its own handlers are set
        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        # granian's SIGHUP restarts its worker (a reload), which can swallow a SIGTERM that comes meanwhile:
        # SIGHUP ends the process, as under waitress.
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        # Its worker starts after this hook, and listens then: the announce waits for that, in a thread.
        threading.Thread(target=announce_when_listening, name="serve-announce", daemon=True).start()

    server.on_startup(started)
    try:
        server.serve(target_loader=lambda *args: app, wrap_loader=False)
    except RuntimeError as exc:  # granian's socket errors ("... (os error 98)"), with a backtrace after a line
        if "(os error" not in str(exc):
            raise
        raise ListenError(str(exc).splitlines()[0]) from None
    except SystemExit as exc:  # granian's own exit: its worker died
        logger.error("granian stopped: its worker exited (exit code %s)", exc.code)
        return 1
    finally:
        stopped.set()
        _collect_granians_loop()
    left = app.metrics.in_progress()
    if left:  # granian returned with requests still in the app (it should not)
        logger.error("%d request(s) still in the app after granian stopped: their answers are lost", left)
        return 1
    print("server stopped", flush=True)
    return 0


def save_specs(path: str, model: Model) -> bool:
    """Writes the signatures ``model`` compiled to ``path``, as the specs of ``--specs``; False if it cannot.
    Atomically (a temporary file, then a rename): a crash leaves the old file, concurrent writes one whole file."""
    try:
        ((written, left_out),) = ftjit.save_specs(path, model.fn).values()  # ftjit: the cached signatures
    except OSError as exc:  # a missing directory, a full disk: said, and the server goes on
        logger.error("cannot write the specs file %s: %s", path, exc)
        return False
    logger.info("wrote %d signature(s) to %s (left out: %s)", written, path, list(left_out) or "none")
    return True


def save_specs_every(path: str, model: Model, minutes: float, stop: threading.Event) -> None:
    """``save_specs`` every ``minutes`` until ``stop`` is set (in a daemon thread of ``main``)."""
    while not stop.wait(60 * minutes):
        save_specs(path, model)


#: --specs-every's range in minutes: at least 0.6 s between writes (each one fsyncs), at most a week.
SPECS_EVERY_MIN, SPECS_EVERY_MAX = 0.01, 10080.0


def bounded(kind: type, low: float, high: float) -> Callable[[str], Any]:
    """An argparse ``type``: the text as ``kind`` (int or float), finite and within [low, high], else an
    argparse error that says which and why (``nan``, ``inf`` and out-of-range values included)."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        if not math.isfinite(value) or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text} is not between {low:g} and {high:g}")
        return value

    parse.__name__ = kind.__name__  # argparse's "invalid int value" wording, should it ever show
    return parse


def path_arg(text: str) -> str:
    """An argparse ``type`` for a file's path: an empty one names no file (it was ignored, silently)."""
    if not text:
        raise argparse.ArgumentTypeError("the path is empty: give the file's path")
    return text


def main(argv: list[str] | None = None) -> int:
    """The command line: warm up, then listen and serve until SIGTERM or SIGINT."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", help="address to bind (default: 127.0.0.1, loopback only)")
    parser.add_argument("--port", type=bounded(int, 0, 65535),
                        help="port to bind, 0 to 65535; 0 picks a free one (default: 8000)")  # fmt: skip
    parser.add_argument("--unix-socket", metavar="PATH", help="listen on a unix socket at PATH instead of TCP")
    parser.add_argument("--jit", choices=("ftjit", "jax"), default="ftjit",
                        help="serve through ftjit.jit, or jax.jit to compare with (default: ftjit)")  # fmt: skip
    parser.add_argument("--front", choices=FRONTS,
                        help="the HTTP server: granian (HTTP in Rust; needs the GIL off) or waitress (pure Python); "
                             "default: granian where it can serve, else waitress")  # fmt: skip
    parser.add_argument("--threads", type=bounded(int, 1, 1024), default=THREADS,
                        help=f"threads that run the app at once, 1 to 1024 (default: {THREADS})")  # fmt: skip
    parser.add_argument("--batch", action="store_true",
                        help="merge concurrent requests of one example each into one call (ftjit.batched)")
    parser.add_argument("--batch-wait", type=bounded(float, 0, 1), default=0.001, metavar="SECONDS",
                        help="with --batch: how long a batch may wait for more examples while one runs, 0 to 1 s "
                             "(default: 0.001)")  # fmt: skip
    parser.add_argument("--max-batch", type=bounded(int, 1, 65536), default=DEFAULT_MAX_BATCH,
                        help="the largest batch, 1 to 65536 (default: 32)")  # fmt: skip
    parser.add_argument("--warmup-workers", type=bounded(int, 1, 256), default=4,
                        help="threads compiling before listening, 1 to 256 (default: 4)")  # fmt: skip
    parser.add_argument("--no-bucket-warmup", dest="buckets", action="store_false", help="compile on first use")
    parser.add_argument("--specs", metavar="FILE", type=path_arg,
                        help="also warm up the signatures in FILE; write it at the stop")  # fmt: skip
    parser.add_argument("--specs-every", type=bounded(float, SPECS_EVERY_MIN, SPECS_EVERY_MAX), metavar="MINUTES",
                        help=f"with --specs: also write it this often, {SPECS_EVERY_MIN} to {SPECS_EVERY_MAX} "
                             "minutes")  # fmt: skip
    parser.add_argument("--compile-cache", metavar="DIR", help="JAX's persistent compilation cache, kept in DIR")
    parser.add_argument("--connection-limit", type=bounded(int, 1, 100_000), default=CONNECTION_LIMIT,
                        help=f"open connections kept, idle ones included (default: {CONNECTION_LIMIT})")
    parser.add_argument("--channel-timeout", type=bounded(float, 1, 3600), default=CHANNEL_TIMEOUT,
                        help=f"seconds an idle connection is kept open (default: {CHANNEL_TIMEOUT:g})")
    args = parser.parse_args(argv)
    if args.unix_socket is not None and (args.host is not None or args.port is not None):
        parser.error("--unix-socket cannot be combined with --host or --port")
    if args.jit == "jax" and args.specs is not None:
        parser.error("--specs needs --jit ftjit: a specs file holds ftjit's signatures")
    if args.specs_every is not None and args.specs is None:
        parser.error("--specs-every needs --specs FILE: the file to write")
    front = args.front or default_front()
    if front == "granian" and (why := granian_unavailable()):
        parser.error(why)
    too_few_files = fit_open_files(args.connection_limit)
    if too_few_files:
        parser.error(too_few_files)
    host, port = args.host or "127.0.0.1", 8000 if args.port is None else args.port
    if args.compile_cache:  # every compile is kept in DIR and read back by the next start (even the small ones)
        jax.config.update("jax_compilation_cache_dir", args.compile_cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    if args.batch and args.jit == "jax":
        parser.error("--batch needs --jit ftjit: it is ftjit.batched")
    if args.batch:
        model: Model = BatchedModel(args.max_batch, batch_wait=args.batch_wait)
    else:
        model = (Model if args.jit == "ftjit" else JaxModel)(args.max_batch)
    saved = ftjit.load_specs(args.specs, missing_ok=True) if args.specs else None  # never raises
    report = model.warm(args.warmup_workers, args.buckets, saved)  # ftjit: compiled before the port opens
    # A saved spec that failed (a damaged or stale file) is a line of the report: the start goes on.
    print(report if len(report) else "warmup: nothing to compile before listening", flush=True)
    if not model.ready:
        return 1
    app = App(model)
    print(f"front: {front}", flush=True)
    stop = threading.Event()
    if args.specs and args.specs_every:
        threading.Thread(target=save_specs_every, args=(args.specs, model, args.specs_every, stop), daemon=True).start()
    try:
        if front == "granian":
            code = serve_granian(
                GranianFront(app, host, port, args.threads, args.unix_socket, args.connection_limit,
                             args.channel_timeout),
                announce=lambda where: f"serving on {where}",
                on_stuck=lambda: args.specs and save_specs(args.specs, model))  # fmt: skip
        else:
            server, listener = make_server(app, host, port, args.threads, args.unix_socket, args.connection_limit,
                                           args.channel_timeout)  # fmt: skip
            where = f"unix:{args.unix_socket}" if args.unix_socket else f"http://{host}:{listener.getsockname()[1]}"
            code = serve(server, listener, app, announce=f"serving on {where}")
    except ListenError as exc:
        print(f"serve.py: cannot listen on {args.unix_socket or f'{host}:{port}'}: {exc}", file=sys.stderr)
        return 1
    finally:
        stop.set()  # no periodic write after the last one
    return code if not args.specs or save_specs(args.specs, model) else 1


if __name__ == "__main__":
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in ("serve", "ftjit", "waitress"):  # ftjit logs one INFO line per compile
        logging.getLogger(name).setLevel(logging.INFO)
    # waitress warns "Task queue depth is N" whenever a request waits for a worker (under load: nearly always).
    logging.getLogger("waitress.queue").setLevel(logging.ERROR)
    sys.exit(main())
