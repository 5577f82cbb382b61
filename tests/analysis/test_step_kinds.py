"""Steps of each kind (unprofiled, profiled, the profiler's warm-up, start and stop) compared like with like: the
three H200 cases of issue #25 with their numbers, the profiler's own cost, window-not-representative, steps
counted per rank, and `dstrace analyze --steps A:B --against C:D`."""
from __future__ import annotations

import json

import pytest

from dstrace.analysis.reduction import STEP_WORK_ITEMS
from dstrace.analysis.render import render
from dstrace.analysis.steps import decode_step_ms
from dstrace.errors import UserError
from dstrace.runfolder.records import read_manifest
from tests.fixtures.reports import analyze_dir, analyze_main, findings_by_id
from tests.fixtures.runs import write_manifest, write_run_record
from tests.fixtures.traces import TraceBuilder

TAIL = 32  # decode steps 0-31 (step 0 the prefill), as the H200 runs of the issue


def manifest_run(folder, call2: list[float], recorded: list[int], kinds: list[str] | None = None,
                 call1: list[float] | None = None, ranks: int = 1) -> None:
    """Call 1 a warm-up call, call 2 the timed one holding the window (`recorded`), as the issue's runs were
    recorded: without `kinds`, a manifest from before kinds were recorded."""
    assert kinds is None or len(kinds) == len(call2)
    for rank in range(ranks):
        path = write_manifest(str(folder), rank, world_size=ranks, step_ms=call1 or [30.0] * TAIL)
        with open(path) as f:
            m = json.load(f)
        m["calls"][0]["index"] = 1
        m["calls"].append({**m["calls"][0], "index": 2, "step_ms": call2, "gathered_bytes": [],
                           "step_kinds": kinds or []})
        m["window"] = {"mode": "full", "call": 2, "start": recorded[0], "steps": len(recorded),
                       "recorded_steps": recorded, "trigger": "generate step"}
        with open(path, "w") as f:
            json.dump(m, f)
    write_run_record(str(folder), world_size=ranks)


def traced_steps(folder, steps: dict[int, float], grows_from: int, item: str = "aten::_cudnn_attention_forward",
                 before_us: float = 2_500.0, after_us: float = 20_000.0) -> None:
    """Rank 0's trace of the steps given (step -> ms), `item` taking `before_us` per step before `grows_from` and
    `after_us` from it on; a GPU kernel of the same length in each step."""
    b = TraceBuilder(0, world_size=1, distributed=False)
    t = 0.0
    for step, ms in sorted(steps.items()):
        b.host_range(f"dstrace/step#{step}", t, ms * 1e3 - 10.0)
        b.host_range(item, t + 100.0, before_us if step < grows_from else after_us, cat="cpu_op")
        b.kernel("void flash_fwd_kernel<64>", t + 200.0, 1_000.0)
        t += ms * 1e3
    b.write(str(folder), "host_rank0.1.pt.trace.json.gz")


# ---- case 1: window steps 2-5, boundary steps 104 and 196 ms, the change at step 4 -------------------------
CASE1 = [40.0, 36.0, 104.0, 62.0, 108.0, 196.0] + [58.0] * (TAIL - 6)


def test_case1_the_shift_is_placed_where_it_happens_not_at_the_boundary_steps(tmp_path):
    manifest_run(tmp_path, CASE1, [2, 3, 4, 5])
    traced_steps(tmp_path, {2: 104.0, 3: 62.0, 4: 108.0, 5: 196.0}, grows_from=4)
    a = analyze_dir(tmp_path)
    f = findings_by_id(a).get("step-time-shift")
    call = f.evidence["calls"]["2"]
    assert call["start"] == 4
    assert call["levels"]["unprofiled"]["before_ms"] == 36.0 and call["levels"]["unprofiled"]["after_ms"] == 58.0
    assert call["levels"]["profiled"] == {"before_ms": 62.0, "after_ms": 108.0, "before_steps": [3],
                                          "after_steps": [4]}
    assert "104" not in f.summary and "steps 1-5" not in f.summary
    assert call["window"] == {"where": "straddles", "call": 2, "steps": [3, 4]}
    grew = call["work_growth_us"]["aten::_cudnn_attention_forward"]
    assert grew["before_us"] == pytest.approx(2_500.0) and grew["after_us"] == pytest.approx(20_000.0)


# ---- case 2: window steps 1-6 covering the change (2-3 at 36, 4-5 at 76, both profiled) --------------------
CASE2 = [24.0, 64.0, 36.0, 36.0, 78.0, 75.0, 293.0] + [59.0] * (TAIL - 7)


def test_case2_a_window_covering_the_change_finds_it_and_names_what_grew(tmp_path):
    manifest_run(tmp_path, CASE2, [1, 2, 3, 4, 5, 6])
    traced_steps(tmp_path, {1: 64.0, 2: 36.0, 3: 36.0, 4: 78.0, 5: 75.0, 6: 293.0}, grows_from=4,
                 item="aten::_cudnn_attention_forward")
    a = analyze_dir(tmp_path)
    f = findings_by_id(a).get("step-time-shift")
    call = f.evidence["calls"]["2"]
    assert call["start"] == 4 and call["kind"] == "profiled"
    assert call["before_ms"] == 36.0 and call["after_ms"] == 76.5
    assert call["window"]["where"] == "straddles" and call["window"]["steps"] == [2, 3, 4, 5]
    assert "aten::_cudnn_attention_forward 2.50 -> 20.00 ms" in f.summary
    assert "grew from 2.50 to 20.00 ms per step" in f.cause


# ---- case 3: ZeRO-3, window steps 2-25 at ~292 ms, ~212 ms unprofiled: no change of regime -------------------
CASE3 = [300.0, 212.0, 600.0] + [292.0] * 22 + [700.0] + [212.0] * (TAIL - 26)


def test_case3_the_profilers_cost_is_no_shift_and_is_a_figure_of_its_own(tmp_path):
    manifest_run(tmp_path, CASE3, list(range(2, 26)), call1=[300.0] + [212.0] * (TAIL - 1))
    a = analyze_dir(tmp_path)
    assert findings_by_id(a).get("step-time-shift") is None
    assert findings_by_id(a).get("window-not-representative") is None
    cost = a.steps.profiler_cost
    assert (cost["profiled_ms"], cost["unprofiled_ms"]) == (292.0, 212.0)
    assert cost["added_ms"] == pytest.approx(80.0) and round(cost["ratio"], 2) == 1.38
    assert cost["profiled_steps"] == 22  # the start (2) and stop (25) steps are in neither side
    assert "the profiler added 80.0 ms per step (1.38x)" in " ".join(render(a, "text").split())


# ---- window-not-representative ---------------------------------------------------------------------------------
def test_profiler_overhead_alone_is_not_an_unrepresentative_window(tmp_path):
    """As on CPU, where 11 of 11 generate() recordings got the finding: profiled steps 1.6x the unprofiled ones of
    the same call, the stop step 5x, the call at the run's level."""
    kinds = (["profiler-warmup", "profiler-start"] + ["profiled"] * 3 + ["profiler-stop"]
             + ["unprofiled"] * (TAIL - 6))
    manifest_run(tmp_path, [40.0, 20.0, 32.0, 33.0, 31.0, 100.0] + [20.0] * (TAIL - 6), [2, 3, 4],
                 kinds=kinds, call1=[40.0] + [20.0] * (TAIL - 1))
    a = analyze_dir(tmp_path)
    assert findings_by_id(a).get("window-not-representative") is None
    assert a.steps.profiler_cost["profiled_ms"] == 32.0 and a.steps.profiler_cost["unprofiled_ms"] == 20.0


def test_a_window_at_another_level_is_unrepresentative_and_says_which_part_is_the_profiler(tmp_path):
    """The window's call runs at 40 ms per unprofiled step, the other call at 20: a level of its own; its profiled
    steps at 60 ms carry 20 ms of the profiler's own on top."""
    kinds = ["unprofiled", "profiler-start"] + ["profiled"] * 3 + ["profiler-stop"] + ["unprofiled"] * (TAIL - 6)
    manifest_run(tmp_path, [50.0, 90.0, 60.0, 60.0, 60.0, 120.0] + [40.0] * (TAIL - 6), [2, 3, 4],
                 kinds=kinds, call1=[50.0] + [20.0] * (TAIL - 1) * 3)
    a = analyze_dir(tmp_path)
    f = findings_by_id(a).get("window-not-representative")
    assert f.evidence["level_ms"] == 40.0 and f.evidence["ms_per_step"] == 20.0 and f.evidence["ratio"] == 2.0
    assert f.evidence["profiler_cost"]["added_ms"] == 20.0
    assert "the profiler added 20.0 ms per step (1.50x)" in f.summary
    text = " ".join(render(a, "text").split())  # the terminal layout wraps lines
    assert f.evidence["profiler_cost"]["line"] in text  # the same figure as the Steps line
    assert "--window-call 1" in f.remedy


# ---- kinds as recorded, and as inferred for older manifests ---------------------------------------------------------
def test_recorded_kinds_leave_out_every_step_the_profiler_touched(tmp_path):
    kinds = ["profiler-warmup", "profiler-start", "profiled", "profiled", "profiler-stop", "unprofiled"]
    manifest_run(tmp_path, [9.0, 1.0, 2.0, 3.0, 4.0, 5.0], [2, 3], kinds=kinds, call1=[9.0, 7.0])
    m = read_manifest(str(tmp_path / "rank0.manifest.json"))
    assert decode_step_ms(m) == [7.0, 5.0]


def test_older_manifests_have_their_first_and_last_window_steps_as_the_profilers():
    """Recorded before kinds were: the profiler started as step 2 began and stopped as step 5 ended."""
    from dstrace.analysis.step_kinds import step_kinds
    from dstrace.runfolder.records import MANIFEST_SCHEMA, GenerationCall, Manifest, Window
    call = GenerationCall(index=2, api="generate", model_class="M", step_ms=CASE1[:8])
    m = Manifest(schema=MANIFEST_SCHEMA, run_id="r", status="complete", rank=0, local_rank=0, world_size=1,
                 host="h", pid=1, started=0.0, calls=[call],
                 window=Window(mode="full", call=2, start=2, steps=4, recorded_steps=[2, 3, 4, 5]))
    assert step_kinds(m, call) == ["unprofiled", "unprofiled", "profiler-start", "profiled", "profiled",
                                   "profiler-stop", "unprofiled", "unprofiled"]


# ---- steps counted as iterations, not iterations x ranks -----------------------------------------------------------
def test_one_iteration_seen_by_eight_ranks_is_one_step(tmp_path):
    for rank in range(8):
        b = TraceBuilder(rank, world_size=8)
        b.host_range("ProfilerStep#3", 0.0, 5_000.0)
        b.compute(100.0, 2_000.0)
        b.write(str(tmp_path), f"host_rank{rank}.1.pt.trace.json.gz")
    a = analyze_dir(tmp_path)
    text = render(a, "text")
    assert "median of 8 step times (1 per rank, 8 ranks)" in text
    assert "median of 8 profiled" not in text


# ---- dstrace analyze --steps A:B --against C:D ---------------------------------------------------------------
def test_steps_against_compares_two_ranges_by_name(tmp_path, capsys):
    manifest_run(tmp_path, CASE2, [1, 2, 3, 4, 5, 6])
    traced_steps(tmp_path, {1: 64.0, 2: 36.0, 3: 36.0, 4: 78.0, 5: 75.0, 6: 293.0}, grows_from=4,
                 item="aten::index_select")
    assert analyze_main(str(tmp_path), "--steps", "1:3", "--against", "4:6", "--format", "json") == 0
    out = json.loads(capsys.readouterr().out)
    assert out["schema"] == "dstrace.steps/1" and out["ranks"] == [0]
    assert out["steps_used"] == [2, 3] and out["against_used"] == [4, 5]
    assert out["left_out"] == {"1": "profiler-start", "6": "profiler-stop"}
    top = out["items"][0]
    assert (top["name"], top["kind"]) == ("aten::index_select", "host")
    assert top["steps_ms"] == pytest.approx(2.5) and top["against_ms"] == pytest.approx(20.0)
    kernel = next(i for i in out["items"] if i["kind"] == "kernel")
    assert kernel["name"] == "void flash_fwd_kernel<64>" and kernel["change_ms"] == pytest.approx(0.0)
    assert analyze_main(str(tmp_path), "--steps", "2", "--against", "5", "--rank", "0") == 0
    text = capsys.readouterr().out
    assert "compared: step 2 against step 5" in text and "aten::index_select" in text


@pytest.mark.parametrize("argv, message", [
    (("--steps", "3:2", "--against", "4:5"), "must be >= 0 and not after the last"),
    (("--steps", "two", "--against", "4:5"), "takes steps as A:B"),
    (("--steps", "2:3"), "go together"),
    (("--steps", "20:21", "--against", "4:5"), "not both in the traces"),
    (("--steps", "1:1", "--against", "4:5"), "left out as the profiler's own: 1"),
    (("--steps", "2:3", "--against", "4:5", "--rank", "3"), "rank 3 has no traced steps"),
])
def test_steps_against_refuses_what_it_cannot_compare(tmp_path, argv, message):
    manifest_run(tmp_path, CASE2, [1, 2, 3, 4, 5, 6])
    traced_steps(tmp_path, {1: 64.0, 2: 36.0, 3: 36.0, 4: 78.0, 5: 75.0, 6: 293.0}, grows_from=4)
    with pytest.raises(UserError, match=message):
        analyze_main(str(tmp_path), *argv)


def test_calls_whose_steps_overlap_are_one_level_however_their_medians_fall(tmp_path):
    """The window's call at a median 1.3x the run's, but its steps spread over the other call's: noise, not a
    level of its own (on a shared CPU a call's steps spread 2x and more)."""
    kinds = ["unprofiled", "profiler-start"] + ["profiled"] * 3 + ["profiler-stop"] + ["unprofiled"] * 11
    call2 = [50.0, 90.0, 40.0, 40.0, 40.0, 120.0] + [28.0, 14.0, 40.0, 28.0, 36.0, 30.0, 18.0, 28.0, 34.0, 16.0,
                                                     29.0]
    call1 = [50.0] + [12.0, 30.0, 14.0, 26.0, 20.0, 16.0, 24.0, 18.0, 22.0, 21.0] * 3
    manifest_run(tmp_path, call2, [2, 3, 4], kinds=kinds, call1=call1)
    a = analyze_dir(tmp_path)
    assert a.steps.ms_per_step < 0.8 * 28.0  # the window call's level is 28 ms: outside the ratio...
    assert findings_by_id(a).get("window-not-representative") is None  # ...but not apart from the run's other steps


@pytest.mark.parametrize("others, listed", [(3, ["aten::argmax"]), (STEP_WORK_ITEMS - 1, [])])
def test_items_only_one_range_has_are_listed_only_where_the_other_kept_all_its_items(tmp_path, capsys, others,
                                                                                        listed):
    """Steps 2-3 run aten::argmax, steps 4-5 do not: listed as only in 2:3, unless steps 4-5 held
    STEP_WORK_ITEMS items (aten::linear and STEP_WORK_ITEMS - 1 more), when an item missing there may only
    have fallen below their top."""
    manifest_run(tmp_path, CASE2, [1, 2, 3, 4, 5, 6])
    b = TraceBuilder(0, world_size=1, distributed=False)
    for step in (1, 2, 3, 4, 5, 6):
        t = step * 100_000.0
        b.host_range(f"dstrace/step#{step}", t, 90_000.0)
        names = ["aten::linear"] + (["aten::argmax"] if step < 4 else [f"aten::op{i}" for i in range(others)])
        for i, name in enumerate(names):
            b.host_range(name, t + 100.0 + i * 1_000.0, 500.0, cat="cpu_op")
    b.write(str(tmp_path), "host_rank0.1.pt.trace.json.gz")
    assert analyze_main(str(tmp_path), "--steps", "2:3", "--against", "4:5", "--format", "json") == 0
    out = json.loads(capsys.readouterr().out)
    assert out["only_in_steps"] == listed
    assert out["only_in_against"] == sorted(f"aten::op{i}" for i in range(others))  # steps 2-3 kept all theirs
