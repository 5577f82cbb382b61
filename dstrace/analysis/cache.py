"""The reduction of a trace, kept beside it so that analyzing the folder again skips the decode.

`.<trace file name>.dstrace-cache.npz` holds the rank's reduction (`reduction.RankReduction`: what the
analysis reads, HTA's breakdowns included), frames column by column (numbers as they are, strings and
other values as int32 codes into a table of distinct values), and the trace's metadata. The timeline
(`dstrace view`), which needs every event, decodes the trace itself. An uncompressed NumPy archive, read
with `allow_pickle=False`, after a seal of the whole file (`identity.seal`) and behind it.

A cache can never change an answer. It is used only when its seal shows that dstrace wrote it for this
user (a cache that came with someone else's folder, or was edited, is no cache) and its fingerprint
matches: the hash of the whole trace as it is now, the cache format, the dstrace code (a hash of its
source) and HTA and pandas versions, and the world size from the folder's manifests (CPU collectives'
byte counts may depend on it). Anything else (a missing, stale, damaged, foreign or oversized file)
reads as no cache, and the trace is decoded again. Files are written under a temporary name and
renamed, so a reader never sees half a cache; the name matches none of the trace patterns
(`*.pt.trace.json[.gz]`, `*.json[.gz]`).
"""
from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass

import numpy as np
import msgspec
import pandas as pd

from dstrace.analysis import identity
from dstrace.runfolder import untrusted
from dstrace.runfolder.files import atomic_file
from dstrace.analysis.reduction import RankReduction
from dstrace.runfolder.names import PARSE_CACHE_SUFFIX

FORMAT = 6
"""Bump when the decode, the reduction or the cached HTA results change meaning."""
SUFFIX = PARSE_CACHE_SUFFIX
MAGIC = b"dstrace-cache/4\n"
MAX_CACHE_BYTES = 1 << 30
"""A reduction is kilobytes to megabytes; a larger file is not one dstrace wrote, and is not read."""


@dataclass
class Cached:
    meta: dict  # the trace's top-level metadata (everything but its events)
    reduced: RankReduction


def cache_path(trace_path: str) -> str:
    folder, name = os.path.split(trace_path)
    return os.path.join(folder, f".{name}{SUFFIX}")


def fingerprint(trace_path: str) -> dict:
    """What a cache must match: the trace's content, the cache format, and the code and libraries that made it."""
    return {**identity.content(trace_path), "format": FORMAT, **identity.versions()}


def _encode(series: pd.Series) -> tuple[str, dict[str, np.ndarray]]:
    """(kind, arrays) for one column: "num" as is, "str" codes + text table, "json" codes + JSON texts."""
    if series.dtype.kind in "biuf":
        return "num", {"values": series.to_numpy()}
    values = series.to_numpy(dtype=object)
    missing = pd.isna(values) if values.dtype == object else np.zeros(len(values), dtype=bool)
    present = values[~missing]
    if all(isinstance(v, str) for v in present):
        codes, uniques = _factorize(values, missing)
        return "str", {"codes": codes, "table": np.asarray(uniques, dtype=str)}
    texts = np.full(len(values), None, dtype=object)
    texts[~missing] = [msgspec.json.encode(v).decode() for v in present]
    codes, uniques = _factorize(texts, missing)
    return "json", {"codes": codes, "table": np.asarray(uniques, dtype=str)}


def _factorize(values: np.ndarray, missing: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """`pd.factorize` of texts (codes in order of first appearance, -1 for a gap) through a dict, which uses
    each text's cached hash: pandas hashes every row's text anew, 30 ms for a 10,000-rank group's
    "[0, 1, ...]" named by 120 calls."""
    index: dict[str, int] = {}
    codes = np.fromiter((-1 if gap else index.setdefault(v, len(index)) for v, gap in zip(values, missing)),
                        dtype=np.int32, count=len(values))
    return codes, list(index)


def _raw(kind: str, arrays: dict[str, np.ndarray], texts: dict | None = None) -> np.ndarray:
    """One stored column as a numpy array: numbers as they are, texts and other values as objects. `texts`,
    when given, makes equal texts of many ranks one object (a 10,000-rank group's "[0, 1, ...]" is 59 KB)."""
    if kind == "num":
        return arrays["values"]
    codes, table = arrays["codes"], arrays["table"]
    lookup = np.empty(len(table) + 1, dtype=object)
    if kind == "str":
        values = table.tolist()
        lookup[:-1] = values if texts is None else [texts.setdefault(t, t) for t in values]
        lookup[-1] = np.nan
    else:
        lookup[:-1] = [msgspec.json.decode(t) for t in table.tolist()]
        lookup[-1] = None
    return lookup[codes]


def _typed(kind: str, values: np.ndarray, dtype: str):
    """A `_raw` column as the frame holds it: texts in `dtype` (pandas' string array), the rest as they are."""
    if kind == "str" and dtype not in ("object", "O"):
        return pd.array(values, dtype=dtype)
    return values


def _decode(kind: str, arrays: dict[str, np.ndarray], dtype: str):
    """One column as an array of `dtype`: a frame is built from arrays at once, without aligning a Series
    per column (most of a summary's read time at thousands of ranks)."""
    return _typed(kind, _raw(kind, arrays), dtype)


FRAMES = ("collectives", "steps", "gathers")
"""The reduction's frames, stored column by column; its dicts go in the head."""


def _put_frame(arrays: dict[str, np.ndarray], prefix: str, df: pd.DataFrame) -> dict:
    columns = []
    for i, col in enumerate(df.columns):
        kind, parts = _encode(df[col])
        columns.append([col, kind, str(df[col].dtype)])
        arrays.update({f"{prefix}{i}.{k}": v for k, v in parts.items()})
    return {"rows": len(df), "columns": columns}


def _get_frame(z, prefix: str, spec: dict) -> pd.DataFrame | None:
    """The frame stored under `prefix`, or None when a column is missing or of the wrong length."""
    data = {}
    for i, (col, kind, dtype) in enumerate(spec["columns"]):
        head = f"{prefix}{i}."
        arrays = {k[len(head):]: z[k] for k in z if k.startswith(head)}
        column = _decode(kind, arrays, dtype)
        if len(column) != spec["rows"]:
            return None
        data[col] = column
    return pd.DataFrame(data, columns=[c for c, _, _ in spec["columns"]])


def _columns(z, prefix: str, spec: dict, texts: dict | None = None) -> list[np.ndarray] | None:
    """The `_raw` columns stored under `prefix`, or None when one is missing or of the wrong length."""
    out = []
    for i, (_, kind, _) in enumerate(spec["columns"]):
        head = f"{prefix}{i}."
        column = _raw(kind, {k[len(head):]: z[k] for k in z if k.startswith(head)}, texts)
        if len(column) != spec["rows"]:
            return None
        out.append(column)
    return out


def columns_of(arrays, head: dict, texts: dict) -> dict[str, list[np.ndarray]] | None:
    """A reduction's frames as `_raw` columns, for `unpack_many` (None when a frame is incomplete): taken
    rank by rank as each is read, so the stored arrays of only one rank are held at a time."""
    columns = {name: _columns(arrays, f"r.{name}.", head["frames"][name], texts) for name in FRAMES}
    return None if any(c is None for c in columns.values()) else columns


def unpack_many(items: list[tuple[dict[str, list[np.ndarray]] | None, dict]]) -> list[RankReduction | None]:
    """What `unpack` gives for each (`columns_of`, head), for many ranks at once: each frame is one table over
    all ranks of the same column layout, and a rank's frame is its slice of that table (a view, indexed from
    0). Building a frame costs about a millisecond whatever its rows, so one per rank and frame was most of
    the read at thousands of ranks. Each rank's columns are consumed (set to None) once in their table."""
    whole = [i for i, (c, _) in enumerate(items) if c is not None]
    frames: dict[int, dict[str, pd.DataFrame]] = {i: {} for i in whole}
    for name in FRAMES:
        layouts: dict[tuple, list[int]] = {}
        for i in whole:
            layouts.setdefault(tuple(map(tuple, items[i][1]["frames"][name]["columns"])), []).append(i)
        for layout, ranks in layouts.items():
            table = pd.DataFrame(
                {col: _typed(kind, np.concatenate([items[i][0][name][j] for i in ranks]), dtype)
                 for j, (col, kind, dtype) in enumerate(layout)}, columns=[c for c, _, _ in layout])
            for i in ranks:
                items[i][0][name] = None  # consumed: a rank's columns are not held beside the table
            starts = np.cumsum([0] + [items[i][1]["frames"][name]["rows"] for i in ranks])
            for i, a, b in zip(ranks, starts[:-1], starts[1:]):
                part = table.iloc[a:b]
                part.index = pd.RangeIndex(b - a)
                frames[i][name] = part
    return [_reduction(frames[i], items[i][1]["reduced"]) if i in frames else None for i in range(len(items))]


def _reduction(frames: dict[str, pd.DataFrame], rest: dict) -> RankReduction | None:
    try:
        return RankReduction(**frames, **rest)
    except TypeError:  # a head naming fields a reduction has not
        return None


def pack(reduced: RankReduction) -> tuple[dict[str, np.ndarray], dict]:
    """A reduction as arrays (its frames, column by column) and a JSON-able head (the frames' layout, its dicts):
    the form of both the cache and the rank summaries (`summaries`)."""
    arrays: dict[str, np.ndarray] = {}
    frames = {name: _put_frame(arrays, f"r.{name}.", getattr(reduced, name)) for name in FRAMES}
    return arrays, {"frames": frames, "reduced": {k: v for k, v in reduced.plain().items() if k not in FRAMES}}


def unpack(arrays, head: dict) -> RankReduction | None:
    """The reduction `pack` gave (arrays: any mapping of name to array), or None when a frame is incomplete."""
    frames = {name: _get_frame(arrays, f"r.{name}.", head["frames"][name]) for name in FRAMES}
    if any(f is None for f in frames.values()):
        return None
    return RankReduction(**frames, **head["reduced"])


def write(target: str, print_: dict, trace_meta: dict, reduced: RankReduction, world_hint: int) -> None:
    """Write a sealed cache to `target`, atomically; `print_` is the trace's `fingerprint` taken before it was
    decoded, so a trace that changed meanwhile leaves a stale cache; `world_hint` the world size the
    folder's manifests gave the reduction. Raises OSError when the folder refuses."""
    arrays, head = pack(reduced)
    head.update(fingerprint=print_, world_hint=world_hint, trace_meta=trace_meta)
    arrays["head"] = np.frombuffer(json.dumps(head).encode(), dtype=np.uint8)
    archive = io.BytesIO()
    np.savez(archive, **arrays)
    payload = archive.getvalue()
    with atomic_file(target, "wb") as f:
        f.write(MAGIC + identity.seal(payload) + payload)


def read(trace_path: str, world_hint: int, source: str | None = None) -> Cached | None:
    """The cached reduction of `trace_path`, or None when there is no cache that dstrace sealed for the trace
    as it is now and this world size hint. Never raises for a bad cache file."""
    source = source or cache_path(trace_path)
    try:
        data = untrusted.read_bytes(source, MAX_CACHE_BYTES)
        start = len(MAGIC) + identity.SEAL_BYTES
        if not data.startswith(MAGIC) or not identity.sealed(data[start:], data[len(MAGIC):start]):
            return None
        with np.load(io.BytesIO(data[start:]), allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        head = json.loads(arrays.pop("head").tobytes())
        if head["fingerprint"] != fingerprint(trace_path) or head["world_hint"] != world_hint:
            return None
        reduced = unpack(arrays, head)
        return None if reduced is None else Cached(meta=head["trace_meta"], reduced=reduced)
    except Exception:  # a damaged, foreign or unreadable cache is no cache: the trace is decoded again
        return None
