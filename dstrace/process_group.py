"""Ending a child that was started in a process group of its own (`start_new_session=True`): the recorder
with its ranks, or TensorBoard with its parsers. One way for every verb that runs such a child."""
from __future__ import annotations

import os
import signal
import subprocess


def stop(child: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM to the child's whole process group, `grace_s` to end (a recorder writes its ranks' files
    then), then SIGKILL."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(child.pid, sig)
        except ProcessLookupError:
            return
        try:
            child.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue
