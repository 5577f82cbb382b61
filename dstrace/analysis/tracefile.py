"""Parse one torch.profiler (Kineto) trace file into columns, without holding the whole document as objects.

A 300 MB trace loaded with `json.loads` becomes several GB of dicts. Kineto writes one event per block,
`  {` ... `  },` at two spaces of indentation, and JSON strings cannot hold a raw newline, so the
event array can be cut at `\\n  },\\n  {` into pieces that are each a valid JSON array. Each piece is
parsed (orjson), its complete ('X') events appended to columns, and dropped. A file formatted
otherwise, or a piece that does not parse, is read again whole, so the result never depends on the
formatting and damage is reported with the message a whole-file parse gives.

The columns keep what `loading` and HTA (`hta_breakdown`) need, so one parse serves both.
"""
from __future__ import annotations

import gzip
import zlib
from dataclasses import dataclass

import numpy as np
import orjson

CHUNK_BYTES = 8 << 20
"""Bytes of JSON decoded at a time: ~10x that in transient objects, small next to a rank's columns."""
EVENT_SEPARATOR = b"\n  },\n  {"
ARRAY_KEY = b'"traceEvents"'

# Args copied into columns: (column, arg key). The first block is what the analyses read; the second
# what HTA's default parser config reads as well.
ARG_COLUMNS = (
    ("correlation", "correlation"),
    ("external_id", "External id"),
    ("stream", "stream"),
    ("device", "device"),
    ("coll_name", "Collective name"),
    ("in_nelems", "In msg nelems"),
    ("out_nelems", "Out msg nelems"),
    ("dtype", "dtype"),
    ("group_size", "Group size"),
    ("pg_name", "Process Group Name"),
    ("pg_ranks", "Process Group Ranks"),
    ("input_dims", "Input Dims"),
    ("input_type", "Input type"),
    ("p2p_src", "Src Rank"),
    ("p2p_dst", "Dst Rank"),
)
HTA_ARG_COLUMNS = (
    ("bytes", "bytes"),
    ("memory_bw_gbps", "memory bandwidth (GB/s)"),
    ("wait_on_stream", "wait_on_stream"),
    ("wait_on_cuda_event_record_corr_id", "wait_on_cuda_event_record_corr_id"),
    ("input_strides", "Input Strides"),
)
ALL_ARGS = ARG_COLUMNS + HTA_ARG_COLUMNS
NUMERIC_ARGS = frozenset({"correlation", "external_id", "stream", "device", "in_nelems", "out_nelems", "group_size",
                          "p2p_src", "p2p_dst",
                          "bytes", "memory_bw_gbps", "wait_on_stream", "wait_on_cuda_event_record_corr_id"})
"""Arg columns held as float64 (NaN when absent); the others hold the raw values (None when absent)."""
CODED = ("name", "cat", "pid", "tid")
"""Columns with few distinct values: stored as int32 codes into a table of values."""


@dataclass
class Columns:
    """A trace's complete ('X') events in file order, as arrays.

    `position` is the event's index in `traceEvents` (HTA's `index`); `has_dur` says whether it had a
    `dur`; coded columns are `codes[c]` into `tables[c]`; `args[c]` is float64 for NUMERIC_ARGS (object
    when the trace put something else there), else object; `present[c]` says whether any event had it.
    """
    position: np.ndarray
    ts: np.ndarray
    dur: np.ndarray
    has_dur: np.ndarray
    codes: dict[str, np.ndarray]
    tables: dict[str, list]
    args: dict[str, np.ndarray]
    present: dict[str, bool]
    ts_all_int: bool = True  # HTA rounds float timestamps and keeps integer ones as they are

    def __len__(self) -> int:
        return len(self.position)


def _objects(values: list) -> np.ndarray:
    arr = np.empty(len(values), dtype=object)
    arr[:] = values
    return arr


def _arg_array(column: str, n: int, rows: list, values: list) -> np.ndarray:
    """A dense column of n rows from the (row, value) pairs of the events that had the arg."""
    if column in NUMERIC_ARGS:
        try:
            arr = np.full(n, np.nan)
            arr[rows] = np.array(values, dtype=np.float64)
            return arr
        except (TypeError, ValueError):
            pass
    arr = np.full(n, None, dtype=object)
    arr[rows] = _objects(values)
    return arr


ARG_INDEX = {key: i for i, (_, key) in enumerate(ALL_ARGS)}


class _Builder:
    """Columns grown one piece of the event array at a time; each piece's Python objects are dropped."""

    def __init__(self) -> None:
        self.pieces: list[dict[str, np.ndarray]] = []
        self.index: dict[str, dict] = {c: {} for c in CODED}
        self.present = {c: False for c, _ in ALL_ARGS}
        self.ts_all_int = True
        self.seen = 0

    def add(self, events: list) -> None:
        positions, ts_list, durs, has_dur = [], [], [], []
        codes = {c: [] for c in CODED}
        tables = [(codes[c], self.index[c]) for c in CODED]
        arg_rows = [[] for _ in ALL_ARGS]
        arg_values = [[] for _ in ALL_ARGS]
        arg_index = ARG_INDEX
        ts_all_int = self.ts_all_int
        pos = self.seen - 1
        n = 0
        for e in events:
            pos += 1
            if not isinstance(e, dict):
                continue
            ts = e.get("ts")
            if ts_all_int and not isinstance(ts, int):
                ts_all_int = False
            if ts is None or e.get("ph") != "X":
                continue
            dur = e.get("dur")
            positions.append(pos)
            ts_list.append(float(ts))
            durs.append(float(dur or 0.0))
            has_dur.append(dur is not None)
            for (out, table), value in zip(tables, (e.get("name", ""), e.get("cat", ""), e.get("pid"), e.get("tid"))):
                code = table.get(value)
                if code is None:
                    code = table[value] = len(table)
                out.append(code)
            args = e.get("args")
            if isinstance(args, dict):
                for key, value in args.items():
                    i = arg_index.get(key)
                    if i is not None and value is not None:
                        arg_rows[i].append(n)
                        arg_values[i].append(value)
            n += 1
        self.seen = pos + 1
        self.ts_all_int = ts_all_int
        piece = {"position": np.array(positions, dtype=np.int64), "ts": np.array(ts_list, dtype=np.float64),
                 "dur": np.array(durs, dtype=np.float64), "has_dur": np.array(has_dur, dtype=bool)}
        piece.update({c: np.array(v, dtype=np.int32) for c, v in codes.items()})
        for (column, _), rows, values in zip(ALL_ARGS, arg_rows, arg_values):
            self.present[column] = self.present[column] or bool(rows)
            piece["arg:" + column] = _arg_array(column, n, rows, values)
        self.pieces.append(piece)

    def finish(self) -> Columns:
        """Join the pieces column by column, dropping each column's pieces once joined: the columns are
        never held twice over."""
        def cat(key: str, dtype) -> np.ndarray:
            parts = [p.pop(key) for p in self.pieces]
            if not parts:
                return np.empty(0, dtype=dtype)
            if any(p.dtype == object for p in parts):
                parts = [p if p.dtype == object else _objects([None if np.isnan(v) else v for v in p.tolist()])
                         for p in parts]
            return np.concatenate(parts)

        columns = Columns(
            position=cat("position", np.int64), ts=cat("ts", np.float64), dur=cat("dur", np.float64),
            has_dur=cat("has_dur", bool), codes={c: cat(c, np.int32) for c in CODED},
            tables={c: list(t) for c, t in self.index.items()},
            args={c: cat("arg:" + c, np.float64 if c in NUMERIC_ARGS else object) for c, _ in ALL_ARGS},
            present=dict(self.present), ts_all_int=self.ts_all_int)
        self.pieces = []
        release_freed_memory()
        return columns


def _libc_trim():
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


_TRIM = _libc_trim()


def release_freed_memory() -> None:
    """Hand freed memory back to the system. glibc keeps freed blocks below its (self-raising) mmap threshold
    in the process: the pieces' arrays, freed once joined into columns, would otherwise stay and count
    twice in the parse's peak. No-op where there is no glibc."""
    if _TRIM is not None:
        _TRIM(0)


def _open(path: str):
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


def _read_whole(path: str) -> tuple[dict, Columns]:
    with _open(path) as f:
        data = orjson.loads(f.read())
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise ValueError("not a torch.profiler trace (no traceEvents list)")
    b = _Builder()
    b.add(data.pop("traceEvents"))
    return data, b.finish()


class _NotKineto(Exception):
    """The file is not laid out as Kineto writes it; read it whole instead."""


def _read_pieces(path: str) -> tuple[dict, Columns]:
    b = _Builder()
    with _open(path) as f:
        buf = f.read(CHUNK_BYTES)
        key = buf.find(ARRAY_KEY)
        start = buf.find(b"[", key) if key >= 0 else -1
        if start < 0 or not buf.lstrip().startswith(b"{"):
            raise _NotKineto
        header = buf[:start + 1]
        buf = buf[start + 1:]
        while True:
            cut = buf.rfind(EVENT_SEPARATOR)
            if cut >= 0:
                cut += 4  # keep "\n  }": the piece ends with a whole event
                b.add(orjson.loads(b"[" + buf[:cut] + b"]"))
                buf = buf[cut + 2:]  # drop ",\n": the rest starts at the next event's "  {"
            more = f.read(CHUNK_BYTES)
            if not more:
                break
            buf += more
    try:
        head = orjson.loads(header + b"]}")
        tail = orjson.loads(b'{"traceEvents": [' + buf)
    except orjson.JSONDecodeError:
        raise _NotKineto from None
    if not isinstance(head, dict) or not isinstance(tail, dict) or not isinstance(tail.get("traceEvents"), list):
        raise _NotKineto
    b.add(tail.pop("traceEvents"))
    head.pop("traceEvents", None)
    head.update(tail)
    return head, b.finish()


def read_trace(path: str) -> tuple[dict, Columns]:
    """The trace's metadata (every top-level key but traceEvents) and its complete events as columns.
    Any damage becomes a ValueError whose message says what is wrong with the file."""
    try:
        try:
            return _read_pieces(path)
        except (_NotKineto, orjson.JSONDecodeError):
            return _read_whole(path)
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise ValueError(f"truncated or corrupt gzip ({exc})") from None
    except (orjson.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"truncated or corrupt JSON ({exc})") from None
    except OSError as exc:
        raise ValueError(f"unreadable ({exc.strerror or exc})") from None
