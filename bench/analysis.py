"""Time and memory of `dstrace analyze` against HTA alone on the same run folder.

The cases, each run `--repeats` times in alternating order, each in a fresh process:
  orjson  the floor the issue measures against: inflate each trace and `orjson.loads` it into dicts, nothing else
  hta     bench/hta_alone.py: HTA's TraceAnalysis and the breakdowns dstrace reports
  first   dstrace analyze with no cache beside the traces (deleted before each run): the default number of
          parse workers (within the memory budget)
  first2  the same with --parse-workers 2 (two traces parsed at once, whatever the budget)
  cached-parse  dstrace analyze again with each trace's parse cache in place, the kept report deleted
  second  dstrace analyze again, every cache in place (the kept report comes back)
Wall time is measured around the process, CPU time (user + system) from its resource usage; peak memory is the largest sum over the process and all its
children (parse workers), sampled every 20 ms, of RSS and, with --pss, every 200 ms of PSS (proportional set size: a page shared
by n processes, like the libraries and the data forked workers inherit, counts 1/n in each, so the sum
counts it once; RSS counts it in every process), and, separately, the main process's own peak RSS.

    python bench/analysis.py traces/h200-zero3-tp2-ds0.16.1 --repeats 5 --json /tmp/bench.json
"""
from __future__ import annotations

import argparse
import compileall
import glob
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import psutil

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


PSS_EVERY = 10
"""With --pss, PSS is read at every 10th sample: reading it walks every page table of every process (smaps),
under the lock that a process's own page faults and unmappings take, so it slows the process measured (read
every 20 ms, it made the 2.2 GB orjson floor take 6.46 s instead of 5.39 s). Time runs go without it."""


def run_measured(cmd: list[str], pss: bool = False) -> dict:
    """Run cmd; wall seconds, CPU seconds (user + system, the process and the children it waited for: parse
    workers), peak RSS and PSS of the whole process tree, peak RSS of the main process (bytes)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=REPO)
    ps = psutil.Process(proc.pid)
    tree_peak = main_peak = pss_peak = 0
    tick = 0
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        try:
            procs = [ps] + ps.children(recursive=True)
            rss = [p.memory_info().rss for p in procs]
            tree_peak, main_peak = max(tree_peak, sum(rss)), max(main_peak, rss[0])
            if pss and tick % PSS_EVERY == 0:
                pss_peak = max(pss_peak, sum(p.memory_full_info().pss for p in procs))
        except psutil.Error:
            pass
        tick += 1
        time.sleep(0.02)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode(errors="replace")
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{err[-2000:]}")
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "tree_peak_rss": tree_peak,
            "tree_peak_pss": pss_peak if pss else None, "main_peak_rss": main_peak}


def clear_cache(folder: str, parse: bool = True) -> None:
    """Delete the kept reports and, with `parse`, the traces' parse caches."""
    patterns = [".dstrace-report.*.cache"] + (["*.reduction.arrow"] if parse else [])
    for pattern in patterns:
        for path in glob.glob(os.path.join(folder, pattern)):
            os.unlink(path)


def trace_sizes(folder: str) -> list[int]:
    sys.path.insert(0, REPO)
    from dstrace.analysis.loading import uncompressed_size
    from dstrace.runfolder.folder import RunFolder

    return [uncompressed_size(f.path) for f in RunFolder.scan(folder).trace_candidates]


def mb(value: float | None) -> str:
    return "-" if value is None else f"{value / 1e6:.0f}"


def summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cases", default="hta,first,cached-parse,second")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--pss", action="store_true",
                    help="also sample PSS, every 200 ms; it slows the measured process, so time runs go without it")
    args = ap.parse_args()
    # dstrace's bytecode, as `pip install dstrace` writes it: an editable install run with
    # PYTHONDONTWRITEBYTECODE=1 (this project's machines) compiles every dstrace module from source on every
    # run, 40 ms of each analyze process and worker that an installed dstrace never spends
    compileall.compile_dir(os.path.join(REPO, "dstrace"), quiet=1)
    folder = os.path.abspath(args.folder)
    py = sys.executable
    report = os.path.join(tempfile.mkdtemp(prefix="dstrace-bench-report-"), "report.json")  # a file, never a device
    analyze = [py, "-m", "dstrace.cli", "analyze", folder, "--format", "json", "-o", report]
    commands = {"orjson": [py, os.path.join(HERE, "json_floor.py"), folder],
                "hta": [py, os.path.join(HERE, "hta_alone.py"), folder], "first": analyze,
                "first2": analyze + ["--parse-workers", "2"], "cached-parse": analyze, "second": analyze}
    cases = args.cases.split(",")
    results: dict[str, list[dict]] = {c: [] for c in cases}
    for i in range(args.repeats):
        order = cases if i % 2 == 0 else cases[::-1]
        for case in order:
            if case.startswith("first"):
                clear_cache(folder)
            elif case in ("cached-parse", "second") and not glob.glob(os.path.join(folder, ".dstrace-report.json.cache")):
                subprocess.run(analyze, check=True, capture_output=True, cwd=REPO)
            if case == "cached-parse":
                clear_cache(folder, parse=False)
            results[case].append(run_measured(commands[case], args.pss))
            m = results[case][-1]
            print(f"{case:12s} run {i + 1}: {m['wall_s']:.2f} s ({m['cpu_s']:.2f} s CPU), tree peak RSS {m['tree_peak_rss'] / 1e6:.0f} MB, "
                  f"PSS {mb(m['tree_peak_pss'])} MB, main peak RSS {m['main_peak_rss'] / 1e6:.0f} MB",
                  file=sys.stderr, flush=True)
    sizes = trace_sizes(folder)
    out = {"folder": folder, "machine": f"{platform.node()}: {psutil.cpu_count()} CPUs, "
                                        f"{psutil.virtual_memory().total / 2**30:.0f} GiB, {platform.processor() or platform.machine()}",
           "traces": len(sizes), "largest_trace_bytes": max(sizes), "total_trace_bytes": sum(sizes),
           "load_average": os.getloadavg(),
           "cases": {c: {"wall_s": summary([m["wall_s"] for m in ms]), "cpu_s": summary([m["cpu_s"] for m in ms]),
                         "tree_peak_rss": summary([m["tree_peak_rss"] for m in ms]),
                         "tree_peak_pss": summary([m["tree_peak_pss"] for m in ms]) if args.pss else None,
                         "main_peak_rss": summary([m["main_peak_rss"] for m in ms]), "runs": ms}
                     for c, ms in results.items()}}
    text = json.dumps(out, indent=2)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text)
    print("| case | wall s, median (min-max) | CPU s, median | peak RSS, tree, MB | peak PSS, tree, MB "
          "| peak RSS, main, MB | peak / largest trace (RSS, PSS) |")
    print("|---|---|---|---|---|---|---|")
    for c, r in out["cases"].items():
        w, t, p, m = r["wall_s"], r["tree_peak_rss"], r["tree_peak_pss"], r["main_peak_rss"]
        pss = (mb(p["median"]), f"{p['median'] / out['largest_trace_bytes']:.2f}x") if p else ("-", "-")
        print(f"| {c} | {w['median']:.2f} ({w['min']:.2f}-{w['max']:.2f}) | {r['cpu_s']['median']:.2f} | {t['median'] / 1e6:.0f} "
              f"({t['min'] / 1e6:.0f}-{t['max'] / 1e6:.0f}) | {pss[0]} | {m['median'] / 1e6:.0f} | "
              f"{t['median'] / out['largest_trace_bytes']:.2f}x, {pss[1]} |")


if __name__ == "__main__":
    main()
