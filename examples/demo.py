"""The end-to-end demo: serve the MLP in-process, load it, check it, print one summary table.

Starts examples/serve.py's server on an ephemeral loopback port (every batch
bucket compiled by the warmup), runs examples/load.py's load generator
against it, reads ``/stats``, shuts the server down, then times the warm-up
of fresh copies of the MLP with one worker and with ``--warmup-workers``
(XLA compiles release the GIL, so the threads overlap them), and prints one
table and a verdict. The exit code is 1 if any request failed or was
answered wrongly, or if the MLP compiled anything but exactly one signature
per bucket, all during warmup.

Run it as ``python examples/demo.py [--threads 8] [--requests 8000] [--seconds 15]``
(the defaults take ~10-20 s on two cores; the load stops at whichever limit
comes first). ``--server waitress`` serves the same app under waitress
instead of the standard library's server (see docs/serving.md).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from typing import Any

if __package__ in (None, ""):  # run as a script: make the ``examples`` package importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from examples.load import fetch_json, format_rows, run_load
from examples.serve import DEFAULT_MAX_BATCH, SERVERS, Model, mlp, serve_in_thread


def _say(message: str) -> None:
    """A progress line on stderr (the summary table goes to stdout)."""
    print(f"demo: {message}", file=sys.stderr, flush=True)


def _fresh_mlp(name: str) -> Any:
    """A new function object computing ``mlp``: JAX caches traces per function, so a copy compiles from scratch."""

    def fresh(params: Any, x: Any) -> Any:
        return mlp(params, x)

    fresh.__name__ = fresh.__qualname__ = name
    return fresh


def compare_warmup(max_batch: int, workers: int) -> tuple[float, float]:
    """Wall seconds to warm every bucket of a fresh MLP copy with 1 worker, then another with ``workers``."""
    seconds = []
    for n in (1, workers):
        report = Model(max_batch=max_batch, fun=_fresh_mlp(f"mlp_warm_{n}")).warm(workers=n)
        if not report.ok:
            raise RuntimeError(f"warmup failed:\n{report}")
        seconds.append(report.wall_seconds)
    return seconds[0], seconds[1]


def main(argv: list[str] | None = None) -> int:
    """Runs the demo; returns the exit code (0: every check passed)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=8, help="load threads (default: 8)")
    parser.add_argument("--requests", type=int, default=8000, help="total requests (default: 8000)")
    parser.add_argument("--seconds", type=float, default=15.0, help="load time limit in seconds (default: 15)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random batches (default: 0)")
    parser.add_argument("--max-batch", type=int, default=DEFAULT_MAX_BATCH, help="largest batch (default: 32)")
    parser.add_argument("--warmup-workers", type=int, default=4, help="warmup compile threads (default: 4)")
    parser.add_argument("--server", choices=SERVERS, default="stdlib", help="the HTTP server (default: stdlib)")
    args = parser.parse_args(argv)

    # waitress warns "Task queue depth is N" each time a request waits for a busy worker: under a load
    # test that is every few requests, and the table reports the latency it adds.
    logging.getLogger("waitress.queue").setLevel(logging.ERROR)
    t0 = time.monotonic()
    _say(f"starting the server: compiling every batch bucket up to {args.max_batch} "
         f"with {args.warmup_workers} warm-up worker(s)")
    try:
        running = serve_in_thread(max_batch=args.max_batch, warmup_workers=args.warmup_workers, server=args.server)
    except ImportError as exc:
        parser.error(f"--server {args.server} needs {exc.name}: pip install 'ftjit[serve]'")
    except ValueError as exc:
        parser.error(str(exc))
    try:
        compiles_after_warmup = running.model.fn.cache_info().compiles
        _say(f"server ready on 127.0.0.1:{running.port} after {time.monotonic() - t0:.1f} s; "
             f"loading it from {args.threads} threads ({args.requests} requests or {args.seconds:g} s)")
        try:
            report = run_load(running.port, args.threads, args.requests, args.seconds, args.seed, args.max_batch)
        except ValueError as exc:
            parser.error(str(exc))
        status, stats = fetch_json("127.0.0.1", running.port, "/stats")
    finally:
        shutdown_problem = None
        try:
            running.shutdown()
        except TimeoutError as exc:  # a hung request handler: reported below, not hung on
            shutdown_problem = str(exc)
    if status != 200:
        print(f"FAIL: GET /stats answered HTTP {status}")
        return 1
    _say(f"server stopped; timing warm-up with 1 and {args.warmup_workers} worker(s) on fresh copies of the model")
    loop_seconds, parallel_seconds = compare_warmup(args.max_batch, args.warmup_workers)
    _say(f"done in {time.monotonic() - t0:.1f} s")

    info = stats["function"]["cache_info"]
    buckets = stats["buckets"]
    warmup = stats["warmup"]
    workers = args.warmup_workers
    rows = [
        ("requests", str(report.requests)),
        ("stopped by", report.stopped_by),
        ("req/s", f"{report.rps:.1f}"),
        ("p50 ms", f"{report.p50_ms:.2f}"),
        ("p99 ms", f"{report.p99_ms:.2f}"),
        ("max ms", f"{report.max_ms:.2f}"),
        ("errors", str(report.errors)),
        ("wrong answers", str(report.wrong)),
        ("buckets", str(len(buckets))),
        ("compiles", str(info["compiles"])),
        ("hits", str(info["hits"])),
        ("waits", str(info["waits"])),
        ("compile seconds", f"{info['compile_seconds']:.3f}"),
        ("warmup seconds", f"{warmup['wall_seconds']:.3f}"),
        ("fresh warmup s, 1 worker", f"{loop_seconds:.3f}"),
        (f"fresh warmup s, {workers} worker{'s' * (workers > 1)}", f"{parallel_seconds:.3f}"),
        ("warmup speed-up", f"{loop_seconds / parallel_seconds:.2f}x"),
    ]
    print(format_rows(rows))

    problems = []
    if report.requests == 0:
        problems.append("no request was answered")
    if shutdown_problem is not None:
        problems.append(f"the server did not shut down cleanly ({shutdown_problem})")
    if report.errors:
        problems.append(f"{report.errors} failed request(s) (first: {report.first_error})")
    if report.wrong:
        problems.append(f"{report.wrong} wrong answer(s) (first: {report.first_error})")
    if info["compiles"] != len(buckets):
        problems.append(f"{info['compiles']} compiles for {len(buckets)} buckets")
    if info["compiles"] != compiles_after_warmup:
        problems.append(f"{info['compiles'] - compiles_after_warmup} compile(s) under load, after warmup")
    if problems:
        print("FAIL: " + "; ".join(problems))
        return 1
    print(
        f"PASS: {report.requests} requests answered correctly by {args.threads} threads ({args.server} server); "
        f"{len(buckets)} buckets compiled once each, all during warmup"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
