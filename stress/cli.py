"""Command line of ``python -m stress``: argument parsing, scenario selection and exit codes."""

from __future__ import annotations

import argparse
import os
import secrets
import sys
import threading
from typing import Optional, Sequence

from .progress import ProgressReporter
from .registry import Scenario, all_scenarios
from .report import print_summary
from .runner import Plan, execute
from .watchdog import Watchdog

EXIT_FAILED = 1
EXIT_USAGE = 2


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m stress", description="ftjit invariant-checking stress suite.")
    parser.add_argument("--quick", action="store_true", help="small sizes (CI smoke run)")
    parser.add_argument("--minutes", type=_positive_float, metavar="N", help="soak: repeat scenarios for N minutes")
    parser.add_argument("--scenario", metavar="NAME", action="append", help="run only NAME (repeatable)")
    parser.add_argument("--seed", type=int, help="base seed (random when omitted; always printed)")
    parser.add_argument("--threads", type=_positive_int, metavar="N", help="override every scenario's thread count")
    parser.add_argument("--stall-seconds", type=_positive_float, default=20.0, metavar="S",
                        help="watchdog: dump stacks and exit 3 after S seconds without progress (default 20)")
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    return parser


def _select(names: Optional[Sequence[str]], parser: argparse.ArgumentParser) -> list[Scenario]:
    known = all_scenarios()
    if not known:
        parser.error("no scenarios are registered")
    if not names:
        return list(known.values())
    unknown = [n for n in names if n not in known]
    if unknown:
        parser.error(f"unknown scenario {', '.join(map(repr, unknown))}; valid: {', '.join(known)}")
    return [known[n] for n in dict.fromkeys(names)]


def _print_list() -> None:
    for scenario in all_scenarios().values():
        print(f"{scenario.name:<16} {scenario.description}")


def _tolerant_output() -> None:
    """The table has a "µs" header: never die on a stdout/stderr that cannot encode it."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _tolerant_output()
    if args.list:
        _print_list()
        return 0
    selected = _select(args.scenario, parser)
    seed = args.seed if args.seed is not None else secrets.randbits(32)
    print(f"stress: seed {seed} (reproduce with --seed {seed})", flush=True)
    plan = Plan(scenarios=selected, seed=seed, quick=args.quick, threads=args.threads,
                minutes=args.minutes, stall_seconds=args.stall_seconds)
    reporter = ProgressReporter(sys.stderr)
    with Watchdog(args.stall_seconds, sys.stderr) as dog:
        results = execute(plan, reporter, dog)
    print_summary(results, sys.stdout)
    code = 0 if all(r.passed for r in results) else EXIT_FAILED
    _exit_now_if_threads_left(code)
    return code


def _exit_now_if_threads_left(code: int) -> None:
    """Hung scenario threads must not take part in interpreter shutdown (they may be blocked in C++): exit hard."""
    left = [t.name for t in threading.enumerate() if t is not threading.main_thread() and t.is_alive()]
    if left:
        print(f"stress: {len(left)} thread(s) still alive after the scenarios; exiting without cleanup",
              file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
