"""The last report of a folder, kept so that asking again for the same report costs no analysis at all.

`dstrace analyze` keeps each rank's parse and reduction beside its trace (`cache`); with those in place
what a second analysis still spends is mostly starting pandas. When nothing it reads has changed (every
file of the folder by name, size, modification time and first and last MiB, the options, dstrace's own
code and the versions of HTA and pandas), the report it would write is the one
it wrote: `.dstrace-report.<format>.cache` beside the traces holds that report and its warnings. This
module uses the standard library only, so that a hit never imports pandas.

A missing, damaged or stale file is a miss, never an error; a folder that refuses the file is
analyzed all the same. The name matches no trace pattern, and the key ignores dstrace's own caches.
"""
from __future__ import annotations

import hashlib
import json
import os

from dstrace.analysis import identity
from dstrace.runfolder.names import PARSE_CACHE_SUFFIX, REPORT_CACHE_PREFIX
from dstrace.runfolder.records import write_json_atomic

PREFIX = REPORT_CACHE_PREFIX
SUFFIX = ".cache"

"""The parse caches' suffix (`cache.SUFFIX`), here so that the key, which ignores them, needs no pandas."""


def _own(name: str) -> bool:
    return (name.startswith(PREFIX) or name.endswith(PARSE_CACHE_SUFFIX) or ".tmp" in name)


def key(trace_dir: str, options: dict) -> str | None:
    """What the report of `trace_dir` under `options` depends on, hashed; None when the folder cannot be read."""
    try:
        files = {e.name: identity.content(e.path) for e in os.scandir(trace_dir) if not _own(e.name) and e.is_file()}
    except OSError:
        return None
    payload = {"dir": os.path.abspath(trace_dir), "files": files, "options": options,
               "versions": identity.versions()}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def path(trace_dir: str, fmt: str) -> str:
    return os.path.join(trace_dir, f"{PREFIX}{fmt}{SUFFIX}")


def read(trace_dir: str, fmt: str, wanted: str) -> tuple[str, list[str]] | None:
    """(report, warnings) kept under key `wanted`, or None."""
    try:
        with open(path(trace_dir, fmt), encoding="utf-8") as f:
            kept = json.load(f)
        if kept["key"] != wanted or not isinstance(kept["report"], str):
            return None
        return kept["report"], [str(w) for w in kept["warnings"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write(trace_dir: str, fmt: str, wanted: str, report: str, warnings: list[str]) -> None:
    """Keep the report, atomically; a folder that refuses it only costs the next analysis its speed."""
    try:
        write_json_atomic(path(trace_dir, fmt), {"key": wanted, "report": report, "warnings": warnings})
    except OSError:
        pass
