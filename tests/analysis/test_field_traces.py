"""Traces of the field's shapes that dstrace was not built on (issue 24): figures that mean what their
words say, and remedies only where the trace or manifest shows their mechanism."""
from __future__ import annotations

import json
import os
import shutil

import pytest

from dstrace.analysis.render import render
from dstrace.analysis.render.terminal import Screen
from tests.fixtures.reports import analyze_dir
from tests.fixtures.runs import write_manifest
from tests.fixtures.traces import TraceBuilder


def one_step_trace(folder, step_name: str = "ProfilerStep#0") -> None:
    """torch.profiler's own output over one step: a ProfilerStep range, CPU ops and their kernels, no dstrace range."""
    b = TraceBuilder(0, world_size=1, distributed=False, dstrace_meta=None, run_id=None)
    b.host_range(step_name, 0.0, 2_000.0)
    for i in range(4):
        b.host_range("aten::mm", 100.0 + i * 400.0, 50.0, cat="cpu_op")
        b.compute(200.0 + i * 400.0, 150.0, launch_ts=110.0 + i * 400.0)
    b.write(str(folder))


def test_one_profiler_step_without_dstrace_ranges_is_analyzed(tmp_path):
    one_step_trace(tmp_path)
    a = analyze_dir(tmp_path)
    assert a.steps.source == "ProfilerStep ranges" and a.steps.count == 1
    assert a.ranks[0].busy_us["compute"] == 600.0
    for fmt in ("text", "json", "markdown"):
        assert render(a, fmt)


KERNELS = 20
KERNEL_US = 50.0
GAP_US = 450.0
SEED_REMEDIES = ("ZeRO-3", "zero3", "AutoTP", "KV cache", "prompt", "synced_gpus", "device_map", "tp_size")


def idle_gpu_trace(folder, host=None, launch_after=0.9, first_op_us: float | None = None) -> None:
    """One GPU rank, idle 90% of its span: a 50 us kernel every 500 us, each launched `launch_after` of the way
    through the gap before it. `host(builder, gap_start, gap_us)` puts what the host does in each gap."""
    b = TraceBuilder(0, world_size=1, distributed=False, dstrace_meta=None, run_id=None)
    b.host_range("ProfilerStep#5", -10.0, KERNELS * (KERNEL_US + GAP_US) + 20.0)
    for i in range(KERNELS):
        t = i * (KERNEL_US + GAP_US)
        gap_start = t - GAP_US
        if i and host:
            host(b, gap_start, GAP_US)
        b.compute(t, KERNEL_US, launch_ts=gap_start + launch_after * GAP_US if i else t - 5.0)
    if first_op_us:
        for i in range(KERNELS - 1):
            t = i * (KERNEL_US + GAP_US) + KERNEL_US
            b.host_range("aten::cudnn_convolution", t + 1.0, first_op_us if i == 0 else 20.0, cat="cpu_op")
    b.write(str(folder))


def host_bound_of(folder):
    a = analyze_dir(folder)
    return a, next((f for f in a.findings if f.id == "host-bound"), None)


def texts(a) -> str:
    return " ".join(f"{f.summary} {f.cause} {f.remedy}" for f in a.findings)


def test_host_wait_is_a_share_of_the_gpus_own_idle_time(tmp_path):
    idle_gpu_trace(tmp_path, launch_after=0.9)
    a, f = host_bound_of(tmp_path)
    e = f.evidence["ranks"]["0"]
    idle = (KERNELS - 1) * GAP_US
    assert e["gpu_idle_us"] == pytest.approx(idle)
    assert e["host_wait_us"] == pytest.approx(idle * 0.9)  # before each launch, not the whole gap
    assert e["host_wait_share_of_idle"] == pytest.approx(0.9)
    assert "90% of rank 0's GPU idle time is waiting for the host" in f.summary
    assert "hta_idle_causes_summed_over_streams_us" in e


def test_launches_issued_early_are_not_host_wait(tmp_path):
    """Launched 30% into each gap: the GPU waited 70% of its idle time on something other than the host."""
    idle_gpu_trace(tmp_path, launch_after=0.3)
    a, f = host_bound_of(tmp_path)
    assert f is None
    assert a.ranks[0].host_time["host_wait_us"] == pytest.approx((KERNELS - 1) * GAP_US * 0.3)


def test_no_host_activity_is_cause_not_identified_without_seed_remedies(tmp_path):
    idle_gpu_trace(tmp_path)
    a, f = host_bound_of(tmp_path)
    assert f.remedy.startswith("cause not identified") and "dstrace view" in f.remedy
    assert not any(word in texts(a) for word in SEED_REMEDIES)


def test_one_time_initialisation_says_warm_up(tmp_path):
    idle_gpu_trace(tmp_path, host=lambda b, t, gap: b.host_range("cudaFree", t + 5.0, gap - 60.0, cat="cuda_runtime"))
    a, f = host_bound_of(tmp_path)
    assert f.remedy.startswith("warm up before the window") and "cudaFree" in f.remedy
    assert "one-time initialisation overlaps" in f.cause
    assert not any(word in texts(a) for word in SEED_REMEDIES)


def test_a_first_call_outlier_says_warm_up(tmp_path):
    """cuDNN building its plan: the first convolution takes 5 ms in a window whose later ones take 20 us."""
    idle_gpu_trace(tmp_path, first_op_us=(KERNELS - 1) * GAP_US * 0.6)
    a, f = host_bound_of(tmp_path)
    first = a.ranks[0].host_time["first_calls"]["aten::cudnn_convolution"]
    assert first["extra_us"] == pytest.approx((KERNELS - 1) * GAP_US * 0.6 - 20.0)
    assert f.remedy.startswith("warm up before the window") and "first aten::cudnn_convolution call" in f.remedy


def test_an_input_pipeline_stall_says_so(tmp_path):
    name = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
    idle_gpu_trace(tmp_path, host=lambda b, t, gap: b.host_range(name, t + 5.0, gap - 60.0))
    a, f = host_bound_of(tmp_path)
    assert "the GPU waits for the next batch" in f.remedy and "num_workers" in f.remedy and name in f.remedy
    assert not any(word in texts(a) for word in SEED_REMEDIES)


def test_a_blocking_copy_is_named(tmp_path):
    def item(b, t, gap):
        b.host_range("aten::item", t + 2.0, gap - 50.0, cat="cpu_op")
        b.host_range("cudaMemcpy", t + 4.0, gap - 60.0, cat="cuda_runtime")

    idle_gpu_trace(tmp_path, host=item)
    a, f = host_bound_of(tmp_path)
    assert f.remedy.startswith("a blocking copy or synchronisation") and "non_blocking=True" in f.remedy
    assert "aten::item" in f.remedy and "cudaMemcpy" in f.remedy
    assert not any(word in texts(a) for word in SEED_REMEDIES)


def test_a_span_with_almost_nothing_on_it_says_so(tmp_path):
    b = TraceBuilder(0, world_size=1, distributed=False, dstrace_meta=None, run_id=None)
    b.compute(0.0, 10.0)
    b.write(str(tmp_path))
    a = analyze_dir(tmp_path)
    assert a.ranks[0].sparse == "its span of 10 us holds 1 kernel" and a.findings == []
    note = next(n for n in a.notes if n.startswith("rank 0: its span of 10 us"))
    assert "too little to split into shares" in note
    table = render(a, "text").split("Time per rank")[1].split("\n\n")[0]
    assert "%" not in table.split("\n", 2)[2]  # the rows give times, no shares


def test_hta_figures_are_labelled_and_an_unknown_overlap_is_not_printed(tmp_path):
    idle_gpu_trace(tmp_path)
    a = analyze_dir(tmp_path)
    a.ranks[0].hta.comm_comp_overlap_pct = float("nan")  # what HTA gives without kernels of one kind
    text = " ".join(render(a, "text", Screen(verbose=True)).split())  # --verbose shows HTA's; lines wrap
    assert "nan%" not in text and "comm/compute overlap" not in text and "HTA's own idle" in text
    assert json.loads(render(a, "json"))["ranks"]["0"]["hta"]["comm_comp_overlap_pct"] is None
    if a.ranks[0].hta.idle_causes_us:
        assert "summed over streams, not a share of the GPU's idle" in text


def test_zero3_hooks_remedy_needs_zero3_in_the_evidence(zero3_dir):
    a = analyze_dir(zero3_dir)
    f = next(f for f in a.findings if f.id == "host-bound")
    assert "ZeRO-3" in f.remedy  # its ranges are in the trace
    assert a.ranks[1].host_time["zero3_hooks_us"] <= a.ranks[1].host_time["gpu_idle_us"]


def test_communication_bound_without_zero3_or_decoding_names_neither(tmp_path):
    """DDP-like training traces (ProfilerStep, NCCL all-reduces no compute hides): no ZeRO-3 or decoding advice."""
    for r in range(2):
        b = TraceBuilder(r, dstrace_meta=None, run_id=None)
        b.host_range("ProfilerStep#3", -10.0, 20_000.0)
        t = 0.0
        for _ in range(10):
            b.compute(t, 300.0, launch_ts=t - 20.0)
            b.nccl("AllReduce", t + 300.0, 700.0, 1_000_000, 1_000_000, launch_ts=t + 280.0)
            t += 1_000.0
        b.write(str(tmp_path))
    a = analyze_dir(tmp_path)
    f = next(f for f in a.findings if f.id == "communication-bound")
    assert "nccl-tests" in f.remedy
    assert not any(word in texts(a) for word in SEED_REMEDIES)


def test_no_nccl_tests_advice_on_cpu_collectives():
    """gloo's collectives run on the host: nccl-tests measures nothing they use."""
    from dstrace.analysis.findings.communication import communication_bound
    from dstrace.analysis.results import RankReport

    s = RankReport(rank=0, file="rank0.json", host=None, span_us=1_000.0, idle_us=0.0,
                    busy_us={"compute": 200.0, "communication": 800.0}, exposed_comm_us=800.0, collectives={},
                    comm_us=800.0, wait_us=0.0, waited_for={}, late_count=0, caused_wait_us=0.0)
    cpu = communication_bound(inputs_of({0: s}, device="cpu"))
    gpu = communication_bound(inputs_of({0: s}, device="gpu"))
    assert "nccl-tests" not in cpu.remedy and "nccl-tests" in gpu.remedy
    assert not any(word in cpu.remedy for word in SEED_REMEDIES)


def test_a_missing_rank_is_named_as_a_rank(tmp_path):
    b = TraceBuilder(1, world_size=2)
    for i in range(12):
        b.compute(i * 100.0, 50.0)
    b.write(str(tmp_path))
    text = render(analyze_dir(tmp_path), "text")
    assert "missing rank 0 (1 of 2 ranks)" in text and "missing 0 (" not in text


PUBLIC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "public")


def public_run(tmp_path, name: str):
    shutil.copy(os.path.join(PUBLIC, name), tmp_path / name)
    return analyze_dir(tmp_path)


def test_public_alexnet_benchmark_is_initialisation_in_the_window(tmp_path):
    """What the events show: the GPU idles 99% of the span while the host creates the CUDA context (cudaFree,
    6 s) and runs the first convolution (10.8 s, cuDNN set-up; later ones take 1-9 ms)."""
    a = public_run(tmp_path, "hta_alexnet_trace.json.gz")
    (f,) = [f for f in a.findings if f.id == "host-bound"]
    assert f.remedy.startswith("warm up before the window")
    assert "cudaFree" in f.remedy and "first aten::conv2d call" in f.remedy
    assert not any(word in texts(a) for word in SEED_REMEDIES)
    share = f.evidence["ranks"]["0"]["host_wait_share_of_idle"]
    assert 0 < share <= 1 and f"{share:.0%} of rank 0's GPU idle time" in f.summary


@pytest.mark.parametrize("name, what", [("hta_event_sync_trace.json.gz", "its span of 263 us holds 5 kernels"),
                                        ("hta_triton_example.json.gz", "its span of 2 us holds 1 kernel")])
def test_public_bare_spans_get_no_shares(tmp_path, name, what):
    a = public_run(tmp_path, name)
    assert a.ranks[0].sparse == what and a.findings == []


def inputs_of(ranks: dict, device: str = "gpu", run=None, steps=None):
    """What a finding's check reads, for summaries made by hand: no ZeRO-3, no decoding steps."""
    from dstrace.analysis.findings import FindingInputs, Mechanisms
    from dstrace.analysis.loaded import LoadedRun

    run = run or LoadedRun(trace_dir="/nonexistent", traces={}, world_size=len(ranks))
    return FindingInputs(run, ranks, steps, device, Mechanisms(zero3=False, decoding=False, gpu=device == "gpu"))


def summary_of(rank: int, **kw):
    from dstrace.analysis.results import RankReport

    base = dict(rank=rank, file=f"rank{rank}.json", host=None, span_us=10_000.0, idle_us=1_000.0,
                busy_us={"compute": 6_000.0, "communication": 3_000.0}, exposed_comm_us=3_000.0, collectives={},
                comm_us=3_000.0, wait_us=2_000.0, waited_for={}, late_count=0, caused_wait_us=0.0)
    return RankReport(**{**base, **kw})


def test_mutual_wait_without_host_bound_does_not_point_to_it():
    """Each rank late to half the collectives (jitter), no rank host-bound: no 'see host-bound'."""
    from dstrace.analysis.findings.communication import waiting_for_peers

    ranks = {r: summary_of(r, waited_for={1 - r: 2_000.0}, late_count=5, caused_wait_us=2_000.0) for r in (0, 1)}
    f = waiting_for_peers(inputs_of(ranks))
    assert f.id == "mutual-wait" and "see host-bound" not in f.remedy and "ZeRO-3" not in f.remedy


def test_ddp_peer_wait_is_a_share_of_the_allreduce_time():
    """Peer wait counted over the whole all-reduce (900 of 1000 us) against 300 us exposed read '300% of the
    exposed time'; the share is of the all-reduce time, and peer-wait is named only when it is a finding: here
    when a second rank, late to every collective, is the straggler rank 0 waits on."""
    from dstrace.analysis.findings.communication import ddp_allreduce_exposed
    from dstrace.analysis.loaded import LoadedRun
    from dstrace.analysis.results import CollectiveStats, StepSummary
    from dstrace.runfolder.records import MANIFEST_SCHEMA, Manifest, Window

    ar = CollectiveStats(count=3, bytes=3_000_000, kernel_us=1_000.0, wait_us=900.0, transfer_us=100.0,
                         algbw_GBps=3.0, busbw_GBps=3.0, busbw_transfer_GBps=30.0, group_size=2)
    s = summary_of(0, span_us=2_000.0, exposed_comm_us=300.0, comm_us=1_000.0, wait_us=900.0,
                   collectives={"AllReduce": ar})
    window = Window(mode="full", call=1, start=2, steps=3, recorded_steps=[2, 3, 4], trigger="optimizer.step",
                    iterations={"optimizer.step": 7, "DistributedDataParallel.forward": 7})
    m = Manifest(schema=MANIFEST_SCHEMA, run_id="r", status="complete", rank=0, local_rank=0, world_size=2, host="h",
                 pid=1, started=0.0, window=window)
    run = LoadedRun(trace_dir="/nonexistent", traces={}, world_size=2, manifests={0: m})
    steps = StepSummary(count=3, ms_median=0.6, source="ProfilerStep ranges", per_rank={0: {"count": 3}}, decode=False)
    f = ddp_allreduce_exposed(inputs_of({0: s}, run=run, steps=steps))
    assert "90% of rank 0's all-reduce time is waiting for a later peer" in f.cause and "see peer-wait" not in f.cause
    late = summary_of(1, span_us=2_000.0, exposed_comm_us=0.0, comm_us=100.0, wait_us=0.0, late_count=3,
                      caused_wait_us=900.0)
    assert "see peer-wait" in ddp_allreduce_exposed(inputs_of({0: s, 1: late}, run=run, steps=steps)).cause


def test_steps_say_no_manifests_only_without_manifests(tmp_path):
    one_step_trace(tmp_path)
    assert "no manifests" in analyze_dir(tmp_path).steps.ms_per_step_covers
    write_manifest(str(tmp_path), 0, world_size=1)  # a manifest with no generate() step times
    covers = analyze_dir(tmp_path).steps.ms_per_step_covers
    assert "no manifests" not in covers and "the manifests hold no generate() step times" in covers
