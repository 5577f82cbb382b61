"""The standard per-rank GPU breakdowns, computed by HTA (holistictraceanalysis 0.5.0), from dstrace's own parse.

HTA gives temporal (idle / compute / non-compute), kernel-type totals, communication-computation
overlap and idle-time causes (host wait, kernel-launch gaps, other). Its critical-path and
frequent-sequence analyses fail on pandas 3 and are not used.

HTA's parser would read every trace a second time, and slowly (row-wise `apply`s over millions of
events). Instead HTA's frame is built here from the columns `tracefile` already parsed, the frame
HTA's `parse_trace_file` makes (symbol-coded names, its timestamp rounding, `index_correlation`,
`iteration`), restricted to the rows the breakdowns below read: GPU work, the launches that link it to
the host, and the ProfilerStep ranges (the CPU ops, most of a trace, would only cost memory). It is
handed to a one-rank `hta.common.trace.Trace`, and HTA's own analyzers run on it. Every HTA breakdown
dstrace uses is per rank, so one rank at a time gives what a whole-run `Trace` gives, in the process
that parsed the rank and with only that rank in memory. HTA logs plenty: silenced. Each analysis that fails
becomes a problem line, never the end of the report.
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import io
import logging
import os
import re
import sys
import types
import warnings
from typing import Callable

import numpy as np
import pandas as pd

from dstrace.analysis import intervals
from dstrace.analysis.model import LoadedRun
from dstrace.analysis.tracefile import Columns
from dstrace.trace_names import GPU_CATEGORIES, LAUNCH_CATEGORIES, comm_library

IDLE_CONSECUTIVE_KERNEL_DELAY_NS = 30
"""HTA's default: gaps under 30 ns between kernels are launch overhead ("kernel wait"), not host wait."""
# HTA's default parser config: (column, default when the event lacks the arg)
HTA_ARGS = (("stream", -1), ("correlation", -1), ("bytes", -1), ("memory_bw_gbps", 0.0), ("wait_on_stream", -1),
            ("wait_on_cuda_event_record_corr_id", -1), ("input_dims", "-1"), ("input_type", "-1"),
            ("input_strides", "-1"), ("external_id", -1))
PROFILER_STEP = re.compile(r"ProfilerStep\s*#\s*(\d+)")


@contextlib.contextmanager
def _quiet():
    """HTA logs, prints and raises pandas deprecation warnings; keep stdout (maybe JSON) and stderr clean."""
    hta_logger = logging.getLogger("hta")
    level, propagate = hta_logger.level, hta_logger.propagate
    hta_logger.setLevel(logging.CRITICAL + 1)
    hta_logger.propagate = False
    try:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hta_logger.setLevel(level)
        hta_logger.propagate = propagate


class _ImportedOnUse(types.ModuleType):
    """Stands in `sys.modules` for a module HTA imports at its top but the breakdowns never call: the first
    attribute read imports the real module and takes on its contents, so any later use works as before.
    `forwards` are names HTA imports from it (`from m import f`): each is a function that calls the real one."""

    def __init__(self, name: str, forwards: tuple[str, ...] = ()) -> None:
        super().__init__(name)
        for attr in forwards:
            setattr(self, attr, self._forward(attr))

    def _forward(self, attr: str):
        def forward(*args, **kwargs):
            return getattr(self._real(), attr)(*args, **kwargs)
        return forward

    def _real(self) -> types.ModuleType:
        name = self.__name__
        if sys.modules.get(name) is self:
            del sys.modules[name]
        real = importlib.import_module(name)
        self.__dict__.update(real.__dict__)
        return real

    def __getattr__(self, attr):
        if attr.startswith("__") and attr.endswith("__"):  # the import system probing (`__path__`): not a use
            raise AttributeError(attr)
        return getattr(self._real(), attr)


STOOD_IN = {"plotly.express": (), "plotly.graph_objects": (), "plotly.subplots": ("make_subplots",)}
"""What HTA's analyzers import for plots (with narwhals, 40-60 ms, half of importing HTA, in every parse
worker), which the breakdowns here never ask for: stood in for unless loaded already."""


def _import_hta_analyzers():
    """HTA's breakdown and communication analyzers, and its Trace, with the plotting modules they import
    stood in for (STOOD_IN)."""
    import plotly

    for name, forwards in STOOD_IN.items():
        if name not in sys.modules:
            sys.modules[name] = _ImportedOnUse(name, forwards)
            setattr(plotly, name.rpartition(".")[2], sys.modules[name])
    from hta.analyzers.breakdown_analysis import BreakdownAnalysis
    from hta.analyzers.communication_analysis import CommunicationAnalysis
    from hta.common import trace  # noqa: F401 - its import parses HTA's YAML of event args: 20 ms

    return BreakdownAnalysis, CommunicationAnalysis


@contextlib.contextmanager
def _apply_once_per_value():
    """HTA classifies kernels with a row-wise `DataFrame.apply` over a one-column frame (the kernel's name
    id): a Series is made for each row, seconds per million kernels, most of HTA's time. The function
    depends on that one value only, so here it runs once per distinct value and the results are spread
    back over the rows: HTA's own function gives HTA's own results, in a fraction of the time."""
    original = pd.DataFrame.apply

    def apply(self, func, axis=0, *args, **kwargs):
        if axis != 1 or self.shape[1] != 1 or args or kwargs or not len(self):
            return original(self, func, axis, *args, **kwargs)
        codes, _ = pd.factorize(self.iloc[:, 0], use_na_sentinel=False)
        first = np.unique(codes, return_index=True)[1]
        per_value = original(self.iloc[first], func, axis=1)
        if not isinstance(per_value, pd.Series):
            return original(self, func, axis, *args, **kwargs)
        return pd.Series(per_value.to_numpy()[codes], index=self.index, dtype=per_value.dtype, name=per_value.name)

    pd.DataFrame.apply = apply
    try:
        yield
    finally:
        pd.DataFrame.apply = original


def _values(columns: Columns, name: str, rows: np.ndarray) -> np.ndarray:
    table = np.empty(len(columns.tables[name]), dtype=object)
    table[:] = columns.tables[name]
    return table[columns.codes[name][rows]]


def _arg(columns: Columns, name: str, default, rows: np.ndarray) -> np.ndarray:
    """An arg column as HTA's parser fills it: the default where the event lacks the arg."""
    values = columns.arg(name, rows)
    if values.dtype == object:
        values[pd.isna(values)] = default
        return values
    values = np.where(np.isnan(values), default, values)
    if isinstance(default, int) and np.all(values == np.trunc(values)):
        return values.astype(np.int64)
    return values


def _add_iteration(df: pd.DataFrame, steps: pd.Series) -> None:
    """HTA's `add_iteration`, vectorised: CPU events take the ProfilerStep they start in, kernels their launch's.
    `steps`: the names of the ProfilerStep rows, by label."""
    ts = df["ts"].to_numpy()
    stream = df["stream"].to_numpy()
    iteration = np.full(len(df), np.nan)
    cpu = stream < 0
    iteration[cpu] = -1
    for label, name in steps.items():
        step = int(PROFILER_STEP.match(name).group(1))
        start, dur = df.at[label, "ts"], df.at[label, "dur"]
        iteration[cpu & (ts >= start) & (ts < start + dur)] = step
    gpu = stream > 0
    linked = df["index_correlation"].to_numpy()
    by_label = pd.Series(iteration, index=df.index)
    looked = by_label.reindex(np.where(linked > 0, linked, df.index[0])).to_numpy()
    iteration[gpu] = np.where(linked[gpu] > 0, looked[gpu], -1)
    df["iteration"] = pd.to_numeric(pd.Series(iteration, index=df.index), downcast="integer")


def _narrowest(values: np.ndarray) -> np.ndarray:
    """Integers as the narrowest of int8-int64 that holds them all, as `pd.to_numeric(downcast="integer")`
    makes them (int8 when there are none), without its trial conversions and comparisons per type."""
    low, high = (int(values.min()), int(values.max())) if len(values) else (0, 0)
    for dtype in (np.int8, np.int16, np.int32, np.int64):
        if np.iinfo(dtype).min <= low and high <= np.iinfo(dtype).max:
            return values.astype(dtype, copy=False)
    return values


def hta_frame(columns: Columns):
    """HTA's per-rank DataFrame and symbol table, as `hta.common.trace.parse_trace_file` makes them."""
    from hta.common.trace import transform_correlation_to_index
    from hta.common.trace_symbol_table import TraceSymbolTable

    gpu_or_launch = columns.per_row("cat", lambda c: c in GPU_CATEGORIES or c in LAUNCH_CATEGORIES)
    categorized = columns.per_row("cat", lambda c: c not in ("", None, "Trace"))
    profiler_step = columns.per_row("name", lambda n: isinstance(n, str) and n.startswith("ProfilerStep"))
    # the breakdowns read GPU work, the launches that link it to the host and the ProfilerStep ranges
    # (iterations, the window HTA keeps); the CPU ops, most of a trace, would only cost memory
    kept = gpu_or_launch | (profiler_step & categorized)
    rows = np.flatnonzero(columns.has_dur & kept)
    ts, dur = columns.ts[rows], columns.dur[rows]
    if not columns.ts_all_int:  # HTA's round_down_time_stamps
        end = np.floor(ts + dur).astype(np.int64)
        ts = np.ceil(ts).astype(np.int64)
        dur = end - ts
    elif np.all(ts == np.trunc(ts)):
        ts = ts.astype(np.int64)
    # names and categories by code: each distinct one is looked up once, not once per row
    used = {c: np.unique(columns.codes[c][rows]) for c in ("cat", "name")}
    symbols = TraceSymbolTable()
    symbols.add_symbols({columns.tables[c][code] for c in used for code in used[c].tolist()})
    ids = symbols.get_sym_id_map()

    def symbol_ids(column: str) -> np.ndarray:
        lookup = np.zeros(len(columns.tables[column]), dtype=np.int64)
        lookup[used[column]] = [ids[columns.tables[column][code]] for code in used[column].tolist()]
        return lookup[columns.codes[column][rows]]

    step_rows = rows[profiler_step[rows]]
    steps = pd.Series(_values(columns, "name", step_rows), index=columns.position[step_rows], dtype=object)
    data = {"index": columns.position[rows], "cat": symbol_ids("cat"), "name": symbol_ids("name"),
            "pid": columns.values("pid", rows), "tid": columns.values("tid", rows), "ts": ts, "dur": dur}
    data.update({name: _arg(columns, name, default, rows) for name, default in HTA_ARGS})
    # HTA downcasts every int column; a narrow correlation column then cannot take event indices (HTA
    # 0.5.0 fails on pandas 3), so it stays as it is
    data = {c: _narrowest(v) if c != "correlation" and v.dtype.kind == "i" else v for c, v in data.items()}
    df = pd.DataFrame(data, index=columns.position[rows])
    df = transform_correlation_to_index(df, symbols)
    _add_iteration(df, steps)
    df["end"] = df["ts"] + df["dur"]
    return df, symbols


def _trace(path: str, meta: dict, columns: Columns):
    """A one-rank HTA Trace, loaded as `Trace.load_traces(include_last_profiler_step=True)` would."""
    from hta.common.trace import Trace

    df, symbols = hta_frame(columns)
    t = Trace(trace_files={0: path}, trace_dir=os.path.dirname(path))
    t.meta_data[0], t.traces[0], t.symbol_table = meta, df, symbols
    t.align_and_filter_trace(include_last_profiler_step=True)
    df = t.traces[0].set_index("index", drop=False)
    df.index.names = [None]
    t.traces[0] = df
    t.is_parsed = True
    return t


def _temporal(t, analyzers) -> dict:
    temporal = analyzers[0].get_temporal_breakdown(t, visualize=False)
    if not len(temporal):
        return {}
    row = temporal.iloc[0]
    out = {
        "idle_us": float(row["idle_time(us)"]), "compute_us": float(row["compute_time(us)"]),
        "non_compute_us": float(row["non_compute_time(us)"]), "span_us": float(row["kernel_time(us)"]),
        "idle_pct": float(row["idle_time_pctg"]), "compute_pct": float(row["compute_time_pctg"]),
        "non_compute_pct": float(row["non_compute_time_pctg"]),
    }
    typed = communication_in_compute(t)
    if typed:
        out["communication_in_compute_us"] = typed
    return {"temporal": out}


def communication_in_compute(t) -> dict[str, float]:
    """Per library, the time of the communication kernels (`trace_names.comm_library`: DeepEP, custom
    all-reduce, MSCCL++, NVSHMEM) that HTA types COMPUTATION, on HTA's own frame and clock: the part of HTA's
    compute time that dstrace counts as communication. HTA knows only `nccl*Kernel` names as communication."""
    from hta.utils.utils import get_kernel_type

    df = t.traces[0]
    kernels = df[df["stream"].ne(-1)]
    if kernels.empty:
        return {}
    names = t.symbol_table.get_sym_table()
    libraries = {}
    for code in pd.unique(kernels["name"]):
        name = names[int(code)]
        library = comm_library(name)
        if library is not None and get_kernel_type(name) == "COMPUTATION":
            libraries[code] = library
    if not libraries:
        return {}
    of = kernels["name"].map(libraries)
    return {str(lib): intervals.total(intervals.merge(g["ts"], g["ts"] + g["dur"]))  # HTA shifts ts, not end
            for lib, g in kernels[of.notna()].groupby(of)}


def _kernels(t, analyzers) -> dict:
    per_kernel: pd.DataFrame = analyzers[0].get_gpu_kernel_breakdown(
        t, visualize=False, num_kernels=5, include_memory_kernels=True)[1]
    if not len(per_kernel):
        return {}
    top = per_kernel.sort_values("sum (us)", ascending=False).head(8)
    return {"kernel_types_us": {k: float(v) for k, v in per_kernel.groupby("kernel_type")["sum (us)"].sum().items()},
            "top_kernels": [_top_kernel(str(n), str(k), float(s))
                            for n, k, s in zip(top["name"], top["kernel_type"], top["sum (us)"])]}


def _top_kernel(name: str, kernel_type: str, total_us: float) -> dict:
    """One of HTA's top kernels; `communication_library` names the library whose communication kernel HTA
    typed as something else (a DeepEP dispatch as COMPUTATION)."""
    out = {"name": name, "kernel_type": kernel_type, "total_us": total_us}
    library = comm_library(name)
    if library is not None and kernel_type != "COMMUNICATION":
        out["communication_library"] = library
    return out


def _overlap(t, analyzers) -> dict:
    overlap = analyzers[1].get_comm_comp_overlap(t, visualize=False)
    if not len(overlap):
        return {}
    value = float(overlap.iloc[0]["comp_comm_overlap_pctg"])
    return {"comm_comp_overlap_pct": value if value == value else None}


def _idle(t, analyzers) -> dict:
    idle = analyzers[0].get_idle_time_breakdown(t, IDLE_CONSECUTIVE_KERNEL_DELAY_NS, rank=0, visualize=False)[0]
    return {"idle_causes_us": {str(k): float(v) for k, v in idle.groupby("idle_category")["idle_time"].sum().items()}}


BREAKDOWNS = {"temporal breakdown": _temporal, "kernel breakdown": _kernels,
              "communication-computation overlap": _overlap, "idle time breakdown": _idle}
"""HTA's breakdowns dstrace reports, in report order: label -> function of (Trace, analyzers) giving entries."""
HELPER_SHARE = ("kernel breakdown", "communication-computation overlap")
"""The breakdowns a helper process computes, when there is one, while this one computes the others and the
reduction: the two slowest (0.27 s and 0.14 s of HTA's 0.55 s on a 300 MB trace), about as long as the rest."""


def _ready() -> None:
    with _quiet():
        _import_hta_analyzers()


def run_breakdowns(t, labels) -> dict[str, tuple[dict, str | None]]:
    """label -> (its entries, None) or ({}, the problem met): each failure is left out, never the end."""
    done = {}
    with _quiet(), _apply_once_per_value():
        analyzers = _import_hta_analyzers()
        for label in labels:
            try:
                done[label] = BREAKDOWNS[label](t, analyzers), None
            except Exception as exc:  # HTA is a third-party library: any failure is reported, not fatal
                done[label] = {}, _failed(label, exc)
    return done


def _failed(label: str, exc: BaseException) -> str:
    return f"HTA {label} failed ({type(exc).__name__}: {exc}); left out"


def rank_breakdowns(path: str, meta: dict, columns: Columns, helper=None) -> Callable[[], dict]:
    """One rank's HTA breakdowns from its parsed columns, as a function that gives {"breakdowns": {"temporal",
    "kernel_types_us", "top_kernels", "comm_comp_overlap_pct", "idle_causes_us"}, "problems": [...]}. With
    a `tracefile.Helper`, the helper computes HELPER_SHARE meanwhile and the function waits for its part:
    the caller reduces the rank in between, and calls it whatever happens (the helper's answers must be
    read before it takes its next job)."""
    taken = [helper is not None and helper.submit(_ready)]  # it imports HTA while this process builds the frame
    share: tuple[str, ...] = ()
    try:
        try:
            with _quiet():
                _import_hta_analyzers()
                t = _trace(path, meta, columns)
        except Exception as exc:  # HTA is a third-party library: any failure is reported, not fatal
            done = None
            skipped = ("HTA could not read this trace, so its breakdown is left out; the rest of the report (time per "
                       "rank, steps, collectives, findings) is dstrace's own and still covers it "
                       f"(HTA's error: {type(exc).__name__}: {exc})")
        else:
            taken.append(helper is not None and helper.submit(run_breakdowns, t, HELPER_SHARE))
            share = HELPER_SHARE if taken[-1] else ()
            done = run_breakdowns(t, [label for label in BREAKDOWNS if label not in share])
            del t
    except BaseException:
        _answers(helper, taken)
        raise

    @functools.cache  # asked again, it gives the same: its helper answers once
    def result() -> dict:
        theirs = _answers(helper, taken)[-1]
        if done is None:
            return {"breakdowns": {}, "problems": [skipped]}
        if share and isinstance(theirs, (OSError, EOFError)):
            done.update({label: ({}, f"HTA {label} left out: its helper process ended ({theirs})") for label in share})
        elif share and isinstance(theirs, Exception):
            done.update({label: ({}, _failed(label, theirs)) for label in share})
        elif share:
            done.update(theirs)
        out, problems = {}, []
        for label in BREAKDOWNS:
            entries, problem = done[label]
            out.update(entries)
            problems.extend([problem] if problem else [])
        return {"breakdowns": out, "problems": problems}
    return result


def _answers(helper, taken: list[bool]) -> list:
    """The helper's answers to the jobs it took (True in `taken`; None for the others), in order: each a value
    or the exception met, the job's own or, once the helper died, the OSError/EOFError of its end."""
    out: list = []
    ended = None
    for job in taken:
        if not job or ended is not None:
            out.append(ended if job else None)
            continue
        try:
            out.append(helper.result())
        except (OSError, EOFError) as exc:
            ended = exc
            out.append(exc)
        except Exception as exc:  # noqa: BLE001 - the job's own failure, reported by the caller
            out.append(exc)
    return out


def hta_breakdowns(run: LoadedRun) -> tuple[dict[int, dict], list[str]]:
    """Per rank with GPU kernels, the breakdowns `rank_breakdowns` gave when the rank was loaded, and the
    problems met, one line each. Empty for CPU-only runs (HTA needs GPU kernels)."""
    out: dict[int, dict] = {}
    problems: list[str] = []
    if run.device != "gpu":
        return out, problems
    for rank, trace in sorted(run.traces.items()):
        if not trace.has_gpu:
            continue
        result = trace.reduced.hta
        if result is None:  # a reduction made without HTA's breakdowns (`dstrace.testing.scale_run`)
            continue
        out[rank] = result["breakdowns"]
        problems.extend(f"rank {rank}: {p}" for p in result["problems"])
    return out, problems
