"""Traces of the field's shapes that dstrace was not built on (issue 24): figures that mean what their
words say, and remedies only where the trace or manifest shows their mechanism."""
from __future__ import annotations

import synthetic
from helpers import analyze_dir

from dstrace.analysis.render import render


def one_step_trace(folder, step_name: str = "ProfilerStep#0") -> None:
    """torch.profiler's own output over one step: a ProfilerStep range, CPU ops and their kernels, no dstrace range."""
    b = synthetic.TraceBuilder(0, world_size=1, distributed=False, dstrace_meta=None, run_id=None)
    b.host_range(step_name, 0.0, 2_000.0)
    for i in range(4):
        b.host_range("aten::mm", 100.0 + i * 400.0, 50.0, cat="cpu_op")
        b.compute(200.0 + i * 400.0, 150.0, launch_ts=110.0 + i * 400.0)
    b.write(str(folder))


def test_one_profiler_step_without_dstrace_ranges_is_analyzed(tmp_path):
    one_step_trace(tmp_path)
    a = analyze_dir(tmp_path)
    assert a.steps.source == "ProfilerStep ranges" and a.steps.count == 1
    assert a.ranks[0].busy_us["compute"] == 600.0
    for fmt in ("text", "json", "markdown"):
        assert render(a, fmt)
