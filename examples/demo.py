"""The end-to-end demo: run examples/serve.py, load it, check every answer, print one report.

Starts ``examples/serve.py`` (its default front: granian where the GIL is
off, else waitress) in a child process on a free loopback port (it
compiles every batch bucket before it listens), loads it
from this process with ``examples/load.py``, stops it with SIGTERM (it must
exit 0), then times the warm-up of fresh copies of the MLP with one worker
and with ``--warmup-workers`` (XLA compiles release the GIL, so the threads
overlap them). It prints, first, the interpreter (path, version, GIL state),
then one table (measure, value with its unit, meaning) of the load
generator's report and the warm-up rows, then a verdict; the exit code is 1
if a request failed or was answered wrongly, if the MLP compiled anything
but one signature per bucket, all during warm-up, or if the server did not
stop cleanly.

Run it as ``.venv/bin/python examples/demo.py [--threads 8] [--requests 8000] [--seconds 15]``
(``bash dev.sh demo`` does; about 20 s on two cores; the load stops at
whichever limit comes first).
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import signal
import subprocess
import sys
import sysconfig
import threading
import time
from typing import Any, Sequence

import jax

import ftjit

if __package__ in (None, ""):  # run as a script: make the ``examples`` package importable
    # Appended, not first: the clone's root holds the source tree's ftjit/ too, which must not shadow an
    # ftjit installed into this interpreter's environment (pip install '/path/to/ftjit[serve]').
    sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from examples.load import format_rows, report_rows, run_load
from examples.serve import DEFAULT_MAX_BATCH, Model, batch_buckets, mlp

SERVE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "serve.py")


class ServerProcess:
    """``examples/serve.py --port 0 ARGS`` in a child process; returns once it listens (``port``).
    With ``unix_socket``, ``--unix-socket PATH`` instead of ``--port 0`` (``port`` stays None); ``env``: its
    environment (None: this process's); ``command``: another server that takes those flags and prints the same
    "serving on" line (None: serve.py).

    Its stdout and stderr (one stream) are collected in ``output``. Raises
    RuntimeError, with that output, if it exits or is silent for ``timeout``
    seconds before listening.
    """

    def __init__(self, *args: str, timeout: float = 120.0, unix_socket: str | None = None,
                 env: dict[str, str] | None = None, command: Sequence[str] | None = None):
        self.port: int | None = None
        self.unix_socket, self.listening = unix_socket, False
        self._lines: list[str] = []
        self._listening = threading.Event()
        where = ["--unix-socket", unix_socket] if unix_socket else ["--port", "0"]
        name = "examples/serve.py" if command is None else " ".join(command[1:])
        command = [sys.executable, SERVE] if command is None else list(command)
        self.proc = subprocess.Popen([*command, *where, *args], env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
        try:
            self._reader = threading.Thread(target=self._read, name="serve-output", daemon=True)
            self._reader.start()
            if not self._listening.wait(timeout) or not self.listening:
                raise RuntimeError(f"{name} did not start listening; its output:\n{self.output}")
        except BaseException:  # that, or Ctrl-C while it starts: no server is left behind
            self.stop(signal.SIGKILL)
            raise

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.append(line)
            match = re.fullmatch(r"serving on http://127\.0\.0\.1:(\d+)", line.strip())
            if match or line.strip() == f"serving on unix:{self.unix_socket}":
                self.port, self.listening = int(match.group(1)) if match else None, True
                self._listening.set()
        self._listening.set()  # the output ended: it exited

    @property
    def output(self) -> str:
        return "".join(self._lines)

    def stop(self, signum: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        """Sends ``signum`` and returns the exit code (killed after ``timeout`` seconds: a hang guard)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signum)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()
        finally:
            self._reader.join(timeout)


def _say(message: str) -> None:
    """A progress line on stderr (the report goes to stdout)."""
    print(f"demo: {message}", file=sys.stderr, flush=True)


def interpreter_lines() -> list[str]:
    """What the demo runs on: the interpreter's path, its version (and jax's and ftjit's), the GIL's state.

    The server is a child process of the same interpreter; its GIL state after the load is in the table."""
    free_threaded = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
    path = sys.executable
    if sys.prefix != sys.base_prefix:  # a venv: its python links to the interpreter it was made with
        path += f" (a venv of {os.path.realpath(sys.executable)})"
    version = f"{platform.python_implementation()} {platform.python_version()}"
    version += " (free-threaded build)" if free_threaded else ""
    if not free_threaded:
        gil = "on (not a free-threaded build; FTJIT_PYTHON=ft bash dev.sh demo runs on one)"
    elif getattr(sys, "_is_gil_enabled", lambda: True)():
        gil = "on: a free-threaded build, but the GIL was turned back on (PYTHON_GIL=1, or an extension not marked safe)"
    else:
        gil = "off (a free-threaded build: threads run Python code in parallel)"
    rows = [("interpreter", path), ("version", f"{version}, jax {jax.__version__}, ftjit {ftjit.__version__}"),
            ("GIL", gil)]  # fmt: skip
    return [f"{name.ljust(11)}  {value}" for name, value in rows]


def compare_warmup(max_batch: int, workers: int) -> tuple[float, float]:
    """Wall seconds to warm every bucket of a fresh MLP copy with 1 worker, then another with ``workers``."""
    seconds = []
    for n in (1, workers):

        def fresh(params: Any, x: Any) -> Any:  # a new function: no JAX cache has seen it, so it compiles
            return mlp(params, x)

        report = Model(max_batch, fun=fresh).warm(workers=n)
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
    parser.add_argument("--warmup-workers", type=int, default=4, help="warm-up compile threads (default: 4)")
    args = parser.parse_args(argv)
    if min(args.threads, args.requests, args.max_batch, args.warmup_workers) < 1 or args.seconds <= 0:
        parser.error("every option must be positive")

    print("\n".join(interpreter_lines()), flush=True)  # first: what this run is on
    t0 = time.monotonic()
    _say(f"starting examples/serve.py: it compiles every batch bucket up to {args.max_batch} "
         f"with {args.warmup_workers} warm-up worker(s), then listens")  # fmt: skip
    try:
        server = ServerProcess("--max-batch", str(args.max_batch), "--warmup-workers", str(args.warmup_workers))
    except RuntimeError as exc:
        print(f"FAIL: {exc}")
        return 1
    try:
        _say(f"server listening on 127.0.0.1:{server.port} after {time.monotonic() - t0:.1f} s; "
             f"loading it from {args.threads} threads ({args.requests} requests or {args.seconds:g} s)")  # fmt: skip
        report = run_load(server.port, args.threads, args.requests, args.seconds, args.seed, args.max_batch)
    finally:
        exit_code = server.stop(signal.SIGTERM)
    _say(f"server stopped (exit code {exit_code}); timing warm-up with 1 and {args.warmup_workers} worker(s) "
         "on fresh copies of the model")  # fmt: skip
    loop_seconds, parallel_seconds = compare_warmup(args.max_batch, args.warmup_workers)
    _say(f"done in {time.monotonic() - t0:.1f} s")

    workers, n_buckets = args.warmup_workers, len(batch_buckets(args.max_batch))
    front = re.search(r"^front: (\w+)$", server.output, re.M)
    print()
    print(format_rows(report_rows(report) + [
        ("HTTP front", front.group(1) if front else "?", "serve.py's default here: granian where the GIL is off, "
         "else waitress"),
        ("fresh warm-up, 1 worker", f"{loop_seconds:.3f} s",
         f"wall clock, the {n_buckets} buckets of a fresh model copy, one at a time"),
        (f"fresh warm-up, {workers} worker{'s' * (workers > 1)}", f"{parallel_seconds:.3f} s",
         f"the same on another fresh copy, {workers} compile{'s' * (workers > 1)} at once"),
        ("warm-up speed-up", f"{loop_seconds / parallel_seconds:.2f}x",
         f"1-worker time / {workers}-worker time (above 1: parallel was faster)"),
    ]))  # fmt: skip

    problems = []
    if report.requests == 0:
        problems.append("no request was answered")
    if report.errors or report.wrong:
        problems.append(f"{report.errors} failed, {report.wrong} wrong answer(s) (first: {report.first_error})")
    if report.stats is None:
        problems.append("the server's /stats did not answer")
    else:
        compiles, buckets = report.stats["function"]["cache_info"]["compiles"], len(report.stats["buckets"])
        in_warmup = sum(r["compiled"] for r in report.stats["warmup"]["results"])
        if not compiles == in_warmup == buckets:
            problems.append(f"{compiles} compiles ({in_warmup} in warm-up) for {buckets} buckets")
    if exit_code != 0 or "server stopped" not in server.output:
        problems.append(f"the server did not stop cleanly on SIGTERM (exit code {exit_code}):\n{server.output[-3000:]}")
    if problems:
        print("FAIL: " + "; ".join(problems))
        return 1
    print(f"PASS: {report.requests} requests answered correctly by {args.threads} threads; "
          f"{buckets} buckets compiled once each, all during warm-up; the server stopped cleanly")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
