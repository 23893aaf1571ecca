"""Command line of ``python -m stress``: argument parsing, scenario selection and exit codes."""

from __future__ import annotations

import argparse
import os
import secrets
import sys
import threading
import time
from typing import Optional, Sequence

from .progress import LINE_INTERVAL_S, ProgressReporter
from .registry import Result, Scenario, all_scenarios
from .report import print_summary
from .runner import Plan, RunState, execute, merge_by_name
from .watchdog import STALL_EXIT_CODE, Watchdog

EXIT_FAILED = 1  #: a violated invariant, or --quick over its time budget
EXIT_USAGE = 2  #: argparse's
EXIT_STALLED = STALL_EXIT_CODE  #: 3: a scenario made no progress for --stall-seconds (stacks dumped)
QUICK_BUDGET_S = 180.0  #: --quick must fit in 3 minutes on 2 cores (CI's budget)


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
                        help=f"watchdog: a scenario without progress for S seconds dumps every thread's stack "
                             f"and ends the run with exit code {EXIT_STALLED} (default 20)")
    parser.add_argument("--budget-seconds", type=_positive_float, metavar="S",
                        help=f"fail (exit {EXIT_FAILED}) when the whole run takes longer than S seconds "
                             f"(default {QUICK_BUDGET_S:g} with --quick, none otherwise)")
    parser.add_argument("--progress-every", type=_positive_float, default=LINE_INTERVAL_S, metavar="S",
                        help=f"off a terminal: one progress line per scenario at most every S seconds "
                             f"(default {LINE_INTERVAL_S:g})")
    parser.add_argument("--scale", type=_positive_float, default=1.0, metavar="F",
                        help="multiply every scenario's rounds and calls by F (e.g. 0.1 under ThreadSanitizer)")
    parser.add_argument("--no-jax", action="store_true", help="skip the scenarios that need JAX")
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    return parser


def _select(names: Optional[Sequence[str]], parser: argparse.ArgumentParser) -> list[Scenario]:
    known = all_scenarios()
    visible = [s for s in known.values() if not s.hidden]
    if not visible:
        parser.error("no scenarios are registered")
    if not names:
        return visible
    unknown = [n for n in names if n not in known]
    if unknown:
        parser.error(f"unknown scenario {', '.join(map(repr, unknown))}; valid: {', '.join(s.name for s in visible)}")
    return [known[n] for n in dict.fromkeys(names)]


def _print_list() -> None:
    for scenario in all_scenarios().values():
        if not scenario.hidden:
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
    if args.no_jax:
        selected = [s for s in selected if not s.needs_jax]
    seed = args.seed if args.seed is not None else secrets.randbits(32)
    budget = args.budget_seconds if args.budget_seconds is not None else (QUICK_BUDGET_S if args.quick else None)
    print(f"stress: seed {seed} (reproduce with --seed {seed})", flush=True)
    plan = Plan(scenarios=selected, seed=seed, quick=args.quick, threads=args.threads,
                minutes=args.minutes, stall_seconds=args.stall_seconds, scale=args.scale)
    reporter = ProgressReporter(sys.stderr, line_interval_s=args.progress_every)
    state = RunState()
    started = time.monotonic()

    def on_stall(label: str, idle: float) -> None:
        """Watchdog thread, just before the process exits: the summary so far, the stalled scenario last."""
        done_results, current, done, total = state.snapshot()
        stalled = Result(scenario=current or label, threads=0, stalled=True)
        stalled.violations.append(f"no progress for {idle:.1f}s (limit {args.stall_seconds:g}s) at {done}/{total}; "
                                  f"stacks of all threads dumped on stderr")
        rows = merge_by_name(done_results + [stalled]) if args.minutes is not None else done_results + [stalled]
        print_summary(rows, sys.stdout, time.monotonic() - started, budget)
        print(f"stress: STALLED: scenario {stalled.scenario!r} made no progress for {idle:.1f}s; "
              f"exit code {EXIT_STALLED}", file=sys.stdout, flush=True)

    with Watchdog(args.stall_seconds, sys.stderr, on_stall) as dog:
        results = execute(plan, reporter, dog, state)
    within_budget = print_summary(results, sys.stdout, time.monotonic() - started, budget)
    code = 0 if all(r.passed for r in results) and within_budget else EXIT_FAILED
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
