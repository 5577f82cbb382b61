"""Shared helpers: run the real `dstrace` console script and read what it wrote."""
from __future__ import annotations

import gzip
import json
import os
import socket
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)
LAUNCH = os.path.join(ROOT, "launch")
SCRIPTS = os.path.join(ROOT, "tests", "recording", "scripts")
RUN_TIMEOUT_S = 600


def tool(name: str) -> str:
    """A console script of this environment (dstrace, torchrun, deepspeed)."""
    return os.path.join(BIN, name)


def cpu_env(**extra) -> dict:
    """A job's environment on CPU. DeepSpeed JIT-builds its CPU all-reduce op under one name in every
    release: each release the job runs (0.16.1 from DSTRACE_DEEPSPEED_ERA on its PYTHONPATH, else the
    installed one) gets its own build folder, or alternating releases break each other's build."""
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.update(extra)
    if "TORCH_EXTENSIONS_DIR" not in extra:
        era = os.environ.get("DSTRACE_DEEPSPEED_ERA")
        release = "0.16.1" if era and era in env.get("PYTHONPATH", "").split(os.pathsep) else "installed"
        env["TORCH_EXTENSIONS_DIR"] = os.path.join(os.path.expanduser("~"), ".cache", "torch_extensions",
                                                   f"deepspeed-{release}")
    return env


def dstrace(*args, env=None, cwd=ROOT, timeout=RUN_TIMEOUT_S) -> subprocess.CompletedProcess:
    return subprocess.run([tool("dstrace"), *args], env=env or cpu_env(), cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


def read_json(path: str):
    with open(path) as f:
        return json.load(f)


def read_trace(path: str) -> dict:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def manifests(run_dir: str) -> dict[int, dict]:
    return {m["rank"]: m for m in (read_json(os.path.join(run_dir, n)) for n in os.listdir(run_dir)
                                   if n.endswith(".manifest.json"))}


def traces(run_dir: str) -> list[str]:
    return sorted(os.path.join(run_dir, n) for n in os.listdir(run_dir) if n.endswith(".pt.trace.json.gz"))


def deepspeed_era_path() -> str:
    """DeepSpeed 0.16.1, installed by `make test` beside the current release."""
    path = os.environ.get("DSTRACE_DEEPSPEED_ERA")
    if not path or not os.path.isdir(os.path.join(path, "deepspeed")):
        pytest.skip("DSTRACE_DEEPSPEED_ERA is not set: run the tests with `make test`")
    return path


def era_python() -> str:
    """The python of a job environment of the report's era (DeepSpeed 0.16.1, transformers 4.47), made by
    `make test` apart from dstrace's own environment."""
    path = os.environ.get("DSTRACE_ERA_PYTHON")
    if not path or not os.path.isfile(path):
        pytest.skip("DSTRACE_ERA_PYTHON is not set: run the tests with `make test`")
    return path


def free_port() -> int:
    """A port for the launcher's rendezvous: the default 29500 may be taken by another job on the machine."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def record_zero3_chat(run_dir: str, *script_args: str, launcher: str = "torchrun", env=None,
                      options: tuple[str, ...] = ()):
    if launcher == "torchrun":
        command = [tool("torchrun"), "--nproc_per_node", "2", "--master_port", str(free_port())]
    else:
        command = [tool("deepspeed"), "--num_gpus", "2", "--master_port", str(free_port())]
    return dstrace("record", "-o", run_dir, *options, "--", *command, os.path.join(LAUNCH, "zero3_chat.py"),
                   "--size", "tiny", *script_args, env=env)


@pytest.fixture(scope="session")
def zero3_run(tmp_path_factory):
    """The report's path, tiny, under real DeepSpeed ZeRO-3 on two gloo ranks, via torchrun."""
    run_dir = str(tmp_path_factory.mktemp("runs") / "zero3")
    result = record_zero3_chat(run_dir, "--max-new-tokens", "8")
    return run_dir, result
