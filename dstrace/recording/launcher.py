"""Run the user's launch command with recording injected into every rank (`dstrace record`, whose verb is
`dstrace.commands.record`).

The command runs unchanged; the injection travels in the environment (PYTHONPATH and DSTRACE_*), which
DeepSpeed's launcher, torchrun and plain python all pass on to the processes they start. After the
command ends, the run record (`run.json`, filled by `fill_run_record`) says which ranks left whole files
and whether the run is complete; dstrace exits with the command's own exit code.
"""
from __future__ import annotations

import contextlib
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import time
import uuid
import dataclasses
from dataclasses import dataclass

from dstrace.errors import UserError
from dstrace.rankset import by_rank_lines, ranks_text
from dstrace.recording import multinode, session
from dstrace.recording.window import WindowOptions
from dstrace.runfolder.folder import FolderRefused, RunFolder
from dstrace.runfolder.names import (NODES_DIR, RUN_FILE, WRITTEN_NAMES, WRITTEN_PREFIXES, WRITTEN_SUFFIXES,
                                     node_record_path)
from dstrace.runfolder.records import (GENERATE_TRIGGER, RUN_SCHEMA, TIME_TRIGGER, RankStatus, RunRecord, Window,
                                       to_json, why_no_trace, write_json_atomic)
from dstrace.say import say, warn

# The one folder put on the job's PYTHONPATH: it holds only a sitecustomize, which takes the folder off
# sys.path again and loads dstrace by location (bootstrap/sitecustomize.py).
BOOTSTRAP_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bootstrap")
_PYTHON_LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch", "deepspeed")
CUPTI_TEARDOWN = "TEARDOWN_CUPTI"
# How long the command gets to write its files after dstrace forwards a SIGTERM.
TERM_GRACE_S = 60.0


@dataclass
class RecordOptions:
    command: list[str]
    output: str | None
    window: WindowOptions
    force: bool = False
    run_id: str | None = None  # the same on every node of a run recorded node by node


def default_run_dir(command: list[str]) -> str:
    program = os.path.basename(command[0]) or "run"
    return os.path.join("traces", f"{time.strftime('%Y%m%d-%H%M%S')}-{program}")


def claim_new_dir(base: str) -> str:
    """`base`, or `base-2`, `base-3`, ...: the first that this call creates itself. mkdir is atomic, so
    two recordings started in the same second never share a folder."""
    try:
        os.makedirs(os.path.dirname(os.path.abspath(base)), exist_ok=True)
        for n in range(1, 1000):
            path = os.path.abspath(base if n == 1 else f"{base}-{n}")
            try:
                os.mkdir(path)
                return path
            except FileExistsError:
                continue
    except OSError as e:
        raise UserError(f"cannot make a run folder at {base}: {e.strerror or e}; choose one with -o") from None
    raise UserError(f"no free run folder next to {base}: choose one with -o")


def _is_plain_python(command: list[str]) -> bool:
    """`python script.py` is one rank; `python -m torch.distributed.run ...` is a launcher."""
    if not os.path.basename(command[0]).startswith("python"):
        return False
    args = command[1:]
    if "-m" in args:
        after = args[args.index("-m") + 1:]
        return not (after and after[0].startswith(_PYTHON_LAUNCHER_MODULES))
    return True


def prepare_run_dir(run_dir: str, force: bool, role: multinode.NodeRole | None = None, run_id: str = "") -> str:
    """A new or empty folder; for one node of several, a folder the other nodes of the same run may share."""
    run_dir = os.path.abspath(run_dir)
    if os.path.exists(run_dir) and not os.path.isdir(run_dir):
        raise UserError(f"{run_dir} exists and is not a folder: choose another run folder with -o")
    try:
        folder = RunFolder.scan(run_dir) if os.path.isdir(run_dir) else None
    except FolderRefused as e:
        raise UserError(f"{e}; choose another run folder with -o") from None
    if role is not None and folder is not None and not force:
        if os.path.exists(node_record_path(run_dir, role.node)):
            raise UserError(f"{role.node} of a run was already recorded in {run_dir}: choose a new folder with -o "
                            "or a new --run-id, or pass --force")
        others = {m.run_id for m in folder.records.manifests.values()} - {run_id}
        if others:
            raise UserError(f"run folder {run_dir} holds run(s) {', '.join(sorted(others))}, not {run_id}: "
                            "choose a new one with -o")
    elif folder is not None and folder.files and not force:
        raise UserError(f"run folder {run_dir} already has files: choose a new one with -o, or pass --force")
    try:
        os.makedirs(run_dir, exist_ok=True)
        if force and role is None and folder is not None:
            clear_run_files(folder)
        probe = os.path.join(run_dir, f".dstrace-write-test.{os.getpid()}")
        with open(probe, "x"):
            pass
        os.unlink(probe)
    except OSError as e:
        raise UserError(f"cannot write into the run folder {run_dir}: {e.strerror or e}; choose another with -o") from None
    return run_dir


def clear_run_files(folder: RunFolder) -> None:
    """--force: the files an earlier recording left (its ranks' files, records, caches, reports) go, so the
    new run's record counts only its own ranks; files dstrace did not write stay."""
    for f in folder.files:
        name, full = f.name, f.path
        if name == NODES_DIR and os.path.isdir(full) and not os.path.islink(full):
            shutil.rmtree(full)
        elif name.endswith(WRITTEN_SUFFIXES) or name.startswith(WRITTEN_PREFIXES) or name in WRITTEN_NAMES:
            if os.path.isdir(full) and not os.path.islink(full):
                continue
            os.unlink(full)


def injected_pythonpath(original: str | None) -> str:
    """The bootstrap folder ahead of the user's PYTHONPATH, kept byte for byte: an empty entry means the
    current folder to Python, so none is added or dropped."""
    return BOOTSTRAP_DIR if not original else BOOTSTRAP_DIR + os.pathsep + original


def child_environment(run_dir: str, run_id: str, opts: RecordOptions,
                      role: multinode.NodeRole | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = injected_pythonpath(env.get("PYTHONPATH"))
    env[session.ENV_RUN_DIR] = run_dir
    env[session.ENV_RUN_ID] = run_id
    # the time-based window falls due at one moment on every rank (`ProfilerWindow.time_tick`)
    env[session.ENV_WINDOW] = dataclasses.replace(opts.window, due=time.time() + opts.window.after).to_env()
    if opts.window.mode == "full":
        # Kineto leaves CUPTI attached after the window unless told to tear it down, which slows every
        # later kernel launch (pytorch/pytorch#144455); the user's own setting wins.
        env.setdefault(CUPTI_TEARDOWN, "1")
    if role is not None:
        env[multinode.ENV_NODE] = role.node
    if _is_plain_python(opts.command):
        env[session.ENV_SINGLE] = str(os.getpid())
    if multinode.is_deepspeed(opts.command):
        forwarded = {k: env[k] for k in (session.ENV_RUN_DIR, session.ENV_RUN_ID, session.ENV_WINDOW, CUPTI_TEARDOWN)
                     if k in env}
        path, warnings = multinode.write_deepspeed_env(run_dir, forwarded, env, os.path.expanduser("~"),
                                                       os.getcwd(), [BOOTSTRAP_DIR])
        env["DS_ENV_FILE"] = path
        for warning in warnings:
            warn(warning)
    return env


@dataclass
class Recording:
    """A launch command that ran with recording injected, as the record verb finishes it: the run record as
    it stood when the command started (`fill_run_record` fills it from what the ranks left), the run folder,
    where the record goes (run.json, or this node's record when the run has several nodes), and the
    command's exit code, which is `dstrace record`'s whatever befalls the record."""
    run: RunRecord
    run_dir: str
    record_path: str
    exit_code: int
    role: multinode.NodeRole | None = None

    @property
    def node(self) -> str | None:
        return self.role.node if self.role else None

    def write(self) -> None:
        write_json_atomic(self.record_path, _record_json(self.run, self.role))

    def report(self) -> None:
        """What the run left, as `record` prints it once the record is written."""
        _report(self.run, self.run_dir)
        if self.role is not None:
            say(f"{self.role.node} of {self.role.nnodes} done; once every node is: dstrace gather {self.run_dir} "
                "(shared folder) or dstrace gather OUT NODE_FOLDER...")


def record(opts: RecordOptions) -> Recording:
    """Run the command with every rank traced into a new (or, for one node of several, shared) run folder;
    return once it has ended."""
    role = multinode.node_role(opts.command, dict(os.environ))
    try:
        run_id = multinode.agreed_run_id(opts.run_id, opts.command, dict(os.environ))
    except ValueError as e:
        raise UserError(str(e)) from None
    if role is not None and run_id is None:
        raise UserError(f"this is {role.node} of a {role.nnodes}-node run: every node's dstrace record needs the "
                        "same run id; pass --run-id ID (e.g. the job id) or torchrun's --rdzv-id")
    run_id = run_id or uuid.uuid4().hex[:12]
    if opts.output is None and role is None:
        run_dir = claim_new_dir(default_run_dir(opts.command))
    else:
        run_dir = prepare_run_dir(opts.output or os.path.join("traces", run_id), opts.force, role, run_id)
    run = RunRecord(schema=RUN_SCHEMA, run_id=run_id, command=opts.command,
                    cwd=os.getcwd(), started=time.time(), status="running")
    run_file = os.path.join(run_dir, RUN_FILE) if role is None else node_record_path(run_dir, role.node)
    _write_first_record(run_file, _record_json(run, role))
    executable = shutil.which(opts.command[0])
    if executable is None:
        run.status, run.exit_code = "incomplete", 127
        run.problems.append(f"command not found: {opts.command[0]}")
        write_json_atomic(run_file, _record_json(run, role))
        raise UserError(f"command not found: {opts.command[0]!r}; check the command after '--' "
                        "(is it installed and on PATH?)", code=127)
    say(f"recording into {run_dir}")
    code = _run_child([executable] + opts.command[1:], child_environment(run_dir, run.run_id, opts, role))
    return Recording(run=run, run_dir=run_dir, record_path=run_file, exit_code=code, role=role)


def _write_first_record(run_file: str, payload: dict) -> None:
    """The run record before the job starts: where it cannot be written (a folder, device or FIFO planted at
    its name), the job is not started."""
    try:
        os.makedirs(os.path.dirname(run_file), exist_ok=True)
        write_json_atomic(run_file, payload)
    except OSError as e:
        raise UserError(f"cannot write the run record {run_file}: {e.strerror or e}; the command was not "
                        "started") from None


def _record_json(run: RunRecord, role: multinode.NodeRole | None) -> dict:
    """run.json, or a node record: the same record with the node it covers."""
    out = to_json(run)
    if role is not None:
        out.update(node=role.node, nnodes=role.nnodes, host=socket.gethostname())
    return out


def _run_child(command: list[str], env: dict[str, str]) -> int:
    """Run the command; pass SIGTERM/SIGHUP on, and a SIGINT that did not reach it (docs/recording.md). A signal
    ignored when `record` started (SIGHUP under nohup) stays ignored: the command inherits SIG_IGN, as it would
    have, and `record` passes on none. Once it has ended, SIGINT is let go by (`_after_the_command`)."""
    try:
        child = subprocess.Popen(command, env=env)
    except OSError as e:
        raise UserError(f"cannot start {command[0]!r}: {e.strerror}; check the command after '--'",
                        code=126) from None
    forwarded = {}
    group_sigint = _GroupSigint.start()

    def forward(signum, frame):
        forwarded.setdefault("at", time.monotonic())
        child.send_signal(signum)

    def on_sigint(signum, frame):
        if not group_sigint.reached_the_job(child.pid):
            child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGHUP)
                if signal.getsignal(sig) is not signal.SIG_IGN}
    previous[signal.SIGINT] = signal.signal(signal.SIGINT, on_sigint)
    try:
        while True:
            try:
                code = child.wait(timeout=1.0)
                break
            except subprocess.TimeoutExpired:
                if "at" in forwarded and time.monotonic() - forwarded["at"] > TERM_GRACE_S:
                    child.kill()
    finally:
        signal.signal(signal.SIGINT, _after_the_command)
        for sig, handler in previous.items():
            if sig != signal.SIGINT:
                signal.signal(sig, handler)
        group_sigint.stop()
    return 128 - code if code < 0 else code


def _after_the_command(signum, frame) -> None:
    """SIGINT once the command has ended: the rest of a Ctrl-C burst whose first press ended the job (a terminal
    sends each to `record` too). It no longer ends `record` while it writes the run record and reduces the traces:
    the job ended as it would have, and run.json keeps its exit code, which `record` returns (CASES.md)."""


GROUP_SIGNAL_WAIT_S = 0.5
"""How long `record` waits for its sentinel to say that a SIGINT was sent to the whole process group."""


@dataclass
class _GroupSigint:
    """Tells a SIGINT sent to `record`'s whole process group (a terminal's Ctrl-C, `kill -INT -PGID`) from one
    sent to `record` alone (`kill -INT PID`). siginfo cannot: `kill` and `killpg` both give SI_USER. A sentinel
    process in the group, SIGINT blocked, takes each SIGINT it is sent with sigtimedwait and writes a byte: a
    SIGINT that reached the sentinel reached the whole group, the job too when it shares the group."""
    pid: int
    reads: int

    @classmethod
    def start(cls) -> "_GroupSigint":
        reads, writes = os.pipe()
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            pid = os.fork()
            if pid == 0:
                _sentinel(writes)
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        os.close(writes)
        return cls(pid=pid, reads=reads)

    def reached_the_job(self, job_pid: int) -> bool:
        """Whether the SIGINT `record` just took reached the job already: it reached the sentinel, and the job
        is in `record`'s process group. Bytes left by earlier signals are taken with it (tests/recording/CASES.md:
        SIGINTs in quick succession)."""
        try:
            shares_the_group = os.getpgid(job_pid) == os.getpgrp()
        except ProcessLookupError:
            return True
        reached_the_group = bool(select.select([self.reads], [], [], GROUP_SIGNAL_WAIT_S)[0])
        if reached_the_group:
            os.read(self.reads, 4096)
        return reached_the_group and shares_the_group

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        os.close(self.reads)


def _sentinel(writes: int) -> None:
    """The sentinel's life: one byte per SIGINT; gone when `record` is (SIGTERM and SIGHUP are `record`'s to
    handle: a group's would otherwise end the sentinel first)."""
    try:
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        parent = os.getppid()
        while os.getppid() == parent:
            if signal.sigtimedwait({signal.SIGINT}, 1.0) is not None:
                os.write(writes, b"i")
    finally:
        os._exit(0)


def fill_run_record(run_dir: str, run: RunRecord, exit_code: int, node: str | None = None) -> None:
    """Fill the run record from the files the ranks left: which are whole, which ranks are missing.

    For one node of several (`node`), only the ranks that node started count, and missing ranks are
    left to `dstrace gather`, which sees every node.
    """
    run.ended, run.exit_code = time.time(), exit_code
    try:
        folder = RunFolder.scan(run_dir)  # listed and its manifests read once
    except FolderRefused as e:
        raise UserError(str(e)) from None
    traces: dict[int, list[str]] = {}
    for f in folder.traces:
        if f.rank is not None:
            traces.setdefault(f.rank, []).append(f.name)
    world = 0
    no_trace: dict[int, str] = {}
    windows: dict[int, str] = {}
    for read in folder.records.manifest_reads:
        name, m = read.file.name, read.record
        if m is None:
            run.problems.append(f"{name}: unreadable manifest ({read.problem})")
            continue
        if node is not None and m.env.get(multinode.ENV_NODE) != node:
            continue
        status = m.status if m.status != "running" else "crashed"
        if status != "complete":
            detail = f": {exception_text(m.exit_error)}" if m.exit_error else ""
            run.problems.append(f"rank {m.rank} {status}{detail}")
        lost = list(m.lost)
        if m.window and m.window.trace_file and m.window.trace_file not in traces.get(m.rank, []):
            lost.append(f"its trace {m.window.trace_file} is not in the folder")
        if lost:
            run.problems.append(f"rank {m.rank} lost what it recorded: {'; '.join(lost)}")
        run.ranks.append(RankStatus(rank=m.rank, status=status, manifest=name, traces=traces.get(m.rank, [])))
        reason = why_no_trace(m) if not traces.get(m.rank) else None
        if reason:
            no_trace[m.rank] = f"no trace: {reason}"
        elif m.window and m.window.trace_file and m.window.trigger:
            windows[m.rank] = f"window on {window_text(m.window)}"
        world = max(world, m.world_size)
    found = {r.rank for r in run.ranks}
    run.world_size = world or None
    run.missing_ranks = [r for r in range(world) if r not in found] if node is None else []
    if run.missing_ranks:
        run.problems.append(f"no manifest from {ranks_text(run.missing_ranks)}")
    run.problems.extend(folder.unrecorded_notes())
    if not run.ranks:
        run.problems.append("no rank was recorded: did the command start Python processes that "
                            "use torch, DeepSpeed or transformers?")
    if exit_code != 0:
        run.problems.append(f"the command exited with code {exit_code}")
    run.notes = by_rank_lines(windows) + by_rank_lines(no_trace)
    complete = not run.problems and all(r.status == "complete" for r in run.ranks)
    run.status = "complete" if complete else "incomplete"


def window_text(w: Window) -> str:
    """Which trigger opened a rank's window and what it covered, as `record` prints it."""
    if w.stood_aside:
        return f"{_window_text(w)}; then dstrace stood aside: {w.stood_aside}"
    return _window_text(w)


def _window_text(w: Window) -> str:
    if w.trigger == TIME_TRIGGER:
        return (f"time: {w.seconds:g} s at module or collective calls, {w.after_s:g} s after recording started, "
                "once the profiler was ready")
    if w.trigger == GENERATE_TRIGGER:
        return f"generate steps: call {w.call}, steps {', '.join(map(str, w.recorded_steps))}"
    # no iteration whole: the rank ended inside the first, unless dstrace stood aside there (`window_text` says so)
    ended = "" if w.stood_aside else " (the rank ended inside the first)"
    steps = ", ".join(map(str, w.recorded_steps)) or f"none whole{ended}"
    return f"{w.trigger}: iterations {steps}"


def exception_text(error: dict) -> str:
    """An exception as Python prints its last line: `Type: message`, or `Type` alone for an empty message."""
    message = error.get("message")
    return f"{error.get('type')}: {message}" if message not in (None, "") else str(error.get("type"))


_RANK_ENDED = re.compile(r"rank \d+ (failed|crashed|interrupted|terminated)\b")
MESSAGE_LINES = 12
"""Lines of a crashed rank's message printed after its first (whole, however long); run.json and the rank's
manifest hold them all."""


def _report(run: RunRecord, run_dir: str) -> None:
    """The summary, then how each rank that did not complete ended (its exception as the job printed it),
    then what each rank recorded or why it did not, then the other problems."""
    traces = sum(len(r.traces) for r in run.ranks)
    say(f"{run.status} run: {len(run.ranks)} rank(s) of world {run.world_size}, {traces} trace(s), in {run_dir}")
    ended = [p for p in run.problems if _RANK_ENDED.match(p)]
    for text in ended + run.notes + [p for p in run.problems if p not in ended]:
        first, *rest = text.split("\n")
        say(first)
        for line in rest[:MESSAGE_LINES]:
            say(f"  {line.expandtabs()}")
        if len(rest) > MESSAGE_LINES:
            say(f"  ({len(rest) - MESSAGE_LINES} more line(s) in the rank's manifest)")
