"""The parsed form of a trace, kept beside it so that analyzing the folder again skips the parse.

`.<trace file name>.dstrace-cache.npz` holds the rank's events frame column by column (numbers as
they are, strings and other values as int32 codes into a table of distinct values), the trace's
metadata and the HTA breakdowns computed from it. It is an uncompressed NumPy archive read with
`allow_pickle=False`: a cache file that came with someone else's folder can hold data, never code.

A cache is used only when it matches the trace: same size, same modification time, same hash of the
first and last MiB (a rewrite in place that keeps size and mtime still changes those bytes for any
real trace), and the same cache format, dstrace and HTA versions. Anything else (a missing, stale,
damaged or foreign file) reads as no cache, and the trace is parsed again. Files are written under a
temporary name and renamed, so a reader never sees half a cache; the name matches none of the trace
patterns (`*.pt.trace.json[.gz]`, `*.json[.gz]`).
"""
from __future__ import annotations

import hashlib
import json
import os
from importlib import metadata

import numpy as np
import orjson
import pandas as pd

FORMAT = 1
"""Bump when the parse, the events frame or the cached HTA results change meaning."""
SUFFIX = ".dstrace-cache.npz"
EDGE_BYTES = 1 << 20


def cache_path(trace_path: str) -> str:
    folder, name = os.path.split(trace_path)
    return os.path.join(folder, f".{name}{SUFFIX}")


def _versions() -> dict:
    def version(dist: str) -> str | None:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None
    return {"format": FORMAT, "dstrace": version("dstrace"), "hta": version("holistictraceanalysis")}


def fingerprint(trace_path: str) -> dict:
    """What identifies the trace's content: size, mtime, and a hash of its first and last MiB."""
    st = os.stat(trace_path)
    h = hashlib.sha256()
    with open(trace_path, "rb") as f:
        h.update(f.read(EDGE_BYTES))
        if st.st_size > EDGE_BYTES:
            f.seek(max(EDGE_BYTES, st.st_size - EDGE_BYTES))
            h.update(f.read(EDGE_BYTES))
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "edges_sha256": h.hexdigest(), **_versions()}


def _encode(series: pd.Series) -> tuple[str, dict[str, np.ndarray]]:
    """(kind, arrays) for one column: "num" as is, "str" codes + text table, "json" codes + JSON texts."""
    if series.dtype.kind in "biuf":
        return "num", {"values": series.to_numpy()}
    values = series.to_numpy(dtype=object)
    missing = pd.isna(values) if values.dtype == object else np.zeros(len(values), dtype=bool)
    present = values[~missing]
    if all(isinstance(v, str) for v in present):
        codes, uniques = pd.factorize(values, use_na_sentinel=True)
        return "str", {"codes": codes.astype(np.int32), "table": np.asarray(uniques, dtype=str)}
    texts = np.full(len(values), None, dtype=object)
    texts[~missing] = [orjson.dumps(v).decode() for v in present]
    codes, uniques = pd.factorize(texts, use_na_sentinel=True)
    return "json", {"codes": codes.astype(np.int32), "table": np.asarray(uniques, dtype=str)}


def _decode(kind: str, arrays: dict[str, np.ndarray], dtype: str) -> pd.Series:
    if kind == "num":
        return pd.Series(arrays["values"])
    codes, table = arrays["codes"], arrays["table"]
    if kind == "str":
        lookup = np.empty(len(table) + 1, dtype=object)
        lookup[:-1] = table.tolist()
        lookup[-1] = np.nan
        return pd.Series(lookup[codes], dtype=dtype)
    lookup = np.empty(len(table) + 1, dtype=object)
    lookup[:-1] = [orjson.loads(t) for t in table.tolist()]
    lookup[-1] = None
    return pd.Series(lookup[codes], dtype=object)


def write(target: str, print_: dict, events: pd.DataFrame, trace_meta: dict, hta: dict | None) -> None:
    """Write a cache to `target`, atomically; `print_` is the trace's `fingerprint` taken before it was
    parsed, so a trace that changed meanwhile leaves a stale cache. Raises OSError when the folder refuses."""
    arrays: dict[str, np.ndarray] = {}
    columns = []
    for i, col in enumerate(events.columns):
        kind, parts = _encode(events[col])
        columns.append([col, kind, str(events[col].dtype)])
        arrays.update({f"{i}.{k}": v for k, v in parts.items()})
    head = {"fingerprint": print_, "rows": len(events), "columns": columns,
            "trace_meta": trace_meta, "hta": hta}
    arrays["head"] = np.frombuffer(json.dumps(head).encode(), dtype=np.uint8)
    tmp = f"{target}.{os.getpid()}.tmp"
    try:
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def read(trace_path: str, source: str | None = None) -> tuple[pd.DataFrame, dict, dict | None] | None:
    """(events, trace metadata, HTA results) from the cache of `trace_path`, or None when there is no
    usable cache for the trace as it is now. Never raises for a bad cache file."""
    source = source or cache_path(trace_path)
    try:
        with np.load(source, allow_pickle=False) as z:
            head = json.loads(z["head"].tobytes())
            if head["fingerprint"] != fingerprint(trace_path):
                return None
            data = {}
            for i, (col, kind, dtype) in enumerate(head["columns"]):
                arrays = {k.split(".", 1)[1]: z[k] for k in z.files if k.split(".", 1)[0] == str(i)}
                series = _decode(kind, arrays, dtype)
                if len(series) != head["rows"]:
                    return None
                data[col] = series
            events = pd.DataFrame(data)
            return events, head["trace_meta"], head["hta"]
    except Exception:  # a damaged or foreign cache is no cache: the trace is parsed again
        return None

