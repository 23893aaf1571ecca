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
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # ``bench`` is a package at the repository root, not installed
    sys.path.insert(0, str(REPO))

from bench.cases import Case, Side, default_cases, dict_of_8_floats  # noqa: E402
from bench.report import format_table  # noqa: E402
from bench.timing import Measurement  # noqa: E402

# (row name, anchor label, target): every row the issues ask for, in table order.
ROWS = [
    ("2 float args", "lru_cache", 4.0),  # bare core vs functools.lru_cache
    ("static int + float", "lru_cache", None),
    ("dict of 8 floats", "lru_cache(items)", None),
    ("jax: x+y, 2 f32[4] jax Arrays", "jax.jit", 1.15),
    ("jax: x+y, 2 f32[4] numpy arrays", "jax.jit", None),
    ("jax: dict pytree, 8 f32[4] leaves", "jax.jit", None),
    ("jax: 2 threads hammering x+y", "jax.jit", 1 / 0.9),
    ("jax: warmup 2 signatures, 2 workers", "workers=1 (loop)", 1.0),
]
STATUS = re.compile(r"PASS \(goal\)|PASS|MISS")


def _table_rows(stdout: str) -> dict[str, list[str]]:
    """The table's data rows by case name (footnote markers dropped), cells split on runs of 2+ spaces."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("case "))
    assert set(lines[start + 1]) <= {"-", " "}
    rows = {}
    for line in lines[start + 2:]:
        if not line or line.startswith("[") or line.startswith(("MISS:", "(ratio")):
            break
        cells = re.split(r"\s{2,}", line.strip())
        rows[re.sub(r" \[\d+\]$", "", cells[0])] = cells[1:]
    return rows


@pytest.mark.thread_unsafe(reason="runs the whole benchmark in a subprocess: 8 at once would overload 2 cores")
@pytest.mark.timeout(120)
def test_bench_smoke_run_prints_every_row_with_finite_ratios(tmp_path):
    out = tmp_path / "bench.json"
    command = [sys.executable, "-m", "bench", "--number", "300", "--repeat", "1", "--warmup-signatures", "2",
               "--warmup-workers", "2", "--png", "", "--json", str(out)]  # fmt: skip
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "warning:" not in proc.stdout  # every ftjit side compiled exactly once: hit latency only

    table = _table_rows(proc.stdout)
    assert list(table) == [name for name, _, _ in ROWS]
    for name, anchor, target in ROWS:
        ftjit_time, anchor_label, anchor_time, ratio, target_cell, goal_cell, status = table[name]
        assert anchor_label == anchor, name
        unit = "ms" if "warmup" in name else "ns"
        assert re.fullmatch(rf"\d+\.\d {unit}", ftjit_time) and re.fullmatch(rf"\d+\.\d {unit}", anchor_time), name
        assert re.fullmatch(r"\d+\.\d{3}x", ratio) and float(ratio[:-1]) > 0, name
        if target is None:
            assert (target_cell, goal_cell, status) == ("-", "-", "report"), name
        else:
            assert target_cell == f"<= {target:.3g}", name
            assert STATUS.fullmatch(status), name

    data = json.loads(out.read_text())
    results = data["results"]
    assert [r["case"] for r in results] == [name for name, _, _ in ROWS]
    for r, (name, anchor, target) in zip(results, ROWS):
        assert r["anchor"] == anchor
        assert r["target"] == target
        for key in ("ftjit_ns", "anchor_ns", "ratio"):
            assert math.isfinite(r[key]) and r[key] > 0, (name, key, r[key])
        assert r["ftjit_ns"] == min(r["ftjit_samples_ns"]) and r["anchor_ns"] == min(r["anchor_samples_ns"])
        if r["paired_ratios"]:  # the single-thread rows: the median of back-to-back pairs
            assert len(r["paired_ratios"]) == len(r["ftjit_samples_ns"]) == len(r["anchor_samples_ns"])
            pairs = [f / a for f, a in zip(r["ftjit_samples_ns"], r["anchor_samples_ns"])]
            assert r["paired_ratios"] == pytest.approx(pairs)
            assert r["ratio"] == pytest.approx(statistics.median(pairs))
        else:  # the two-thread and warm-up rows: best against best
            assert "threads" in name or "warmup" in name, name
            assert r["ratio"] == pytest.approx(r["ftjit_ns"] / r["anchor_ns"])
        if target is None:
            assert r["status"] == "report"
        else:
            assert r["status"] == ("MISS" if r["ratio"] > target else ("PASS (goal)" if r["goal_met"] else "PASS"))
    warm = results[-1]
    assert warm["unit"] == "ms" and len(warm["ftjit_samples_ns"]) == len(warm["anchor_samples_ns"]) == 1
    assert data["meta"]["warmup_signatures"] == 2 and data["meta"]["warmup_workers"] == 2


def _fixed(name: str, ftjit_ns: float, anchor_ns: float, target, goal) -> Measurement:
    side = Side("x", lambda: None, ())
    return Measurement(Case(name, side, side, target=target, goal=goal), ftjit_ns, anchor_ns, (ftjit_ns,), (anchor_ns,))


def test_table_statuses_and_miss_line():
    rows = [
        _fixed("fast", 100.0, 100.0, 4.0, 2.0),  # 1.00x: goal met
        _fixed("ok", 300.0, 100.0, 4.0, 2.0),  # 3.00x: target met
        _fixed("slow", 500.0, 100.0, 4.0, 2.0),  # 5.00x: miss
        _fixed("untargeted", 900.0, 100.0, None, None),  # 9.00x: reported, never a miss
    ]
    table = format_table(rows)
    cells = _table_rows(table)
    assert cells["fast"][3:] == ["1.000x", "<= 4", "<= 2", "PASS (goal)"]
    assert cells["ok"][3:] == ["3.000x", "<= 4", "<= 2", "PASS"]
    assert cells["slow"][3:] == ["5.000x", "<= 4", "<= 2", "MISS"]
    assert cells["untargeted"][3:] == ["9.000x", "-", "-", "report"]
    assert table.splitlines()[-1] == "MISS: 1 case(s) slower than target: slow"
    assert [m.passed for m in rows] == [True, True, False, True]


def test_dict_case_gives_both_sides_the_same_dict():
    case = dict_of_8_floats()
    (leaves,) = case.ftjit.args
    assert case.anchor.args == case.ftjit.args  # the very same dict object, not its values unpacked
    assert isinstance(leaves, dict) and len(leaves) == 8
    assert case.ftjit.fn(leaves) == leaves
    assert case.anchor.fn(leaves) == tuple(sorted(leaves.items()))
    assert case.target is None and case.goal is None


def test_cases_other_than_jax_call_both_sides_with_the_same_arguments():
    cases = default_cases(with_jax=False)
    assert [c.name for c in cases] == [name for name, _, _ in ROWS[:3]]
    for case in cases:
        assert case.ftjit.args == case.anchor.args, case.name
    assert [c.target for c in cases] == [4.0, None, None]


def test_ratio_of_paired_timings_is_their_median():
    # Each pair is one ftjit timing and the anchor timing right next to it; a
    # lucky anchor timing (90) no longer decides the row on its own.
    side = Side("x", lambda: None, ())
    ft, an = (100.0, 120.0, 130.0), (90.0, 115.0, 120.0)
    pairs = tuple(f / a for f, a in zip(ft, an))
    m = Measurement(Case("paired", side, side, target=1.1, goal=1.0), min(ft), min(an), ft, an, pairs)
    assert m.ratio == pytest.approx(130.0 / 120.0)  # the median pair
    assert m.status == "PASS"
    assert Measurement(m.case, min(ft), min(an), ft, an).ratio == pytest.approx(100.0 / 90.0)  # best/best: MISS
    assert _table_rows(format_table([m]))["paired"][3] == "1.083x"


def test_measure_pairs_adjacent_timings_alternates_order_and_takes_overhead_out():
    import bench.timing as timing

    calls = []  # (side label, calls per timing)
    clock = iter(range(1000, 100000, 10))  # ns/call of each timing, in call order

    def fake_ns_per_call(timer, number):
        calls.append((timer.label, number))
        return float(next(clock))

    class FakeTimer:
        def __init__(self, label):
            self.label = label

    ft, an = Side("ft", lambda: None, ()), Side("an", lambda: None, ())
    case = Case("split", ft, an, target=1.5, goal=None, scale=0.1, splits=4)
    (m,) = timing.measure([case], number=2000, repeat=3, overhead_ns=5.0,
                          make_timer=lambda side: FakeTimer(side.label), time_calls=fake_ns_per_call)
    # 3 repeats x 4 splits = 12 pairs of 2000 * 0.1 / 4 = 50 calls per side, order alternating.
    assert [n for _, n in calls] == [50] * 24
    firsts = [calls[2 * i][0] for i in range(12)]
    assert firsts == ["ft", "an"] * 6
    assert all({calls[2 * i][0], calls[2 * i + 1][0]} == {"ft", "an"} for i in range(12))
    values = [1000.0 + 10 * i for i in range(24)]
    ft_raw = [v for (label, _), v in zip(calls, values) if label == "ft"]
    an_raw = [v for (label, _), v in zip(calls, values) if label == "an"]
    assert m.ftjit_samples_ns == tuple(v - 5.0 for v in ft_raw)  # overhead out of both sides
    assert m.anchor_samples_ns == tuple(v - 5.0 for v in an_raw)
    assert m.paired_ratios == pytest.approx([(f - 5.0) / (a - 5.0) for f, a in zip(ft_raw, an_raw)])
    assert (m.ftjit_ns, m.anchor_ns) == (min(ft_raw) - 5.0, min(an_raw) - 5.0)
    assert m.ratio == pytest.approx(statistics.median(m.paired_ratios))
