"""End to end: `dstrace record` over real DeepSpeed ZeRO-3 ranks (gloo, CPU), three launchers."""
from __future__ import annotations

import math
import os
import re
import sys

from tests.fixtures.paths import LAUNCH
from tests.fixtures.processes import cpu_env, dstrace, record_zero3_chat
from tests.fixtures.runs import manifests, read_json, trace_paths
from tests.fixtures.traces import read_trace


MAX_NEW_TOKENS = 8


def dstrace_names(trace: dict) -> list[str]:
    return [e["name"] for e in trace["traceEvents"]
            if e.get("cat") == "user_annotation" and e["name"].startswith("dstrace/")]


def test_torchrun_records_both_ranks(zero3_run):
    run_dir, result = zero3_run
    assert result.returncode == 0, result.stderr[-3000:]
    run = read_json(os.path.join(run_dir, "run.json"))
    assert run["status"] == "complete" and run["world_size"] == 2 and run["missing_ranks"] == []
    ms = manifests(run_dir)
    assert sorted(ms) == [0, 1]
    files = trace_paths(run_dir)
    assert len(files) == 2
    for path in files:
        name = os.path.basename(path)
        assert re.fullmatch(r".+_rank[01]\.\d+\.pt\.trace\.json\.gz", name), name
        trace = read_trace(path)
        info = trace["distributedInfo"]
        assert info["world_size"] == 2 and info["backend"] == "gloo"
        meta = trace["dstrace"]
        assert meta["run_id"] == run["run_id"] and meta["rank"] == info["rank"]
        assert ms[info["rank"]]["window"]["trace_file"] == name


def test_ranges_and_steps_in_trace(zero3_run):
    run_dir, _ = zero3_run
    for path in trace_paths(run_dir):
        names = dstrace_names(read_trace(path))
        steps = sorted(n for n in names if n.startswith("dstrace/step#"))
        assert steps == ["dstrace/step#2", "dstrace/step#3", "dstrace/step#4"]  # the default window
        assert any(n.startswith("dstrace/zero3.fetch ") for n in names)
        assert any(n.startswith("dstrace/zero3.release ") for n in names)
        gathers = [int(n.rsplit("=", 1)[1]) for n in names if n.startswith("dstrace/zero3.allgather bytes=")]
        assert gathers and sum(gathers) > 0
        kinds = {e["name"] for e in read_trace(path)["traceEvents"]}
        assert any("all_gather" in k for k in kinds), "gloo all-gathers missing from the trace"


def test_manifest_counts_decode_steps_and_calls(zero3_run):
    run_dir, _ = zero3_run
    for rank, m in manifests(run_dir).items():
        assert m["status"] == "complete" and m["world_size"] == 2 and m["hook_errors"] == []
        (call,) = m["calls"]
        assert call["api"] == "chat" and call["new_tokens"] == MAX_NEW_TOKENS
        assert len(call["step_ms"]) == MAX_NEW_TOKENS and all(ms > 0 for ms in call["step_ms"])
        assert len(call["gathered_bytes"]) == MAX_NEW_TOKENS
        assert m["window"]["recorded_steps"] == [2, 3, 4]
        outside = [b for step, b in enumerate(call["gathered_bytes"]) if step not in {2, 3, 4}]
        assert all(b > 0 for b in outside)  # counted where no range is opened, outside the window
        apis = [c["api"] for c in m["deepspeed_calls"]]
        assert "deepspeed.zero.Init" in apis and "deepspeed.initialize" in apis
        init = next(c for c in m["deepspeed_calls"] if c["api"] == "deepspeed.initialize")
        assert init["config"]["zero_optimization"]["stage"] == 3 and init["error"] is None
        assert m["versions"]["deepspeed"] and m["versions"]["torch"] and m["versions"]["transformers"]
        assert m["env"]["RANK"] == str(rank) and m["env"]["WORLD_SIZE"] == "2"
        assert m["zero3"]["fetches"] > 0 and m["zero3"]["fetches"] == m["zero3"]["releases"]


def test_inventory_full_shapes_half_held(zero3_run):
    run_dir, _ = zero3_run
    for m in manifests(run_dir).values():
        inv = m["inventory"]
        assert inv["taken_at"] == "deepspeed.initialize" and inv["effective_tp"] == 1
        assert inv["zero3_partitioned"] == len(inv["weights"])
        q = next(w for w in inv["weights"] if w["name"].endswith("layers.0.self_attn.q_proj.weight"))
        assert q["shape"] == [64, 64]  # the tiny model's full logical shape: ds_shape
        assert q["local_numel"] == 64 * 64 // 2
        assert abs(inv["local_numel"] - inv["logical_numel"] / 2) <= len(inv["weights"])  # padding only


def test_language_model_gathered_every_decode_step(zero3_run):
    """Each decode forward gathers the whole language model again: the ZeRO-3 cost per token."""
    run_dir, _ = zero3_run
    for m in manifests(run_dir).values():
        lm_bytes = sum(math.prod(w["shape"]) * 4 for w in m["inventory"]["weights"]  # fp32 on CPU
                       if w["name"].startswith("language_model."))
        decode = m["calls"][0]["gathered_bytes"][1:]
        assert decode and all(abs(b - lm_bytes) <= 0.01 * lm_bytes for b in decode), (decode, lm_bytes)


def test_deepspeed_launcher(tmp_path):
    run_dir = str(tmp_path / "ds")
    result = record_zero3_chat(run_dir, "--max-new-tokens", "4", launcher="deepspeed")
    assert result.returncode == 0, result.stderr[-3000:]
    ms = manifests(run_dir)
    assert sorted(ms) == [0, 1] and all(m["status"] == "complete" for m in ms.values())
    assert all(len(m["calls"][0]["step_ms"]) == 4 for m in ms.values())
    assert len(trace_paths(run_dir)) == 2
    assert read_json(os.path.join(run_dir, "run.json"))["status"] == "complete"


def test_plain_python(tmp_path):
    run_dir = str(tmp_path / "py")
    result = dstrace("record", "-o", run_dir, "--", sys.executable,
                     os.path.join(LAUNCH, "device_map_chat.py"), "--size", "tiny", "--max-new-tokens", "6")
    assert result.returncode == 0, result.stderr[-3000:]
    (m,) = manifests(run_dir).values()
    assert m["rank"] == 0 and m["world_size"] == 1 and m["status"] == "complete"
    assert m["deepspeed_calls"] == [] and m["inventory"]["zero3_partitioned"] == 0
    assert m["inventory"]["local_numel"] == m["inventory"]["logical_numel"]
    assert len(m["calls"][0]["step_ms"]) == 6
    (path,) = trace_paths(run_dir)
    trace = read_trace(path)
    assert "distributedInfo" not in trace  # no process group in a single-process run
    assert "dstrace/step#2" in dstrace_names(trace)


def test_annotate_mode_writes_no_trace(tmp_path):
    run_dir = str(tmp_path / "annotate")
    result = dstrace("record", "--mode", "annotate", "-o", run_dir, "--", sys.executable,
                     os.path.join(LAUNCH, "device_map_chat.py"), "--size", "tiny", "--max-new-tokens", "5")
    assert result.returncode == 0, result.stderr[-3000:]
    (m,) = manifests(run_dir).values()
    assert trace_paths(run_dir) == [] and m["window"]["mode"] == "annotate" and m["window"]["trace_file"] is None
    assert len(m["calls"][0]["step_ms"]) == 5


def test_window_options_choose_call_and_steps(tmp_path):
    run_dir = str(tmp_path / "window")
    result = dstrace("record", "--window-call", "2", "--window-start", "0", "--window-steps", "2", "-o", run_dir,
                     "--", sys.executable, os.path.join(LAUNCH, "device_map_chat.py"), "--size", "tiny",
                     "--max-new-tokens", "4", "--prompts", "2")
    assert result.returncode == 0, result.stderr[-3000:]
    (m,) = manifests(run_dir).values()
    assert [c["index"] for c in m["calls"]] == [1, 2]
    assert m["window"]["recorded_steps"] == [0, 1]
    (path,) = trace_paths(run_dir)
    steps = sorted(n for n in dstrace_names(read_trace(path)) if n.startswith("dstrace/step#"))
    assert steps == ["dstrace/step#0", "dstrace/step#1"]


def test_full_mode_asks_kineto_to_tear_cupti_down(zero3_run, tmp_path):
    """After the window the profiler must not stay attached; a user's own TEARDOWN_CUPTI is kept."""
    run_dir, _ = zero3_run
    assert all(m["env"]["TEARDOWN_CUPTI"] == "1" for m in manifests(run_dir).values())
    kept = str(tmp_path / "kept")
    result = dstrace("record", "-o", kept, "--", sys.executable, os.path.join(LAUNCH, "device_map_chat.py"),
                     "--size", "tiny", "--max-new-tokens", "3", env=cpu_env(TEARDOWN_CUPTI="0"))
    assert result.returncode == 0, result.stderr[-2000:]
    (m,) = manifests(kept).values()
    assert m["env"]["TEARDOWN_CUPTI"] == "0"
