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

FULL = {"number": 200_000, "repeat": 7, "warmup_repeat": 4}
QUICK = {"number": 20_000, "repeat": 3, "warmup_repeat": 2}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description="ftjit dispatch benchmarks.")
    parser.add_argument("--quick", action="store_true", help="short run (CI): fewer calls and repeats")
    parser.add_argument("--number", type=int, metavar="N",
                        help="calls per timing of a fast row; slow rows use number * scale / splits "
                             "(overrides the preset)")
    parser.add_argument("--repeat", type=int, metavar="R",
                        help="rounds of paired timings (splits pairs per row each; overrides the preset, "
                             "also caps the warm-up runs)")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON to PATH")
    parser.add_argument("--png", metavar="PATH", default="bench/bench.png",
                        help="write a bar chart to PATH (needs matplotlib; default %(default)s, '' to skip)")
    parser.add_argument("--no-jax", action="store_true", help="skip the jax.jit comparisons and the warm-up row")
    parser.add_argument("--warmup-signatures", type=int, default=8, metavar="K",
                        help="signatures compiled per warm-up run (default: %(default)s)")
    parser.add_argument("--warmup-workers", type=int, default=4, metavar="N",
                        help="threads of the parallel warm-up, compared with 1 (default: %(default)s)")
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
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.warmup_signatures < 1 or args.warmup_workers < 2:
        parser.error("--warmup-signatures must be >= 1 and --warmup-workers >= 2")
    if (args.number is not None and args.number < 1) or (args.repeat is not None and args.repeat < 1):
        parser.error("--number and --repeat must be >= 1")
    sizes = dict(QUICK if args.quick else FULL)
    if args.number is not None:
        sizes["number"] = args.number
    if args.repeat is not None:
        sizes["repeat"] = args.repeat
        sizes["warmup_repeat"] = min(sizes["warmup_repeat"], args.repeat)
    cases = default_cases(with_jax=not args.no_jax)
    print(f"bench: ftjit {ftjit.__version__}, {len(cases)} cases, number={sizes['number']}, "
          f"repeat={sizes['repeat']} (sides paired and interleaved; ratio = median of paired ratios)",
          file=sys.stderr, flush=True)
    overhead = loop_overhead_ns(sizes["number"], sizes["repeat"])
    results = measure(cases, sizes["number"], sizes["repeat"], on_repeat=_progress, overhead_ns=overhead)
    if not args.no_jax:
        from .threads import two_thread_measurement
        from .warmup import warmup_measurement

        results.append(two_thread_measurement(calls=max(1000, sizes["number"] // 20), repeat=sizes["repeat"]))
        print(f"bench: warm-up, {args.warmup_signatures} signatures, workers={args.warmup_workers} vs 1, "
              f"{sizes['warmup_repeat']} run(s) each", file=sys.stderr, flush=True)
        results.append(warmup_measurement(args.warmup_signatures, args.warmup_workers, sizes["warmup_repeat"]))
    print(format_table(results))
    print(f"(ratio = ftjit / anchor, lower is better: for the single-thread rows the median over back-to-back "
          f"pairs of timings, whose best is shown per side; timeit's loop overhead, {overhead:.1f} ns/call, is "
          "taken out of both sides)")
    for warning in _check_compiled_once(cases):
        print(warning)
    _write_outputs(args, results, {"quick": args.quick, "ftjit": ftjit.__version__, "loop_overhead_ns": overhead,
                                   "warmup_signatures": args.warmup_signatures,
                                   "warmup_workers": args.warmup_workers, **sizes})
    return 0  # benchmarks report; they do not fail CI


def _write_outputs(args: argparse.Namespace, results: list[Measurement], meta: dict[str, Any]) -> None:
    if args.json:
        write_json(args.json, results, meta)
        print(f"bench: wrote {args.json}", file=sys.stderr)
    if args.png:
        skipped = write_png(args.png, results)
        print(f"bench: {'skipped ' + args.png + ': ' + skipped if skipped else 'wrote ' + args.png}", file=sys.stderr)
