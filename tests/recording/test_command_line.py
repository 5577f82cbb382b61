"""The command line people already know from nsys and py-spy: what follows the program is the program's."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from dstrace import __version__
from tests.fixtures.paths import JOB
from tests.fixtures.processes import cpu_env, dstrace, tool
from tests.fixtures.runs import read_json

ARGV_PROBE = "import json, sys; print('argv=' + json.dumps(sys.argv[1:]))"


def probe_argv(stdout: str) -> list[str]:
    return json.loads(next(line for line in stdout.splitlines() if line.startswith("argv="))[5:])


def test_options_after_the_program_name_belong_to_the_program(tmp_path):
    run_dir = tmp_path / "run"
    r = dstrace("record", "-o", str(run_dir), sys.executable, "-c", ARGV_PROBE, "-o", "x", "--mode", "y",
                "--force")
    assert r.returncode == 0, r.stderr
    assert probe_argv(r.stdout) == ["-o", "x", "--mode", "y", "--force"]
    assert read_json(str(run_dir / "run.json"))["command"][-5:] == ["-o", "x", "--mode", "y", "--force"]


def test_a_double_dash_still_separates_and_later_ones_reach_the_program(tmp_path):
    r = dstrace("record", "-o", str(tmp_path / "run"), "--mode", "annotate", "--", sys.executable, "-c",
                ARGV_PROBE, "--", "-o")
    assert r.returncode == 0, r.stderr
    assert probe_argv(r.stdout) == ["--", "-o"]


def test_record_without_a_command_says_how(tmp_path):
    for args in (["record"], ["record", "--"], ["record", "-o", str(tmp_path / "x")]):
        r = dstrace(*args)
        assert r.returncode == 2 and "no command to record" in r.stderr and "Traceback" not in r.stderr, args


def test_two_recordings_started_together_get_their_own_folders(tmp_path):
    """Default folders are named to the second; the second recording of that second gets `-2`, and both run."""
    procs = [subprocess.Popen([tool("dstrace"), "record", sys.executable, "-c", f"print('job {i}')"],
                              cwd=tmp_path, env=cpu_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for i in range(3)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [e for _, e in outs]
    folders = [next(line.split("recording into ", 1)[1] for line in err.splitlines() if "recording into" in line)
               for _, err in outs]
    assert len(set(folders)) == 3
    for i, folder in enumerate(folders):
        assert f"job {i}" in outs[i][0]
        assert read_json(os.path.join(folder, "run.json"))["command"][-1] == f"print('job {i}')"


def test_version_and_bare_help():
    r = subprocess.run([tool("dstrace"), "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == f"dstrace {__version__}"
    r = subprocess.run([tool("dstrace")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "usage: dstrace" in r.stdout
    assert all(verb in r.stdout for verb in ("record", "analyze", "compare", "view", "gather"))


def test_a_window_never_reached_is_said_plainly(tmp_path):
    """One call of 8 forward steps, a window at step 50: record and analyze both say so, with the numbers,
    and neither calls the ranks missing."""
    run_dir = str(tmp_path / "late")
    r = dstrace("record", "-o", run_dir, "--window-start", "50", sys.executable, JOB)
    assert r.returncode == 0, r.stderr[-3000:]
    said = "call 1 has 8 forward step(s); the window starts at step 50"
    assert said in r.stderr and "rank 0: no trace" in r.stderr
    run = read_json(os.path.join(run_dir, "run.json"))
    assert run["status"] == "complete" and any(said in n for n in run["notes"])
    a = dstrace("analyze", run_dir)
    assert a.returncode == 0, a.stderr
    assert said in a.stderr
    assert "ranks found 0" in a.stdout
    assert "missing" not in a.stdout
    # 8 forwards: prefill + 7 decode
    assert ("median of 7 step times (7 per rank, 1 rank): unprofiled decode steps of every call"
            in " ".join(a.stdout.split()))  # the terminal layout wraps lines


def test_an_annotate_run_is_not_reported_as_ranks_missing(tmp_path):
    run_dir = str(tmp_path / "annotate")
    r = dstrace("record", "-o", run_dir, "--mode", "annotate", sys.executable, JOB)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "annotate mode records ranges and timings, no trace" in r.stderr
    a = dstrace("analyze", run_dir, "--format", "json")
    assert a.returncode == 0, a.stderr
    report = json.loads(a.stdout)
    assert report["ranks_found"] == [0] and report["missing_ranks"] == []
    assert "annotate mode" in a.stderr and "ended before" not in a.stderr


def test_the_output_file_name_picks_the_report_format(tmp_path):
    run_dir = str(tmp_path / "run")
    assert dstrace("record", "-o", run_dir, "--mode", "annotate", sys.executable, JOB).returncode == 0
    out = {ext: str(tmp_path / f"report.{ext}") for ext in ("html", "json", "md", "txt")}
    for path in out.values():
        r = dstrace("analyze", run_dir, "-o", path)
        assert r.returncode == 0, r.stderr
    assert open(out["html"]).read().lstrip().lower().startswith("<!doctype html")
    assert json.load(open(out["json"]))["schema"] == "dstrace.analysis/1"
    assert open(out["md"]).read().startswith("#")
    assert open(out["txt"]).read().startswith("dstrace analysis of")
    forced = str(tmp_path / "forced.html")
    assert dstrace("analyze", run_dir, "--format", "text", "-o", forced).returncode == 0
    assert open(forced).read().startswith("dstrace analysis of")
    compared = str(tmp_path / "compare.json")
    r = dstrace("compare", run_dir, "-o", compared)
    assert r.returncode == 0, r.stderr
    assert json.load(open(compared))["schema"].startswith("dstrace.compare/")
