"""`dstrace analyze` on traces nobody here made: public Kineto sets (tests/corpus/data, README.md there) and
multi-rank twins cut from them (make_twins.py).

Every set runs through the CLI in a subprocess, as a user runs it: it exits 0, or with a one-line error, never a
traceback. Then the report is checked against what the events themselves say (README.md, "expert readings").
A check that today's analysis fails is written as it should hold and marked `xfail(strict=True)` with the
defect (issue 24), so it turns into a failure, and its mark is removed, once the defect is fixed.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field

import pytest

from tests.corpus import make_twins
from tests.fixtures.paths import CORPUS, ROOT


@dataclass(frozen=True)
class Expect:
    """What an expert reads off the set's events (README.md). None: not checked."""
    device: str | None = None
    world_size: int | None = None
    ranks_found: tuple[int, ...] | None = None
    steps: int | None = None
    """Profiler steps of one rank (iterations), or 0 for a trace with none."""
    collectives: dict[str, int] | None = None
    """Collective kind -> calls on every found rank; {} for none."""
    idle_pct: float | None = None
    """GPU idle share of the GPU span on the lowest found rank (union of kernels, copies and sets), +-1 point."""
    accelerator: str | None = None
    late_rank: int | None = None
    """The rank that arrives last and causes the most peer wait."""
    comm_us_at_least: float | None = None
    """Communication time on the lowest found rank that the communication kernels alone add up to."""
    step_samples: int | None = None
    """Iterations per rank the per-step median covers (`ms_per_step_per_rank`; `ms_per_step_samples` is that
    times the ranks, and the text says both: 'median of 16 step times (2 per rank, 8 ranks)')."""
    says: tuple[str, ...] = ()
    """Words the text report (--verbose) holds (its lines joined, whitespace collapsed): what the expert
    concludes."""
    never_says: tuple[str, ...] = ()
    """Words the text report must not hold: a claim or remedy the events do not support."""
    xfail: dict[str, str] = field(default_factory=dict)
    """Check name -> the defect that makes it fail today."""


@dataclass(frozen=True)
class CorpusSet:
    name: str
    files: tuple[str, ...]
    """Paths under data/ (a real set), or the twin's name (built by make_twins)."""
    expect: Expect
    crash: str | None = None
    """The defect that makes `dstrace analyze` print a traceback on this set today."""
    twin: bool = False


HTA = "hta/tests/data/"
TL = "tracelens/tests/traces/"
SETS = (
    CorpusSet("hta-rocm-mi250", (HTA + "amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",),
              Expect(device="gpu", world_size=1, ranks_found=(0,), steps=2, collectives={}, idle_pct=98.3,
                     # no manifest marks the profiler's start step: the 9.3 ms and 49 us steps are both timed
                     # HTA fails on it: the report says so in its own words and what it still covers
                     says=("every traced step in the median", "HTA could not read this trace, so its breakdown "
                           "is left out", "is dstrace's own and still covers it"),
                     never_says=("left out of the median",))),
    CorpusSet("hta-backward-thread", (HTA + "call_stack/backward_thread.json",),
              Expect(device="gpu", ranks_found=(0,), steps=1, collectives={},
                     # 1 kernel in 45 us: too little to split, HTA's shares of it included
                     says=("median of 1 step time (", "HTA's shares left out"),
                     never_says=("1 step times", "HTA's own idle"))),
    CorpusSet("hta-cpu-only-gloo", (HTA + "cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",),
              Expect(device="cpu", world_size=300, ranks_found=(34,), steps=1,
                     # 10 gloo:all_reduce in the trace (two threads); 2 start inside the one ProfilerStep, the span
                     collectives={"AllReduce": 2},
                     # gloo ops, not kernels; busbw's n is the world of 300 the trace records, not the 1 rank found
                     says=("n = the group size the trace records",),
                     never_says=("collective kernel time",))),
    CorpusSet("hta-alexnet", (HTA + "critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz",),
              Expect(device="gpu", world_size=1, ranks_found=(0,), steps=0, collectives={}, idle_pct=99.5)),
    CorpusSet("hta-cuda-event-sync", (HTA + "critical_path/cuda_event_sync/event_sync_trace.json.gz",),
              Expect(device="gpu", ranks_found=(0,), steps=1, collectives={}, idle_pct=80.6,
                     says=("HTA's shares left out",), never_says=("HTA's own idle",))),
    CorpusSet("hta-cupti-profiler", (HTA + "cupti_profiler/benchmark_result_924719_1679055439_trace.json.gz",),
              # 1,862 CUDA runtime calls and 77 CUPTI profiler ranges, no kernel: a GPU job, its device side untraced
              Expect(device="host-only", world_size=1, ranks_found=(0,), steps=0,
                     says=("GPU job profiled without its GPU activity (host times only)",
                           "wrote 1862 CUDA runtime calls, 77 CUPTI profiler ranges"),
                     never_says=("CPU-only", "gloo / c10d"))),
    CorpusSet("hta-distributed-info-missing",
              (HTA + "distributed_info_unavailable/distributed_info_not_found.json.gz",),
              # 6 nccl:all_to_all host ranges, no kernel: an NCCL job profiled without its GPU activity
              Expect(device="host-only", ranks_found=(0,), steps=1,
                     says=("GPU job profiled without its GPU activity (host times only)",
                           "c10d's nccl:* ranges: 6 AllToAll (353.8 MB)"),
                     never_says=("CPU-only", "gloo / c10d"))),
    CorpusSet("hta-rank-missing", (HTA + "rank_unavailable/rank_not_found.json.gz",),
              Expect(device="host-only", ranks_found=(0,), steps=1,
                     says=("GPU job profiled without its GPU activity (host times only)",
                           "c10d's nccl:* ranges: 6 AllToAll (353.8 MB)"),
                     never_says=("CPU-only", "gloo / c10d"))),
    CorpusSet("hta-mtia-inference", (HTA + "mtia_inference_trace/mtia_inference_rank_0.json.gz",),
              Expect(device="host-only", world_size=1, ranks_found=(0,), steps=0, accelerator="MTIA")),
    CorpusSet("hta-mtia-single-rank", (HTA + "mtia_trace_single_rank/mtia_rank_0.json.gz",),
              Expect(device="host-only", world_size=1, ranks_found=(0,), steps=1, accelerator="MTIA",
                     collectives={"Barrier": 48})),
    CorpusSet("hta-nccl-allreduce-broadcast", (HTA + "nccl_parser_config/nccl_data.json.gz",),
              Expect(device="gpu", world_size=2, ranks_found=(0,), steps=3,
                     collectives={"AllReduce": 15, "Broadcast": 6}, idle_pct=76.2)),
    CorpusSet("hta-negative-queue", (HTA + "negative_queue_length_values_check/rank0.json.gz",),
              Expect(device="gpu", world_size=16, ranks_found=(0,), steps=5, idle_pct=64.4,
                     # SendRecv kernels named by the c10d range that launched them; 5 are launched outside any
                     collectives={"AllToAll": 45, "AllReduce": 10, "ReduceScatter": 10, "AllGather": 10,
                                  "SendRecv": 5})),
    CorpusSet("hta-ns-resolution", (HTA + "ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",),
              Expect(device="gpu", world_size=1, ranks_found=(0,), steps=5, collectives={}, idle_pct=1.6)),
    CorpusSet("hta-sampled-2-of-128", (HTA + "trace_filter/sampled_rank-0.json.gz",
                                       HTA + "trace_filter/sampled_rank-1.json.gz"),
              Expect(device="gpu", world_size=128, ranks_found=(0, 1), steps=2, idle_pct=55.2,
                     collectives={"AllToAll": 4, "AllReduce": 4, "AllGather": 2},
                     # every SendRecv kernel is launched inside a c10d collective's range: none is point-to-point;
                     # after the +170 us shift rank 1's ends still differ from rank 0's by 65 ms: no alignment
                     says=("these collectives do not align the clocks",),
                     never_says=("point-to-point calls whose peer", "clocks aligned"))),
    CorpusSet("hta-old-category-names", (HTA + "trace_file_list/inference_rank_1.json.gz",),
              Expect(device="gpu", ranks_found=(1,), steps=0, collectives={}, idle_pct=98.2,
                     says=("HTA's shares left out",), never_says=("HTA's own idle",))),
    CorpusSet("hta-triton", (HTA + "triton_example/triton_example.json.gz",),
              Expect(device="gpu", world_size=1, ranks_found=(0,), steps=1, collectives={},
                     says=("HTA's shares left out",), never_says=("HTA's own idle",))),
    CorpusSet("hta-v100-allreduce", (HTA + "df_index_resolver/df_index_resolver.json.gz",),
              Expect(device="gpu", world_size=2, ranks_found=(1,), steps=5, collectives={"AllReduce": 2020},
                     idle_pct=42.3)),
    CorpusSet("hta-dlrm-rank3-of-8", (HTA + "trace_diff/control/control.json.gz",),
              Expect(device="gpu", world_size=8, ranks_found=(3,), steps=6, idle_pct=16.4,
                     collectives={"AllToAll": 42, "AllReduce": 18},
                     # its NCCL kernels carry no size args: the remedy is not a CPU profiler flag
                     says=("their NCCL kernels carry no size args",), never_says=("record_shapes=True",))),
    CorpusSet("param-linear", ("param/et_replay/tests/inputs/linear_kineto.json.gz",),
              Expect(device="gpu", world_size=1, ranks_found=(0,), steps=0, collectives={}, idle_pct=63.2)),
    CorpusSet("tracelens-b200-rank0-of-8", (TL + "b200/eager_trace.json.gz",),
              Expect(device="gpu", world_size=8, ranks_found=(0,), steps=0, collectives={"AllGather": 1},
                     idle_pct=86.3, comm_us_at_least=2119)),
    CorpusSet("tracelens-h100-bert", (TL + "h100/gaunernst_bert-small-uncased__1016001.json.gz",),
              Expect(device="gpu", world_size=1, ranks_found=(0,), steps=1, collectives={},
                     # torch.profiler wrote it, with one host event overlapping its neighbour (as in 8 other sets)
                     says=("overlapping, not nested",), never_says=("not what a profiler writes",))),
    CorpusSet("tracelens-mi300-bert", (TL + "mi300/gaunernst_bert-small-uncased__1016001.json.gz",),
              Expect(device="gpu", world_size=1, ranks_found=(0,), steps=1, collectives={})),
    CorpusSet("tracelens-sglang-decode", (TL + "inference/sglang_decode/sglang_Qwen3-8B_decode.json.gz",),
              # 463 ms of the 464 ms GPU idle is one host hipMemcpyWithStream (aten::copy_, 256 B device to host)
              Expect(device="gpu", world_size=1, ranks_found=(0,), steps=0, collectives={}, idle_pct=97.9,
                     says=("463.03 ms of the GPU's 463.98 ms idle time overlaps host hipMemcpyWithStream calls",))),
    CorpusSet("tracelens-sglang-graph-capture", (TL + "inference/sglang_decode/capture_traces/bs_32_rank0.json.gz",),
              Expect(device="gpu", world_size=1, ranks_found=(0,), steps=1, collectives={},
                     says=("HTA's shares left out",), never_says=("HTA's own idle",))),
    CorpusSet("tracelens-vllm-graph-execution", (TL + "inference/vllm_decode_full/graph_execution.json.gz",),
              Expect(device="gpu", world_size=1, ranks_found=(0,), steps=0, collectives={}, idle_pct=0.2)),
    CorpusSet("tracelens-vllm-graph-capture", (TL + "inference/vllm_decode_full/capture_traces/"
                                               "graph_capture_rank_0.1773709742341309550.pt.trace.json.gz",),
              Expect(device="gpu", world_size=1, ranks_found=(0,), steps=0, collectives={},
                     # hipStreamBeginCapture to hipStreamEndCapture holds 55 of the 57.8 ms: the kernels launched
                     # then are recorded into the graph, not run; one-time set-up, not a host too slow to launch
                     says=("graph capture", "start the window after the capture"),
                     never_says=("cause not identified",))),
    CorpusSet("tracelens-mi210-gpu-only", (TL + "mi210/gpu_only_trace/gpu_only_trace.json.gz",),
              Expect(device="gpu", world_size=1, ranks_found=(0,), steps=0, collectives={}, idle_pct=10.6)),
    CorpusSet("tracelens-mi300-resnet-rank0-of-8", (TL + "mi300/resnet_act_checkpoint.json.gz",),
              Expect(device="gpu", world_size=8, ranks_found=(0,), steps=3, idle_pct=3.0,
                     collectives={"AllReduce": 6, "Broadcast": 6, "NCCL (kind not named)": 5})),
    CorpusSet("tracelens-torch-compile-triton", (TL + "torch_compile_triton/trace.json.gz",),
              Expect(device="gpu", world_size=1, ranks_found=(0,), steps=0, collectives={}, idle_pct=0.0)),
    CorpusSet("twin-allreduce-2ranks", ("hta_allreduce_2ranks",), twin=True,
              expect=Expect(device="gpu", world_size=2, ranks_found=(0, 1), steps=3, late_rank=1, step_samples=3,
                            collectives={"AllReduce": 15, "Broadcast": 6})),
    CorpusSet("twin-all-to-all-8ranks", ("hta_all_to_all_8ranks",), twin=True,
              expect=Expect(device="gpu", world_size=8, ranks_found=tuple(range(8)), steps=2, late_rank=3,
                            step_samples=2, collectives={"AllToAll": 4, "AllReduce": 4, "AllGather": 2},
                            # its AllGather kernels carry no sizes (older NCCL): nothing says how much is gathered
                            says=("rank 3 arrives last to 10 of 10",), never_says=("gathered 0 B",))),
    CorpusSet("twin-mi300-resnet-generic-8ranks", ("mi300_resnet_generic_8ranks",), twin=True,
              expect=Expect(device="gpu", world_size=8, ranks_found=tuple(range(8)), steps=3, late_rank=5,
                            step_samples=3, collectives={"AllReduce": 6, "Broadcast": 6,
                                                         "NCCL (kind not named)": 5})),
)
BY_NAME = {s.name: s for s in SETS}


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str


def analyze(folder: str, fmt: str) -> Run:
    """`dstrace analyze FOLDER --format FMT` (text with --verbose: every section), in a subprocess with this
    interpreter."""
    proc = subprocess.run([sys.executable, "-m", "dstrace.cli", "analyze", folder, "--format", fmt]
                          + (["--verbose"] if fmt == "text" else []),
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, OMP_NUM_THREADS="1",
                                   PYTHONPATH=os.pathsep.join(filter(None, (ROOT, os.environ.get("PYTHONPATH"))))))
    return Run(proc.returncode, proc.stdout, proc.stderr)


def assert_no_traceback(run: Run) -> None:
    """Exit 0, or non-zero with one `dstrace:` error line; never a traceback."""
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    if run.returncode != 0:
        errors = [line for line in run.stderr.splitlines() if line.startswith("dstrace: ")]
        assert errors, run.stderr[-2000:]


@pytest.fixture(scope="session")
def corpus_runs(tmp_path_factory):
    """Each set copied to a folder of its own (dstrace keeps caches beside the traces), analyzed as json and
    text; returns {name: {fmt: Run}}, computed lazily per set."""
    root = tmp_path_factory.mktemp("corpus")
    twins = {t.name: t for t in make_twins.TWINS}
    done: dict[str, dict[str, Run]] = {}

    def get(name: str) -> dict[str, Run]:
        if name not in done:
            s = BY_NAME[name]
            folder = root / name
            if s.twin:
                make_twins.build(twins[s.files[0]], str(root))
                folder = root / s.files[0]
            else:
                folder.mkdir()
                for f in s.files:
                    shutil.copyfile(os.path.join(CORPUS, f), folder / os.path.basename(f))
            done[name] = {fmt: analyze(str(folder), fmt) for fmt in ("json", "text")}
        return done[name]
    return get


def _crash_marks(s: CorpusSet):
    return [pytest.mark.xfail(strict=True, reason=s.crash)] if s.crash else []


@pytest.mark.parametrize("name", [pytest.param(s.name, marks=_crash_marks(s)) for s in SETS])
def test_no_traceback(corpus_runs, name):
    runs = corpus_runs(name)
    for fmt in ("json", "text"):
        assert_no_traceback(runs[fmt])
    if runs["json"].returncode == 0:
        assert json.loads(runs["json"].stdout)["schema"] == "dstrace.analysis/1"


def _lowest(report: dict) -> dict:
    return report["ranks"][str(min(int(r) for r in report["ranks"]))]


def _observed(check: str, report: dict):
    """The report's value for one expert check."""
    if check == "device":
        return report["device"]
    if check == "world_size":
        return report["world_size"]
    if check == "ranks_found":
        return tuple(report["ranks_found"])
    if check == "steps":
        return (report.get("steps") or {}).get("count") or 0
    if check == "collectives":
        return {r: {k: c["count"] for k, c in v["collectives"].items()} for r, v in report["ranks"].items()}
    if check == "idle_pct":
        rank = _lowest(report)
        return 100 * rank["idle_us"] / rank["span_us"]
    if check == "accelerator":
        return set(report.get("accelerators") or {})
    if check == "late_rank":
        caused = {int(r): v["caused_wait_us"] for r, v in report["ranks"].items()}
        return max(caused, key=caused.get) if any(caused.values()) else None
    if check == "comm_us_at_least":
        return _lowest(report)["busy_us"]["communication"]
    if check == "step_samples":
        return (report.get("steps") or {}).get("ms_per_step_per_rank")
    raise KeyError(check)


def _holds(check: str, expected, observed) -> bool:
    if check == "collectives":
        return all(v == expected for v in observed.values())
    if check == "idle_pct":
        return abs(observed - expected) <= 1.0
    if check == "accelerator":
        return expected in observed
    if check == "comm_us_at_least":
        return observed >= expected
    return observed == expected


CHECKS = ("device", "world_size", "ranks_found", "steps", "collectives", "idle_pct", "accelerator", "late_rank",
          "comm_us_at_least", "step_samples")


def _check_params():
    for s in SETS:
        for check in CHECKS:
            if getattr(s.expect, check) is None:
                continue
            reason = s.expect.xfail.get(check) or s.crash
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
            yield pytest.param(s.name, check, marks=marks, id=f"{s.name}-{check}")


@pytest.mark.parametrize(("name", "check"), list(_check_params()))
def test_expert_reading(corpus_runs, name, check):
    run = corpus_runs(name)["json"]
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(run.stdout)
    expected = getattr(BY_NAME[name].expect, check)
    observed = _observed(check, report)
    assert _holds(check, expected, observed), f"{name}: {check} expected {expected!r}, report {observed!r}"


def _text_params():
    for s in SETS:
        if s.expect.says or s.expect.never_says:
            marks = [pytest.mark.xfail(strict=True, reason=s.crash)] if s.crash else []
            yield pytest.param(s.name, marks=marks, id=s.name)


@pytest.mark.parametrize("name", list(_text_params()))
def test_report_says(corpus_runs, name):
    """The text report's sentences say what the expert reads off the events, and nothing they do not support."""
    run = corpus_runs(name)["text"]
    assert run.returncode == 0, run.stderr[-2000:]
    text = " ".join(run.stdout.split())
    expect = BY_NAME[name].expect
    assert [w for w in expect.says if w not in text] == [], text
    assert [w for w in expect.never_says if w in text] == [], text


def test_corpus_stays_small():
    """The committed data stays within what the GPU machine's tree carries: <= 25 MB, <= 3 MB a file."""
    sizes = [os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(CORPUS) for f in fs]
    assert sum(sizes) <= 25_000_000 and max(sizes) <= 3_000_000
