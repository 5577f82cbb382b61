"""Run by every Python process under `dstrace record` (this folder is first on PYTHONPATH).

Arms dstrace's recording, then runs the sitecustomize this file shadows, if any, so the user's
environment behaves as before.
"""
import os
import sys


def _arm():
    try:
        from dstrace.recording import injection

        injection.arm()
    except Exception as e:  # recording must never stop the user's process from starting
        sys.stderr.write(f"dstrace: recording is off in pid {os.getpid()}: {type(e).__name__}: {e}\n")


def _chain():
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        folder = os.path.abspath(entry or os.getcwd())
        candidate = os.path.join(folder, "sitecustomize.py")
        if folder != here and os.path.isfile(candidate):
            with open(candidate) as f:
                code = compile(f.read(), candidate, "exec")
            exec(code, {"__name__": "sitecustomize", "__file__": candidate})
            return


if os.environ.get("DSTRACE_RUN_DIR"):
    _arm()
_chain()
