"""The report kept beside the traces: asked again with nothing changed, the same bytes come back without
an analysis; any change to what the report depends on makes it analyze again."""
import glob
import json
import os
import subprocess
import sys
import time

from dstrace.runfolder.folder import RunFolder
from dstrace.analysis import report_cache
from tests.fixtures.processes import dstrace
from tests.fixtures.traces import TraceBuilder, write_zero3_traces

KEPT = "nothing in the folder changed"


def folder_of_two_ranks(folder):
    write_zero3_traces(str(folder), world_size=2, steps=3, layers=3)
    return folder


def analyze(folder, *args):
    proc = dstrace("analyze", str(folder), *args)
    assert proc.returncode == 0, proc.stderr
    return proc


def test_the_same_report_again_without_an_analysis(tmp_path):
    folder_of_two_ranks(tmp_path)
    first = analyze(tmp_path, "--format", "json")
    second = analyze(tmp_path, "--format", "json")
    assert KEPT not in first.stderr and KEPT in second.stderr
    assert second.stdout == first.stdout and json.loads(second.stdout)["ranks"]
    assert "analyzing" not in second.stderr and "parsing trace" not in second.stderr


def test_a_kept_report_imports_no_pandas(tmp_path):
    """What makes it fast: building the command line and checking the key need the standard library only."""
    folder_of_two_ranks(tmp_path)
    analyze(tmp_path)
    code = ("import sys; from dstrace import cli; rc = cli.main(['analyze', sys.argv[1], '-o', sys.argv[2]]); "
            "sys.exit(rc if 'pandas' not in sys.modules else 99)")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path), str(tmp_path / "out.txt")],
                          capture_output=True, text=True)
    assert proc.returncode == 0 and KEPT in proc.stderr, proc.stderr


def test_each_change_it_depends_on_analyzes_again(tmp_path):
    folder_of_two_ranks(tmp_path)
    analyze(tmp_path)
    assert KEPT in analyze(tmp_path).stderr
    assert KEPT not in analyze(tmp_path, "--format", "markdown").stderr  # another format
    assert KEPT not in analyze(tmp_path, "--align-clocks", "never").stderr  # another option
    assert KEPT not in analyze(tmp_path).stderr  # the default options again: their report is made anew
    trace = sorted(glob.glob(str(tmp_path / "*.pt.trace.json.gz")))[0]
    later = time.time() + 5
    os.utime(trace, (later, later))  # a trace touched, its bytes the same: the same answer
    assert KEPT in analyze(tmp_path).stderr
    b = TraceBuilder(0)
    b.compute(10.0, 5.0)
    b.write(str(tmp_path), os.path.basename(trace))  # a trace rewritten
    assert KEPT not in analyze(tmp_path).stderr
    assert KEPT in analyze(tmp_path).stderr
    (tmp_path / "notes.txt").write_text("a new file in the folder")
    assert KEPT not in analyze(tmp_path).stderr


def test_warnings_come_back_with_the_kept_report(tmp_path):
    folder_of_two_ranks(tmp_path)
    os.unlink(sorted(glob.glob(str(tmp_path / "*.pt.trace.json.gz")))[1])
    first, second = analyze(tmp_path), analyze(tmp_path)
    warned = [line for line in first.stderr.splitlines() if line.startswith("dstrace: warning:")]
    assert warned and warned == [line for line in second.stderr.splitlines() if line.startswith("dstrace: warning:")]
    assert KEPT in second.stderr


def test_a_damaged_or_unwritable_kept_report_only_costs_speed(tmp_path):
    folder_of_two_ranks(tmp_path)
    first = analyze(tmp_path)
    kept = report_cache.path(str(tmp_path), "text")
    with open(kept, "w") as f:
        f.write("{not json")
    again = analyze(tmp_path)
    assert KEPT not in again.stderr and again.stdout == first.stdout
    os.unlink(kept)
    os.mkdir(kept)  # the name is taken by a folder: keeping the report fails
    assert analyze(tmp_path).stdout == first.stdout
    assert KEPT not in analyze(tmp_path).stderr


def test_a_kept_reduction_counts_in_the_key_only_without_its_trace(tmp_path):
    """Beside its trace a kept reduction is derived from it (rewriting it leaves the key); without its trace it
    is the rank, and a change to it is a change to the run."""
    from dstrace.analysis import kept
    from dstrace.analysis.loading import load_run

    folder_of_two_ranks(tmp_path)
    load_run(str(tmp_path), progress=lambda m: None)
    (path,) = [p for p in glob.glob(str(tmp_path / f"*{kept.SUFFIX}")) if "_rank1." in p]
    before = report_cache.key(RunFolder.scan(str(tmp_path)), {})
    got = kept.KeptReduction.load(path)
    got.reduced.utilization["span_us"] += 1.0
    got.save(path)
    assert report_cache.key(RunFolder.scan(str(tmp_path)), {}) == before
    for trace in glob.glob(str(tmp_path / "*.pt.trace.json.gz")):
        os.remove(trace)
    alone = report_cache.key(RunFolder.scan(str(tmp_path)), {})
    got.reduced.utilization["span_us"] += 1.0
    got.save(path)
    assert report_cache.key(RunFolder.scan(str(tmp_path)), {}) != alone
