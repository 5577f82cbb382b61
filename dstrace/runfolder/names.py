"""Every name in a run folder, and the one way to read a rank from a file name.

    <host>_rank<N>.<ms>.pt.trace.json.gz   the rank's torch.profiler trace (HTA and TensorBoard read it)
    rank<N>.manifest.json                   the rank's manifest (records.Manifest)
    <trace stem>.reduction.arrow            the rank's reduction, kept beside its trace (or alone)
    run.json                                the run record (records.RunRecord), by `dstrace record`
    nodes/<node>.json                       node records of a run recorded node by node
    deepspeed_env                           the variables DeepSpeed's runner forwards to other nodes
    unrecorded.<host>.<pid>.json            a rank whose interpreter could not run the recording code
    .dstrace-report.<format>.cache          the last report of each format, kept by analyze
    dstrace-report.html, dstrace-merged.pftrace   what `dstrace view` writes by default
"""
from __future__ import annotations

import os
import re

TRACE_SUFFIXES = (".pt.trace.json.gz", ".pt.trace.json")
MANIFEST_SUFFIX = ".manifest.json"
REDUCTION_SUFFIX = ".reduction.arrow"
RUN_FILE = "run.json"
TRACE_STEM_SUFFIXES = TRACE_SUFFIXES + (".json.gz", ".json")
"""What `reduction_name` takes off a trace's name: dstrace's and any other tool's."""
NODES_DIR = "nodes"
DEEPSPEED_ENV_FILE = "deepspeed_env"
# The bootstrap's sitecustomize writes these and cannot import dstrace to share the name.
UNRECORDED_PREFIX = "unrecorded."
REPORT_CACHE_PREFIX = ".dstrace-report."
REPORT_NAME = "dstrace-report.html"
MERGED_NAME = "dstrace-merged.pftrace"

# What `dstrace record --force` clears: every file dstrace writes into a run folder.
WRITTEN_SUFFIXES = TRACE_SUFFIXES + (MANIFEST_SUFFIX, REDUCTION_SUFFIX, ".pftrace")
WRITTEN_PREFIXES = (UNRECORDED_PREFIX, REPORT_CACHE_PREFIX)
WRITTEN_NAMES = (RUN_FILE, DEEPSPEED_ENV_FILE, REPORT_NAME)

# What analyze and view derive from a run (kept reports, the report and merged trace they write), and the
# temporary names `files.atomic_file` writes any file under: none of it is the run itself. A kept reduction
# is derived from its trace when that is there (`trace_names_of`), and is the rank when it is not.
_DERIVED = re.compile(r"^(?:" + re.escape(REPORT_CACHE_PREFIX) + r"[a-z]+\.cache|" + re.escape(REPORT_NAME) + "|"
                      + re.escape(MERGED_NAME) + r"|\..+\.tmp)$")
_DSTRACE_RANK = re.compile(r"_rank(\d+)\.")
_ANY_RANK = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9._-]")


def manifest_path(run_dir: str, rank: int) -> str:
    return os.path.join(run_dir, f"rank{rank}{MANIFEST_SUFFIX}")


def node_record_path(run_dir: str, node: str) -> str:
    return os.path.join(run_dir, NODES_DIR, f"{node}.json")


def rank_in_name(name: str) -> int | None:
    """The rank a trace's file name gives: dstrace's `<host>_rank<N>.` (the last one, a host name may hold
    "rank" too), else the first `rank<N>` / `rank_<N>` other tools write; None when there is none."""
    ours = _DSTRACE_RANK.findall(name)
    if ours:
        return int(ours[-1])
    other = _ANY_RANK.search(name)
    return int(other.group(1)) if other else None


def reduction_name(trace_name: str) -> str:
    """The kept reduction's name for a trace's: its name less the trace suffix, plus REDUCTION_SUFFIX."""
    for suffix in TRACE_STEM_SUFFIXES:
        if trace_name.endswith(suffix):
            return trace_name[:-len(suffix)] + REDUCTION_SUFFIX
    return trace_name + REDUCTION_SUFFIX


def trace_names_of(reduction: str) -> list[str]:
    """The trace names whose kept reduction is named `reduction` (`reduction_name`)."""
    stem = reduction[:-len(REDUCTION_SUFFIX)]
    return [stem + suffix for suffix in TRACE_STEM_SUFFIXES] + [stem]


def derived_from_the_run(name: str) -> bool:
    """Whether a file of a run folder is what analysis made of the run, or a write in progress: a report
    kept for the run depends on everything else in the folder, and on none of these."""
    return bool(_DERIVED.match(name))


def beside(run_dir: str, name: str) -> str:
    """Where a view of the run writes by default: `name` in the run folder, or beside a single trace file,
    named after it."""
    if not os.path.isfile(run_dir):
        return os.path.join(run_dir, name)
    stem = os.path.basename(run_dir)
    for suffix in TRACE_SUFFIXES + (".json.gz", ".json"):
        if stem.endswith(suffix):
            stem = stem[:-len(suffix)]
            break
    return os.path.join(os.path.dirname(os.path.abspath(run_dir)), f"{stem}.{name}")


def safe_name(text: str) -> str:
    """A host or node name as part of a file name: letters, digits, '.', '_' and '-' only, no leading dot."""
    return _UNSAFE_NAME.sub("_", text).strip(".") or "_"
