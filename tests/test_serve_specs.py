"""examples/serve.py --specs FILE (issue 28): a restart warms up the signatures the last run compiled.

In this process, through serve.Model (these run 8 at once under pytest-run-parallel): the saved
signatures, and only they, are compiled by the warm-up, and a damaged file is a line of the warm-up
report while /healthz still answers 200. Over the wire, examples/serve.py under waitress in child
processes (thread_unsafe: processes and ports): the file is written periodically and at SIGTERM, a
restart from it compiles nothing during traffic (exact /stats and /metrics counts), and a corrupted
file still lets the server start and answer, the error said once. Nothing asserts on speed; timeouts
are hang guards. The over-the-wire tests skip where TCP on 127.0.0.1 is refused.
"""

import http.client
import json
import signal
import sys
from pathlib import Path

import numpy as np
import pytest

import ftjit
from helpers import require_module, require_tcp, wait_for

for _name in ("waitress", "prometheus_client"):  # the serve extra (see tests/test_serve.py)
    require_module(_name, "examples/serve.py and these tests of it need it", module_level=True)

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # ``examples`` is a package at the repository root, not installed
    sys.path.insert(0, str(REPO))

from examples import load, serve  # noqa: E402
from examples.demo import ServerProcess  # noqa: E402

starts_servers = pytest.mark.thread_unsafe(reason="starts server processes on ports and counts their compiles")
#: The key of serve.py's MLP in a file that serve.py wrote, run as a script.
SCRIPT_KEY = "__main__:mlp"
GARBAGE = b"\x80\x05 this is not a specs file"


def _rows(n, seed=0):
    return np.random.default_rng(seed).standard_normal((n, serve.N_INPUTS)).astype(np.float32)


def _request(port, method, path, rows=None):
    """One request on a fresh connection: (status, body: decoded JSON, or text for /metrics)."""
    body = None if rows is None else json.dumps({"inputs": rows.tolist()})
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request(method, path, body, {"Content-Type": "application/json"} if body is not None else {})
        response = connection.getresponse()
        data = response.read().decode()
        return response.status, (data if path == "/metrics" else json.loads(data))
    finally:
        connection.close()


def _predict(port, n, seed=0):
    """POST /predict with ``n`` rows; checks the answer against the numpy reference."""
    x = _rows(n, seed)
    status, body = _request(port, "POST", "/predict", x)
    assert status == 200, body
    expected = load.reference_forward(serve.make_weights(), x)
    np.testing.assert_allclose(body["outputs"], expected, rtol=load.RTOL, atol=load.ATOL)


def _saved_signatures(path):
    saved = ftjit.load_specs(path)
    assert saved.error is None, saved.error
    assert list(saved.functions) == [SCRIPT_KEY]
    return sorted(entry["signature"] for entry in saved.functions[SCRIPT_KEY])


def _stop(server):
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


@starts_servers
@pytest.mark.timeout(300)
def test_a_restart_with_specs_compiles_nothing_during_traffic(tmp_path, monkeypatch):
    require_tcp("examples/serve.py's server")
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")  # the servers must not open this process's accelerator
    path = tmp_path / "specs"
    flags = ("--max-batch", "8", "--threads", "4", "--warmup-workers", "2", "--no-bucket-warmup", "--specs", str(path))
    # First run: no file yet, nothing warmed up; traffic of 1 and 3 rows compiles buckets 1 and 4. The
    # file is written every 0.002 minutes (0.12 s) while it runs.
    server = ServerProcess(*flags, "--specs-every", "0.002")
    try:
        assert "warmup: nothing to compile before listening" in server.output
        for n in (1, 3):
            _predict(server.port, n)
        _, stats = _request(server.port, "GET", "/stats")
        compiled = sorted(s["signature"] for s in stats["function"]["signatures"])
        assert len(compiled) == 2 and stats["warmup"] is None
        assert wait_for(lambda: path.exists() and _saved_signatures(path) == compiled, timeout=120)
    finally:
        output = _stop(server)
    assert output.rstrip().endswith(f"INFO serve: wrote 2 signature(s) to {path} (left out: none)")

    # Restart from the file: both signatures compile before the port opens, none during traffic.
    server = ServerProcess(*flags)
    try:
        assert server.output.index("warmup: 2/2 ok") < server.output.index("serving on http://127.0.0.1:")
        for i, n in enumerate((1, 3, 4, 1)):  # buckets 1 and 4 only: the saved ones
            _predict(server.port, n, seed=i)
        _, stats = _request(server.port, "GET", "/stats")
        info = stats["function"]["cache_info"]
        assert (info["compiles"], info["misses"], info["hits"], info["failures"]) == (2, 2, 4, 0)
        assert sorted(s["signature"] for s in stats["function"]["signatures"]) == compiled
        assert [r["compiled"] for r in stats["warmup"]["results"]] == [True, True]
        _, metrics = _request(server.port, "GET", "/metrics")
        families = {f.name: f for f in text_string_to_metric_families(metrics)}
        assert [s.value for s in families["ftjit_compiles"].samples if s.name == "ftjit_compiles_total"] == [2]
        path.unlink()  # no --specs-every here: only the stop can write it again
    finally:
        _stop(server)
    assert _saved_signatures(path) == compiled


@starts_servers
@pytest.mark.timeout(300)
def test_a_corrupted_specs_file_still_lets_the_server_start_and_answer(tmp_path, monkeypatch):
    require_tcp("examples/serve.py's server")
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    path = tmp_path / "specs"
    path.write_bytes(GARBAGE)
    error = f"UnpicklingError: {ftjit.load_specs(path).error}"  # what the warm-up report says of it
    server = ServerProcess("--max-batch", "4", "--threads", "2", "--warmup-workers", "2", "--specs", str(path))
    try:
        assert server.output.index("warmup: 3/4 ok") < server.output.index("serving on http://127.0.0.1:")
        assert _request(server.port, "GET", "/healthz") == (200, {"ok": True})
        for n in (1, 2, 3):
            _predict(server.port, n)
        _, stats = _request(server.port, "GET", "/stats")
        assert stats["function"]["cache_info"]["compiles"] == 3  # the buckets, all before listening
    finally:
        output = _stop(server)
    lines = [line for line in output.splitlines() if error in line]
    assert len(lines) == 1 and lines[0].startswith(f"<specs file {path}>"), output  # said once, in the report
    assert len(_saved_signatures(path)) == 3  # the stop replaced the damaged file with the buckets
