"""Outputs go only to regular files (issue #27): `-o` onto a device, a FIFO or a /proc link is written in place,
never renamed over (as root the rename put a regular file where /dev/null was); a device where a kept file
goes is left alone; outputs honour the umask. Devices are private copies made with mknod in tmp_path (the
real /dev/null is never touched); each case failed on the code before the change."""
from __future__ import annotations

import os
import stat
import subprocess
import threading

import pytest

from tests.fixtures.processes import cpu_env, dstrace, tool


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mknod of a character device needs root")

VERBS = {
    "analyze": lambda run, out: ["analyze", run, "--format", "json", "-o", out],
    "view-report": lambda run, out: ["view", run, "--report", "-o", out],
    "view-perfetto": lambda run, out: ["view", run, "--perfetto", "-o", out],
    "compare": lambda run, out: ["compare", run, "--format", "json", "-o", out],
}


def private_null(path) -> str:
    """A character device like /dev/null (major 1, minor 3), of this test's own."""
    os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    return str(path)


def assert_is_null_device(path) -> None:
    st = os.lstat(path)
    assert stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(1, 3), f"{path} was replaced: {st}"


@needs_root
@pytest.mark.parametrize("verb", sorted(VERBS))
def test_output_onto_a_device_writes_into_it_and_leaves_it_a_device(small_run, tmp_path, verb):
    null = private_null(tmp_path / "null")
    r = dstrace(*VERBS[verb](small_run, null), timeout=300)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert_is_null_device(null)
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_output_onto_a_fifo_is_written_into_the_fifo(small_run, tmp_path, verb):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(open(fifo, "rb").read()), daemon=True)
    reader.start()
    r = dstrace(*VERBS[verb](small_run, str(fifo)), timeout=300)
    if r.returncode != 0:  # the reader still waits for a writer: let it go
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    reader.join(30)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert got and len(got[0]) > 100


def test_output_through_a_link_to_proc_self_fd_1_goes_to_stdout(small_run, tmp_path):
    """`-o /dev/stdout` is a link to /proc/self/fd/1; a private link of the same kind stands in for it."""
    link = tmp_path / "stdout"
    os.symlink("/proc/self/fd/1", link)
    r = dstrace("analyze", small_run, "--format", "json", "-o", str(link), timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert os.path.islink(link) and r.stdout.lstrip().startswith("{")
    r = dstrace("analyze", small_run, "--format", "json", "-o", "/proc/self/fd/1", timeout=300)
    assert r.returncode == 0 and r.stdout.lstrip().startswith("{"), r.stderr[-2000:]


@needs_root
def test_a_device_where_a_kept_report_goes_is_left_alone(small_run):
    kept = private_null(os.path.join(small_run, ".dstrace-report.json.cache"))
    r = dstrace("analyze", small_run, "--format", "json", timeout=300)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert_is_null_device(kept)


@needs_root
def test_a_device_where_view_writes_its_default_files_is_refused_with_one_line(small_run):
    merged = private_null(os.path.join(small_run, "dstrace-merged.pftrace"))
    r = dstrace("view", small_run, "--perfetto", timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "character device" in r.stderr.strip().splitlines()[-1]
    assert_is_null_device(merged)


def test_outputs_honour_the_umask_and_an_existing_files_mode(small_run, tmp_path):
    kept = tmp_path / "private.json"
    kept.write_text("{}")
    os.chmod(kept, 0o600)
    fresh = tmp_path / "fresh.json"
    for out in (kept, fresh):
        r = subprocess.run(["sh", "-c", 'umask 027 && exec "$0" "$@"', tool("dstrace"), "analyze", small_run,
                            "--format", "json", "-o", str(out)], env=cpu_env(), capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
    assert stat.S_IMODE(os.stat(kept).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(fresh).st_mode) == 0o640
    assert stat.S_IMODE(os.stat(os.path.join(small_run, ".dstrace-report.json.cache")).st_mode) == 0o640
