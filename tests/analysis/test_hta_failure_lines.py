"""A failed HTA breakdown is one problem line that says where HTA failed: HTA 0.5.0's temporal breakdown ends in a
bare `assert` on some H200 traces, which printed as "(AssertionError: )" and told the reader nothing."""
from __future__ import annotations

import importlib.util

from dstrace.analysis.hta_breakdown import _failed


def test_a_bare_assert_names_its_file_line_and_condition(tmp_path):
    """A module of its own, as HTA's is: pytest rewrites the asserts of test modules and would give it a message."""
    source = tmp_path / "breakdown_analysis.py"
    source.write_text("def idle_time_per_rank(non_compute_time):\n    x = 1\n    assert non_compute_time >= 0\n")
    spec = importlib.util.spec_from_file_location("breakdown_analysis_copy", source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        module.idle_time_per_rank(-1.0)
    except AssertionError as exc:
        line = _failed("temporal breakdown", exc)
    assert line == ("HTA temporal breakdown failed (AssertionError at breakdown_analysis.py:3 "
                    "`assert non_compute_time >= 0`); left out")


def test_an_error_with_a_message_keeps_it():
    try:
        {}["stream"]
    except KeyError as exc:
        line = _failed("idle time breakdown", exc)
    assert line == "HTA idle time breakdown failed (KeyError: 'stream'); left out"
