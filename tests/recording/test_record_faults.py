"""What goes wrong around a recording never costs the job's exit code, nor a rank's data that was written;
what was lost is said in run.json."""
from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time

from tests.fixtures.paths import JOB, SCRIPTS
from tests.fixtures.processes import cpu_env, dstrace, start_dstrace, tool
from tests.fixtures.runs import manifests, read_json, trace_paths
from tests.fixtures.traces import read_trace


SLOW = os.path.join(SCRIPTS, "slow_step.py")


def test_two_sigterms_in_quick_succession_keep_the_trace(tmp_path):
    """Launchers send a second SIGTERM soon after the first: the rank still writes its whole trace."""
    run_dir = str(tmp_path / "run")
    proc = start_dstrace("record", "-o", run_dir, sys.executable, SLOW)
    assert proc.stdout.readline().strip() == "in-window"
    pid = manifests(run_dir)[0]["pid"]
    os.kill(pid, signal.SIGTERM)
    time.sleep(0.005)
    os.kill(pid, signal.SIGTERM)
    proc.communicate(timeout=120)
    (m,) = manifests(run_dir).values()
    assert m["status"] == "terminated"
    (trace,) = trace_paths(run_dir)
    assert read_trace(trace)["traceEvents"]
    assert read_json(os.path.join(run_dir, "run.json"))["ranks"][0]["traces"] == [os.path.basename(trace)]


def _file_size_limit(nbytes):
    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, nbytes))
    return apply


def test_a_trace_that_could_not_be_written_makes_the_run_incomplete(tmp_path):
    """A disk that fills up while the trace is written (here: a file size limit) loses the trace; the job
    runs on, and run.json says the run is incomplete and why."""
    run_dir = str(tmp_path / "run")
    r = subprocess.run([tool("dstrace"), "record", "-o", run_dir, sys.executable, JOB], env=cpu_env(),
                       capture_output=True, text=True, timeout=300, preexec_fn=_file_size_limit(32 << 10))
    assert r.returncode == 0 and "generated on rank 0" in r.stdout, r.stderr[-3000:]
    assert not trace_paths(run_dir)
    run = read_json(os.path.join(run_dir, "run.json"))
    assert run["status"] == "incomplete"
    lost = [p for p in run["problems"] if p.startswith("rank 0 lost what it recorded: trace:")]
    assert lost and ("File too large" in lost[0] or "could not write its trace" in lost[0]), run["problems"]
    assert "lost what it recorded" in r.stderr


def test_the_exit_code_comes_through_when_the_run_record_cannot_be_written(tmp_path):
    run_dir = str(tmp_path / "run")
    job = "import os; d = os.environ['DSTRACE_RUN_DIR']; os.remove(d + '/run.json'); os.mkdir(d + '/run.json'); raise SystemExit(3)"
    r = dstrace("record", "-o", run_dir, sys.executable, "-c", job)
    assert r.returncode == 3, r.stderr
    assert "Traceback" not in r.stderr and "could not write the run record" in r.stderr


def test_a_malformed_stray_manifest_is_a_problem_not_a_crash(tmp_path):
    run_dir = str(tmp_path / "run")
    job = "import os; open(os.environ['DSTRACE_RUN_DIR'] + '/rank7.manifest.json', 'w').write('[1'); raise SystemExit(5)"
    r = dstrace("record", "-o", run_dir, sys.executable, "-c", job)
    assert r.returncode == 5 and "Traceback" not in r.stderr, r.stderr
    run = read_json(os.path.join(run_dir, "run.json"))
    assert run["exit_code"] == 5 and run["status"] == "incomplete"
    assert any(p.startswith("rank7.manifest.json: unreadable manifest") for p in run["problems"])


def test_an_unwritable_run_folder_is_refused_before_the_job_starts(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    marker = tmp_path / "ran"
    r = dstrace("record", "-o", str(blocker / "run"), sys.executable, "-c", f"open({str(marker)!r}, 'w')")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "choose" in r.stderr
    assert not marker.exists()


def test_force_starts_a_clean_run(tmp_path):
    """--force over a 1-rank run with a trace: the new run's record holds only its own rank and files."""
    run_dir = str(tmp_path / "run")
    assert dstrace("record", "-o", run_dir, sys.executable, JOB).returncode == 0
    assert trace_paths(run_dir)
    keep = os.path.join(run_dir, "notes.txt")
    with open(keep, "w") as f:
        f.write("mine")
    r = dstrace("record", "--force", "--mode", "annotate", "-o", run_dir, sys.executable, JOB)
    assert r.returncode == 0, r.stderr
    assert not trace_paths(run_dir)
    run = read_json(os.path.join(run_dir, "run.json"))
    assert [x["rank"] for x in run["ranks"]] == [0] and run["ranks"][0]["traces"] == []
    assert manifests(run_dir)[0]["run_id"] == run["run_id"]
    assert open(keep).read() == "mine"
