"""The whole pipeline on real traces: a 2-rank gloo job under torch.profiler (CPU only)."""
import glob
import json
import os

from tests.fixtures.processes import analyze_json, dstrace
from tests.fixtures.reports import analyze_dir


def test_real_gloo_traces(fresh_gloo_run_dir):
    """The job wrote exactly its two traces (on a copy no other test analysed: an analysis leaves caches)."""
    files = sorted(os.listdir(fresh_gloo_run_dir))
    assert len(files) == 2 and all(f.endswith(".pt.trace.json.gz") for f in files)
    a = analyze_dir(fresh_gloo_run_dir)
    assert a.device == "cpu" and a.run_id == "gloo-e2e"
    assert a.ranks_found == [0, 1] and a.world_size == 2 and not a.missing_ranks
    assert any("CPU-side collective ops" in n for n in a.notes)
    for r in (0, 1):
        coll = a.ranks[r].collectives
        assert coll["AllGather"].count == 4 and coll["AllReduce"].count == 4
        assert coll["AllGather"].bytes == 4 * 2 * 64 * 64 * 4  # fp32 64x64 shard gathered from 2 ranks
        assert coll["AllReduce"].bytes == 4 * 16 * 64 * 4
    # rank 1 sleeps before every AllGather: rank 0 waits for it, and rank 1 is the late one
    assert 1 in a.ranks[0].waited_for
    assert a.ranks[1].late_count >= 4
    assert a.ranks[0].collectives["AllGather"].wait_us > a.ranks[1].collectives["AllGather"].wait_us
    assert a.steps is not None and a.steps.count == 3 and a.steps.source == "dstrace/step ranges"
    assert a.steps.gathered_bytes_median == 2 * 64 * 64 * 4


def test_cli_json_on_real_traces(gloo_run_dir):
    proc = dstrace("analyze", str(gloo_run_dir), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["device"] == "cpu" and sorted(doc["ranks"]) == ["0", "1"]
    assert "peer-wait" in {f["id"] for f in doc["findings"]}
    assert "Traceback" not in proc.stderr


def test_one_parse_worker_gives_the_same_report(gloo_run_dir):
    """--parse-workers 1 (the least memory) changes how the traces are parsed, never what is reported."""
    def report(folder, *extra):
        for cache in glob.glob(os.path.join(folder, "*.reduction.arrow")) + \
                glob.glob(os.path.join(folder, ".dstrace-report.*")):
            os.unlink(cache)
        return analyze_json(folder, *extra)

    assert report(gloo_run_dir, "--parse-workers", "1") == report(gloo_run_dir, "--parse-workers", "2")
    bad = dstrace("analyze", str(gloo_run_dir), "--parse-workers", "0")
    assert bad.returncode != 0 and "--parse-workers" in bad.stderr and "Traceback" not in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
