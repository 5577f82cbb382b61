"""The house's floors, read from the imports of every module of dstrace (any import, at the top or inside a
function): runfolder/ at the bottom imports nothing of dstrace above it; recording/ and analysis/ sit side
by side on it and import neither each other nor anything above them; comparison/, viewing/ and trying/
import no verb; the verbs (commands/) are imported by the CLI alone; every import is absolute."""
from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "dstrace"
FLOORS = ("runfolder", "recording", "analysis", "comparison", "viewing", "trying", "commands")
NOT_BELOW = {
    "recording": ("analysis", "comparison", "viewing", "trying", "commands"),
    "analysis": ("recording", "comparison", "viewing", "trying", "commands"),
    "comparison": ("commands",),
    "viewing": ("commands",),
    "trying": ("commands",),
}


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: pathlib.Path) -> list[tuple[str, int, int]]:
    """(module imported, line, relative level) of every import statement in the file."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno, 0) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            # `from dstrace import analysis` imports the floor as much as `import dstrace.analysis` does
            out += [(f"{module}.{alias.name}", node.lineno, node.level) for alias in node.names]
    return out


def _floor(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "dstrace" and parts[1] in FLOORS else None


def _edges() -> list[tuple[str, str, int, int]]:
    """(importing module, imported module, line, level) over every module of dstrace."""
    return [(_module_name(path), imported, line, level)
            for path in sorted(PACKAGE.rglob("*.py")) for imported, line, level in _imports(path)]


EDGES = _edges()


def test_the_modules_are_found():
    importers = {src for src, *_ in EDGES}
    assert {"dstrace.cli", "dstrace.recording.launcher", "dstrace.analysis.loading"} <= importers


def test_runfolder_imports_nothing_of_dstrace_above_it():
    wrong = [f"{src}:{line} imports {dst}" for src, dst, line, _ in EDGES
             if _floor(src) == "runfolder" and dst.startswith("dstrace.") and _floor(dst) != "runfolder"]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("floor", sorted(NOT_BELOW))
def test_a_floor_imports_no_floor_beside_or_above_it(floor):
    wrong = [f"{src}:{line} imports {dst}" for src, dst, line, _ in EDGES
             if _floor(src) == floor and _floor(dst) in NOT_BELOW[floor]]
    assert not wrong, "\n".join(wrong)


def test_only_the_cli_imports_the_verbs():
    wrong = [f"{src}:{line} imports {dst}" for src, dst, line, _ in EDGES
             if _floor(dst) == "commands" and src != "dstrace.cli"]
    assert not wrong, "\n".join(wrong)


def test_every_import_is_absolute():
    wrong = [f"{src}:{line} imports {dst} relatively" for src, dst, line, level in EDGES if level]
    assert not wrong, "\n".join(wrong)
