"""DeepSpeed's multi-node runner forwards only some variables to the other nodes: dstrace's must get there.

pdsh and ssh cannot run here, so DeepSpeed's real runner (`deepspeed --hostfile ...`, its hostfile parsing,
export filtering and `.deepspeed_env` reading) runs up to the point where it starts pdsh; a stand-in
`pdsh` on PATH records the command line it was given, and that command's export prefix is then run in
an empty environment, as a remote login shell would run it.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

from dstrace.recording import launcher, multinode
from dstrace.recording.launcher import RecordOptions
from dstrace.recording.window import WindowOptions
from tests.fixtures.processes import tool

PDSH_STAND_IN = """#!{python}
import json, os, sys
with open(os.environ["PDSH_ARGV_OUT"], "w") as f:
    json.dump(sys.argv, f)
"""
REMOTE_PROBE = ("import json, os, sitecustomize; from dstrace.recording.window import WindowOptions; "
                "print(json.dumps({'env': {k: v for k, v in os.environ.items() if k.startswith(('DSTRACE_', 'NCCL_', 'MY_'))}, "
                "'pythonpath': os.environ.get('PYTHONPATH', ''), 'sitecustomize': sitecustomize.__file__, "
                "'window': WindowOptions.from_env(os.environ['DSTRACE_WINDOW']).__dict__}))")


def _user_files(tmp_path):
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    (home / ".deepspeed_env").write_text("NCCL_SOCKET_IFNAME=eth1\nMY_SETTING=from-home\n")
    (work / ".deepspeed_env").write_text("MY_SETTING=from-cwd\nPYTHONPATH=/opt/user/lib\n")
    (work / "hostfile").write_text("# two nodes\nnode-a slots=1\nnode-b slots=1\n")
    return home, work


def test_deepspeed_runner_forwards_dstrace_to_other_nodes(tmp_path, monkeypatch):
    home, work = _user_files(tmp_path)
    user_files = {p: p.read_text() for p in (home / ".deepspeed_env", work / ".deepspeed_env")}
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "pdsh").write_text(PDSH_STAND_IN.format(python=sys.executable))
    (bin_dir / "pdsh").chmod(0o755)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    command = [tool("deepspeed"), "--hostfile", "hostfile", "--master_addr", "10.0.0.1", "--no_ssh_check",
               "train.py", "--size", "tiny"]
    opts = RecordOptions(command=command, output=str(run_dir), window=WindowOptions(steps=4))
    env = launcher.child_environment(str(run_dir), "ds-run", opts)
    env.update(DS_ACCELERATOR="cpu", PDSH_ARGV_OUT=str(tmp_path / "pdsh_argv.json"))

    runner = subprocess.run(command, env=env, cwd=work, capture_output=True, text=True, timeout=300)
    assert runner.returncode == 0, runner.stderr[-3000:]
    argv = json.loads((tmp_path / "pdsh_argv.json").read_text())
    assert argv[argv.index("-w") + 1] == "node-a,node-b"  # DeepSpeed read the hostfile: two nodes
    exports = next(a for a in argv if a.startswith("export "))
    remote = subprocess.run(["env", "-i", f"PATH={os.environ['PATH']}", "/bin/bash", "-c",
                             f"{exports} cd {work}; {sys.executable} -c \"{REMOTE_PROBE}\""],
                            capture_output=True, text=True, timeout=120)
    assert remote.returncode == 0, remote.stderr[-3000:]
    seen = json.loads(remote.stdout.strip().splitlines()[-1])
    assert seen["env"]["DSTRACE_RUN_DIR"] == str(run_dir) and seen["env"]["DSTRACE_RUN_ID"] == "ds-run"
    due = WindowOptions.from_env(env["DSTRACE_WINDOW"]).due  # one moment for every rank: forwarded as it is
    assert seen["window"] == {"mode": "full", "call": 1, "start": 2, "steps": 4, "after": 30.0, "seconds": 2.0,
                              "due": due} and due is not None
    assert seen["sitecustomize"] == os.path.join(launcher.BOOTSTRAP_DIR, "sitecustomize.py")
    paths = seen["pythonpath"].split(os.pathsep)
    assert paths[:2] == [launcher.BOOTSTRAP_DIR, "/opt/user/lib"]
    assert seen["env"]["NCCL_SOCKET_IFNAME"] == "eth1" and seen["env"]["MY_SETTING"] == "from-cwd"
    assert {p: p.read_text() for p in user_files} == user_files  # the user's own files are never written


def test_env_file_without_user_files_leaves_pythonpath_to_the_runner(tmp_path):
    path, warnings = multinode.write_deepspeed_env(str(tmp_path), {"DSTRACE_RUN_ID": "x", "DSTRACE_RUN_DIR": "/a b"},
                                                   {}, str(tmp_path / "nohome"), str(tmp_path / "nocwd"), ["/boot"])
    assert open(path).read() == "DSTRACE_RUN_ID=x\nDSTRACE_RUN_DIR=/a b\n"
    assert len(warnings) == 1 and "DSTRACE_RUN_DIR" in warnings[0]  # a space: mpirun would pass the quotes on


def test_env_file_follows_the_users_ds_env_file(tmp_path):
    (tmp_path / "custom_env").write_text("MY_SETTING=custom\n")
    path, _ = multinode.write_deepspeed_env(str(tmp_path), {"DSTRACE_RUN_ID": "x"},
                                            {"DS_ENV_FILE": "custom_env"}, str(tmp_path / "nohome"), str(tmp_path), [])
    assert open(path).read() == "MY_SETTING=custom\nDSTRACE_RUN_ID=x\n"


def test_torchrun_nodes_agree_on_a_run_id():
    cmd = ["torchrun", "--nnodes=2:4", "--node-rank", "1", "--rdzv-id", "job42", "train.py", "--nnodes", "9"]
    role = multinode.node_role(cmd, {})
    assert role is not None and role.nnodes == 4 and role.node.endswith("-node1")
    assert multinode.agreed_run_id(None, cmd, {}) == "job42"
    assert multinode.agreed_run_id("mine", cmd, {}) == "mine"
    assert multinode.node_role(["torchrun", "--nproc_per_node", "2", "train.py"], {}) is None
    assert multinode.node_role([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "t.py"], {}).nnodes == 2
    assert multinode.is_deepspeed(["deepspeed", "--hostfile", "h", "t.py"])
