"""Command line of ``python -m bench``: run the cases, print the table, optionally write JSON and a PNG."""

from __future__ import annotations

import argparse
import sys
from typing import Any, Optional, Sequence

import ftjit

from .cases import Case, default_cases
from .chart import write_png
from .report import format_table, write_json
from .timing import Measurement, loop_overhead_ns, measure

FULL = {"number": 200_000, "repeat": 7}
QUICK = {"number": 20_000, "repeat": 3}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description="ftjit dispatch benchmarks.")
    parser.add_argument("--quick", action="store_true", help="short run (CI): fewer calls and repeats")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON to PATH")
    parser.add_argument("--png", metavar="PATH", default="bench/bench.png",
                        help="write a bar chart to PATH (needs matplotlib; default %(default)s, '' to skip)")
    parser.add_argument("--no-jax", action="store_true", help="skip the jax.jit comparisons")
    return parser


def _check_compiled_once(cases: Sequence[Case]) -> list[str]:
    """The ftjit side must have compiled exactly once, or the numbers are not hit latency."""
    warnings = []
    for case in cases:
        info_fn = getattr(case.ftjit.fn, "cache_info", None)
        if info_fn is None:
            continue
        info = info_fn()
        if info.compiles != 1 or info.misses != 1:
            warnings.append(f"warning: {case.name}: ftjit compiled {info.compiles}x, missed {info.misses}x "
                            "(expected 1): not a pure hit-latency number")
    return warnings


def _progress(done: int, total: int) -> None:
    print(f"bench: repeat {done}/{total}", file=sys.stderr, flush=True)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    sizes = QUICK if args.quick else FULL
    cases = default_cases(with_jax=not args.no_jax)
    print(f"bench: ftjit {ftjit.__version__}, {len(cases)} cases, number={sizes['number']}, "
          f"repeat={sizes['repeat']} (min per side; sides interleaved)", file=sys.stderr, flush=True)
    results = measure(cases, sizes["number"], sizes["repeat"], on_repeat=_progress)
    if not args.no_jax:
        from .threads import two_thread_measurement

        results.append(two_thread_measurement(calls=max(1000, sizes["number"] // 20), repeat=sizes["repeat"]))
    overhead = loop_overhead_ns(sizes["number"], sizes["repeat"])
    print(format_table(results))
    print(f"(ns/call include timeit's loop overhead of {overhead:.1f} ns on both sides)")
    for warning in _check_compiled_once(cases):
        print(warning)
    _write_outputs(args, results, {"quick": args.quick, "ftjit": ftjit.__version__, "loop_overhead_ns": overhead,
                                   **sizes})
    return 0  # benchmarks report; they do not fail CI


def _write_outputs(args: argparse.Namespace, results: list[Measurement], meta: dict[str, Any]) -> None:
    if args.json:
        write_json(args.json, results, meta)
        print(f"bench: wrote {args.json}", file=sys.stderr)
    if args.png:
        skipped = write_png(args.png, results)
        print(f"bench: {'skipped ' + args.png + ': ' + skipped if skipped else 'wrote ' + args.png}", file=sys.stderr)
