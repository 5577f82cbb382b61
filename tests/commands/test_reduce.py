"""`dstrace reduce` on public traces nobody here recorded: the run folder it writes is analyzed, without the traces,
to the report the traces themselves give; several real processes under torchrun, and under the real srun of a
two-node SLURM cluster on this host, split the traces between them; bad input costs one line and writes nothing
outside the run folder."""
from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import subprocess

import pytest

from dstrace.runfolder.names import REDUCTION_SUFFIX, rank_in_name
from tests.corpus import make_twins
from tests.fixtures.paths import CORPUS, ROOT
from tests.fixtures.processes import analyze_json, cpu_env, dstrace, tool, torchrun
from tests.fixtures.runs import read_json

SAMPLED = os.path.join(CORPUS, "hta", "tests", "data", "trace_filter")  # HTA's two sampled ranks of a 128-rank job
SAME = ("device", "world_size", "ranks_found", "missing_ranks", "ranks", "steps", "clock_alignment", "findings",
        "accelerators", "skipped")
"""What the analysis of the reduction must say as the traces' does (notes and warnings name what was read)."""


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("twins"))
    for twin in make_twins.TWINS:
        if twin.name in ("hta_allreduce_2ranks", "hta_all_to_all_8ranks"):
            make_twins.build(twin, out)
    return out


def env_in(tmp_path, **extra) -> dict:
    """The tests' environment, with dstrace's per-user cache inside the test's folder."""
    return cpu_env(XDG_CACHE_HOME=str(tmp_path / "user-cache"), **extra)


def listing(folder: str) -> dict[str, int]:
    return {os.path.relpath(os.path.join(d, n), folder): os.path.getsize(os.path.join(d, n))
            for d, _, names in os.walk(folder) for n in names}


def analysis(folder: str, env: dict) -> dict:
    report = analyze_json(folder, env=env)
    for rank in report["ranks"].values():
        rank.pop("file")  # where each trace is: the folder given
    return report


@pytest.mark.parametrize("source", ["hta_allreduce_2ranks", "hta_all_to_all_8ranks", "sampled"])
def test_the_reduction_alone_gives_the_traces_report(twins, tmp_path, source):
    given = SAMPLED if source == "sampled" else os.path.join(twins, source)
    traces = str(tmp_path / "traces")
    shutil.copytree(given, traces)
    before = listing(traces)
    run_dir = str(tmp_path / "run")
    env = env_in(tmp_path)
    result = dstrace("reduce", "-o", run_dir, traces, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert listing(traces) == before  # nothing written beside the traces
    names = sorted(os.listdir(run_dir))
    kept = [n for n in names if n.endswith(REDUCTION_SUFFIX)]
    assert names == sorted(kept + ["run.json"]), names
    ranks = sorted(rank_in_name(n) for n in kept)
    assert None not in ranks and len(set(ranks)) == len(kept), names
    run = read_json(os.path.join(run_dir, "run.json"))
    assert run["status"] == "complete" and run["problems"] == [] and [r["rank"] for r in run["ranks"]] == ranks

    of_traces = analysis(traces, env)
    shutil.rmtree(traces)  # the reduction is all analyze reads
    of_reduction = analysis(run_dir, env)
    assert [r.pop("read_from") for r in of_traces["ranks"].values()] == ["trace"] * len(ranks)
    assert [r.pop("read_from") for r in of_reduction["ranks"].values()] == ["kept reduction"] * len(ranks)
    assert {k: of_reduction[k] for k in SAME} == {k: of_traces[k] for k in SAME}
    assert of_reduction["ranks_found"] == ranks
    expected = {"hta_allreduce_2ranks": ["host-bound"], "hta_all_to_all_8ranks": ["peer-wait"], "sampled": []}
    assert [f["id"] for f in of_reduction["findings"]] == expected[source]
    if source == "sampled":  # two ranks of 128: the world size comes from the traces' distributedInfo
        assert of_reduction["world_size"] == 128 and len(of_reduction["missing_ranks"]) == 126


def test_torchrun_processes_split_the_traces(twins, tmp_path):
    run_dir = str(tmp_path / "run")
    env = env_in(tmp_path)
    traces = os.path.join(twins, "hta_all_to_all_8ranks")
    result = subprocess.run([*torchrun(), "--no-python", tool("dstrace"), "reduce", "-o", run_dir, traces],
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    records = [read_json(os.path.join(run_dir, "nodes", n)) for n in sorted(os.listdir(os.path.join(run_dir, "nodes")))]
    shares = [[r["rank"] for r in record["ranks"]] for record in records]
    assert len(shares) == 2 and all(shares), shares  # both processes reduced, each its own ranks
    assert sorted(shares[0] + shares[1]) == list(range(8))  # no rank twice, none lost
    kept = [n for n in os.listdir(run_dir) if n != "nodes"]
    assert all(n.endswith(REDUCTION_SUFFIX) for n in kept) and sorted(map(rank_in_name, kept)) == list(range(8))
    assert "run.json" not in os.listdir(run_dir)  # the processes write their node records only

    gathered = dstrace("gather", run_dir, env=env)
    assert gathered.returncode == 0, gathered.stderr[-3000:]
    run = read_json(os.path.join(run_dir, "run.json"))
    assert run["status"] == "complete", run["problems"]
    assert [r["rank"] for r in run["ranks"]] == list(range(8)) and run["world_size"] == 8
    assert len(run["gathered_from"]) == 2
    assert [f["id"] for f in analysis(run_dir, env)["findings"]] == ["peer-wait"]


def test_node_folders_gathered_into_one_run(twins, tmp_path):
    """Two nodes, each reducing its own traces into its own folder (a node-local disk), joined by gather."""
    env = env_in(tmp_path)
    source = os.path.join(twins, "hta_all_to_all_8ranks")
    folders = []
    for node in (0, 1):
        local = tmp_path / f"local{node}"
        local.mkdir()
        for r in range(4 * node, 4 * node + 4):
            shutil.copy(os.path.join(source, f"rank{r}.json.gz"), local)
        folder = str(tmp_path / f"node{node}")
        result = dstrace("reduce", "-o", folder, "--run-id", "job7", str(local),
                         env=dict(env, LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", GROUP_RANK=str(node)))
        assert result.returncode == 0, result.stderr[-3000:]
        folders.append(folder)
    merged = str(tmp_path / "merged")
    result = dstrace("gather", merged, *folders, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    run = read_json(os.path.join(merged, "run.json"))
    assert run["run_id"] == "job7" and run["status"] == "complete" and run["missing_ranks"] == []
    assert [r["rank"] for r in run["ranks"]] == list(range(8))
    assert analysis(merged, env)["ranks_found"] == list(range(8))


def write_trace(path: str, payload: dict | str) -> None:
    text = payload if isinstance(payload, str) else json.dumps(payload)
    with gzip.open(path, "wt") as f:
        f.write(text)


def one_rank(rank: int | None, events_first: bool = False) -> dict:
    events = {"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10 * i,
                               "dur": 5} for i in range(20)]}
    info = {} if rank is None else {"distributedInfo": {"rank": rank, "world_size": 4, "backend": "gloo"}}
    return {**events, **info} if events_first else {**info, **events}


def refused(tmp_path, *args, env=None) -> str:
    """The one line a refused reduce prints; nothing is written outside the test's run folders."""
    result = dstrace("reduce", *args, env=env or env_in(tmp_path), cwd=str(tmp_path))
    assert result.returncode != 0, result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    return result.stderr


def test_rank_read_where_the_metadata_follows_the_events(tmp_path):
    traces = tmp_path / "traces"
    traces.mkdir()
    write_trace(str(traces / "a.json.gz"), one_rank(2, events_first=True))
    write_trace(str(traces / "b.json.gz"), one_rank(3))
    run_dir = str(tmp_path / "run")
    # a batch script's own SLURM variables (as sbatch -N 2 --ntasks-per-node 2 sets them here), no srun: alone
    batch_script = env_in(tmp_path, SLURM_LOCALID="0", SLURM_NODEID="0", SLURM_PROCID="0", SLURM_NTASKS="4",
                          SLURM_NTASKS_PER_NODE="2", SLURM_TASKS_PER_NODE="2(x2)")
    result = dstrace("reduce", "-o", run_dir, str(traces), env=batch_script)
    assert result.returncode == 0, result.stderr
    assert sorted(os.listdir(run_dir)) == ["rank2.a.reduction.arrow", "rank3.b.reduction.arrow", "run.json"]


def test_refusals(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    traces = tmp_path / "traces"
    traces.mkdir()
    write_trace(str(traces / "rank0.json.gz"), one_rank(0))
    out = str(tmp_path / "out")

    assert "no such file or folder" in refused(tmp_path, "-o", out, str(tmp_path / "nowhere"))
    assert "no traces" in refused(tmp_path, "-o", out, str(empty))
    os.symlink(str(empty), str(tmp_path / "link"))
    assert "is a link" in refused(tmp_path, "-o", str(tmp_path / "link"), str(traces))
    (tmp_path / "file").write_text("")
    assert "is not a folder" in refused(tmp_path, "-o", str(tmp_path / "file"), str(traces))
    launched = env_in(tmp_path, LOCAL_RANK="0", LOCAL_WORLD_SIZE="2")
    assert "give them one run folder with -o" in refused(tmp_path, str(traces), env=launched)
    bad = env_in(tmp_path, SLURM_LOCALID="3", SLURM_NODEID="1", SLURM_STEP_TASKS_PER_NODE="2(x2)",
                 SLURM_STEP_NUM_TASKS="4")
    assert "SLURM_LOCALID=3" in refused(tmp_path, "-o", out, str(traces), env=bad)
    assert not os.path.exists(out) and not os.listdir(empty)


def test_bad_traces_cost_a_line_each(tmp_path):
    traces = tmp_path / "traces"
    traces.mkdir()
    write_trace(str(traces / "rank0.json.gz"), one_rank(0))
    write_trace(str(traces / "x.json.gz"), one_rank(None))  # no rank anywhere, and not alone
    write_trace(str(traces / "rank1.json.gz"), '{"distributedInfo": {"rank": 1}, "traceEvents": [{"ph": ')
    with gzip.open(str(traces / "rank2.json.gz"), "wb", compresslevel=1) as f:  # 100 MB of blanks in 0.5 MB
        f.write(b"{" + b" " * (100 << 20))
    os.mkfifo(str(traces / "rank3.json"))
    write_trace(str(traces / "copy.json.gz"), one_rank(0))  # claims rank 0 too
    run_dir = str(tmp_path / "run")
    err = refused(tmp_path, "-o", run_dir, str(traces))
    lines = [line for line in err.splitlines() if "/traces/" in line and "parsing" not in line]
    said = {os.path.basename(line.split(":")[1]): line for line in lines}
    assert set(said) == {"x.json.gz", "rank1.json.gz", "rank2.json.gz", "rank3.json", "rank0.json.gz",
                         "copy.json.gz"}, err
    assert "no rank in it" in said["x.json.gz"]
    assert "claims rank 0" in said["copy.json.gz"] and "claims rank 0" in said["rank0.json.gz"]
    assert "more than 64 MiB of metadata before its events" in said["rank2.json.gz"] and "FIFO" in said["rank3.json"]
    assert "rank 1: no kept reduction: truncated or corrupt JSON" in said["rank1.json.gz"]
    run = read_json(os.path.join(run_dir, "run.json"))
    assert run["status"] == "incomplete" and run["ranks"] == [] and len(run["problems"]) == 6
    assert sorted(os.listdir(run_dir)) == ["run.json"]  # no leftovers of the private folder


def test_a_second_reduce_never_replaces_a_rank(tmp_path):
    traces = tmp_path / "traces"
    traces.mkdir()
    write_trace(str(traces / "rank0.json.gz"), one_rank(0))
    run_dir = str(tmp_path / "run")
    assert dstrace("reduce", "-o", run_dir, str(traces), env=env_in(tmp_path)).returncode == 0
    kept = (tmp_path / "run" / "rank0.reduction.arrow").read_bytes()
    other = tmp_path / "other"
    other.mkdir()
    write_trace(str(other / "rank0.json.gz"), one_rank(0, events_first=True))
    assert "is in" in refused(tmp_path, "-o", run_dir, str(other))
    assert (tmp_path / "run" / "rank0.reduction.arrow").read_bytes() == kept


SRUN_LINE = re.compile(r"dstrace: \S+-node[01] process \d of \d: .*|srun: .*")
"""What srun passes on from its tasks: each line whole, led by the task's node and share."""


def srun_reduce(slurm_cluster, env: dict, *args: str, job: dict | None = None) -> subprocess.CompletedProcess:
    result = slurm_cluster.srun(*args, env=env, cwd=str(ROOT), job=job)
    lines = result.stderr.splitlines()
    assert lines and all(SRUN_LINE.fullmatch(line) for line in lines), result.stderr[-3000:]
    return result


def shares_of(run_dir: str) -> dict[str, list[int]]:
    """Each task's node record: the ranks it reduced."""
    nodes = os.path.join(run_dir, "nodes")
    return {n: [r["rank"] for r in read_json(os.path.join(nodes, n))["ranks"]] for n in sorted(os.listdir(nodes))}


def test_srun_tasks_of_two_nodes_split_the_job(twins, tmp_path, slurm_cluster):
    """`srun -N 2 -n 4 dstrace reduce --split job`, the real srun: each of the 8 traces gets one kept reduction,
    written by one task, and analyze reads those alone to the traces' own report."""
    traces = os.path.join(twins, "hta_all_to_all_8ranks")
    run_dir = str(tmp_path / "run")
    env = env_in(tmp_path)
    result = srun_reduce(slurm_cluster, env, "-N", "2", "-n", "4", tool("dstrace"), "reduce", "--split", "job",
                         "-o", run_dir, "--run-id", "srun1", traces)
    assert result.returncode == 0, result.stderr[-3000:]
    shares = shares_of(run_dir)
    placed = [re.fullmatch(r".+-node(\d)-reduce(\d)\.json", n).groups() for n in shares]  # (SLURM_NODEID, PROCID)
    assert sorted(int(task) for _, task in placed) == [0, 1, 2, 3] and {node for node, _ in placed} == {"0", "1"}
    # task i takes traces i and i + 4, wherever srun placed it
    assert all(ranks == [int(task), int(task) + 4] for (_, task), ranks in zip(placed, shares.values())), shares
    kept = sorted(n for n in os.listdir(run_dir) if n != "nodes")
    assert kept == [f"rank{r}{REDUCTION_SUFFIX}" for r in range(8)], kept  # no private folder left
    assert all(os.stat(os.path.join(run_dir, n)).st_nlink == 1 for n in kept)

    assert dstrace("gather", run_dir, env=env).returncode == 0
    run = read_json(os.path.join(run_dir, "run.json"))
    assert run["status"] == "complete" and run["run_id"] == "srun1" and len(run["gathered_from"]) == 4
    of_reduction, of_traces = analysis(run_dir, env), analysis(traces, env)
    assert [r.pop("read_from") for r in of_reduction["ranks"].values()] == ["kept reduction"] * 8
    assert [r.pop("read_from") for r in of_traces["ranks"].values()] == ["trace"] * 8
    assert {k: of_reduction[k] for k in SAME} == {k: of_traces[k] for k in SAME}
    assert [f["id"] for f in of_reduction["findings"]] == ["peer-wait"]


def test_srun_node_shares_follow_the_steps_own_layout(twins, tmp_path, slurm_cluster):
    """`srun -N 2 -n 3` inside a job of `--ntasks-per-node 2` (its SLURM_NTASKS_PER_NODE=2 passed on to the
    step, which has 2 tasks on its first node and 1 on its second), each node given its own folder of traces:
    the node of one task reduces all of its traces. A damaged trace there makes that task, and srun, fail."""
    source = os.path.join(twins, "hta_all_to_all_8ranks")
    for node, ranks in (("n1", range(4)), ("n2", range(4, 8))):
        (tmp_path / node).mkdir()
        for r in ranks:
            shutil.copy(os.path.join(source, f"rank{r}.json.gz"), tmp_path / node)
    write_trace(str(tmp_path / "n2" / "rank8.json.gz"), '{"distributedInfo": {"rank": 8}, "traceEvents": [{"ph": ')
    run_dir = str(tmp_path / "run")
    env = env_in(tmp_path)
    script = f'exec {tool("dstrace")} reduce -o {run_dir} {tmp_path}/"$SLURMD_NODENAME"'
    result = srun_reduce(slurm_cluster, env, "-N", "2", "-n", "3", "bash", "-c", script,
                         job={"SLURM_NTASKS_PER_NODE": "2"})
    assert result.returncode == 1, result.stderr[-3000:]
    shares = shares_of(run_dir)
    assert [len(s) for s in shares.values()] == [2, 2, 4], shares  # two tasks on the first node, one on the second
    assert sorted(sum(shares.values(), [])) == list(range(8)), shares
    failed = [n for n in shares if read_json(os.path.join(run_dir, "nodes", n))["problems"]]
    assert len(failed) == 1 and "-node1-" in failed[0]
    assert re.search(r"error: n2: task 2: Exited with exit code 1", result.stderr), result.stderr[-3000:]
    assert sorted(n for n in os.listdir(run_dir) if n != "nodes") == [f"rank{r}{REDUCTION_SUFFIX}" for r in range(8)]
