import numpy as np
import pandas as pd

from dstrace.analysis import intervals


def test_merge_gaps_and_total():
    m = intervals.merge([0, 5, 20, 22], [10, 8, 25, 30])
    assert m.values.tolist() == [[0, 10], [20, 30]]
    assert intervals.total(m) == 20
    assert intervals.gaps(m).values.tolist() == [[10, 20]]
    assert intervals.gaps(m, -5, 40).values.tolist() == [[-5, 0], [10, 20], [30, 40]]


def test_covered_counts_each_event_against_the_union():
    m = intervals.merge([0, 20], [10, 30])
    got = intervals.covered(m, [5, 8, 12, -5], [15, 25, 18, 40])
    assert np.allclose(got, [5, 7, 0, 20])


def test_top_level_drops_nested_ops():
    ev = pd.DataFrame({"pid": [1] * 4, "tid": [1, 1, 1, 2], "ts": [0.0, 1.0, 20.0, 2.0],
                       "dur": [10.0, 2.0, 5.0, 1.0], "name": ["outer", "inner", "next", "other thread"]})
    ev["end"] = ev["ts"] + ev["dur"]
    assert sorted(intervals.top_level(ev)["name"]) == ["next", "other thread", "outer"]
