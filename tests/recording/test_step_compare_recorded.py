"""`dstrace analyze RUN --steps A:B --against C:D` on real CPU recordings of the cases it is for: a recompiling
step, a KV cache growing over a long decode, and synced_gpus' extra forwards under ZeRO-3."""
from __future__ import annotations

import os
import sys

from tests.fixtures.paths import SCRIPTS
from tests.fixtures.processes import analyze_json, dstrace, torchrun
from tests.fixtures.runs import manifests, trace_paths
from tests.fixtures.traces import read_trace

COMPILE_TIMER = " (dynamo_timed)"  # torch.compile's name for the ranges its timers write


def steps_with(path: str, suffix: str) -> set[int]:
    """Traced steps whose range holds an event whose name ends with `suffix`, read from the trace itself."""
    events = [e for e in read_trace(path)["traceEvents"] if e.get("ph") == "X"]
    steps = [(int(e["name"].split("#")[1]), e["ts"], e["ts"] + e["dur"]) for e in events
             if e.get("cat") == "user_annotation" and e["name"].startswith("dstrace/step#")]
    return {n for n, lo, hi in steps for e in events if e["name"].endswith(suffix) and lo <= e["ts"] < hi}


def test_a_recompiling_step_shows_its_compile_work(tmp_path):
    """Dynamo compiles the decode again while the cache's length is new to a graph (steps 2 and 3 here, with
    the model's graph breaks), then reuses it: the compile ranges, nested in the compiled region's op, are
    what grew, not only that op."""
    run_dir = str(tmp_path / "compiled")
    result = dstrace("record", "-o", run_dir, "--window-start", "2", "--window-steps", "4", "--",
                     sys.executable, os.path.join(SCRIPTS, "compiled_generate.py"), "--max-new-tokens", "8")
    assert result.returncode == 0, result.stderr[-3000:]
    (path,) = trace_paths(run_dir)
    compiling = steps_with(path, COMPILE_TIMER)
    assert 2 in compiling and not compiling & {4, 5}, compiling  # the workload does what it says
    c = analyze_json(run_dir, "--steps", "2", "--against", "4:5")
    assert c["steps_used"] == [2] and c["against_used"] == [4, 5]
    compile_items = [i for i in c["items"] if i["name"].endswith(COMPILE_TIMER)]
    assert compile_items, [i["name"] for i in c["items"]]
    (item,) = compile_items  # the outermost compile range only: its nested timers are inside it
    assert item["kind"] == "host" and item["steps_ms"] > 0 and item["against_ms"] == 0
    assert c["items"].index(item) <= 1  # beside the compiled region's op that holds it, the largest change
    assert item["name"] in c["only_in_steps"] and c["only_in_against"] == []


def test_a_growing_kv_cache_shows_as_its_concatenation_growing(tmp_path):
    """400 steps of a decode whose cache takes 4 kB per token per layer: DynamicCache concatenates the whole
    cache at every step, so aten::cat is what grew from the first 20 recorded steps to the last 20, and no
    item is shown at 0 only for falling out of a step's kept items."""
    run_dir = str(tmp_path / "long")
    result = dstrace("record", "-o", run_dir, "--window-start", "2", "--window-steps", "396", "--",
                     sys.executable, os.path.join(SCRIPTS, "long_decode.py"), "--max-new-tokens", "400")
    assert result.returncode == 0, result.stderr[-3000:]
    c = analyze_json(run_dir, "--steps", "2:21", "--against", "378:397")
    assert len(c["steps_used"]) == 20 and len(c["against_used"]) == 20
    top = c["items"][0]
    assert (top["name"], top["kind"]) == ("aten::cat", "host") and top["change_ms"] > 0, c["items"][:3]
    assert all(i["steps_ms"] > 0 and i["against_ms"] > 0 for i in c["items"] if i["kind"] == "host"), c["items"]
    text = dstrace("analyze", run_dir, "--steps", "2:21", "--against", "378:397").stdout
    assert "compared: steps 2-21 against steps 378-397\n" in text, text[:500]


def test_synced_gpus_extra_forwards_are_named_on_the_rank_that_ran_them(tmp_path):
    """ZeRO-3 on two gloo ranks, rank 1 asking for 4 new tokens and rank 0 for 10: rank 1's generate() runs 10
    forwards, the last 6 after its last token, each gathering every parameter as its real ones do; the
    comparison names them from the manifest, and shows them full forwards: what they lack is only the choice of
    a token."""
    run_dir = str(tmp_path / "synced")
    result = dstrace("record", "-o", run_dir, "--window-start", "2", "--window-steps", "6", "--",
                     *torchrun(), os.path.join(SCRIPTS, "synced_generate.py"), "--max-new-tokens", "10",
                     "--short-rank-tokens", "4")
    assert result.returncode == 0, result.stderr[-3000:]
    calls = {r: m["calls"][0] for r, m in manifests(run_dir).items()}
    assert {r: (c["new_tokens"], len(c["step_ms"])) for r, c in calls.items()} == {0: (10, 10), 1: (4, 10)}
    gathered = calls[1]["gathered_bytes"]
    assert gathered[0] > 0 and set(gathered[4:]) == {gathered[1]}  # full forwards, the same gathers
    c = analyze_json(run_dir, "--steps", "2:3", "--against", "4:7", "--rank", "1")
    assert c["after_last_token"] == {"1": [4, 9]}
    assert c["steps_used"] == [2, 3] and c["against_used"] == [4, 5, 6, 7]
    # what the extra forwards leave out is the token choice between forwards (the argmax, the stopping checks),
    # not any of the ZeRO-3 gathers: every dstrace/zero3 range of the real steps is in each of them too
    assert "aten::argmax" in c["only_in_steps"] and c["only_in_against"] == [], c
    assert not [n for n in c["only_in_steps"] if n.startswith("dstrace/")], c["only_in_steps"]
    assert analyze_json(run_dir, "--steps", "2:3", "--against", "4:7")["after_last_token"] == {"1": [4, 9]}
    text = dstrace("analyze", run_dir, "--steps", "2:3", "--against", "4:7", "--rank", "1").stdout
    assert "rank 1: steps 4-9 came after its last new token (4 new tokens, 10 forwards)" in text, text
