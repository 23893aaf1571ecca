"""A restart of examples/serve.py: time to ready and the first requests' latency, with and without a
specs file (``--specs``) and JAX's persistent compilation cache (``--compile-cache``).

Run it as ``.venv/bin/python -m bench.restart [--runs 5]`` from the clone (docs/serving.md has its
numbers). First a priming server, started without a bucket warm-up, is loaded until every bucket has
compiled, then stopped with SIGTERM: that writes the specs file and fills the compile cache. Then,
``--runs`` times, each configuration (in turn, interleaved) starts a fresh server process, which
is loaded by ``examples/load.py``'s generator from this process (``--threads`` clients,
``--requests`` requests, batch sizes 1..max_batch with a fixed seed, so every run sends the same
requests, which cover every bucket):

- ready: seconds from starting the process to its ``serving on`` line (imports, JAX's start, the
  warm-up, listening), and of those the warm-up's (its wall clock, from ``/stats``);
- the p50, p99 and max latency of those first requests, and the compiles during them (the server's
  compiles after the load minus those of its warm-up).

The configurations: ``cold`` (``--no-bucket-warmup``: each bucket compiles at its first request),
``specs`` (plus ``--specs`` of the primed file), ``cache`` (plus ``--compile-cache`` of the primed
directory), ``both``, and for comparison serve.py's default bucket warm-up without and with the cache
(``buckets``, ``buckets+cache``). Each server gets a copy of the primed specs file (its stop rewrites
it). Prints one table of medians (with the range) and the 1-minute load average seen.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import signal
import statistics
import sys
import sysconfig
import tempfile
import time
from typing import Any

import jax

import ftjit
from examples.demo import ServerProcess
from examples.load import run_load

CONFIGS = {  # name: (flags, uses the specs file, uses the compile cache)
    "cold": (["--no-bucket-warmup"], False, False),
    "specs": (["--no-bucket-warmup"], True, False),
    "cache": (["--no-bucket-warmup"], False, True),
    "both": (["--no-bucket-warmup"], True, True),
    "buckets": ([], False, False),
    "buckets+cache": ([], False, True),
}


def _flags(name: str, workdir: str, run: int) -> list[str]:
    flags, specs, cache = CONFIGS[name]
    flags = list(flags)
    if specs:
        copy = os.path.join(workdir, f"specs-{name}-{run}")
        shutil.copy2(os.path.join(workdir, "specs"), copy)  # keeps the mode: load_specs refuses a group-writable file
        flags += ["--specs", copy]
    if cache:
        flags += ["--compile-cache", os.path.join(workdir, "cache")]
    return flags


def _stop(server: ServerProcess) -> None:
    code = server.stop(signal.SIGTERM)
    if code != 0:
        raise RuntimeError(f"the server exited {code}; its output:\n{server.output}")


def prime(workdir: str, args: argparse.Namespace) -> int:
    """Runs a server until every bucket has compiled; its stop writes the specs file. Returns the buckets."""
    server = ServerProcess("--no-bucket-warmup", "--max-batch", str(args.max_batch), "--specs",
                           os.path.join(workdir, "specs"), "--compile-cache", os.path.join(workdir, "cache"))
    try:
        seed = 0
        while True:
            assert server.port is not None  # ServerProcess returns once it listens
            report = run_load(server.port, threads=args.threads, requests=args.requests, seconds=None, seed=seed,
                              max_batch=args.max_batch, progress=False)
            stats = report.stats or {}
            if report.errors or report.wrong or not stats:
                raise RuntimeError(f"priming failed: {report.first_error}")
            if stats["function"]["cache_info"]["size"] == len(stats["buckets"]):
                return len(stats["buckets"])
            seed += 1
    finally:
        _stop(server)


def measure(name: str, workdir: str, run: int, args: argparse.Namespace) -> dict[str, Any]:
    """One restart in configuration ``name``: ready seconds, latencies, compiles during the traffic."""
    flags = _flags(name, workdir, run) + ["--max-batch", str(args.max_batch)]
    t0 = time.perf_counter()
    server = ServerProcess(*flags)
    ready = time.perf_counter() - t0
    try:
        assert server.port is not None  # ServerProcess returns once it listens
        report = run_load(server.port, threads=args.threads, requests=args.requests, seconds=None, seed=0,
                          max_batch=args.max_batch, progress=False)
    finally:
        _stop(server)
    if report.errors or report.wrong or report.stats is None:
        raise RuntimeError(f"{name}: {report.errors} errors, {report.wrong} wrong: {report.first_error}")
    warmup = report.stats["warmup"]
    warm_compiles = 0 if warmup is None else sum(r["compiled"] for r in warmup["results"])
    return {"ready": ready, "warmup": 0.0 if warmup is None else warmup["wall_seconds"],
            "p50": report.p50_ms, "p99": report.p99_ms, "max": report.max_ms,
            "compiles": report.stats["function"]["cache_info"]["compiles"] - warm_compiles,
            "load": os.getloadavg()[0], "gil": report.stats["gil_enabled"]}


def _cell(values: list[float], digits: int) -> str:
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.restart", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="restarts per configuration (default: %(default)s)")
    parser.add_argument("--requests", type=int, default=100, help="requests after each restart (default: 100)")
    parser.add_argument("--threads", type=int, default=8, help="load generator threads (default: %(default)s)")
    parser.add_argument("--max-batch", type=int, default=32, help="serve.py's --max-batch (default: %(default)s)")
    parser.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS),
                        help="configurations to run (default: all)")
    args = parser.parse_args(argv)
    free_threaded = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
    print(f"{platform.python_implementation()} {platform.python_version()}{'t' if free_threaded else ''}, "
          f"jax {jax.__version__}, ftjit {ftjit.__version__}, {os.cpu_count()} CPUs", flush=True)
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in args.configs}
    with tempfile.TemporaryDirectory(prefix="ftjit-restart-") as workdir:
        buckets = prime(workdir, args)
        print(f"primed: {buckets} buckets in the specs file and the compile cache", flush=True)
        for run in range(args.runs):
            for name in args.configs:
                row = measure(name, workdir, run, args)
                results[name].append(row)
                print(f"run {run + 1}/{args.runs} {name:13} ready {row['ready']:.2f} s  p99 {row['p99']:.1f} ms  "
                      f"compiles during traffic {row['compiles']}  load {row['load']:.2f}", flush=True)
    print(f"\nmedians (min-max) of {args.runs} runs; first {args.requests} requests from {args.threads} threads")
    print(f"{'configuration':13}  {'ready s':16}  {'warm-up s':16}  {'p50 ms':16}  {'p99 ms':19}  compiles in traffic")
    for name, rows in results.items():
        cells = [_cell([r[key] for r in rows], digits) for key, digits in
                 (("ready", 2), ("warmup", 2), ("p50", 1), ("p99", 1))]  # fmt: skip
        compiles = "/".join(map(str, sorted({r["compiles"] for r in rows})))
        print(f"{name:13}  {cells[0]:16}  {cells[1]:16}  {cells[2]:16}  {cells[3]:19}  {compiles}")
    loads = [r["load"] for rows in results.values() for r in rows]
    print(f"1-minute load average during the runs: {min(loads):.2f}-{max(loads):.2f}; the servers' GIL: "
          + "/".join(sorted({"enabled" if r["gil"] else "disabled" for rows in results.values() for r in rows})))
    return 0


if __name__ == "__main__":
    sys.exit(main())
