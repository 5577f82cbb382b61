"""`dstrace gather OUT [NODE_FOLDER...]`: one run folder, and its run.json, from the nodes of a run.

Each node of a multi-node run writes its ranks' files where it can: all into one shared folder, or
each into a folder of its own disk. Gathering copies the nodes' folders into OUT (a file two nodes both
hold must be the same file; a rank recorded twice, or two run ids, is refused) and writes `run.json`
for the whole run: every rank of every node, the world size from the manifests, the missing ranks,
and each node's command and exit code from its node record (`nodes/<node>.json`). With no
NODE_FOLDER, OUT is the shared folder and only `run.json` is written.
"""
from __future__ import annotations

import filecmp
import os

from ..errors import UserError
from ..runfolder.files import copy_regular_atomic
from ..runfolder.folder import MANIFEST, SUMMARY, TRACE, FolderRefused, RunFolder
from ..runfolder.names import NODES_DIR, RUN_FILE
from ..runfolder.records import RUN_SCHEMA, Manifest, RunRecord, read_json_object, to_json, write_json_atomic
from ..say import say
from .launcher import fill_run_record

LAUNCHER_RECORD = "launcher"  # node record name for a run.json that `dstrace record` wrote for a whole launch


def add_arguments(parser) -> None:
    parser.add_argument("output", metavar="OUT",
                        help="the run folder to write; with no NODE_FOLDER, the shared folder every node wrote into")
    parser.add_argument("nodes", nargs="*", metavar="NODE_FOLDER",
                        help="per-node run folders (copied from each node's disk) to merge into OUT")


def main(args) -> int:
    run = gather(args.output, args.nodes)
    say(f"{run.status} run {run.run_id}: {len(run.ranks)} rank(s) of world {run.world_size} "
        f"in {os.path.abspath(args.output)}")
    for problem in run.problems:
        say(problem)
    return 0


def _scan(folder: str) -> RunFolder:
    try:
        return RunFolder.scan(folder)
    except FolderRefused as e:
        raise UserError(f"{e}; give a folder you can read") from None


def _node_files(folder: RunFolder) -> list[str]:
    try:
        return [f.name for f in folder.node_files()]
    except FolderRefused as e:
        raise UserError(f"{e}; give a folder you can read") from None


def _refuse_link(path: str, what: str) -> None:
    if os.path.islink(path):
        raise UserError(f"{path} is a link: gather {what}; replace it with the folder itself")


def _is_gathered(path: str) -> bool:
    try:
        return "gathered_from" in read_json_object(path)
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read {path}: {e}") from None


def _plan(out: RunFolder, sources: list[str]) -> tuple[list[tuple[str, str]], list[RunFolder]]:
    """(source path, destination path) for every file to copy, and the node folders as listed; refuses
    conflicting files."""
    plan: dict[str, str] = {}
    trace_owner: dict[int, str] = {}
    folders = []
    for f in out.traces:
        if f.rank is not None:
            trace_owner[f.rank] = f.path
    for src in sources:
        if not os.path.isdir(src):
            raise UserError(f"{src} is not a folder: give the run folders the nodes wrote")
        folder = _scan(src)
        folders.append(folder)
        trace_rank = {f.path: f.rank for f in folder.traces}
        entries = [(f.path, os.path.join(out.path, f.name)) for f in folder.of_kind(MANIFEST, TRACE, SUMMARY)]
        nodes_dir = folder.nodes_dir
        _refuse_link(nodes_dir, "reads no folder through one")
        entries += [(os.path.join(nodes_dir, n), os.path.join(out.path, NODES_DIR, n)) for n in _node_files(folder)]
        run_file = os.path.join(src, RUN_FILE)
        if os.path.isfile(run_file) and not _is_gathered(run_file):
            entries.append((run_file, os.path.join(out.path, NODES_DIR, f"{os.path.basename(src)}.json")))
        if not entries:
            raise UserError(f"{src} holds no dstrace files (manifests, traces, summaries, node records)")
        for source, dest in entries:
            if os.path.islink(source) or not os.path.isfile(source):
                raise UserError(f"{source} is a link or not a regular file: gather copies only the files the "
                                "nodes wrote; replace it with the file itself")
            if os.path.islink(dest):
                raise UserError(f"{dest} is a link: gather writes no file through one; remove it")
            earlier = plan.get(dest) or (dest if os.path.exists(dest) else None)
            if earlier and not filecmp.cmp(earlier, source, shallow=False):
                raise UserError(f"{source} and {earlier} differ: the same file from two nodes; "
                                "was a rank recorded twice?")
            rank = trace_rank.get(source)
            if rank is not None:
                owner = trace_owner.setdefault(rank, source)
                if os.path.basename(owner) != os.path.basename(source):
                    raise UserError(f"two traces claim rank {rank}: {owner} and {source}")
            plan.setdefault(dest, source)
    return [(s, d) for d, s in plan.items() if not os.path.exists(d)], folders


def _check_one_run(out: RunFolder, plan: list[tuple[str, str]], folders: list[RunFolder]) -> str:
    """The run id of the manifests in OUT and of those to be copied (each read once); unreadable ones are passed over."""
    manifests: dict[str, Manifest | None] = {r.file.path: r.record for f in [out] + folders
                                             for r in f.records.manifest_reads}
    paths = [f.path for f in out.of_kind(MANIFEST)] + [s for s, _ in plan if s in manifests]
    runs: dict[str, list[str]] = {}
    for path in paths:
        if manifests.get(path) is not None:
            runs.setdefault(manifests[path].run_id, []).append(path)
    if len(runs) > 1:
        listing = "; ".join(f"run {rid}: {os.path.dirname(p[0])}" for rid, p in sorted(runs.items()))
        raise UserError(f"the folders hold different runs ({listing}); give every node the same --run-id")
    if not runs:
        raise UserError("no rank manifest in the given folders: nothing to gather")
    return next(iter(runs))


def _copy(source: str, dest: str) -> None:
    try:
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        copy_regular_atomic(source, dest)
    except (OSError, ValueError) as e:
        raise UserError(f"cannot copy {source}: {e}") from None


def _node_records(out: RunFolder) -> dict[str, dict]:
    try:
        return out.node_records()
    except FolderRefused as e:
        raise UserError(f"{e}; give a folder you can read") from None
    except ValueError as e:
        raise UserError(str(e)) from None


def gather(output: str, node_folders: list[str]) -> RunRecord:
    """Merge the node folders into `output` and write its run.json; return the run record."""
    out = os.path.abspath(output)
    sources = [os.path.abspath(n) for n in node_folders if os.path.abspath(n) != out]
    if not sources and not os.path.isdir(out):
        raise UserError(f"{out} is not a folder: give the shared run folder, or OUT and the node folders")
    if os.path.lexists(out) and not os.path.isdir(out):
        raise UserError(f"{out} is there and is not a folder: give gather a folder to write the run into")
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot make the folder {out} ({e.strerror or e}); choose another OUT") from None
    _refuse_link(os.path.join(out, NODES_DIR), "writes no file through one")
    listed = _scan(out)
    plan, folders = _plan(listed, sources)
    run_id = _check_one_run(listed, plan, folders)
    own_run = os.path.join(out, RUN_FILE)
    if os.path.isfile(own_run) and not _is_gathered(own_run):
        plan.append((own_run, os.path.join(out, NODES_DIR, f"{LAUNCHER_RECORD}.json")))
    for source, dest in plan:
        _copy(source, dest)
    records = _node_records(listed)
    first = next(iter(records.values()), {})
    run = RunRecord(schema=RUN_SCHEMA, run_id=run_id, command=first.get("command", []), cwd=first.get("cwd", ""),
                    started=min((r.get("started") or 0 for r in records.values()), default=0.0),
                    status="running")
    codes = {name: r.get("exit_code") for name, r in records.items()}
    fill_run_record(out, run, 0)
    run.exit_code = next((c for c in codes.values() if c), 0)
    run.ended = max((r.get("ended") or 0 for r in records.values()), default=run.ended)
    for name, code in codes.items():
        if code:
            run.problems.append(f"{name}: the command exited with code {code}")
        elif code is None:
            run.problems.append(f"{name}: its dstrace record did not finish (no exit code)")
    expected = max((r.get("nnodes") or 0 for r in records.values()), default=0)
    if expected > len(records):
        run.problems.append(f"node records from {len(records)} of {expected} nodes ({', '.join(records)})")
    if not records:
        run.problems.append("no node record: the nodes' commands and exit codes are unknown")
    run.status = "complete" if not run.problems and all(r.status == "complete" for r in run.ranks) else "incomplete"
    payload = to_json(run)
    payload["gathered_from"] = [{"node": name, "host": r.get("host"), "command": r.get("command"),
                                 "exit_code": r.get("exit_code"), "ranks": [x["rank"] for x in r.get("ranks", [])]}
                                for name, r in records.items()]
    write_json_atomic(own_run, payload)
    return run
