"""The runs of `dstrace try`: each one `dstrace record --mode MODE` in a subprocess, as it is or with the
overrides, in the order of the plan, its folder `DIR/<side>/rep<k>` and its output in `rep<k>.log` beside it."""
from __future__ import annotations

import os
import sys

from dstrace.say import say


class AsIsFailed(Exception):
    """A run of the unchanged command failed: nothing to compare the change with."""

    def __init__(self, code: int | None):
        super().__init__(code)
        self.code = code


def _record(run_dir: str, command: list[str], env: dict, mode: str, timeout: float | None):
    """One `dstrace record` run in a subprocess; (exit code or None when timed out, wall seconds)."""
    from dstrace.comparison.sweep import run_recorder

    argv = [sys.executable, "-m", "dstrace.cli", "record", "--mode", mode, "-o", run_dir, "--", *command]
    return run_recorder(run_dir, argv, env, timeout)


def manifests(run_dir: str) -> dict:
    """The readable manifests of a run folder by rank; an unreadable one is the comparison's to warn about."""
    from dstrace.runfolder.folder import FolderRefused, RunFolder

    try:
        return RunFolder.scan(run_dir).records.manifests if os.path.isdir(run_dir) else {}
    except FolderRefused:
        return {}


def _error(run_dir: str, manifests: dict) -> str:
    """The job's error in one line: a rank's exit error, else the last line of the run's log."""
    from dstrace.runfolder.records import error_line

    for _, m in sorted(manifests.items()):
        if m.exit_error:
            return f"rank {m.rank}: {error_line(m.exit_error)}"
    try:
        with open(f"{run_dir}.log", errors="replace") as f:
            lines = [x.strip() for x in f.read()[-20000:].splitlines() if x.strip()]
    except OSError:
        return "no log"
    job = [x for x in lines if not x.startswith("dstrace:")]
    return (job or lines or ["no output"])[-1][:300]


def record_all(out: str, plan, command: list[str], sides: dict, mode: str, timeout: float | None):
    """Every run of the plan, in order; AsIsFailed when a run as-is fails."""
    from dstrace.runfolder.folder import ended_run
    from dstrace.trying.result import AS_IS, TryRun

    runs: list[TryRun] = []
    for i, (k, name) in enumerate(plan, 1):
        run_dir = os.path.join(out, name, f"rep{k}")
        say(f"[{i}/{len(plan)}] {name} rep{k}: recording")
        code, wall = _record(run_dir, command, sides[name], mode, timeout)
        status = "timed out" if code is None else (ended_run(run_dir) or {}).get("status", "not recorded")
        run = TryRun(name, k, run_dir, code, status, None if code == 0 else _error(run_dir, manifests(run_dir)), wall)
        runs.append(run)
        say(f"[{i}/{len(plan)}] {name} rep{k}: {status} ({wall:.0f} s, exit code {code})"
            + ("" if code == 0 else f": {run.error}; log: {run_dir}.log"))
        if name == AS_IS and code != 0:
            raise AsIsFailed(code)
    return runs
