"""Every file of a run folder is untrusted input (issue #14: memory and caches). Each test builds the hostile
file; each fails on the code before the typed decoder: the analysis ran out of memory, hung, or answered
from a cache that did not belong to the trace.

The analyses that could run away run as `dstrace analyze` in a child process under a 3 GiB address-space
limit and a time limit, so that a failure is a failed test, not a machine out of memory.
"""
from __future__ import annotations

import dataclasses
import glob
import gzip
import json
import os
import resource
import shutil
import subprocess
import sys
import zlib

import pandas as pd

from dstrace.analysis import kept
from dstrace.analysis.loading import load_run
from dstrace.analysis.pipeline import analyze
from dstrace.analysis.render import render
from tests.fixtures.reports import quiet
from tests.fixtures.traces import TraceBuilder, zero3_traces

ADDRESS_SPACE = 3 << 30
LIMIT_S = 120


def two_ranks(folder, suffix=".pt.trace.json.gz", layers=3) -> list[str]:
    """A 2-rank ZeRO-3 run whose rank 1 is late to every AllGather (a peer-wait finding)."""
    return [b.write(str(folder), f"{b.host}_rank{b.rank}.1700000000000{suffix}")
            for b in zero3_traces(world_size=2, steps=3, layers=layers)]


def limited():
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def analyze_limited(folder) -> subprocess.CompletedProcess:
    """`dstrace analyze FOLDER --format json` in a child held to 3 GiB of address space and two minutes."""
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "dstrace.cli", "analyze", str(folder), "--format", "json"],
                          capture_output=True, text=True, timeout=LIMIT_S, preexec_fn=limited, env=env)


def warnings_of(proc) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.startswith("dstrace: warning:")]


def test_a_gzip_of_zeros_is_refused_in_bounded_memory(tmp_path):
    """9 MB of gzip holding 9 GB of zeros, named like rank 2's trace: refused as soon as it inflates past
    100x, with one line; the two real ranks are analyzed."""
    two_ranks(tmp_path)
    member = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    member = member.compress(bytes(64 << 20)) + member.flush()
    with open(tmp_path / "hostA_rank2.1700000000000.pt.trace.json.gz", "wb") as f:
        for _ in range(144):  # 144 gzip members of 64 MiB of zeros each: 9 GiB inflated
            f.write(member)
    assert os.path.getsize(tmp_path / "hostA_rank2.1700000000000.pt.trace.json.gz") < 12 << 20
    proc = analyze_limited(tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert json.loads(proc.stdout)["ranks_found"] == [0, 1]
    (line,) = [w for w in warnings_of(proc) if "rank2" in w]
    assert "inflates more than 100x" in line and "remove it from the folder" in line


def test_a_gigabyte_of_spaces_inside_trace_events_is_refused_in_bounded_memory(tmp_path):
    """A 1 GiB run of spaces where the events should be: no event boundary in 64 MiB, and more than a
    trace laid out otherwise may hold; refused with one line, not read into an ever-growing buffer."""
    two_ranks(tmp_path)
    with open(tmp_path / "hostA_rank2.1700000000000.pt.trace.json", "wb") as f:
        f.write(b'{\n  "schemaVersion": 1,\n  "traceEvents": [\n')
        spaces = b" " * (64 << 20)
        for _ in range(16):
            f.write(spaces)
        f.write(b"\n  ]\n}")
    proc = analyze_limited(tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (line,) = [w for w in warnings_of(proc) if "rank2" in w]
    assert "not laid out as torch.profiler writes traces" in line


def test_a_fifo_named_like_a_trace_or_a_kept_reduction_does_not_hang(tmp_path):
    two_ranks(tmp_path)
    os.mkfifo(tmp_path / "hostA_rank2.1700000000000.pt.trace.json.gz")
    traces = sorted(glob.glob(str(tmp_path / "hostA_rank[01]*.gz")))
    os.mkfifo(kept.kept_path(traces[0]))  # where rank 0's reduction would be kept
    proc = analyze_limited(tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["ranks_found"] == [0, 1]
    (line,) = [w for w in warnings_of(proc) if "rank2" in w]
    assert "a FIFO, not a file" in line


def test_a_world_size_of_a_billion_in_distributed_info_is_ignored(tmp_path):
    builders = zero3_traces(world_size=2, steps=3, layers=3)
    for b in builders:
        path = b.write(str(tmp_path))
        if b.rank == 1:
            trace = json.loads(gzip.open(path).read())
            trace["distributedInfo"]["world_size"] = 10 ** 9
            with gzip.open(path, "wt") as f:
                json.dump(trace, f)
    proc = analyze_limited(tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["world_size"] == 2 and report["missing_ranks"] == []
    assert any("world_size 1000000000, which no job has" in w for w in warnings_of(proc))


def test_deeply_nested_args_are_one_line(tmp_path):
    two_ranks(tmp_path)
    deep = "[" * 100_000 + "]" * 100_000
    (tmp_path / "hostA_rank2.1.pt.trace.json").write_text(
        '{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 1, "args": ' + deep + "}]}")
    run = load_run(str(tmp_path), progress=quiet)
    (skipped,) = [s for s in run.skipped if "rank2" in s["path"]]
    assert "\n" not in skipped["reason"] and "corrupt JSON" in skipped["reason"]


def _edit_in_the_middle(path: str) -> None:
    """Change one digit of a kernel duration near the middle of the file, keeping its size and mtime."""
    st = os.stat(path)
    data = bytearray(open(path, "rb").read())
    at = data.index(b'"dur": ', data.index(b'"cat": "kernel"', len(data) // 2)) + len(b'"dur": ')
    data[at] = ord("9") if data[at] != ord("9") else ord("8")
    with open(path, "r+b") as f:
        f.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_size == st.st_size and os.stat(path).st_mtime_ns == st.st_mtime_ns


def test_an_edit_in_the_middle_reaches_both_caches(tmp_path):
    """Same size, same mtime, same first and last MiB: the kept reduction and the kept report both answer for
    the new bytes."""
    paths = two_ranks(tmp_path, suffix=".pt.trace.json", layers=500)
    assert os.path.getsize(paths[1]) > 2 << 20  # an edit in the middle is outside the first and last MiB
    dstrace = [sys.executable, "-m", "dstrace.cli", "analyze", str(tmp_path), "--format", "json"]
    before = subprocess.run(dstrace, capture_output=True, text=True, check=True).stdout
    fresh_before = render(analyze(load_run(str(tmp_path), progress=quiet)), "json")
    _edit_in_the_middle(paths[1])
    messages = []
    fresh_after = render(analyze(load_run(str(tmp_path), progress=messages.append)), "json")
    assert fresh_after != fresh_before and any("rank1" in m and "from its kept reduction" not in m for m in messages)
    after = subprocess.run(dstrace, capture_output=True, text=True, check=True)
    assert "nothing in the folder changed" not in after.stderr
    assert after.stdout != before
    for c in glob.glob(str(tmp_path / ".*")) + glob.glob(str(tmp_path / f"*{kept.SUFFIX}")):
        os.unlink(c)
    assert render(analyze(load_run(str(tmp_path), progress=quiet)), "json") == fresh_after


def test_a_reduction_kept_for_other_bytes_cannot_remove_a_finding(tmp_path):
    """A kept reduction is not sealed: it answers for its trace only when its key (the hash of the trace's
    bytes, this code) matches. One emptied of its collectives and keyed to other bytes changes nothing."""
    two_ranks(tmp_path)
    first = analyze(load_run(str(tmp_path), progress=quiet))
    assert "peer-wait" in {f.id for f in first.findings}
    for path in glob.glob(str(tmp_path / f"*{kept.SUFFIX}")):
        got = kept.KeptReduction.load(path)
        got.reduced.collectives = got.reduced.collectives.iloc[:0]
        dataclasses.replace(got, key={**got.key, "trace": {"size": 1, "xxh3_128": "0" * 32}}).save(path)
    messages = []
    again = analyze(load_run(str(tmp_path), progress=messages.append))
    assert "peer-wait" in {f.id for f in again.findings}
    assert render(again, "json") == render(first, "json")
    assert not any("from its kept reduction" in m for m in messages)


def test_a_forged_kept_report_is_not_shown(tmp_path):
    two_ranks(tmp_path)
    dstrace = [sys.executable, "-m", "dstrace.cli", "analyze", str(tmp_path), "--format", "json"]
    honest = subprocess.run(dstrace, capture_output=True, text=True, check=True).stdout
    (kept,) = glob.glob(str(tmp_path / ".dstrace-report.json.cache"))
    record = json.load(open(kept))
    record["report"] = json.dumps({"findings": []})
    with open(kept, "w") as f:
        json.dump(record, f)
    proc = subprocess.run(dstrace, capture_output=True, text=True, check=True)
    assert "nothing in the folder changed" not in proc.stderr and proc.stdout == honest


def test_a_name_holding_tmp_is_in_the_report_key(tmp_path):
    """Only dstrace's own temporary files are left out of the kept report's key, by their exact names."""
    for b in zero3_traces(world_size=2, steps=3, layers=3):
        b.write(str(tmp_path), f"node.tmp_rank{b.rank}.1700000000000.pt.trace.json")
    dstrace = [sys.executable, "-m", "dstrace.cli", "analyze", str(tmp_path), "--format", "json"]
    before = subprocess.run(dstrace, capture_output=True, text=True, check=True).stdout
    path = sorted(glob.glob(str(tmp_path / "node.tmp_rank1*")))[0]
    b = TraceBuilder(1)
    b.compute(10.0, 5.0)
    b.write(str(tmp_path), os.path.basename(path))
    after = subprocess.run(dstrace, capture_output=True, text=True, check=True)
    assert "nothing in the folder changed" not in after.stderr and after.stdout != before


def test_a_damaged_or_hostile_kept_reduction_is_skipped_with_one_line(tmp_path, monkeypatch):
    """Without its trace, a kept reduction is read from the run folder like a trace: one too large for a
    reduction (refused before it is read), one that is not Arrow, one whose columns no reduction has, and one
    whose values are of the wrong kind are each skipped with a one-line warning; the others are read."""
    two_ranks(tmp_path)
    load_run(str(tmp_path), progress=quiet)
    folder = tmp_path / "run"
    folder.mkdir()
    for path in glob.glob(str(tmp_path / f"*{kept.SUFFIX}")):
        shutil.copy(path, folder / os.path.basename(path))
    good = kept.KeptReduction.load(str(sorted(folder.iterdir())[1]))
    monkeypatch.setattr(kept, "MAX_KEPT_BYTES", 4 << 20)
    (folder / "hostA_rank2.1.reduction.arrow").write_bytes(bytes(5 << 20))
    (folder / "hostA_rank3.1.reduction.arrow").write_bytes(b"ARROW1\0\0" + b"[" * 1000)
    odd = dataclasses.replace(good, reduced=dataclasses.replace(
        good.reduced, collectives=good.reduced.collectives.rename(columns={"ts": "when"})))
    odd.save(str(folder / "hostA_rank4.1.reduction.arrow"))
    idle = dataclasses.replace(good, reduced=dataclasses.replace(good.reduced, utilization="all idle"))
    idle.save(str(folder / "hostA_rank5.1.reduction.arrow"))
    texts = dataclasses.replace(good, reduced=dataclasses.replace(
        good.reduced, steps=good.reduced.steps.assign(ts=pd.Series(["soon"] * len(good.reduced.steps), dtype=object))))
    texts.save(str(folder / "hostA_rank6.1.reduction.arrow"))
    run = load_run(str(folder), progress=quiet)
    assert run.ranks == [0, 1]
    reasons = {os.path.basename(s["path"]): s["reason"] for s in run.skipped}
    assert "holds more than 4 MiB" in reasons["hostA_rank2.1.reduction.arrow"]
    assert "truncated or corrupt" in reasons["hostA_rank3.1.reduction.arrow"]
    assert "collectives has columns" in reasons["hostA_rank4.1.reduction.arrow"]
    assert "utilization" in reasons["hostA_rank5.1.reduction.arrow"]
    assert "not numbers" in reasons["hostA_rank6.1.reduction.arrow"]
    assert all("\n" not in r for r in reasons.values()) and len(reasons) == 5
