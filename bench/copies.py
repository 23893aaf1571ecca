"""What 200 threads alive at once, each calling a jitted x+y once, leave in memory: the threads alone, jax.jit,
and ftjit.jit (whose entries keep a copy of jaxlib's call object per thread index), and what ``clear_cache()`` (and
``jax.clear_caches()``) gives back.

Run it as ``.venv/bin/python -m bench.copies [--threads 200] [--runs 3]``: each side runs in a fresh process
(``--side``), which reports RSS growth (MiB) from before the threads start to once they all called (held alive
on a barrier), then after they ended, then after the clear and a collection. Prints the medians of the runs,
with the range, and the load average. docs/design.md ("Copies") quotes it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import sysconfig
import threading

SIDES = ("threads only", "jax.jit", "ftjit.jit")


def _rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _one_side(side: str, threads: int) -> dict[str, float]:
    """In this process: RSS growth of `threads` threads, alive at once, each calling `side` once."""
    import gc

    import jax
    import jax.numpy as jnp
    import numpy as np

    import ftjit

    def add(x, y):
        return x + y

    fn = {"threads only": None, "jax.jit": jax.jit(add), "ftjit.jit": ftjit.jit(add)}[side]
    x = np.ones(4, np.float32)
    if fn is not None:
        np.asarray(fn(x, x))  # compiled in this thread first: the threads' calls are hits
    jnp.zeros(1).block_until_ready()
    gc.collect()
    start = _rss_mib()
    called = threading.Barrier(threads + 1)
    release = threading.Event()

    def work() -> None:
        if fn is not None:
            np.asarray(fn(x, x))
        called.wait(120)
        release.wait(120)

    pool = [threading.Thread(target=work) for _ in range(threads)]
    for t in pool:
        t.start()
    called.wait(120)
    gc.collect()
    alive = _rss_mib() - start
    release.set()
    for t in pool:
        t.join(120)
    gc.collect()
    ended = _rss_mib() - start
    copies = ftjit._core._live_counts()["entries"] if side == "ftjit.jit" else 0
    if side == "ftjit.jit":
        fn.clear_cache()
    elif side == "jax.jit":
        jax.clear_caches()
    gc.collect()
    cleared = _rss_mib() - start
    return {"alive": alive, "ended": ended, "cleared": cleared, "entries": copies}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.copies", description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=200)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.threads < 1 or args.runs < 1:
        parser.error("--threads and --runs must be >= 1")
    if args.side:
        print(json.dumps(_one_side(args.side, args.threads)))
        return 0
    load = os.getloadavg()[0]
    results: dict[str, list[dict[str, float]]] = {side: [] for side in SIDES}
    for _ in range(args.runs):
        for side in SIDES:  # interleaved
            out = subprocess.run([sys.executable, "-m", "bench.copies", "--side", side, "--threads", str(args.threads)],
                                 capture_output=True, text=True, timeout=600, check=True)
            results[side].append(json.loads(out.stdout.strip().splitlines()[-1]))
    build = "free-threaded" if sysconfig.get_config_var("Py_GIL_DISABLED") else "GIL"
    print(f"CPython {platform.python_version()} ({build} build), {os.cpu_count()} CPUs, load average {load:.2f} before, "
          f"{os.getloadavg()[0]:.2f} after; {args.threads} threads alive at once, each calling x+y (f32[4]) once; "
          f"RSS growth in MiB from before the threads, median of {args.runs} fresh processes (range)")
    print(f"{'side':<14} {'all alive':>18} {'all ended':>18} {'after the clear':>18}")
    for side in SIDES:
        cells = []
        for key in ("alive", "ended", "cleared"):
            vals = [r[key] for r in results[side]]
            cells.append(f"{statistics.median(vals):+7.1f} ({min(vals):+.1f}..{max(vals):+.1f})")
        print(f"{side:<14} " + " ".join(f"{c:>18}" for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
