"""A run folder read once: `RunFolder.scan` lists it, names what each file is (`names` owns the names), and
reads its manifests and run record once, for every verb that reads the folder (analyze, compare, view,
gather, record's own summary).

A file's kind comes from its name alone (`FolderFile.kind`); nothing is opened until asked for, and then
through `untrusted`/`records`, once: the manifests and run.json on the first `records`, a file's content
hash on the first `content` (the key of its kept reduction and of the kept report: one hash per file and
analysis). The scan is what the folder was when it was listed; a file that goes or changes afterwards is
found out when it is read. Standard library only (records read with msgspec, hashes with xxhash, both
imported at first use).
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from functools import cached_property

from dstrace.runfolder import untrusted
from dstrace.runfolder.names import (DEEPSPEED_ENV_FILE, MANIFEST_SUFFIX, NODES_DIR, REDUCTION_SUFFIX, RUN_FILE,
                                     TRACE_SUFFIXES, UNRECORDED_PREFIX, derived_from_the_run, rank_in_name,
                                     trace_names_of)
from dstrace.runfolder.records import (MAX_WORLD, Manifest, RunRecord, read_json_object, read_manifest,
                                       read_node_record, read_run)

TRACE = "trace"  # *.pt.trace.json[.gz]: a rank's torch.profiler trace
MANIFEST = "manifest"  # rank<N>.manifest.json
REDUCTION = "reduction"  # <trace stem>.reduction.arrow: a rank's kept reduction (`analysis.kept`)
RUN = "run"  # run.json
UNRECORDED = "unrecorded"  # unrecorded.<host>.<pid>.json: a rank that ran without the recording
NODES = "nodes"  # nodes/: the node records of a run recorded node by node
NODE_RECORD = "node record"  # nodes/<node>.json (`node_files`)
DEEPSPEED_ENV = "deepspeed_env"
DERIVED = "derived"  # what analyze and view made of the run, or a write in progress (`names.derived_from_the_run`)
JSON = "json"  # any other *.json[.gz]: a trace of another tool, read as one where no profiler trace is there
OTHER = "other"  # none of dstrace's: ignored

RECORD_ERRORS = (OSError, ValueError, TypeError, KeyError)
"""What reading a manifest or run record may raise: the file is then skipped, its reason kept."""


def kind_of(name: str) -> str:
    """What a file of a run folder is, by its name (the kinds above)."""
    if derived_from_the_run(name):
        return DERIVED
    if name.endswith(TRACE_SUFFIXES):
        return TRACE
    if name.endswith(MANIFEST_SUFFIX):
        return MANIFEST
    if name.endswith(REDUCTION_SUFFIX):
        return REDUCTION
    if name == RUN_FILE:
        return RUN
    if name.startswith(UNRECORDED_PREFIX) and name.endswith(".json"):
        return UNRECORDED
    if name == NODES_DIR:
        return NODES
    if name == DEEPSPEED_ENV_FILE:
        return DEEPSPEED_ENV
    return JSON if name.endswith((".json", ".json.gz")) else OTHER


class FolderRefused(ValueError):
    """The folder cannot be listed; the message says why, the caller adds what to do."""


class NotAFolder(FolderRefused):
    pass


class UnreadableFolder(FolderRefused):
    pass


@dataclass(frozen=True)
class FolderFile:
    """One name of a run folder (or one trace given alone), as listed."""
    path: str
    kind: str
    regular: bool = True  # a regular file when listed (links followed): not a folder, FIFO or dangling link

    @property
    def name(self) -> str:
        return os.path.basename(self.path)

    @property
    def rank(self) -> int | None:
        """The rank the file's name gives (`names.rank_in_name`), None when it gives none."""
        return rank_in_name(self.name)

    @cached_property
    def _hashed(self) -> tuple[dict, tuple]:
        before = _stamp(self.path)  # before the bytes are read: a write meanwhile shows as a change
        return untrusted.content(self.path), before

    @property
    def content(self) -> dict:
        """`untrusted.content` of the file, taken once (raises OSError or `untrusted.Refused` each time asked
        when it cannot be read)."""
        return self._hashed[0]

    def changed_since_hashed(self) -> bool:
        """Whether the file is not what `content` hashed: written, replaced or removed since (its size,
        modification and change times or inode moved)."""
        try:
            return _stamp(self.path) != self._hashed[1]
        except (OSError, ValueError):  # gone, or never hashed: not what a cache may be keyed on
            return True


def _stamp(path: str) -> tuple:
    s = os.stat(path)
    return s.st_size, s.st_mtime_ns, s.st_ctime_ns, s.st_ino, s.st_dev


@dataclass(frozen=True)
class RecordRead:
    """One manifest or run.json, read: its record, or why it could not be read."""
    file: FolderFile
    record: Manifest | RunRecord | None
    problem: str | None = None


@dataclass(frozen=True)
class Records:
    """The manifests and run.json of a folder, each read once, in name order."""
    reads: tuple[RecordRead, ...]

    @property
    def manifest_reads(self) -> list[RecordRead]:
        return [r for r in self.reads if r.file.kind == MANIFEST]

    @property
    def manifests(self) -> dict[int, Manifest]:
        """rank -> its manifest (of two files naming one rank, the later name's)."""
        return {r.record.rank: r.record for r in self.manifest_reads if r.record is not None}

    @property
    def run(self) -> RunRecord | None:
        return next((r.record for r in self.reads if r.file.kind == RUN), None)

    @property
    def skipped(self) -> list[tuple[FolderFile, str]]:
        """The files that could not be read, and why."""
        return [(r.file, r.problem) for r in self.reads if r.problem is not None]


@dataclass(frozen=True)
class RunFolder:
    """Every file of a run folder, classified once; `single`: one trace file given alone (a run of one rank,
    none of its folder's other files)."""
    path: str
    files: tuple[FolderFile, ...]  # in name order
    single: bool = False

    @classmethod
    def scan(cls, path: str) -> "RunFolder":
        """List `path` once. A file named like a trace is a run of that one trace (`is_single_trace`).
        Raises NotAFolder or UnreadableFolder."""
        path = os.path.abspath(path)
        if is_single_trace(path):
            return cls(path=path, files=(FolderFile(path, TRACE),), single=True)
        if not os.path.isdir(path):
            raise NotAFolder(f"{path} is not a folder")
        try:
            with os.scandir(path) as listing:
                entries = sorted(listing, key=lambda e: e.name)
                files = tuple(FolderFile(e.path, kind_of(e.name), _is_file(e)) for e in entries)
        except OSError as exc:
            raise UnreadableFolder(f"cannot read the folder {path} ({exc.strerror or exc})") from None
        return cls(path=path, files=files)

    def of_kind(self, *kinds: str) -> list[FolderFile]:
        return [f for f in self.files if f.kind in kinds]

    @property
    def names(self) -> list[str]:
        return [f.name for f in self.files]

    @property
    def traces(self) -> list[FolderFile]:
        """The torch.profiler traces (`*.pt.trace.json[.gz]`)."""
        return self.of_kind(TRACE)

    @property
    def trace_candidates(self) -> list[FolderFile]:
        """What the analysis reads as traces: the torch.profiler traces if any, else every other `.json` /
        `.json.gz` file but the manifests and run.json (maybe none)."""
        return self.traces or [f for f in self.files if f.name.endswith((".json", ".json.gz"))
                               and f.kind not in (MANIFEST, RUN)]

    @property
    def kept_alone(self) -> list[str]:
        """Paths of the kept reductions whose traces are not in the folder: each is its rank."""
        names = {f.name for f in self.files}
        return [f.path for f in self.of_kind(REDUCTION) if f.regular and not self.single
                and not any(t in names for t in trace_names_of(f.name))]

    @property
    def run_files(self) -> list[FolderFile]:
        """The regular files of the run itself: everything but what analysis derived from it. A kept reduction
        whose trace is here is derived from that trace; one whose trace is not is the rank."""
        names = {f.name for f in self.files}
        return [f for f in self.files if f.kind != DERIVED and f.regular
                and not (f.kind == REDUCTION and any(t in names for t in trace_names_of(f.name)))]

    @property
    def is_run(self) -> bool:
        """Whether the folder holds a recorded run or torch.profiler traces (compare's test)."""
        return bool(self.of_kind(RUN, MANIFEST, TRACE))

    @cached_property
    def records(self) -> Records:
        """The manifests and run.json, read once; one that cannot be read is kept with why."""
        reads = []
        for f in self.of_kind(MANIFEST, RUN):
            try:
                reads.append(RecordRead(f, read_run(f.path) if f.kind == RUN else read_manifest(f.path)))
            except RECORD_ERRORS as exc:
                reads.append(RecordRead(f, None, str(exc)))
        return Records(tuple(reads))

    def unrecorded_notes(self) -> list[str]:
        """The notes of ranks whose interpreter could not run dstrace's recording code (bootstrap/sitecustomize);
        a note that cannot be read is passed over."""
        out = []
        for f in self.of_kind(UNRECORDED):
            try:
                note = read_json_object(f.path)
            except (OSError, ValueError):
                continue
            who = f"rank {note.get('rank')}" if note.get("rank") is not None else f"pid {note.get('pid')}"
            out.append(f"{who} on {note.get('host')} ran unrecorded: its Python {note.get('python')} "
                       f"({note.get('executable')}) cannot run dstrace's recording code ({note.get('error')})")
        return out


def node_files(run_dir: str) -> list[FolderFile]:
    """`nodes/*.json` of a run folder, listed when asked (never through a link: the caller refuses one); none
    without nodes/. Raises UnreadableFolder."""
    folder = os.path.join(run_dir, NODES_DIR)
    if os.path.islink(folder) or not os.path.isdir(folder):
        return []
    try:
        names = sorted(os.listdir(folder))
    except OSError as exc:
        raise UnreadableFolder(f"cannot read the folder {folder} ({exc.strerror or exc})") from None
    return [FolderFile(os.path.join(folder, n), NODE_RECORD) for n in names if n.endswith(".json")]


def node_records(run_dir: str) -> dict[str, dict]:
    """node name -> its node record (`records.read_node_record`). Raises UnreadableFolder, and ValueError
    naming the record that cannot be read."""
    out = {}
    for f in node_files(run_dir):
        try:
            out[f.name.removesuffix(".json")] = read_node_record(f.path)
        except (OSError, ValueError) as exc:
            raise ValueError(f"cannot read node record {f.name}: {exc}") from None
    return out


def _is_file(entry: os.DirEntry) -> bool:
    try:
        return entry.is_file()
    except OSError:
        return False


def is_single_trace(path: str) -> bool:
    """Whether `path` names one trace file rather than a run folder: analyzed as a run of one rank (#28)."""
    return os.path.isfile(path) and os.path.basename(path).endswith(TRACE_SUFFIXES + (".json", ".json.gz"))


def ended_run(run_dir: str) -> dict | None:
    """The run.json of a folder as written, if it says the run ended; None when there is none, it cannot be
    read, or the run had not ended (a sweep records that run again)."""
    try:
        run = read_json_object(os.path.join(run_dir, RUN_FILE))
    except (OSError, ValueError):
        return None
    return run if run.get("ended") is not None else None


# ---- What a trace says of itself: its rank, world, host and dstrace block, where a job can have them --------
HOST_IN_NAME = re.compile(r"^(?P<host>.+?)_rank\d+")


def dstrace_metadata(meta: dict) -> dict | None:
    """The "dstrace" block of a trace's metadata: an object, or a JSON string when added with add_metadata_json."""
    value = meta.get("dstrace")
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return None
    return value if isinstance(value, dict) else None


def plausible(value, lowest: int) -> bool:
    """A rank (lowest 0) or world size (lowest 1) that a real job can have: up to `records.MAX_WORLD` ranks, the
    one cap of every file of a run folder."""
    return isinstance(value, int) and not isinstance(value, bool) and lowest <= value < MAX_WORLD + lowest


def rank_of(path: str, meta: dict, ours: dict | None) -> tuple[int | None, str | None]:
    """The rank a trace claims, and where that came from. distributedInfo wins, then dstrace, then the name;
    a value no job can have is passed over."""
    dist = meta.get("distributedInfo")
    if isinstance(dist, dict) and plausible(dist.get("rank"), 0):
        return dist["rank"], "distributedInfo"
    if ours and plausible(ours.get("rank"), 0):
        return ours["rank"], "dstrace metadata"
    rank = rank_in_name(os.path.basename(path))
    if rank is not None and plausible(rank, 0):
        return rank, "file name"
    return None, None


def implausible(path: str, meta: dict, ours: dict | None) -> list[str]:
    """What the trace claims for its rank or world size that no job can have (and is ignored)."""
    out = []
    for where, block in (("distributedInfo", meta.get("distributedInfo")), ("dstrace metadata", ours)):
        if not isinstance(block, dict):
            continue
        for key, lowest in (("rank", 0), ("world_size", 1)):
            if key in block and not plausible(block[key], lowest):
                out.append(f"{os.path.basename(path)}: {where} gives {key} {str(block[key])[:40]}, which no job has "
                           f"(dstrace reads {lowest} to {MAX_WORLD + lowest - 1}); ignored")
    if isinstance(ours, dict) and ours.get("run_id") is not None and not isinstance(ours["run_id"], str):
        out.append(f"{os.path.basename(path)}: dstrace metadata gives run_id {str(ours['run_id'])[:40]}, which is "
                   "not text; ignored")
    return out


def host_of(path: str, meta: dict) -> str | None:
    """The host a trace names (torch.profiler's host_name), else the `<host>_rank<N>` of its file name."""
    host = meta.get("host_name")
    if isinstance(host, str) and host:
        return host
    m = HOST_IN_NAME.match(os.path.basename(path))
    return m.group("host") if m else None


def world_of(meta: dict, ours: dict | None) -> int | None:
    """The world size a trace claims: distributedInfo's, else dstrace's; None when neither is one a job can have."""
    dist = meta.get("distributedInfo")
    if isinstance(dist, dict) and plausible(dist.get("world_size"), 1):
        return dist["world_size"]
    if ours and plausible(ours.get("world_size"), 1):
        return ours["world_size"]
    return None
