"""A range is opened only when something records it: the ZeRO-3 hooks skip it otherwise (docs/performance.md)."""
from __future__ import annotations

import pytest
import torch

from dstrace.recording import ranges


@pytest.fixture
def window_closed():
    yield
    ranges.set_profiling(False)


def test_ranges_are_recorded_only_inside_the_window(window_closed):
    if ranges._domain is not None:
        pytest.skip("an NVTX tool records this process: every range is wanted")
    assert ranges.active is False
    ranges.set_profiling(True)
    assert ranges.active is True
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with ranges.span("zero3.fetch Layer#1"):
            torch.ones(1).add_(1)
    assert "dstrace/zero3.fetch Layer#1" in {e.name for e in prof.events()}
    ranges.set_profiling(False)
    assert ranges.active is False
