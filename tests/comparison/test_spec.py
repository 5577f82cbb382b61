"""Sweep specs: the shipped ones load, placeholders and the environment are filled, bad specs are refused."""
from __future__ import annotations

import json
import os
import sys

import pytest

from dstrace.comparison.spec import expand_env, load_spec
from dstrace.errors import UserError
from tests.fixtures.paths import ROOT

SWEEPS = os.path.join(ROOT, "launch", "sweeps")


@pytest.mark.parametrize("name", ["cpu-tiny.json", "h200x2.json"])
def test_shipped_specs_resolve(name):
    spec = load_spec(os.path.join(SWEEPS, name), {"ds_era": "/opt/ds016", "nproc": "4"})
    assert spec.baseline == spec.configurations[0].name
    for c in spec.configurations:
        assert c.command[0] == sys.executable
        assert not any("{" in a for a in c.command), c.command
        script = next(a for a in c.command if a.endswith(".py"))
        assert os.path.isfile(os.path.join(ROOT, script)), script
        if "torch.distributed.run" in c.command:
            assert c.command[c.command.index("--nproc_per_node") + 1] == "4"
    era = [c for c in spec.configurations if "ds016" in c.name]
    assert era and all(c.env["PYTHONPATH"].startswith("/opt/ds016") for c in era)


def test_env_takes_the_inherited_environment():
    assert expand_env("/era:$PYTHONPATH", {"PYTHONPATH": "/a:/b"}) == "/era:/a:/b"
    assert expand_env("/era:${PYTHONPATH}", {}) == "/era"
    assert expand_env("$HOME/x", {"HOME": "/root"}) == "/root/x"


def write(tmp_path, spec: dict) -> str:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    return str(path)


def test_bad_specs_are_refused_in_one_line(tmp_path):
    ok = {"variables": {"n": "2"}, "configurations": [{"name": "a", "command": ["x", "{n}"]}]}
    assert load_spec(write(tmp_path, ok), {"n": "3"}).configurations[0].command == ["x", "3"]
    cases = [
        ({"configurations": []}, {}, "configurations"),
        ({"configurations": [{"name": "a b", "command": ["x"]}]}, {}, "name"),
        ({"configurations": [{"name": "a", "command": ["x", "{nope}"]}]}, {}, "{nope}"),
        ({"configurations": [{"name": "a", "command": "x y"}]}, {}, "command"),
        ({"baseline": "b", "configurations": [{"name": "a", "command": ["x"]}]}, {}, "baseline"),
        (ok, {"m": "1"}, "--set m"),
        ({"variables": {"era": None}, "configurations": [{"name": "a", "command": ["x"]}]}, {}, "--set era=VALUE"),
    ]
    for spec, overrides, words in cases:
        with pytest.raises(UserError, match=None) as err:
            load_spec(write(tmp_path, spec), overrides)
        assert words in str(err.value) and "\n" not in str(err.value)
