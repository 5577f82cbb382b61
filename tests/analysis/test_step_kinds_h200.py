"""Issue #25 on the runs recorded on one H200 (traces/h200-steps: random-weight Qwen2-7B stand-ins, bf16, 32 new
tokens, two chat() calls, the window in call 2, steps 2-4; `launch/steps_device.sh`), each recorded twice with
the code before the boundary steps were kept out of the window (`old-N`, ff03bd2) and twice after (`new-N`).
What the manifests show is checked against what the step analysis makes of them."""
from __future__ import annotations

import glob
import os
import statistics

import pytest

from dstrace.analysis.shift import call_shifts, profiler_cost, window_steps
from dstrace.analysis.step_kinds import BOUNDARY_KINDS, PROFILED, START, STOP, UNPROFILED, step_kinds
from dstrace.runfolder.records import read_manifest

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "traces",
                    "h200-steps")
RUNS = sorted(glob.glob(os.path.join(ROOT, "*", "*-[0-9]")))
NEW = [r for r in RUNS if os.path.basename(r).startswith("new-")]
OLD = [r for r in RUNS if os.path.basename(r).startswith("old-")]


def manifest(run):
    return read_manifest(os.path.join(run, "rank0.manifest.json"))


def window_call(m):
    return next(c for c in m.calls if c.index == m.window.call)


def test_the_gpu_runs_are_here():
    assert len(NEW) == 4 and len(OLD) == 4, RUNS


@pytest.mark.parametrize("run", NEW, ids=lambda r: os.path.relpath(r, ROOT))
def test_new_recording_keeps_start_and_stop_outside_the_window(run):
    m = manifest(run)
    kinds = window_call(m).step_kinds
    recorded = sorted(m.window.recorded_steps)
    assert len(kinds) == len(window_call(m).step_ms)
    assert all(kinds[s] == PROFILED for s in recorded)
    assert kinds.index(START) == recorded[0] - 1 and kinds.index(STOP) == recorded[-1] + 1
    assert window_steps(m) == (m.window.call, recorded)


@pytest.mark.parametrize("run", OLD, ids=lambda r: os.path.relpath(r, ROOT))
def test_old_recording_is_read_with_its_boundaries_inside_the_window(run):
    """Before kinds were recorded, the profiler started in the window's first step and stopped in its last:
    the kinds are inferred so, and only the step between them counts as profiled."""
    m = manifest(run)
    call = window_call(m)
    assert call.step_kinds == []
    recorded = sorted(m.window.recorded_steps)
    kinds = step_kinds(m, call)
    assert kinds[recorded[0]] == START and kinds[recorded[-1]] == STOP
    assert window_steps(m)[1] == recorded[1:-1]


@pytest.mark.parametrize("run", RUNS, ids=lambda r: os.path.relpath(r, ROOT))
def test_no_shift_is_placed_at_the_profilers_own_steps(run):
    """The start and stop steps (1.1-7.4x an unprofiled step on these runs) are never where a level changes."""
    m = manifest(run)
    for shift in call_shifts(m):
        call = next(c for c in m.calls if c.index == shift.call)
        kinds = step_kinds(m, call)
        assert kinds[shift.start] not in BOUNDARY_KINDS, (shift, kinds)
        before = [ms for i, ms in enumerate(call.step_ms[1:shift.start], 1) if kinds[i] == UNPROFILED]
        after = [ms for i, ms in enumerate(call.step_ms[shift.start:], shift.start) if kinds[i] == UNPROFILED]
        assert before and after, shift


@pytest.mark.parametrize("run", NEW, ids=lambda r: os.path.relpath(r, ROOT))
def test_profiler_cost_is_profiled_against_unprofiled_steps_of_one_level(run):
    m = manifest(run)
    call = window_call(m)
    cost = profiler_cost({0: m})
    assert cost is not None and cost.call == call.index
    shift = next((s for s in call_shifts(m) if s.call == call.index), None)
    recorded = sorted(m.window.recorded_steps)
    same_level = (lambda i: True) if shift is None else (lambda i: (i >= shift.start) == (recorded[0] >= shift.start))
    unprofiled = [ms for i, (ms, k) in enumerate(zip(call.step_ms, call.step_kinds))
                  if i > 0 and k == UNPROFILED and same_level(i)]
    assert cost.profiled_ms == pytest.approx(statistics.median(call.step_ms[s] for s in recorded))
    assert cost.unprofiled_ms == pytest.approx(statistics.median(unprofiled))
    assert cost.line().startswith(f"the profiler added {cost.added_ms:.1f} ms per step ({cost.ratio:.2f}x)")
