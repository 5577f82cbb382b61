"""`dstrace sweep SPEC -o OUT`: record every configuration of a sweep spec K times, then compare.

Runs alternate (ABCABC, not AAABBB), so a drift of the machine over time spreads over every
configuration instead of biasing one. Each run is the real recorder in a subprocess,
`dstrace record -o OUT/<name>/rep<k> -- COMMAND`, its output in `OUT/<name>/rep<k>.log`. A run that
fails or is refused is a result, and the sweep goes on. A run folder that already holds a run that
ended by itself (not stopped by a signal) is kept, so an interrupted sweep continues where it stopped.
SIGTERM or Ctrl-C stop the current run and record no more, and the runs there are are still compared:
the comparison is written to `OUT/compare.json` and `OUT/compare.md`, and printed. `record_sweep` records;
the `dstrace sweep` verb (`dstrace.commands.sweep`) checks the options, then compares.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

import msgspec

from dstrace import process_group
from dstrace.errors import UserError
from dstrace.runfolder.folder import ended_run
from dstrace.say import say

SWEEP_SCHEMA = "dstrace.sweep/1"
SWEEP_FILE = "sweep.json"
COMPARE_FILE = "compare.json"
COMPARE_MARKDOWN = "compare.md"
TERM_GRACE_S = 60.0  # what a recorder gets, after SIGTERM, to write its ranks' files
SIGNAL_EXIT = 128  # dstrace record exits 128+N when signal N ended the command


class SweepStopped(Exception):
    """SIGTERM reached the sweep."""


def on_sigterm(signum, frame):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise SweepStopped()


@dataclass
class RunOutcome:
    config: str
    repeat: int
    path: str
    status: str  # what run.json says (complete | incomplete), or "timed out" / "not recorded"
    exit_code: int | None
    wall_s: float
    kept: bool  # recorded by an earlier sweep into the same folder


MAX_SWEEP_BYTES = 16 << 20
"""A sweep.json names configurations and runs: kilobytes. A larger one is not one dstrace wrote."""


class SweepRecord(msgspec.Struct):
    """What `dstrace compare` reads of a sweep folder's sweep.json (the rest is for people)."""
    schema: str
    configurations: list[str] = []
    baseline: str | None = None


def read_sweep_record(path: str) -> SweepRecord:
    """A sweep folder's sweep.json, refused (UserError, one line naming the file) when it is larger than
    MAX_SWEEP_BYTES, not a regular file, not JSON, or not of the schema dstrace writes."""
    from dstrace.runfolder.untrusted import Refused, read_bytes, unreadable

    try:
        record = msgspec.json.decode(read_bytes(path, MAX_SWEEP_BYTES), type=SweepRecord)
    except OSError as exc:
        raise UserError(f"cannot read {path}: {unreadable(path, exc)}") from None
    except Refused as exc:
        raise UserError(f"cannot read {path}: {exc}; remove it from the sweep folder") from None
    except msgspec.ValidationError as exc:
        raise UserError(f"{path} is not a sweep record dstrace wrote ({exc}); remove it from the sweep folder "
                        "or compare the run folders themselves") from None
    except msgspec.DecodeError as exc:
        raise UserError(f"{path} is not valid JSON ({exc}); remove it from the sweep folder") from None
    except RecursionError:
        raise UserError(f"{path} is corrupt JSON (nested too deeply for a sweep record); remove it from the "
                        "sweep folder") from None
    if record.schema != SWEEP_SCHEMA:
        raise UserError(f"{path} is not a {SWEEP_SCHEMA} record (schema {record.schema[:40]!r}); remove it from the "
                        "sweep folder or compare the run folders themselves")
    return record


def finished_run(run_dir: str) -> dict | None:
    """The run record of a run that ended by itself; a run stopped by a signal is to be recorded again."""
    run = ended_run(run_dir)
    if run is None or (run.get("exit_code") or 0) >= SIGNAL_EXIT:
        return None
    return run


def run_recorder(run_dir: str, argv: list[str], env: dict, timeout: float | None) -> tuple[int | None, float]:
    """One `dstrace record` in its own process group, its output in `run_dir.log`: (exit code, or None when
    it ran past `timeout`; wall seconds). Ctrl-C or a stop ends the recorder's whole group, then re-raises."""
    os.makedirs(os.path.dirname(run_dir), exist_ok=True)
    t0 = time.monotonic()
    with open(f"{run_dir}.log", "w") as log:
        log.write(" ".join(argv) + "\n")
        log.flush()
        child = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = child.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process_group.stop(child, TERM_GRACE_S)
            code = None
        except (KeyboardInterrupt, SweepStopped):
            process_group.stop(child, TERM_GRACE_S)
            raise
    return code, round(time.monotonic() - t0, 1)


def record_run(config, repeat: int, out: str, timeout: float | None) -> RunOutcome:
    from dstrace.comparison.spec import expand_env

    run_dir = os.path.join(out, config.name, f"rep{repeat}")
    if os.path.exists(run_dir):
        shutil.rmtree(run_dir)  # an unfinished attempt: start it again
    env = dict(os.environ)
    env.update({k: expand_env(v, os.environ) for k, v in config.env.items()})
    command = [sys.executable, "-m", "dstrace.cli", "record", "-o", run_dir, "--", *config.command]
    code, wall = run_recorder(run_dir, command, env, timeout)
    run = ended_run(run_dir) or {}
    status = "timed out" if code is None else run.get("status", "not recorded")
    return RunOutcome(config.name, repeat, run_dir, status, code, wall, False)


def write_sweep_file(out: str, spec, repeats: int, baseline: str | None, outcomes: list[RunOutcome]) -> None:
    from dstrace.runfolder.records import write_json_atomic

    write_json_atomic(os.path.join(out, SWEEP_FILE), {
        "schema": SWEEP_SCHEMA, "spec": spec.path, "description": spec.description, "baseline": baseline,
        "repeats": repeats, "variables": spec.variables,
        "configurations": [c.name for c in spec.configurations],
        "commands": {c.name: {"command": c.command, "env": c.env, "note": c.note} for c in spec.configurations},
        "runs": [asdict(o) for o in outcomes]})


def record_sweep(spec, configurations: list, repeats: int, out: str, baseline: str | None,
                 timeout: float | None) -> tuple[list[RunOutcome], int]:
    """Each configuration `repeats` times into `out`, alternating, `sweep.json` rewritten after every run:
    (the outcomes, the runs planned). SIGTERM or Ctrl-C stop it after the current run."""

    os.makedirs(out, exist_ok=True)
    plan = [(k, c) for k in range(1, repeats + 1) for c in configurations]
    outcomes: list[RunOutcome] = []
    write_sweep_file(out, spec, repeats, baseline, outcomes)
    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        for i, (k, config) in enumerate(plan, 1):
            step = f"[{i}/{len(plan)}] {config.name} rep{k}"
            run_dir = os.path.join(out, config.name, f"rep{k}")
            done = finished_run(run_dir)
            if done is not None:
                outcomes.append(RunOutcome(config.name, k, run_dir, done.get("status", "?"), done.get("exit_code"),
                                           0.0, True))
                say(f"{step}: {done.get('status')} (kept from an earlier sweep)")
                continue
            say(f"{step}: recording")
            o = record_run(config, k, out, timeout)
            outcomes.append(o)
            write_sweep_file(out, spec, repeats, baseline, outcomes)
            say(f"{step}: {o.status} ({o.wall_s:.0f} s, exit code {o.exit_code})"
                            + ("" if o.status == "complete" else f"; log: {o.path}.log"))
    except (KeyboardInterrupt, SweepStopped):
        say(f"stopped after {len(outcomes)} of {len(plan)} runs; comparing what was recorded")
    finally:
        signal.signal(signal.SIGTERM, previous)
    write_sweep_file(out, spec, repeats, baseline, outcomes)
    return outcomes, len(plan)
