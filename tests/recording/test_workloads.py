"""End to end beyond generate(): torch DDP training, torch-native TP and a loop of bare collectives, recorded
unchanged on two gloo ranks, and the calls around a chat() window, each asserted through what `record` and
`analyze` say."""
from __future__ import annotations

import math
import os
import re
import sys

import pytest

from tests.fixtures.paths import LAUNCH
from tests.fixtures.processes import analyze_json, dstrace, free_port, record_zero3_chat, tool, torchrun
from tests.fixtures.runs import manifests, read_json, trace_paths
from tests.fixtures.traces import read_trace


def record_torchrun(run_dir: str, script: str, *args: str, options: tuple[str, ...] = ()):
    return dstrace("record", "-o", run_dir, *options, "--", *torchrun(), os.path.join(LAUNCH, script), *args)


def user_ranges(trace: dict) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for e in trace["traceEvents"]:
        if e.get("cat") == "user_annotation":
            out.setdefault(e["name"], []).append(e)
    return out


@pytest.fixture(scope="session")
def ddp_run(tmp_path_factory):
    """timm-style DDP training, rank 1's backward 30 ms late each iteration: no generate, no DeepSpeed."""
    run_dir = str(tmp_path_factory.mktemp("workloads") / "ddp")
    result = record_torchrun(run_dir, "ddp_train.py", "--steps", "7", "--late-rank", "1", "--late-ms", "30")
    return run_dir, result


@pytest.fixture(scope="session")
def tp_run(tmp_path_factory):
    """torch-native TP (parallelize_module), an inference loop of its own: the time-based window."""
    run_dir = str(tmp_path_factory.mktemp("workloads") / "tp")
    result = record_torchrun(run_dir, "tp_mlp.py", "--steps", "400",
                             options=("--window-after", "1", "--window-seconds", "0.5"))
    return run_dir, result


def test_ddp_training_window_follows_optimizer_steps(ddp_run):
    run_dir, result = ddp_run
    assert result.returncode == 0, result.stderr[-3000:]
    assert "window on optimizer.step: iterations 2, 3, 4" in result.stderr
    run = read_json(os.path.join(run_dir, "run.json"))
    assert run["status"] == "complete" and len(trace_paths(run_dir)) == 2
    for m in manifests(run_dir).values():
        w = m["window"]
        assert w["trigger"] == "optimizer.step" and w["recorded_steps"] == [2, 3, 4]
        assert w["iterations"] == {"optimizer.step": 7, "DistributedDataParallel.forward": 7}
        assert m["inventory"]["taken_at"] == "DistributedDataParallel.forward" and m["hook_errors"] == []
    for path in trace_paths(run_dir):
        names = user_ranges(read_trace(path))
        assert sorted(n for n in names if n.startswith("ProfilerStep#")) == [
            "ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"]
        assert "Optimizer.step#SGD.step" in names


def test_ddp_allreduce_exposed_after_backward(ddp_run):
    run_dir, _ = ddp_run
    a = analyze_json(run_dir)
    assert a["steps"]["source"] == "ProfilerStep ranges" and a["steps"]["decode"] is False
    for r in ("0", "1"):
        assert a["ranks"][r]["collectives"]["AllReduce"]["count"] >= 3  # at least a bucket per iteration
    (f,) = [f for f in a["findings"] if f["id"] == "ddp-allreduce-exposed"]
    assert 0 in f["ranks"]  # rank 0 waits for the late rank 1 after its own backward
    e = f["evidence"]["ranks"]["0"]
    assert e["iterations"] == 3 and e["buckets_per_iteration"] >= 1
    assert e["exposed_fraction"] >= 0.10 and e["wait_us_per_iteration"] > 10_000  # 30 ms late, less noise
    assert any(f["id"] == "peer-wait" for f in a["findings"])


def test_training_shorter_than_the_window_says_so(tmp_path):
    run_dir = str(tmp_path / "short")
    result = record_torchrun(run_dir, "ddp_train.py", "--steps", "2")
    assert result.returncode == 0, result.stderr[-3000:]
    assert trace_paths(run_dir) == []
    assert "window (iterations 2-4 of optimizer.step) was never reached: 2 optimizer.step ran" in result.stderr


def test_torch_native_tp_measured_from_dtensors(tp_run):
    run_dir, result = tp_run
    assert result.returncode == 0, result.stderr[-3000:]
    for m in manifests(run_dir).values():
        inv = m["inventory"]
        assert inv["taken_at"] == "parallelize_module" and inv["effective_tp"] == 2
        assert inv["dtensors"] == 4 and inv["fsdp_sharded"] == 0
        up = next(w for w in inv["weights"] if w["name"] == "layers.0.up_proj.weight")
        assert up["shape"] == [1024, 256] and up["local_numel"] == 512 * 256 and up["split"] == 2
        assert up["placements"].endswith("@tp=2")
        assert inv["local_numel"] * 2 == inv["logical_numel"]


def test_time_window_for_a_loop_of_its_own(tp_run):
    run_dir, result = tp_run
    assert "window on time: 0.5 s at module or collective calls, 1 s after recording started, once the profiler was " \
        "ready" in result.stderr
    assert len(trace_paths(run_dir)) == 2
    a = analyze_json(run_dir)
    assert not any(f["id"] == "tp-not-applied" for f in a["findings"])
    for r in ("0", "1"):  # RowwiseParallel all-reduces each down_proj's output: two per forward
        assert a["ranks"][r]["collectives"]["AllReduce"]["count"] >= 4


def test_time_window_for_a_loop_of_bare_collectives(tmp_path):
    """A comm benchmark (nccl-tests style): only broadcast, all_reduce, all_gather_into_tensor and barrier on
    tensors, no nn.Module, no optimizer. The time-based window ticks at the collective calls, so both ranks get a
    trace holding them; the job prints and exits as it would without dstrace."""
    run_dir = str(tmp_path / "comm")
    result = record_torchrun(run_dir, "comm_bench.py", "--seconds", "5",
                             options=("--window-after", "1", "--window-seconds", "2"))
    assert result.returncode == 0, result.stderr[-3000:]
    lines = sorted(result.stdout.splitlines())
    assert len(lines) == 4, result.stdout
    for rank in (0, 1):  # every result checked by the job, every iteration
        assert lines[2 * rank] == (f"rank {rank} of 2: all_reduce 3, all_gather_into_tensor ranks 0-1, "
                                   "broadcast from rank 0: correct")
    counts = [re.fullmatch(rf"rank {r}: (\d+) iterations, [\d.]+ ms per iteration", lines[2 * r + 1]) for r in (0, 1)]
    assert all(counts) and counts[0].group(1) == counts[1].group(1) and int(counts[0].group(1)) > 0, lines
    assert "ranks 0, 1: window on time: 2 s at module or collective calls, 1 s after recording started, once the " \
        "profiler was ready" \
        in result.stderr
    assert read_json(os.path.join(run_dir, "run.json"))["status"] == "complete" and len(trace_paths(run_dir)) == 2
    ms = manifests(run_dir)
    assert sorted(ms) == [0, 1]
    for m in ms.values():
        w = m["window"]
        assert w["trigger"] == "time" and w["trace_file"] and w["iterations"] == {} and m["hook_errors"] == []
    a = analyze_json(run_dir)
    for r in ("0", "1"):
        collectives = a["ranks"][r]["collectives"]
        assert {"AllReduce", "AllGather", "Broadcast", "Barrier"} <= set(collectives), collectives
        all_reduce = collectives["AllReduce"]
        assert all_reduce["count"] > 0 and all_reduce["bytes"] == all_reduce["count"] * 4 * (1 << 16)  # float32
    # Both windows cover the same calls: they open at one moment (a rank's window opened at once would be spent
    # waiting for its peer's profiler to get ready, and cover other calls than the peer's).
    spans = []
    for path in trace_paths(run_dir):
        events = [e for e in read_trace(path)["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
        (marker,) = user_ranges(read_trace(path))["dstrace/window.open"]
        spans.append((marker["ts"], max(e["ts"] + e["dur"] for e in events)))
    shared = min(end for _, end in spans) - max(start for start, _ in spans)
    assert shared >= 0.5 * min(end - start for start, end in spans), spans
    counts = [a["ranks"][r]["collectives"]["AllReduce"]["count"] for r in ("0", "1")]
    assert min(counts) >= 0.5 * max(counts), counts


def test_calls_around_the_window(zero3_run):
    """chat() clipped to the window, DeepSpeed's entry points at their real times, on the trace's clock."""
    run_dir, _ = zero3_run
    ms = manifests(run_dir)
    for path in trace_paths(run_dir):
        trace = read_trace(path)
        m = ms[trace["distributedInfo"]["rank"]]
        names = user_ranges(trace)
        (marker,) = names["dstrace/window.open"]
        (chat,) = names["dstrace/chat"]
        assert chat["args"]["clipped"] is True and chat["ts"] >= marker["ts"]
        assert chat["args"]["call start us"] < marker["ts"]
        assert abs(chat["args"]["call dur us"] / 1e6 - m["calls"][0]["wall_s"]) < 0.05
        play = chat["args"]["clock uncertainty us"] + 1  # how far the two clocks' meeting point can be off
        steps = [e for n, es in names.items() if n.startswith("dstrace/step#") for e in es]
        assert all(chat["ts"] - play <= s["ts"] and s["ts"] + s["dur"] <= chat["ts"] + chat["dur"] + play for s in steps)
        (init,) = names["dstrace/deepspeed.initialize"]
        wall = next(c["wall_s"] for c in m["deepspeed_calls"] if c["api"] == "deepspeed.initialize")
        assert init["ts"] + init["dur"] <= chat["args"]["call start us"] and abs(init["dur"] / 1e6 - wall) < 1e-3
        assert "dstrace/deepspeed.zero.Init" in names and chat["pid"] == marker["pid"] == init["pid"]


@pytest.fixture(scope="session")
def fsdp_run(tmp_path_factory):
    """FSDP2 training (`fully_shard` per block and on the root), AdamW."""
    run_dir = str(tmp_path_factory.mktemp("workloads") / "fsdp2")
    return run_dir, record_torchrun(run_dir, "fsdp2_train.py", "--steps", "6", "--layers", "3")


def test_fsdp2_is_partitioning_not_tp(fsdp_run):
    run_dir, result = fsdp_run
    assert result.returncode == 0, result.stderr[-3000:]
    assert "window on optimizer.step: iterations 2, 3, 4" in result.stderr
    for m in manifests(run_dir).values():
        assert m["window"]["iterations"] == {"optimizer.step": 6, "FSDP forward": 6}
        inv = m["inventory"]
        assert inv["taken_at"] == "FSDP forward" and inv["effective_tp"] == 1
        assert inv["fsdp_sharded"] == inv["dtensors"] == len(inv["weights"]) == 12 and inv["zero3_partitioned"] == 0
        w = next(w for w in inv["weights"] if w["name"] == "0.0.weight")
        assert w["shape"] == [1024, 256] and w["local_numel"] == 512 * 256 and w["split"] == 1


def test_fsdp2_gathers_every_unit_forward_and_backward(fsdp_run):
    run_dir, _ = fsdp_run
    a = analyze_json(run_dir)
    ids = [f["id"] for f in a["findings"]]
    assert "fsdp-gathers-model-per-step" in ids and "zero3-gathers-model-per-step" not in ids
    (f,) = [f for f in a["findings"] if f["id"] == "fsdp-gathers-model-per-step"]
    e = f["evidence"]
    assert e["allgathers_per_step"] == {"0": 6, "1": 6}  # 3 units, each gathered for forward and for backward
    assert e["ratio"] == pytest.approx(2.0, rel=0.02)  # the whole model twice per step
    for r in ("0", "1"):  # gradients: 3 units x 3 steps; gloo runs FSDP's _reduce_scatter_base_ as an all-reduce
        assert a["ranks"][r]["collectives"]["AllReduce"]["count"] == 9


def test_accelerate_launch_multi_process_inference(tmp_path):
    """Each process generates for its share of the prompts: two traces, their own calls, no collective in them."""
    run_dir = str(tmp_path / "accelerate")
    result = dstrace("record", "-o", run_dir, "--", tool("accelerate"), "launch", "--multi_gpu", "--num_processes", "2",
                     "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                     "--main_process_port", str(free_port()), os.path.join(LAUNCH, "accelerate_generate.py"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "window on generate steps: call 1, steps 2, 3, 4" in result.stderr
    ms = manifests(run_dir)
    assert sorted(ms) == [0, 1] and len(trace_paths(run_dir)) == 2
    for m in ms.values():
        assert [c["new_tokens"] for c in m["calls"]] == [8, 8]  # 4 prompts split over 2 processes
        assert m["world_size"] == 2 and m["inventory"]["effective_tp"] == 1
    a = analyze_json(run_dir)
    assert all(not a["ranks"][r]["collectives"] for r in ("0", "1"))
    assert a["steps"]["decode"] is True
    assert not {"tp-not-applied", "zero3-gathers-model-per-step", "peer-wait"} & {f["id"] for f in a["findings"]}


def test_device_map_baseline_shows_its_call(tmp_path):
    """The one-process HF device_map baseline: a decode window, the chat() around it, no collective."""
    run_dir = str(tmp_path / "device_map")
    result = dstrace("record", "-o", run_dir, "--", sys.executable, os.path.join(LAUNCH, "device_map_chat.py"),
                     "--size", "tiny", "--max-new-tokens", "6")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "rank 0: window on generate steps: call 1, steps 2, 3, 4" in result.stderr
    (path,) = trace_paths(run_dir)
    (chat,) = user_ranges(read_trace(path))["dstrace/chat"]
    assert chat["args"]["clipped"] is True
    a = analyze_json(run_dir)
    assert a["steps"]["decode"] is True and a["ranks"]["0"]["collectives"] == {}


def test_generate_steps_win_over_a_due_time_window(tmp_path):
    """A time-based window due before the decode steps (a long load, a JIT build: 30 s on the H200) leaves the
    window to them: it never opens inside a generation call, and an open one would become theirs."""
    run_dir = str(tmp_path / "late_generate")
    result = dstrace("record", "-o", run_dir, "--window-after", "0", "--window-seconds", "600", "--",
                     sys.executable, os.path.join(LAUNCH, "device_map_chat.py"), "--size", "tiny",
                     "--max-new-tokens", "6")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "rank 0: window on generate steps: call 1, steps 2, 3, 4" in result.stderr
    (m,) = manifests(run_dir).values()
    assert m["window"]["trigger"] == "generate step" and m["window"]["recorded_steps"] == [2, 3, 4]
    (path,) = trace_paths(run_dir)
    names = user_ranges(read_trace(path))
    assert sorted(n for n in names if n.startswith("dstrace/step#")) == ["dstrace/step#2", "dstrace/step#3",
                                                                         "dstrace/step#4"]


def test_setup_collectives_leave_the_window_to_generate(tmp_path):
    """The time-based window due during DeepSpeed's setup (a long load: 30 s and more on a real model): the
    collectives of zero.Init and initialize do not open it, as the process has a model, so the decode steps get
    the window and the only profiler; the trace holds no setup and one chat()."""
    run_dir = str(tmp_path / "zero3_due")
    result = record_zero3_chat(run_dir, "--max-new-tokens", "6", options=("--window-after", "0"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ranks 0, 1: window on generate steps: call 1, steps 2, 3, 4" in result.stderr
    for path in trace_paths(run_dir):
        names = user_ranges(read_trace(path))
        assert len(names["dstrace/chat"]) == len(names["dstrace/deepspeed.initialize"]) == 1
        assert sorted(n for n in names if n.startswith("dstrace/step#")) == ["dstrace/step#2", "dstrace/step#3",
                                                                             "dstrace/step#4"]


def test_transformers_tp_plan_measured_from_dtensors(tmp_path):
    """`from_pretrained(tp_plan="auto")`: transformers splits the weights as DTensors; the manifest measures
    effective TP 2 from the shards each rank holds, and the window follows generate()."""
    run_dir = str(tmp_path / "tp-plan")
    result = record_torchrun(run_dir, "tp_plan_generate.py", "--checkpoint", str(tmp_path / "ckpt"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "window on generate steps" in result.stderr
    for m in manifests(run_dir).values():
        inv = m["inventory"]
        assert inv["effective_tp"] == 2 and inv["dtensors"] > 0
        split = [w for w in inv["weights"] if w["split"] == 2]
        assert split and all(w["local_numel"] * 2 == math.prod(w["shape"]) for w in split)
    assert "tp-not-applied" not in {f["id"] for f in analyze_json(run_dir)["findings"]}
    for m in manifests(run_dir).values():  # the request itself, beside what the shards measure
        asked = {t["key"]: t["value"] for t in m["tp_requested"] if t["source"] == "from_pretrained"}
        assert asked == {"tp_plan": "auto", "tp_size (implied: WORLD_SIZE)": 2}
    compared = dstrace("compare", run_dir)
    assert compared.returncode == 0, compared.stderr[-3000:]
    said = " ".join(compared.stdout.split())
    assert "TP requested: tp_plan=auto (from_pretrained); tp_size (implied: WORLD_SIZE)=2 (from_pretrained)" in said
