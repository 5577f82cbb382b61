"""The last report of a folder, kept so that asking again for the same report costs no analysis at all.

`dstrace analyze` keeps each rank's reduction beside its trace (`kept`); with those in place what a
second analysis still spends is mostly starting pandas. When nothing it reads has changed (every file
of the folder by name and a hash of its whole content, the options, dstrace's own code and the versions
of HTA and pandas), the report it would write is the one it wrote: `.dstrace-report.<format>.cache`
beside the traces holds that report and its warnings, sealed (`identity.seal`) so that a report file
dstrace did not write for this user is never shown. This module uses the standard library and xxhash
only, so that a hit never imports pandas.

A missing, damaged, forged or stale file is a miss, never an error; a folder that refuses the file is
analyzed all the same. The name matches no trace pattern, and the key leaves out what analysis derives
(kept reports, kept reductions of traces in the folder) and temporary files, by their exact names: any
other file counts, whatever its name holds.
"""
from __future__ import annotations

import hashlib
import json
import os

from dstrace.analysis import identity
from dstrace.runfolder import untrusted
from dstrace.runfolder.folder import FolderRefused, RunFolder
from dstrace.runfolder.names import REPORT_CACHE_PREFIX
from dstrace.runfolder.records import write_json_atomic
from dstrace.say import say

PREFIX = REPORT_CACHE_PREFIX
SUFFIX = ".cache"
MAX_REPORT_BYTES = 256 << 20
"""A kept report larger than this is not one dstrace wrote."""


def key(folder: RunFolder, options: dict) -> str | None:
    """What the report of the run folder under `options` depends on, hashed (each file's `content`, which the
    analysis then reuses); None when a file cannot be read (or is not a file where a file is expected: the
    analysis then says what)."""
    try:
        files = {f.name: f.content for f in folder.run_files}
    except (OSError, untrusted.Refused):
        return None
    payload = {"dir": folder.path, "files": files, "options": options,
               "versions": identity.versions()}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def path(run_dir: str, fmt: str) -> str:
    return os.path.join(run_dir, f"{PREFIX}{fmt}{SUFFIX}")


def read(run_dir: str, fmt: str, wanted: str) -> tuple[str, list[str]] | None:
    """(report, warnings) kept under key `wanted`, or None."""
    try:
        kept = json.loads(untrusted.read_bytes(path(run_dir, fmt), MAX_REPORT_BYTES))
        report, warnings = kept["report"], kept["warnings"]
        if kept["key"] != wanted or not isinstance(report, str) or not isinstance(warnings, list):
            return None
        if not identity.sealed(_body(wanted, report, warnings), bytes.fromhex(kept["seal"])):
            return None
        return report, [str(w) for w in warnings]
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None


def _body(wanted: str, report: str, warnings: list) -> bytes:
    return json.dumps([wanted, report, warnings]).encode()


def write(run_dir: str, fmt: str, wanted: str, report: str, warnings: list[str]) -> None:
    """Keep the report, atomically; a folder that refuses it only costs the next analysis its speed."""
    try:
        write_json_atomic(path(run_dir, fmt), {"key": wanted, "report": report, "warnings": warnings,
                                                 "seal": identity.seal(_body(wanted, report, warnings)).hex()})
    except OSError:
        pass


def report_of(run_dir: str, fmt: str, clock_policy: str = "auto", workers: int | None = None,
              screen=None) -> tuple[str, list[str]]:
    """The rendered report and its warnings: the one kept beside the traces when nothing in the folder, the
    options or dstrace changed since, else a new analysis (then kept)."""
    options = {"format": fmt, "align_clocks": clock_policy}
    if fmt == "text" and screen is not None:
        options |= screen.options()
    elif fmt in ("markdown", "html") and screen is not None:
        options["verbose"] = screen.verbose  # the whole legend or the terms used
    try:  # listed once: the report's key and the analysis read the same listing, each file hashed once
        folder = RunFolder.scan(run_dir)
    except FolderRefused:
        folder = None  # the analysis says what is wrong
    single = os.path.isfile(run_dir)  # one trace file: its reduction is kept beside it, no report is
    wanted = None if single or folder is None else key(folder, options)
    kept = read(run_dir, fmt, wanted) if wanted else None
    if kept is not None:
        say(f"nothing in the folder changed since the last analysis: its report, from {path(run_dir, fmt)}")
        return kept
    from dstrace.analysis import load_and_analyze
    from dstrace.analysis.render import render  # pandas: only when there is no kept report to print

    analysis = load_and_analyze(folder or run_dir, clock_policy=clock_policy, workers=workers)
    report, warnings = render(analysis, fmt, screen), list(analysis.warnings)
    if wanted:
        write(run_dir, fmt, wanted, report, warnings)
    return report, warnings
