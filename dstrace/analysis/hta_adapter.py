"""HTA (holistictraceanalysis 0.5.0, the version pyproject.toml pins: >=0.5.0,<0.6) behind one adapter.

Everything that knows HTA's internals is here: its per-rank frame built from dstrace's own decode
(`hta_frame`, `trace`), its logging and warnings kept off dstrace's output (`quiet`), the plotting modules it
imports but the breakdowns never use (stood in for, `import_analyzers`), and its row-wise kernel
classification run once per distinct kernel (`apply_once_per_value`). `hta_breakdown` asks HTA's analyzers
for the breakdowns through these and types what they give.

HTA's parser would read every trace a second time, and slowly (row-wise `apply`s over millions of
events). Instead HTA's frame is built here from the columns `tracefile` already parsed, the frame
HTA's `parse_trace_file` makes (symbol-coded names, its timestamp rounding, `index_correlation`,
`iteration`), restricted to the rows the breakdowns read: GPU work, the launches that link it to
the host, and the ProfilerStep ranges (the CPU ops, most of a trace, would only cost memory). It is
handed to a one-rank `hta.common.trace.Trace`, and HTA's own analyzers run on it. A new HTA release
is checked against HTA's own parse by `test_hta_frame_gives_what_htas_own_parse_gives`.
"""
from __future__ import annotations

import contextlib
import importlib
import io
import logging
import os
import re
import sys
import types
import warnings

import numpy as np
import pandas as pd

from dstrace.analysis.tracefile import Columns
from dstrace.trace_names import GPU_CATEGORIES, LAUNCH_CATEGORIES

# HTA's default parser config: (column, default when the event lacks the arg)
HTA_ARGS = (("stream", -1), ("correlation", -1), ("bytes", -1), ("memory_bw_gbps", 0.0), ("wait_on_stream", -1),
            ("wait_on_cuda_event_record_corr_id", -1), ("input_dims", "-1"), ("input_type", "-1"),
            ("input_strides", "-1"), ("external_id", -1))
HTA_STEP_NAME = re.compile(r"ProfilerStep\s*#\s*(\d+)")
"""HTA's own reading of a ProfilerStep name (`hta.common.trace.add_iteration`), which its frame must reproduce;
dstrace's own steps are `trace_names.PROFILER_STEP`."""


@contextlib.contextmanager
def quiet():
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


def import_analyzers():
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
def apply_once_per_value():
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
        step = int(HTA_STEP_NAME.match(name).group(1))
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


def trace(path: str, meta: dict, columns: Columns):
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
