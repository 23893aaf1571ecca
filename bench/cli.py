"""Command line of ``python -m bench``: run the cases, print the tables, optionally write JSON and a PNG."""

from __future__ import annotations

import argparse
import os
import platform
import re
import sys
import sysconfig
from typing import Any, Optional, Sequence

import ftjit

from .cases import Case, default_cases
from .chart import write_png
from .report import format_scaling, format_table, write_json
from .threads import ScalingResult, scaling_result
from .timing import Measurement, loop_overhead_ns, measure

FULL = {"number": 200_000, "repeat": 7, "warmup_repeat": 4, "scaling_calls": 100_000, "scaling_rounds": 5,
        "misses": 200, "miss_rounds": 7}
QUICK = {"number": 20_000, "repeat": 3, "warmup_repeat": 2, "scaling_calls": 20_000, "scaling_rounds": 3,
         "misses": 100, "miss_rounds": 3}


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
    parser.add_argument("--scaling-calls", type=int, metavar="N",
                        help="calls per thread per thread-scaling timing (overrides the preset)")
    parser.add_argument("--scaling-rounds", type=int, metavar="R",
                        help="interleaved rounds of the thread-scaling timings (overrides the preset)")
    parser.add_argument("--only-scaling", action="store_true",
                        help="only the thread-scaling table (for a many-core machine's short lease)")
    parser.add_argument("--only-cases", action="store_true",
                        help="only the single-thread rows of every argument kind, timed in a worker thread "
                             "(ftjit / its anchor by kind; for a short lease)")
    parser.add_argument("--batching", action="store_true",
                        help="only the batching rows: threads with one example each, per call, a hand-written "
                             "batcher and ftjit.batched, with their batches and host overhead (issue 45's targets, "
                             "set for a TPU)")
    parser.add_argument("--batching-threads", type=thread_counts, metavar="1,N,...", default=(1, 4, 16, 64),
                        help="the batching rows' thread counts (default: 1,4,16,64)")
    parser.add_argument("--batching-seconds", type=float, default=2.0, metavar="S",
                        help="seconds each side runs per thread count and round (default: %(default)s)")
    parser.add_argument("--batching-rounds", type=int, default=3, metavar="R",
                        help="interleaved rounds of the batching rows (default: %(default)s)")
    parser.add_argument("--batching-slicing", action="store_true",
                        help="with --batching: also what handing each caller its row of a batch costs, three ways")
    parser.add_argument("--batching-hidden", type=int, default=64, metavar="H",
                        help="the batching model's hidden width, 16 -> H -> 4 (default: %(default)s)")
    parser.add_argument("--stages", action="store_true",
                        help="only the stage table: ns of each stage of a hit at one thread (ftjit's signature, "
                             "probe and invoke, jaxlib's call, the execute) beside jax.jit's whole call")
    parser.add_argument("--threads", type=thread_counts, metavar="1,N,...",
                        help="thread-scaling columns: these thread counts (increasing, from 1), every thread "
                             "calling a function of its own, instead of 1 thread and 2 threads on one "
                             "function or two; measure on a machine with as many cores as the largest count")
    return parser


def thread_counts(text: str) -> tuple[int, ...]:
    """--threads' value: comma-separated positive ints, strictly increasing from 1, at least two of them.
    Anything else is refused rather than sorted or deduplicated: the columns are printed in the order given,
    and the speed-up is over the first, which must be 1 thread."""
    counts = tuple(int(part) for part in text.split(",")) if re.fullmatch(r"[0-9]+(,[0-9]+)*", text) else ()
    if not counts or min(counts) < 1:
        problem = "thread counts are positive ints, comma-separated"
    elif len(set(counts)) < len(counts):
        problem = "a thread count is repeated"
    elif counts[0] != 1 or list(counts) != sorted(counts):
        problem = "thread counts start at 1 and increase"
    elif len(counts) < 2:
        problem = "give 1 and at least one more thread count"
    else:
        return counts
    raise argparse.ArgumentTypeError(f"{problem} (such as 1,2,4), got {text!r}")


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
    for flag in ("number", "repeat", "scaling_calls", "scaling_rounds"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be >= 1")
    if args.only_cases and args.only_scaling:
        parser.error("--only-cases and --only-scaling exclude each other")
    if args.batching:
        return _batching(args)
    if args.stages:
        return _stages(args)
    sizes = dict(QUICK if args.quick else FULL)
    for flag in ("number", "repeat", "scaling_calls", "scaling_rounds"):
        if getattr(args, flag) is not None:
            sizes[flag] = getattr(args, flag)
    if args.repeat is not None:
        sizes["warmup_repeat"] = min(sizes["warmup_repeat"], args.repeat)
    cases = [] if args.only_scaling else default_cases(with_jax=not args.no_jax)
    load_before = os.getloadavg()
    print(f"bench: ftjit {ftjit.__version__} on {_interpreter()}, {len(cases)} cases, number={sizes['number']}, "
          f"repeat={sizes['repeat']}, load average {load_before[0]:.2f}", file=sys.stderr, flush=True)
    overhead = loop_overhead_ns(sizes["number"], sizes["repeat"])
    results: list[Measurement] = []
    for thread in () if args.only_scaling else ("worker",) if args.only_cases else ("worker", "main"):
        print(f"bench: single-thread rows, timed in the {thread} thread", file=sys.stderr, flush=True)
        results += measure(cases, sizes["number"], sizes["repeat"], on_repeat=_progress, overhead_ns=overhead,
                           thread=thread)
    # Worker and main rows of a case next to each other.
    results.sort(key=lambda m: cases.index(m.case))
    if args.only_cases:
        _print_cases(results, cases, overhead, load_before)
        return 0
    if not args.no_jax and not args.only_scaling:
        from .warmup import warmup_measurement

        print(f"bench: warm-up, {args.warmup_signatures} signatures, workers={args.warmup_workers} vs 1, "
              f"{sizes['warmup_repeat']} run(s) each", file=sys.stderr, flush=True)
        results.append(warmup_measurement(args.warmup_signatures, args.warmup_workers, sizes["warmup_repeat"]))
    from .misses import LARGE, UNEXPLAINED_SIZES, miss_measurement, unexplained_miss_measurements

    if not args.only_scaling:
        print(f"bench: misses with {LARGE} signatures cached and with 10", file=sys.stderr, flush=True)
        results.append(miss_measurement(misses=sizes["misses"], rounds=sizes["miss_rounds"]))
        print(f"bench: unexplained misses with {', '.join(map(str, UNEXPLAINED_SIZES))} signatures cached and with "
              "none", file=sys.stderr, flush=True)
        results += unexplained_miss_measurements(misses=sizes["misses"], rounds=sizes["miss_rounds"])
    threads = "" if args.threads is None else f" with {','.join(map(str, args.threads))} threads"
    print(f"bench: thread scaling{threads}, {sizes['scaling_rounds']} rounds of {sizes['scaling_calls']} calls per "
          f"thread", file=sys.stderr, flush=True)
    scaling = scaling_result(sizes["scaling_calls"], sizes["scaling_rounds"], with_jax=not args.no_jax,
                             on_round=lambda d, t: print(f"bench: scaling round {d}/{t}", file=sys.stderr,
                                                         flush=True), thread_counts=args.threads)
    load_after = _print_cases(results, cases, overhead, load_before, scaling=format_scaling(scaling))
    _write_outputs(args, results, scaling, {"quick": args.quick, "ftjit": ftjit.__version__,
                                            "loop_overhead_ns": overhead, "load_before": list(load_before),
                                            "load_after": list(load_after), "interpreter": _interpreter(),
                                            "warmup_signatures": args.warmup_signatures,
                                            "warmup_workers": args.warmup_workers,
                                            "threads": None if args.threads is None else list(args.threads),
                                            **sizes})
    return 0  # benchmarks report; they do not fail CI


def _print_cases(results: list[Measurement], cases: list[Case], overhead: float, load_before: tuple[float, ...],
                 scaling: str | None = None) -> tuple[float, ...]:
    """The run's header line, the per-call table (if any rows), the scaling table (if given) and the
    compiled-once warnings; returns the load average after."""
    load_after = os.getloadavg()
    print(f"ftjit {ftjit.__version__} on {_interpreter()}; load average {load_before[0]:.2f} before, "
          f"{load_after[0]:.2f} after ({os.cpu_count()} CPUs)")
    print()
    if results:
        print(format_table(results))
        print(f"(ratio = ftjit /call ÷ anchor /call, lower is better; each /call is the median of the interleaved "
              f"timings, less timeit's loop overhead of {overhead:.1f} ns/call; the warm-up row compares best runs)")
        print()
    if scaling is not None:
        print(scaling)
    for warning in _check_compiled_once(cases):
        print(warning)
    return load_after


def _batching(args: argparse.Namespace) -> int:
    """--batching: the batching rows alone (bench.batching)."""
    if not (0 < args.batching_seconds <= 600) or args.batching_rounds < 1 or args.batching_hidden < 1:
        raise SystemExit("bench: --batching-seconds must be in (0, 600], --batching-rounds and --batching-hidden "
                         ">= 1")
    from .batching import batching_rows, format_batching

    load_before = os.getloadavg()
    counts = args.batching_threads
    print(f"bench: batching rows with {','.join(map(str, counts))} threads, {args.batching_rounds} rounds of "
          f"{args.batching_seconds:g} s, on {_interpreter()}, load average {load_before[0]:.2f}", file=sys.stderr,
          flush=True)
    rows, overheads = batching_rows(counts, args.batching_seconds, args.batching_rounds, args.batching_hidden,
                                    on_round=lambda d, t: print(f"bench: batching round {d}/{t}", file=sys.stderr,
                                                                flush=True))
    load_after = os.getloadavg()
    print(f"ftjit {ftjit.__version__} on {_interpreter()}; load average {load_before[0]:.2f} before, "
          f"{load_after[0]:.2f} after ({os.cpu_count()} CPUs)")
    print()
    print(format_batching(rows, counts, args.batching_hidden, args.batching_seconds, args.batching_rounds, overheads))
    from .batching import lone_costs

    print()
    print(lone_costs(args.batching_hidden))
    if args.batching_slicing:
        from .batching import slicing_costs

        print()
        print(slicing_costs(args.batching_hidden))
    return 0


def _stages(args: argparse.Namespace) -> int:
    """--stages: the stage table alone (bench.stages), in many short interleaved timings."""
    from .stages import format_stages, stage_rows

    number = args.number or (1_000 if args.quick else 2_000)
    rounds = args.repeat or (31 if args.quick else 101)
    load_before = os.getloadavg()
    print(f"bench: stage table, {rounds} rounds of {number} calls per row, on {_interpreter()}, load average "
          f"{load_before[0]:.2f}", file=sys.stderr, flush=True)
    rows = stage_rows(number, rounds)
    print(f"ftjit {ftjit.__version__} on {_interpreter()}, JAX {_jax_version()}; load average {load_before[0]:.2f} "
          f"before, {os.getloadavg()[0]:.2f} after ({os.cpu_count()} CPUs); {rounds} rounds of {number} calls")
    print()
    print(format_stages(rows))
    return 0


def _jax_version() -> str:
    import jax

    return jax.__version__


def _interpreter() -> str:
    build = "free-threaded" if sysconfig.get_config_var("Py_GIL_DISABLED") else "GIL"
    return f"CPython {platform.python_version()} ({build} build)"


def _write_outputs(args: argparse.Namespace, results: list[Measurement], scaling: ScalingResult,
                   meta: dict[str, Any]) -> None:
    if args.json:
        write_json(args.json, results, meta, scaling)
        print(f"bench: wrote {args.json}", file=sys.stderr)
    if args.png:
        skipped = write_png(args.png, results, scaling)
        print(f"bench: {'skipped ' + args.png + ': ' + skipped if skipped else 'wrote ' + args.png}", file=sys.stderr)
