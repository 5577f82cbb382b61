"""Decode one torch.profiler (Kineto) trace file into columns, with no Python object per event kept.

A 300 MB trace loaded with `json.loads` becomes several GB of dicts, and building them is most of the
time (on this project's machine: inflate 0.7 s, `orjson.loads` 5 s, a typed msgspec decode 0.7 s). Here
each event is decoded (msgspec) into a small typed `Event` whose `args` stay raw JSON; events become
columns, and only the events whose args the analysis reads (GPU work, its launches, ProfilerStep
ranges, CPU collective ops: `reads_args`) have their args decoded, in one batch per piece.

Kineto writes one event per block, `  {` ... `  },` at two spaces of indentation, and JSON strings cannot
hold a raw newline, so the event array is cut at `\\n  },\\n  {` into pieces that each decode as a JSON
array: the inflated text never exists whole, and each piece's events are dropped once they are columns.
A file laid out otherwise (up to MAX_WHOLE_BYTES of JSON), or a piece that does not decode, is decoded
whole instead, so the result never depends on the layout and damage is reported with the message a
whole-file decode gives. Files are read through `untrusted` (regular files only, bounded inflation).

The columns keep what `loading` and HTA (`hta_breakdown`) need, so one decode serves both.
"""
from __future__ import annotations

import contextlib
import gc
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from dstrace.analysis import parallel
from dstrace.analysis.parallel import release_freed_memory
from dstrace.runfolder import untrusted
from dstrace.trace_names import C10D_OP, GLOO_OP, GPU_CATEGORIES, LAUNCH_CATEGORIES, NCCL_HOST_RANGE

CHUNK_BYTES = 8 << 20
"""Bytes of JSON decoded at a time: their events as objects are small next to a rank's columns."""
MAX_UNCUT_BYTES = 64 << 20
"""More JSON than this without an event boundary: not Kineto's layout (or hostile), decoded whole instead."""
MAX_WHOLE_BYTES = 256 << 20
"""A file decoded whole is held whole, with an object per event: traces laid out otherwise stop here. Such a
file (one line of JSON) adds ~4.7x its JSON at the peak (bench/trace_layouts.py): ~1.4 GB here, extrapolated."""
MAX_EVENTS = 8_000_000
"""Events one trace may hold: memory grows with events more than with bytes (a million tiny events, 25 bytes
of JSON each, cost ~110 MB as columns and frames): 1.1 GB measured at this limit. Kineto's layout is counted as it is
read, before its events are decoded; a file decoded whole, once decoded (its size bounds it)."""
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


class Event(msgspec.Struct, gc=False):
    """One trace event as decoded: any JSON value where Kineto writes a string or number (kept as it is,
    as the columns keep it), `args` as raw JSON until an analysis needs it. Untracked by the garbage
    collector (JSON makes no cycles): a million tracked objects would make each collection walk them all."""
    ph: Any = None
    cat: Any = ""
    name: Any = ""
    pid: Any = None
    tid: Any = None
    ts: Any = None
    dur: Any = None
    args: msgspec.Raw = msgspec.Raw(b"null")


Args = msgspec.defstruct("Args", [(column, Any, None) for column, _ in ALL_ARGS],
                         rename={column: key for column, key in ALL_ARGS}, gc=False)
"""The args the columns keep; any others in an event's args are skipped unread."""
NO_ARGS = Args()
EVENTS = msgspec.json.Decoder(list[Event])
ARGS = msgspec.json.Decoder(list[Args | None])
TOP = msgspec.json.Decoder(dict[str, msgspec.Raw])
ANY = msgspec.json.Decoder()


def reads_args(cat, name) -> bool:
    """Whether an analysis reads this complete event's args: GPU work and the launches that link it to the
    host (correlation, stream, device, NCCL's sizes, HTA's columns), ProfilerStep ranges (HTA's external
    id) and the CPU ops that do collectives on CPU-only runs, or enqueue NCCL's (their sizes)."""
    if cat in GPU_CATEGORIES or cat in LAUNCH_CATEGORIES:
        return True
    return isinstance(name, str) and (name.startswith("ProfilerStep") or name == "record_param_comms"
                                      or GLOO_OP.match(name) is not None or C10D_OP.match(name) is not None
                                      or NCCL_HOST_RANGE.match(name) is not None)


@dataclass
class Columns:
    """A trace's complete ('X') events in file order, as arrays.

    `position` is the event's index in `traceEvents` (HTA's `index`); `has_dur` says whether it had a
    `dur`; coded columns are `codes[c]` into `tables[c]`; `args[c]` is sparse, (the rows that have the arg,
    their values), as most events lack most args (`arg` gives it dense); `present[c]` says whether any
    event had it.
    """
    position: np.ndarray
    ts: np.ndarray
    dur: np.ndarray
    has_dur: np.ndarray
    codes: dict[str, np.ndarray]
    tables: dict[str, list]
    args: dict[str, tuple[np.ndarray, np.ndarray]]
    present: dict[str, bool]
    ts_all_int: bool = True  # HTA rounds float timestamps and keeps integer ones as they are
    duplicate_keys: list[str] | None = None  # top-level keys given twice (None: not looked for, decoded whole)

    def __len__(self) -> int:
        return len(self.position)

    def per_row(self, name: str, test) -> np.ndarray:
        """`test(value)` for every row of a coded column, as booleans: run once per distinct value."""
        return np.array([test(v) for v in self.tables[name]] or [False], dtype=bool)[self.codes[name]]

    def arg(self, name: str, rows: np.ndarray | None = None) -> np.ndarray:
        """An arg column over every row, or over `rows` (ascending): float64 for NUMERIC_ARGS, NaN where
        absent (objects when the trace put something else there), else objects, None where absent."""
        where, values = self.args[name]
        n = len(self) if rows is None else len(rows)
        dense = np.full(n, np.nan) if values.dtype != object else np.empty(n, dtype=object)
        if rows is None:
            dense[where] = values
        elif len(rows):
            at = np.minimum(np.searchsorted(rows, where), len(rows) - 1)
            hit = rows[at] == where
            dense[at[hit]] = values[hit]
        return dense

    def values(self, name: str, rows=slice(None)) -> np.ndarray:
        """A coded column's values at `rows`, typed as `infer_objects` would type them: int64 when every value
        is an integer (pid, tid), looked up once per distinct value, else objects."""
        table = self.tables[name]
        if table and all(type(v) is int for v in table):
            return np.array(table, dtype=np.int64)[self.codes[name][rows]]
        lookup = np.empty(len(table), dtype=object)
        lookup[:] = table
        return pd.Series(lookup[self.codes[name][rows]], dtype=object).infer_objects().to_numpy()


CHECKS_KEY = "dstrace.checks"
"""Where `read_trace` puts what it found odd in the events (`event_checks`), in the metadata it returns (and the
kept reduction keeps): a key no profiler writes."""
OVERLAP_TOLERANCE_US = 1.0
"""Kineto's rounding lets a child outlive its parent by a fraction of a microsecond; an overlap past this is
not rounding."""


def event_checks(columns: Columns) -> dict[str, int]:
    """What a profiler does not write, counted: complete events with a negative duration, and host events that
    start inside the one before them on the same thread and end more than OVERLAP_TOLERANCE_US after it
    (overlapping without nesting; a thread's ranges nest). GPU work is left out: kernels of one stream may
    overlap (programmatic dependent launch, e.g. cuBLASLt's split-K reduce). The analysis takes the events as
    they are; these say where it should not be trusted."""
    n = len(columns)
    if n == 0:
        return {"negative_durations": 0, "overlaps": 0}
    host = ~columns.per_row("cat", lambda c: c in GPU_CATEGORIES or c == "gpu_user_annotation")
    order = np.flatnonzero(host)
    order = order[np.lexsort((-columns.dur[order], columns.ts[order], columns.codes["tid"][order],
                              columns.codes["pid"][order]))]
    pid, tid = columns.codes["pid"][order], columns.codes["tid"][order]
    ts, end = columns.ts[order], (columns.ts + np.maximum(columns.dur, 0))[order]
    same_track = (pid[1:] == pid[:-1]) & (tid[1:] == tid[:-1])
    overlaps = same_track & (ts[1:] < end[:-1]) & (end[1:] > end[:-1] + OVERLAP_TOLERANCE_US)
    return {"negative_durations": int((columns.dur < 0).sum()), "overlaps": int(overlaps.sum())}


def _duplicate_keys(text: bytes) -> list[str]:
    """The keys an object of this JSON gives twice (the decoders keep the last one silently), by path."""
    import json

    found: list[str] = []

    def pairs(items):
        keys = [k for k, _ in items]
        if len(keys) != len(set(keys)):
            found.extend(sorted({k for k in keys if keys.count(k) > 1}))
        # None: only the keys are wanted, and no object is kept

    with contextlib.suppress(ValueError, RecursionError):
        json.loads(text, object_pairs_hook=pairs)
    return found


EVENT_KEYS = ("ph", "cat", "name", "pid", "tid", "ts", "dur", "args", "id")
"""The keys looked for twice inside each event (`_event_keys_twice`): those the decoder reads, and a flow's `id`.
Any other key given twice is found too, in an event looked at key by key."""
ARRAY_AT = b'{"traceEvents": '
"""What the event array's last piece is put after, to decode it with the top-level keys that follow it."""
OPEN = ord("{")
MARK_BITS, MARKED = 0x41, 0x7B
"""`byte | MARK_BITS == MARKED` for `:` and `{` (and `;` and `z`): one comparison finds both."""
_SIGNS = np.array([0] + [int.from_bytes(b'"%s":' % k.encode(), "little") << 8 * (5 - len(k)) for k in EVENT_KEYS],
                  dtype=np.uint64)
"""Per key code (1, 2, ...): `"key":` as the 8 bytes up to the colon hold it, read little-endian (the colon the
top byte), masked by `_MASKS`."""
_MASKS = np.array([0] + [((1 << 8 * (len(k) + 3)) - 1) << 8 * (5 - len(k)) for k in EVENT_KEYS], dtype=np.uint64)
_EVENT_OPENERS = tuple((int.from_bytes(b, "little") << 8 * (8 - len(b)), ((1 << 8 * len(b)) - 1) << 8 * (8 - len(b)))
                       for b in (b",{", b"[{", b", {", b"[ {", b",\n{", b"[\n{", b"\n  {", b"\n    {"))
"""(bytes, mask) of what comes before a `{` that opens an event, as read like `_SIGNS`: right after the `,` or
`[` of the event array, or one space or newline after it, or Kineto's `\n  ` (`\n    ` where the array itself
is indented, as `json.dump(indent=2)` writes it)."""
_CODE_AT = np.zeros(1 << 16, dtype=np.intp)
"""Key code by a tail's bytes 3 and 4 read little-endian: the key's third- and second-last bytes (`"p` for ph, `ca`
for cat, `pi`, `ti`, `am`, ...: distinct for EVENT_KEYS)."""
_CODE_AT[[int.from_bytes(int(sign).to_bytes(8, "little")[3:5], "little") for sign in _SIGNS[1:]]] = \
    np.arange(1, len(EVENT_KEYS) + 1)
assert np.count_nonzero(_CODE_AT) == len(EVENT_KEYS), "two EVENT_KEYS share their bytes 3 and 4"
ARG_KEYS = tuple(key for _, key in ALL_ARGS)
"""The args keys the columns read, looked for twice as well (codes len(EVENT_KEYS) + 1, ...): an event that gives
one twice has its last value taken. Each is 5 characters or more, so the 8 bytes up to its colon are the key's own."""
_ARG_WORDS = np.array([(0, 0, 0)] * (len(EVENT_KEYS) + 1) + [
    (int.from_bytes(text[-8:], "little"), int.from_bytes(text[-16:-8], "little") << 8 * (16 - len(text[-16:])),
     ((1 << 8 * len(text[-16:-8])) - 1) << 8 * (16 - len(text[-16:])))
    for text in (b'"%s":' % key.encode() for key in ARG_KEYS)], dtype=np.uint64).T
_ARG_LOW, _ARG_HIGH, _ARG_HIGH_MASK = _ARG_WORDS
"""Per code: an args key's 8 bytes up to its colon (`_SIGNS`' reading), and the 8 before them with their mask (the
key's other bytes and its opening quote). 0 for EVENT_KEYS' codes: no tail is 0 (its top byte is a mark)."""
_ARG_AT = np.zeros(1 << 16, dtype=np.int8)
"""Args key code by a tail's bytes 1 and 2 (`_CODE_AT`'s way): the first key of ARG_KEYS with those bytes."""
_ARG_ALIKE: list[tuple[int, int, bool]] = []
"""(code in `_ARG_AT`, code of a later key with the same bytes 1 and 2, whether the two differ only before the
8 bytes up to the colon: `stream` and `wait_on_stream`, `In msg nelems` and `Out msg nelems`)."""
for _code in range(len(EVENT_KEYS) + 1, len(_ARG_LOW)):
    _at = int(_ARG_LOW[_code]) >> 8 & 0xFFFF
    if _ARG_AT[_at]:
        _ARG_ALIKE.append((int(_ARG_AT[_at]), _code, bool(_ARG_LOW[_ARG_AT[_at]] == _ARG_LOW[_code])))
    else:
        _ARG_AT[_at] = _code
assert len(_ARG_LOW) < 64, "the codes of EVENT_KEYS and ARG_KEYS are bits of an int64"


def _arg_codes(code: np.ndarray, tail: np.ndarray, tails: np.ndarray, at: np.ndarray) -> np.ndarray:
    """`code` with ARG_KEYS' codes where the marks end one: looked up by the tails' bytes 1 and 2 (`_ARG_AT`), kept
    where the 8 bytes match; the keys that share those 8 bytes told apart by the 8 before them."""
    arg = np.take(_ARG_AT, np.ndarray(shape=(len(tail),), dtype="<u2", buffer=tail, offset=1, strides=(8,)))
    rows = np.flatnonzero(arg)
    arg, low = arg[rows].astype(np.intp), tail[rows]
    for first, alike, same_low in _ARG_ALIKE:
        if not same_low:
            arg[(arg == first) & (low == _ARG_LOW[alike])] = alike
    ok = low == np.take(_ARG_LOW, arg)
    rows, arg = rows[ok], arg[ok]
    for first, alike, same_low in _ARG_ALIKE:
        if same_low:
            which = np.flatnonzero(arg == first)
            high = tails[np.maximum(at[rows[which]] - 15, 0)]  # an args key is never in a piece's first 15 bytes
            arg[which[high & _ARG_HIGH_MASK[alike] == _ARG_HIGH[alike]]] = alike
    code[rows] = arg
    return code


def _event_keys_twice(text, events: int, start: int = 0, end: int | None = None) -> list[str]:
    """The keys given twice in an object of `text[start:end]`, a piece of the event array with `events` events
    (`_duplicate_keys`), looked for only in the events where one of EVENT_KEYS or ARG_KEYS occurs twice.

    One numpy pass over the piece (no copy) finds each `:` and `{` and reads the 8 bytes up to each: the `{`
    that open events (`_EVENT_OPENERS`) cut the keys (`_SIGNS`, `_arg_codes`) into events, and an event whose sum of
    `1 << key code` differs from their bitwise or holds a code twice. Keys in args count as the event's: the
    events flagged (a metadata event's `args.name` flags it) are looked at key by key, together. Where the
    `{` found are not one per event (lists of objects in args, other whitespace), the piece is looked at
    whole if it holds more of one key than events: a key twice in a piece where some events lack it then
    passes unseen. What it costs next to the decode: bench/duplicate_keys.py."""
    end = len(text) if end is None else end
    a = np.frombuffer(text, dtype=np.uint8, count=end - start, offset=start)
    if len(a) < 16:
        return _duplicate_keys(a.tobytes())
    at = np.flatnonzero((a | MARK_BITS) == MARKED)  # each `:` and `{` (and `;`, `z`, which match no key)
    tails = np.ndarray(shape=(len(a) - 7,), dtype="<u8", buffer=a, strides=(1,))
    tail = tails[at - 7]  # the 8 bytes up to each mark
    early = int(np.searchsorted(at, 7))  # marks in the first 7 bytes (read from the end above): theirs, after zeros
    if early:
        head = np.zeros(15, dtype=np.uint8)
        head[7:] = a[:8]
        tail[:early] = np.ndarray(shape=(8,), dtype="<u8", buffer=head, strides=(1,))[at[:early]]
    opening = np.flatnonzero(tail.view(np.uint8)[7::8] == OPEN)
    heads = tail[opening]
    firsts = opening[np.logical_or.reduce([heads & np.uint64(m) == np.uint64(b) for b, m in _EVENT_OPENERS])]
    code = np.take(_CODE_AT, np.ndarray(shape=(len(tail),), dtype="<u2", buffer=tail, offset=3, strides=(8,)))
    code[tail & np.take(_MASKS, code) != np.take(_SIGNS, code)] = 0
    code = _arg_codes(code, tail, tails, at)
    if len(firsts) != events:
        counts = np.bincount(code, minlength=len(_SIGNS))[1:]
        return _duplicate_keys(a.tobytes()) if (counts > events).any() else []
    if not events:
        return []
    bits = np.left_shift(np.int64(1), code) & ~np.int64(1)
    twice = np.flatnonzero(np.add.reduceat(bits, firsts) != np.bitwise_or.reduceat(bits, firsts))
    if not len(twice):
        return []
    bounds = at[firsts].tolist() + [len(a)]
    return _duplicate_keys(b"[" + b",".join(a[bounds[i]:bounds[i + 1]].tobytes().rstrip(b" \t\r\n,]")
                                            for i in twice.tolist()) + b"]")


def _objects(values) -> np.ndarray:
    """A 1-d object array of the values (lists among them stay elements)."""
    return np.fromiter(values, dtype=object, count=len(values))


def _typed(column: str, values: np.ndarray) -> np.ndarray:
    """An arg's values (objects) as the column keeps them: float64 for a numeric arg whose values are all
    numbers, else as they are."""
    if column in NUMERIC_ARGS:
        try:
            return values.astype(np.float64)
        except (TypeError, ValueError):
            pass
    return values


class _Builder:
    """Columns grown one piece of the event array at a time; each piece's events are dropped once added.

    A piece keeps its positions and rows relative to itself, with its index `k` in the array: the pieces of
    a trace decoded in two processes (`read_trace(ways=2)`) are put in order and numbered when joined."""

    def __init__(self) -> None:
        self.pieces: list[dict] = []
        self.index: dict[str, dict] = {c: {} for c in CODED}
        self.wants_args: dict[str, list[bool]] = {"cat": [], "name": []}  # per table entry: `reads_args`
        self.present = {c: False for c, _ in ALL_ARGS}
        self.ts_all_int = True
        self.duplicate_keys: list[str] | None = None
        self.event_keys_twice: list[str] = []  # keys given twice inside the events (`_event_keys_twice`)

    def _code_of(self, column: str, value) -> int:
        """The value's code in the column's table: first seen, first coded."""
        table = self.index[column]
        code = table.get(value)
        if code is None:
            code = table[value] = len(table)
            flags = self.wants_args.get(column)
            if flags is not None:
                flags.append(reads_args(value, None) if column == "cat" else reads_args(None, value))
        return code

    def _codes(self, column: str, values: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """int32 codes of the values into the column's table, and for cat and name whether each value calls
        for the event's args."""
        local, uniques = pd.factorize(values)  # JSON null (None) is code -1: the last entry of `codes`
        codes = np.empty(len(uniques) + 1, dtype=np.int32)
        for i, value in enumerate(uniques):
            codes[i] = self._code_of(column, value)
        codes[-1] = self._code_of(column, None) if (local < 0).any() else -1
        coded = codes[local]
        flags = self.wants_args.get(column)
        return coded, None if flags is None else np.array(flags, dtype=bool)[coded]

    def add(self, events: list[Event], k: int = 0, keys_twice: list[str] = ()) -> None:
        """Add piece `k`, its complete events: one list comprehension per field, then numpy over the field's
        values (the cheapest way through a list of Structs: ~40 ns per event and field). `keys_twice`: the
        piece's keys given twice inside its events (`_event_keys_twice`)."""
        self.event_keys_twice += keys_twice
        if not events:
            return
        ts = _objects([e.ts for e in events])
        if self.ts_all_int:
            self.ts_all_int = set(map(type, ts)) <= {int, bool}
        keep = np.flatnonzero((_objects([e.ph for e in events]) == "X") & (ts != None))  # noqa: E711 (elementwise)
        n = len(keep)
        kept = [events[i] for i in keep.tolist()]
        ts = ts[keep]
        cat, name = _objects([e.cat for e in kept]), _objects([e.name for e in kept])
        pid, tid, durs = _objects([e.pid for e in kept]), _objects([e.tid for e in kept]), _objects([e.dur for e in kept])
        has_dur = durs != None  # noqa: E711
        try:
            dur = np.zeros(n)
            dur[has_dur] = durs[has_dur].astype(np.float64)
            piece = {"k": k, "events": len(events), "position": keep, "ts": ts.astype(np.float64), "dur": dur,
                     "has_dur": has_dur}
        except (TypeError, ValueError) as exc:
            raise ValueError(f"an event's ts or dur is not a number ({exc})") from None
        except OverflowError:
            raise ValueError("an event's ts or dur is an integer too large for any clock (over 10^308)") from None
        if not (np.isfinite(piece["ts"]).all() and np.isfinite(dur).all()):
            raise ValueError("an event's ts or dur is not a finite number")
        wants = np.zeros(n, dtype=bool)
        for c, values in zip(CODED, (name, cat, pid, tid)):
            try:
                piece[c], flags = self._codes(c, values)
            except TypeError:
                raise ValueError(f"an event's {c} is not a string or number") from None
            if flags is not None:
                wants |= flags
        rows = np.flatnonzero(wants)
        try:
            args = ARGS.decode(b"[" + b",".join([kept[i].args for i in rows.tolist()]) + b"]") if len(rows) else []
        except msgspec.ValidationError as exc:
            raise ValueError(f"an event's args is not an object ({exc})") from None
        del kept
        args = [NO_ARGS if a is None else a for a in args]
        for column, _ in ALL_ARGS:
            values = list(map(attrgetter(column), args))
            if values.count(None) == len(values):  # most args are in no event of a piece
                piece["arg:" + column] = (rows[:0], np.empty(0, dtype=object))
                continue
            values = _objects(values)
            has = np.flatnonzero(values != None)  # noqa: E711
            self.present[column] = True
            piece["arg:" + column] = (rows[has], values[has])  # sparse: most events lack most args
        self.pieces.append(piece)

    def share(self) -> tuple:
        """What another process's builder needs to take these pieces in (`absorb`): small next to the pieces."""
        return (self.pieces, {c: list(t) for c, t in self.index.items()}, self.present, self.ts_all_int,
                self.event_keys_twice)

    def absorb(self, shared: tuple) -> None:
        """Take in the pieces another process decoded (`share`), their codes recoded into these tables."""
        pieces, tables, present, ts_all_int, event_keys_twice = shared
        self.event_keys_twice += event_keys_twice
        for c in CODED:
            recode = np.array([self._code_of(c, v) for v in tables[c]] or [0], dtype=np.int32)
            for piece in pieces:
                piece[c] = recode[piece[c]]
        self.present = {c: self.present[c] or present[c] for c in self.present}
        self.ts_all_int = self.ts_all_int and ts_all_int
        self.pieces.extend(pieces)

    def finish(self) -> Columns:
        """Join the pieces in file order, column by column, dropping each column's pieces once joined: the
        columns are never held twice over."""
        self.pieces.sort(key=lambda p: p["k"])
        seen = np.cumsum([0] + [p["events"] for p in self.pieces])
        rows = np.cumsum([0] + [len(p["ts"]) for p in self.pieces])

        def cat(key: str, dtype, offsets=None) -> np.ndarray:
            parts = [p.pop(key) for p in self.pieces]
            if offsets is not None:
                parts = [part + offset for part, offset in zip(parts, offsets.tolist())]
            return np.concatenate(parts) if parts else np.empty(0, dtype=dtype)

        def arg(column: str) -> tuple[np.ndarray, np.ndarray]:
            parts = [p.pop("arg:" + column) for p in self.pieces]
            where = np.concatenate([r + o for (r, _), o in zip(parts, rows.tolist())]) if parts else np.empty(0, np.int64)
            values = np.concatenate([v for _, v in parts]) if parts else np.empty(0, dtype=object)
            return where, _typed(column, values)

        columns = Columns(
            position=cat("position", np.int64, seen), ts=cat("ts", np.float64), dur=cat("dur", np.float64),
            has_dur=cat("has_dur", bool), codes={c: cat(c, np.int32) for c in CODED},
            tables={c: list(t) for c, t in self.index.items()},
            args={c: arg(c) for c, _ in ALL_ARGS},
            present=dict(self.present), ts_all_int=self.ts_all_int,
            duplicate_keys=None if self.duplicate_keys is None and not self.event_keys_twice
            else (self.duplicate_keys or []) + self.event_keys_twice)
        self.pieces = []
        release_freed_memory()
        return columns


class _NotKineto(Exception):
    """The file is not laid out as Kineto writes it; decode it whole instead."""


def _top(text: bytes) -> dict[str, msgspec.Raw]:
    try:
        top = TOP.decode(text)
    except msgspec.ValidationError:
        raise ValueError("not a torch.profiler trace (no traceEvents list)") from None
    if "traceEvents" not in top:
        raise ValueError("not a torch.profiler trace (no traceEvents list)")
    return top


def _events(text) -> list[Event]:
    try:
        return EVENTS.decode(text)
    except msgspec.ValidationError as exc:
        raise ValueError(f"not a torch.profiler trace (traceEvents: {exc})") from None


def _meta(top: dict[str, msgspec.Raw]) -> dict:
    """The top-level keys but traceEvents, decoded."""
    return {k: ANY.decode(v) for k, v in top.items() if k != "traceEvents"}


def _too_many(events: int) -> untrusted.Refused:
    return untrusted.Refused(f"holds more than {MAX_EVENTS / 1e6:g} million events ({events / 1e6:.1f} million "
                             "counted so far), more than dstrace analyzes in one trace: record a shorter window "
                             "(dstrace record --window-steps)")


def _read_whole(path: str) -> tuple[dict, Columns]:
    text = bytearray()
    for piece in untrusted.json_chunks(path, CHUNK_BYTES, MAX_WHOLE_BYTES):
        text += piece
    top = _top(text)
    b = _Builder()
    events = _events(top["traceEvents"])
    if len(events) > MAX_EVENTS:
        raise _too_many(len(events))
    b.add(events, keys_twice=_event_keys_twice(top["traceEvents"], len(events)))
    del events
    meta = _meta(top)
    del top, text
    return meta, b.finish()


def _read_pieces(path: str, jobs: list[parallel.Job] = ()) -> tuple[dict, _Builder]:
    """Decode the event array piece by piece in one growing buffer: each piece runs from the `[` that opens
    it to the `,` after its last event, which is made a `]` for the decode and then the next piece's `[`.
    With helpers' `decode_pieces` jobs, of every len(jobs) + 1 pieces this process decodes one and sends each
    job one (its index in 8 bytes, then the piece)."""
    b = _Builder()
    chunks = untrusted.read_ahead(untrusted.json_chunks(path, CHUNK_BYTES))
    buf = bytearray(next(chunks, b""))
    key = buf.find(ARRAY_KEY)
    opener = buf.find(b"[", key) if key >= 0 else -1
    if opener < 0 or not buf.lstrip().startswith(b"{"):
        raise _NotKineto
    header = bytes(buf[:opener + 1])
    k = events = 0
    for more in chunks:
        buf += more
        cut = buf.rfind(EVENT_SEPARATOR, opener)
        if cut >= 0:
            close = cut + 4  # the "," after the piece's last "\n  }"
            events += buf.count(EVENT_SEPARATOR, opener, close + 6)  # one after each event of the piece
            if events > MAX_EVENTS:
                raise _too_many(events)
            buf[close] = ord("]")
            with memoryview(buf) as view:
                turn = k % (len(jobs) + 1)
                if turn:
                    jobs[turn - 1].send(k.to_bytes(8, "little") + view[opener:close + 1])
                else:
                    events_here = EVENTS.decode(view[opener:close + 1])
                    b.add(events_here, k, _event_keys_twice(buf, len(events_here), opener, close + 1))
                    del events_here
            buf[close] = ord("[")
            del buf[:close]
            opener = 0
            k += 1
        elif len(buf) - opener > MAX_UNCUT_BYTES:
            raise _NotKineto
    try:
        head = ANY.decode(header + b"]}")
        last = ARRAY_AT + buf[opener:]
        tail = TOP.decode(last)
        if not isinstance(head, dict) or "traceEvents" not in tail:
            raise _NotKineto
        events_here = EVENTS.decode(tail["traceEvents"])
    except msgspec.DecodeError:
        raise _NotKineto from None
    after = len(ARRAY_AT) + len(tail["traceEvents"])  # what follows the array: the other top-level keys
    b.add(events_here, k, _event_keys_twice(last, len(events_here), len(ARRAY_AT), after))
    del events_here
    twice = _duplicate_keys(header + b"]}") + _duplicate_keys(b'{"traceEvents": null' + last[after:])
    keys = list(head) + [key for key in tail if key != "traceEvents"]
    twice += sorted({key for key in keys if keys.count(key) > 1 and key != "traceEvents"})
    head.pop("traceEvents", None)
    head.update(_meta(tail))
    b.duplicate_keys = twice
    return head, b


def decode_pieces(pieces) -> tuple:
    """A helper's job (`parallel.Helper.submit(decode_pieces, stream=True)`): decode each piece sent, its index
    in 8 bytes and then the piece (`_read_pieces`), and answer with them as columns (`_Builder.share`)."""
    b = _Builder()
    with _no_collections():
        for message in pieces:
            with memoryview(message) as view:
                events = EVENTS.decode(view[8:])
                b.add(events, int.from_bytes(view[:8], "little"), _event_keys_twice(message, len(events), 8))
                del events
    return b.share()


def _read_split(path: str, helpers: list[parallel.Helper]) -> tuple[dict, Columns]:
    """The pieces decoded by this process and the helpers at once: this one inflates the file (in its own
    thread), decodes every (len(helpers) + 1)-th piece and sends the others to the helpers, then joins their
    columns to its own. Helpers that are gone or die leave the decode to this process alone."""
    jobs = [job for h in helpers if (job := h.submit(decode_pieces, stream=True)) is not None]
    head, b = _read_pieces(path, jobs)
    try:
        shared = [job.result() for job in jobs]
    except parallel.HelperGone:
        head, b = _read_pieces(path)
        shared = []
    for theirs in shared:
        b.absorb(theirs)
    return head, b.finish()


@contextlib.contextmanager
def _no_collections():
    """No garbage collection while a trace is decoded: its objects make no cycles, and each collection
    would walk every container alive."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def read_trace(path: str, ways: int = 1, helping: list[parallel.Helper] | None = None) -> tuple[dict, Columns]:
    """The trace's metadata (every top-level key but traceEvents) and its complete events as columns,
    decoded by `ways` processes, or by this one and the `helping` helpers (`parallel.helpers`). Any damage, or a file
    the limits refuse (`untrusted`), becomes a ValueError whose message says what is wrong with the file."""
    if helping is None:
        with parallel.helpers(ways - 1) as started:
            return read_trace(path, helping=started)
    with _no_collections():
        meta, columns = _read_trace(path, helping)
    meta[CHECKS_KEY] = {"duplicate_keys": columns.duplicate_keys or [], **event_checks(columns)}
    return meta, columns


def _read_trace(path: str, helping: list[parallel.Helper]) -> tuple[dict, Columns]:
    try:
        try:
            return _read_split(path, helping)
        except (_NotKineto, msgspec.DecodeError) as exc:
            problem = exc
        try:
            return _read_whole(path)
        except untrusted.TooLarge:
            if isinstance(problem, msgspec.DecodeError):
                raise ValueError(f"truncated or corrupt JSON ({problem})") from None
            raise ValueError(f"not laid out as torch.profiler writes traces and over {MAX_WHOLE_BYTES >> 20} MiB "
                             "of JSON, more than dstrace decodes whole") from None
    except msgspec.DecodeError as exc:
        raise ValueError(f"truncated or corrupt JSON ({exc})") from None
    except RecursionError:
        raise ValueError("corrupt JSON (nested too deeply for a trace)") from None
    except OSError as exc:
        raise ValueError(untrusted.unreadable(path, exc)) from None
