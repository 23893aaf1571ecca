"""Tests of the stress suite itself (``python -m stress``): its watchdog, exit codes, summary and progress lines.

Each test runs ``python -m stress`` in a subprocess from the repository root, mostly on the hidden self-test
scenarios (stress/scenarios/_selftest.py): ``_stall`` blocks its workers forever, ``_violation`` reports one
violated invariant, ``_pass`` makes steady progress for about a second.
"""

import os
import re
import subprocess
import sys

import pytest

from helpers import child_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLUMNS = ["scenario", "threads", "calls", "compiles", "waits", "errors", "p50", "p99", "verdict"]
EXIT_FAILED, EXIT_STALLED = 1, 3


def run_stress(*args, timeout=120):
    """Runs ``python -m stress ARGS`` (stdout and stderr are pipes: not a TTY); returns the CompletedProcess."""
    env = child_env({"PYTHONFAULTHANDLER": "", "PYTHONUNBUFFERED": "1"})
    return subprocess.run([sys.executable, "-m", "stress", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def header_columns(stdout):
    """The summary table's header line, split into words (``p50 µs`` gives ``p50`` and ``µs``)."""
    lines = stdout.splitlines()
    header = next(line for line in lines if line.startswith("scenario "))
    return [word for word in header.split() if word != "µs"]


def table_row(stdout, scenario):
    """The cells of the summary row of ``scenario``."""
    for line in stdout.splitlines():
        cells = line.split()
        if cells and cells[0] == scenario:
            return cells
    raise AssertionError(f"no summary row for {scenario!r} in:\n{stdout}")


def test_stall_dumps_every_thread_and_exits_3():
    """1. A scenario that stops making progress: the watchdog dumps every thread's stack and ends the run (3)."""
    proc = run_stress("--scenario", "_stall", "--stall-seconds", "2", "--seed", "7", timeout=60)
    assert proc.returncode == EXIT_STALLED, proc.stdout + proc.stderr
    err = proc.stderr
    assert re.search(r"stress: WATCHDOG: scenario '_stall' made no progress for \d+\.\ds \(limit 2s\)", err), err
    # faulthandler's dump: one block per thread, the three blocked workers among them
    assert re.search(r"^Thread 0x[0-9a-f]+ \(most recent call first\):$", err, re.M), err
    assert re.search(r"^Current thread 0x[0-9a-f]+ \(most recent call first\):$", err, re.M), err
    assert err.count("in _blocked_forever") == 3, err
    assert "stress: WATCHDOG: '_stall' stalled; exiting with code 3" in err
    out = proc.stdout
    assert header_columns(out) == COLUMNS
    assert table_row(out, "_stall")[-1] == "STALL"
    assert re.search(r"_stall: no progress for \d+\.\ds \(limit 2s\) at 12/15; stacks of all threads dumped", out)
    assert "stress: 0 passed, 0 failed, 1 stalled (_stall)" in out
    assert re.search(r"stress: STALLED: scenario '_stall' made no progress for \d+\.\ds; exit code 3", out), out


def test_stall_report_keeps_the_scenarios_that_finished():
    """2. The stall summary lists the scenarios that ran before the stall with their verdicts."""
    proc = run_stress("--scenario", "_violation", "--scenario", "_stall", "--stall-seconds", "1", "--seed", "7",
                      timeout=60)
    assert proc.returncode == EXIT_STALLED, proc.stdout + proc.stderr
    assert table_row(proc.stdout, "_violation")[-1] == "FAIL"
    assert table_row(proc.stdout, "_stall")[-1] == "STALL"
    assert "stress: 0 passed, 1 failed, 1 stalled (_stall)" in proc.stdout


@pytest.mark.thread_unsafe(reason="runs the 64-thread herd scenario: 8 copies at once would only oversubscribe "
                                  "the CPUs (each copy is a separate process: nothing shared to race on)")
def test_herd_quick_passes_and_prints_the_table():
    """3. A real scenario: exit 0, the summary table with every column, a PASS row with exact compile counts."""
    proc = run_stress("--scenario", "herd", "--quick", "--seed", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert header_columns(out) == COLUMNS
    row = table_row(out, "herd")
    assert row[1:4] == ["64", str(64 * 30 * 5), "30"]  # threads, calls (30 rounds x 5 calls), one compile each
    assert row[-1] == "PASS"
    assert re.search(r"^stress: total wall time \d+\.\d s \(budget 180 s\)$", out, re.M), out
    assert re.search(r"^stress: sys\._is_gil_enabled\(\) (== (True|False)|n/a \(Python 3\.\d+\))$", out, re.M), out
    assert out.rstrip().endswith("stress: 1 passed, 0 failed")
    assert "stress: herd PASS in" in proc.stderr


def test_injected_violation_fails_the_run():
    """4. A violated invariant: exit 1, a FAIL row, the violation listed verbatim."""
    proc = run_stress("--scenario", "_violation", "--seed", "1")
    assert proc.returncode == EXIT_FAILED, proc.stdout + proc.stderr
    assert table_row(proc.stdout, "_violation")[-1] == "FAIL"
    assert "violated invariants:\n  _violation: injected violation (self-test)\n" in proc.stdout
    assert proc.stdout.rstrip().endswith("stress: 0 passed, 1 failed")
    assert "stress: _violation failed with run seed" in proc.stderr


def test_over_budget_fails_the_run():
    """5. A run longer than its time budget fails (1) even though every scenario passed."""
    proc = run_stress("--scenario", "_pass", "--seed", "1", "--budget-seconds", "0.2")
    assert proc.returncode == EXIT_FAILED, proc.stdout + proc.stderr
    assert table_row(proc.stdout, "_pass")[-1] == "PASS"
    assert re.search(r"^stress: FAIL: the run took \d+\.\d s, over its 0\.2 s budget", proc.stdout, re.M), proc.stdout


def test_within_budget_and_progress_lines_off_a_tty():
    """6. Off a TTY (a CI log), plain progress lines at most once per interval; within budget: exit 0."""
    proc = run_stress("--scenario", "_pass", "--seed", "1", "--budget-seconds", "60", "--progress-every", "0.25")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = re.findall(r"^stress: _pass (\d+)/10 \(\d+%\) after (\d+\.\d)s$", proc.stderr, re.M)
    assert len(lines) >= 2, proc.stderr  # >= 1 s of progress at one line per 0.25 s at most
    done = [int(d) for d, _ in lines]
    assert done == sorted(done) and len(set(done)) == len(done)
    elapsed = [float(t) for _, t in lines]
    assert all(b - a >= 0.2 for a, b in zip(elapsed, elapsed[1:])), elapsed  # 0.25 s apart, shown to 0.1 s
    assert "\r" not in proc.stderr and "\x1b[" not in proc.stderr  # no bar drawing in a log


def test_hidden_scenarios_are_not_listed():
    """7. ``--list`` shows the real scenarios only; the self-tests run only when named."""
    proc = run_stress("--list")
    assert proc.returncode == 0, proc.stderr
    names = [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]
    assert names == ["herd", "mixed", "churn", "clear_storm", "reentrant_keys", "recursion", "failing_compiles",
                     "jax", "server", "reentrant_hooks", "reentrant_copies", "batching"]


def test_every_mutation_of_the_mutation_check_still_applies():
    """python -m stress.mutation_check patches the source; a refactor that
    moves a patched line makes it skip that mutation ('cannot apply'), so
    each must match exactly once in today's source."""
    import pathlib

    from stress.mutation_check import MUTATIONS

    root = pathlib.Path(__file__).resolve().parent.parent
    for m in MUTATIONS:
        text = (root / m.path).read_text()
        assert text.count(m.old) == 1, (m.name, m.path, text.count(m.old))
