"""`dstrace analyze FILE` and `dstrace view FILE` analyze one trace file as a run of one rank (issue #28); what
they keep goes beside it, replacing a planted link rather than writing through it. Refused as "not a folder"
before."""
from __future__ import annotations

import json
import os

from dstrace.runfolder.names import reduction_name
from tests.fixtures.processes import dstrace

RANK0 = "hostA_rank0.1700000000000.pt.trace.json.gz"


def test_analyze_one_trace_file_is_a_run_of_that_rank(small_run, tmp_path):
    trace = os.path.join(small_run, RANK0)
    r = dstrace("analyze", trace, "--format", "json", timeout=120)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    report = json.loads(r.stdout)
    assert report["ranks_found"] == [0] and report["trace_dir"] == trace
    assert os.path.exists(os.path.join(small_run, reduction_name(RANK0)))
    again = dstrace("analyze", trace, "--format", "json", timeout=120)
    assert again.returncode == 0 and "(from its kept reduction)" in again.stderr and json.loads(again.stdout) == report


def test_view_one_trace_file_writes_beside_it_through_no_link(small_run, tmp_path):
    trace = os.path.join(small_run, RANK0)
    outside = tmp_path / "outside"
    outside.write_text("mine")
    merged = os.path.join(small_run, "hostA_rank0.1700000000000.dstrace-merged.pftrace")
    os.symlink(outside, merged)
    r = dstrace("view", trace, "--perfetto", timeout=120)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert r.stdout.strip() == merged and not os.path.islink(merged) and outside.read_text() == "mine"
    r = dstrace("view", trace, "--report", timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert os.path.exists(os.path.join(small_run, "hostA_rank0.1700000000000.dstrace-report.html"))


def test_tensorboard_still_wants_a_folder(small_run):
    r = dstrace("view", os.path.join(small_run, RANK0), "--tensorboard", timeout=60)
    assert r.returncode == 2 and "is not a folder" in r.stderr and "Traceback" not in r.stderr
