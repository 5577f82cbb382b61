"""TensorBoard with the PyTorch profiler plugin over one run, every rank a worker of it.

The plugin treats each folder holding `*.pt.trace.json[.gz]` files as a run and each file as a
worker (`<host>_rank<N>` from `<host>_rank<N>.<ms>.pt.trace.json.gz`); it numbers spans per worker,
so the ranks' different `<ms>` stamps still land in one span, which its distributed view needs. A
run folder also holds manifests and may sit among other runs, so TensorBoard is pointed at a
temporary log folder holding just this run: one sub-folder named after it, with links to its traces.
"""
from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import threading

from dstrace.errors import UserError
from dstrace.runfolder.names import TRACE_SUFFIXES

PLUGIN_ROUTE = "#pytorch_profiler"


def trace_files(run_dir: str) -> list[str]:
    if not os.path.isdir(run_dir):
        raise UserError(f"{run_dir} is not a folder; give the run folder written by `dstrace record`")
    names = sorted(n for n in os.listdir(run_dir) if n.endswith(TRACE_SUFFIXES))
    if not names:
        raise UserError(f"no trace files (*.pt.trace.json or *.pt.trace.json.gz) in {run_dir}; "
                        "TensorBoard's profiler plugin reads only files named so")
    return [os.path.join(run_dir, n) for n in names]


def make_logdir(run_dir: str, parent: str | None = None) -> str:
    """A fresh log folder with `<run name>/` linking to the run's traces; the caller removes it."""
    files = trace_files(run_dir)
    logdir = tempfile.mkdtemp(prefix="dstrace-tensorboard-", dir=parent)
    run_folder = os.path.join(logdir, os.path.basename(os.path.abspath(run_dir)))
    os.mkdir(run_folder)
    for path in files:
        os.symlink(os.path.abspath(path), os.path.join(run_folder, os.path.basename(path)))
    return logdir


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


def serve(run_dir: str, port: int = 0) -> int:
    """Serve until Ctrl-C or SIGTERM, then remove the temporary log folder."""
    logdir = make_logdir(run_dir)
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        url = _start(logdir, port)
        print(f"dstrace: TensorBoard at {url}{PLUGIN_ROUTE} (PyTorch profiler: run "
              f"{os.path.basename(os.path.abspath(run_dir))}, one worker per rank); Ctrl-C to stop", flush=True)
        try:
            while not stop.wait(0.5):
                pass
        except KeyboardInterrupt:
            pass
        print("dstrace: TensorBoard stopped", file=sys.stderr, flush=True)
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)
        shutil.rmtree(logdir, ignore_errors=True)
