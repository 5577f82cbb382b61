"""How long `dstrace analyze` takes, and how much memory it holds, on a run of many ranks read from their
kept reductions alone (issue #8: 256 ranks in under a minute; issue #29: 1,024 ranks under 8 s, 10,000
under 60 s, under 2 GB). The run is the one tests/multinode/test_scale.py checks for correctness
(`dstrace.testing.scale_run`): ranks on hosts of 8, 360 collectives each, clocks off by a known offset per
host, one late rank, no traces.

    python bench/summaries_scale.py --world 1024 --repeats 3
    python bench/summaries_scale.py --world 256 --against /tmp/old-checkout   # old vs new, alternating
    python bench/summaries_scale.py --world 10000 --repeats 1 --record analysis/bench-scale.json
    python bench/summaries_scale.py --world 10000 --keep /tmp/k10k   # written once, analyzed again next time

It exits non-zero when the reports differ (`--against`) or this checkout's median peak memory is over
`--peak-limit` (2e9 bytes: issue #29's target, which holds whatever the load).

Each checkout writes the run with its own generator (the file format may differ between them), into its
own folder. Each analysis is a fresh `python -m dstrace.cli analyze` (kept report removed first); its wall
time, CPU time (user + system) and peak resident memory come from the child's own rusage (`os.wait4`). On
a shared machine the wall time includes waiting for a core: compare by the CPU time, or old against new
run in the same minutes (`--against`), whose reports must be byte-identical once the folder's path and
the notes naming the files the ranks were read from (`SOURCE_NOTES`) are set aside.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import re
import statistics
import subprocess
import sys
import tempfile
import time

PEAK_LIMIT_BYTES = 2e9
"""Issue #29: 10,000 ranks analyzed from kept reductions in under 2 GB. Peak memory does not depend on the machine's
load (unlike the times), so the bench holds every run to it."""
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE_NOTES = re.compile(r'^\s*"(?:read from the \d+ rank summaries|ranks? [\d, -]+ read from (?:their|its) kept reductions?'
                          r'|[a-z0-9-]+: (?:full traces in|its ranks\' traces, not in|its rank\'s trace, not in) '
                          r'|read_from": ").*",?$')
"""The notes and keys that say which files the ranks were read from: they name the file format, which differs
between checkouts of different formats (one JSON line each in the report; `read_from` is newer than some)."""


def _env(repo: str) -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join([repo] + [p for p in [os.environ.get("PYTHONPATH")] if p]),
                OMP_NUM_THREADS="1")


def write_run(folder: str, world: int, workers: int, repo: str) -> float:
    """The synthetic run, written by `workers` processes with checkout `repo`'s generator; seconds taken."""
    late = min(77, world - 1)
    t0 = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c", "import sys; from dstrace.testing.scale_run import write_run; "
                               f"write_run(sys.argv[1], world={world}, late_rank={late}, "
                               f"ranks=range({i}, {world}, {workers}))", folder], cwd=repo, env=_env(repo))
             for i in range(workers)]
    if any(p.wait() != 0 for p in procs):
        sys.exit(f"writing the run with {repo} failed")
    return time.perf_counter() - t0


def analyze(folder: str, repo: str, report: str) -> dict:
    """One `dstrace analyze` of `folder` with the dstrace of checkout `repo`: wall s, CPU s, peak RSS MiB."""
    for kept in os.listdir(folder):
        if kept.startswith(".dstrace-report."):
            os.unlink(os.path.join(folder, kept))  # time the analysis, not the kept report
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "dstrace.cli", "analyze", folder, "--format", "json", "-o", report],
                            cwd=repo, env=_env(repo), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    stderr = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"analyze with {repo} failed ({proc.returncode}): {stderr.decode()[-2000:]}")
    rss_mib = usage.ru_maxrss / 1024 if sys.platform != "darwin" else usage.ru_maxrss / 2**20
    return {"wall_s": round(wall, 2), "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
            "peak_rss_mib": round(rss_mib)}


def comparable(report: str, folder: str) -> str:
    """A JSON report's text with its folder's path as <run> and without the `SOURCE_NOTES` lines."""
    with open(report, encoding="utf-8") as f:
        text = f.read().replace(folder, "<run>")
    return "\n".join(line for line in text.splitlines() if not SOURCE_NOTES.match(line))


def same_reports(a: str, folder_a: str, b: str, folder_b: str) -> str | None:
    """None when the two JSON reports are byte-identical but for `comparable`'s changes, else the first
    top-level key that differs."""
    ta, tb = comparable(a, folder_a), comparable(b, folder_b)
    if ta == tb:
        return None
    ja, jb = json.loads(ta), json.loads(tb)
    return next((k for k in sorted(set(ja) | set(jb)) if ja.get(k) != jb.get(k)), "(formatting)")


def summary(runs: list[dict]) -> dict:
    return {k: statistics.median(r[k] for r in runs) for k in ("wall_s", "cpu_s", "peak_rss_mib")} | {
        "runs": runs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--against", metavar="CHECKOUT",
                    help="another dstrace checkout (e.g. a git worktree of the previous commit): each repeat "
                         "runs it and this one in turn, and their JSON reports must be identical")
    ap.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1), help="processes writing the run")
    ap.add_argument("--record", metavar="FILE", help="add this measurement to a JSON list in FILE")
    ap.add_argument("--keep", metavar="DIR", help="write the run to DIR and keep it (default: a temporary folder)")
    ap.add_argument("--peak-limit", type=float, default=PEAK_LIMIT_BYTES, metavar="BYTES",
                    help="exit non-zero when this checkout's median peak memory is above it (default: 2e9, "
                         "issue #29's target; 0: no limit)")
    args = ap.parse_args()

    base = args.keep or tempfile.mkdtemp(prefix="dstrace-scale-")
    reports = tempfile.mkdtemp(prefix="dstrace-scale-reports-")
    try:
        checkouts = {"new": REPO} | ({"old": os.path.abspath(args.against)} if args.against else {})
        folders = {name: os.path.join(base, name) for name in checkouts}
        wrote = 0.0
        for name, repo in checkouts.items():
            os.makedirs(folders[name], exist_ok=True)
            if not os.listdir(folders[name]):  # a kept folder is written once
                wrote = write_run(folders[name], args.world, args.workers, repo)
                print(f"{args.world} ranks written in {wrote:.1f} s with {name}")
        runs: dict[str, list[dict]] = {name: [] for name in checkouts}
        for i in range(args.repeats):
            for name, repo in (checkouts.items() if i % 2 == 0 else reversed(checkouts.items())):
                runs[name].append(analyze(folders[name], repo, os.path.join(reports, f"{name}.json")))
                print(f"  {name}: {runs[name][-1]}")
        result = {"world": args.world, "collectives_per_rank": 360, "host": platform.node(),
                  "cpus": os.cpu_count(), "load_1min": round(os.getloadavg()[0], 1),
                  "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                  "command": "python bench/summaries_scale.py " + " ".join(sys.argv[1:]),
                  "write_s": round(wrote, 1), "peak_limit_bytes": args.peak_limit} | {
                      name: summary(r) for name, r in runs.items()}
        if args.against:
            differs = same_reports(os.path.join(reports, "new.json"), folders["new"],
                                   os.path.join(reports, "old.json"), folders["old"])
            result["reports_identical"] = differs is None
            result["ratio_cpu_old_over_new"] = round(result["old"]["cpu_s"] / result["new"]["cpu_s"], 2)
            result["ratio_wall_old_over_new"] = round(result["old"]["wall_s"] / result["new"]["wall_s"], 2)
            print("reports identical" if differs is None else f"REPORTS DIFFER at {differs!r}")
        for name in runs:
            s = result[name]
            print(f"{args.world} ranks from kept reductions, {name}: median wall {s['wall_s']:.2f} s, CPU {s['cpu_s']:.2f} s, "
                  f"peak {s['peak_rss_mib']:.0f} MiB ({args.repeats} runs)")
        if args.record:
            kept = json.load(open(args.record)) if os.path.exists(args.record) else []
            with open(args.record, "w") as f:
                json.dump(kept + [result], f, indent=1)
                f.write("\n")
        over = bool(args.peak_limit) and result["new"]["peak_rss_mib"] * 2**20 > args.peak_limit
        if over:
            print(f"PEAK OVER LIMIT: {result['new']['peak_rss_mib']:.0f} MiB is more than {args.peak_limit:.3g} bytes")
        if (args.against and not result["reports_identical"]) or over:
            sys.exit(1)
    finally:
        shutil.rmtree(reports, ignore_errors=True)
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
