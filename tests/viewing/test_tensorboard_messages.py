"""What `dstrace view --tensorboard` says: whether the charts will draw (said at start, from whether their
CDN answers here), the address only once the plugin lists the run, and one line when Ctrl-C ends it, also
while the plugin is still parsing. The run is a committed H200 trace; the Ctrl-C comes as a terminal sends it,
to the whole foreground process group."""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import json
import time
import urllib.request

import pytest

from dstrace.viewing.tensorboard import charts_reachable
from tests.fixtures.paths import TRACES
from tests.fixtures.processes import cpu_env, start_dstrace

RUN = os.path.join(TRACES, "h200-device-map")
URL_LINE = re.compile(r"^dstrace: TensorBoard at (http://127\.0\.0\.1:\d+/)#pytorch_profiler ")


def finish(proc: subprocess.Popen) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # its TensorBoard follows it (it watches its parent)
        raise


def start(run_dir: str, tmp_path) -> subprocess.Popen:
    return start_dstrace("view", run_dir, "--tensorboard", env=cpu_env(TMPDIR=str(tmp_path)), start_new_session=True)


def test_the_address_comes_once_the_run_is_listed_and_offline_is_said_first(tmp_path):
    run_dir = str(shutil.copytree(RUN, tmp_path / "run"))
    proc = start(run_dir, tmp_path)
    try:
        m = URL_LINE.match(proc.stdout.readline())
        assert m
        with urllib.request.urlopen(m.group(1) + "data/plugin/pytorch_profiler/runs", timeout=10) as r:
            assert "run" in json.load(r)["runs"], "listed when the address is printed"
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        out, err = finish(proc)
    assert proc.returncode == 0
    said = [line for line in err.splitlines() if line.startswith("dstrace:")]
    offline = [line for line in said if "cannot be reached" in line]
    assert bool(offline) == (not charts_reachable())
    if offline:
        assert said[0] == offline[0] and "--report" in offline[0] and "--perfetto" in offline[0]
    assert said[-1] == "dstrace: TensorBoard stopped" and "Traceback" not in err


@pytest.mark.parametrize("after_s", [0.0, 3.0])
def test_ctrl_c_while_the_plugin_parses_ends_it_with_one_line(tmp_path, after_s):
    """Right as the server starts, and a few seconds in, while TensorBoard starts and its plugin parses."""
    run_dir = str(shutil.copytree(RUN, tmp_path / "run"))
    proc = start(run_dir, tmp_path)
    for line in proc.stderr:
        if "starting TensorBoard" in line:
            break
    time.sleep(after_s)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = finish(proc)
    assert proc.returncode == 0
    # at once: nothing is loaded, so no address; a few seconds in, the run may be loaded and its address out
    assert out == "" if after_s == 0 else all(URL_LINE.match(line) for line in out.splitlines())
    assert err.strip().splitlines() == ["dstrace: TensorBoard stopped"]
    assert not any(n.startswith("dstrace-tensorboard-") for n in os.listdir(tmp_path))


def test_the_server_does_not_outlive_a_killed_view(tmp_path):
    run_dir = str(shutil.copytree(RUN, tmp_path / "run"))
    proc = start(run_dir, tmp_path)
    assert URL_LINE.match(proc.stdout.readline())
    server = [int(p) for p in os.listdir("/proc") if p.isdigit() and _is_server_of(int(p), tmp_path)]
    assert len(server) == 1
    proc.kill()
    proc.wait(timeout=30)
    deadline = time.monotonic() + 60
    while os.path.exists(f"/proc/{server[0]}") and _is_server_of(server[0], tmp_path) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _is_server_of(server[0], tmp_path), "the TensorBoard server exits when its dstrace view is killed"


def _is_server_of(pid: int, tmp_path) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().split(b"\0")
    except OSError:
        return False
    return b"dstrace.viewing.tensorboard" in args and any(str(tmp_path).encode() in a for a in args)
