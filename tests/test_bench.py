"""The benchmark (python -m bench): every row of the table is there, ratios are finite, statuses follow the targets.

No speed thresholds: the smoke run uses tiny call counts, and only the shape
of its output and the arithmetic of its ratios are asserted.
"""

import json
import math
import re
import statistics
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from helpers import child_env

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # ``bench`` is a package at the repository root, not installed
    sys.path.insert(0, str(REPO))

from bench.cases import Case, Side, default_cases, dict_of_8_floats  # noqa: E402
from bench.report import format_table  # noqa: E402
from bench.timing import Measurement  # noqa: E402

FT = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))

# (row name, anchor label, target): every single-thread row, in table order;
# each is timed in a worker thread and again in the main thread.
ROWS = [
    ("2 float args", "lru_cache", 1.5 if FT else 4.0),  # bare core vs functools.lru_cache
    ("static int + float", "lru_cache", None),
    ("dict of 8 floats", "lru_cache(items)", None),
    ("jax: x+y, 2 f32[4] jax Arrays", "jax.jit", 1.0 if FT else 1.15),
    ("jax: x+y, 2 f32[4] numpy arrays", "jax.jit", None),
    ("jax: dict pytree, 8 f32[4] leaves", "jax.jit", None),
    ("jax: static str keyword", "jax.jit", None),
    ("jax: static int", "jax.jit", None),
    ("jax: Python float", "jax.jit", None),
    ("jax: static custom object", "jax.jit", None),
    ("jax: dict of 8 arrays", "jax.jit", 1.10),
    ("jax: optax adam state", "jax.jit", 1.10),
    ("jax: register_dataclass node", "jax.jit", 1.0),
    ("jax: custom node (module-like)", "jax.jit", 1.0),
]
WARMUP = ("jax: warmup 2 signatures, 2 workers", "workers=1 (loop)", 1.0)
MISSES = ("miss with 4000 signatures cached", "10 signatures", 1.25)
STATUS = re.compile(r"PASS|MISS")
SCALING_SIDES = ["ftjit core", "lru_cache", "ftjit core, jax Array", "ftjit.jit", "jax.jit"]


def _table_rows(stdout: str, header: str = "case ") -> list[list[str]]:
    """The data rows of the table whose header line starts with `header` (footnote markers dropped),
    cells split on runs of 2+ spaces."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    assert set(lines[start + 1]) <= {"-", " "}
    rows = []
    for line in lines[start + 2:]:
        if not line or line.startswith(("[", "MISS:", "(ratio", "scaling =", "(report")):
            break
        cells = re.split(r"\s{2,}", line.strip())
        rows.append([re.sub(r" \[\d+\]$", "", cells[0])] + cells[1:])
    return rows


def _num(cell: str) -> float:
    """'12.5 ns' / '1.2 ms' / '1.197x' / '6.181M' / '165.8k' as a number (ns, ms, x, calls/s)."""
    value, _, unit = cell.partition(" ")
    if value.endswith("M"):
        return float(value[:-1]) * 1e6
    if value.endswith("k"):
        return float(value[:-1]) * 1e3
    return float(value.rstrip("x"))


@pytest.mark.thread_unsafe(reason="runs the whole benchmark in a subprocess: 8 at once would overload 2 cores")
@pytest.mark.timeout(180)
def test_bench_smoke_run_prints_every_row_with_ratios_computable_from_the_printed_times(tmp_path):
    out = tmp_path / "bench.json"
    command = [sys.executable, "-m", "bench", "--number", "300", "--repeat", "1", "--warmup-signatures", "2",
               "--warmup-workers", "2", "--scaling-calls", "300", "--scaling-rounds", "1", "--png", "",
               "--json", str(out)]  # fmt: skip
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=170, env=child_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "warning:" not in proc.stdout  # every ftjit side compiled exactly once: hit latency only
    assert re.search(r"^ftjit \S+ on CPython \S+ \((free-threaded|GIL) build\); load average \d+\.\d\d before, "
                     r"\d+\.\d\d after", proc.stdout, re.M), proc.stdout

    table = _table_rows(proc.stdout)
    expected = [(name, thread) for name, _, _ in ROWS for thread in ("worker", "main")] + [(WARMUP[0], "main"),
                                                                                           (MISSES[0], "worker")]
    assert [(r[0], r[1]) for r in table] == expected
    for row, (name, anchor, target) in zip(table, [r for r in ROWS for _ in range(2)] + [WARMUP, MISSES]):
        _, thread, ftjit_time, anchor_label, anchor_time, ratio, target_cell, status = row
        assert anchor_label == anchor, name
        unit = "ms" if "warmup" in name else "ns"
        assert re.fullmatch(rf"\d+\.\d {unit}", ftjit_time) and re.fullmatch(rf"\d+\.\d {unit}", anchor_time), name
        assert re.fullmatch(r"\d+\.\d{3}x", ratio) and _num(ratio) > 0, name
        # The ratio is the quotient of the two times printed beside it (to their rounding).
        assert _num(ratio) == pytest.approx(_num(ftjit_time) / _num(anchor_time), rel=0.02, abs=0.002), row
        if target is None:
            assert (target_cell, status) == ("-", "report"), name
        else:
            assert target_cell == f"<= {target:.3g}", name
            if abs(_num(ratio) - target) > 0.001:  # beyond the printed rounding, the status follows the ratio
                assert status == ("MISS" if _num(ratio) > target else "PASS"), row
            else:
                assert STATUS.fullmatch(status), row
    assert "issue" not in proc.stdout.lower()  # notes explain rows; they do not cite issue numbers

    scaling = _table_rows(proc.stdout, header="side ")
    assert [r[0] for r in scaling] == SCALING_SIDES
    for row in scaling:
        one, same, distinct, s_same, s_distinct = map(_num, row[1:])
        assert s_same == pytest.approx(same / one, abs=0.011) and s_distinct == pytest.approx(distinct / one, abs=0.011)
    targets = _table_rows(proc.stdout, header="target ")
    assert [t[0] for t in targets] == ["ftjit core: 2 threads on one function / 1 thread",
                                       "ftjit.jit / jax.jit throughput, 2 threads on one function"]
    rates = {r[0]: r for r in scaling}
    assert _num(targets[0][1]) == pytest.approx(_num(rates["ftjit core"][4]), abs=0.011)
    assert _num(targets[1][1]) == pytest.approx(_num(rates["ftjit.jit"][2]) / _num(rates["jax.jit"][2]), rel=0.02)
    assert targets[0][3] == ("PASS" if _num(targets[0][1]) >= 1.8 else "MISS") if FT else "report"

    data = json.loads(out.read_text())
    results = data["results"]
    assert [(r["case"], r["thread"]) for r in results] == expected
    for r in results:
        for key in ("ftjit_ns", "anchor_ns", "ratio"):
            assert math.isfinite(r[key]) and r[key] > 0, (r["case"], key, r[key])
        assert r["ratio"] == pytest.approx(r["ftjit_ns"] / r["anchor_ns"])
        if "warmup" in r["case"]:
            assert (r["ftjit_ns"], r["anchor_ns"]) == (min(r["ftjit_samples_ns"]), min(r["anchor_samples_ns"]))
        else:
            assert r["ftjit_ns"] == pytest.approx(statistics.median(r["ftjit_samples_ns"]))
            assert r["anchor_ns"] == pytest.approx(statistics.median(r["anchor_samples_ns"]))
    assert [s["label"] for s in data["scaling"]["sides"]] == SCALING_SIDES
    assert data["meta"]["warmup_signatures"] == 2 and data["meta"]["warmup_workers"] == 2


def _fixed(name: str, ftjit_ns: float, anchor_ns: float, target) -> Measurement:
    side = Side("x", lambda: None, ())
    return Measurement(Case(name, side, side, target=target), ftjit_ns, anchor_ns, (ftjit_ns,), (anchor_ns,))


def test_table_statuses_and_miss_line():
    rows = [
        _fixed("ok", 300.0, 100.0, 4.0),  # 3.00x: target met
        _fixed("slow", 500.0, 100.0, 4.0),  # 5.00x: miss
        _fixed("untargeted", 900.0, 100.0, None),  # 9.00x: reported, never a miss
    ]
    table = format_table(rows)
    cells = {r[0]: r for r in _table_rows(table)}
    assert cells["ok"][1:] == ["worker", "300.0 ns", "x", "100.0 ns", "3.000x", "<= 4", "PASS"]
    assert cells["slow"][5:] == ["5.000x", "<= 4", "MISS"]
    assert cells["untargeted"][5:] == ["9.000x", "-", "report"]
    assert table.splitlines()[-1] == "MISS: 1 case(s) slower than target: slow (worker thread)"
    assert [m.passed for m in rows] == [True, False, True]


def test_dict_case_gives_both_sides_the_same_dict():
    case = dict_of_8_floats()
    (leaves,) = case.ftjit.args
    assert case.anchor.args == case.ftjit.args  # the very same dict object, not its values unpacked
    assert isinstance(leaves, dict) and len(leaves) == 8
    assert case.ftjit.fn(leaves) == leaves
    assert case.anchor.fn(leaves) == tuple(sorted(leaves.items()))
    assert case.target is None


def test_cases_other_than_jax_call_both_sides_with_the_same_arguments():
    cases = default_cases(with_jax=False)
    assert [c.name for c in cases] == [name for name, _, _ in ROWS[:3]]
    for case in cases:
        assert case.ftjit.args == case.anchor.args, case.name
    assert [c.target for c in cases] == [ROWS[0][2], None, None]


def test_ratio_is_the_quotient_of_the_two_medians():
    side = Side("x", lambda: None, ())
    ft, an = (100.0, 120.0, 130.0), (90.0, 115.0, 120.0)
    m = Measurement(Case("medians", side, side, target=1.1), statistics.median(ft), statistics.median(an), ft, an)
    assert m.ratio == pytest.approx(120.0 / 115.0)
    assert m.status == "PASS"
    row = _table_rows(format_table([m]))[0]
    assert row[2:6] == ["120.0 ns", "x", "115.0 ns", "1.043x"]


@pytest.mark.parametrize("thread", ["worker", "main"])
def test_measure_interleaves_takes_overhead_out_and_runs_in_the_thread_asked(thread):
    import threading

    import bench.timing as timing

    calls = []  # (side label, calls per timing, thread)
    clock = iter(range(1000, 100000, 10))  # ns/call of each timing, in call order

    def fake_ns_per_call(timer, number):
        calls.append((timer.label, number, threading.current_thread()))
        return float(next(clock))

    class FakeTimer:
        def __init__(self, label):
            self.label = label

    ft, an = Side("ft", lambda: None, ()), Side("an", lambda: None, ())
    case = Case("split", ft, an, target=1.5, scale=0.1, splits=4)
    (m,) = timing.measure([case], number=2000, repeat=3, overhead_ns=5.0,
                          make_timer=lambda side: FakeTimer(side.label), time_calls=fake_ns_per_call,
                          thread=thread)
    assert m.thread == thread
    # "main" times right here, in the calling thread (the main thread when the
    # bench runs; a pytest-run-parallel worker here); "worker" in a fresh thread.
    here = threading.current_thread()
    assert all((t is here) == (thread == "main") for _, _, t in calls)
    assert len({id(t) for _, _, t in calls}) == 1  # one thread for every timing
    # 3 repeats x 4 splits = 12 pairs of 2000 * 0.1 / 4 = 50 calls per side, order alternating.
    assert [n for _, n, _ in calls] == [50] * 24
    firsts = [calls[2 * i][0] for i in range(12)]
    assert firsts == ["ft", "an"] * 6
    assert all({calls[2 * i][0], calls[2 * i + 1][0]} == {"ft", "an"} for i in range(12))
    values = [1000.0 + 10 * i for i in range(24)]
    ft_raw = [v for (label, _, _), v in zip(calls, values) if label == "ft"]
    an_raw = [v for (label, _, _), v in zip(calls, values) if label == "an"]
    assert m.ftjit_samples_ns == tuple(v - 5.0 for v in ft_raw)  # overhead out of both sides
    assert m.anchor_samples_ns == tuple(v - 5.0 for v in an_raw)
    assert (m.ftjit_ns, m.anchor_ns) == (statistics.median(ft_raw) - 5.0, statistics.median(an_raw) - 5.0)
    assert m.ratio == pytest.approx(m.ftjit_ns / m.anchor_ns)


def test_scaling_measurement_runs_every_config_in_worker_threads_and_targets_follow_the_numbers():
    import threading

    from bench import threads as bt

    seen = []

    def make(i):
        def fn(*args):
            seen.append((i, threading.current_thread() is threading.main_thread(), args))
            return 0

        return fn, lambda: (object(),)

    groups = [(bt.Contender("a", make), bt.Contender("b", make))]
    ((a, b),) = bt.measure_scaling(groups, calls=5, rounds=2)
    assert set(a.rates) == {"one", "same", "distinct"} and all(len(v) == 2 for v in a.rates.values())
    assert not any(on_main for _, on_main, _ in seen)  # all calls from worker threads
    # Each thread's arguments are its own objects.
    per_call_args = {id(args[0]) for _, _, args in seen}
    assert len(per_call_args) > 2
    assert a.scaling("same") == pytest.approx(a.rate("same") / a.rate("one"))
    t = bt.Target("x", 1.79, 1.8, True)
    assert t.status == "MISS" and bt.Target("x", 1.8, 1.8, True).status == "PASS"
    assert bt.Target("x", 0.1, 1.8, False).status == "report"
