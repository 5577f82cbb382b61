"""Under `dstrace record` the job imports exactly what it would without it, from its own environment."""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import pytest

from tests.fixtures.processes import cpu_env, era_python
from tests.fixtures.runs import manifests, read_json


# What the job sees of its interpreter, printed as it exits.
PROBE = r'''
import json, os, sys
import torch.distributed, deepspeed, transformers
import sitecustomize
top = sorted({name.split(".")[0] for name in sys.modules})
print("probe=" + json.dumps({
    "path": sys.path, "modules": top, "deepspeed": deepspeed.__version__,
    "transformers": transformers.__version__, "sitecustomize": getattr(sitecustomize, "__file__", None),
    "user_site_ran": os.environ.get("USER_SITECUSTOMIZE_RAN"),
}))
'''
USER_SITECUSTOMIZE = "import os\nos.environ['USER_SITECUSTOMIZE_RAN'] = 'yes'\n"


def probe(result: subprocess.CompletedProcess) -> dict:
    assert result.returncode == 0, result.stderr[-3000:]
    line = next(x for x in result.stdout.splitlines() if x.startswith("probe="))
    return json.loads(line[len("probe="):])


def test_the_job_imports_what_it_would_without_dstrace(tmp_path, tool_env):
    """dstrace from a tools environment records a job of another environment: the job's own DeepSpeed 0.16.1
    and transformers 4.47 are used and recorded (not the tools environment's shadowing `deepspeed`), its
    sys.path is the same entry for entry (an empty PYTHONPATH entry included), the user's own sitecustomize
    still runs, and the modules it holds differ only by dstrace's recording code and the standard library."""
    python = era_python()
    user_site = tmp_path / "usersite"
    user_site.mkdir()
    (user_site / "sitecustomize.py").write_text(USER_SITECUSTOMIZE)
    script = tmp_path / "job.py"
    script.write_text(PROBE)
    env = cpu_env(PYTHONPATH=f":{user_site}")
    plain = probe(subprocess.run([python, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                                 timeout=300))
    run_dir = tmp_path / "run"
    recorded = probe(subprocess.run([os.path.join(tool_env, "dstrace"), "record", "-o", str(run_dir), python,
                                     str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                                    timeout=300))
    assert plain["deepspeed"] == recorded["deepspeed"] == "0.16.1"
    assert recorded["transformers"] == plain["transformers"]
    assert recorded["path"] == plain["path"]
    assert recorded["sitecustomize"] == plain["sitecustomize"] == str(user_site / "sitecustomize.py")
    assert recorded["user_site_ran"] == plain["user_site_ran"] == "yes"
    assert set(plain["modules"]) <= set(recorded["modules"])
    extra = set(recorded["modules"]) - set(plain["modules"])
    assert extra <= {"dstrace"} | set(sys.stdlib_module_names), extra
    (m,) = manifests(str(run_dir)).values()
    assert m["versions"]["deepspeed"] == "0.16.1" and m["versions"]["transformers"] == plain["transformers"]
    assert m["status"] == "complete"


def _old_interpreter() -> str | None:
    """A Python older than 3.7, whose parser rejects dstrace's recording code, if this machine has one."""
    for path in sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.[0-6].*/bin/python3"))):
        return path
    return None


def test_an_interpreter_that_cannot_run_the_recording_code_runs_its_job_unrecorded(tmp_path):
    old = _old_interpreter()
    if old is None:
        pytest.skip("no Python older than 3.7 on this machine")
    run_dir = str(tmp_path / "run")
    r = subprocess.run([os.path.join(os.path.dirname(sys.executable), "dstrace"), "record", "-o", run_dir, old,
                        "-c", "print('the job ran')"], env=cpu_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "the job ran" in r.stdout
    assert "ran unrecorded" in r.stderr and "cannot run dstrace's recording code" in r.stderr
    run = read_json(os.path.join(run_dir, "run.json"))
    assert run["status"] == "incomplete"
    assert any("ran unrecorded" in p and old in p for p in run["problems"])
