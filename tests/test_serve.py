"""The serving example (examples/serve.py, load.py, demo.py): answers, compile-once, bad input, shutdown,
HTTP rules, /metrics, bounded threads, deadlines and one log line per event, under both servers.

Servers bind ephemeral loopback ports; nothing asserts on speed: timeouts
are hang guards, and the deadline tests use small configured deadlines with
generous bounds. The server tests are thread_unsafe: they start servers,
threads and subprocesses, count one function's compiles across whole load
runs, or count threads. The App tests (a fake model, no server) run in many
threads at once. Tests of the waitress server skip when waitress is not
installed (bash dev.sh installs it; pip install 'ftjit[serve]').
"""

import importlib.util
import http.client
import io
import json
import logging
import queue
import re
import signal
import socket
import struct
import subprocess
import sys
import sysconfig
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import jax  # noqa: F401 - a hard dependency: its absence must fail, not skip

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # ``examples`` is a package at the repository root, not installed
    sys.path.insert(0, str(REPO))

from examples import load, serve  # noqa: E402

from helpers import LogCapture, run_threads, wait_for  # noqa: E402

starts_servers = pytest.mark.thread_unsafe(reason="starts servers, threads or subprocesses and counts their compiles")
HAVE_WAITRESS = importlib.util.find_spec("waitress") is not None
needs_waitress = pytest.mark.skipif(
    not HAVE_WAITRESS, reason="waitress is not installed: pip install 'ftjit[serve]' (bash dev.sh installs it)"
)
#: Both servers, as pytest params; waitress's skip when it is not installed.
SERVERS = [pytest.param("stdlib"), pytest.param("waitress", marks=needs_waitress)]


def _request(port: int, method: str, path: str, body: bytes | None = None) -> tuple[int, object]:
    """One request on a fresh connection: (status, decoded JSON body)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request(method, path, body, {"Content-Type": "application/json"} if body is not None else {})
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def _rows(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, serve.N_INPUTS)).astype(np.float32)


def _predict_body(x: np.ndarray) -> bytes:
    return json.dumps({"inputs": x.tolist()}).encode()


@pytest.fixture
def running():
    """A server with max_batch=8 (buckets 1, 2, 4, 8) serving in a background thread."""
    server = serve.serve_in_thread(max_batch=8, warmup_workers=2)
    yield server
    server.shutdown(timeout=30)


def test_batch_buckets():
    assert serve.batch_buckets(32) == (1, 2, 4, 8, 16, 32)
    assert serve.batch_buckets(1) == (1,)
    assert serve.batch_buckets(12) == (1, 2, 4, 8, 12)
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="max_batch"):
            serve.batch_buckets(bad)


def test_load_refuses_non_loopback_hosts():
    with pytest.raises(ValueError, match="non-loopback"):
        load.run_load(80, host="192.0.2.1", requests=1)
    with pytest.raises(ValueError, match="non-loopback"):
        load.fetch_json("192.0.2.1", 80, "/stats")


@starts_servers
@pytest.mark.timeout(120)
def test_load_is_answered_correctly_and_compiles_only_during_warmup():
    with serve.serve_in_thread(max_batch=32, warmup_workers=4) as running:
        model = running.model
        buckets = len(model.buckets)
        assert buckets == 6
        warmup = model.warmup_report
        assert warmup is not None and warmup.ok
        assert [r.compiled for r in warmup.results] == [True] * buckets
        after_warmup = model.fn.cache_info()
        assert after_warmup.compiles == after_warmup.misses == after_warmup.size == buckets

        report = load.run_load(
            running.port, threads=4, requests=200, seconds=None, seed=1, max_batch=32, progress=False
        )
        after_load = model.fn.cache_info()
        signatures = model.fn.signatures()

    assert report.requests == 200
    assert report.stopped_by == load.STOPPED_BY_COUNT == "request count"
    assert report.errors == 0, report.first_error
    assert report.wrong == 0, report.first_error
    assert report.first_error is None
    assert report.compiles == buckets
    assert after_load.compiles == after_warmup.compiles == buckets
    assert after_load.misses == after_warmup.misses
    assert after_load.failures == 0
    assert after_load.hits == 200  # one call per request, each served from the cache
    assert len(signatures) == buckets
    assert sum(s.hits for s in signatures) == 200


@starts_servers
@pytest.mark.timeout(120)
def test_healthz_and_stats(running):
    assert _request(running.port, "GET", "/healthz") == (200, {"ok": True})

    status, stats = _request(running.port, "GET", "/stats")
    assert status == 200
    assert json.loads(json.dumps(stats)) == stats
    function = stats["function"]
    assert function["name"] == "mlp"
    assert function["cache_info"]["compiles"] == len(running.model.buckets) == 4
    assert set(function["cache_info"]) == set(running.model.fn.cache_info()._fields)
    assert len(function["signatures"]) == 4
    assert all(set(s) == {"signature", "hits", "compile_seconds"} for s in function["signatures"])
    assert "mlp" in [f["name"] for f in stats["ftjit"]["functions"]]
    assert stats["buckets"] == [1, 2, 4, 8]
    assert stats["warmup"]["ok"] is True
    assert [r["compiled"] for r in stats["warmup"]["results"]] == [True] * 4

    status, body = _request(running.port, "GET", "/nowhere")
    assert status == 404 and "error" in body


@starts_servers
@pytest.mark.timeout(120)
def test_every_batch_size_is_padded_to_its_bucket_and_matches_the_reference(running):
    model = running.model
    for rows in range(1, model.max_batch + 1):
        x = _rows(rows, seed=rows)
        status, body = _request(running.port, "POST", "/predict", _predict_body(x))
        assert status == 200, body
        outputs = np.asarray(body["outputs"])
        assert outputs.shape == (rows, serve.N_OUTPUTS)
        np.testing.assert_allclose(outputs, serve.reference_forward(model.weights, x), rtol=load.RTOL, atol=load.ATOL)
    info = model.fn.cache_info()
    assert info.compiles == len(model.buckets)
    hits = {s.signature: s.hits for s in model.fn.signatures()}
    by_bucket = {b: next(n for s, n in hits.items() if s.endswith(f"float32[{b},16])")) for b in model.buckets}
    assert by_bucket == {1: 1, 2: 1, 4: 2, 8: 4}  # rows 1 | 2 | 3-4 | 5-8


@starts_servers
@pytest.mark.timeout(120)
def test_bad_input_gets_400_and_a_json_error_on_a_connection_that_stays_usable(running):
    row = [0.5] * serve.N_INPUTS
    bad_bodies = {
        "not JSON": b"not json",
        "not UTF-8": b"\xff\xfe",
        "not an object": b"[1, 2]",
        "no inputs": json.dumps({"x": [row]}).encode(),
        "inputs not a list": json.dumps({"inputs": "abc"}).encode(),
        "empty batch": json.dumps({"inputs": []}).encode(),
        "short row": json.dumps({"inputs": [row[:3]]}).encode(),
        "long row": json.dumps({"inputs": [row + [1.0]]}).encode(),
        "row not a list": json.dumps({"inputs": [1.0, 2.0]}).encode(),
        "strings": json.dumps({"inputs": [["1.0"] * serve.N_INPUTS]}).encode(),
        "booleans": json.dumps({"inputs": [[True] * serve.N_INPUTS]}).encode(),
        "nested": json.dumps({"inputs": [[[1.0]] * serve.N_INPUTS]}).encode(),
        "NaN": b'{"inputs": [[' + b", ".join([b"NaN"] * serve.N_INPUTS) + b"]]}",
        "float32 overflow": json.dumps({"inputs": [[1e39] * serve.N_INPUTS]}).encode(),
        "ragged": json.dumps({"inputs": [row, row[:-1]]}).encode(),
        "nested too deep": b'{"inputs": ' + b"[" * 1500 + b"]" * 1500 + b"}",
        "int too long to parse": b'{"inputs": [[' + b"9" * 5000 + b", " + b", ".join([b"1"] * (serve.N_INPUTS - 1)) + b"]]}",
        "int beyond float64": json.dumps({"inputs": [[10**309] + row[1:]]}).encode(),
    }
    connection = http.client.HTTPConnection("127.0.0.1", running.port, timeout=30)
    try:
        for what, body in bad_bodies.items():
            connection.request("POST", "/predict", body, {"Content-Type": "application/json"})
            response = connection.getresponse()
            answer = json.loads(response.read())
            assert response.status == 400, what
            assert isinstance(answer["error"], str) and answer["error"], what
        # The same keep-alive connection still answers a good request.
        connection.request("POST", "/predict", _predict_body(_rows(3)), {"Content-Type": "application/json"})
        response = connection.getresponse()
        assert response.status == 200
        assert len(json.loads(response.read())["outputs"]) == 3
    finally:
        connection.close()
    assert running.model.fn.cache_info().compiles == len(running.model.buckets)


@starts_servers
@pytest.mark.timeout(120)
def test_too_big_batches_and_bodies_are_rejected(running):
    status, body = _request(running.port, "POST", "/predict", _predict_body(_rows(9)))
    assert status == 413
    assert "max_batch=8" in body["error"]

    huge = b"[" * (running.server.max_body_bytes + 1)
    status, body = _request(running.port, "POST", "/predict", huge)
    assert status == 413 and "error" in body

    with socket.create_connection(("127.0.0.1", running.port), timeout=30) as raw:
        raw.sendall(b"POST /predict HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\r\n")
        assert raw.makefile("rb").readline().split()[1] == b"411"

    status, body = _request(running.port, "POST", "/predict", _predict_body(_rows(8)))
    assert status == 200 and len(body["outputs"]) == 8


@starts_servers
@pytest.mark.timeout(120)
def test_non_finite_outputs_get_422(running):
    # Finite float32 inputs whose hidden layer overflows: the answer would not be valid JSON.
    status, body = _request(running.port, "POST", "/predict", _predict_body(np.full((1, serve.N_INPUTS), 3e38)))
    assert status == 422 and "not finite" in body["error"]


@starts_servers
@pytest.mark.timeout(120)
def test_shutdown_joins_the_server_and_closes_idle_keepalive_connections():
    running = serve.serve_in_thread(max_batch=2, warmup_workers=1)
    idle = http.client.HTTPConnection("127.0.0.1", running.port, timeout=30)
    try:
        idle.request("GET", "/healthz")
        response = idle.getresponse()
        assert response.status == 200 and not response.will_close
        response.read()  # the connection is now idle, kept alive by the server

        running.shutdown(timeout=30)
        assert not running.thread.is_alive()
        assert running.server.socket.fileno() == -1  # the listening socket is closed
        # server_close() woke and joined the idle connection's thread, which closed it.
        assert idle.sock.recv(1) == b""
    finally:
        idle.close()


def _serve_until_port(proc: subprocess.Popen, lines: "queue.Queue[str | None]", timeout: float) -> int:
    """Reads the server's output until its ``serving on http://127.0.0.1:PORT`` line; returns PORT."""
    seen = []
    while True:
        try:
            line = lines.get(timeout=timeout)
        except queue.Empty:
            pytest.fail("serve.py printed no 'serving on' line in time; output so far:\n" + "".join(seen))
        if line is None:
            pytest.fail(f"serve.py exited with {proc.wait()} before serving; output:\n" + "".join(seen))
        seen.append(line)
        match = re.match(r"serving on http://127\.0\.0\.1:(\d+)$", line.strip())
        if match:
            return int(match.group(1))


@starts_servers
@pytest.mark.timeout(120)
@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("server", SERVERS)
def test_serve_script_exits_0_on_signal(signum, server):
    command = [sys.executable, str(REPO / "examples" / "serve.py"), "--port", "0", "--max-batch", "4", "--server", server]
    proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: "queue.Queue[str | None]" = queue.Queue()
    output: list[str] = []

    def read() -> None:
        for line in proc.stdout:
            output.append(line)
            lines.put(line)
        lines.put(None)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        port = _serve_until_port(proc, lines, timeout=90)
        assert _request(port, "GET", "/healthz") == (200, {"ok": True})
        proc.send_signal(signum)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        reader.join(timeout=30)
    assert not reader.is_alive(), "the server's output never ended"
    text = "".join(output)
    assert "warmup: 3/3 ok" in text  # buckets 1, 2, 4
    assert f"INFO serve: {server} server: --max-connections 256, --idle-timeout 30 s, " in text
    assert "server stopped" in text
    assert "Traceback" not in text


@starts_servers
@pytest.mark.timeout(120)
def test_demo_script_passes_and_prints_the_table():
    demo = str(REPO / "examples" / "demo.py")
    command = [sys.executable, demo, "--threads", "2", "--requests", "50", "--max-batch", "8"]
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.strip().splitlines()
    rows = [re.split(r"\s{2,}", line.strip()) for line in lines if line and not line.startswith(("-", "PASS", "FAIL"))]
    assert all(len(row) == 2 for row in rows), rows
    table = dict(rows)
    expected_names = [
        "requests", "stopped by", "req/s", "p50 ms", "p99 ms", "max ms", "errors", "wrong answers",
        "buckets", "compiles", "hits", "waits", "compile seconds", "warmup seconds",
        "fresh warmup s, 1 worker", "fresh warmup s, 4 workers", "warmup speed-up",
    ]  # fmt: skip
    assert list(table) == expected_names
    assert table["requests"] == "50"
    assert table["stopped by"] == "request count"
    assert table["errors"] == table["wrong answers"] == "0"
    assert table["buckets"] == table["compiles"] == "4"
    assert table["hits"] == "50"
    loop, parallel = float(table["fresh warmup s, 1 worker"]), float(table["fresh warmup s, 4 workers"])
    assert loop > 0 and parallel > 0
    speed_up = table["warmup speed-up"]
    assert re.fullmatch(r"\d+\.\d\dx", speed_up)
    # loop / parallel, within what rounding the two seconds to 3 decimals and the ratio to 2 allows
    assert (loop - 5e-4) / (parallel + 5e-4) - 5e-3 <= float(speed_up[:-1]) <= (loop + 5e-4) / (parallel - 5e-4) + 5e-3
    assert lines[-1].startswith("PASS")


@starts_servers
@pytest.mark.timeout(120)
def test_load_time_limit_stops_a_huge_run_and_reports_it(running):
    total = 10**9
    t0 = time.monotonic()
    report = load.run_load(running.port, threads=2, requests=total, seconds=1.0, seed=3, max_batch=8, progress=False)
    elapsed = time.monotonic() - t0
    assert report.stopped_by == load.STOPPED_BY_TIME == "time limit"
    assert 0 < report.requests < total
    assert report.errors == 0 and report.wrong == 0, report.first_error
    # The run ended only once the deadline refused a request, and its wall
    # time is this call's (a run that ignored the deadline would not return:
    # the timeout mark fails it).
    assert 1.0 <= report.seconds <= elapsed
    assert report.compiles == len(running.model.buckets) == 4
    assert re.search(r"^stopped by +time limit$", load.format_table(report), re.M)


@starts_servers
@pytest.mark.timeout(120)
def test_load_script_reports_which_limit_stopped_it(running, capsys):
    port = str(running.port)
    common = ["--port", port, "--threads", "2", "--max-batch", "8"]
    assert load.main([*common, "--requests", "20", "--seconds", "600"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^requests +20$", out, re.M) and re.search(r"^stopped by +request count$", out, re.M)
    assert load.main([*common, "--requests", str(10**9), "--seconds", "0.5"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^stopped by +time limit$", out, re.M)
    assert re.search(r"^errors +0$", out, re.M) and re.search(r"^server compiles +4$", out, re.M)


@starts_servers
@pytest.mark.timeout(120)
def test_load_script_fails_when_no_request_was_answered(running, capsys):
    # A run that sends nothing proves nothing: exit code 1, not a pass.
    args = ["--port", str(running.port), "--threads", "2", "--seconds", "0.000001"]
    assert load.main(args) == 1
    assert re.search(r"^requests +0$", capsys.readouterr().out, re.M)


@starts_servers
@pytest.mark.timeout(120)
def test_shutdown_with_a_hung_request_handler_raises_instead_of_hanging():
    running = serve.serve_in_thread(max_batch=2, warmup_workers=1)
    entered, release = threading.Event(), threading.Event()
    predict = running.model.predict

    def hung_predict(x):
        entered.set()
        release.wait(60)
        return predict(x)

    running.model.predict = hung_predict
    outcome = []

    def run_client():
        try:
            outcome.append(
                load.run_load(running.port, threads=1, requests=1, seconds=None, max_batch=2, progress=False)
            )
        except BaseException as e:  # noqa: BLE001 - examined below
            outcome.append(e)

    client = threading.Thread(target=run_client, daemon=True)
    client.start()
    try:
        assert entered.wait(30)
        # The handler is held until release (up to 60 s), so a shutdown that
        # waited for it instead of giving up after its timeout would not raise.
        with pytest.raises(TimeoutError, match=r"^still running 1\.5 s after shutdown: connection-\d+$"):
            running.shutdown(timeout=1.5)
        assert outcome == []  # it gave up while the handler was still hung: no answer yet
        assert not running.thread.is_alive()  # the serving thread itself stopped
    finally:
        release.set()
        client.join(30)
    assert not client.is_alive()
    # Released, the hung handler still answers its request (shutdown closed
    # only the read side of the connection), right.
    assert len(outcome) == 1 and isinstance(outcome[0], load.LoadReport), outcome
    report = outcome[0]
    assert (report.requests, report.errors, report.wrong) == (1, 0, 0), report.first_error
    assert report.stopped_by == load.STOPPED_BY_COUNT


@starts_servers
@pytest.mark.timeout(120)
def test_a_connection_thread_that_fails_to_start_does_not_break_shutdown(monkeypatch):
    running = serve.serve_in_thread(max_batch=2, warmup_workers=1)
    start = threading.Thread.start
    failed = []

    def failing_start(self):
        if self.name.startswith("serve-worker-") and not failed:
            failed.append(self.name)
            raise RuntimeError("can't start new thread")  # as under a thread limit
        return start(self)

    monkeypatch.setattr(threading.Thread, "start", failing_start)
    first = http.client.HTTPConnection("127.0.0.1", running.port, timeout=10)
    with pytest.raises((http.client.HTTPException, OSError)):
        first.request("GET", "/healthz")
        first.getresponse()
    first.close()
    second = http.client.HTTPConnection("127.0.0.1", running.port, timeout=10)
    second.request("GET", "/healthz")
    assert second.getresponse().status == 200
    second.close()
    assert len(failed) == 1
    running.shutdown(timeout=10)  # no "cannot join thread before it is started"
    assert running.server.hung_handlers == []


# --- the App core, without a server (a fake model: these run in many threads at once) ---------------------------


class _FakeFn:
    __name__ = "fake_mlp"

    def cache_info(self):
        import ftjit

        return ftjit.CacheInfo(
            hits=7, misses=2, compiles=2, waits=1, evictions=0, size=2, failures=0,
            compile_seconds=0.5, wait_seconds=0.25,
        )  # fmt: skip


class _FakeModel:
    """What App uses of a Model: max_batch, ready, fn (its name and cache_info), predict and stats."""

    max_batch = 4
    ready = True
    fn = _FakeFn()

    def predict(self, x):
        return x[:, : serve.N_OUTPUTS] * 2

    def stats(self):
        return {"fake": True}


def _no_body(n):
    raise AssertionError("the body must not be read")


def _handle(app, method, path, headers=None, body=None):
    """app.handle with a body reader over ``body``; (response, decoded JSON body or None, read calls)."""
    reads = []

    def read_body(n):
        reads.append(n)
        return body[:n]

    response = app.handle(method, path, headers or {}, _no_body if body is None else read_body)
    data = json.loads(response.body) if response.body and response.body[:1] in (b"{", b"[") else None
    return response, data, reads


def _predict_headers(body, content_type="application/json"):
    return {"content-type": content_type, "content-length": str(len(body))}


def test_request_path_drops_the_query_and_decodes():
    assert serve.request_path("/healthz?x=1") == "/healthz"
    assert serve.request_path("/healthz?") == "/healthz"
    assert serve.request_path("/healthz#top") == "/healthz"
    assert serve.request_path("/heal%74hz?a=%2F") == "/healthz"
    assert serve.request_path("http://localhost:8000/stats?x") == "/stats"
    assert serve.request_path("//healthz") == "//healthz"
    assert serve.request_path("/%FF") == "/\ufffd"


def test_app_answers_405_with_allow_404_and_head():
    app = serve.App(_FakeModel())
    cases = [
        ("PUT", "/predict", 405, "POST", {"error": "method PUT is not allowed on /predict (allowed: POST)"}),
        ("DELETE", "/predict", 405, "POST", {"error": "method DELETE is not allowed on /predict (allowed: POST)"}),
        ("GET", "/predict", 405, "POST", {"error": "method GET is not allowed on /predict (allowed: POST)"}),
        ("POST", "/healthz", 405, "GET, HEAD", {"error": "method POST is not allowed on /healthz (allowed: GET, HEAD)"}),
        ("PATCH", "/metrics", 405, "GET, HEAD", {"error": "method PATCH is not allowed on /metrics (allowed: GET, HEAD)"}),
        ("GET", "/nowhere", 404, None, {"error": "no such path: /nowhere"}),
        ("DELETE", "/nowhere", 404, None, {"error": "no such path: /nowhere"}),
        ("GET", "/healthz", 200, None, {"ok": True}),
        ("GET", "/stats", 200, None, {"fake": True}),
    ]  # fmt: skip
    for method, path, status, allow, payload in cases:
        response, data, _ = _handle(app, method, path)
        headers = dict(response.headers)
        assert (response.status, headers.get("Allow"), data) == (status, allow, payload), (method, path)
        assert headers["Content-Type"] == "application/json"
        assert headers["Content-Length"] == str(len(response.body))
        assert not response.close

    # HEAD: the status and headers of the same GET, no body (a 405 to HEAD too: a HEAD answer never has one).
    for path, status, payload in (
        ("/healthz", 200, {"ok": True}),
        ("/predict", 405, {"error": "method HEAD is not allowed on /predict (allowed: POST)"}),
        ("/nowhere", 404, {"error": "no such path: /nowhere"}),
    ):
        head, _, _ = _handle(app, "HEAD", path)
        assert (head.status, head.body) == (status, b"")
        assert dict(head.headers)["Content-Length"] == str(len(json.dumps(payload).encode()))
        assert dict(head.headers)["Content-Type"] == "application/json"


def test_app_checks_content_type_and_length_before_reading_the_body():
    app = serve.App(_FakeModel())
    body = json.dumps({"inputs": [[1.0] * serve.N_INPUTS]}).encode()
    for content_type in ("application/json", "application/json; charset=utf-8", "Application/JSON ;charset=UTF-8"):
        response, data, reads = _handle(app, "POST", "/predict", _predict_headers(body, content_type), body)
        assert (response.status, data, reads) == (200, {"outputs": [[2.0] * serve.N_OUTPUTS]}, [len(body)])
        assert not response.close

    cases = [
        ({"content-type": "text/plain", "content-length": "5"}, 415,
         "Content-Type must be application/json, got 'text/plain'"),
        ({"content-type": "application/jsonx", "content-length": "5"}, 415,
         "Content-Type must be application/json, got 'application/jsonx'"),
        ({"content-length": "5"}, 415, "Content-Type must be application/json, got none"),
        ({"content-type": "application/json"}, 411, "a Content-Length header is required"),
        ({"content-type": "application/json", "content-length": "-1"}, 400, "bad Content-Length: '-1'"),
        ({"content-type": "application/json", "content-length": "+5"}, 400, "bad Content-Length: '+5'"),
        ({"content-type": "application/json", "content-length": "5_0"}, 400, "bad Content-Length: '5_0'"),
        ({"content-type": "application/json", "content-length": "5, 6"}, 400, "bad Content-Length: '5, 6'"),
        ({"content-type": "application/json", "content-length": str(app.max_body_bytes + 1)}, 413,
         f"body of {app.max_body_bytes + 1} bytes exceeds {app.max_body_bytes}"),
    ]  # fmt: skip
    for headers, status, error in cases:
        response, data, _ = _handle(app, "POST", "/predict", headers)  # _no_body: never read
        assert (response.status, data) == (status, {"error": error}), headers
        # A declared body left unread: a stream transport must close the connection.
        assert response.close == (headers.get("content-length", "0") != "0"), headers

    # A body shorter than its Content-Length.
    response, data, reads = _handle(app, "POST", "/predict", {"content-type": "application/json", "content-length": "10"}, b"{}")
    assert (response.status, data, reads, response.close) == (400, {"error": "body ended before Content-Length bytes"}, [10], True)
    # A 405 with a body it did not read closes too; without one it does not.
    response, _, _ = _handle(app, "PUT", "/predict", {"content-length": "3"})
    assert (response.status, response.close) == (405, True)
    response, _, _ = _handle(app, "PUT", "/predict", {"content-length": "0"})
    assert (response.status, response.close) == (405, False)


def _parse_exposition(text):
    """Prometheus text format 0.0.4 -> ({family: (type, help)}, {sample with labels: value}), checking its grammar."""
    assert text.endswith("\n")
    families, samples = {}, {}
    sample_re = re.compile(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*",?)*\})? (\S+)')
    current = None
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, help_text = line[7:].partition(" ")
            assert name not in families, f"{name} described twice"
            families[name] = [None, help_text]
            current = name
        elif line.startswith("# TYPE "):
            name, _, kind = line[7:].partition(" ")
            assert name == current and kind in ("counter", "gauge", "histogram"), line
            families[name][0] = kind
        else:
            match = sample_re.fullmatch(line)
            assert match, f"not a sample line: {line!r}"
            name = match.group(1)
            base = re.sub(r"_(bucket|sum|count)$", "", name) if families.get(current, [None])[0] == "histogram" else name
            assert base == current, f"{name} outside its family {current}"
            key = name + (match.group(2) or "")
            assert key not in samples, f"{key} twice"
            value = match.group(3)
            samples[key] = float("inf") if value == "+Inf" else float(value)
    for name, (kind, _) in families.items():
        assert kind is not None, f"{name} has no TYPE line"
        if kind == "counter":
            assert name.endswith("_total"), name
    return {name: tuple(v) for name, v in families.items()}, samples


def test_metrics_exposition_counts_exactly():
    app = serve.App(_FakeModel())
    body = json.dumps({"inputs": [[1.0] * serve.N_INPUTS]}).encode()
    for _ in range(5):
        assert _handle(app, "POST", "/predict", _predict_headers(body), body)[0].status == 200
    assert _handle(app, "POST", "/predict", _predict_headers(b"[1]"), b"[1]")[0].status == 400
    for _ in range(2):
        assert _handle(app, "GET", "/healthz")[0].status == 200
    assert _handle(app, "DELETE", "/healthz")[0].status == 405
    assert _handle(app, "BREW", "/nowhere")[0].status == 404

    response, _, _ = _handle(app, "GET", "/metrics")
    assert response.status == 200
    assert dict(response.headers)["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    families, samples = _parse_exposition(response.body.decode())
    ftjit_values = {
        "ftjit_cache_hits_total": 7, "ftjit_cache_misses_total": 2, "ftjit_compiles_total": 2,
        "ftjit_compile_failures_total": 0, "ftjit_compile_waits_total": 1, "ftjit_compile_seconds_total": 0.5,
        "ftjit_compile_wait_seconds_total": 0.25, "ftjit_cache_evictions_total": 0, "ftjit_cache_entries": 2,
    }  # fmt: skip
    for name, value in ftjit_values.items():
        assert samples[name + '{function="fake_mlp"}'] == value, name
        assert families[name][0] == ("gauge" if name == "ftjit_cache_entries" else "counter")
    assert families["ftjit_live_functions"][0] == "gauge"
    requests = {k: v for k, v in samples.items() if k.startswith("http_requests_total")}
    assert requests == {
        'http_requests_total{handler="/predict",method="POST",code="200"}': 5,
        'http_requests_total{handler="/predict",method="POST",code="400"}': 1,
        'http_requests_total{handler="/healthz",method="GET",code="200"}': 2,
        'http_requests_total{handler="/healthz",method="DELETE",code="405"}': 1,
        'http_requests_total{handler="other",method="OTHER",code="404"}': 1,
    }  # the scrape itself is counted once answered: not in its own answer
    assert families["http_request_duration_seconds"][0] == "histogram"
    for handler, count in (("/predict", 6), ("/healthz", 3), ("other", 1)):
        buckets = [samples[f'http_request_duration_seconds_bucket{{handler="{handler}",le="{le}"}}']
                   for le in [repr(b) for b in serve.LATENCY_BUCKETS] + ["+Inf"]]
        assert buckets == sorted(buckets) and buckets[-1] == count, handler
        assert samples[f'http_request_duration_seconds_count{{handler="{handler}"}}'] == count
        assert samples[f'http_request_duration_seconds_sum{{handler="{handler}"}}'] >= 0
    # The next scrape counts the first.
    _, samples = _parse_exposition(_handle(app, "GET", "/metrics")[0].body.decode())
    assert samples['http_requests_total{handler="/metrics",method="GET",code="200"}'] == 1
    assert samples['http_request_duration_seconds_count{handler="/metrics"}'] == 1


def test_metrics_label_values_are_escaped():
    family = serve.MetricFamily("x_total", "counter", "help", (("", (("path", 'a"b\\c\nd'),), 1),))
    assert family.render() == '# HELP x_total help\n# TYPE x_total counter\nx_total{path="a\\"b\\\\c\\nd"} 1'


def test_wsgi_callable_is_the_same_app():
    app = serve.App(_FakeModel())
    body = json.dumps({"inputs": [[1.0] * serve.N_INPUTS]}).encode()
    started = []

    def call(method, path, body=b"", **extra):
        environ = {"REQUEST_METHOD": method, "PATH_INFO": path, "QUERY_STRING": "x=1", "wsgi.input": io.BytesIO(body), **extra}
        result = app(environ, lambda status, headers: started.append((status, dict(headers))))
        return started[-1][0], started[-1][1], b"".join(result)

    status, headers, data = call("POST", "/predict", body, CONTENT_TYPE="application/json", CONTENT_LENGTH=str(len(body)))
    assert (status, json.loads(data)) == ("200 OK", {"outputs": [[2.0] * serve.N_OUTPUTS]})
    status, headers, data = call("POST", "/predict", body, CONTENT_TYPE="text/plain", CONTENT_LENGTH=str(len(body)))
    assert status == "415 Unsupported Media Type"
    status, headers, data = call("HEAD", "/predict")
    assert (status, headers["Allow"], data) == ("405 Method Not Allowed", "POST", b"")
    status, headers, data = call("GET", "/healthz")
    assert (status, json.loads(data)) == ("200 OK", {"ok": True})


# --- the servers over the wire -----------------------------------------------------------------------------------


def _exchange(port, data, timeout=30):
    """Sends raw bytes on a fresh connection; (status, headers, body, closed after) of the one answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        response = http.client.HTTPResponse(sock, method=data.split(b" ", 1)[0].decode())
        response.begin()
        body = response.read()
        return response.status, dict(response.getheaders()), body, response.will_close


@pytest.fixture(params=SERVERS)
def any_server(request):
    """A server of each kind with max_batch=8 (buckets 1, 2, 4, 8), serving in a background thread."""
    running = serve.serve_in_thread(max_batch=8, warmup_workers=2, server=request.param)
    yield running
    running.shutdown(timeout=30)


@starts_servers
@pytest.mark.timeout(120)
def test_http_method_and_path_rules_over_the_wire(any_server):
    port = any_server.port
    for method, path, allow in (("HEAD", "/predict", "POST"), ("PUT", "/predict", "POST"),
                                ("DELETE", "/predict", "POST"), ("GET", "/predict", "POST"),
                                ("PUT", "/healthz", "GET, HEAD"), ("DELETE", "/stats", "GET, HEAD")):  # fmt: skip
        status, headers, body, _ = _exchange(port, f"{method} {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert (status, headers["Allow"], headers["Content-Type"]) == (405, allow, "application/json"), (method, path)
        expected = {"error": f"method {method} is not allowed on {path} (allowed: {allow})"}
        assert int(headers["Content-Length"]) == len(json.dumps(expected).encode())
        assert body == (b"" if method == "HEAD" else json.dumps(expected).encode())
    status, headers, body, _ = _exchange(port, b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (status, body, headers["Content-Length"]) == (200, b"", str(len(b'{"ok": true}')))
    assert _request(port, "GET", "/healthz?x=1") == (200, {"ok": True})
    assert _request(port, "GET", "/healthz?") == (200, {"ok": True})
    assert _request(port, "GET", "/nowhere?x=1") == (404, {"error": "no such path: /nowhere"})
    body = _predict_body(_rows(2))
    request = b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n" % len(body)
    status, _, answer, _ = _exchange(port, request + body)
    assert (status, json.loads(answer)) == (415, {"error": "Content-Type must be application/json, got 'text/plain'"})
    request = b"POST /predict?debug=1 HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
    status, _, answer, _ = _exchange(port, request % len(body) + body)
    assert status == 200 and len(json.loads(answer)["outputs"]) == 2


@starts_servers
@pytest.mark.timeout(120)
def test_metrics_endpoint_counts_exactly_over_the_wire(any_server):
    port = any_server.port
    for rows in (1, 3, 5, 8, 2):
        assert _request(port, "POST", "/predict", _predict_body(_rows(rows)))[0] == 200
    assert _request(port, "GET", "/healthz")[0] == 200
    assert _request(port, "PUT", "/predict")[0] == 405

    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.request("GET", "/metrics")
    response = connection.getresponse()
    text = response.read().decode()
    connection.close()
    assert response.status == 200
    assert response.getheader("Content-Type") == "text/plain; version=0.0.4; charset=utf-8"
    families, samples = _parse_exposition(text)
    info = any_server.model.fn.cache_info()
    assert (info.hits, info.compiles, info.misses) == (5, 4, 4)
    expected = {
        'ftjit_cache_hits_total{function="mlp"}': 5,
        'ftjit_cache_misses_total{function="mlp"}': 4,
        'ftjit_compiles_total{function="mlp"}': 4,
        'ftjit_compile_waits_total{function="mlp"}': info.waits,
        'ftjit_compile_failures_total{function="mlp"}': 0,
        'ftjit_cache_entries{function="mlp"}': 4,
        'http_requests_total{handler="/predict",method="POST",code="200"}': 5,
        'http_requests_total{handler="/predict",method="PUT",code="405"}': 1,
        'http_requests_total{handler="/healthz",method="GET",code="200"}': 1,
        'http_request_duration_seconds_count{handler="/predict"}': 6,
        'http_request_duration_seconds_bucket{handler="/predict",le="+Inf"}': 6,
    }
    assert {k: samples[k] for k in expected} == expected
    assert samples['ftjit_compile_seconds_total{function="mlp"}'] == pytest.approx(info.compile_seconds)
    assert len([k for k in samples if k.startswith("http_requests_total")]) == 3
    transport = {name for name in families if name.startswith("serve_")}
    if any_server.server.__class__.__name__ == "InferenceServer":
        assert transport == {
            "serve_connections_open", "serve_connections_max", "serve_worker_threads",
            "serve_connections_rejected_total", "serve_request_timeouts_total", "serve_client_disconnects_total",
        }  # fmt: skip
        assert samples["serve_connections_max"] == serve.MAX_CONNECTIONS
        assert samples["serve_connections_rejected_total"] == samples["serve_request_timeouts_total"] == 0
    else:
        assert transport == set()


@starts_servers
@pytest.mark.timeout(120)
def test_malformed_requests_get_a_json_status(running):
    port = running.port
    cases = [
        (b"GARBAGE\r\n\r\n", 400),
        (b"GET /healthz HTTP/9.9\r\nHost: x\r\n\r\n", 505),
        (b"GET /healthz HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 70000 + b"\r\n\r\n", 431),
        (b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\n\r\n", 414),
        (b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 501),
    ]  # fmt: skip
    for data, status in cases:
        got, headers, body, will_close = _exchange(port, data)
        assert (got, headers["Content-Type"], will_close) == (status, "application/json", True), data[:40]
        assert isinstance(json.loads(body)["error"], str) and json.loads(body)["error"]
    assert _request(port, "GET", "/healthz") == (200, {"ok": True})


def _serve_threads():
    """Names of the stdlib server's pool threads alive now (idle: serve-worker-N; serving: connection-PORT)."""
    return [t.name for t in threading.enumerate() if t.name.startswith(("serve-worker-", "connection-"))]


def _read_answer(sock):
    response = http.client.HTTPResponse(sock)
    response.begin()
    return response.status, dict(response.getheaders()), response.read()


@starts_servers
@pytest.mark.timeout(120)
def test_connections_over_the_limit_get_503_and_threads_stay_bounded():
    # 12 idle connections against max_connections=4: 4 hold a pool thread each (their request
    # deadline is far off), the 8 others are refused with a 503 at once, by one helper thread.
    running = serve.serve_in_thread(max_batch=2, warmup_workers=1, max_connections=4, request_timeout=60)
    port = running.port
    with LogCapture("refused", logger_name="serve") as log:
        connections = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(12)]
        try:
            for sock in connections[4:]:  # accepted in the order they connected
                status, headers, body = _read_answer(sock)
                assert (status, headers["Connection"], headers["Retry-After"]) == (503, "close", "1")
                assert json.loads(body) == {"error": "too many connections (the limit is 4); retry later"}
            assert running.server.worker_threads() == 4
            assert len(_serve_threads()) == 4
            assert wait_for(lambda: len(log.records) == 8, timeout=30)
            assert all(r.levelname == "WARNING" and r.exc_info is None for r in log.records)
            assert all(r.getMessage().endswith("refused: 4 connections open (--max-connections): answered 503")
                       for r in log.records)  # fmt: skip
        finally:
            for sock in connections:
                sock.close()
        # The 4 admitted connections closed: the pool serves new ones, with no new threads.
        assert wait_for(lambda: running.server.app.render_metrics().count("serve_connections_open 0\n") == 1, timeout=30)
        assert _request(port, "GET", "/healthz") == (200, {"ok": True})
        assert running.server.worker_threads() == 4
        text = running.server.app.render_metrics()
        assert "serve_connections_rejected_total 8\n" in text and "serve_worker_threads 4\n" in text
    running.shutdown(timeout=30)
    assert _serve_threads() == []


@starts_servers
@pytest.mark.timeout(120)
def test_a_request_that_does_not_arrive_in_time_gets_408_and_one_warning_line():
    running = serve.serve_in_thread(max_batch=2, warmup_workers=1, request_timeout=0.5)
    try:
        with LogCapture("", logger_name="serve") as log:
            cases = [
                (b"", "waiting for the request line"),
                (b"POST /predict HTTP/1.1\r\nHost: x\r\n", "reading the headers"),
                (b"POST /predict HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{", "reading the body"),
            ]  # fmt: skip
            for data, phase in cases:
                with socket.create_connection(("127.0.0.1", running.port), timeout=30) as sock:
                    peer = "%s:%d" % sock.getsockname()
                    sock.sendall(data)
                    status, headers, body = _read_answer(sock)  # 30 s: a hang guard, the deadline is 0.5 s
                    assert (status, headers["Connection"]) == (408, "close"), phase
                    assert json.loads(body) == {"error": "the request did not arrive within 0.5 s"}
                    assert sock.recv(1) == b""  # and closed
                mine = [r for r in log.records if r.getMessage().startswith(peer + ":")]
                assert [(r.levelname, r.getMessage(), r.exc_info) for r in mine] == [
                    ("WARNING", f"{peer}: request not received within 0.5 s ({phase}): answered 408, connection closed", None)
                ]
        assert "serve_request_timeouts_total 3\n" in running.server.app.render_metrics()
    finally:
        running.shutdown(timeout=30)


@starts_servers
@pytest.mark.timeout(120)
def test_a_trickling_request_is_cut_at_its_deadline():
    # One header byte every 0.05 s renews no timeout: the whole request has 0.5 s.
    running = serve.serve_in_thread(max_batch=2, warmup_workers=1, request_timeout=0.5)
    try:
        with socket.create_connection(("127.0.0.1", running.port), timeout=30) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nX-Slow: ")
            t0 = time.monotonic()
            answered = threading.Event()

            def trickle():
                while not answered.is_set() and time.monotonic() - t0 < 60:
                    try:
                        sock.sendall(b"a")
                    except OSError:
                        return
                    time.sleep(0.05)

            sender = threading.Thread(target=trickle, daemon=True)
            sender.start()
            try:
                status, _, _ = _read_answer(sock)
            finally:
                answered.set()
                sender.join(30)
            assert status == 408
            assert time.monotonic() - t0 < 30  # generous: cut at ~0.5 s, not when the client stops
    finally:
        running.shutdown(timeout=30)


@starts_servers
@pytest.mark.timeout(120)
def test_an_idle_keepalive_connection_is_closed_after_the_idle_timeout():
    running = serve.serve_in_thread(max_batch=2, warmup_workers=1, idle_timeout=0.3)
    try:
        with LogCapture("idle for", logger_name="serve") as log:
            connection = http.client.HTTPConnection("127.0.0.1", running.port, timeout=30)
            connection.request("GET", "/healthz")
            response = connection.getresponse()
            assert response.status == 200 and not response.will_close
            response.read()
            assert connection.sock.recv(1) == b""  # closed by the server (30 s: a hang guard)
            connection.close()
            assert wait_for(lambda: len(log.records) == 1, timeout=30)
            assert log.records[0].levelname == "DEBUG"
    finally:
        running.shutdown(timeout=30)


@starts_servers
@pytest.mark.timeout(120)
def test_a_client_reset_logs_one_line_and_no_traceback(running, capfd):
    with LogCapture("", logger_name="serve") as log:
        sock = socket.create_connection(("127.0.0.1", running.port), timeout=30)
        peer = "%s:%d" % sock.getsockname()
        sock.sendall(b"POST /predict HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
        assert wait_for(lambda: running.server.app.render_metrics().count("serve_connections_open 1\n"), timeout=30)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()  # with SO_LINGER 0: a reset, in the middle of the body
        assert wait_for(lambda: [r for r in log.records if r.getMessage().startswith(peer)], timeout=30)
        assert wait_for(lambda: "serve_connections_open 0\n" in running.server.app.render_metrics(), timeout=30)
        mine = [r for r in log.records if r.getMessage().startswith(peer)]
    assert [(r.levelname, r.getMessage(), r.exc_info) for r in mine] == [
        ("INFO", f"{peer}: client disconnected (ConnectionResetError) reading the body", None)
    ]
    assert "Traceback" not in capfd.readouterr().err
    assert "serve_client_disconnects_total 1\n" in running.server.app.render_metrics()
    assert _request(running.port, "GET", "/healthz") == (200, {"ok": True})


@starts_servers
@pytest.mark.timeout(180)
@pytest.mark.parametrize("server", SERVERS)
def test_200_clients_connecting_at_once_are_all_answered(server):
    # A backlog of 5 reset some of these connections; 128 (and a pool of 256) answers all.
    running = serve.serve_in_thread(max_batch=2, warmup_workers=1, server=server)
    try:
        body = _predict_body(_rows(2))

        def client(i):
            return _request(running.port, "POST", "/predict", body)[0]

        assert run_threads(200, client, timeout=120) == [200] * 200
        assert running.model.fn.cache_info().hits == 200
    finally:
        running.shutdown(timeout=30)


@starts_servers
@pytest.mark.timeout(120)
@pytest.mark.parametrize("server", SERVERS)
def test_shutdown_answers_the_request_in_flight(server):
    running = serve.serve_in_thread(max_batch=2, warmup_workers=1, server=server)
    entered, release = threading.Event(), threading.Event()
    predict = running.model.predict

    def slow_predict(x):
        entered.set()
        assert release.wait(60)
        return predict(x)

    running.model.predict = slow_predict
    answers = []
    client = threading.Thread(
        target=lambda: answers.append(_request(running.port, "POST", "/predict", _predict_body(_rows(1)))), daemon=True
    )
    client.start()
    stopper = None
    try:
        assert entered.wait(30)
        stopper = threading.Thread(target=running.shutdown, kwargs={"timeout": 60}, daemon=True)
        stopper.start()
        assert wait_for(lambda: not running.thread.is_alive(), timeout=30)  # no longer serving
    finally:
        release.set()
        client.join(30)
        if stopper is not None:
            stopper.join(60)
    assert not client.is_alive() and stopper is not None and not stopper.is_alive()
    assert len(answers) == 1 and answers[0][0] == 200 and len(answers[0][1]["outputs"]) == 1
    assert running.server.hung_handlers == []
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", running.port), timeout=5).close()


@starts_servers
@needs_waitress
@pytest.mark.timeout(120)
def test_waitress_load_is_answered_correctly_with_the_gil_off():
    with serve.serve_in_thread(max_batch=8, warmup_workers=2, server="waitress", threads=4) as running:
        assert type(running.server).__name__ == "WaitressServer"
        report = load.run_load(running.port, threads=4, requests=200, seconds=None, seed=2, max_batch=8, progress=False)
        gil_under_load = sys._is_gil_enabled() if hasattr(sys, "_is_gil_enabled") else True
    assert (report.requests, report.errors, report.wrong) == (200, 0, 0), report.first_error
    assert report.compiles == 4
    info = running.model.fn.cache_info()
    assert (info.hits, info.compiles) == (200, 4)
    if sysconfig.get_config_var("Py_GIL_DISABLED"):
        assert gil_under_load is False  # waitress (pure Python) keeps the free-threaded build's GIL off


@needs_waitress
@starts_servers
@pytest.mark.timeout(120)
def test_waitress_answers_a_too_big_body_413():
    with serve.serve_in_thread(max_batch=2, warmup_workers=1, server="waitress") as running:
        # waitress refuses it itself, before the app, in text/plain.
        huge = b"[" * (running.server.max_body_bytes + 1)
        request = b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
        status, _, _, _ = _exchange(running.port, request % len(huge) + huge)
        assert status == 413
        status, body = _request(running.port, "POST", "/predict", _predict_body(_rows(3)))  # under max_body_bytes
        assert (status, body) == (413, {"error": "batch of 3 rows exceeds max_batch=2"})  # the app's JSON


def test_make_server_rejects_bad_settings():
    with pytest.raises(ValueError, match="server must be one of stdlib, waitress"):
        serve.make_server(server="gunicorn")
    with pytest.raises(ValueError, match="max_connections must be a positive int"):
        serve.make_server(max_connections=0)
    with pytest.raises(ValueError, match="request_timeout must be a positive number of seconds"):
        serve.make_server(request_timeout=0)
    with pytest.raises(ValueError, match="idle_timeout must be a positive number of seconds"):
        serve.make_server(idle_timeout=float("inf"))


@starts_servers
@needs_waitress
@pytest.mark.timeout(120)
def test_demo_script_serves_with_waitress_too():
    demo = str(REPO / "examples" / "demo.py")
    command = [sys.executable, demo, "--threads", "2", "--requests", "50", "--max-batch", "8", "--server", "waitress"]
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"^requests +50$", proc.stdout, re.M) and re.search(r"^errors +0$", proc.stdout, re.M)
    assert proc.stdout.strip().splitlines()[-1].startswith("PASS: 50 requests answered correctly by 2 threads (waitress server)")
    assert "Task queue depth" not in proc.stderr


def test_at_most_every_lets_one_record_through_per_interval_and_counts_the_rest():
    """waitress's per-request 'Task queue depth' warning becomes one line per interval, saying how many were dropped."""
    now = [100.0]
    limiter = serve.AtMostEvery(10.0, clock=lambda: now[0])

    def record(depth: int) -> logging.LogRecord:
        return logging.LogRecord("waitress.queue", logging.WARNING, __file__, 1, "Task queue depth is %d", (depth,), None)

    first = record(1)
    assert limiter.filter(first) is True
    assert first.getMessage() == "Task queue depth is 1"  # nothing dropped yet: the message is untouched
    now[0] += 9.9
    assert [limiter.filter(record(d)) for d in range(2, 6)] == [False] * 4
    now[0] += 0.1  # 10 s after the first: the next one passes and counts the 4 dropped
    passed = record(6)
    assert limiter.filter(passed) is True
    assert passed.getMessage() == "Task queue depth is 6 (4 more like it in the last 10 s not logged)"
    now[0] += 10.0
    again = record(7)
    assert limiter.filter(again) is True
    assert again.getMessage() == "Task queue depth is 7"  # the count started over


@needs_waitress
def test_waitress_servers_share_one_queue_warning_limiter():
    for _ in range(3):
        serve._quiet_waitress_queue()
    limiters = [f for f in logging.getLogger("waitress.queue").filters if isinstance(f, serve.AtMostEvery)]
    assert len(limiters) == 1
    assert limiters[0].seconds == 10.0
