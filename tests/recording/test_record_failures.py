"""What recording does when things go wrong: refused configs, crashing ranks, signals, bad commands."""
from __future__ import annotations

import os
import signal
import sys
import time

from tests.fixtures.paths import JOB, LAUNCH
from tests.fixtures.processes import cpu_env, deepspeed_era_path, dstrace, record_zero3_chat, start_dstrace, torchrun
from tests.fixtures.runs import manifests, read_json, trace_paths
from tests.fixtures.traces import read_trace


def run_record(tmp_path, name, *command, env=None):
    run_dir = str(tmp_path / name)
    return run_dir, dstrace("record", "-o", run_dir, "--", *command, env=env)


def assert_whole_traces(run_dir):
    """Every file that looks like a trace is a complete gzip of a complete JSON document."""
    for path in trace_paths(run_dir):
        assert read_trace(path)["traceEvents"], path
    assert not [n for n in os.listdir(run_dir) if n.endswith((".pt.trace.json", ".pt.trace.json.gz"))
                and not os.path.isfile(os.path.join(run_dir, n))]


def test_report_config_in_deepspeed_0_16_is_accepted_and_ignored(tmp_path):
    """DeepSpeed 0.16.1 takes "tensor_parallel": {"tp_size": 2} silently; the manifest shows TP never applied."""
    era = deepspeed_era_path()
    run_dir = str(tmp_path / "era")
    result = record_zero3_chat(run_dir, "--tp-size", "2", "--max-new-tokens", "4",
                               env=cpu_env(PYTHONPATH=era))
    assert result.returncode == 0, result.stderr[-3000:]
    for m in manifests(run_dir).values():
        assert m["versions"]["deepspeed"] == "0.16.1"
        assert {(t["source"], t["key"], t["value"]) for t in m["tp_requested"]} >= {
            ("HfDeepSpeedConfig", "tensor_parallel.tp_size", 2),
            ("deepspeed.initialize", "tensor_parallel.tp_size", 2)}
        assert all(c["error"] is None for c in m["deepspeed_calls"])
        assert m["inventory"]["effective_tp"] == 1  # asked for 2, got 1: full logical shapes
        assert all(w["split"] == 1.0 for w in m["inventory"]["weights"])
        assert m["status"] == "complete"


def test_report_config_in_current_deepspeed_is_refused(tmp_path):
    """The current release refuses tp_size (TPTrainingConfig forbids extra keys): the manifest says so."""
    run_dir = str(tmp_path / "current")
    result = record_zero3_chat(run_dir, "--tp-size", "2", "--max-new-tokens", "4")
    assert result.returncode != 0
    run = read_json(os.path.join(run_dir, "run.json"))
    assert run["status"] == "incomplete" and run["exit_code"] == result.returncode
    ms = manifests(run_dir)
    assert sorted(ms) == [0, 1]
    for m in ms.values():
        assert m["status"] == "failed" and m["versions"]["deepspeed"] != "0.16.1"
        refused = [c for c in m["deepspeed_calls"] if c["error"]]
        assert refused and "tp_size" in refused[0]["error"]["message"]
        assert refused[0]["config"]["tensor_parallel"] == {"tp_size": 2}  # exactly as passed
    assert "failed" in result.stderr


def test_crashing_rank_leaves_other_rank_whole(tmp_path):
    run_dir, result = run_record(tmp_path, "crash", *torchrun(), JOB,
                                 "--crash-rank", "1", "--sleep", "60")
    assert result.returncode != 0
    run = read_json(os.path.join(run_dir, "run.json"))
    assert run["status"] == "incomplete"
    ms = manifests(run_dir)
    assert ms[1]["status"] == "failed" and "planted crash" in ms[1]["exit_error"]["message"]
    assert ms[0]["status"] in ("terminated", "complete")
    assert {os.path.basename(p).split(".")[0].rsplit("_", 1)[1] for p in trace_paths(run_dir)} == {"rank0", "rank1"}
    assert_whole_traces(run_dir)
    assert "rank 1 failed" in result.stderr


def test_killed_rank_is_reported_crashed(tmp_path):
    run_dir, result = run_record(tmp_path, "kill", *torchrun(), JOB,
                                 "--crash-rank", "1", "--crash-how", "kill", "--sleep", "60")
    assert result.returncode != 0
    run = read_json(os.path.join(run_dir, "run.json"))
    statuses = {r["rank"]: r["status"] for r in run["ranks"]}
    assert statuses[1] == "crashed" and run["status"] == "incomplete"
    assert any("rank 1 crashed" in p for p in run["problems"])
    assert_whole_traces(run_dir)


def _start_and_wait_for_trace(run_dir, command, expected):
    proc = start_dstrace("record", "-o", run_dir, "--", *command, start_new_session=True)
    deadline = time.time() + 300

    def found() -> int:
        return len(trace_paths(run_dir)) if os.path.isdir(run_dir) else 0

    while found() < expected and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert len(trace_paths(run_dir)) == expected, proc.communicate(timeout=60)
    return proc


def test_sigterm_writes_what_was_recorded(tmp_path):
    run_dir = str(tmp_path / "term")
    proc = _start_and_wait_for_trace(run_dir, [sys.executable, JOB, "--sleep", "120"], expected=1)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    (m,) = manifests(run_dir).values()
    assert m["status"] == "terminated" and len(m["calls"][0]["step_ms"]) == 8
    assert read_json(os.path.join(run_dir, "run.json"))["status"] == "incomplete"
    assert_whole_traces(run_dir)


def test_sigterm_through_torchrun(tmp_path):
    run_dir = str(tmp_path / "term2")
    proc = _start_and_wait_for_trace(run_dir, [*torchrun(), JOB, "--sleep", "120"],
                                     expected=2)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode != 0
    ms = manifests(run_dir)
    assert sorted(ms) == [0, 1] and all(m["status"] == "terminated" for m in ms.values()), err[-2000:]
    assert_whole_traces(run_dir)


def test_ctrl_c_writes_what_was_recorded(tmp_path):
    run_dir = str(tmp_path / "int")
    proc = _start_and_wait_for_trace(run_dir, [sys.executable, JOB, "--sleep", "120"], expected=1)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGINT, err
    (m,) = manifests(run_dir).values()
    assert m["status"] == "interrupted"
    assert_whole_traces(run_dir)


def test_command_not_found(tmp_path):
    run_dir, result = run_record(tmp_path, "missing", "no-such-launcher-xyz", "--num_gpus", "2")
    assert result.returncode == 127
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "command not found" in lines[0] and "Traceback" not in result.stderr
    assert read_json(os.path.join(run_dir, "run.json"))["status"] == "incomplete"


def test_exit_code_is_the_commands(tmp_path):
    run_dir, result = run_record(tmp_path, "exit3", sys.executable, "-c", "import sys; sys.exit(3)")
    assert result.returncode == 3
    assert read_json(os.path.join(run_dir, "run.json"))["exit_code"] == 3


def test_existing_run_folder_is_not_overwritten(tmp_path):
    run_dir = tmp_path / "used"
    run_dir.mkdir()
    (run_dir / "keep.txt").write_text("x")
    result = dstrace("record", "-o", str(run_dir), "--", sys.executable, "-c", "pass")
    assert result.returncode == 2 and "--force" in result.stderr and "Traceback" not in result.stderr
    assert os.listdir(run_dir) == ["keep.txt"]


def test_failing_hook_does_not_break_the_job(tmp_path):
    """dstrace's own inventory fails (a fault planted in it): the job runs on, the manifest says what failed."""
    script = tmp_path / "planted.py"
    script.write_text(
        "import runpy, sys\n"
        "import dstrace.recording.hooks as hooks\n"
        "def broken(*a, **k):\n"
        "    raise RuntimeError('planted inventory fault')\n"
        "hooks.take_inventory = broken\n"
        f"sys.argv = [{os.path.join(LAUNCH, 'device_map_chat.py')!r}, '--size', 'tiny', '--max-new-tokens', '4']\n"
        f"runpy.run_path(sys.argv[0], run_name='__main__')\n")
    run_dir, result = run_record(tmp_path, "hookfail", sys.executable, str(script))
    assert result.returncode == 0, result.stderr[-2000:]
    (m,) = manifests(run_dir).values()
    assert m["status"] == "complete" and len(m["calls"][0]["step_ms"]) == 4
    assert any("planted inventory fault" in e for e in m["hook_errors"])


def test_sitecustomize_of_the_user_still_runs(tmp_path):
    user_site = tmp_path / "usersite"
    user_site.mkdir()
    (user_site / "sitecustomize.py").write_text("import os\nos.environ['USER_SITE_RAN'] = '1'\n")
    run_dir = str(tmp_path / "chain")
    result = dstrace("record", "-o", run_dir, "--", sys.executable, "-c",
                     "import os, sys; sys.exit(0 if os.environ.get('USER_SITE_RAN') == '1' else 9)",
                     env=cpu_env(PYTHONPATH=str(user_site)))
    assert result.returncode == 0, result.stderr


CRASH_IN_DDP = """
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
class Bad(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l = torch.nn.Linear(2, 2)
    def forward(self, x):
        raise ValueError("the first line " + "x" * 300 + "\\nthe second line\\n\\tand a tab")
torch.nn.parallel.DistributedDataParallel(Bad())(torch.ones(2))
"""


def test_a_crashed_ranks_exception_is_printed_as_the_job_printed_it(tmp_path):
    """record cut the first line at 200 characters, wrote newlines as \\u000a, put "no trace: ..." before the
    crash, and the job's traceback held dstrace's wrapper frame (hooks.py) around DDP's forward."""
    script = tmp_path / "crash.py"
    script.write_text(CRASH_IN_DDP)
    run_dir, r = run_record(tmp_path, "crash", *torchrun(), str(script))
    assert r.returncode == 1, r.stderr[-3000:]
    assert "Traceback" in r.stderr and "hooks.py" not in r.stderr
    lines = r.stderr.splitlines()
    first = "dstrace: rank 0 failed: ValueError: the first line " + "x" * 300
    assert first in lines and "\\u000a" not in r.stderr
    at = lines.index(first)
    assert lines[at + 1:at + 3] == ["dstrace:   the second line", "dstrace:           and a tab"]
    assert at < min(i for i, line in enumerate(lines) if "no trace" in line)
