"""Sweep specs: a JSON file naming configurations, each a launch command with placeholders.

    {"description": "...", "baseline": "device_map",
     "variables": {"size": "mini", "nproc": "2", "ds_era": null}, "env": {"DS_ACCELERATOR": "cpu"},
     "configurations": [{"name": "zero3-tp2", "command": ["{python}", "-m", "torch.distributed.run", ...],
                         "env": {"PYTHONPATH": "{ds_era}:$PYTHONPATH"}}]}

The top-level `env` applies to every configuration, a configuration's own `env` on top of it.
`{name}` in a command or env value is a variable: the spec's default, replaced by `--set name=value`; a
variable whose default is null must be set. `{python}` is the interpreter running the sweep. `$NAME`
in an env value is the inherited environment variable (empty when unset).
"""
from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass, field

from dstrace.errors import UserError

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
ENV_REFERENCE = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?")
BUILTINS = ("python",)
MAX_SPEC_BYTES = 16 << 20
"""A spec names a few configurations: kilobytes. A larger file is refused before it is read."""


@dataclass
class Configuration:
    name: str
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)
    note: str | None = None


@dataclass
class SweepSpec:
    path: str
    description: str
    baseline: str | None
    variables: dict[str, str]
    configurations: list[Configuration]


class _Variables(dict):
    def __init__(self, values: dict, where: str):
        super().__init__(values)
        self.where = where

    def __missing__(self, key):
        raise UserError(f"unknown placeholder {{{key}}} in {self.where}; known: {', '.join(sorted(self))}")


def parse_overrides(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise UserError(f"--set takes NAME=VALUE, not {pair!r}")
        out[name] = value
    return out


def _fill(text: str, variables: dict, where: str) -> str:
    try:
        return text.format_map(_Variables(variables, where))
    except (ValueError, IndexError) as exc:
        raise UserError(f"bad placeholder in {where}: {text!r} ({exc})") from None


def expand_env(value: str, environ: dict[str, str]) -> str:
    """`$NAME` / `${NAME}` from the inherited environment; separators left dangling by an empty one go."""
    expanded = ENV_REFERENCE.sub(lambda m: environ.get(m.group(1), ""), value)
    return os.pathsep.join(p for p in expanded.split(os.pathsep) if p) if os.pathsep in value else expanded


def load_spec(path: str, overrides: dict[str, str]) -> SweepSpec:
    from dstrace.runfolder.untrusted import Refused, read_bytes, unreadable

    try:
        raw = json.loads(read_bytes(path, MAX_SPEC_BYTES))
    except OSError as exc:
        raise UserError(f"cannot read sweep spec {path}: {unreadable(path, exc)}") from None
    except Refused as exc:
        raise UserError(f"cannot read sweep spec {path}: {exc}") from None
    except ValueError as exc:
        raise UserError(f"sweep spec {path} is not valid JSON: {exc}") from None
    except RecursionError:
        raise UserError(f"sweep spec {path} is not valid JSON: nested too deeply for a spec") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("configurations"), list) or not raw["configurations"]:
        raise UserError(f"sweep spec {path} needs a non-empty \"configurations\" list")
    defaults = raw.get("variables") or {}
    if not isinstance(defaults, dict):
        raise UserError(f"\"variables\" of {path} must map names to default values")
    if not isinstance(raw.get("description", ""), str):
        raise UserError(f"\"description\" of {path} must be text")
    unknown = sorted(set(overrides) - set(defaults))
    if unknown:
        raise UserError(f"--set {unknown[0]}: the spec {path} has no such variable; "
                        f"its variables: {', '.join(sorted(defaults)) or 'none'}")
    variables = {k: (None if v is None else str(v)) for k, v in defaults.items()}
    variables.update(overrides)
    missing = sorted(k for k, v in variables.items() if v is None)
    if missing:
        raise UserError(f"the sweep spec {path} needs " + " ".join(f"--set {k}=VALUE" for k in missing))
    values = dict(variables, python=sys.executable)
    shared_env = raw.get("env") or {}
    if not isinstance(shared_env, dict) or not all(isinstance(v, str) for v in shared_env.values()):
        raise UserError(f"\"env\" of {path} must map names to strings")
    configs, names = [], set()
    for i, c in enumerate(raw["configurations"]):
        name = c.get("name") if isinstance(c, dict) else None
        if not isinstance(name, str) or not NAME.match(name) or name in names:
            raise UserError(f"configuration {i + 1} of {path} needs a unique \"name\" of letters, digits, . _ -")
        names.add(name)
        command = c.get("command")
        if not isinstance(command, list) or not command or not all(isinstance(a, str) for a in command):
            raise UserError(f"configuration {name} of {path} needs a \"command\": a list of strings")
        own_env = c.get("env") or {}
        if not isinstance(own_env, dict) or not all(isinstance(v, str) for v in own_env.values()):
            raise UserError(f"configuration {name} of {path}: \"env\" must map names to strings")
        env = {**shared_env, **own_env}
        where = f"configuration {name} of {path}"
        note = c.get("note")
        if note is not None and not isinstance(note, str):
            raise UserError(f"configuration {name} of {path}: \"note\" must be text")
        configs.append(Configuration(name=name, command=[_fill(a, values, where) for a in command],
                                     env={k: _fill(v, values, where) for k, v in env.items()}, note=note))
    baseline = raw.get("baseline")
    if baseline is not None and (not isinstance(baseline, str) or baseline not in names):
        raise UserError(f"the baseline {str(baseline)[:60]!r} of {path} is not one of its configurations")
    return SweepSpec(path=os.path.abspath(path), description=raw.get("description", ""), baseline=baseline,
                     variables={k: v for k, v in variables.items() if v is not None}, configurations=configs)
