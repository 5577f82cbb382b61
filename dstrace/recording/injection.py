"""Injection: patch DeepSpeed and transformers in every rank process without editing the user's script.

`dstrace record` puts `bootstrap/` first on PYTHONPATH, so each Python process the launcher starts runs
its sitecustomize, which calls `arm()`. `arm()` adds an import finder that applies `hooks.PATCHES` the
moment each target module has been executed, before the user's code can take a reference to the
unpatched functions. Only the standard library is imported here: a process that never imports torch
pays nothing.
"""
from __future__ import annotations

import importlib.abc
import sys

_armed = False


class _PatchingFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: it asks the other finders, then wraps the loader to patch after exec."""

    def __init__(self, patches: dict):
        self.patches = patches

    def find_spec(self, name, path, target=None):
        if name not in self.patches:
            return None
        spec = _find_with(name, path, target, self)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        execute = loader.exec_module
        patch = self.patches[name]

        def exec_module(module):
            execute(module)
            _apply(patch, module)

        loader.exec_module = exec_module
        return spec


def _find_with(name, path, target, me):
    for finder in sys.meta_path:
        if finder is me or not hasattr(finder, "find_spec"):
            continue
        spec = finder.find_spec(name, path, target)
        if spec is not None:
            return spec
    return None


def _apply(patch, module) -> None:
    from dstrace.recording import session

    try:
        patch(module)
    except Exception as e:  # noqa: BLE001 - a DeepSpeed/transformers version we cannot patch runs unpatched
        session.note_error(f"patch {module.__name__}: {type(e).__name__}: {e}")


def arm() -> None:
    """Install the patching finder; start this process's recording now if it is a rank."""
    global _armed
    if _armed:
        return
    _armed = True
    from dstrace.recording import hooks, session

    finder = _PatchingFinder(hooks.PATCHES)
    sys.meta_path.insert(0, finder)
    for name, patch in hooks.PATCHES.items():  # already imported (rare): patch in place
        if name in sys.modules:
            _apply(patch, sys.modules[name])
    if session.is_rank_process():
        session.get()
