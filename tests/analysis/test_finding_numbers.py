"""A finding and the table or line beside it print one value the same way (`dstrace.units`): a reader who
looks a finding's number up in the report's tables finds it written alike."""
import os

from dstrace.analysis.render.common import rank_rows, steps_line
from tests.fixtures.paths import TRACES
from tests.fixtures.reports import analyze_dir
from tests.fixtures.runs import write_manifest
from tests.fixtures.traces import write_zero3_traces


def test_a_gathered_size_reads_alike_in_the_finding_and_the_steps_line(tmp_path):
    """500 MB gathered per step: the finding said 0.50 GB where the Steps line said 500.00 MB."""
    write_zero3_traces(str(tmp_path), layer_nelems=62_500_000)  # 4 layers of bf16 weights a step
    for r in range(2):
        write_manifest(str(tmp_path), r, logical_bytes=500_000_000)
    a = analyze_dir(tmp_path)
    f = next(f for f in a.findings if f.id == "zero3-gathers-model-per-step")
    assert f.evidence["gathered_bytes_median"] == 500_000_000
    assert "gathers 500.00 MB per rank" in f.summary and "of the model's 500.00 MB" in f.summary
    assert "gathered 500.00 MB per step" in steps_line(a) and "vs model 500.00 MB" in steps_line(a)


def test_a_span_reads_alike_in_host_bound_and_the_time_per_rank_table():
    a = analyze_dir(os.path.join(TRACES, "h200-device-map"))
    f = next(f for f in a.findings if f.id == "host-bound")
    worst = f.evidence["worst_rank"]
    head, rows = rank_rows(a)
    span = next(row[head.index("span")] for row in rows if row[0] == str(worst))
    assert f.summary.startswith("GPU idle ") and f" of {span} on rank {worst}" in f.summary
