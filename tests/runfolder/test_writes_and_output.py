"""Nothing is written outside the chosen folder or through a link, and nothing read from a run folder can
drive the terminal or restructure a markdown report."""
from __future__ import annotations

import json
import os

from dstrace.recording.session import RankSession
from dstrace.recording.window import WindowOptions
from tests.fixtures.processes import dstrace

OUTSIDE = "the user's own file"


def _plant_link(run_dir, name, tmp_path) -> str:
    target = tmp_path / f"outside-{name.strip('.')}"
    target.write_text(OUTSIDE)
    os.symlink(target, os.path.join(run_dir, name))
    return str(target)


def test_reports_and_caches_replace_planted_links_instead_of_writing_through_them(copy_of, tmp_path):
    run_dir = copy_of()
    targets = [_plant_link(run_dir, name, tmp_path)
               for name in ("dstrace-report.html", ".dstrace-report.text.cache", "dstrace-merged.pftrace",
                            "dstrace-merged.pftrace.tmp")]
    for args in (["view", run_dir, "--report"], ["analyze", run_dir], ["view", run_dir, "--perfetto"]):
        r = dstrace(*args, timeout=300)
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert all(open(t).read() == OUTSIDE for t in targets)
    for name in ("dstrace-report.html", "dstrace-merged.pftrace"):
        assert not os.path.islink(os.path.join(run_dir, name))


def test_gather_copies_no_link_and_writes_through_none(copy_of, tmp_path):
    node = copy_of("node")
    secret = tmp_path / "secret.manifest.json"
    secret.write_text(json.dumps({"schema": "dstrace.manifest/1"}))
    os.symlink(secret, os.path.join(node, "rank1.manifest.json"))
    out = tmp_path / "out"
    r = dstrace("gather", str(out), node)
    assert r.returncode == 2 and "rank1.manifest.json" in r.stderr and "link" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    os.unlink(os.path.join(node, "rank1.manifest.json"))
    out.mkdir(exist_ok=True)
    target = _plant_link(str(out), "rank0.manifest.json", tmp_path)
    r = dstrace("gather", str(out), node)
    assert r.returncode == 2 and "is a link" in r.stderr and "Traceback" not in r.stderr
    assert open(target).read() == OUTSIDE


def test_no_host_name_puts_a_trace_outside_the_run_folder(tmp_path):
    s = RankSession(str(tmp_path), "run", WindowOptions(mode="annotate"))
    s.manifest.host = "../../etc/x\n"
    assert "/" not in s.worker and "\n" not in s.worker and s.worker.endswith("_rank0")


def test_escape_sequences_and_newlines_from_a_run_folder_are_shown_not_obeyed(copy_of, tmp_path):
    """A TP request whose source and key carry a clear-screen, an OSC 52 clipboard write and a newline that
    would add a row to markdown: the tp-not-applied finding quotes them, escaped."""
    run_dir = copy_of()
    path = os.path.join(run_dir, "rank0.manifest.json")
    with open(path) as f:
        m = json.load(f)
    m["tp_requested"] = [{"source": "HfDeepSpeedConfig\x1b[2J", "key": "tp\x1b]52;c;aGVsbG8=\x07\n| injected | row |",
                          "value": 2}]
    with open(path, "w") as f:
        json.dump(m, f)
    bad_name = os.path.join(run_dir, "rank3\x1b[31m.manifest.json")
    with open(bad_name, "w") as f:
        f.write("{")
    for fmt in ("text", "markdown"):
        r = dstrace("analyze", run_dir, "--format", fmt, timeout=300)
        assert r.returncode == 0, r.stderr
        assert "tp-not-applied" in r.stdout
        for stream in (r.stdout, r.stderr):
            assert "\x1b" not in stream and "\x07" not in stream
        assert "\\u001b" in r.stdout and "\\u001b" in r.stderr
        assert not [line for line in r.stdout.splitlines() if line.startswith("| injected")]
