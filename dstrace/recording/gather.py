"""One run folder, and its run.json, from the nodes of a run (`dstrace gather`, `dstrace.commands.gather`).

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

from dstrace.errors import UserError
from dstrace.rankset import ranks_text
from dstrace.recording.launcher import fill_run_record
from dstrace.runfolder.files import OutputRefused, copy_regular_atomic, make_output_folder
from dstrace.runfolder.folder import (MANIFEST, REDUCTION, TRACE, FolderRefused, RunFolder, node_files,
                                      node_records)
from dstrace.runfolder.names import MANIFEST_SUFFIX, NODES_DIR, RUN_FILE, TRACE_SUFFIXES, rank_in_name
from dstrace.runfolder.records import (RUN_SCHEMA, RankStatus, RunRecord, read_json_object, read_manifest,
                                       read_node_record, to_json, write_json_atomic)

LAUNCHER_RECORD = "launcher"  # node record name for a run.json that `dstrace record` wrote for a whole launch


def _scan(folder: str) -> RunFolder:
    try:
        return RunFolder.scan(folder)
    except FolderRefused as e:
        raise UserError(f"{e}; give a folder you can read") from None


def _rank_files(folder: str) -> list[str]:
    return [f.name for f in _scan(folder).of_kind(MANIFEST, TRACE, REDUCTION)]


def _node_files(run_dir: str) -> list[str]:
    """`nodes/*.json` of a run folder (none without nodes/), as `folder.node_files` lists them."""
    try:
        return [f.path for f in node_files(run_dir)]
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


def _plan(run_dir: str, sources: list[str]) -> list[tuple[str, str]]:
    """(source path, destination path) for every file to copy; refuses conflicting files."""
    plan: dict[str, str] = {}
    trace_owner: dict[int, str] = {}
    for name in _rank_files(run_dir):
        if name.endswith(TRACE_SUFFIXES) and rank_in_name(name) is not None:
            trace_owner[rank_in_name(name)] = os.path.join(run_dir, name)
    for src in sources:
        if not os.path.isdir(src):
            raise UserError(f"{src} is not a folder: give the run folders the nodes wrote")
        entries = [(os.path.join(src, n), os.path.join(run_dir, n)) for n in _rank_files(src)]
        nodes_dir = os.path.join(src, NODES_DIR)
        _refuse_link(nodes_dir, "reads no folder through one")
        entries += [(n, os.path.join(run_dir, NODES_DIR, os.path.basename(n))) for n in _node_files(src)]
        run_file = os.path.join(src, RUN_FILE)
        if os.path.isfile(run_file) and not _is_gathered(run_file):
            entries.append((run_file, os.path.join(run_dir, NODES_DIR, f"{os.path.basename(src)}.json")))
        if not entries:
            raise UserError(f"{src} holds no dstrace files (manifests, traces, kept reductions, node records)")
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
            rank = rank_in_name(os.path.basename(source)) if source.endswith(TRACE_SUFFIXES) else None
            if rank is not None:
                owner = trace_owner.setdefault(rank, source)
                if os.path.basename(owner) != os.path.basename(source):
                    raise UserError(f"two traces claim rank {rank}: {owner} and {source}")
            plan.setdefault(dest, source)
    return [(s, d) for d, s in plan.items() if not os.path.exists(d)]


def _check_one_run(run_dir: str, plan: list[tuple[str, str]]) -> str:
    paths = [os.path.join(run_dir, n) for n in _rank_files(run_dir) if n.endswith(MANIFEST_SUFFIX)]
    paths += [s for s, _ in plan if s.endswith(MANIFEST_SUFFIX)]
    runs: dict[str, list[str]] = {}
    for path in paths:
        try:
            runs.setdefault(read_manifest(path).run_id, []).append(path)
        except (OSError, ValueError, TypeError):
            continue
    if not runs:  # a run `dstrace reduce` wrote has no manifests: its node records name the run
        for path in _node_record_paths(run_dir) + [s for s, d in plan if os.path.dirname(d) == os.path.join(run_dir, NODES_DIR)]:
            try:
                runs.setdefault(read_node_record(path)["run_id"], []).append(path)
            except (OSError, ValueError, TypeError):
                continue
    if len(runs) > 1:
        listing = "; ".join(f"run {rid}: {os.path.dirname(p[0])}" for rid, p in sorted(runs.items()))
        raise UserError(f"the folders hold different runs ({listing}); give every node the same --run-id")
    if not runs:
        raise UserError("no rank manifest or node record in the given folders: nothing to gather")
    return next(iter(runs))


def _node_record_paths(run_dir: str) -> list[str]:
    return _node_files(run_dir)


def _reduced_ranks(run: RunRecord, records: dict[str, dict]) -> None:
    """The ranks of a run without manifests, as the node records of `dstrace reduce` list them."""
    for r in records.values():
        run.ranks.extend(RankStatus(**x) for x in r.get("ranks", []))
        run.problems.extend(r.get("problems", []))
        run.notes.extend(r.get("notes", []))
    run.ranks.sort(key=lambda x: x.rank)
    run.world_size = max((r.get("world_size") or 0 for r in records.values()), default=0) or None
    found = {x.rank for x in run.ranks}
    run.missing_ranks = [r for r in range(run.world_size or 0) if r not in found]
    if run.missing_ranks:
        run.problems.append(f"no reduction of {ranks_text(run.missing_ranks)}")
    if not run.ranks:
        run.problems.append("no rank was reduced")


def _copy(source: str, dest: str) -> None:
    try:
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        copy_regular_atomic(source, dest)
    except (OSError, ValueError) as e:
        raise UserError(f"cannot copy {source}: {e}") from None


def _node_records(run_dir: str) -> dict[str, dict]:
    try:
        return node_records(run_dir)
    except FolderRefused as e:
        raise UserError(f"{e}; give a folder you can read") from None
    except ValueError as e:
        raise UserError(str(e)) from None


def gather(run_dir: str, node_folders: list[str]) -> RunRecord:
    """Merge the node folders into `run_dir` and write its run.json; return the run record."""
    run_dir = os.path.abspath(run_dir)
    sources = [os.path.abspath(n) for n in node_folders if os.path.abspath(n) != run_dir]
    if not sources and not os.path.isdir(run_dir):
        raise UserError(f"{run_dir} is not a folder: give the shared run folder, or OUT and the node folders")
    try:
        make_output_folder(run_dir, "give gather a folder to write the run into")
    except OutputRefused as e:
        raise UserError(str(e)) from None
    _refuse_link(os.path.join(run_dir, NODES_DIR), "writes no file through one")
    plan = _plan(run_dir, sources)
    run_id = _check_one_run(run_dir, plan)
    own_run = os.path.join(run_dir, RUN_FILE)
    if os.path.isfile(own_run) and not _is_gathered(own_run):
        plan.append((own_run, os.path.join(run_dir, NODES_DIR, f"{LAUNCHER_RECORD}.json")))
    for source, dest in plan:
        _copy(source, dest)
    records = _node_records(run_dir)
    first = next(iter(records.values()), {})
    run = RunRecord(schema=RUN_SCHEMA, run_id=run_id, command=first.get("command", []), cwd=first.get("cwd", ""),
                    started=min((r.get("started") or 0 for r in records.values()), default=0.0),
                    status="running")
    codes = {name: r.get("exit_code") for name, r in records.items()}
    if _scan(run_dir).of_kind(MANIFEST):
        fill_run_record(run_dir, run, 0)
    else:
        _reduced_ranks(run, records)
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
