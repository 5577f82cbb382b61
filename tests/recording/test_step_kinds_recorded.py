"""Real CPU recordings: the profiler's warm-up, start and stop fall in steps outside the window, the manifest says
which (calls[].step_kinds), and the analysis of a run as a new user records it finds no unrepresentative window."""
from __future__ import annotations

import sys

from tests.fixtures.paths import JOB
from tests.fixtures.processes import analyze_json, dstrace
from tests.fixtures.runs import manifests, trace_paths
from tests.fixtures.traces import read_trace


def traced_steps(path: str) -> list[str]:
    return sorted(e["name"] for e in read_trace(path)["traceEvents"]
                  if e.get("cat") == "user_annotation" and e["name"].startswith("dstrace/step#"))


def test_the_profilers_start_and_stop_fall_outside_the_window(tmp_path):
    run_dir = str(tmp_path / "generate")
    result = dstrace("record", "-o", run_dir, "--", sys.executable, JOB)
    assert result.returncode == 0, result.stderr[-3000:]
    (m,) = manifests(run_dir).values()
    (call,) = m["calls"]
    assert call["step_kinds"] == ["profiler-warmup", "profiler-start", "profiled", "profiled", "profiled",
                                  "profiler-stop", "unprofiled", "unprofiled"]
    assert m["window"]["recorded_steps"] == [2, 3, 4]
    (path,) = trace_paths(run_dir)
    assert traced_steps(path) == ["dstrace/step#2", "dstrace/step#3", "dstrace/step#4"]
    a = analyze_json(run_dir)
    assert "window-not-representative" not in {f["id"] for f in a["findings"]}
    cost = a["steps"]["profiler_cost"]
    assert cost["profiled_steps"] == 3 and cost["unprofiled_steps"] == 2
    assert a["steps"]["ms_per_step_samples"] == 2  # steps 6 and 7: the prefill and the profiler's steps left out


def test_a_window_from_step_0_starts_in_its_first_step(tmp_path):
    """No step before it: step 0 is both the profiler's start and recorded; the stop is in the step after."""
    run_dir = str(tmp_path / "from0")
    result = dstrace("record", "-o", run_dir, "--window-start", "0", "--window-steps", "2", "--",
                     sys.executable, JOB)
    assert result.returncode == 0, result.stderr[-3000:]
    (m,) = manifests(run_dir).values()
    assert m["calls"][0]["step_kinds"][:4] == ["profiler-start", "profiled", "profiler-stop", "unprofiled"]
    assert m["window"]["recorded_steps"] == [0, 1]
    (path,) = trace_paths(run_dir)
    assert traced_steps(path) == ["dstrace/step#0", "dstrace/step#1"]


def test_zero3_ranks_record_the_kinds_of_their_steps(zero3_run):
    """The report's path on two gloo ranks: the same kinds on each rank, and no window called unrepresentative
    for the profiler's own cost."""
    run_dir, result = zero3_run
    assert result.returncode == 0, result.stderr[-3000:]
    for m in manifests(run_dir).values():
        kinds = m["calls"][0]["step_kinds"]
        assert kinds[:6] == ["profiler-warmup", "profiler-start", "profiled", "profiled", "profiled",
                             "profiler-stop"]
    a = analyze_json(run_dir)
    assert "window-not-representative" not in {f["id"] for f in a["findings"]}
