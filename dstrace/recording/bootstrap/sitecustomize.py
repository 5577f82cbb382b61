"""Run by every Python process under `dstrace record`: this folder, alone, is put first on PYTHONPATH.

It leaves the job's interpreter as it would be without dstrace: the folder is taken off `sys.path`
again, the `dstrace` package is loaded from where dstrace is installed without putting that place on
`sys.path` (so dstrace's environment lends the job none of its packages), and the sitecustomize this
file shadows, if any, is then imported as Python would have imported it.

Kept to old syntax on purpose: a job's interpreter may be older than dstrace supports. Where the
recording code cannot run there, a rank runs unrecorded and leaves a note that `dstrace record` reports.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = os.path.dirname(os.path.dirname(HERE))  # .../dstrace: recording/bootstrap is two levels down
UNRECORDED_PREFIX = "unrecorded."  # unrecorded.<host>.<pid>.json in the run folder (manifest.UNRECORDED_PREFIX)


def _leave_path():
    sys.path[:] = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != HERE]
    sys.path_importer_cache.pop(HERE, None)


def _load_package():
    """Import `dstrace` from its install folder by location: its siblings stay out of reach."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "dstrace", os.path.join(PACKAGE, "__init__.py"), submodule_search_locations=[PACKAGE])
    module = importlib.util.module_from_spec(spec)
    sys.modules["dstrace"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules["dstrace"]
        raise
    return module


def _is_rank():
    if "RANK" in os.environ:
        return True
    return os.environ.get("DSTRACE_SINGLE_PROCESS_PARENT") == str(os.getppid())


def _note_unrecorded(error):
    """A rank whose interpreter cannot run dstrace: one line on stderr and a note for `dstrace record`."""
    import json
    import socket

    message = "%s: %s" % (type(error).__name__, error)
    sys.stderr.write("dstrace: recording is off in pid %d (%s): %s\n" % (os.getpid(), sys.executable, message))
    if not _is_rank():
        return
    note = {"pid": os.getpid(), "host": socket.gethostname(), "rank": os.environ.get("RANK"),
            "python": "%d.%d.%d" % sys.version_info[:3], "executable": sys.executable, "error": message[:500]}
    import re

    run_dir = os.environ.get("DSTRACE_RUN_DIR", "")
    host = re.sub(r"[^A-Za-z0-9_-]", "_", note["host"])  # files.safe_name, without importing dstrace
    path = os.path.join(run_dir, "%s%s.%d.json" % (UNRECORDED_PREFIX, host, os.getpid()))
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
        with os.fdopen(os.open(path, flags, 0o644), "w") as f:
            json.dump(note, f)
    except (OSError, ValueError):
        pass


def _arm():
    try:
        _load_package()
        from dstrace.recording import injection

        injection.arm()
    except Exception as e:  # recording must never stop the user's process from starting
        _note_unrecorded(e)


def _chain():
    """Import the sitecustomize this file shadows, as site.py would have, errors included."""
    mine = sys.modules.pop("sitecustomize", None)
    try:
        import sitecustomize  # noqa: F401 - the user's own, now that this folder is off sys.path
    except ImportError as e:
        if e.name != "sitecustomize":
            raise
        if mine is not None and "sitecustomize" not in sys.modules:
            sys.modules["sitecustomize"] = mine


_leave_path()
if os.environ.get("DSTRACE_RUN_DIR"):
    _arm()
_chain()
