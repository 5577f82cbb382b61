"""Manifests and run records are untrusted input: a wrong type, an impossible rank or world size, a file
that is not a file. Every verb answers with one line (a skipped file or a refusal), never a traceback,
and within bounded memory and time."""
from __future__ import annotations

import json
import os

import pytest

from tests.fixtures.processes import dstrace


MANIFEST = "rank0.manifest.json"


def _edit(name, change):
    def apply(run_dir):
        path = os.path.join(run_dir, name)
        with open(path) as f:
            data = json.load(f)
        change(data)
        with open(path, "w") as f:
            json.dump(data, f)
    return apply


def _call(index, key, value):
    return lambda m: m["calls"][index].__setitem__(key, value)


# (name, file, change, what the warning names)
CASES = [
    ("rank-as-text", MANIFEST, lambda m: m.__setitem__("rank", "0"), "$.rank"),
    ("world-null", MANIFEST, lambda m: m.__setitem__("world_size", None), "$.world_size"),
    ("world-huge", MANIFEST, lambda m: m.__setitem__("world_size", 10**9), "world_size 1000000000"),
    ("rank-negative", MANIFEST, lambda m: m.__setitem__("rank", -3), "rank -3"),
    ("rank-beyond-world", MANIFEST, lambda m: m.__setitem__("rank", 7), "rank 7"),
    ("calls-of-numbers", MANIFEST, lambda m: m.__setitem__("calls", [1]), "$.calls[0]"),
    ("inventory-list", MANIFEST, lambda m: m.__setitem__("inventory", [3]), "$.inventory"),
    ("window-text", MANIFEST, lambda m: m.__setitem__("window", "x"), "$.window"),
    ("versions-list", MANIFEST, lambda m: m.__setitem__("versions", [1]), "$.versions"),
    ("step-ms-text", MANIFEST, _call(0, "step_ms", ["a"]), "$.calls[0].step_ms[0]"),
    ("error-as-text", MANIFEST, lambda m: m.__setitem__("deepspeed_calls", [{"api": "x", "config": {}, "error": "boom"}]),
     "$.deepspeed_calls[0].error"),
    ("zero3-text", MANIFEST, lambda m: m.__setitem__("zero3", {"gathered_bytes": "x"}), "$.zero3"),
    ("tp-request-object", MANIFEST, lambda m: m.__setitem__("tp_requested", [{"source": 1}]), "$.tp_requested[0]"),
    ("exit-error-list", MANIFEST, lambda m: m.__setitem__("exit_error", [1]), "$.exit_error"),
    ("run-world-huge", "run.json", lambda r: r.__setitem__("world_size", 10**9), "world_size 1000000000"),
    ("run-ranks-numbers", "run.json", lambda r: r.__setitem__("ranks", [5]), "$.ranks[0]"),
    ("run-missing-text", "run.json", lambda r: r.__setitem__("missing_ranks", "x"), "$.missing_ranks"),
    ("run-command-object", "run.json", lambda r: r.__setitem__("command", {"a": 1}), "$.command"),
]
VERBS = {
    "analyze": lambda d, tmp: ["analyze", d],
    "analyze-markdown": lambda d, tmp: ["analyze", d, "--format", "markdown"],
    "compare": lambda d, tmp: ["compare", d],
    "view-report": lambda d, tmp: ["view", d, "--report", "-o", str(tmp / "report.html")],
    "gather": lambda d, tmp: ["gather", str(tmp / "gathered"), d],
}


def assert_one_line_answer(r, verb):
    assert "Traceback" not in r.stderr, f"{verb}: {r.stderr[-2000:]}"
    assert r.returncode in (0, 2), f"{verb}: exit {r.returncode}: {r.stderr[-2000:]}"


@pytest.mark.parametrize("name,file,change,field", CASES, ids=[c[0] for c in CASES])
def test_a_type_confused_record_is_skipped_or_refused_by_every_verb(copy_of, tmp_path, name, file, change, field):
    run_dir = copy_of()
    _edit(file, change)(run_dir)
    for verb, args in VERBS.items():
        r = dstrace(*args(run_dir, tmp_path), timeout=300)
        assert_one_line_answer(r, verb)
    r = dstrace("analyze", run_dir, timeout=300)
    assert file in r.stderr and field in r.stderr, r.stderr


@pytest.mark.parametrize("content", [b"[1, 2]", b"{", b"\xff\xfe", b"null"], ids=["list", "torn", "binary", "null"])
def test_a_record_that_is_not_a_json_object_is_skipped(copy_of, tmp_path, content):
    run_dir = copy_of()
    with open(os.path.join(run_dir, MANIFEST), "wb") as f:
        f.write(content)
    for verb, args in VERBS.items():
        assert_one_line_answer(dstrace(*args(run_dir, tmp_path), timeout=300), verb)


def test_a_fifo_named_like_a_manifest_does_not_hang_any_verb(copy_of, tmp_path):
    run_dir = copy_of()
    os.mkfifo(os.path.join(run_dir, "rank1.manifest.json"))
    for verb, args in VERBS.items():
        r = dstrace(*args(run_dir, tmp_path), timeout=120)
        assert_one_line_answer(r, verb)
    assert "rank1.manifest.json" in dstrace("analyze", run_dir, timeout=120).stderr


def test_a_huge_manifest_is_refused_without_reading_it_all(copy_of, tmp_path):
    run_dir = copy_of()
    with open(os.path.join(run_dir, "rank1.manifest.json"), "wb") as f:
        f.truncate(3 << 30)  # a sparse 3 GiB file: reading it whole would take that much memory
    r = dstrace("analyze", run_dir, timeout=300)
    assert_one_line_answer(r, "analyze")
    assert "rank1.manifest.json" in r.stderr and "larger than" in r.stderr


def _first_slice(events):
    return next(i for i, e in enumerate(events) if isinstance(e, dict) and e.get("ph") == "X")


TRACE_CASES = {
    "name-as-object": lambda d: d["traceEvents"][_first_slice(d["traceEvents"])].__setitem__("name", {"a": 1}),
    "ts-as-list": lambda d: d["traceEvents"][_first_slice(d["traceEvents"])].__setitem__("ts", [1, 2]),
    "event-as-text": lambda d: d["traceEvents"].__setitem__(_first_slice(d["traceEvents"]), "hello"),
    "events-as-object": lambda d: d.__setitem__("traceEvents", {"a": 1}),
    "args-as-list": lambda d: d["traceEvents"][_first_slice(d["traceEvents"])].__setitem__("args", [1, 2]),
    "rank-as-text": lambda d: d.__setitem__("distributedInfo", {"rank": "0", "world_size": [2]}),
}


@pytest.mark.parametrize("case", sorted(TRACE_CASES))
def test_a_type_confused_trace_is_one_line_for_every_verb(copy_of, tmp_path, case):
    import glob
    import gzip

    run_dir = copy_of()
    for name in os.listdir(run_dir):
        if name.endswith(".reduction.arrow"):
            os.remove(os.path.join(run_dir, name))  # the trace itself is read, not its reduction
    (path,) = glob.glob(os.path.join(run_dir, "*.pt.trace.json.gz"))
    with gzip.open(path, "rt") as f:
        data = json.load(f)
    TRACE_CASES[case](data)
    with gzip.open(path, "wt") as f:
        json.dump(data, f)
    for verb, args in VERBS.items():
        assert_one_line_answer(dstrace(*args(run_dir, tmp_path), timeout=300), verb)
