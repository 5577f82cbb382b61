"""`dstrace reduce [-o RUN_DIR] TRACES...`: traces dstrace did not record (torch.profiler's, HTA's, a
cluster's), reduced where they lie into the per-rank files `dstrace record` writes, so that `dstrace analyze
RUN_DIR` reads those and never the traces.

Run alone, it reduces every trace given. Run as several processes at once, by the job's launcher or the
cluster's scheduler on every node (`torchrun --nproc_per_node K`, `srun --ntasks-per-node K`), each process
takes every K-th of the node's traces (LOCAL_RANK of LOCAL_WORLD_SIZE, or in a task srun started SLURM_LOCALID
of the step's tasks on its node, SLURM_STEP_TASKS_PER_NODE at SLURM_NODEID); with `--split job`, of the whole
job's traces on a shared filesystem (RANK of WORLD_SIZE, or SLURM_PROCID of SLURM_STEP_NUM_TASKS). No two
processes write one file: each reduces into a private folder inside RUN_DIR and moves each rank's file in with
a hard link, which fails where the file is already there (two traces claiming one rank, or an earlier reduce). A
process alone writes `run.json`; each process of several writes its node record,
`nodes/<host>[-node<K>]-reduce<i>.json`, as each node of a multi-node `dstrace record` does, and `dstrace
gather` joins them (docs/multi-node.md).

Nothing is written outside RUN_DIR: the traces are read through links in that private folder, where their
kept reductions are made and the temporary files go too, and the folder is removed at the end.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

from dstrace.errors import UserError
from dstrace.rankset import ranks_text
from dstrace.runfolder.files import OutputRefused, make_output_folder
from dstrace.runfolder.names import RUN_FILE, node_record_path, rank_in_name, reduction_name, safe_name
from dstrace.runfolder.records import RUN_SCHEMA, RankStatus, RunRecord, to_json, write_json_atomic
from dstrace.say import say

MAX_PROCESSES = 1 << 16
STEP_TASKS = "SLURM_STEP_TASKS_PER_NODE"
TASKS_OF_NODES = re.compile(r"(\d{1,6})(?:\(x(\d{1,6})\))?")


def tasks_here(environ: dict[str, str]) -> str | None:
    """How many tasks of this srun step run on this task's node: SLURM_STEP_TASKS_PER_NODE (`2(x3),1`: two on
    each of the first three nodes, one on the fourth) at SLURM_NODEID. Not SLURM_NTASKS_PER_NODE: srun sets it
    only for --ntasks-per-node, and a step inherits the job's where its own tasks lie otherwise (`sbatch -N 2
    --ntasks-per-node 2`, then `srun -n 3`: 2 and 1), which would leave traces of the node of 1 unreduced."""
    text, node = environ.get(STEP_TASKS, ""), environ.get("SLURM_NODEID", "")
    if not node.isdigit() or len(text) > 4096:
        return None
    left = int(node)
    for part in text.split(","):
        m = TASKS_OF_NODES.fullmatch(part)
        if m is None:
            return None
        left -= int(m.group(2) or 1)
        if left < 0:
            return m.group(1)
    return None


@dataclass(frozen=True)
class Variables:
    """Where a launcher says which of the processes sharing the traces this one is: `index` of `count` (or of
    what `count_of` reads), counted only where `gate` is set (where the pair means this process's share)."""
    index: str
    count: str
    gate: str
    count_of: Callable[[dict[str, str]], str | None] | None = None

    def values(self, environ: dict[str, str]) -> tuple[str | None, str | None]:
        return environ.get(self.index), self.count_of(environ) if self.count_of else environ.get(self.count)


SLURM_STEP = "SLURM_STEP_NUM_TASKS"
"""Set by srun in the tasks of a job step only: a batch script has SLURM_LOCALID and SLURM_PROCID too, and a
`dstrace reduce` run there alone must not take one share of the traces and leave the others."""
SHARES = {  # --split -> the launchers' variables, first found wins
    "node": (Variables("LOCAL_RANK", "LOCAL_WORLD_SIZE", "LOCAL_RANK"),
             Variables("SLURM_LOCALID", f"{STEP_TASKS} at SLURM_NODEID", SLURM_STEP, tasks_here)),
    "job": (Variables("RANK", "WORLD_SIZE", "RANK"), Variables("SLURM_PROCID", SLURM_STEP, SLURM_STEP)),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("traces", nargs="+", metavar="TRACES",
                        help="folders of traces (*.pt.trace.json[.gz], else *.json[.gz]) or trace files")
    parser.add_argument("-o", "--output", metavar="RUN_DIR",
                        help="the run folder to write the per-rank files into (default: traces/<time>-reduce; "
                             "required when run as several processes)")
    parser.add_argument("--split", choices=tuple(SHARES), default="node",
                        help="several processes share: node = the traces given on each node, by LOCAL_RANK or "
                             "SLURM_LOCALID (default); job = the traces of the whole job, given alike to every "
                             "process on a shared filesystem, by RANK or SLURM_PROCID")
    parser.add_argument("--run-id", metavar="ID", help="the run's id in its records (default: RUN_DIR's name)")


@dataclass(frozen=True)
class Share:
    """This process is `index` of `count` sharing the traces (0 of 1: alone); `by` names the variables."""
    index: int
    count: int
    by: str | None = None

    @property
    def alone(self) -> bool:
        return self.by is None


def share_of(environ: dict[str, str], split: str) -> Share:
    """Which share of the traces is this process's, from its launcher's variables."""
    for names in SHARES[split]:
        index, count = names.values(environ)
        if names.gate not in environ or (index is None and count is None):
            continue
        if not (index and count and index.isdigit() and count.isdigit()
                and 0 <= int(index) < int(count) <= MAX_PROCESSES):
            raise UserError(f"{names.index}={index} and {names.count}={count} do not say which of the processes "
                            f"this is: the launcher sets both")
        return Share(int(index), int(count), f"{names.index} of {names.count}")
    return Share(0, 1)


def trace_files(inputs: list[str]) -> list[str]:
    """Every trace the inputs name, once, in one order every process sees alike."""
    from dstrace.analysis.loading import run_folder

    found: dict[str, str] = {}
    for given in inputs:
        path = os.path.abspath(given)
        if os.path.isdir(path):
            files = [f.path for f in run_folder(path).trace_candidates]
            if not files:
                raise UserError(f"no traces (*.pt.trace.json[.gz], else *.json[.gz]) in {path}: give the folder "
                                "the profiler wrote into")
        elif os.path.lexists(path):
            files = [path]
        else:
            raise UserError(f"{path}: no such file or folder; give the folders or files of the traces")
        for f in files:
            found.setdefault(os.path.realpath(f), f)
    return sorted(found.values())


def output_folder(output: str | None, share: Share) -> str:
    """RUN_DIR, made if new; never a link, never a file."""
    if output is None:
        if not share.alone:
            raise UserError(f"several processes reduce together ({share.by}): give them one run folder with -o")
        from dstrace.recording.launcher import claim_new_dir, default_run_dir

        return claim_new_dir(default_run_dir(["reduce"]))
    try:
        return make_output_folder(output, "choose another -o")
    except OutputRefused as e:
        raise UserError(str(e)) from None


@dataclass
class Claim:
    """A trace of this process's share and the rank it says it is, or why it cannot be reduced."""
    path: str
    rank: int | None = None
    world: int | None = None
    problem: str | None = None


def claim(path: str, alone_in_run: bool) -> Claim:
    """The rank (and world size) a trace claims, read from its head, as `dstrace analyze` reads it."""
    from dstrace.analysis.trace_head import trace_metadata
    from dstrace.runfolder.folder import dstrace_metadata, rank_of, world_of
    from dstrace.runfolder import untrusted

    try:
        meta = trace_metadata(path)
    except ValueError as exc:
        return Claim(path, problem=str(exc))
    except OSError as exc:
        return Claim(path, problem=untrusted.unreadable(path, exc))
    ours = dstrace_metadata(meta)
    rank, _ = rank_of(path, meta, ours)
    if rank is None and alone_in_run:
        rank = 0  # a run of one trace, as `dstrace analyze FILE` reads it
    if rank is None:
        return Claim(path, problem="no rank in it (no distributedInfo.rank, no dstrace metadata, no rankN in its "
                                   "name): rename it <host>_rank<N>.pt.trace.json.gz")
    return Claim(path, rank, world_of(meta, ours))


def one_per_rank(claims: list[Claim]) -> None:
    """Two traces of this share claiming one rank: neither is reduced (which one is that rank, no file says)."""
    by_rank: dict[int, list[Claim]] = {}
    for c in claims:
        if c.problem is None:
            by_rank.setdefault(c.rank, []).append(c)
    for rank, same in by_rank.items():
        for c in same if len(same) > 1 else ():
            others = " and ".join(os.path.basename(o.path) for o in same if o is not c)
            c.problem = f"claims rank {rank}, as {others} does: keep one trace per rank"


def reduce_into(run_dir: str, claims: list[Claim], progress) -> tuple[list[int], list[str]]:
    """Reduce the claimed traces in a private folder of `run_dir` (`write_run_reductions`, as `dstrace record`
    does) and move each rank's kept reduction into `run_dir`, never over a file there. Returns the ranks written
    and a line per rank that was not."""
    from dstrace.analysis.kept import write_run_reductions

    good = [c for c in claims if c.problem is None]
    if not good:
        return [], []
    staging = tempfile.mkdtemp(prefix=".reduce-", suffix=".tmp", dir=run_dir)
    before = tempfile.tempdir
    try:
        names = {}
        for i, c in enumerate(good):
            os.mkdir(os.path.join(staging, str(i)))
            names[c.rank] = os.path.join(str(i), os.path.basename(c.path))
            os.symlink(c.path, os.path.join(staging, names[c.rank]))
        world = max((c.world or 0 for c in good), default=0)
        tempfile.tempdir = staging  # the reduction's scratch files stay inside RUN_DIR too
        try:
            problems = write_run_reductions(staging, names, world, progress)
        except Exception as exc:  # noqa: BLE001 - the traces' fault or ours, it is one line, not a traceback
            problems = [f"{ranks_text(names)}: not reduced ({type(exc).__name__}: {exc})"]
        written, refused = publish(staging, run_dir, names)
        where = {c.rank: c.path for c in good}
        return written, [_naming_its_trace(line, where) for line in problems + refused]
    finally:
        tempfile.tempdir = before
        shutil.rmtree(staging, ignore_errors=True)


def _naming_its_trace(line: str, where: dict[int, str]) -> str:
    """A line about rank N (`rank N: ...`), led by the trace it was reduced from."""
    m = re.match(r"rank (\d+):", line)
    return f"{where[int(m.group(1))]}: {line}" if m and int(m.group(1)) in where else line


def publish(staging: str, run_dir: str, names: dict[int, str]) -> tuple[list[int], list[str]]:
    """Each rank's kept reduction (written beside its trace's link, `names`: rank -> link in `staging`), linked
    into `run_dir` where no file of that name is."""
    written, refused = [], []
    for rank, link in sorted(names.items()):
        kept = reduction_name(os.path.basename(link))
        source = os.path.join(staging, os.path.dirname(link), kept)
        if not os.path.isfile(source) or os.path.islink(source):
            continue
        # traces of different ranks may share a name (one folder per rank): the rank goes into the kept name
        name = kept if rank_in_name(kept) == rank else f"rank{rank}.{kept}"
        try:
            os.link(source, os.path.join(run_dir, name))
        except FileExistsError:
            refused.append(f"rank {rank}: {name} is in {run_dir} already (another trace claims rank {rank}, or an "
                           "earlier reduce wrote it): remove it, or reduce into a new folder")
            continue
        except OSError as e:
            refused.append(f"rank {rank}: cannot write {name} into {run_dir} ({e.strerror or e})")
            continue
        written.append(rank)
    return written, refused


def record_of(run_id: str, command: list[str], share: Share, claims: list[Claim], written: list[int], problems: list[str],
              started: float) -> RunRecord:
    """The run record of what this process reduced: its ranks, the traces it could not, where they lie."""
    worlds = [c.world for c in claims if c.world]
    world = max(worlds) if worlds else None
    run = RunRecord(schema=RUN_SCHEMA, run_id=run_id, command=command, cwd=os.getcwd(),
                    started=started, status="complete" if not problems else "incomplete", ended=time.time(),
                    exit_code=1 if problems else 0, world_size=world,
                    ranks=[RankStatus(rank=r, status="complete", manifest=None, traces=[]) for r in written],
                    problems=problems)
    if share.alone and world:
        run.missing_ranks = [r for r in range(world) if r not in set(written)]
    folders = sorted({os.path.dirname(c.path) for c in claims if c.rank in set(written)})
    if written:
        run.notes.append(f"{ranks_text(written)}: reduced by dstrace reduce on {socket.gethostname()} from the "
                         f"traces in {', '.join(folders)} (not in this folder)")
    return run


def node_of(environ: dict[str, str]) -> str:
    """This process's host, with the node's number where the launcher gives one (torchrun's GROUP_RANK,
    SLURM_NODEID): nodes of one host name stay apart, in its records and in what it says."""
    node = environ.get("GROUP_RANK") or environ.get("SLURM_NODEID") or ""
    return f"{safe_name(socket.gethostname())}{f'-node{node}' if node.isdigit() else ''}"


def node_name(share: Share, environ: dict[str, str]) -> str:
    """This process's node record name: its node and its share."""
    return f"{node_of(environ)}-reduce{share.index}"


def run_id_of(explicit: str | None, run_dir: str) -> str:
    from dstrace.recording.multinode import RUN_ID

    chosen = explicit or safe_name(os.path.basename(run_dir))[:64]
    if not RUN_ID.match(chosen):
        raise UserError(f"run id {chosen!r} must be 1-64 letters, digits, '.', '_' or '-': pass --run-id ID")
    return chosen


def main(args: argparse.Namespace) -> int:
    started = time.time()
    share = share_of(dict(os.environ), args.split)
    files = trace_files(args.traces)
    run_dir = output_folder(args.output, share)
    run_id = run_id_of(args.run_id, run_dir)
    mine = files[share.index::share.count]
    who = "" if share.alone else f"{node_of(dict(os.environ))} process {share.index + 1} of {share.count}: "

    def progress(message: str) -> None:
        say(who + message)

    if not mine:
        progress(f"no trace falls to this process: {len(files)} trace(s) for {share.count} processes")
        return 0
    progress(f"reducing {len(mine)} of {len(files)} trace(s) into {run_dir}")
    claims = [claim(path, len(files) == 1) for path in mine]
    one_per_rank(claims)
    written, problems = reduce_into(run_dir, claims, progress)
    problems = [f"{c.path}: {c.problem}" for c in claims if c.problem] + problems
    command = ["dstrace", "reduce", "-o", run_dir, "--split", args.split] + [os.path.abspath(t) for t in args.traces]
    run = record_of(run_id, command, share, claims, written, problems, started)
    node = node_name(share, dict(os.environ))
    record_path = os.path.join(run_dir, RUN_FILE) if share.alone else node_record_path(run_dir, node)
    payload = to_json(run) | ({} if share.alone else {"node": node, "host": socket.gethostname()})
    try:
        if os.path.islink(os.path.dirname(record_path)):
            raise OSError(f"{os.path.dirname(record_path)} is a link, and dstrace writes no file through one")
        os.makedirs(os.path.dirname(record_path), exist_ok=True)
        write_json_atomic(record_path, payload)
    except OSError as e:
        problems.append(f"cannot write the run record {record_path} ({e.strerror or e})")
    for line in problems:
        progress(line)
    progress(f"{ranks_text(written)} reduced into {run_dir}" if written else f"nothing reduced into {run_dir}")
    return 1 if problems else 0
