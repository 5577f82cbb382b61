"""gather never follows a link nor widens a mode, and refuses an OUT that is a file; a killed `analyze` leaves
no process and, once analyze runs again, no scratch folder (issue #27). Each failed on the code before."""
from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time

import psutil
import pytest

from tests.fixtures.processes import cpu_env, dstrace
from tests.fixtures.runs import write_manifest, write_run_record
from tests.fixtures.traces import write_zero3_traces


@pytest.fixture
def node(tmp_path) -> str:
    folder = tmp_path / "node"
    folder.mkdir()
    for rank in range(2):
        write_manifest(str(folder), rank)
    return str(folder)


def test_gather_refuses_a_linked_nodes_folder_and_writes_nothing_outside(node, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = outside / "secret.json"
    secret.write_text("{}")
    os.chmod(secret, 0o600)
    os.symlink(outside, os.path.join(node, "nodes"))
    r = dstrace("gather", str(tmp_path / "out"), node, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "is a link" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not os.path.exists(tmp_path / "out" / "nodes")


def test_gather_writes_through_no_linked_nodes_folder_in_out(node, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, out / "nodes")
    write_run_record(node)  # a node's run record is copied to OUT/nodes/
    r = dstrace("gather", str(out), node, timeout=60)
    assert r.returncode == 2 and "is a link" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert os.listdir(elsewhere) == []


def test_gather_writes_no_run_through_a_linked_out(node, tmp_path):
    """OUT itself a link to a folder: gather writes nothing there (reduce refuses the same, one ground check)."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, tmp_path / "out")
    r = dstrace("gather", str(tmp_path / "out"), node, timeout=60)
    assert r.returncode == 2 and "is a link" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and os.listdir(elsewhere) == []


def test_gather_keeps_modes_no_wider_than_the_source(node, tmp_path):
    os.chmod(os.path.join(node, "rank0.manifest.json"), 0o600)
    out = tmp_path / "out"
    r = dstrace("gather", str(out), node, timeout=60)
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE(os.stat(out / "rank0.manifest.json").st_mode) == 0o600
    assert stat.S_IMODE(os.stat(out / "rank1.manifest.json").st_mode) == 0o644


def test_gather_into_a_file_is_one_line(node, tmp_path):
    out = tmp_path / "a-file"
    out.write_text("mine")
    r = dstrace("gather", str(out), node, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "is not a folder" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert out.read_text() == "mine"


@pytest.fixture(scope="module")
def large_run(tmp_path_factory) -> str:
    """Two ranks of ~70 MB of JSON each: analyze parses them with a helper or a worker process."""
    folder = tmp_path_factory.mktemp("large")
    write_zero3_traces(str(folder), world_size=2, steps=3, layers=12000)
    return str(folder)


def _helpers_of(proc: psutil.Process, wait_s: float = 120) -> list[psutil.Process]:
    deadline = time.time() + wait_s
    while time.time() < deadline:
        kids = proc.children(recursive=True)
        if kids:
            return kids
        time.sleep(0.05)
    raise AssertionError("analyze started no helper or worker process")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_killed_analyze_leaves_no_process_and_the_next_removes_its_scratch(large_run, tmp_path, sig):
    scratch_root = tmp_path / "tmp"
    scratch_root.mkdir()
    env = cpu_env(TMPDIR=str(scratch_root))
    for name in os.listdir(large_run):
        if name.startswith("."):
            os.unlink(os.path.join(large_run, name))
    proc = psutil.Popen([sys.executable, "-m", "dstrace.cli", "analyze", large_run, "--format", "json"], env=env,
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    helpers = _helpers_of(proc)
    time.sleep(0.5)
    proc.send_signal(sig)
    proc.wait(30)
    gone, alive = psutil.wait_procs(helpers, timeout=10)
    for p in alive:
        p.kill()
    assert not alive, f"{len(alive)} helper process(es) outlived the killed analyze"
    left = [n for n in os.listdir(scratch_root) if n.startswith(f"dstrace-parse-{proc.pid}-")]
    small = tmp_path / "small"
    small.mkdir()
    write_zero3_traces(str(small), world_size=2, steps=2, layers=2)
    r = subprocess.run([sys.executable, "-m", "dstrace.cli", "analyze", str(small)], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert not [n for n in os.listdir(scratch_root) if n.startswith(f"dstrace-parse-{proc.pid}-")], left
