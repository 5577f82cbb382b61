"""Signals, forks, execs and the job's own profiler around a recording: the job ends as it would have without
dstrace, and each rank's trace is whole or recorded as lost with the reason (tests/recording/CASES.md)."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from dstrace.recording.launcher import TERM_GRACE_S
from dstrace.recording.session import WRITING_NOTE
from tests.fixtures.paths import ROOT, SCRIPTS
from tests.fixtures.processes import cpu_env, dstrace, free_port, start_dstrace, tool, torchrun
from tests.fixtures.runs import manifests, read_json, trace_paths
from tests.fixtures.traces import read_trace

LONG_EXPORT = os.path.join(SCRIPTS, "long_export.py")
# The single-rank jobs below follow optimizer.step: the window is iterations 2-4 of 8.
TRAINING = """
import torch
m = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(m.parameters(), lr=0.1)
for i in range(8):
    m(torch.randn(4, 8)).sum().backward()
    opt.step()
"""


def _job(tmp_path, body: str, name: str = "job.py") -> str:
    path = tmp_path / name
    path.write_text(body)
    return str(path)


def _start(run_dir: str, *command: str, **popen) -> subprocess.Popen:
    return start_dstrace("record", "-o", run_dir, "--", *command, **popen)


def _record(run_dir: str, *command: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return dstrace("record", "-o", run_dir, "--", *command, timeout=timeout)


def _wait_for_a_trace_being_written(run_dir: str, proc: subprocess.Popen, rank: int = 0) -> None:
    """Until rank `rank` writes its trace: Kineto's raw JSON, `.<worker>.<ms>.pt.trace.json.gz.*.json.tmp`."""
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if os.path.isdir(run_dir) and any(n.endswith(".json.tmp") and f"_rank{rank}." in n for n in os.listdir(run_dir)):
            return
        time.sleep(0.002)
    raise AssertionError(f"rank {rank} never wrote a trace: {proc.communicate(timeout=60)}")


def _whole_trace(run_dir: str, rank: int = 0) -> str:
    """The rank's one trace, a whole gzip of a whole JSON document, and no raw JSON left beside it."""
    (trace,) = [t for t in trace_paths(run_dir) if f"_rank{rank}." in os.path.basename(t)]
    assert read_trace(trace)["traceEvents"]
    assert not [n for n in os.listdir(run_dir) if n.endswith(".json.tmp")]
    return trace


# ---- the job's own profiler ------------------------------------------------------------------------------
@pytest.mark.parametrize("at, recorded, said", [
    (3, [2], "iterations 2; then dstrace stood aside"),
    # in the window's first iteration: none whole, and not said to be the rank's end
    (2, [], "iterations none whole; then dstrace stood aside")], ids=["after-one-iteration", "in-the-first"])
def test_the_jobs_own_profiler_opened_in_the_window_works_and_dstrace_stands_aside(tmp_path, at, recorded, said):
    """Exit 139 (a segfault) before: two profilers in one process. Now dstrace's window ends where the job's
    profiler starts, its trace is written, and the manifest says why the window ended there."""
    job = _job(tmp_path, TRAINING.replace("    opt.step()\n", f"""    opt.step()
    if i == {at}:
        with torch.profiler.profile() as prof:
            m(torch.randn(4, 8)).sum()
        print("own profiler:", len(prof.key_averages()) > 0, flush=True)
"""))
    run_dir = str(tmp_path / "run")
    r = _record(run_dir, sys.executable, job)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "own profiler: True" in r.stdout
    (m,) = manifests(run_dir).values()
    assert m["status"] == "complete"
    assert m["window"]["recorded_steps"] == recorded
    assert said in r.stderr, r.stderr[-3000:]
    assert m["window"]["stood_aside"].startswith("the job started its own torch.profiler (torch.autograd.profiler.profile,")
    assert f"{job}:" in m["window"]["stood_aside"]
    assert os.path.basename(_whole_trace(run_dir)) == m["window"]["trace_file"]
    assert "then dstrace stood aside: the job started its own torch.profiler" in r.stderr


def test_a_job_profiling_itself_before_the_window_keeps_the_only_profiler(tmp_path):
    """The job's profiler runs first: dstrace never opens a window of its own, and says why."""
    job = _job(tmp_path, textwrap.dedent("""
        import torch
        with torch.autograd.profiler.profile() as prof:
            torch.ones(3) + 1
        """) + TRAINING)
    run_dir = str(tmp_path / "run")
    r = _record(run_dir, sys.executable, job)
    assert r.returncode == 0, r.stderr[-3000:]
    (m,) = manifests(run_dir).values()
    assert m["window"]["trigger"] is None and not trace_paths(run_dir)
    assert "no trace: dstrace stood aside: the job started its own torch.profiler" in r.stderr


# ---- fork and exec -----------------------------------------------------------------------------------------
def test_a_fork_after_the_window_opened_exits_and_writes_nothing(tmp_path):
    """The child hung at exit in Kineto's config-loader destructor (pytorch/kineto#998); a double-forked
    daemon never exited. Now both exit with their own codes, and only the rank writes a trace."""
    done = tmp_path / "daemon-done"
    job = _job(tmp_path, TRAINING.replace("    opt.step()\n", f"""    opt.step()
    if i == 3:
        import os, sys
        child = os.fork()
        if child == 0:
            if os.fork() == 0:  # the daemon: its parent exits at once, it runs on alone
                os.setsid()
                open({str(done)!r}, "w").write(str(os.getpid()))
                sys.exit(0)
            sys.exit(5)
        print("child exited with", os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]), flush=True)
"""))
    run_dir = str(tmp_path / "run")
    proc = _start(run_dir, sys.executable, job, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=120)
        deadline = time.time() + 30
        while time.time() < deadline and not done.exists():
            time.sleep(0.1)
        daemon = int(done.read_text())
        while time.time() < deadline and _running(daemon):
            time.sleep(0.1)
        assert not _running(daemon)
    finally:  # a hung child or daemon would outlive the test
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        if done.exists() and _running(int(done.read_text())):
            os.kill(int(done.read_text()), signal.SIGKILL)
    assert proc.returncode == 0, err[-3000:]
    assert "child exited with 5" in out
    (m,) = manifests(run_dir).values()
    assert m["status"] == "complete" and m["window"]["recorded_steps"] == [2, 3, 4]
    _whole_trace(run_dir)


def _running(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_fork_pool_used_in_the_window_and_terminated_writes_one_trace(tmp_path):
    """On ff03bd2 each worker of the pool wrote a rank-0 trace of its own (three in all): a worker inherits the
    open window, and its optimizer steps closed it. Workers that only compute wrote none even there (the
    SIGTERM of terminate() killed them unhandled), so the workers step an optimizer, as a job's would."""
    job = _job(tmp_path, textwrap.dedent("""
        import multiprocessing, time, torch
        def work(x):
            m = torch.nn.Linear(8, 8)
            opt = torch.optim.SGD(m.parameters(), lr=0.1)
            for _ in range(6):
                m(torch.randn(4, 8)).sum().backward()
                opt.step()
            return float(torch.ones(3).sum()) * x
        """) + TRAINING.replace("    opt.step()\n", """    opt.step()
    if i == 3:
        pool = multiprocessing.get_context("fork").Pool(2)
        print(pool.map(work, [1, 2, 3]), flush=True)
        time.sleep(0.3)
        pool.terminate()
        pool.join()
"""))
    run_dir = str(tmp_path / "run")
    r = _record(run_dir, sys.executable, job, timeout=120)
    assert r.returncode == 0 and "[3.0, 6.0, 9.0]" in r.stdout, r.stderr[-3000:]
    (m,) = manifests(run_dir).values()
    assert m["status"] == "complete" and m["window"]["recorded_steps"] == [2, 3, 4]
    _whole_trace(run_dir)


def test_a_rank_that_execs_itself_is_recorded_once(tmp_path):
    """Rank 0's trace was written twice (by each program the process ran); analyze then refused the folder."""
    job = _job(tmp_path, TRAINING + """
import os, sys
if len(sys.argv) == 1:
    os.execv(sys.executable, [sys.executable, __file__, "again"])
print("the second program ran", flush=True)
""")
    run_dir = str(tmp_path / "run")
    r = _record(run_dir, sys.executable, job)
    assert r.returncode == 0 and "the second program ran" in r.stdout, r.stderr[-3000:]
    (m,) = manifests(run_dir).values()
    assert m["status"] == "complete"
    assert any("replaced itself" in e for e in m["hook_errors"])
    _whole_trace(run_dir)


# ---- a signal while a rank writes its trace ------------------------------------------------------------------
def test_sigterm_while_the_trace_is_written_keeps_it_whole(tmp_path):
    """One SIGTERM while the rank writes: the trace was lost and the note said the window was never reached.
    Now the signal waits for the write, then ends the job as it would have (143)."""
    run_dir = str(tmp_path / "run")
    proc = _start(run_dir, sys.executable, LONG_EXPORT, "--ops", "1500", "--after", "60")
    _wait_for_a_trace_being_written(run_dir, proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert "loop done" not in out
    (m,) = manifests(run_dir).values()
    assert m["status"] == "terminated" and m["lost"] == [], m
    assert os.path.basename(_whole_trace(run_dir)) == m["window"]["trace_file"]
    assert "never reached" not in err


def test_ctrl_c_twice_while_the_trace_is_written_at_exit_keeps_it_whole(tmp_path):
    run_dir = str(tmp_path / "run")
    proc = _start(run_dir, sys.executable, LONG_EXPORT, "--ops", "1500", "--interrupt-wait", start_new_session=True)
    assert proc.stdout.readline().strip() == "in-window"
    os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C: the whole foreground group
    _wait_for_a_trace_being_written(run_dir, proc)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGINT, err[-3000:]
    (m,) = manifests(run_dir).values()
    assert m["status"] == "interrupted" and m["lost"] == [], m
    assert os.path.basename(_whole_trace(run_dir)) == m["window"]["trace_file"]


def test_ranks_keep_their_traces_when_torchrun_ends_them_after_one_rank_failed(tmp_path):
    """Rank 1 dies while rank 0 writes; torchrun then sends SIGTERM to rank 0: its trace is whole."""
    run_dir = str(tmp_path / "run")
    proc = _start(run_dir, *torchrun(), "--monitor-interval", "0.05", LONG_EXPORT, "--ops", "3000", "--crash-rank", "1",
                  "--after", "60")
    out, err = proc.communicate(timeout=300)
    assert proc.returncode != 0
    ms = manifests(run_dir)
    assert ms[1]["status"] == "running" and ms[0]["status"] == "terminated", err[-3000:]
    assert ms[0]["lost"] == []
    assert os.path.basename(_whole_trace(run_dir, 0)) == ms[0]["window"]["trace_file"]
    assert "rank 0: no trace" not in err


def test_a_rank_killed_while_it_writes_its_trace_says_so(tmp_path):
    """SIGKILL (a launcher's last resort) cannot wait: the manifest says the trace was being written."""
    run_dir = str(tmp_path / "run")
    proc = _start(run_dir, sys.executable, LONG_EXPORT, "--ops", "1500", "--after", "60")
    _wait_for_a_trace_being_written(run_dir, proc)
    os.kill(manifests(run_dir)[0]["pid"], signal.SIGKILL)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGKILL
    (m,) = manifests(run_dir).values()
    assert m["lost"] == [WRITING_NOTE]
    run = read_json(os.path.join(run_dir, "run.json"))
    assert f"rank 0 lost what it recorded: {WRITING_NOTE}" in run["problems"]
    assert "never reached" not in err and "ended before" not in err


# ---- record's own signals ------------------------------------------------------------------------------------
def test_sighup_under_nohup_is_not_passed_on(tmp_path):
    """Under nohup (SIGHUP ignored), record forwarded a SIGHUP and killed the job TERM_GRACE_S later."""
    job = _job(tmp_path, f"import time\ntime.sleep({TERM_GRACE_S + 3})\nprint('ran to the end', flush=True)\n")
    run_dir = str(tmp_path / "run")
    proc = _start(run_dir, sys.executable, job, preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    deadline = time.time() + 60
    while time.time() < deadline and not (os.path.isdir(run_dir) and manifests(run_dir)):
        time.sleep(0.1)
    proc.send_signal(signal.SIGHUP)
    out, err = proc.communicate(timeout=TERM_GRACE_S + 120)
    assert proc.returncode == 0 and "ran to the end" in out, err[-3000:]


def test_the_job_sees_its_own_signal_handlers(tmp_path):
    """signal.getsignal(SIGTERM) showed dstrace's handler; the job sees what it would have seen."""
    job = _job(tmp_path, textwrap.dedent("""
        import signal, torch
        torch.nn.Linear(2, 2)(torch.ones(2))
        print(signal.getsignal(signal.SIGTERM) is signal.SIG_DFL,
              signal.signal(signal.SIGTERM, signal.SIG_DFL) is signal.SIG_DFL, flush=True)
        """))
    run_dir = str(tmp_path / "run")
    r = _record(run_dir, sys.executable, job)
    assert r.returncode == 0 and r.stdout.strip() == "True True", (r.stdout, r.stderr[-3000:])
    assert manifests(run_dir)[0]["status"] == "complete"


def test_a_run_folder_named_with_a_newline_and_a_backslash_keeps_its_trace(tmp_path):
    """Kineto wrote the trace under an escaped name and every trace was lost ("is the disk full?")."""
    job = _job(tmp_path, TRAINING)
    run_dir = str(tmp_path / "new\nline\\back")
    r = _record(run_dir, sys.executable, job)
    assert r.returncode == 0, r.stderr[-3000:]
    (m,) = manifests(run_dir).values()
    assert m["lost"] == [] and os.path.basename(_whole_trace(run_dir)) == m["window"]["trace_file"]
    assert sorted(os.listdir(tmp_path)) == sorted(["job.py", "new\nline\\back"])


def test_a_running_recording_is_not_said_to_have_ended(tmp_path):
    """analyze on a recording still running said "the rank ended before the time-based window"."""
    job = _job(tmp_path, "import time, torch\ntorch.nn.Linear(2, 2)(torch.ones(2))\ntime.sleep(60)\n")
    run_dir = str(tmp_path / "run")
    proc = _start(run_dir, sys.executable, job, start_new_session=True)
    try:
        deadline = time.time() + 60
        while time.time() < deadline and not (os.path.isdir(run_dir) and manifests(run_dir)):
            time.sleep(0.1)
        r = dstrace("analyze", run_dir, timeout=300)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=60)
    assert "Traceback" not in r.stderr
    assert "the rank had not ended when its manifest was last written" in r.stderr, r.stderr
    assert "ended before" not in r.stderr


def _sigint_job(tmp_path) -> str:
    """Counts the SIGINTs it gets (its handler is in place before it prints 'ready'), until 2 s after the
    first or 3 s in all: a second one would be counted too."""
    return _job(tmp_path, textwrap.dedent("""
        import signal, sys, time
        got = []
        signal.signal(signal.SIGINT, lambda *a: got.append(time.time()))
        print("ready", flush=True)
        deadline = time.time() + 3
        while time.time() < (got[0] + 2 if got else deadline):
            time.sleep(0.05)
        print("interrupts", len(got), flush=True)
        sys.exit(130 if got else 0)
        """))


def test_sigint_to_the_record_pid_alone_reaches_the_job_once(tmp_path):
    """`kill -INT <record pid>` was ignored (record left Ctrl-C to the terminal); now the job gets it, once."""
    run_dir = str(tmp_path / "run")
    proc = _start(run_dir, sys.executable, _sigint_job(tmp_path), start_new_session=True)
    assert proc.stdout.readline().strip() == "ready"
    os.kill(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert out.split() == ["interrupts", "1"] and proc.returncode == 130, (out, err[-3000:])


def test_sigint_to_the_whole_group_reaches_the_job_once(tmp_path):
    """A terminal's Ctrl-C (the whole group) is not passed on a second time."""
    run_dir = str(tmp_path / "run")
    proc = _start(run_dir, sys.executable, _sigint_job(tmp_path), start_new_session=True)
    assert proc.stdout.readline().strip() == "ready"
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert out.split() == ["interrupts", "1"] and proc.returncode == 130, (out, err[-3000:])


def _torchrun(*args: str) -> list[str]:
    return [tool("torchrun"), "--nproc_per_node", "2", "--master_port", str(free_port()), "--monitor-interval", "0.05",
            *args]


def _ctrl_c_pressed(proc: subprocess.Popen, times: int, gap_s: float) -> None:
    """A terminal's Ctrl-C pressed `times` times, `gap_s` apart: SIGINT to the whole foreground group (while it
    has a process left)."""
    for _ in range(times):
        try:
            os.killpg(proc.pid, signal.SIGINT)
        except ProcessLookupError:
            return
        time.sleep(gap_s)


def test_ctrl_c_pressed_four_times_while_ranks_write_keeps_every_trace_or_says_why(tmp_path):
    """Four Ctrl-Cs within 100 ms while one rank writes and the other stops its profiler (torchrun, 2 ranks,
    in sessions of their own: torchrun sends them SIGINT, then SIGTERM when a second SIGINT cuts its wait
    short). A signal handled inside the profiler's stop left Kineto half stopped, and the rank died writing at
    exit (0 bytes); one during the first manifest write left "being written" beside a whole trace. Each rank's
    trace is whole with nothing said lost, or absent and `lost` says why; the exit code is torchrun's own."""
    run_dir = str(tmp_path / "run")
    job = (LONG_EXPORT, "--ops", "3000", "--after", "60")
    proc = _start(run_dir, *_torchrun(*job), start_new_session=True)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None and not (
            os.path.isdir(run_dir) and any(n.endswith(".json.tmp") for n in os.listdir(run_dir))):
        time.sleep(0.002)
    _ctrl_c_pressed(proc, 4, 0.025)
    out, err = proc.communicate(timeout=300)
    # torchrun alone, under such a burst, exits 1 (its SignalException) or dies of the SIGINT (130), as the
    # burst meets it: dstrace passes on whichever it was
    assert proc.returncode in (1, 128 + signal.SIGINT), err[-3000:]
    assert proc.returncode == read_json(os.path.join(run_dir, "run.json"))["exit_code"]
    ms = manifests(run_dir)
    assert sorted(ms) == [0, 1], err[-3000:]
    for rank, m in ms.items():
        assert m["status"] in ("interrupted", "terminated"), (rank, m["status"], err[-3000:])
        if m["window"]["trace_file"]:
            assert m["lost"] == [], (rank, m["lost"])
            assert os.path.basename(_whole_trace(run_dir, rank)) == m["window"]["trace_file"]
        elif m["window"]["trigger"] is not None:  # its window opened: the trace it did not keep is said lost
            assert m["lost"] and all(reason.startswith("trace: ") for reason in m["lost"]), (rank, m)
        else:  # interrupted before its window opened (the ranks run at their own pace): nothing to lose
            assert m["lost"] == [] and not m["window"]["recorded_steps"], (rank, m)
    assert not [n for n in os.listdir(run_dir) if n.endswith(".json.tmp")]


# ---- a Ctrl-C burst to a plain python job ----------------------------------------------------------------------
def _alone(*command: str) -> subprocess.Popen:
    """The job without dstrace, in a session of its own as `record` is in the tests (its group is the terminal's)."""
    return subprocess.Popen(list(command), env=cpu_env(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def _wait_for_line(proc: subprocess.Popen, line: str) -> None:
    for got in proc.stdout:
        if got.strip() == line:
            return
    raise AssertionError(f"the job ended before printing {line!r}: {proc.communicate(timeout=60)}")


def _shell_code(proc: subprocess.Popen) -> int:
    """The exit status as a shell reports it: 128 + N for a process that died of signal N."""
    return 128 - proc.returncode if proc.returncode < 0 else proc.returncode


KEYBOARD_INTERRUPT = (1, 128 + signal.SIGINT)
"""How a plain python job dies of Ctrl-C: of the SIGINT Python sends itself after the KeyboardInterrupt's traceback
(130), or 1 where a second KeyboardInterrupt met its exit (the burst decides, with or without dstrace)."""
BURST_MOMENTS = {  # the job's options, and the line it prints when the moment has come (None: its trace's write)
    "before-the-window": (("--wait-before",), "before-window"),
    "in-the-window": (("--interrupt-wait",), "in-window"),
    "while-the-trace-is-written": ((), None),
}


@pytest.mark.parametrize("moment", BURST_MOMENTS)
def test_ctrl_c_pressed_four_times_at_a_plain_python_job_ends_it_as_without_dstrace(tmp_path, moment):
    """Four Ctrl-Cs within 100 ms (the whole group: record, its sentinel and the job, as a terminal sends them) to
    `record -- python job.py`. Without dstrace the job dies of KeyboardInterrupt; under record too, with the code
    record returns in run.json. The SIGINTs after the one that ended the job reached `record` itself while it
    finished the run folder, and ended it ("dstrace: interrupted"): run.json kept no exit code. The rank's trace
    is whole, or absent with nothing recorded (interrupted before its window); no raw JSON is left."""
    options, line = BURST_MOMENTS[moment]
    job = (sys.executable, LONG_EXPORT, "--ops", "1500", "--after", "60", *options)
    alone = _alone(*job)
    _wait_for_line(alone, line or "loop done on rank 0")  # without dstrace nothing is written: after the loop
    _ctrl_c_pressed(alone, 4, 0.025)
    alone.communicate(timeout=120)
    run_dir = str(tmp_path / "run")
    proc = _start(run_dir, *job, start_new_session=True)
    if line:
        _wait_for_line(proc, line)
    else:
        _wait_for_a_trace_being_written(run_dir, proc)
    _ctrl_c_pressed(proc, 4, 0.025)
    out, err = proc.communicate(timeout=120)
    assert _shell_code(alone) in KEYBOARD_INTERRUPT and proc.returncode in KEYBOARD_INTERRUPT, err[-3000:]
    assert "dstrace: interrupted" not in err
    assert read_json(os.path.join(run_dir, "run.json"))["exit_code"] == proc.returncode, err[-3000:]
    (m,) = manifests(run_dir).values()
    assert m["status"] == "interrupted" and m["lost"] == [], m
    if moment == "before-the-window":
        assert m["window"]["trigger"] is None and not trace_paths(run_dir)
    else:
        assert os.path.basename(_whole_trace(run_dir)) == m["window"]["trace_file"]
    if moment == "in-the-window":  # said "iterations " and nothing after it
        assert "window on optimizer.step: iterations none whole (the rank ended inside the first)" in err
    assert not [n for n in os.listdir(run_dir) if n.endswith(".json.tmp")]


def test_ctrl_c_while_record_reduces_the_traces_leaves_the_reduction_out_and_keeps_the_jobs_code(tmp_path):
    """The job has ended (exit 0) and `record` reduces its trace, which takes minutes for large traces: a Ctrl-C
    then stops the reduction (it only saves `analyze` time), never the run record. Before, once the rest of a
    burst was let go by, `record` could not be stopped there at all. Exit 0 and run.json's 0, the trace whole,
    no kept reduction nor temporary file, a note saying why, and no process of record's left."""
    run_dir = str(tmp_path / "run")
    proc = _start(run_dir, sys.executable, LONG_EXPORT, "--ops", "6000", start_new_session=True)
    for got in proc.stderr:
        if got.startswith("dstrace: reducing "):
            break
    else:
        raise AssertionError(f"record never reduced: {proc.communicate(timeout=60)}")
    _ctrl_c_pressed(proc, 1, 0.0)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    run = read_json(os.path.join(run_dir, "run.json"))
    assert run["exit_code"] == 0 and run["status"] == "complete", run
    assert any("not reduced" in note for note in run["notes"]), (run, os.listdir(run_dir), err[-2000:])
    _whole_trace(run_dir)
    assert not [n for n in os.listdir(run_dir) if n.endswith(".reduction.arrow") or ".tmp" in n]
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, 0)
        raise AssertionError("a process of record's group is still running")


HANDLES_CTRL_C = """
import signal, time, torch
m = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(m.parameters(), lr=0.1)

def step():
    m(torch.randn(4, 8)).sum().backward()
    opt.step()

try:
    for i in range(8):
        step()
        if i == {wait_at}:
            print("ready", flush=True)
            time.sleep(60)
except KeyboardInterrupt:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # stops at the first Ctrl-C, then finishes its work
    for _ in range(4):
        step()
print("finished its work", flush=True)
"""


@pytest.mark.parametrize("wait_at", [0, 2], ids=["before-the-window", "in-the-window"])
def test_a_job_that_handles_ctrl_c_finishes_and_keeps_its_trace_under_a_burst(tmp_path, wait_at):
    """A job that catches the KeyboardInterrupt and finishes its work (ignoring the Ctrl-Cs after the first) exits
    0 without dstrace; under record too, with its trace whole: the burst's later SIGINTs met only `record`, after
    the job had ended, and ended it with 130 ("dstrace: interrupted")."""
    job = _job(tmp_path, HANDLES_CTRL_C.format(wait_at=wait_at))
    alone = _alone(sys.executable, job)
    _wait_for_line(alone, "ready")
    _ctrl_c_pressed(alone, 4, 0.025)
    assert "finished its work" in alone.communicate(timeout=120)[0] and alone.returncode == 0
    run_dir = str(tmp_path / "run")
    proc = _start(run_dir, sys.executable, job, start_new_session=True)
    _wait_for_line(proc, "ready")
    _ctrl_c_pressed(proc, 4, 0.025)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and "finished its work" in out, err[-3000:]
    assert read_json(os.path.join(run_dir, "run.json"))["exit_code"] == 0
    (m,) = manifests(run_dir).values()
    assert m["status"] == "complete" and m["lost"] == [], m
    assert os.path.basename(_whole_trace(run_dir)) == m["window"]["trace_file"]
