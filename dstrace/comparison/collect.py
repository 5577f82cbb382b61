"""Find the run folders behind the paths given to `dstrace compare`, group them by configuration, and
read each one (manifests, run record, analysis). The file reading of a comparison happens here.

A run folder holds `run.json`, `rank<N>.manifest.json`, or torch.profiler traces (`*.pt.trace.json[.gz]`:
plain traces are compared from what they show). Its configuration is the name of the folder
above it when its own name is `rep<k>` (the sweep layout `<sweep>/<config>/rep<k>/`), else its own name.
A folder that is not a run is searched two levels down, so a sweep folder, a configuration folder or
single run folders can be given. A sweep folder's `sweep.json` gives the configurations' order and the
default baseline.
"""
from __future__ import annotations

import os
import re
from collections.abc import Callable

from dstrace.analysis import load_and_analyze
from dstrace.comparison.facts import run_facts
from dstrace.comparison.model import RunFacts, RunRef
from dstrace.errors import UserError
from dstrace.runfolder.folder import MANIFEST, FolderRefused, RunFolder

REPEAT_DIR = re.compile(r"^rep\d+$")
SEARCH_DEPTH = 2


def _scan(path: str) -> RunFolder:
    try:
        return RunFolder.scan(path)
    except FolderRefused as exc:
        raise UserError(f"{exc}; give folders you can read") from None


def _ref(path: str) -> RunRef:
    name = os.path.basename(path)
    if REPEAT_DIR.match(name):
        return RunRef(config=os.path.basename(os.path.dirname(path)), repeat=name, path=path)
    return RunRef(config=name, repeat=name, path=path)


def _search(path: str, depth: int) -> list[str]:
    """The run folders at `path` or up to `depth` levels below (`RunFolder.is_run`), each folder listed once."""
    folder = _scan(path)
    if folder.is_run:
        return [path]
    if depth == 0:
        return []
    found = []
    for f in folder.files:
        if os.path.isdir(f.path):
            found.extend(_search(f.path, depth - 1))
    return found


def find_runs(paths: list[str]) -> list[RunRef]:
    refs: list[RunRef] = []
    for given in paths:
        path = os.path.abspath(given)
        if not os.path.isdir(path):
            raise UserError(f"{given} is not a folder; give run folders or a sweep folder")
        found = _search(path, SEARCH_DEPTH)
        if not found:
            raise UserError(f"no recorded run in {given}: expected run.json, rank<N>.manifest.json or "
                            f"*.pt.trace.json[.gz] in it, or in folders up to {SEARCH_DEPTH} levels below")
        refs.extend(_ref(p) for p in found)
    seen: set[str] = set()
    unique = []
    for ref in refs:
        if ref.path not in seen:
            seen.add(ref.path)
            unique.append(ref)
    return unique


def sweep_record(paths: list[str]):
    """The sweep record (`sweep.read_sweep_record`) of the one sweep folder given, if there is exactly one."""
    from dstrace.comparison.sweep import SWEEP_FILE, read_sweep_record

    records = [read_sweep_record(os.path.join(given, SWEEP_FILE)) for given in paths
               if os.path.lexists(os.path.join(given, SWEEP_FILE))]
    return records[0] if len(records) == 1 else None


def _quiet(message: str) -> None:
    pass


def read_facts(ref: RunRef, progress: Callable[[str], None] = _quiet) -> RunFacts:
    """Manifests, run record and analysis of one run folder. A run that cannot be analyzed (no trace:
    DeepSpeed refused before the profiling window) is described by its manifests alone; plain traces
    without manifests by their analysis alone."""
    warnings: list[str] = []
    folder = _scan(ref.path)  # listed and its manifests read once, for the facts and the analysis alike
    records = folder.records
    for f, problem in sorted(records.skipped, key=lambda skip: skip[0].kind != MANIFEST):  # manifests first
        warnings.append(f"{ref.config}/{ref.repeat}: skipped {f.name}: {problem}")
    manifests, record = records.manifests, records.run
    analysis = None
    if manifests or folder.traces:
        progress(f"analyzing {ref.config}/{ref.repeat}")
        try:
            analysis = load_and_analyze(folder, progress=_quiet)
        except UserError as exc:
            warnings.append(f"{ref.config}/{ref.repeat}: not analyzed: {exc}")
    return run_facts(ref, manifests, record, analysis, warnings)
