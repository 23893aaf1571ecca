"""The serving example (examples/serve.py, load.py, demo.py): what ftjit does in a threaded server.

Through the WSGI app, in this process (no server; these run 8 at once under
pytest-run-parallel): concurrent first requests compile once, the recompile
guard answers a JSON error, /stats numbers are exact, /metrics parses and
carries ftjit's series, the app's own errors are JSON, and a model warms up
exactly the signatures of a specs file (a damaged one is a report line, and
/healthz still answers 200). Over the wire, examples/serve.py under waitress
in a child process (thread_unsafe: processes and ports): warm-up before the
port opens, 200 clients at once all answered with the GIL still off, the
load generator's count and time limits, SIGTERM and SIGINT answering the
request in flight, the demo, and --specs: the file written periodically and
at SIGTERM, a restart from it compiling nothing during traffic, a corrupted
one still letting the server start and answer. --jit jax (JaxModel): the same
answers, no ftjit numbers on /stats and /metrics. --unix-socket: a stale
socket file is replaced, a live one or another file refused; both --jit
servers on unix sockets answer examples/load.py --unix-socket, and agree;
the option clashes are argparse errors; bench/tpu_compare.py, which compares
them, prints its table. HTTP mechanics are waitress's and are not tested
here. Nothing asserts on speed; timeouts are hang guards.

The over-the-wire tests on TCP skip where TCP on 127.0.0.1 is refused (the TPU machine); those on unix sockets
run everywhere. Their processes run JAX on the CPU (helpers.child_env).
"""

import dataclasses
import http.client
import io
import json
import os
import platform
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import sysconfig
import tempfile
import threading
import uuid
from pathlib import Path

import numpy as np
import pytest

import ftjit
from helpers import SERVE_TOOLS, child_env, require_module, require_tcp, run_threads, wait_for

# The serve extra, which examples/serve.py imports (a missing one fails here, or skips the file on an accelerator
# machine that cannot install it: see require_module).
for _name in SERVE_TOOLS:
    require_module(_name, "examples/serve.py and these tests of it need it", module_level=True)

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # ``examples`` is a package at the repository root, not installed
    sys.path.insert(0, str(REPO))

from examples import load, serve  # noqa: E402
from examples.demo import ServerProcess  # noqa: E402

def _server(*args, **options):
    """examples/serve.py in a child process (demo's ServerProcess) on the CPU backend, as every process a test
    starts (helpers.child_env): on a TPU the test process holds the chip, and a second cannot open it."""
    return ServerProcess(*args, env=child_env(), **options)


starts_servers = pytest.mark.thread_unsafe(reason="starts server processes on ports and counts their compiles")
#: Each of serve.py's fronts, granian skipped where it cannot serve (a GIL build; not installed): its reason.
FRONTS = [pytest.param(front, marks=pytest.mark.skipif(front == "granian" and serve.granian_unavailable() is not None,
                                                       reason=str(serve.granian_unavailable())))
          for front in serve.FRONTS]  # fmt: skip
FREE_THREADED = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
JSON = "application/json"


def _rows(n, seed=0):
    return np.random.default_rng(seed).standard_normal((n, serve.N_INPUTS)).astype(np.float32)


def _body(x):
    return json.dumps({"inputs": x.tolist()}).encode()


def _call(app, method, path, body=None, content_type="application/json"):
    """One request through the WSGI app: (status, headers, body)."""
    environ = {"REQUEST_METHOD": method, "PATH_INFO": path, "wsgi.input": io.BytesIO(body or b"")}
    if body is not None:
        environ.update(CONTENT_LENGTH=str(len(body)), **({"CONTENT_TYPE": content_type} if content_type else {}))
    started = []
    chunks = app(environ, lambda status, headers: started.append((status, headers)))
    (status, headers), = started
    return int(status.split()[0]), dict(headers), b"".join(chunks)


def _named_mlp(name):
    """A fresh function computing ``serve.mlp``, named ``name`` (in ftjit.stats() and /metrics)."""

    def fresh(params, x):
        return serve.mlp(params, x)

    fresh.__name__ = fresh.__qualname__ = name
    return fresh


def _request(port, method, path, body=None):
    """One request on a fresh connection: (status, decoded JSON body)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request(method, path, body, {"Content-Type": "application/json"} if body is not None else {})
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def test_batch_buckets():
    assert serve.batch_buckets(32) == (1, 2, 4, 8, 16, 32)
    assert serve.batch_buckets(1) == (1,)
    assert serve.batch_buckets(12) == (1, 2, 4, 8, 12)


def test_load_refuses_non_loopback_hosts():
    with pytest.raises(ValueError, match="non-loopback"):
        load.run_load(80, host="192.0.2.1", requests=1)
    with pytest.raises(ValueError, match="non-loopback"):
        load.fetch_json("192.0.2.1", 80, "/stats")


class _ScriptedServer:
    """A loopback HTTP/1.1 server (keep-alive) for load.py's checks: /predict answers the float32 MLP, plus
    ``offset`` for the requests numbered in ``wrong`` (counted from 0 in arrival order); /healthz answers ``health``."""

    def __init__(self, wrong=(), offset=1.0, health=(200, b'{"ok": true}')):
        import http.server

        weights, lock, seen = serve.make_weights(), threading.Lock(), []
        self.seen = seen

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self, status, body):
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                self._answer(*health)

            def do_POST(self):
                x = np.asarray(json.loads(self.rfile.read(int(self.headers["Content-Length"])))["inputs"], np.float32)
                with lock:
                    number = len(seen)
                    seen.append(number)
                out = serve.forward(weights, x) + (offset if number in wrong else 0.0)
                self._answer(200, json.dumps({"outputs": out.tolist()}).encode())

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=30)


@pytest.mark.thread_unsafe(reason="opens a server on a port")
def test_load_checks_every_answer_also_a_wrong_one_after_right_answers_to_the_same_request():
    require_tcp("load.py's checks")
    # 2 threads, 40 requests, 4 distinct: each thread sends its 2 requests 10 times each. Answers 5 and 30 are
    # wrong, after right answers to the same request: an answer verified before is no pass for different bytes.
    # Answers 34 to 39 are wrong alike, each counted: a wrong answer is never kept as verified.
    with _ScriptedServer(wrong={5, 30, *range(34, 40)}) as server:
        report = load.run_load(server.port, threads=2, requests=40, seconds=None, seed=3, progress=False, distinct=4)
    assert (report.requests, report.errors, report.wrong, report.route) == (40, 0, 8, "predict")
    assert report.first_error.startswith("wrong answer: differs from the reference by up to 1")
    with _ScriptedServer(wrong=range(10**6), offset=1e-3) as server:  # every answer off by 1e-3: all wrong
        assert load.run_load(server.port, threads=3, requests=30, seconds=None, progress=False).wrong == 30


def test_load_threads_claim_the_request_count_exactly_between_them():
    # 8 threads at once claim until the count is spent: the claims add up to it exactly, none over CLAIM, and a
    # count-free run grants without limit.
    budget = load._Budget(1000)

    def claims(_):
        got = []
        while granted := budget.claim():
            got.append(granted)
        return got

    got = [n for per_thread in run_threads(8, claims) for n in per_thread]
    assert sum(got) == 1000 and max(got) == load.CLAIM and budget.claim() == 0
    assert load._Budget(None).claim() is None


@pytest.mark.thread_unsafe(reason="opens a server on a port")
def test_load_on_the_trivial_route_checks_each_answer():
    require_tcp("load.py's checks")
    with _ScriptedServer() as server:
        report = load.run_load(server.port, threads=3, requests=31, seconds=None, progress=False, route="healthz")
        assert (report.requests, report.errors, report.wrong, report.route, server.seen) == (31, 0, 0, "healthz", [])
    with _ScriptedServer(health=(503, b'{"ok": false}')) as server:
        report = load.run_load(server.port, threads=2, requests=9, seconds=None, progress=False, route="healthz")
    assert (report.requests, report.errors, report.first_error) == (9, 9, "HTTP 503 from /healthz: b'{\"ok\": false}'")
    with pytest.raises(ValueError, match="route must be one of predict, healthz; got 'metrics'"):
        load.run_load(server.port, requests=1, route="metrics")


@pytest.mark.thread_unsafe(reason="opens a server on a port")
@pytest.mark.timeout(300)
def test_load_split_across_processes_sends_and_checks_exactly_as_one_process():
    # load.py's threads in 3 spawned processes: the count is split exactly, every answer is still checked (all
    # 30 off by 1e-3: 30 wrong), a trivial route's errors are counted, and the report says how it was split.
    require_tcp("load.py's checks")
    with _ScriptedServer(wrong=range(10**6), offset=1e-3) as server:
        report = load.run_load(server.port, threads=3, requests=30, seconds=None, progress=False, processes=3)
    assert (report.requests, report.errors, report.wrong, report.stopped_by, report.processes) == (
        30, 0, 30, "request count", 3)  # fmt: skip
    assert report.first_error.startswith("wrong answer: differs from the reference by up to 0.001")
    assert ("load threads", "3", "client threads, one keep-alive connection each, in 3 processes") in (
        load.report_rows(dataclasses.replace(report, stats=None)))  # fmt: skip
    with _ScriptedServer() as server:
        report = load.run_load(server.port, threads=4, requests=101, seconds=None, progress=False, processes=2)
        assert (report.requests, report.errors, report.wrong, len(server.seen)) == (101, 0, 0, 101)
        timed = load.run_load(server.port, threads=2, requests=None, seconds=0.5, progress=False, processes=2)
        assert (timed.stopped_by, timed.errors, timed.wrong) == ("time limit", 0, 0) and timed.requests > 0
        assert 0.5 <= timed.seconds < 30  # from the common start, not from the processes' start
    with _ScriptedServer(health=(503, b'{"ok": false}')) as server:
        report = load.run_load(server.port, threads=2, requests=9, seconds=None, progress=False, route="healthz",
                               processes=2)  # fmt: skip
    assert (report.requests, report.errors, report.first_error) == (9, 9, "HTTP 503 from /healthz: b'{\"ok\": false}'")
    with pytest.raises(ValueError, match=r"processes must be between 1 and the threads \(2\); got 3"):
        load.run_load(server.port, threads=2, requests=1, processes=3)


def test_concurrent_first_requests_compile_once():
    # No warm-up: 16 request threads released together on one new bucket. Its compile is held until the
    # other 15 wait on it, so exactly one compiles and 15 wait (none compiles again, none is a hit).
    n = 16
    held = []

    def slow_mlp(params, x):  # runs while JAX traces it, inside the one compile
        held.append(wait_for(lambda: model.fn.cache_info().waits >= n - 1, timeout=60))
        return serve.mlp(params, x)

    model = serve.Model(max_batch=8, fun=slow_mlp)
    app = serve.App(model)
    inputs = [_rows(3, seed=i) for i in range(n)]  # 3 rows: bucket 4
    answers = run_threads(n, lambda i: _call(app, "POST", "/predict", _body(inputs[i])), timeout=120)
    assert held == [True]
    for x, (status, _, body) in zip(inputs, answers):
        assert status == 200, body
        np.testing.assert_allclose(json.loads(body)["outputs"], load.reference_forward(model.weights, x),
                                   rtol=load.RTOL, atol=load.ATOL)  # fmt: skip
    info = model.fn.cache_info()
    assert (info.misses, info.compiles, info.hits, info.waits, info.failures, info.size) == (1, 1, 0, n - 1, 0, 1)


def test_the_recompile_guard_answers_a_json_error():
    # max_signatures=2 and no warm-up: batches of 1 and 2 rows compile; a third bucket is refused, not compiled.
    model = serve.Model(max_batch=8, max_signatures=2)
    app = serve.App(model)
    assert [_call(app, "POST", "/predict", _body(_rows(n)))[0] for n in (1, 2)] == [200, 200]
    status, headers, body = _call(app, "POST", "/predict", _body(_rows(3)))
    with pytest.raises(ftjit.RecompileLimitError) as refused:  # what ftjit says of that signature
        model.fn(model.params, np.zeros((4, serve.N_INPUTS), np.float32))
    assert str(refused.value).startswith("mlp() would compile a signature past max_signatures=2 ")
    assert (status, headers["Content-Type"], json.loads(body)) == (500, JSON, {"error": str(refused.value)})
    assert _call(app, "POST", "/predict", _body(_rows(2)))[0] == 200  # the compiled buckets still answer
    info = model.fn.cache_info()
    assert (info.compiles, info.size, info.hits) == (2, 2, 1)


def test_stats_numbers_are_exact():
    model = serve.Model(max_batch=8)
    app = serve.App(model)
    assert _call(app, "GET", "/healthz")[::2] == (503, b'{"ok": false}')  # not warmed up yet
    assert model.warm(workers=2).ok
    assert _call(app, "GET", "/healthz")[::2] == (200, b'{"ok": true}')
    for rows in range(1, 9):
        x = _rows(rows, seed=rows)
        status, _, body = _call(app, "POST", "/predict", _body(x))
        assert status == 200, body
        np.testing.assert_allclose(json.loads(body)["outputs"], load.reference_forward(model.weights, x),
                                   rtol=load.RTOL, atol=load.ATOL)  # fmt: skip
    status, _, body = _call(app, "GET", "/stats")
    stats = json.loads(body)
    assert status == 200
    assert stats["buckets"] == [1, 2, 4, 8]
    assert stats["function"]["name"] == "mlp"
    info = stats["function"]["cache_info"]
    assert info == model.fn.cache_info()._asdict()
    assert {k: info[k] for k in ("hits", "misses", "compiles", "waits", "failures", "size")} == {
        "hits": 8, "misses": 4, "compiles": 4, "waits": 0, "failures": 0, "size": 4}  # fmt: skip
    hits = {int(re.search(r"float32\[(\d+),16\]\)$", s["signature"]).group(1)): s["hits"]
            for s in stats["function"]["signatures"]}  # fmt: skip
    # A signature's hits are sampled (every 64th call of a thread counts 64; docs/design.md, "One dispatch per
    # hit"): of these 8 calls in one thread, each bucket's first reached the core and was counted there, once.
    assert hits == {1: 1, 2: 1, 4: 1, 8: 1}  # rows 1 | 2 | 3-4 | 5-8, each padded to its bucket
    assert stats["warmup"]["ok"] is True and stats["warmup"]["workers"] == 2
    assert [r["compiled"] for r in stats["warmup"]["results"]] == [True] * 4
    assert stats["gil_enabled"] is (not FREE_THREADED)
    mine = [f for f in stats["ftjit"]["functions"] if f["name"] == "mlp"]
    assert any(f["hits"] == 8 and f["compiles"] == 4 for f in mine)  # other tests' "mlp"s may be alive too


def test_metrics_parse_and_carry_ftjit_series():
    name = f"mlp_{uuid.uuid4().hex}"  # its own series, whatever else lives in this process
    model = serve.Model(max_batch=4, fun=_named_mlp(name))
    app = serve.App(model)
    assert model.warm(workers=1).ok
    for rows in (1, 2, 3, 4, 1):
        assert _call(app, "POST", "/predict", _body(_rows(rows)))[0] == 200
    assert _call(app, "POST", "/predict", b"[1]")[0] == 400
    assert [_call(app, "GET", "/healthz")[0] for _ in range(2)] == [200, 200]
    assert _call(app, "PUT", "/healthz")[0] == 405
    assert _call(app, "BREW", "/nowhere")[0] == 404

    status, headers, body = _call(app, "GET", "/metrics")
    assert (status, headers["Content-Type"]) == (200, "text/plain; version=1.0.0; charset=utf-8")
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    info = model.fn.cache_info()
    ftjit_expected = {
        "ftjit_cache_hits": 5, "ftjit_cache_misses": 3, "ftjit_compiles": 3, "ftjit_compile_waits": 0,
        "ftjit_compile_failures": 0, "ftjit_cache_evictions": 0, "ftjit_compile_seconds": info.compile_seconds,
        "ftjit_compile_wait_seconds": 0.0,
    }  # fmt: skip
    for family, value in ftjit_expected.items():
        assert families[family].type == "counter"
        assert [s.value for s in families[family].samples if s.labels == {"function": name}] == [value], family
    assert [s.value for s in families["ftjit_cache_entries"].samples if s.labels == {"function": name}] == [3]
    requests = {tuple(sorted(s.labels.items())): s.value
                for s in families["http_requests"].samples if s.name == "http_requests_total"}  # fmt: skip
    assert requests == {  # the scrape is counted once answered: not in its own answer
        (("code", "200"), ("handler", "/predict"), ("method", "POST")): 5,
        (("code", "400"), ("handler", "/predict"), ("method", "POST")): 1,
        (("code", "200"), ("handler", "/healthz"), ("method", "GET")): 2,
        (("code", "405"), ("handler", "/healthz"), ("method", "PUT")): 1,
        (("code", "404"), ("handler", "other"), ("method", "OTHER")): 1,
    }
    counts = {s.labels["handler"]: s.value for s in families["http_request_duration_seconds"].samples
              if s.name == "http_request_duration_seconds_count"}  # fmt: skip
    assert counts == {"/predict": 6, "/healthz": 3, "other": 1}
    assert families["http_requests_in_progress"].samples[0].value == 1  # the scrape itself
    _, _, body = _call(app, "GET", "/metrics")
    assert 'http_requests_total{code="200",handler="/metrics",method="GET"} 1.0\n' in body.decode()


def test_request_metrics_add_up_every_threads_requests_exactly():
    # 16 threads at once, 50 requests each, on their own tallies: a scrape's totals are exact (also once the ended
    # threads' tallies were added up into one), the histogram's buckets are cumulative and end at the count, and
    # a request that raised leaves nothing in progress.
    app = serve.App(serve.Model(max_batch=4))
    run_threads(16, lambda i: [_call(app, "GET", "/healthz" if n % 2 else "/nowhere") for n in range(50)], timeout=120)
    app.route = lambda *args: 1 / 0  # an unexpected error: waitress answers it 500, and the app counts a 500
    with pytest.raises(ZeroDivisionError):
        _call(app, "GET", "/healthz")
    del app.route
    # This thread's first count added the 16 ended threads' tallies into one (granian ends and starts threads).
    assert app.metrics.tallies() == 2
    _, _, body = _call(app, "GET", "/metrics")
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    requests = {(s.labels["handler"], s.labels["code"]): s.value
                for s in families["http_requests"].samples if s.name == "http_requests_total"}  # fmt: skip
    assert requests == {("/healthz", "503"): 400, ("other", "404"): 400, ("/healthz", "500"): 1}  # 503: not warmed
    samples = {(s.name, s.labels.get("le")): s.value for s in families["http_request_duration_seconds"].samples
               if s.labels["handler"] == "/healthz"}  # fmt: skip
    bounds = ["0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1.0", "2.5", "5.0", "10.0",
              "+Inf"]  # as prometheus_client's Histogram writes them
    cumulative = [samples[("http_request_duration_seconds_bucket", b)] for b in bounds]
    assert cumulative == sorted(cumulative) and cumulative[-1] == samples[("http_request_duration_seconds_count", None)]
    assert cumulative[-1] == 401 and samples[("http_request_duration_seconds_sum", None)] > 0
    assert families["http_requests_in_progress"].samples[0].value == 1  # the scrape itself
    assert app.metrics.in_progress() == 0


def test_the_apps_own_errors_are_json():
    model = serve.Model(max_batch=4)
    app = serve.App(model)
    row = [0.5] * serve.N_INPUTS
    not_json = {"error": 'the body must be JSON {"inputs": [[16 numbers], ...]}'}
    not_rows = {"error": '"inputs" must be a non-empty list of rows of 16 numbers'}
    not_finite = {"error": "inputs must be finite float32 numbers"}
    cases = [  # (method, path, body, Content-Type, status, JSON answer, Allow)
        ("POST", "/predict", b"not json", "application/json", 400, not_json, None),
        ("POST", "/predict", b"\xff\xfe", "application/json", 400, not_json, None),
        ("POST", "/predict", b"[1, 2]", "application/json", 400, not_json, None),
        ("POST", "/predict", b'{"x": 1}', "application/json", 400, not_json, None),
        ("POST", "/predict", b"[" * 1500 + b"]" * 1500, "application/json", 400, not_json, None),  # too deep
        # More than a full batch can need: 413 from the Content-Length, unread (granian leaves the bound to the app)
        ("POST", "/predict", b"[" * 100000 + b"]" * 100000, "application/json", 413,
         {"error": f"the body's 200000 bytes exceed {app.max_body_bytes}"}, None),
        ("POST", "/predict", b'{"inputs": []}', "application/json", 400, not_rows, None),
        ("POST", "/predict", json.dumps({"inputs": [row[:3]]}).encode(), "application/json", 400, not_rows, None),
        ("POST", "/predict", json.dumps({"inputs": [["1"] * 16]}).encode(), "application/json", 400, not_rows, None),
        ("POST", "/predict", json.dumps({"inputs": [[True] * 16]}).encode(), "application/json", 400, not_rows, None),
        ("POST", "/predict", b'{"inputs": [[' + b", ".join([b"NaN"] * 16) + b"]]}", JSON, 400, not_finite, None),
        ("POST", "/predict", json.dumps({"inputs": [[1e39] * 16]}).encode(), JSON, 400, not_finite, None),
        ("POST", "/predict", json.dumps({"inputs": [[10**309] + row[1:]]}).encode(), JSON, 400, not_finite, None),
        ("POST", "/predict", _body(_rows(5)), JSON, 413, {"error": "batch of 5 rows exceeds max_batch=4"}, None),
        ("POST", "/predict", _body(_rows(1)), "text/plain", 415,
         {"error": "Content-Type must be application/json, got text/plain"}, None),
        ("POST", "/predict", _body(_rows(1)), None, 415,
         {"error": "Content-Type must be application/json, got none"}, None),
        ("POST", "/predict", _body(np.full((1, 16), 3e38)), JSON, 422,  # finite inputs, overflowing hidden layer
         {"error": "the model's outputs are not finite for these inputs"}, None),
        ("PUT", "/predict", None, None, 405,
         {"error": "method PUT is not allowed on /predict (allowed: POST)"}, "POST"),
        ("GET", "/predict", None, None, 405,
         {"error": "method GET is not allowed on /predict (allowed: POST)"}, "POST"),
        ("POST", "/stats", None, None, 405,
         {"error": "method POST is not allowed on /stats (allowed: GET, HEAD)"}, "GET, HEAD"),
        ("GET", "/nowhere", None, None, 404, {"error": "no such path: /nowhere"}, None),
    ]  # fmt: skip
    for method, path, body, content_type, status, answer, allow in cases:
        got, headers, data = _call(app, method, path, body, content_type)
        what = (method, path, body[:40] if body else None)
        assert (got, json.loads(data), headers.get("Allow")) == (status, answer, allow), what
        assert (headers["Content-Type"], headers["Content-Length"]) == ("application/json", str(len(data)))
    started = []
    answer = app({"REQUEST_METHOD": "POST", "PATH_INFO": "/predict", "wsgi.input": io.BytesIO(b"{}"),
                  "CONTENT_TYPE": JSON, "CONTENT_LENGTH": "ten"}, lambda *args: started.append(args))  # fmt: skip
    assert (started[0][0], json.loads(b"".join(answer))) == ("400 Bad Request",
                                                             {"error": "Content-Length must be a number of bytes"})
    # application/json with parameters is JSON; HEAD answers the status and headers only.
    assert _call(app, "POST", "/predict", _body(_rows(1)), "Application/JSON; charset=utf-8")[0] == 200
    status, headers, data = _call(app, "HEAD", "/predict")
    assert (status, headers["Allow"], data) == (405, "POST", b"")
    assert headers["Content-Length"] == str(len(b'{"error": "method HEAD is not allowed on /predict (allowed: POST)"}'))
    assert model.fn.cache_info().compiles == 1  # only the 1-row bucket: no error compiled anything


@pytest.mark.thread_unsafe(reason="calls serve.main(), which a monkeypatched make_server ends")
@pytest.mark.parametrize("front", FRONTS)
def test_warmup_happens_before_the_port_opens(monkeypatch, capsys, front):
    # main() opens the port in make_server (socket.create_server) or GranianFront (its bind check, then granian's
    # own): by then every bucket must be compiled.
    seen = []

    class Listening(Exception):
        pass

    def make_server(app, host, port, threads, unix_socket, connection_limit, channel_timeout):
        seen.append((host, port, threads, unix_socket, connection_limit, channel_timeout, app.model.fn.cache_info(),
                     app.model.warmup_report))
        raise Listening

    monkeypatch.setattr(serve, "make_server", make_server)
    monkeypatch.setattr(serve, "GranianFront", make_server)  # the same arguments
    with pytest.raises(Listening):
        serve.main(["--port", "0", "--max-batch", "4", "--threads", "3", "--warmup-workers", "2",
                    "--connection-limit", "50", "--channel-timeout", "7.5", "--front", front])
    (host, port, threads, unix_socket, connection_limit, channel_timeout, info, report), = seen
    assert (host, port, threads, unix_socket, connection_limit, channel_timeout) == ("127.0.0.1", 0, 3, None, 50, 7.5)
    assert (info.compiles, info.misses, info.hits, info.failures) == (3, 3, 0, 0)
    assert report.ok and [r.compiled for r in report] == [True] * 3 and report.workers == 2
    out = capsys.readouterr().out
    assert "warmup: 3/3 ok" in out and out.rstrip().endswith(f"front: {front}")


def test_the_default_front_is_granian_where_it_can_serve_else_waitress(monkeypatch, capsys):
    assert serve.default_front() == ("granian" if serve.granian_unavailable() is None else "waitress")
    monkeypatch.setattr(serve, "gil_enabled", lambda: True)  # a GIL build: granian's workers would be processes
    assert serve.default_front() == "waitress"
    with pytest.raises(SystemExit) as exited:
        serve.main(["--front", "granian"])
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(
        "error: --front granian needs a free-threaded Python with the GIL off (there granian's workers are threads "
        "of this process); this one has the GIL on: use --front waitress")


@starts_servers
@pytest.mark.timeout(300)
def test_the_server_under_200_clients_at_once_then_sigterm(capsys):
    require_tcp("examples/serve.py's server")
    server = _server("--max-batch", "8", "--warmup-workers", "2", "--threads", "4")
    try:
        output = server.output
        assert output.index("warmup: 4/4 ok") < output.index("serving on http://127.0.0.1:")
        # 200 clients connect and send at once (a barrier): all answered, all right, all cache hits.
        inputs = [_rows(i % 8 + 1, seed=i) for i in range(200)]
        answers = run_threads(200, lambda i: _request(server.port, "POST", "/predict", _body(inputs[i])), timeout=240)
        weights = serve.make_weights()
        for x, (status, body) in zip(inputs, answers):
            assert status == 200, body
            expected = load.reference_forward(weights, x)
            np.testing.assert_allclose(body["outputs"], expected, rtol=load.RTOL, atol=load.ATOL)
        status, stats = _request(server.port, "GET", "/stats")
        info = stats["function"]["cache_info"]
        assert (status, info["hits"], info["misses"], info["compiles"], info["failures"]) == (200, 200, 4, 4, 0)
        assert stats["gil_enabled"] is (not FREE_THREADED)  # waitress and prometheus_client are pure Python
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        connection.request("GET", "/metrics")
        families = {f.name: f for f in text_string_to_metric_families(connection.getresponse().read().decode())}
        connection.close()
        assert [s.value for s in families["ftjit_cache_hits"].samples if s.labels == {"function": "mlp"}] == [200]
        requests = {(s.labels["handler"], s.labels["code"]): s.value
                    for s in families["http_requests"].samples if s.name == "http_requests_total"}  # fmt: skip
        assert requests == {("/predict", "200"): 200, ("/stats", "200"): 1}
        # The load generator, stopped by its count: every answer checked, no compile.
        report = load.run_load(server.port, threads=4, requests=100, seconds=None, seed=1, max_batch=8, progress=False)
        assert (report.requests, report.errors, report.wrong, report.stopped_by) == (100, 0, 0, "request count")
        assert report.compiles == 4 and report.stats["function"]["cache_info"]["hits"] == 300
        # Stopped by its time limit instead; and a run that sent nothing is a failure (exit code 1), not a pass.
        timed = load.run_load(server.port, threads=2, requests=10**9, seconds=1.0, seed=2, max_batch=8, progress=False)
        assert (timed.stopped_by, timed.errors, timed.wrong, timed.compiles) == ("time limit", 0, 0, 4)
        assert load.main(["--port", str(server.port), "--threads", "2", "--seconds", "0.000001"]) == 1
        assert re.search(r"^requests +0  sent, answered or not$", capsys.readouterr().out, re.M)
    finally:
        code = server.stop(signal.SIGTERM)
    assert code == 0, server.output
    assert "INFO serve: SIGTERM: stopping; answering the requests being served" in server.output
    assert server.output.rstrip().endswith("server stopped")
    assert "Traceback" not in server.output


# Runs in a child process: serve.serve() must own the main thread, where signals arrive. A request is
# held inside the model when the signal comes; it is released once the handler has run (the port is
# closed by then) and a second signal was sent; its answer must still arrive, and serve() must return 0.
IN_FLIGHT_CHILD = r"""
import http.client, json, os, socket, sys, threading, time
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/tests"]
from examples import serve
from helpers import wait_for

serve.STOP_SECONDS = 120  # granian's bound on the stop: the request is held here until the port is refused
model = serve.Model(max_batch=2)
assert model.warm(workers=1).ok
app = serve.App(model)
entered, release, listening, seen = threading.Event(), threading.Event(), threading.Event(), {}
if sys.argv[3] == "waitress":
    server, listener = serve.make_server(app, threads=2)
    port = listener.getsockname()[1]
    listening.set()
    run = lambda: serve.serve(server, listener, app)
else:
    front = serve.GranianFront(app, threads=2)

    def announce(where):
        global port
        port = int(where.rsplit(":", 1)[1])
        listening.set()
        return "serving on " + where

    run = lambda: serve.serve_granian(front, announce)
predict = model.predict

def held_predict(x):
    entered.set()
    assert release.wait(60)
    return predict(x)

model.predict = held_predict

def client():
    assert listening.wait(60)
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    connection.request("POST", "/predict", json.dumps({"inputs": [[0.5] * 16]}), {"Content-Type": "application/json"})
    response = connection.getresponse()
    seen["answer"] = [response.status, json.loads(response.read())]

def conductor():
    assert entered.wait(60)
    os.kill(os.getpid(), int(sys.argv[2]))
    seen["handler ran"] = wait_for(lambda: app.stopping, 60)
    os.kill(os.getpid(), int(sys.argv[2]))  # a second signal, while the request is still held: ignored

    def refused():  # the serving loop closes the listener once it sees the stop (under load, not at once)
        try:
            socket.create_connection(("127.0.0.1", port), timeout=10).close()
            return False
        except ConnectionRefusedError:
            return True

    seen["port"] = "refused" if wait_for(refused, 30) else "open"
    release.set()

threads = [threading.Thread(target=client), threading.Thread(target=conductor)]
for thread in threads:
    thread.start()
seen["serve() returned"] = run()
for thread in threads:
    thread.join(60)
print(json.dumps(seen))
"""


@starts_servers
@pytest.mark.timeout(180)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("front", FRONTS)
def test_a_signal_stops_the_server_and_the_request_in_flight_is_answered(signum, front):
    require_tcp("serve.py's listener")
    child = subprocess.run([sys.executable, "-c", IN_FLIGHT_CHILD, str(REPO), str(int(signum)), front],
                           capture_output=True, text=True, timeout=150, env=child_env())  # fmt: skip
    assert child.returncode == 0, child.stdout + child.stderr
    *_, last = child.stdout.strip().splitlines()
    seen = json.loads(last)
    (status, answer) = seen.pop("answer")
    assert status == 200, child.stdout
    expected = load.reference_forward(serve.make_weights(), np.full((1, serve.N_INPUTS), 0.5, np.float32))
    np.testing.assert_allclose(answer["outputs"], expected, rtol=load.RTOL, atol=load.ATOL)
    assert seen == {"handler ran": True, "port": "refused", "serve() returned": 0}
    assert "server stopped" in child.stdout
    assert "Traceback" not in child.stderr, child.stderr


@starts_servers
@pytest.mark.timeout(240)
def test_demo_script_passes_and_prints_the_report():
    require_tcp("examples/demo.py (a server and its load generator)")
    demo = str(REPO / "examples" / "demo.py")
    command = [sys.executable, demo, "--threads", "2", "--requests", "50", "--max-batch", "8"]
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=220, env=child_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # First what it ran on: the interpreter's path, its version, the GIL's state.
    interpreter, version, gil, blank, header, rule, *table, last_rule, verdict = proc.stdout.strip().splitlines()
    assert interpreter.startswith(f"interpreter  {sys.executable}")
    py = f"{platform.python_implementation()} {platform.python_version()}"
    assert version.startswith(f"version      {py}{' (free-threaded build)' if FREE_THREADED else ''}, jax ")
    assert version.endswith(f", ftjit {ftjit.__version__}")
    assert gil == ("GIL          off (a free-threaded build: threads run Python code in parallel)" if FREE_THREADED
                   else "GIL          on (not a free-threaded build; FTJIT_PYTHON=ft bash dev.sh demo runs on one)")  # fmt: skip
    # Then one table: a header row, each value with its unit, each measure explained.
    assert blank == "" and re.split(r"\s{2,}", header) == ["measure", "value", "meaning"]
    assert re.fullmatch(r"-+  -+  -+", rule) and last_rule == rule
    rows = {name: (value, meaning) for name, value, meaning in (re.split(r"\s{2,}", line.strip()) for line in table)}
    assert list(rows) == [
        "requests", "route", "load threads", "stopped by", "load time", "throughput", "latency p50", "latency p99",
        "latency max", "errors", "wrong answers", "buckets", "compiles", "hits", "waits", "compile time",
        "server warm-up", "server GIL", "HTTP front", "fresh warm-up, 1 worker", "fresh warm-up, 4 workers",
        "warm-up speed-up",
    ]  # fmt: skip
    assert rows["HTTP front"][0] == serve.default_front()
    values = {name: value for name, (value, _) in rows.items()}
    assert (values["requests"], values["route"], values["load threads"], values["stopped by"]) == (
        "50", "/predict", "2", "request count")
    assert (values["errors"], values["wrong answers"]) == ("0", "0")
    assert (values["buckets"], values["compiles"], values["hits"], values["waits"]) == ("4", "4", "50", "0")
    assert values["server GIL"] == ("disabled" if FREE_THREADED else "enabled")
    units = {name: value.split(" ", 1)[1] for name, value in values.items() if re.fullmatch(r"[\d.]+ \S+", value)}
    assert units == {
        "load time": "s", "throughput": "req/s", "latency p50": "ms", "latency p99": "ms", "latency max": "ms",
        "compile time": "s", "server warm-up": "s", "fresh warm-up, 1 worker": "s", "fresh warm-up, 4 workers": "s",
    }  # fmt: skip
    assert re.fullmatch(r"\d+\.\d\dx", values["warm-up speed-up"])
    loop, parallel = float(values["fresh warm-up, 1 worker"][:-2]), float(values["fresh warm-up, 4 workers"][:-2])
    # The ratio of the two rounded times, up to their rounding (0.0005 s each).
    assert float(values["warm-up speed-up"][:-1]) == pytest.approx(loop / parallel, rel=0.02, abs=0.01)
    # The derived numbers say what they are.
    assert rows["throughput"][1] == "requests / load time"
    assert rows["compile time"][1] == "a sum over 4 parallel warm-up workers, not wall clock"
    assert rows["server warm-up"][1] == "wall clock of its warm-up (4 workers), before listening"
    assert rows["buckets"][1] == "batch sizes the server pads to: 1, 2, 4, 8"
    assert rows["warm-up speed-up"][1] == "1-worker time / 4-worker time (above 1: parallel was faster)"
    assert verdict == ("PASS: 50 requests answered correctly by 2 threads; 4 buckets compiled once each, "
                       "all during warm-up; the server stopped cleanly")  # fmt: skip


# --- --specs FILE (issue 28): a restart warms up the signatures the last run compiled -------------------------

#: The key of serve.py's MLP in a specs file that serve.py wrote, run as a script.
SCRIPT_KEY = "__main__:mlp"
GARBAGE = b"\x80\x05 this is not a specs file"


def _predict(port, n, seed=0):
    """POST /predict with ``n`` rows over the wire; checks the answer against the numpy reference."""
    x = _rows(n, seed)
    status, body = _request(port, "POST", "/predict", _body(x))
    assert status == 200, body
    expected = load.reference_forward(serve.make_weights(), x)
    np.testing.assert_allclose(body["outputs"], expected, rtol=load.RTOL, atol=load.ATOL)


def _saved_signatures(path):
    saved = ftjit.load_specs(path)
    assert saved.error is None, saved.error
    assert list(saved.functions) == [SCRIPT_KEY]
    return sorted(entry.signature for entry in saved.functions[SCRIPT_KEY])


def _stop_cleanly(server):
    code = server.stop(signal.SIGTERM)
    assert code == 0, server.output
    assert "Traceback" not in server.output, server.output
    return server.output


def test_a_model_warms_up_exactly_the_saved_signatures(tmp_path):
    # Traffic of 1 and 3 rows compiles buckets 1 and 4; a fresh model warmed up from the file (no bucket
    # warm-up) compiles those two before any call, and the same traffic then compiles nothing.
    first = serve.Model(max_batch=8)
    for n in (1, 3):
        first.predict(_rows(n))
    os.chmod(tmp_path, 0o700)  # load_specs reads only where others cannot write (a thread's tmp_path: 0777 - umask)
    path = tmp_path / "specs"
    assert ftjit.save_specs(path, first.fn) == {"examples.serve:mlp": (2, ())}
    second = serve.Model(max_batch=8)
    report = second.warm(workers=2, buckets=False, saved=ftjit.load_specs(path))
    assert report.ok and second.ready and [r.compiled for r in report] == [True, True]
    assert {r.signature for r in report} == {info.signature for info in first.fn.signatures()}
    for n in (1, 3, 4, 1):
        second.predict(_rows(n))
    info = second.fn.cache_info()
    assert (info.compiles, info.misses, info.hits, info.size) == (2, 2, 4, 2)


def test_a_damaged_file_is_a_report_line_and_the_model_is_ready(tmp_path):
    path = tmp_path / "specs"
    path.write_bytes(GARBAGE)
    model = serve.Model(max_batch=4)
    app = serve.App(model)
    report = model.warm(workers=1, saved=ftjit.load_specs(path))
    assert model.ready and not report.ok  # the buckets compiled; the file's one line is an error
    assert [r.signature for r in report.errors] == [f"<specs file {path}>"]
    assert model.fn.cache_info().compiles == 3
    assert b"".join(app({"REQUEST_METHOD": "GET", "PATH_INFO": "/healthz"}, lambda *_: None)) == b'{"ok": true}'
    warmup = model.stats()["warmup"]
    assert warmup["ok"] is False and [r["error"] is None for r in warmup["results"]] == [True] * 3 + [False]


def test_stats_shows_a_files_megabyte_signature_cut(tmp_path):
    """A 20 MB signature of a specs file made /stats 60 MB a request (the warm-up's results, each in full)."""
    first = serve.Model(max_batch=4)
    first.predict(_rows(1))
    os.chmod(tmp_path, 0o700)
    path = tmp_path / "specs"
    ftjit.save_specs(path, first.fn)
    data = json.loads(path.read_text())
    (entry,) = data["functions"]["examples.serve:mlp"]
    entry["signature"], entry["args"][1]["dtype"] = "mlp(" + "x" * 2_000_000 + ")", "no_such_dtype"
    path.write_text(json.dumps(data))
    model = serve.Model(max_batch=4)
    model.warm(workers=1, saved=ftjit.load_specs(path))
    status, _, body = _call(serve.App(model), "GET", "/stats")
    results = json.loads(body)["warmup"]["results"]
    assert status == 200 and len(body) < 64 * 1024
    assert [r["error"] is None for r in results] == [True] * 3 + [False]
    assert results[3]["signature"].endswith("x... (1999045 more characters)")
    assert results[3]["error"] == f"ValueError: the dtype no_such_dtype is not known in this process (numpy {np.__version__})"


def test_a_stale_specs_file_never_takes_a_buckets_signature(tmp_path):
    # issue 34 §2: specs saved by a server with --max-batch 64 name float32[64,16]; a restart with
    # --max-batch 32 (six buckets, max_signatures=6) warms its buckets first, the stale spec finds no room and
    # is skipped, every request size is answered, /healthz says 200, and the next save no longer names it.
    wide = serve.Model(max_batch=64)
    wide.predict(_rows(64))
    path = tmp_path / "specs"
    assert ftjit.save_specs(path, wide.fn)["examples.serve:mlp"][0] == 1
    narrow = serve.Model(max_batch=32)
    app = serve.App(narrow)
    report = narrow.warm(workers=4, saved=ftjit.load_specs(path))
    assert narrow.ready and report.ok
    assert [r.compiled for r in report.results[:6]] == [True] * 6
    (stale,) = report.results[6:]
    assert stale.signature.endswith("float32[64,16])") and not stale.compiled
    assert stale.skipped == "no room under max_signatures beside the program's own signatures and other saved specs"
    for n in (1, 2, 3, 17, 32):
        assert _call(app, "POST", "/predict", _body(_rows(n)))[0] == 200
    assert _call(app, "GET", "/healthz")[::2] == (200, b'{"ok": true}')
    info = narrow.fn.cache_info()
    assert (info.compiles, info.size, info.failures) == (6, 6, 0)
    assert ftjit.save_specs(path, narrow.fn)["examples.serve:mlp"] == (6, ())


def test_healthz_fails_and_names_a_bucket_that_cannot_compile():
    # --no-bucket-warmup with a guard too tight for the buckets (an operator's mistake): the request that needs
    # the third bucket gets a 500, and from then on /healthz answers 503 naming that bucket.
    model = serve.Model(max_batch=4, max_signatures=2)
    app = serve.App(model)
    model.warm(buckets=False)
    assert _call(app, "GET", "/healthz")[::2] == (200, b'{"ok": true}')
    for n in (1, 2):
        assert _call(app, "POST", "/predict", _body(_rows(n)))[0] == 200
    status, _, body = _call(app, "POST", "/predict", _body(_rows(3)))
    assert status == 500 and json.loads(body)["error"].startswith("mlp() would compile a signature past max_signatures=2")
    status, _, body = _call(app, "GET", "/healthz")
    health = json.loads(body)
    assert status == 503 and health["ok"] is False and list(health["failed_buckets"]) == ["4"]
    assert health["failed_buckets"]["4"].startswith("RecompileLimitError: mlp() would compile a signature past "
                                                    "max_signatures=2")


@starts_servers
@pytest.mark.timeout(300)
def test_a_restart_with_specs_compiles_nothing_during_traffic(tmp_path, monkeypatch):
    require_tcp("examples/serve.py's server")
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")  # the servers must not open this process's accelerator
    path = tmp_path / "specs"
    flags = ("--max-batch", "8", "--threads", "4", "--warmup-workers", "2", "--no-bucket-warmup", "--specs", str(path))
    # First run: no file yet, nothing warmed up; traffic of 1 and 3 rows compiles buckets 1 and 4. The
    # file is written every 0.01 minutes (0.6 s, the least --specs-every takes) while it runs.
    server = _server(*flags, "--specs-every", "0.01")
    try:
        assert "warmup: nothing to compile before listening" in server.output
        for n in (1, 3):
            _predict(server.port, n)
        _, stats = _request(server.port, "GET", "/stats")
        compiled = sorted(s["signature"] for s in stats["function"]["signatures"])
        assert len(compiled) == 2 and stats["warmup"] is None
        assert wait_for(lambda: path.exists() and _saved_signatures(path) == compiled, timeout=120)
    finally:
        output = _stop_cleanly(server)
    assert output.rstrip().endswith(f"INFO serve: wrote 2 signature(s) to {path} (left out: none)")

    # Restart from the file: both signatures compile before the port opens, none during traffic.
    server = _server(*flags)
    try:
        assert server.output.index("warmup: 2/2 ok") < server.output.index("serving on http://127.0.0.1:")
        for i, n in enumerate((1, 3, 4, 1)):  # buckets 1 and 4 only: the saved ones
            _predict(server.port, n, seed=i)
        _, stats = _request(server.port, "GET", "/stats")
        info = stats["function"]["cache_info"]
        assert (info["compiles"], info["misses"], info["hits"], info["failures"]) == (2, 2, 4, 0)
        assert sorted(s["signature"] for s in stats["function"]["signatures"]) == compiled
        assert [r["compiled"] for r in stats["warmup"]["results"]] == [True, True]
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        connection.request("GET", "/metrics")
        families = {f.name: f for f in text_string_to_metric_families(connection.getresponse().read().decode())}
        connection.close()
        assert [s.value for s in families["ftjit_compiles"].samples if s.name == "ftjit_compiles_total"] == [2]
        path.unlink()  # no --specs-every here: only the stop can write it again
    finally:
        _stop_cleanly(server)
    assert _saved_signatures(path) == compiled


@starts_servers
@pytest.mark.timeout(300)
def test_a_corrupted_specs_file_still_lets_the_server_start_and_answer(tmp_path, monkeypatch):
    require_tcp("examples/serve.py's server")
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    path = tmp_path / "specs"
    path.write_bytes(GARBAGE)
    refused = ftjit.load_specs(path).error
    error = f"{type(refused).__name__}: {refused}"  # what the warm-up report says of it
    server = _server("--max-batch", "4", "--threads", "2", "--warmup-workers", "2", "--specs", str(path))
    try:
        assert server.output.index("warmup: 3/4 ok") < server.output.index("serving on http://127.0.0.1:")
        assert _request(server.port, "GET", "/healthz") == (200, {"ok": True})
        for n in (1, 2, 3):
            _predict(server.port, n)
        _, stats = _request(server.port, "GET", "/stats")
        assert stats["function"]["cache_info"]["compiles"] == 3  # the buckets, all before listening
    finally:
        output = _stop_cleanly(server)
    lines = [line for line in output.splitlines() if error in line]
    assert len(lines) == 1 and lines[0].startswith(f"<specs file {path}>"), output  # said once, in the report
    assert len(_saved_signatures(path)) == 3  # the stop replaced the damaged file with the buckets


@starts_servers
@pytest.mark.timeout(300)
def test_a_saved_shape_no_device_holds_is_a_report_line_and_the_server_starts(monkeypatch):
    # The restart setup of docs/serving.md with one saved shape edited to [2**56, 16]: the first matmul's result
    # overflowed XLA's 64-bit byte count, which aborted the start (rc 134) before the port opened, every time.
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    with tempfile.TemporaryDirectory(prefix="serve-") as tmp:  # short: a unix socket path has at most 107 bytes
        path = os.path.join(tmp, "specs.json")
        model = serve.Model(max_batch=8)
        model.predict(_rows(3))
        ftjit.save_specs(path, {SCRIPT_KEY: model.fn})
        data = json.loads(Path(path).read_text())
        data["functions"][SCRIPT_KEY][0]["args"][1]["shape"] = [2**56, 16]
        Path(path).write_text(json.dumps(data))
        (entry,) = ftjit.load_specs(path).functions[SCRIPT_KEY]
        size = 2**56 * 16 * 4 + sum(w.nbytes for w in model.weights.values())
        socket_path = os.path.join(tmp, "serve.sock")
        server = _server("--max-batch", "8", "--threads", "2", "--no-bucket-warmup", "--specs", path,
                               unix_socket=socket_path)  # fmt: skip
        try:
            assert load.fetch_json("localhost", None, "/healthz", unix_socket=socket_path) == (200, {"ok": True})
        finally:
            output = _stop_cleanly(server)
    line = next(line for line in output.splitlines() if line.startswith(entry.signature))
    assert line.endswith(f"  ValueError: its arrays would take {size} bytes on the default device, more than the "
                         "1099511627776 (1 TiB) a saved spec may take where the device's memory is not known: not "
                         "warmed up (a damaged file?)")
    assert "warmup: 0/1 ok" in output


# --- --jit jax and --unix-socket: the comparison on a machine without TCP (the TPU one) -----------------------


def test_jax_model_answers_the_same_and_reports_no_ftjit_numbers():
    # The same weights, buckets and padding through jax.jit: the same answers as ftjit's Model. /stats says
    # null where only ftjit has numbers, and /metrics has no ftjit series at all (not zeros).
    ftjit_model, jax_model = serve.Model(max_batch=8), serve.JaxModel(max_batch=8)
    app = serve.App(jax_model)
    assert _call(app, "GET", "/healthz")[::2] == (503, b'{"ok": false}')
    report = jax_model.warm(workers=3)
    assert jax_model.ready and list(report.seconds) == [1, 2, 4, 8] and str(report).startswith("warmup: 4 bucket(s)")
    for rows in (1, 3, 8):
        x = _rows(rows, seed=rows)
        status, _, body = _call(app, "POST", "/predict", _body(x))
        assert status == 200, body
        np.testing.assert_allclose(json.loads(body)["outputs"], ftjit_model.predict(x), rtol=load.RTOL, atol=load.ATOL)
    status, _, body = _call(app, "GET", "/stats")
    stats = json.loads(body)
    assert (status, stats["jit"], stats["ftjit"], stats["buckets"]) == (200, "jax", None, [1, 2, 4, 8])
    assert stats["function"] == {"name": "mlp", "cache_info": None, "signatures": None}
    assert [r["bucket"] for r in stats["warmup"]["results"]] == [1, 2, 4, 8] and stats["warmup"]["workers"] == 1
    families = {f.name for f in text_string_to_metric_families(_call(app, "GET", "/metrics")[2].decode())}
    assert "http_requests" in families and not any(name.startswith("ftjit_") for name in families)
    assert serve.JaxModel(max_batch=4).warm(buckets=False).seconds == {}  # --no-bucket-warmup: nothing called


def test_listen_unix_replaces_only_a_stale_socket_file():
    with tempfile.TemporaryDirectory(prefix="serve-") as tmp:  # short: a unix socket path has at most 107 bytes
        path = os.path.join(tmp, "serve.sock")
        stale = socket.socket(socket.AF_UNIX)
        stale.bind(path)
        stale.close()  # a killed server's file: nothing listens behind it
        with serve.listen_unix(path):
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
            with pytest.raises(OSError, match=f"a server is listening on {re.escape(path)}"):
                serve.listen_unix(path)  # a live one is left alone
        os.unlink(path)
        open(path, "w").close()
        with pytest.raises(OSError, match="Address already in use"):
            serve.listen_unix(path)  # not a socket: not removed
        assert os.path.isfile(path)


SERVE_UNIX_CLASH = "--unix-socket cannot be combined with --host or --port"


@pytest.mark.thread_unsafe(reason="reads what argparse wrote to this process's stderr (capsys)")
@pytest.mark.parametrize(("main", "argv", "message"), [
    (serve.main, ["--unix-socket", "s", "--port", "8000"], SERVE_UNIX_CLASH),
    (serve.main, ["--unix-socket", "s", "--host", "::1"], SERVE_UNIX_CLASH),
    (serve.main, ["--jit", "jax", "--specs", "f"], "--specs needs --jit ftjit: a specs file holds ftjit's signatures"),
    (serve.main, ["--specs-every", "5"], "--specs-every needs --specs FILE: the file to write"),
    (serve.main, ["--specs", ""], "argument --specs: the path is empty: give the file's path"),
    (serve.main, ["--specs", "", "--specs-every", "1"], "argument --specs: the path is empty: give the file's path"),
    (serve.main, ["--specs", "f", "--specs-every", "nan"], "argument --specs-every: nan is not between 0.01 and 10080"),
    (serve.main, ["--specs", "f", "--specs-every", "inf"], "argument --specs-every: inf is not between 0.01 and 10080"),
    (serve.main, ["--specs", "f", "--specs-every", "1e-7"],
     "argument --specs-every: 1e-7 is not between 0.01 and 10080"),
    (serve.main, ["--specs", "f", "--specs-every", "soon"], "argument --specs-every: 'soon' is not a number"),
    (serve.main, ["--port", "70000"], "argument --port: 70000 is not between 0 and 65535"),
    (serve.main, ["--port", "-1"], "argument --port: -1 is not between 0 and 65535"),
    (serve.main, ["--port", "80.5"], "argument --port: '80.5' is not an integer"),
    (serve.main, ["--threads", "0"], "argument --threads: 0 is not between 1 and 1024"),
    (serve.main, ["--max-batch", "10000000"], "argument --max-batch: 10000000 is not between 1 and 65536"),
    (serve.main, ["--warmup-workers", "-3"], "argument --warmup-workers: -3 is not between 1 and 256"),
    (serve.main, ["--connection-limit", "0"], "argument --connection-limit: 0 is not between 1 and 100000"),
    (serve.main, ["--channel-timeout", "nan"], "argument --channel-timeout: nan is not between 1 and 3600"),
    (load.main, ["--unix-socket", "s", "--port", "8000"], "argument --port: not allowed with argument --unix-socket"),
    (load.main, ["--unix-socket", "s", "--host", "::1"], "argument --host: not allowed with argument --unix-socket"),
    (load.main, ["--threads", "2"], "one of the arguments --port --unix-socket is required"),
], ids=["serve-port", "serve-host", "serve-specs-jax", "serve-every-alone", "serve-specs-empty",
        "serve-specs-empty-every", "serve-every-nan", "serve-every-inf",
        "serve-every-tiny", "serve-every-text", "serve-port-high", "serve-port-negative", "serve-port-float",
        "serve-threads", "serve-max-batch", "serve-workers", "serve-connections", "serve-channel-timeout",
        "load-port", "load-host", "load-neither"])  # fmt: skip
def test_option_clashes_are_argparse_errors(main, argv, message, capsys):
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(f": error: {message}")


def _limited_files(soft, hard, command):
    """``command`` run under a limit of open files (ulimit -n) of ``soft``, hard limit ``hard``: through an
    interpreter that sets it and execs the command (not a preexec_fn, which would fork this process, JAX's
    threads and all)."""
    setter = ("import os, resource, sys; resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), "
              "int(sys.argv[2]))); os.execv(sys.argv[3], sys.argv[3:])")
    return [sys.executable, "-c", setter, str(soft), str(hard), *command]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the limits from /proc (Linux)")
@starts_servers
def test_a_connection_limit_past_the_open_files_limit_is_raised_to_fit_or_refused(tmp_path):
    """Under ulimit -n below --connection-limit, waitress's accept() failed once descriptors ran out and its loop
    spun on it (190 of 500 CPU ticks, 17,824 tracebacks in 5 s, /healthz in 3.1 s). Now the start raises the soft
    limit to fit, or refuses, naming both numbers, when the hard limit is below what it needs."""
    need = 1000 + serve.FILES_BESIDE_CONNECTIONS
    sock = str(tmp_path / "s.sock")
    command = [sys.executable, serve.__file__, "--unix-socket", sock, "--connection-limit", "1000", "--threads", "2"]
    done = subprocess.run(_limited_files(256, need - 1, command), capture_output=True, text=True, timeout=120,
                          env=child_env())
    assert done.returncode == 2, done.stdout + done.stderr  # before: it warmed up and served
    assert done.stderr.splitlines()[-1].endswith(
        f"error: --connection-limit 1000 needs {need} open files ({serve.FILES_BESIDE_CONNECTIONS} besides the "
        f"connections), but the hard limit (ulimit -Hn) is {need - 1}: lower --connection-limit to "
        f"{need - 1 - serve.FILES_BESIDE_CONNECTIONS} or less, or raise the hard limit")
    proc = subprocess.Popen(_limited_files(256, need + 10, [*command, "--no-bucket-warmup"]), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=child_env())
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.strip() == f"serving on unix:{sock}":
                break
        assert lines and lines[-1].strip() == f"serving on unix:{sock}", "".join(lines)
        with open(f"/proc/{proc.pid}/limits") as f:
            (row,) = [r for r in f if r.startswith("Max open files")]
        soft, hard = row.split()[3:5]
        assert hard == str(need + 10), row  # as it was
        # Raised to fit; granian raises it further, to the hard limit, as its worker starts.
        assert soft == str(need + 10 if serve.default_front() == "granian" else need), row
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0


def _answer(path, request):
    """Sends ``request`` (bytes) on a new connection to the unix socket ``path``; what the server sent back
    before it closed the connection."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.settimeout(60)
        client.connect(path)
        client.sendall(request)
        chunks = []
        try:
            while chunk := client.recv(65536):
                chunks.append(chunk)
        except ConnectionResetError:  # closed with some of the request unread (waitress's 431)
            pass
    return b"".join(chunks)


@starts_servers
@pytest.mark.timeout(300)
@pytest.mark.parametrize("front", FRONTS)
def test_idle_connections_close_after_the_channel_timeout_and_the_limits_hold(front):
    # waitress swept idle connections every 30 s (its cleanup_interval), whatever --channel-timeout said:
    # --channel-timeout 2 closed an idle connection after 30.1 s, and kept clients behind --connection-limit
    # waiting as long. Headers were capped only by waitress's 256 KiB. Each front must hold serve.py's limits:
    # the socket's mode, the connection limit, the idle timeout, the head's and the body's sizes.
    import time

    with tempfile.TemporaryDirectory(prefix="serve-") as tmp:  # short: a unix socket path has at most 107 bytes
        path = os.path.join(tmp, "serve.sock")
        server = _server("--max-batch", "1", "--threads", "2", "--no-bucket-warmup", "--channel-timeout", "2",
                         "--connection-limit", "2", "--front", front, unix_socket=path)  # fmt: skip
        try:
            mode = stat.S_IMODE(os.stat(path).st_mode)
            idle = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(2)]
            waiting = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                for connection in idle:
                    connection.settimeout(28)  # past 25 s below, short of waitress's 30 s sweep
                    connection.connect(path)
                started = time.monotonic()
                waiting.connect(path)  # the kernel's backlog takes it; the server does not, while two are open
                waiting.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
                waiting.settimeout(1.0)
                with pytest.raises(TimeoutError):
                    waiting.recv(1)  # not answered while the limit's two connections are open
                assert [connection.recv(1) for connection in idle] == [b"", b""]  # closed, sending nothing
                seconds = time.monotonic() - started
                waiting.settimeout(30)
                answered = b"".join(iter(lambda: waiting.recv(65536), b""))
            finally:
                for connection in (*idle, waiting):
                    connection.close()
            get = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
            small = _answer(path, get + b"X-Pad: " + b"a" * (8 * 1024) + b"\r\n\r\n")
            # waitress's cap is exact; granian's read buffer bounds a head loosely (24,000 bytes passed): twice over
            over = serve.MAX_HEADER_BYTES + 1 if front == "waitress" else 2 * serve.MAX_HEADER_BYTES
            big = _answer(path, get + b"X-Pad: " + b"a" * over + b"\r\n\r\n")
            if front == "granian":  # a head sent a byte every 0.2 s is cut at the channel timeout (waitress: never)
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as slow:
                    slow.connect(path)
                    head = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Slow: " + b"a" * 200
                    started = time.monotonic()
                    with pytest.raises(OSError):  # BrokenPipeError or ConnectionResetError, once it is closed
                        for i in range(len(head)):
                            slow.sendall(head[i:i + 1])
                            time.sleep(0.2)
                    cut = time.monotonic() - started
                assert 1.9 <= cut < 25, cut
            body = b'{"inputs": [[' + b" " * 20000 + b"]]}"
            large = _answer(path, b"POST /predict HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
                                  b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        finally:
            _stop_cleanly(server)
        assert not os.path.exists(path)  # the stop removed the socket file
    # channel_timeout, then (waitress) the sweep: every max(1, 2/10) s, and the loop's own second. A hang guard above.
    print(f"idle connections closed after {seconds:.2f} s")
    assert mode == 0o600, oct(mode)
    assert 1.9 <= seconds < 25, seconds
    assert answered.startswith(b"HTTP/1.1 200 OK\r\n") and answered.endswith(b'{"ok": true}'), answered
    assert small.startswith(b"HTTP/1.1 200 OK\r\n") and small.endswith(b'{"ok": true}')
    if front == "waitress":
        assert big.startswith(b"HTTP/1.0 431 Request Header Fields Too Large\r\n"), big[:200]
        assert big.endswith(b"exceeds max_header of 16384\r\n\r\n(generated by waitress)")
        assert large.startswith(b"HTTP/1.1 413 Request Entity Too Large\r\n"), large[:200]  # waitress's own, unread
    else:
        assert big.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n"), big[:200]
        assert large.startswith(b"HTTP/1.1 413 "), large[:200]  # the app's: the phrase is the Python's HTTPStatus
        assert large.endswith(b'{"error": "the body\'s %d bytes exceed 1536"}' % len(body)), large[-200:]


@pytest.mark.parametrize("front", [f for f in FRONTS if f.values == ("granian",)])
def test_granian_listens_on_a_resolved_address_and_a_bad_one_is_a_listen_error(front):
    # granian takes numeric addresses only (a name raised ValueError with a Rust backtrace): serve.py resolves it.
    app = serve.App(serve.Model(max_batch=1))
    assert serve.GranianFront(app, host="localhost", port=0).where() in ("http://127.0.0.1:0", "http://[::1]:0")
    with pytest.raises(serve.ListenError, match="Name or service not known|nodename nor servname"):
        serve.GranianFront(app, host="no-such-host.invalid", port=8000)
    assert isinstance(serve.ListenError(), OSError)  # what main() reports as "cannot listen on ..."


# Runs in a child process: a request that never leaves the model when SIGTERM comes. granian's worker thread
# cannot be stopped from outside: serve_granian's watchdog must end the process, after the specs' write.
STUCK_CHILD = r"""
import http.client, json, logging, os, sys, threading, time
sys.path[:0] = [sys.argv[1]]
from examples import serve

logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")

serve.STOP_SECONDS = 1.0
model = serve.Model(max_batch=1)
model.predict = lambda x: threading.Event().wait()  # never returns
app = serve.App(model)

def client(port):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    connection.request("POST", "/predict", json.dumps({"inputs": [[0.5] * 16]}), {"Content-Type": "application/json"})
    connection.getresponse()

def signal_once_in_the_app():
    while app.metrics.in_progress() < 1:
        time.sleep(0.01)
    os.kill(os.getpid(), 15)

def announce(where):
    threading.Thread(target=client, args=(int(where.rsplit(":", 1)[1]),), daemon=True).start()
    threading.Thread(target=signal_once_in_the_app, daemon=True).start()
    return "serving on " + where

serve.serve_granian(serve.GranianFront(app, threads=2), announce, on_stuck=lambda: print("on_stuck ran", flush=True))
print("serve_granian returned")
"""


@starts_servers
@pytest.mark.timeout(120)
@pytest.mark.parametrize("front", [f for f in FRONTS if f.values == ("granian",)])
def test_a_request_stuck_in_the_app_ends_the_stop_after_its_bound(front):
    require_tcp("serve.py's listener")
    child = subprocess.run([sys.executable, "-c", STUCK_CHILD, str(REPO)], capture_output=True, text=True,
                           timeout=100, env=child_env())  # fmt: skip
    assert child.returncode == 1, child.stdout + child.stderr
    assert child.stdout.splitlines()[-1] == "on_stuck ran", child.stdout
    assert "ERROR serve: 1 request(s) still in the app 1 s after the signal: their answers are lost" in child.stderr


@pytest.mark.parametrize(("timeout", "interval"), [(1, 1), (2, 1), (10, 1), (45, 4), (120, 12), (299, 29),
                                                   (300, 30), (3600, 30)])
def test_waitress_sweeps_idle_connections_every_tenth_of_the_channel_timeout(timeout, interval):
    assert serve.cleanup_interval(timeout) == interval


def _report_values(stdout):
    """examples/load.py's printed report as {measure: value}."""
    return {parts[0]: parts[1] for parts in (re.split(r"\s{2,}", line.strip()) for line in stdout.splitlines())
            if len(parts) == 3}  # fmt: skip


@starts_servers
@pytest.mark.timeout(300)
def test_ftjit_and_jax_servers_on_unix_sockets_answer_load_py_alike(monkeypatch):
    # Each --jit in turn, on a unix socket: examples/load.py --unix-socket (its command line) sends the same
    # seeded requests to both, all answered and checked; then the same batches get the same answers from both.
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    answers = {}
    with tempfile.TemporaryDirectory(prefix="serve-") as tmp:  # short: a unix socket path has at most 107 bytes
        for jit in ("ftjit", "jax"):
            path = os.path.join(tmp, f"{jit}.sock")
            server = _server("--jit", jit, "--max-batch", "8", "--threads", "2", "--warmup-workers", "2",
                                   unix_socket=path)  # fmt: skip
            try:
                assert f"serving on unix:{path}\n" in server.output
                assert load.fetch_json("localhost", None, "/healthz", unix_socket=path) == (200, {"ok": True})
                command = [sys.executable, str(REPO / "examples" / "load.py"), "--unix-socket", path,
                           "--threads", "2", "--requests", "60", "--seed", "5", "--max-batch", "8"]  # fmt: skip
                done = subprocess.run(command, capture_output=True, text=True, timeout=180, env=child_env())
                assert done.returncode == 0, done.stdout + done.stderr
                values = _report_values(done.stdout)
                assert (values["requests"], values["errors"], values["wrong answers"]) == ("60", "0", "0")
                assert values["compiles"] == {"ftjit": "4", "jax": "n/a"}[jit], done.stdout
                _, stats = load.fetch_json("localhost", None, "/stats", unix_socket=path)
                assert stats["jit"] == jit and (stats["ftjit"] is None) is (jit == "jax")
                answers[jit] = []
                for n in range(1, 9):
                    connection = load.UnixHTTPConnection(path, timeout=60)
                    connection.request("POST", "/predict", _body(_rows(n, seed=n)), {"Content-Type": JSON})
                    answers[jit].append(json.loads(connection.getresponse().read())["outputs"])
                    connection.close()
            finally:
                output = _stop_cleanly(server)
            assert output.rstrip().endswith("server stopped")
            assert not os.path.exists(path)  # the stop removed the socket file
    weights = serve.make_weights()
    for n, ftjit_answer, jax_answer in zip(range(1, 9), answers["ftjit"], answers["jax"]):
        np.testing.assert_allclose(ftjit_answer, load.reference_forward(weights, _rows(n, seed=n)),
                                   rtol=load.RTOL, atol=load.ATOL)  # fmt: skip
        np.testing.assert_allclose(jax_answer, ftjit_answer, rtol=load.RTOL, atol=load.ATOL)


@starts_servers
@pytest.mark.timeout(300)
def test_the_tpu_comparison_driver_prints_its_table():
    # bench/tpu_compare.py, small: one server per --jit, on a unix socket, each loaded by load.py; one table.
    command = [sys.executable, "-m", "bench.tpu_compare", "--threads", "2", "--load-threads", "2", "--requests", "20"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=280, env=child_env())
    workdir = re.search(r"^servers' output and load reports: (\S+)$", done.stdout, re.M)
    if workdir:
        shutil.rmtree(workdir.group(1))
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line.split() for line in done.stdout.splitlines() if line.startswith(("ftjit ", "jax "))]
    # jit, server threads/clients, requests, requests/s, p50, p99, errors, wrong, compiles during traffic
    assert [(r[:3], r[6:]) for r in rows] == [(["ftjit", "2/2", "20"], ["0", "0", "0"]),
                                             (["jax", "2/2", "20"], ["0", "0", "n/a"])]  # fmt: skip


# --- --batch: one example per request, merged (ftjit.batched) -------------------------------------------------


def test_batch_model_merges_one_example_requests_and_answers_each_its_own():
    """Sixteen threads each send one-example requests through the app: every answer is its own row of the
    MLP; the examples were merged into batches (batch_info's books balance); a request of several rows still
    goes through the buckets; the warm-up compiled the example and every batch size, and traffic nothing."""
    model = serve.BatchedModel(max_batch=8, batch_wait=0.005)
    app = serve.App(model)
    report = model.warm(workers=2)
    assert report.ok and len(report) == 4 + 1 + 3  # buckets 1, 2, 4, 8; the example; batches of 2, 4, 8
    compiles = (model.one._runner.one.cache_info().compiles, model.one._runner.many.cache_info().compiles)
    assert compiles == (1, 3) and model.one.batch_info().compiles == 4
    xs = [_rows(1, seed=i) for i in range(16)]

    def client(i):
        out = []
        for _ in range(10):
            status, _, body = _call(app, "POST", "/predict", _body(xs[i]))
            assert status == 200, body
            out.append(json.loads(body)["outputs"])
        return out

    for i, answers in enumerate(run_threads(16, client, timeout=120)):
        for answer in answers:
            np.testing.assert_allclose(answer, load.reference_forward(model.weights, xs[i]), rtol=load.RTOL,
                                       atol=load.ATOL)
    info = model.one.batch_info()
    assert info.calls == 160 and info.alone + sum(n * c for n, c in info.sizes) == 160
    assert (model.one._runner.one.cache_info().compiles, model.one._runner.many.cache_info().compiles) == compiles
    status, _, body = _call(app, "POST", "/predict", _body(_rows(3)))
    assert status == 200 and len(json.loads(body)["outputs"]) == 3  # several rows: the bucket of 4
    assert model.fn.cache_info().hits == 1
    stats = json.loads(_call(app, "GET", "/stats")[2])
    assert stats["batched"]["calls"] == 160 and stats["batched"]["batches"] == info.batches


def test_batch_metrics_carry_a_histogram_of_batch_sizes():
    model = serve.BatchedModel(max_batch=4, batch_wait=0.005)
    app = serve.App(model)
    assert model.warm(workers=1).ok
    run_threads(8, lambda i: [_call(app, "POST", "/predict", _body(_rows(1, seed=i)))[0] for _ in range(5)],
                timeout=120)
    info = model.one.batch_info()
    families = {f.name: f for f in text_string_to_metric_families(_call(app, "GET", "/metrics")[2].decode())}
    hist = families["ftjit_batch_size"]
    assert hist.type == "histogram"
    samples = {(s.name, s.labels.get("le")): s.value for s in hist.samples}
    counts = dict(info.sizes)
    for bound in ("1", "2", "4"):
        assert samples[("ftjit_batch_size_bucket", bound)] == sum(c for n, c in counts.items() if n <= int(bound))
    assert samples[("ftjit_batch_size_bucket", "+Inf")] == samples[("ftjit_batch_size_count", None)] == info.batches
    assert samples[("ftjit_batch_size_sum", None)] == sum(n * c for n, c in counts.items())
    assert [s.value for s in families["ftjit_batched_calls"].samples if s.name.endswith("_total")] == [40]


@starts_servers
@pytest.mark.timeout(300)
def test_a_batch_server_on_a_unix_socket_answers_load_py_one_example_per_request(monkeypatch):
    # serve.py --batch: examples/load.py --max-batch 1 sends one example per request from 8 connections; all
    # answered and checked against the reference; /stats counts every request as one call of the batched one.
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    with tempfile.TemporaryDirectory(prefix="serve-") as tmp:
        path = os.path.join(tmp, "batch.sock")
        server = _server("--batch", "--max-batch", "8", "--threads", "8", "--warmup-workers", "2",
                               unix_socket=path)  # fmt: skip
        try:
            command = [sys.executable, str(REPO / "examples" / "load.py"), "--unix-socket", path,
                       "--threads", "8", "--requests", "200", "--seed", "3", "--max-batch", "1"]  # fmt: skip
            done = subprocess.run(command, capture_output=True, text=True, timeout=240, env=child_env())
            assert done.returncode == 0, done.stdout + done.stderr
            values = _report_values(done.stdout)
            assert (values["requests"], values["errors"], values["wrong answers"]) == ("200", "0", "0")
            _, stats = load.fetch_json("localhost", None, "/stats", unix_socket=path)
            batched = stats["batched"]
            assert batched["calls"] == 200 and batched["timeouts"] == batched["failed_batches"] == 0
            assert batched["alone"] + sum(n * c for n, c in batched["sizes"]) == 200
        finally:
            output = _stop_cleanly(server)
        assert output.rstrip().endswith("server stopped")


def test_batch_needs_the_ftjit_jit(capsys):
    with pytest.raises(SystemExit) as exit_:
        serve.main(["--batch", "--jit", "jax"])
    assert exit_.value.code == 2
    assert "--batch needs --jit ftjit: it is ftjit.batched" in capsys.readouterr().err


@starts_servers
@pytest.mark.timeout(300)
def test_the_serving_breakdown_measures_each_layer_with_every_answer_checked():
    # bench.serving's rows, briefly: each HTTP row's server answers load.py's checked requests (a row with an
    # error or a wrong answer raises), and the in-process rows time the app and the model.
    from bench import serving

    for front in serve.FRONTS if serve.granian_unavailable() is None else ["waitress"]:
        rows = serving.http_rows(clients=2, seconds=0.3, batch=False, front=front)
        assert [name for name, *_ in rows] == ["client ceiling (canned responder)", f"front, bare app ({front})",
                                               "serve.py GET /healthz", "serve.py POST /predict, 1 example"]
        assert all(rate > 0 and 0 < p50 <= p99 for _, rate, p50, p99 in rows)
    inside = serving.process_rows(clients=2, seconds=0.2, batch=True)
    assert [name for name, *_ in inside] == ["app GET /healthz, no HTTP", "app POST /predict, no HTTP",
                                             "the model's call, ftjit.batched",
                                             "the model's call, ftjit.batched, after a JSON parse"]
    assert all(rate > 0 and us > 0 for _, rate, us, _ in inside)
