"""The step-time-shift detector on hand-made step times, and a profiled window across the change."""
from __future__ import annotations

import json

import pytest

from dstrace.analysis.shift import MIN_LEVEL_STEPS, SHIFT_RATIO, find_shift
from tests.fixtures.reports import analyze_dir
from tests.fixtures.runs import write_manifest, write_run_record
from tests.fixtures.traces import TraceBuilder


def test_two_levels_are_found_where_they_change():
    assert find_shift([60, 62, 61, 63, 180, 182, 179, 181, 185]) == (5, 61.5, 181.0)


def test_the_first_step_index_is_carried():
    start, _, _ = find_shift([10, 10, 10, 30, 30, 30], first_step=1)
    assert start == 4


def test_a_drop_is_a_shift_too():
    start, before, after = find_shift([700, 500, 450, 860, 730, 300, 290, 330, 370, 350, 357])
    assert start == 6 and after / before < 1 / SHIFT_RATIO


def test_a_level_must_hold_for_min_steps():
    later = [100.0] * 6 + [300.0] * (MIN_LEVEL_STEPS - 1)
    assert find_shift(later) is None
    assert find_shift(later + [300.0]) is not None


def test_single_outliers_are_not_a_shift():
    assert find_shift([100, 102, 99, 400, 101, 98, 100, 103, 97, 420, 100]) is None


def test_a_change_below_the_ratio_is_noise():
    assert find_shift([100, 101, 99, 100, 100 * SHIFT_RATIO * 0.95, 119, 118, 120]) is None


def test_alternating_levels_are_not_sustained():
    assert find_shift([60, 180, 60, 180, 60, 180, 60, 180, 60, 180]) is None


def test_too_few_steps():
    assert find_shift([10, 10, 30]) is None and find_shift([]) is None


def straddling_run(folder: str) -> None:
    """One rank; call 0's decode steps 1-4 at 10 ms and 5-8 at 30 ms; the trace profiles steps 3-6, where a
    host op (`aten::planner`) grows from 1 to 15 ms per step across the change."""
    b = TraceBuilder(0, world_size=1, distributed=False)
    t = 0.0
    for step in range(3, 7):
        length = 10_000.0 if step < 5 else 30_000.0
        b.host_range(f"dstrace/step#{step}", t, length - 10.0)
        b.host_range("aten::planner", t + 100.0, 1_000.0 if step < 5 else 15_000.0, cat="cpu_op")
        b.compute(t + 200.0, 2_000.0)
        t += length
    b.write(folder, "host_rank0.1.pt.trace.json.gz")
    path = write_manifest(folder, 0, world_size=1, step_ms=[50.0] + [10.0] * 4 + [30.0] * 4)
    with open(path) as f:
        m = json.load(f)
    m["window"] = {"mode": "full", "call": 0, "start": 3, "steps": 4, "recorded_steps": [3, 4, 5, 6],
                   "trace_file": "host_rank0.1.pt.trace.json.gz"}
    with open(path, "w") as f:
        json.dump(m, f)


def test_a_window_across_the_change_names_what_grew(tmp_path):
    straddling_run(str(tmp_path))
    a = analyze_dir(tmp_path)
    f = next(f for f in a.findings if f.id == "step-time-shift")
    call = f.evidence["calls"]["0"]
    assert call["start"] == 5 and call["window"]["where"] == "straddles"
    grew = max(call["work_growth_us"].items(), key=lambda kv: kv[1]["after_us"] - kv[1]["before_us"])
    assert grew[0] == "aten::planner"
    assert grew[1]["before_us"] == pytest.approx(1_000.0) and grew[1]["after_us"] == pytest.approx(15_000.0)
    assert "aten::planner grew from 1.00 to 15.00 ms per step" in f.cause
    assert "straddles the change" in f.summary


def test_no_shift_no_finding(tmp_path):
    write_manifest(str(tmp_path), 0, world_size=1, step_ms=[50.0] + [10.0, 11.0, 10.5, 9.8, 10.2, 10.1])
    write_run_record(str(tmp_path), world_size=1)
    assert "step-time-shift" not in {f.id for f in analyze_dir(tmp_path).findings}
