"""Round 3's hostile inputs (issue #27), one row each in CASES (the catalogue: tests/runfolder/CASES.md): every
verb answers with one line saying what is wrong and what to do, never a traceback, within bounded memory.
Each case failed on the code before the change (a traceback, a hang, or gigabytes read), as CASES.md says."""
from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys

import pytest

from tests.fixtures.processes import cpu_env, dstrace


RANK0 = "hostA_rank0.1700000000000.pt.trace.json.gz"
LIMITED_AS = 3 << 30


def _edit_trace(run, change, name=RANK0):
    path = os.path.join(run, name)
    data = json.loads(gzip.open(path).read())
    change(data)
    with gzip.open(path, "wt") as f:
        json.dump(data, f)


def _mid_range(data) -> dict:
    ranges = [e for e in data["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "user_annotation"]
    return ranges[len(ranges) // 2]


def dangling_link(run):
    os.symlink("/nonexistent/trace", os.path.join(run, "hostA_rank2.1.pt.trace.json.gz"))


def link_loop(run):
    os.symlink("b.pt.trace.json", os.path.join(run, "a.pt.trace.json"))
    os.symlink("a.pt.trace.json", os.path.join(run, "b.pt.trace.json"))


def folder_named_like_a_trace(run):
    os.mkdir(os.path.join(run, "hostA_rank2.1.pt.trace.json.gz"))


def fifo_named_like_a_trace(run):
    os.mkfifo(os.path.join(run, "hostA_rank2.1.pt.trace.json.gz"))


def deep_manifest(run):
    with open(os.path.join(run, "rank0.manifest.json"), "w") as f:
        f.write('{"schema": "dstrace.manifest/1", "a": ' + "[" * 100_000 + "]" * 100_000 + "}")


def deep_run_record(run):
    with open(os.path.join(run, "run.json"), "w") as f:
        f.write("[" * 100_000 + "]" * 100_000)


def run_id_as_list(run):
    _edit_trace(run, lambda d: d["dstrace"].__setitem__("run_id", ["a", "b"]))


def dur_of_400_digits(run):
    path = os.path.join(run, RANK0)
    text = gzip.open(path).read().decode()
    at = text.index('"dur": ', text.index('"cat": "kernel"')) + len('"dur": ')
    end = text.index(",", at)
    with gzip.open(path, "wt") as f:
        f.write(text[:at] + "9" * 400 + text[end:])


def ts_negative(run):
    _edit_trace(run, lambda d: _mid_range(d).__setitem__("ts", -5e15))


def ts_huge(run):
    _edit_trace(run, lambda d: _mid_range(d).__setitem__("ts", 1e300))


# (id, how the folder is spoiled, verb, exit code, words of the line)
CASES = [
    ("dangling-link", dangling_link, "analyze", 0, "which does not exist"),
    ("link-loop", link_loop, "analyze", 0, "loop of links"),
    ("folder-named-like-a-trace", folder_named_like_a_trace, "analyze", 0, "a folder, not a file"),
    ("fifo-named-like-a-trace", fifo_named_like_a_trace, "analyze", 0, "a FIFO, not a file"),
    ("dangling-link-text", dangling_link, "analyze-text", 0, ""),
    ("deep-manifest", deep_manifest, "analyze", 0, "nested too deeply"),
    ("deep-run-record", deep_run_record, "analyze", 0, "nested too deeply"),
    ("deep-manifest-compare", deep_manifest, "compare", 0, "nested too deeply"),
    ("run-id-as-list", run_id_as_list, "analyze", 0, "run_id ['a', 'b'], which is not text"),
    ("dur-of-400-digits", dur_of_400_digits, "analyze", 0, "too large for any clock"),
    ("dur-of-400-digits-view", dur_of_400_digits, "perfetto", 0, ""),
    ("ts-negative-view", ts_negative, "perfetto", 2, "outside what a timeline holds"),
    ("ts-huge-view", ts_huge, "perfetto", 2, "outside what a timeline holds"),
]
VERBS = {
    "analyze": lambda run, tmp: ["analyze", run, "--format", "json", "-o", str(tmp / "report.json")],
    "analyze-text": lambda run, tmp: ["analyze", run, "-o", str(tmp / "report.txt")],
    "compare": lambda run, tmp: ["compare", run, "-o", str(tmp / "compare.txt")],
    "perfetto": lambda run, tmp: ["view", run, "--perfetto", "-o", str(tmp / "merged.pftrace")],
}


def assert_one_line(r, code: int, words: str) -> None:
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    assert r.returncode == code, r.stderr[-3000:]
    lines = [line for line in r.stderr.splitlines() if line.startswith("dstrace: ")]
    assert any(words in line for line in lines), r.stderr[-3000:]


@pytest.mark.parametrize("name,spoil,verb,code,words", CASES, ids=[c[0] for c in CASES])
def test_a_hostile_folder_is_one_line(small_run, tmp_path, name, spoil, verb, code, words):
    spoil(small_run)
    r = dstrace(*VERBS[verb](small_run, tmp_path), timeout=120)
    assert_one_line(r, code, words)


def without_dac_override(*args: str) -> subprocess.CompletedProcess:
    """dstrace as root without the capabilities that let root read any file: permissions hold as for a user."""
    return subprocess.run(["setpriv", "--bounding-set=-dac_override,-dac_read_search", sys.executable, "-m",
                           "dstrace.cli", *args], env=cpu_env(), capture_output=True, text=True, timeout=120)


needs_root = pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/usr/bin/setpriv"),
                                reason="root without DAC override stands in for a user (setpriv)")


@needs_root
def test_an_unreadable_trace_is_skipped_with_one_line(small_run, tmp_path):
    os.chmod(os.path.join(small_run, RANK0), 0)
    r = without_dac_override("analyze", small_run, "--format", "json", "-o", str(tmp_path / "r.json"))
    assert_one_line(r, 0, "not readable by you (permission denied)")


@needs_root
@pytest.mark.parametrize("verb", [["analyze"], ["view", "--perfetto"], ["compare"]], ids=lambda v: v[-1])
def test_an_unreadable_folder_is_one_line(small_run, tmp_path, verb):
    os.chmod(small_run, 0)
    try:
        r = without_dac_override(verb[0], small_run, *verb[1:])
    finally:
        os.chmod(small_run, 0o755)
    assert "Traceback" not in r.stderr and r.returncode == 2, r.stderr[-3000:]
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def _limited():
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (LIMITED_AS, LIMITED_AS))


def test_a_kept_reduction_too_large_for_one_is_refused_unread(small_run, tmp_path):
    """A kept reduction of a rank whose trace is not in the folder, 300 MiB (a rank's is kilobytes to a few MB):
    refused by its size with one line, before any of it is read; the other rank is analyzed."""
    from dstrace.analysis.kept import MAX_KEPT_BYTES
    from dstrace.runfolder.names import reduction_name

    name = sorted(n for n in os.listdir(small_run) if n.endswith(".gz"))[1]
    os.remove(os.path.join(small_run, name))
    path = os.path.join(small_run, reduction_name(name))
    with open(path, "wb") as f:
        f.truncate(MAX_KEPT_BYTES + (44 << 20))
    r = subprocess.run([sys.executable, "-m", "dstrace.cli", "analyze", small_run, "--format", "json"],
                       env=cpu_env(), capture_output=True, text=True, timeout=120, preexec_fn=_limited)
    assert_one_line(r, 0, "more than a rank's reduction")
    assert reduction_name(name) in r.stderr and json.loads(r.stdout)["ranks_found"] == [0]


def test_a_kept_reduction_that_decompresses_to_gigabytes_is_refused_as_it_is_read(small_run, tmp_path):
    """A 128 kB kept reduction (a zstd frame, as dstrace writes them) of 4 GiB of zeros, for a rank whose trace is
    not in the folder: refused with one line once it has decompressed to 64 times its size, under a 3 GiB
    address space; the other rank is analyzed."""
    import pyarrow as pa

    from dstrace.runfolder.names import reduction_name

    name = sorted(n for n in os.listdir(small_run) if n.endswith(".gz"))[1]
    os.remove(os.path.join(small_run, name))
    zeros = bytes(64 << 20)
    with pa.OSFile(os.path.join(small_run, reduction_name(name)), "wb") as raw, \
            pa.CompressedOutputStream(raw, "zstd") as f:
        for _ in range(64):
            f.write(zeros)
    assert os.path.getsize(os.path.join(small_run, reduction_name(name))) < 256 << 10
    r = subprocess.run([sys.executable, "-m", "dstrace.cli", "analyze", small_run, "--format", "json"],
                       env=cpu_env(), capture_output=True, text=True, timeout=120, preexec_fn=_limited)
    assert_one_line(r, 0, "decompresses to more than")
    assert reduction_name(name) in r.stderr and json.loads(r.stdout)["ranks_found"] == [0]


def _sweep(tmp_path, small_run) -> str:
    import shutil

    sweep = tmp_path / "sweep"
    for config in ("a", "b"):
        shutil.copytree(small_run, sweep / config / "rep1")
    return str(sweep)


SWEEP_CASES = {
    "list": (b"[1]", "Expected `object`, got `array`"),
    "configurations-number": (b'{"schema": "dstrace.sweep/1", "configurations": 5}', "$.configurations"),
    "baseline-list": (b'{"schema": "dstrace.sweep/1", "configurations": ["a"], "baseline": ["x"]}', "$.baseline"),
    "configuration-object": (b'{"schema": "dstrace.sweep/1", "configurations": [{"a": 1}]}', "$.configurations[0]"),
    "deep": (b'{"schema": "dstrace.sweep/1", "x": ' + b"{\"x\": " * 100_000 + b"1" + b"}" * 100_001,
             "nested too deeply"),
    "other-schema": (b'{"schema": "x", "configurations": ["a"]}', "not a dstrace.sweep/1 record"),
    "binary": (b"\xff\xfe\x00", "not valid JSON"),
}


@pytest.mark.parametrize("case", sorted(SWEEP_CASES))
def test_a_hostile_sweep_record_is_one_line(small_run, tmp_path, case):
    sweep = _sweep(tmp_path, small_run)
    content, words = SWEEP_CASES[case]
    with open(os.path.join(sweep, "sweep.json"), "wb") as f:
        f.write(content)
    assert_one_line(dstrace("compare", sweep, timeout=120), 2, words)


def test_a_huge_sweep_record_is_refused_before_it_is_read(small_run, tmp_path):
    sweep = _sweep(tmp_path, small_run)
    with open(os.path.join(sweep, "sweep.json"), "wb") as f:
        f.truncate(1500 << 20)  # sparse: 1.5 GB that reading would hold whole
    r = subprocess.run([sys.executable, "-m", "dstrace.cli", "compare", sweep], env=cpu_env(), capture_output=True,
                       text=True, timeout=60, preexec_fn=_limited)
    assert_one_line(r, 2, "larger than 16 MiB")


def test_a_fifo_as_sweep_record_does_not_hang(small_run, tmp_path):
    sweep = _sweep(tmp_path, small_run)
    os.mkfifo(os.path.join(sweep, "sweep.json"))
    assert_one_line(dstrace("compare", sweep, timeout=60), 2, "a FIFO, not a file")


@pytest.mark.parametrize("content,words", [
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    (b'{"configurations": [{"name": "a", "command": ["x"], "note": [1]}]}', '"note" must be text'),
    (b'{"configurations": [{"name": "a", "command": ["x"]}], "baseline": ["a"]}', "is not one of its configurations"),
    (b'{"configurations": [{"name": "a", "command": ["x"]}], "variables": [1]}', '"variables"'),
], ids=["deep", "note-list", "baseline-list", "variables-list"])
def test_a_hostile_sweep_spec_is_one_line(tmp_path, content, words):
    spec = tmp_path / "spec.json"
    spec.write_bytes(content)
    assert_one_line(dstrace("sweep", str(spec), "-o", str(tmp_path / "out"), timeout=60), 2, words)


def kineto_layout(data: dict) -> str:
    """The trace as torch.profiler lays it out: one event per block, `  {` ... `  },` (tracefile cuts there)."""
    events = ",\n".join("  " + json.dumps(e).replace("{", "{\n    ", 1)[:-1] + "\n  }" for e in data["traceEvents"])
    rest = "".join(f',\n  {json.dumps(k)}: {json.dumps(v)}' for k, v in data.items() if k != "traceEvents")
    return '{\n  "traceEvents": [\n' + events + "\n  ]" + rest + "\n}\n"


def test_overlaps_negative_durations_and_duplicate_keys_are_warned_and_counted(small_run, tmp_path):
    path = os.path.join(small_run, RANK0)
    data = json.loads(gzip.open(path).read())
    host = [e for e in data["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "user_annotation"]
    for e in host[3:5]:
        e["dur"] = -7.0
    first = host[6]  # three ranges that start inside the one before and end well after it
    for i, e in enumerate(host[7:10], 1):
        e["ts"], e["dur"] = first["ts"] + i, first["dur"] + 100.0 * i
    text = kineto_layout(data)
    text = text.replace('\n  "host_name": ', '\n  "host_name": "twice",\n  "host_name": ', 1)
    with gzip.open(path, "wt") as f:
        f.write(text)
    r = dstrace("analyze", small_run, "--format", "json", "-o", str(tmp_path / "r.json"), timeout=120)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    warned = [line for line in r.stderr.splitlines() if RANK0 in line]
    assert any("2 event(s) with a negative duration" in line for line in warned), warned
    assert any("3 event(s) start inside the event before them" in line for line in warned), warned
    assert any("1 key(s) given twice in one object (host_name)" in line for line in warned), warned
    report = json.load(open(tmp_path / "r.json"))
    assert sum(RANK0 in w for w in report["warnings"]) == 3


def _warned_twice(small_run, tmp_path, path: str, text: str, keys) -> str:
    """Rank 0's trace rewritten as `text`, then analyzed: one warning line naming `keys` as given twice; the
    report's JSON file."""
    with gzip.open(path, "wt") as f:
        f.write(text)
    r = dstrace("analyze", small_run, "--format", "json", "-o", str(tmp_path / "r.json"), timeout=120)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    warned = [line for line in r.stderr.splitlines() if RANK0 in line and "twice" in line]
    said = f"{len(keys)} key(s) given twice in one object ({', '.join(sorted(keys))})"
    assert len(warned) == 1 and said in warned[0], r.stderr[-3000:]
    return str(tmp_path / "r.json")


@pytest.mark.parametrize("keys", [("dur", "ts"), ("dur",), ("name", "ph", "cat", "pid", "tid", "args")],
                         ids=["ts-and-dur", "dur-alone", "the-others"])
@pytest.mark.parametrize("layout", ["kineto", "one-line"])
def test_keys_given_twice_inside_events_are_warned_and_counted(small_run, tmp_path, layout, keys):
    """Only the top level was looked at: an event giving one of its keys twice passed silently (the decoder keeps
    the last); then only where a piece held more `ts` or `dur` than events (`dur` alone passed: metadata
    events have none). Each key the decoder reads, each in another event. Either layout: torch.profiler's
    (decoded in pieces, by two processes) and one line (whole)."""
    path = os.path.join(small_run, RANK0)
    data = json.loads(gzip.open(path).read())
    host = [i for i, e in enumerate(data["traceEvents"]) if e.get("ph") == "X" and e.get("cat") == "user_annotation"]
    assert all("args" in data["traceEvents"][i] for i in host) and len(host) > len(keys) + 2
    marks = dict(zip(host[2:len(keys) + 1] + host[-1:], keys))
    for i, key in marks.items():
        data["traceEvents"][i] = {"__twice__": key, **data["traceEvents"][i]}
    text = kineto_layout(data) if layout == "kineto" else json.dumps(data)
    for key in marks.values():  # the marker becomes the key itself, its value a decoy the event's own replaces
        text = text.replace(f'"__twice__": "{key}"', f'"{key}": -1', 1)
    report = _warned_twice(small_run, tmp_path, path, text, keys)
    assert sum(RANK0 in w and "twice" in w for w in json.load(open(report))["warnings"]) == 1


def test_a_well_formed_trace_gets_no_such_warning(small_run, tmp_path):
    r = dstrace("analyze", small_run, "--format", "json", timeout=120)
    assert r.returncode == 0
    assert not [w for w in r.stderr.splitlines() if "negative duration" in w or "overlapping" in w or "twice" in w]


@pytest.mark.parametrize("keys", [("Collective name",), ("External id", "stream", "In msg nelems", "Out msg nelems")],
                         ids=["collective-name", "the-others"])
@pytest.mark.parametrize("layout", ["kineto", "one-line"])
def test_args_keys_given_twice_are_warned_and_counted(small_run, tmp_path, layout, keys):
    """An args key the decoder reads given twice in one event (`{"Collective name": "allgather", "Collective name":
    "allreduce"}`) passed silently: the decoder took the last, and nobody could know which counted. Now it is
    warned as a top-level key given twice is; each key in another event that has it, the decoy first."""
    path = os.path.join(small_run, RANK0)
    data = json.loads(gzip.open(path).read())
    marks = {}
    for key in keys:
        i = next(i for i, e in enumerate(data["traceEvents"]) if key in e.get("args", {}) and i not in marks)
        marks[i] = key
        data["traceEvents"][i]["args"] = {"__twice__": key, **data["traceEvents"][i]["args"]}
    text = kineto_layout(data) if layout == "kineto" else json.dumps(data)
    for key in marks.values():
        decoy = '"allgather"' if key == "Collective name" else "-1"
        text = text.replace(f'"__twice__": "{key}"', f'"{key}": {decoy}', 1)
    _warned_twice(small_run, tmp_path, path, text, keys)
