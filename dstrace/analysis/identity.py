"""What identifies a file's content and the code that read it, for the caches that stand in for a parse
(`cache`) or a whole report (`report_cache`). Standard library only: a report-cache hit imports nothing more.
"""
from __future__ import annotations

import hashlib
import os
from functools import lru_cache
from importlib import metadata

EDGE_BYTES = 1 << 20
PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@lru_cache(maxsize=1)
def code() -> str:
    """A hash of dstrace's own source: any change to the code that made a cached result makes it stale,
    also in a development checkout whose version number does not move."""
    h = hashlib.sha256()
    for folder, dirs, files in sorted(os.walk(PACKAGE)):
        dirs.sort()
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                h.update(os.path.relpath(path, PACKAGE).encode())
                with open(path, "rb") as f:
                    h.update(f.read())
    return h.hexdigest()


@lru_cache(maxsize=1)
def versions() -> dict:
    """dstrace's version and code, and the versions of the libraries whose results get cached: looked up
    once per process, not for each trace's cache (callers read it, never change it)."""
    def version(dist: str) -> str | None:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None
    return {"dstrace": version("dstrace"), "code": code(), "hta": version("holistictraceanalysis"),
            "pandas": version("pandas")}


def content(path: str) -> dict:
    """Size, mtime and a hash of the first and last MiB: a rewrite in place that keeps size and mtime still
    changes those bytes for any real trace."""
    st = os.stat(path)
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read(EDGE_BYTES))
        if st.st_size > EDGE_BYTES:
            f.seek(max(EDGE_BYTES, st.st_size - EDGE_BYTES))
            h.update(f.read(EDGE_BYTES))
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "edges_sha256": h.hexdigest()}
