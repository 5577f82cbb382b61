"""The statistics behind a comparison, on hand-made manifests and spreads."""
from __future__ import annotations

from dstrace.analysis.steps import decode_step_ms
from dstrace.comparison.model import Spread
from dstrace.comparison.stats import decode_gathered_bytes, indistinguishable, same_bytes, spread
from dstrace.runfolder.records import MANIFEST_SCHEMA, GenerationCall, Manifest, Window


def manifest(calls: list[list[float]], window: Window | None) -> Manifest:
    return Manifest(schema=MANIFEST_SCHEMA, run_id="r", status="complete", rank=0, local_rank=0, world_size=1,
                    host="h", pid=1, started=0.0, window=window,
                    calls=[GenerationCall(index=i + 1, api="chat", model_class="M", step_ms=steps,
                                          gathered_bytes=[10 * (j + 1) for j in range(len(steps))])
                           for i, steps in enumerate(calls)])


def test_decode_steps_leave_out_prefill_and_the_profiled_steps_of_the_profiled_call():
    window = Window(mode="full", call=1, start=2, steps=2, recorded_steps=[2, 3])
    m = manifest([[100.0, 1.0, 50.0, 60.0, 2.0], [100.0, 3.0, 4.0, 5.0, 6.0]], window)
    assert decode_step_ms(m) == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]


def test_annotate_mode_has_no_profiler_overhead_to_leave_out():
    window = Window(mode="annotate", call=1, start=2, steps=2, recorded_steps=[2, 3])
    assert decode_step_ms(manifest([[100.0, 1.0, 2.0, 3.0]], window)) == [1.0, 2.0, 3.0]


def test_failed_calls_count_no_steps():
    m = manifest([[100.0, 1.0], [100.0, 2.0]], None)
    m.calls[0].error = "RuntimeError: boom"
    assert decode_step_ms(m) == [2.0]
    assert decode_gathered_bytes(m) == [20]


def test_spread_is_median_and_range_of_the_runs_with_a_value():
    s = spread([3.0, None, 1.0, 2.0, 10.0])
    assert (s.median, s.low, s.high, s.runs) == (2.5, 1.0, 10.0, 4)
    assert spread([None]) is None


def test_indistinguishable_needs_each_median_inside_the_other_range():
    a = Spread(median=10.0, low=9.0, high=11.0, runs=3)
    b = Spread(median=10.5, low=8.0, high=13.0, runs=3)
    c = Spread(median=12.0, low=8.0, high=13.0, runs=3)  # a's median is in c's range, c's is not in a's
    assert indistinguishable(a, b) and indistinguishable(b, a)
    assert not indistinguishable(a, c) and not indistinguishable(c, a)


def test_single_runs_tie_only_when_equal():
    one = Spread(median=5.0, low=5.0, high=5.0, runs=1)
    assert indistinguishable(one, Spread(5.0, 5.0, 5.0, 1))
    assert not indistinguishable(one, Spread(5.1, 5.1, 5.1, 1))


def test_same_bytes_within_one_percent():
    assert same_bytes(1000.0, 1009.0)
    assert not same_bytes(1000.0, 1020.0)
    assert not same_bytes(None, 1000.0)
