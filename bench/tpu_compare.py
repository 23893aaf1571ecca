"""examples/serve.py through ftjit.jit and through jax.jit, on a unix socket, at 1, 4 and 12 server threads: one table.

For a machine where no internet socket may be opened, not even on loopback (the TPU one). For each ``--jit``
(ftjit, jax) and each server ``--threads``, in turn (one server at a time: on a TPU only one process can open
the chip), it starts ``PYTHON examples/serve.py --unix-socket DIR/serve.sock --jit JIT --threads T``, waits
until its ``/healthz`` answers 200 through the socket, runs ``PYTHON examples/load.py --unix-socket
DIR/serve.sock`` with the same ``--threads``, ``--requests`` and ``--seed`` every time (every answer checked),
reads ``/stats``, and stops the server with SIGTERM (it must exit 0). Then it prints one table: requests/s,
p50 and p99 latency, errors and wrong answers (load.py's report), and the server's compiles during the traffic
(its compiles after the load minus its warm-up's; none counted under jax.jit).

serve.py and load.py run as files, by PYTHON (``--python``, default: this interpreter), so that they import
the ftjit of PYTHON's environment (installed from a wheel on the device) and not the clone's ``ftjit/``. This
module uses only the standard library (its package, ``bench``, imports ftjit). Each run's server output and load report are kept in the directory
printed at the end. The exit code is 1 if any run failed.

Run it from the clone's root as ``.venv/bin/python -m bench.tpu_compare [--requests 2000] [--load-threads 12]``
(docs/serving.md, "On a TPU").
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
COLUMNS = ("jit", "server threads/clients", "requests", "requests/s", "p50 ms", "p99 ms", "errors", "wrong",
           "compiles during traffic")  # fmt: skip


def get(sock: str, path: str, timeout: float = 30.0) -> tuple[int, bytes]:
    """``GET path`` over the unix socket ``sock``: (status, body). HTTP/1.0, so the server closes after answering."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout)
        conn.connect(sock)
        conn.sendall(f"GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n".encode())
        answer = b"".join(iter(lambda: conn.recv(65536), b""))
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(None, 2)[1]), body


def wait_healthy(proc: subprocess.Popen[Any], sock: str, timeout: float) -> float:
    """Seconds until ``/healthz`` answered 200 on ``sock``; RuntimeError if the server exits or ``timeout`` passes."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited ({proc.returncode}) before answering /healthz")
        try:
            if get(sock, "/healthz", 5.0)[0] == 200:
                return time.monotonic() - start
        except OSError:  # no socket file yet, or not accepting yet
            pass
        time.sleep(0.1)
    raise RuntimeError(f"/healthz did not answer 200 within {timeout:.0f} s")


def report_values(text: str) -> dict[str, str]:
    """load.py's printed report (rows of measure, value, meaning) as {measure: value}."""
    rows = (re.split(r"\s{2,}", line.strip()) for line in text.splitlines())
    return {row[0]: row[1] for row in rows if len(row) == 3}


def run_one(args: argparse.Namespace, jit: str, threads: int, workdir: str) -> list[str]:
    """One server (``jit``, ``threads``) under load: its row of the table (RuntimeError if it failed)."""
    sock, name = os.path.join(workdir, "serve.sock"), os.path.join(workdir, f"{jit}-{threads}")
    clients = threads if args.clients_follow_threads else args.load_threads
    serve = [args.python, os.path.join(EXAMPLES, "serve.py"), "--unix-socket", sock,
             "--jit", jit.removesuffix("-batch"), "--threads", str(threads), "--max-batch", str(args.max_batch),
             *(["--batch"] if jit.endswith("-batch") else [])]  # fmt: skip
    load = [args.python, os.path.join(EXAMPLES, "load.py"), "--unix-socket", sock, "--threads", str(clients),
            "--requests", str(args.requests), "--seconds", str(args.seconds), "--seed", str(args.seed),
            "--max-batch", str(args.rows or args.max_batch)]  # fmt: skip
    with open(f"{name}.server.log", "w") as log:
        proc = subprocess.Popen(serve, stdout=log, stderr=subprocess.STDOUT)
    try:
        ready = wait_healthy(proc, sock, args.start_timeout)
        print(f"tpu_compare: --jit {jit} --threads {threads}: healthy after {ready:.1f} s; loading", file=sys.stderr)
        done = subprocess.run(load, capture_output=True, text=True, timeout=args.seconds + 120)
        with open(f"{name}.load.txt", "w") as out:
            out.write(done.stdout + done.stderr)
        values = report_values(done.stdout)
        if "throughput" not in values:
            raise RuntimeError(f"load.py printed no report (exit code {done.returncode}): {done.stderr[-500:]}")
        status, body = get(sock, "/stats")
        stats = json.loads(body) if status == 200 else None
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
    if code != 0:
        raise RuntimeError(f"the server exited {code} after SIGTERM")
    traffic = "n/a"  # jax.jit counts no compiles
    if stats is not None and stats["function"]["cache_info"] is not None:
        warmup = stats["warmup"]["results"] if stats["warmup"] else []
        batched = stats.get("batched") or {}  # serve.py --batch: the batched function's compiles too
        traffic = str(stats["function"]["cache_info"]["compiles"] + batched.get("compiles", 0)
                      - sum(r["compiled"] for r in warmup))
    return [jit, f"{threads}/{clients}", values["requests"], values["throughput"].split()[0], values["latency p50"].split()[0],
            values["latency p99"].split()[0], values["errors"], values["wrong answers"], traffic]  # fmt: skip


def table(rows: list[list[str]]) -> str:
    """The rows under COLUMNS: the jit left-aligned, the numbers right-aligned."""
    widths = [max(len(row[i]) for row in (COLUMNS, *rows)) for i in range(len(COLUMNS))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(COLUMNS, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join([row[0].ljust(widths[0]), *(v.rjust(w) for v, w in zip(row[1:], widths[1:]))]) for row in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=sys.executable, help="runs serve.py and load.py (default: this one)")
    parser.add_argument("--jit", default="ftjit,jax",
                        help="serve.py --jit values, comma-separated: ftjit, jax, and ftjit-batch (--jit ftjit "
                             "--batch) (default: ftjit,jax)")
    parser.add_argument("--threads", default="1,4,12", help="serve.py --threads values, comma-separated")
    parser.add_argument("--load-threads", type=int, default=12, help="load.py --threads, its connections (default 12)")
    parser.add_argument("--clients-follow-threads", action="store_true",
                        help="load.py --threads equal to each serve.py --threads (one client per server thread)")
    parser.add_argument("--max-batch", type=int, default=32, help="serve.py --max-batch (default: 32)")
    parser.add_argument("--rows", type=int, help="load.py --max-batch: the most rows a request carries (default: "
                                                   "--max-batch; 1: one example per request)")
    parser.add_argument("--requests", type=int, default=2000, help="load.py --requests per run (default: 2000)")
    parser.add_argument("--seconds", type=float, default=60.0, help="load.py --seconds, per run (default: 60)")
    parser.add_argument("--seed", type=int, default=0, help="load.py --seed, the same for every run (default: 0)")
    parser.add_argument("--start-timeout", type=float, default=300.0, help="seconds a server may take to be healthy")
    args = parser.parse_args(argv)
    jits, threads = args.jit.split(","), [int(t) for t in args.threads.split(",")]
    if not set(jits) <= {"ftjit", "jax", "ftjit-batch"} or min(threads) < 1:
        parser.error("--jit takes ftjit, jax and ftjit-batch, --threads positive integers")
    workdir = tempfile.mkdtemp(prefix="tpu-compare-")  # short: a unix socket's path has at most 107 bytes
    rows, failed = [], 0
    for jit in jits:
        for n in threads:
            try:
                row = run_one(args, jit, n, workdir)
            except (RuntimeError, OSError, subprocess.TimeoutExpired, ValueError, KeyError) as exc:
                print(f"tpu_compare: --jit {jit} --threads {n} failed: {exc}", file=sys.stderr)
                row = [jit, str(n), "failed", *["-"] * (len(COLUMNS) - 3)]
            failed += row[2] == "failed" or row[6:8] != ["0", "0"]  # errors, wrong answers
            rows.append(row)
    clients = "as many threads as the server's" if args.clients_follow_threads else f"{args.load_threads} threads"
    print(f"python {args.python}; load.py: {args.requests} requests (or {args.seconds:g} s) of up to "
          f"{args.rows or args.max_batch} rows from {clients}, seed {args.seed}; every server on a unix socket\n")
    print(table(rows))
    print(f"\nservers' output and load reports: {workdir}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
