"""dstrace as users install it: a built wheel, installed (not editable) into environments of its own."""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import venv

import pytest

from tests.fixtures.paths import ROOT


INSTALL_TIMEOUT_S = 900


def pip(python: str, *args: str) -> subprocess.CompletedProcess:
    """pip of another environment, seeing only that environment: no PYTHONPATH, and run outside the checkout
    (whose dstrace.egg-info would pass for an installed dstrace); DS_ACCELERATOR unset, as DeepSpeed's setup
    needs when it is built from source."""
    env = {k: v for k, v in os.environ.items() if k not in ("DS_ACCELERATOR", "PYTHONPATH")}
    return subprocess.run([python, "-m", "pip", "--disable-pip-version-check", *args], capture_output=True,
                          text=True, env=env, cwd=os.path.dirname(python), timeout=INSTALL_TIMEOUT_S)


def packages(python: str) -> dict[str, str]:
    """name -> version of every distribution an environment holds."""
    r = pip(python, "list", "--format", "json")
    assert r.returncode == 0, r.stderr[-2000:]
    import json

    return {p["name"].lower().replace("_", "-"): p["version"] for p in json.loads(r.stdout)}


@pytest.fixture(scope="session")
def wheel(tmp_path_factory) -> str:
    """dstrace built the way pip builds it for a user (an isolated build of this checkout)."""
    out = tmp_path_factory.mktemp("wheel")
    source = out / "source"  # a copy: building in the checkout would leave build/ and *.egg-info there
    shutil.copytree(os.path.join(ROOT, "dstrace"), source / "dstrace",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(os.path.join(ROOT, name), source / name)
    r = pip(sys.executable, "wheel", "--no-deps", "-q", "-w", str(out), str(source))
    assert r.returncode == 0, r.stderr[-3000:]
    (path,) = glob.glob(str(out / "dstrace_profiler-*.whl"))
    return path


@pytest.fixture(scope="session")
def tool_env(tmp_path_factory, wheel) -> str:
    """A tools environment holding only dstrace (recording needs nothing else) and a package that would shadow
    the job's DeepSpeed if dstrace lent the job its own environment: the bin folder of that environment."""
    root = tmp_path_factory.mktemp("tool") / "venv"
    venv.EnvBuilder(with_pip=True).create(root)
    python = str(root / "bin" / "python")
    r = pip(python, "install", "-q", "--no-deps", wheel)
    assert r.returncode == 0, r.stderr[-3000:]
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    shadow = os.path.join(site, "deepspeed")
    os.makedirs(shadow)
    with open(os.path.join(shadow, "__init__.py"), "w") as f:
        f.write('__version__ = "shadow-from-the-dstrace-environment"\n')
    return str(root / "bin")
