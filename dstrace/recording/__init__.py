"""dstrace's recording: the user's launch command run unchanged, with every rank traced into the run folder.

`launcher` runs the command with the injection in its environment and fills the run record (`run.json`)
from what the ranks left; inside each rank, `bootstrap/` (the job's sitecustomize) loads `injection`,
which patches the entry points (`hooks`) as they are imported, and `session` keeps the rank's state and
writes its manifest, with `window` (the profiler window), `ranges` and `inventory`. `multinode` says which
node of a run this is, `gather` merges the nodes' folders. The `dstrace record` verb, which also has each
trace reduced for analysis, is `dstrace.commands.record`; nothing here imports the analysis.
"""
