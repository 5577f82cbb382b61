"""The four output formats, through the CLI entry points the `dstrace` command calls."""
import json
import re

import pytest

from dstrace.errors import UserError
from tests.fixtures.reports import analyze_main


def test_json_schema(full_run, capsys):
    assert analyze_main(str(full_run), "--format", "json") == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert doc["schema"] == "dstrace.analysis/1"
    assert doc["trace_dir"] == str(full_run) and doc["world_size"] == 2 and doc["ranks_found"] == [0, 1]
    r0 = doc["ranks"]["0"]
    assert set(r0["busy_us"]) == {"compute", "communication", "memory"}
    ag = r0["collectives"]["AllGather"]
    assert {"count", "bytes", "kernel_us", "wait_us", "transfer_us", "busbw_GBps"} <= set(ag)
    assert isinstance(ag["count"], int) and isinstance(ag["bytes"], int)
    assert doc["steps"]["count"] == 3 and doc["steps"]["ms_median"] > 0
    found = {f["id"]: f for f in doc["findings"]}
    assert {"tp-not-applied", "zero3-gathers-model-per-step", "peer-wait"} <= set(found)
    for f in doc["findings"]:
        assert set(f) == {"id", "ranks", "summary", "evidence", "cause", "remedy", "docs", "config_change"}
        assert f["cause"] and f["remedy"] and f["docs"].startswith("docs/")
    assert "parsing trace 1 of 2" in err


def test_text_is_default_and_leads_with_findings(full_run, capsys):
    analyze_main(str(full_run))
    out = capsys.readouterr().out
    assert out.index("Verdict") < out.index("Time per rank")
    assert re.search(r"^  \[peer-wait\] ranks? [0-9, ]+: rank 0 waits", out, re.M)


def test_markdown_for_an_issue(full_run, capsys):
    analyze_main(str(full_run), "--format", "markdown")
    out = capsys.readouterr().out
    assert out.startswith("## dstrace analysis")
    assert "- **`tp-not-applied`** (ranks 0, 1):" in out
    assert re.search(r"^\| rank \| kind \| count \|", out, re.M)


def test_html_is_one_self_contained_file(full_run, tmp_path, capsys):
    target = tmp_path / "report.html"
    assert analyze_main(str(full_run), "--format", "html", "-o", str(target)) == 0
    assert capsys.readouterr().out == ""
    page = target.read_text()
    assert page.count("<svg") == 2 and "<circle" in page and "<rect" in page
    assert "<script" not in page and "src=" not in page and "@import" not in page


def test_bad_input_raises_user_error_from_main(tmp_path):
    with pytest.raises(UserError):
        analyze_main(str(tmp_path))


def test_output_to_unwritable_path(full_run, tmp_path):
    with pytest.raises(UserError, match="cannot write"):
        analyze_main(str(full_run), "-o", str(tmp_path / "no" / "such" / "dir.txt"))
