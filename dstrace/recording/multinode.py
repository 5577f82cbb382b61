"""Runs that span nodes, through the launchers people already use.

Two shapes:

* torchrun started on every node (`torchrun --nnodes N --node_rank K ...`, by hand, by SLURM's srun,
  ...): each node runs its own `dstrace record`, so this one is one *node* of the run. The nodes must
  agree on the run id without talking to each other: `--run-id ID`, or torchrun's own `--rdzv-id`.
  Each node writes a node record (`nodes/<node>.json`); `dstrace gather` merges them into `run.json`.
* DeepSpeed's runner with a hostfile: one `dstrace record` on the first node; the runner starts the
  other nodes over pdsh/mpirun/srun and forwards only some variables (prefixes `PYTHON`, `MV2`, `UCX`,
  `MLFLOW`, the accelerator's, e.g. `NCCL`) plus the `KEY=VALUE` lines of `.deepspeed_env` (read from
  `~` and `.`, or the file `DS_ENV_FILE` names). PYTHONPATH travels on its own; the DSTRACE_* variables
  go through a merged copy of the user's environment file that DS_ENV_FILE points at, so the user's
  own file is read as before and never written.
"""
from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass

from dstrace.runfolder.files import write_text_atomic
from dstrace.runfolder.names import DEEPSPEED_ENV_FILE, safe_name

ENV_NODE = "DSTRACE_NODE"  # the node a rank was started by; its manifest keeps it
RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
# Characters DeepSpeed's runner passes without quoting them (MultiNodeRunner.add_export).
SHELL_SAFE = re.compile(r"^[\w@%+=:,./-]*$")


@dataclass
class NodeRole:
    """This `dstrace record` starts the ranks of one node of several."""
    node: str  # the host name, with torchrun's --node-rank when given (c10d rendezvous may renumber nodes)
    nnodes: int


def _launcher_args(command: list[str], programs: tuple[str, ...], modules: tuple[str, ...]) -> list[str] | None:
    """The launcher's own arguments (before the script) when the command is that launcher, else None."""
    if os.path.basename(command[0]) in programs:
        args = command[1:]
    elif os.path.basename(command[0]).startswith("python") and "-m" in command[:-1] \
            and command[command.index("-m") + 1] in modules:
        args = command[command.index("-m") + 2:]
    else:
        return None
    script = next((i for i, a in enumerate(args) if a.endswith(".py")), len(args))
    return args[:script]


def _option(args: list[str], *names: str) -> str | None:
    for i, a in enumerate(args):
        for name in names:
            if a == name and i + 1 < len(args):
                return args[i + 1]
            if a.startswith(name + "="):
                return a.split("=", 1)[1]
    return None


def torchrun_args(command: list[str]) -> list[str] | None:
    return _launcher_args(command, ("torchrun",), ("torch.distributed.run", "torch.distributed.launch"))


def is_deepspeed(command: list[str]) -> bool:
    return _launcher_args(command, ("deepspeed",), ("deepspeed", "deepspeed.launcher.runner")) is not None


def node_role(command: list[str], environ: dict[str, str]) -> NodeRole | None:
    """A node of a torchrun run of several nodes; None for a run one `dstrace record` covers whole."""
    args = torchrun_args(command)
    if args is None:
        return None
    nnodes = _option(args, "--nnodes") or environ.get("PET_NNODES", "1")
    most = int(nnodes.split(":")[-1]) if nnodes.split(":")[-1].isdigit() else 1
    if most <= 1:
        return None
    rank = _option(args, "--node_rank", "--node-rank") or environ.get("PET_NODE_RANK")
    host = safe_name(socket.gethostname())
    return NodeRole(node=f"{host}-node{rank}" if rank is not None and rank.isdigit() else host, nnodes=most)


def agreed_run_id(explicit: str | None, command: list[str], environ: dict[str, str]) -> str | None:
    """The run id every node derives alike: `--run-id`, else torchrun's rendezvous id; None when neither."""
    args = torchrun_args(command) or []
    rdzv = _option(args, "--rdzv_id", "--rdzv-id") or (environ.get("PET_RDZV_ID") if args else None)
    chosen = explicit or (rdzv if rdzv and rdzv != "none" else None)
    if chosen is not None and not RUN_ID.match(chosen):
        raise ValueError(f"run id {chosen!r} must be 1-64 letters, digits, '.', '_' or '-'")
    return chosen


def _deepspeed_env_lines(environ: dict[str, str], home: str, cwd: str) -> list[tuple[str, str]]:
    """The user's environment file lines as DeepSpeed's runner reads them: `~` first, then `.`."""
    name = environ.get("DS_ENV_FILE", ".deepspeed_env")
    out = []
    for folder in (home, cwd):
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            with open(path) as f:
                for line in f:
                    if line.strip():
                        key, value = line.split("=", 1)
                        out.append((key.strip(), value.strip()))
    return out


def write_deepspeed_env(run_dir: str, forwarded: dict[str, str], environ: dict[str, str],
                        home: str, cwd: str, injected_paths: list[str]) -> tuple[str, list[str]]:
    """Write `<run_dir>/deepspeed_env`: the user's lines, then `forwarded`; return its path and warnings.

    A PYTHONPATH line of the user's would replace the forwarded PYTHONPATH on the other nodes, so it
    gets dstrace's folders in front.
    """
    lines = []
    for key, value in _deepspeed_env_lines(environ, home, cwd):
        if key == "PYTHONPATH":
            value = os.pathsep.join(injected_paths + ([value] if value else []))
        lines.append((key, value))
    lines.extend(forwarded.items())
    warnings = [f"{key}={value!r} has characters DeepSpeed's runner quotes; mpirun/srun-based launchers "
                "may pass the quotes on: choose a run folder path without them"
                for key, value in forwarded.items() if not SHELL_SAFE.match(value)]
    path = os.path.join(run_dir, DEEPSPEED_ENV_FILE)
    write_text_atomic(path, "".join(f"{k}={v}\n" for k, v in lines))
    return path, warnings
