"""Installing dstrace changes nothing a recorded job depends on."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile

from tests.fixtures.processes import dstrace, era_python
from tests.fixtures.runs import manifests
from tests.install.conftest import packages, pip

WORKLOADS = ("torch", "deepspeed", "transformers", "accelerate")


def requirements(wheel: str) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    return [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Requires-Dist:")]


def test_the_wheel_requires_no_workload_library_and_pins_nothing(wheel):
    core = [r for r in requirements(wheel) if "extra ==" not in r]
    names = {re.split(r"[<>=!~ ;\[]", r, maxsplit=1)[0].lower() for r in core}
    assert names and not names & set(WORKLOADS), core
    assert not [r for r in core if "==" in r], core
    demo = [r for r in requirements(wheel) if "extra == \"demo\"" in r]
    assert {re.split(r"[<>=!~ ;\[]", r, maxsplit=1)[0].lower() for r in demo} >= set(WORKLOADS)


def test_pip_install_into_a_job_environment_of_the_report_era_keeps_its_libraries(tmp_path, wheel):
    """A copy of the era's job environment (DeepSpeed 0.16.1, transformers 4.47): `pip install dstrace` there
    adds dstrace and what its analysis needs, and upgrades or downgrades none of the job's libraries."""
    source = os.path.dirname(os.path.dirname(era_python()))
    env_dir = tmp_path / "job-env"
    shutil.copytree(source, env_dir, symlinks=True)
    python = str(env_dir / "bin" / "python")
    before = packages(python)
    assert before["deepspeed"] == "0.16.1" and before["transformers"].startswith("4.")
    r = pip(python, "install", "-q", wheel)
    assert r.returncode == 0, r.stderr[-3000:]
    after = packages(python)
    assert "dstrace-profiler" in after
    assert {name: after.get(name) for name in WORKLOADS} == {name: before[name] for name in WORKLOADS}
    r = subprocess.run([python, "-m", "dstrace.cli", "--version"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("dstrace "), r.stderr
    # and a job there, recorded by the dstrace of another environment (this one's), keeps the job's releases
    run_dir = str(tmp_path / "run")
    r = dstrace("record", "-o", run_dir, python, "-c", "import deepspeed, transformers; print(deepspeed.__version__)")
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "0.16.1"
    (m,) = manifests(run_dir).values()
    assert (m["versions"]["deepspeed"], m["versions"]["transformers"]) == ("0.16.1", before["transformers"])


def test_the_wheel_ships_the_docs_its_findings_point_to(wheel, tmp_path):
    """Unpacked as pip installs it (a pure-Python wheel): `dstrace explain` there prints the page from the
    wheel and links it under the Documentation URL of the wheel's own metadata, or, with none (no public
    repository yet: no made-up URL), as the page shipped in the wheel."""
    from dstrace.analysis.findings import DOCS

    with zipfile.ZipFile(wheel) as z:
        z.extractall(tmp_path / "site")
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    urls = [line.split(",", 1)[1].strip() for line in text.splitlines()
            if line.startswith("Project-URL: Documentation,")]
    url = urls[0] if urls else (tmp_path / "site" / "dstrace" / "docs").resolve().as_uri()
    assert {d.split("#")[0].removeprefix("docs/") for d in DOCS.values()} <= set(os.listdir(tmp_path / "site" /
                                                                                            "dstrace" / "docs"))
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "site"))
    r = subprocess.run([sys.executable, "-m", "dstrace.cli", "explain", "peer-wait"], capture_output=True, text=True,
                       env=env, cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == f"peer-wait: {url}/analysis-schema.md#cross-rank-alignment"
    assert "## Cross-rank alignment" in r.stdout
    r = subprocess.run([sys.executable, "-c", "from dstrace.explain import shipped_doc; print(shipped_doc('x.md'))"],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert r.stdout.strip() == str(tmp_path / "site" / "dstrace" / "docs" / "x.md"), "the docs read are the wheel's"
