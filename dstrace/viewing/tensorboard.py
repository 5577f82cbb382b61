"""TensorBoard with the PyTorch profiler plugin over one run, every rank a worker of it.

The plugin treats each folder holding `*.pt.trace.json[.gz]` files as a run and each file as a
worker (`<host>_rank<N>` from `<host>_rank<N>.<ms>.pt.trace.json.gz`); it numbers spans per worker,
so the ranks' different `<ms>` stamps still land in one span, which its distributed view needs. A
run folder also holds manifests and may sit among other runs, so TensorBoard is pointed at a
temporary log folder holding just this run: one sub-folder named after it, with links to its traces.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

from dstrace import process_group
from dstrace.errors import UserError
from dstrace.runfolder.folder import FolderRefused, RunFolder
from dstrace.say import say

PLUGIN_ROUTE = "#pytorch_profiler"


def trace_files(run_dir: str) -> list[str]:
    """The run's torch.profiler traces: the plugin reads only files named so."""
    if not os.path.isdir(run_dir):
        raise UserError(f"{run_dir} is not a folder; give the run folder written by `dstrace record`")
    try:
        traces = RunFolder.scan(run_dir).traces
    except FolderRefused as exc:
        raise UserError(f"{exc}; give a folder you can read") from None
    if not traces:
        raise UserError(f"no trace files (*.pt.trace.json or *.pt.trace.json.gz) in {run_dir}; "
                        "TensorBoard's profiler plugin reads only files named so")
    return [os.path.join(run_dir, f.name) for f in traces]


def make_logdir(run_dir: str, files: list[str], parent: str | None = None) -> str:
    """A fresh log folder with `<run name>/` linking to the run's traces (`files`); the caller removes it."""
    logdir = tempfile.mkdtemp(prefix="dstrace-tensorboard-", dir=parent)
    run_folder = os.path.join(logdir, os.path.basename(os.path.abspath(run_dir)))
    os.mkdir(run_folder)
    for path in files:
        os.symlink(os.path.abspath(path), os.path.join(run_folder, os.path.basename(path)))
    return logdir


CHARTS_HOST = "www.gstatic.com"
"""The plugin's page loads Google Charts from here before it draws any chart."""
LOAD_TIMEOUT_S = 600
POLL_S = 0.5


def charts_reachable(timeout_s: float = 2.0) -> bool:
    try:
        socket.create_connection((CHARTS_HOST, 443), timeout=timeout_s).close()
    except OSError:
        return False
    return True


def offline_note(run_dir: str) -> str:
    return (f"{CHARTS_HOST} cannot be reached: the PyTorch profiler page will list the run and its workers but "
            "draw none of its charts (it loads Google Charts from there); offline, read the HTML report "
            f"(dstrace view {run_dir} --report) or open the merged timeline in Perfetto "
            f"(dstrace view {run_dir} --perfetto)")


def _start(logdir: str, port: int) -> str:
    """TensorBoard on 127.0.0.1 in a background thread of this process; returns its URL."""
    try:
        import torch_tb_profiler  # noqa: F401  (the plugin TensorBoard finds through its entry point)
        from tensorboard import program
    except ImportError as exc:
        raise UserError(f"--tensorboard needs tensorboard and torch-tb-profiler installed ({exc})") from None
    board = program.TensorBoard()
    board.configure(logdir=logdir, host="127.0.0.1", port=port, reload_interval=0)
    try:
        return board.launch()
    except program.TensorBoardServerException as exc:
        raise UserError(f"TensorBoard could not start: {exc.msg}") from None


def _server(logdir: str, port: int) -> int:
    """The TensorBoard process (`python -m dstrace.viewing.tensorboard LOGDIR PORT`): prints its URL, then
    serves until it is terminated or the `dstrace view` that started it is gone (killed, it could not stop
    this process group: the server must not outlive it)."""
    parent = os.getppid()
    try:
        url = _start(logdir, port)
    except UserError as e:
        say(str(e))
        return e.code
    print(url, flush=True)
    while os.getppid() == parent:
        time.sleep(1.0)
    os.killpg(os.getpgrp(), signal.SIGTERM)
    return 0


def _loaded(url: str, run_name: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}data/plugin/pytorch_profiler/runs", timeout=5) as r:
            return run_name in json.load(r).get("runs", [])
    except (OSError, ValueError):
        return False


def serve(run_dir: str, port: int = 0) -> int:
    """TensorBoard in a process group of its own (the plugin parses each trace in a child process: Ctrl-C
    must not reach them), its URL printed once the plugin lists the run; until Ctrl-C or SIGTERM, then the
    temporary log folder is removed."""
    files = trace_files(run_dir)
    logdir = make_logdir(run_dir, files)
    run_name = os.path.basename(os.path.abspath(run_dir))
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    proc, interrupted = None, False
    stack = contextlib.ExitStack()
    try:
        if not charts_reachable():
            say(offline_note(run_dir))
        say(f"starting TensorBoard; its PyTorch profiler plugin parses the {len(files)} trace(s) of "
            f"run {run_name} (seconds per 100 MB of trace), then the address follows")
        log = stack.enter_context(tempfile.TemporaryFile(mode="w+"))  # TensorBoard's chatter, shown if it fails
        # SIGINT blocked from before the start until `proc` is set, so that a Ctrl-C cannot leave the server
        # running unseen; the server and the plugin's parsers keep it blocked (they stop on SIGTERM).
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            proc = subprocess.Popen([sys.executable, "-m", "dstrace.viewing.tensorboard", logdir, str(port)],
                                    stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True)
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        url = proc.stdout.readline().strip()
        if not url:
            code = proc.wait() or 1
            log.seek(0)
            sys.stderr.write("".join(log.readlines()[-20:]))
            return code
        deadline = time.monotonic() + LOAD_TIMEOUT_S
        while not _loaded(url, run_name) and proc.poll() is None and not stop.is_set():
            if time.monotonic() > deadline:
                say(f"the plugin has not listed run {run_name} after {LOAD_TIMEOUT_S} s; it may still be parsing")
                break
            time.sleep(POLL_S)
        if proc.poll() is not None or stop.is_set():
            return proc.poll() or 0
        print(f"dstrace: TensorBoard at {url}{PLUGIN_ROUTE} (PyTorch profiler: run {run_name}, one worker per "
              "rank); Ctrl-C to stop", flush=True)
        while not stop.wait(POLL_S) and proc.poll() is None:
            pass
        return 0
    except KeyboardInterrupt:
        interrupted = True
        return 0
    finally:
        if proc is not None:
            _stop(proc)
        if proc is not None or interrupted:
            print("dstrace: TensorBoard stopped", file=sys.stderr, flush=True)
        stack.close()
        signal.signal(signal.SIGTERM, previous)
        shutil.rmtree(logdir, ignore_errors=True)


def _stop(proc: subprocess.Popen) -> None:
    """TensorBoard and the plugin's parsers, all of its process group."""
    process_group.stop(proc, 10.0)
    if proc.stdout:
        proc.stdout.close()


if __name__ == "__main__":
    sys.exit(_server(sys.argv[1], int(sys.argv[2])))
