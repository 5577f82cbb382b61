"""`record`'s own process: something planted at its run record's name is left alone and the job is not started;
a user's sitecustomize runs once in each process, as without dstrace (tests/recording/CASES.md)."""
from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

from tests.fixtures.processes import cpu_env, dstrace, tool, torchrun


def _marking_job(tmp_path) -> tuple[str, str]:
    """A job that leaves a file behind when it runs: it must not."""
    marker = tmp_path / "job-ran"
    job = tmp_path / "job.py"
    job.write_text(f"open({str(marker)!r}, 'w').close()\n")
    return str(job), str(marker)


def _one_line_refusal(r) -> None:
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert len(r.stderr.strip().splitlines()) == 1 and "the command was not started" in r.stderr, r.stderr


def test_a_folder_at_run_json_refuses_before_the_job_starts(tmp_path):
    """--force keeps folders; a folder named run.json made record's first write raise (a traceback)."""
    run_dir = tmp_path / "run"
    (run_dir / "run.json").mkdir(parents=True)
    job, marker = _marking_job(tmp_path)
    r = dstrace("record", "-o", str(run_dir), "--force", "--", sys.executable, job)
    _one_line_refusal(r)
    assert not os.path.exists(marker) and (run_dir / "run.json").is_dir()


@pytest.mark.parametrize("planted", ["fifo", "device"])
def test_a_fifo_or_device_at_a_nodes_record_refuses_before_the_job_starts(tmp_path, planted):
    """One node of a two-node torchrun run, shared folder, --force: a FIFO or a device where the node writes
    its record (nodes/<node>.json) made the first write raise; nothing is written through it."""
    if planted == "device" and os.geteuid() != 0:
        pytest.skip("mknod of a character device needs root")
    run_dir = tmp_path / "run"
    (run_dir / "nodes").mkdir(parents=True)
    job, marker = _marking_job(tmp_path)
    command = [tool("torchrun"), "--nnodes", "2", "--node_rank", "0", "--nproc_per_node", "1",
               "--master_addr", "127.0.0.1", "--master_port", "1", job]
    target = run_dir / "nodes" / f"{_node_name()}.json"
    if planted == "fifo":
        os.mkfifo(target)
    else:
        os.mknod(target, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # a private /dev/null
    r = dstrace("record", "--run-id", "planted", "--force", "-o", str(run_dir), "--", *command)
    _one_line_refusal(r)
    assert not os.path.exists(marker)
    mode = os.lstat(target).st_mode
    assert stat.S_ISFIFO(mode) if planted == "fifo" else stat.S_ISCHR(mode)


def _node_name() -> str:
    from dstrace.recording.multinode import node_role
    return node_role([tool("torchrun"), "--nnodes", "2", "--node_rank", "0", "x.py"], {}).node


def _logging_sitecustomize(tmp_path):
    """A user's sitecustomize (its folder, to go on PYTHONPATH) that logs each process it runs in: pid, argv[0]."""
    user_site = tmp_path / "usersite"
    user_site.mkdir()
    log = tmp_path / "ran"
    (user_site / "sitecustomize.py").write_text(
        f"import os, sys\nwith open({str(log)!r}, 'a') as f:\n    f.write('%d %s\\n' % (os.getpid(), sys.argv[0]))\n")
    return user_site, log


def test_a_users_sitecustomize_runs_once_in_each_process(tmp_path):
    """Reported: the user's sitecustomize ran a second time in dstrace's own process. Each process (record,
    torchrun, the rank) logs its pid once; record's own process is one of them."""
    user_site, log = _logging_sitecustomize(tmp_path)
    job = tmp_path / "job.py"
    job.write_text("import torch\ntorch.nn.Linear(2, 2)(torch.ones(2))\n")
    run_dir = str(tmp_path / "run")
    r = dstrace("record", "-o", run_dir, "--", *torchrun(1), str(job), env=cpu_env(PYTHONPATH=os.pathsep.join(
                    filter(None, [str(user_site), os.environ.get("PYTHONPATH")]))))
    assert r.returncode == 0, r.stderr[-3000:]
    runs = [line.split(" ", 1) for line in log.read_text().splitlines()]
    pids = [pid for pid, _ in runs]
    assert len(pids) == len(set(pids)) == 3, runs
    assert [os.path.basename(program) for _, program in runs] == ["dstrace", "torchrun", "job.py"], runs


def test_a_users_sitecustomize_runs_once_in_nested_records_and_spawned_children(tmp_path):
    """Case 19's set-ups tried later: `record -- record -- python job.py` (the inner record and its job get the
    bootstrap folder twice on PYTHONPATH) and a job whose multiprocessing 'spawn' children are fresh interpreters.
    Each process logs once: the two records, and every process the job alone starts."""
    user_site, log = _logging_sitecustomize(tmp_path)
    job = tmp_path / "job.py"
    job.write_text("import multiprocessing\n"
                   "if __name__ == '__main__':\n"
                   "    children = [multiprocessing.get_context('spawn').Process(target=print, args=(i,)) for i in (0, 1)]\n"
                   "    for child in children:\n        child.start()\n"
                   "    print([child.join() or child.exitcode for child in children], flush=True)\n")
    env = cpu_env(PYTHONPATH=os.pathsep.join(filter(None, [str(user_site), os.environ.get("PYTHONPATH")])))

    def logged() -> list[list[str]]:
        runs = [line.split(" ", 1) for line in log.read_text().splitlines()]
        log.unlink()
        return runs

    alone = subprocess.run([sys.executable, str(job)], env=env, capture_output=True, text=True, timeout=120)
    assert alone.returncode == 0, alone.stderr[-3000:]
    by_the_job = logged()
    inner = [tool("dstrace"), "record", "-o", str(tmp_path / "inner"), "--", sys.executable, str(job)]
    r = dstrace("record", "-o", str(tmp_path / "outer"), "--", *inner, env=env)
    assert r.returncode == 0 and "[0, 0]" in r.stdout, r.stderr[-3000:]
    runs = logged()
    pids = [pid for pid, _ in runs]
    assert len(pids) == len(set(pids)) == 2 + len(by_the_job), (runs, by_the_job)
    assert [os.path.basename(program) for _, program in runs[:3]] == ["dstrace", "dstrace", "job.py"], runs
