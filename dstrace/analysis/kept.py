"""A rank's kept reduction: `<trace>.reduction.arrow`, the one file per rank that stands in for its trace.

`KeptReduction` is both what decoding a trace hands over and what goes on disk (`save`/`load`): the
rank's `reduction.RankReduction` (what the analysis reads of a rank, HTA's breakdowns included), the
trace's metadata (everything but its events), its file name, and the key it was made under (the hash of
the whole trace, the world size the folder's manifests gave, dstrace's code and the HTA and pandas
versions). `dstrace record` writes one per rank once the job has ended and `dstrace reduce` one per trace
it is given (both `write_run_reductions`), `dstrace analyze` one for each trace it decodes without one; all
with the one decoder and reduction (`loading.decode_rank`).

The file is an Arrow IPC stream of one table, compressed as one zstd frame (pyarrow's codec: `zstd -dc`
gives the stream back): a `frame` column and the reduction's three frames side by side (`collectives.*`,
`steps.*`, `gathers.*`: each row belongs to one of them, its other columns are null), numbers as they are
and texts dictionary-encoded; everything else is JSON in the schema's metadata. A stream holds its schema
once (an IPC file holds it twice, and the metadata with it) and the one frame compresses the nulls, the
repeated texts and the metadata together: 3-21 kB a rank where the uncompressed IPC file was 18-402 kB.
So the files of all ranks read as one table (`load_many`: concatenated, dictionaries unified, each frame
converted once for all ranks), not one decode per rank.

One trust model: a kept reduction is untrusted input like every file of a run folder, read within bounds
and checked (`_problem`), never sealed. It answers for its trace when the trace is in the folder and the
key matches (the same bytes, read by this code: a kept reduction never changes an answer), and it is the
rank when the trace is not there (a folder copied without its traces, or reduced where it lay).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

import msgspec
import numpy as np
import pandas as pd
import pyarrow as pa

from dstrace.analysis import identity, rank_collectives, reduction
from dstrace.analysis.reduction import RankReduction
from dstrace.analysis.results import HtaBreakdown
from dstrace.runfolder import untrusted
from dstrace.runfolder.files import atomic_file
from dstrace.runfolder.names import REDUCTION_SUFFIX, reduction_name

pd.set_option("mode.string_storage", "python")
"""pandas 3 stores its text columns in Arrow when pyarrow is installed, a copy of each row's text; dstrace's
hold a few distinct texts named by millions of calls (a 10,000-rank group's member list is 59 KB), shared
as Python objects (`collectives._per_value`, `matching._codes`), so the analysis keeps pandas' own storage."""

FORMAT = "dstrace.reduction/2"
"""Bump when the decode, the reduction or the kept HTA results change meaning, or the file's layout (/2: the
zstd-compressed IPC stream; /1 was an uncompressed IPC file)."""
SUFFIX = REDUCTION_SUFFIX
MAX_KEPT_BYTES = 256 << 20
"""A rank's reduction is kilobytes to a few MB in memory, its file a tenth of that; a larger file is not one
dstrace wrote, and is refused before it is read, and so is one whose stream would be larger."""
MAX_INFLATION = 64
"""A file's stream is at most this many times the file (dstrace's are 3-16 times: texts and nulls compress,
times do not): it is refused as it is decompressed, so a folder of small files holds at most this many
times its size in memory, not a decompression bomb's gigabytes per file."""
CODEC = "zstd"
LEVEL = 3
"""zstd's own default (Arrow's is 1): half the file where a 10,000-rank group's member list is kept (22 kB, not
43), read as fast."""
META_KEY = b"dstrace"
FRAMES = ("collectives", "steps", "gathers")
COLUMNS = {"collectives": rank_collectives.RANK_COLUMNS, "steps": reduction.STEP_COLUMNS,
           "gathers": reduction.GATHER_COLUMNS}
NUMERIC = {"collectives": ("ts", "dur", "end", "host_ts", "in_bytes", "out_bytes"),
           "steps": ("step", "ts", "end", "ms"), "gathers": ("ts", "bytes")}
KINDS = ("num", "str", "json")
_FRAME_CODES = np.arange(len(FRAMES), dtype=np.int8)
BATCH_RANKS = 512
"""Files read into one Arrow table at a time: their tables (a world group's member list is 59 KB of text per
rank at 10,000 ranks) are held only until their frames are columns."""


def kept_path(trace_path: str) -> str:
    folder, name = os.path.split(trace_path)
    return os.path.join(folder, reduction_name(name))


def key(trace_path: str, world_hint: int, content: dict | None = None) -> dict:
    """What a kept reduction must have been made under to answer for the trace as it is now (`content`: the
    trace's `untrusted.content`, when the folder's listing took it already). Raises OSError (or
    `untrusted.Refused`) when the trace cannot be read."""
    return {"trace": content or untrusted.content(trace_path), "world_hint": world_hint, **identity.versions()}


@dataclass
class KeptReduction:
    reduced: RankReduction
    meta: dict  # the trace's top-level metadata (everything but its events)
    trace_file: str  # the trace's file name, in the same folder
    key: dict  # `key` when it was made

    def answers_for(self, trace_path: str, world_hint: int, content: dict | None = None) -> bool:
        """Whether this reduction is the one this code makes of the trace as it is now."""
        try:
            return self.key == key(trace_path, world_hint, content)
        except (OSError, untrusted.Refused):
            return False

    def save(self, path: str) -> None:
        """Write the file, whole or not at all. Raises OSError when the folder refuses."""
        table = _table(self)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        data = pa.Codec(CODEC, LEVEL).compress(sink.getvalue())
        with atomic_file(path, "wb") as f:
            f.write(memoryview(data))

    @classmethod
    def load(cls, path: str) -> KeptReduction:
        """The kept reduction in `path`. Raises ValueError saying what is wrong with the file, OSError when it
        cannot be read."""
        got = load_many([path])[0]
        if isinstance(got, str):
            raise ValueError(got)
        return got


# ---- writing: a reduction as one table

def _factorize(values: np.ndarray, missing: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Codes in order of first appearance (-1 for a gap) through a dict, which uses each text's cached hash:
    pandas hashes every row's text anew, 30 ms for a 10,000-rank group's "[0, 1, ...]" named by 120 calls."""
    index: dict[str, int] = {}
    codes = np.fromiter((-1 if gap else index.setdefault(v, len(index)) for v, gap in zip(values, missing)),
                        dtype=np.int32, count=len(values))
    return codes, list(index)


def _encode(series: pd.Series) -> tuple[str, np.ndarray, list[str] | None]:
    """(kind, values or codes, texts) for one column: "num" as is, "str" codes into its texts, "json" codes
    into the JSON texts of its values."""
    if series.dtype.kind in "biuf":
        return "num", series.to_numpy(), None
    values = series.to_numpy(dtype=object)
    missing = pd.isna(values) if values.dtype == object else np.zeros(len(values), dtype=bool)
    present = values[~missing]
    if all(isinstance(v, str) for v in present):
        return ("str", *_factorize(values, missing))
    texts = np.full(len(values), None, dtype=object)
    texts[~missing] = [msgspec.json.encode(v).decode() for v in present]
    return ("json", *_factorize(texts, missing))


def _table(kept: KeptReduction) -> pa.Table:
    r = kept.reduced
    frames = {name: getattr(r, name) for name in FRAMES}
    rows = {name: len(df) for name, df in frames.items()}
    total = sum(rows.values())
    fields, arrays = [pa.field("frame", pa.int8())], [pa.array(np.repeat(np.arange(3, dtype=np.int8),
                                                                         list(rows.values())))]
    before = 0
    for name, df in frames.items():
        after = total - before - rows[name]
        for col in df.columns:
            kind, values, texts = _encode(df[col])
            if kind == "num":
                part = pa.array(values)
                column = pa.concat_arrays([pa.nulls(before, part.type), part, pa.nulls(after, part.type)])
            else:
                codes = np.concatenate([np.full(before, -1, np.int32), values, np.full(after, -1, np.int32)])
                column = pa.DictionaryArray.from_arrays(pa.array(codes, mask=codes < 0), pa.array(texts, pa.string()))
            fields.append(pa.field(f"{name}.{col}", column.type,
                                   metadata={"kind": kind, "dtype": str(df[col].dtype)}))
            arrays.append(column)
        before += rows[name]
    head = {"format": FORMAT, "trace_file": kept.trace_file, "key": kept.key, "meta": kept.meta, "rows": rows,
            "reduced": {k: v for k, v in r.plain().items() if k not in FRAMES}}
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields, metadata={META_KEY: json.dumps(head)}))


# ---- reading: many ranks' files as one table

def load_many(paths: list[str], progress=lambda message: None) -> list[KeptReduction | str]:
    """Each file's kept reduction, or one line saying what is wrong with it. The files are read `BATCH_RANKS`
    at a time into one table per column layout (each rank's frame is then its slice of the whole run's frame,
    a view indexed from 0): building a frame costs about a millisecond whatever its rows, so one per rank
    and frame was most of the read at thousands of ranks."""
    out: list[KeptReduction | str | None] = [None] * len(paths)
    heads: dict[int, dict] = {}
    pieces: dict[tuple, list[tuple[list[int], dict[str, dict[str, np.ndarray]]]]] = {}
    texts: dict[str, str] = {}  # equal texts of all ranks as one object
    for start in range(0, len(paths), BATCH_RANKS):
        if start:
            progress(f"read {start} of {len(paths)} kept reductions")
        layouts: dict[tuple, list[tuple[int, pa.Table]]] = {}
        for i in range(start, min(start + BATCH_RANKS, len(paths))):
            try:
                table, head, layout = _read(paths[i])
            except (OSError, ValueError) as exc:
                out[i] = untrusted.unreadable(paths[i], exc) if isinstance(exc, OSError) else str(exc)
                continue
            heads[i] = head
            layouts.setdefault(layout, []).append((i, table))
        for (layout, _), members in layouts.items():
            ranks = [i for i, _ in members]
            try:
                pieces.setdefault(layout, []).append((ranks, _columns([t for _, t in members], layout, texts)))
            except (pa.ArrowException, ValueError, TypeError) as exc:  # checked file by file: not expected
                for i in ranks:
                    out[i] = f"not a reduction dstrace kept ({type(exc).__name__}: {str(exc)[:200]})"
                    del heads[i]
        del layouts
    for layout, batches in pieces.items():
        ranks = [i for batch, _ in batches for i in batch]
        for name in FRAMES:
            wanted = [(col, kind, dtype) for frame, col, kind, dtype in layout if frame == name]
            whole = pd.DataFrame({col: _typed(kind, np.concatenate([cols[name][col] for _, cols in batches]), dtype)
                                  for col, kind, dtype in wanted}, columns=[c for c, _, _ in wanted])
            for _, cols in batches:
                cols[name] = None  # consumed: the batches' columns are not held beside the whole frame
            starts = np.cumsum([0] + [heads[i]["rows"][name] for i in ranks])
            for i, a, b in zip(ranks, starts[:-1], starts[1:]):
                part = whole.iloc[a:b]
                part.index = pd.RangeIndex(b - a)
                heads[i].setdefault("frames", {})[name] = part
    for i, head in heads.items():
        kept = _kept(head)
        problem = kept if isinstance(kept, str) else _problem(kept)
        out[i] = f"not a reduction dstrace kept ({problem})" if problem else kept
    return out


def _read(path: str) -> tuple[pa.Table, dict, tuple]:
    """A file's table (without its head), head and layout (`_layout`, and the Arrow types: files of one are
    read as one table), checked as far as batching them needs. Raises ValueError."""
    if os.stat(path).st_size > MAX_KEPT_BYTES:  # refused unread; the read below holds the bound all the same
        raise ValueError(f"holds more than {MAX_KEPT_BYTES >> 20} MiB, more than a rank's reduction "
                         "(kilobytes to a few MB): remove it, it is not one dstrace wrote")
    data = untrusted.read_bytes(path, MAX_KEPT_BYTES)
    try:
        table = _open(data)
        table.validate(full=True)
        head = _head(table.schema)
    except _Refused:
        raise
    except (pa.ArrowException, KeyError, TypeError, ValueError, RecursionError) as exc:
        raise ValueError(f"not a reduction dstrace kept: truncated or corrupt ({str(exc)[:200]})") from None
    if not isinstance(head, dict) or head.get("format") != FORMAT:
        raise ValueError(_other_format(head))
    schema = table.schema
    seen = schema.remove_metadata().serialize().to_pybytes()  # names, types and field metadata, in C++
    if seen not in _LAYOUTS:
        try:
            _LAYOUTS[seen] = (_layout(schema), tuple(str(f.type) for f in schema))
        except UnicodeDecodeError:
            raise ValueError("not a reduction dstrace kept (its columns' kinds are not text)") from None
    layout = _LAYOUTS[seen]
    problem = _layout_problem(table, head, layout)
    if problem:
        raise ValueError(f"not a reduction dstrace kept ({problem})")
    return table.replace_schema_metadata(None), head, layout


class _Refused(ValueError):
    """What `_open` says of a file it does not read as a table: its one line."""


def _open(data: bytes) -> pa.Table:
    """The table of a file's bytes: its zstd frame decompressed within `MAX_INFLATION` times its size and
    `MAX_KEPT_BYTES` (`_Refused` past them), then read as an Arrow IPC stream. An uncompressed IPC file, as
    dstrace.reduction/1 wrote them, is `_Refused` by the format its schema names."""
    if data[:6] == b"ARROW1":
        raise _Refused(_other_format(_head(pa.ipc.open_file(pa.py_buffer(data)).schema)))
    limit = min(MAX_KEPT_BYTES, MAX_INFLATION * len(data))
    stream = pa.CompressedInputStream(pa.BufferReader(data), CODEC).read_buffer(limit + 1)
    if stream.size > limit:
        raise _Refused(f"decompresses to more than {limit:,} bytes ({MAX_INFLATION} times its size, or "
                       f"{MAX_KEPT_BYTES >> 20} MiB), more than a rank's reduction: remove it, it is not one "
                       "dstrace wrote")
    # as Python bytes, like the file's: Arrow's allocator keeps what it frees, and a batch's streams held
    # there raised the peak by their size (+34 MiB at 1,000 ranks of a 10,000-rank world)
    return pa.ipc.open_stream(pa.py_buffer(stream.to_pybytes())).read_all()


def _head(schema: pa.Schema):
    return json.loads(schema.metadata[META_KEY])


def _other_format(head) -> str:
    found = head.get("format") if isinstance(head, dict) else None
    return (f"not a {FORMAT} reduction ({str(found)[:40]}: written by another dstrace version?); remove it, or keep "
            "its trace beside it")


_LAYOUTS: dict[bytes, tuple] = {}


def _layout(schema: pa.Schema) -> tuple:
    """(frame, column, kind, dtype) per column: files of one layout are read as one table."""
    out = []
    for f in schema:
        if f.name != "frame":
            frame, _, col = f.name.partition(".")
            meta = f.metadata or {}
            out.append((frame, col, meta.get(b"kind", b"").decode(), meta.get(b"dtype", b"").decode()))
    return tuple(out)


def _layout_problem(table: pa.Table, head: dict, layout: tuple) -> str | None:
    """What is wrong with a file's columns and row counts for the analysis to read them, or None."""
    schema = table.schema
    if not schema.names or schema.names[0] != "frame" or schema.field(0).type != pa.int8() \
            or table.column(0).null_count:
        return "no frame column"
    problem = _schema_problem(layout, schema)
    if problem:
        return problem
    rows = head.get("rows")
    if not (isinstance(rows, dict) and list(rows) == list(FRAMES)
            and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in rows.values())):
        return "no row counts"
    frame = table.column(0).to_numpy()
    if len(frame) != sum(rows.values()) or not np.array_equal(frame, np.repeat(_FRAME_CODES, list(rows.values()))):
        return "rows that do not add up to its frames"
    for name, c, kind, _ in layout[0]:
        if c in NUMERIC.get(name, ()) and kind != "num":
            column = table.column(f"{name}.{c}")
            if kind == "str" and column.null_count != len(column):
                return f"{name} holds times or sizes that are not numbers"
            if kind == "json" and not all(v is None or _number(v) for chunk in column.chunks
                                          for v in map(msgspec.json.decode, chunk.dictionary.to_pylist())):
                return f"{name} holds times or sizes that are not numbers"
    return None


_CHECKED: dict[tuple, str | None] = {}


def _schema_problem(layout: tuple, schema: pa.Schema) -> str | None:
    """What is wrong with a file's columns, or None: files of one layout share the answer."""
    if layout not in _CHECKED:
        _CHECKED[layout] = _columns_problem(schema)
    return _CHECKED[layout]


def _columns_problem(schema: pa.Schema) -> str | None:
    for f in list(schema)[1:]:
        meta = f.metadata or {}
        if f.name.partition(".")[0] not in FRAMES or meta.get(b"kind", b"").decode() not in KINDS:
            return f"a column {f.name[:60]!r} that no reduction has"
        kind = meta[b"kind"].decode()
        typed = pa.types.is_integer(f.type) or pa.types.is_floating(f.type) or pa.types.is_boolean(f.type)
        if (kind == "num") != typed or (kind != "num" and not (pa.types.is_dictionary(f.type)
                                                               and pa.types.is_string(f.type.value_type))):
            return f"column {f.name[:60]} holds {f.type}, not {kind} values"
        try:
            _dtype(meta.get(b"dtype", b"").decode())
        except TypeError:
            return f"column {f.name[:60]} names no pandas type"
    layout = _layout(schema)
    for name in FRAMES:
        names = [c for frame, c, _, _ in layout if frame == name]
        if names != list(COLUMNS[name]):
            return f"{name} has columns {names}"[:200]
    return None


_DTYPES: dict[str, object] = {}


def _dtype(name: str):
    """pandas' dtype of that name (TypeError when none): a file names a few, 21 columns per rank."""
    if name not in _DTYPES:
        try:
            _DTYPES[name] = pd.api.types.pandas_dtype(name)
        except (TypeError, ValueError):
            raise TypeError(name) from None
    return _DTYPES[name]


def _columns(tables: list[pa.Table], layout: tuple, texts: dict) -> dict[str, dict[str, np.ndarray]]:
    """The tables of one layout as one: per frame, its columns over all these ranks, as numpy arrays (texts
    and JSON values as objects, equal texts one object)."""
    whole = pa.concat_tables(tables).unify_dictionaries().combine_chunks()
    frame = whole.column(0).to_numpy()
    out: dict[str, dict[str, np.ndarray]] = {}
    for n, name in enumerate(FRAMES):
        rows = np.flatnonzero(frame == n)
        out[name] = {}
        for f, col, kind, _ in layout:
            if f != name:
                continue
            out[name][col] = _raw(kind, whole.column(f"{name}.{col}").combine_chunks(), rows, texts)
    return out


def _raw(kind: str, array: pa.Array, rows: np.ndarray, texts: dict) -> np.ndarray:
    """One stored column's `rows` as a numpy array: numbers as they are, texts (gaps NaN) and JSON values
    (gaps None) as objects."""
    if kind == "num":
        return array.take(pa.array(rows)).to_numpy(zero_copy_only=False)
    table = array.dictionary.to_pylist()
    lookup = np.empty(len(table) + 1, dtype=object)
    if kind == "str":
        lookup[:-1] = [texts.setdefault(t, t) for t in table]
        lookup[-1] = np.nan
    else:
        lookup[:-1] = [msgspec.json.decode(t) for t in table]
        lookup[-1] = None
    codes = array.indices.fill_null(len(table)).to_numpy(zero_copy_only=False)
    return lookup[codes[rows]]


def _typed(kind: str, values: np.ndarray, dtype: str):
    """A `_raw` column as the frame holds it: texts in `dtype` (pandas' string array, its texts kept as the
    Python objects they are: Arrow storage would copy a 59 KB group text once per call), the rest as is."""
    if kind == "str" and dtype not in ("object", "O"):
        return pd.array(values, dtype=_python_storage(_dtype(dtype)))
    if values.dtype == object:  # as kept: pandas 3 would infer its text type from an object array of texts
        return pd.Series(values, dtype=object, copy=False)
    if kind == "num" and values.dtype != _dtype(dtype):
        return values.astype(_dtype(dtype))
    return values


def _python_storage(dtype):
    if isinstance(dtype, pd.StringDtype) and dtype.storage != "python":
        try:
            return pd.StringDtype("python", na_value=dtype.na_value)
        except TypeError:  # pandas before 2.3: one missing-value marker
            return pd.StringDtype("python")
    return dtype


def _kept(head: dict) -> KeptReduction | str:
    try:
        reduced = RankReduction(**head.pop("frames"), **head["reduced"])
        return KeptReduction(reduced=reduced, meta=head["meta"], trace_file=head["trace_file"], key=head["key"])
    except (KeyError, TypeError) as exc:  # a head naming fields a reduction has not
        return f"{type(exc).__name__}: {str(exc)[:200]}"


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _problem(kept: KeptReduction) -> str | None:
    """What is wrong with a kept reduction's content for the analysis to read it, or None (its frames'
    columns were checked as it was read, `_layout_problem`)."""
    name = kept.trace_file
    if not (isinstance(name, str) and name and os.path.basename(name) == name and name not in (".", "..")):
        return "its trace's file name is not a file name"
    if not isinstance(kept.meta, dict) or not isinstance(kept.key, dict):
        return "its trace's metadata is not an object"
    reduced = kept.reduced
    u = reduced.utilization
    if not (isinstance(reduced.has_gpu, bool) and isinstance(u, dict)
            and all(_number(u.get(k)) for k in ("span_us", "idle_us", "exposed_comm_us"))
            and isinstance(u.get("busy_us"), dict) and all(_number(v) for v in u["busy_us"].values())
            and isinstance(u.get("devices", {}), dict)
            and (u.get("window_us") is None or (isinstance(u["window_us"], list) and len(u["window_us"]) == 2
                                                and all(_number(v) for v in u["window_us"])))
            and isinstance(u.get("comm_libraries_us", {}), dict)
            and all(isinstance(k, str) and _number(v) for k, v in u.get("comm_libraries_us", {}).items())
            and isinstance(reduced.host_time, dict) and (reduced.hta is None or isinstance(reduced.hta, HtaBreakdown))
            and isinstance(reduced.step_work, list) and isinstance(reduced.accelerator_events, dict)
            and isinstance(reduced.gpu_host_events, dict)
            and all(isinstance(k, str) and _number(v) for k, v in reduced.gpu_host_events.items())
            and isinstance(reduced.nccl_host_calls, dict)
            and all(isinstance(k, str) and isinstance(v, dict) and all(_number(v.get(x)) for x in ("count", "bytes"))
                    for k, v in reduced.nccl_host_calls.items())):
        return "its utilization, host time or HTA results are not what the analysis reads"
    return None


# ---- the run's reductions, as `dstrace record` and `dstrace reduce` write them

def write_run_reductions(run_dir: str, traces: dict[int, str], world_size: int,
                         progress=lambda message: None) -> list[str]:
    """Reduce each rank's trace (rank -> file name in `run_dir`) and keep its reduction beside it: what `dstrace
    record` does once the command has ended and `dstrace reduce` for the traces it is given. These are the
    reductions `dstrace analyze` makes and reads, so the first analysis decodes no trace. Returns one line
    per rank left without one in `run_dir`."""
    from dstrace.analysis.loading import Parsed, parse_traces
    from dstrace.runfolder.folder import TRACE, FolderFile

    paths = {rank: os.path.join(run_dir, name) for rank, name in sorted(traces.items())}
    parsed = parse_traces([FolderFile(p, TRACE) for p in paths.values()], progress, world_hint=world_size)
    problems = []
    for rank, path in paths.items():
        result = parsed[path]
        if not isinstance(result, Parsed):
            problems.append(f"rank {rank}: no kept reduction: {result}")
        elif not os.path.isfile(kept_path(path)):
            problems.append(f"rank {rank}: no kept reduction: {run_dir} refused the file")
    return problems
