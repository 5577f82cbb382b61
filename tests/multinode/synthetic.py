"""The many-rank synthetic run, for the multinode tests: built by `dstrace.testing.scale_run`, which the
benchmarks (bench/summaries_scale.py) use too."""
from dstrace.testing.scale_run import RANKS_PER_HOST, host_offset_us, write_run

__all__ = ["RANKS_PER_HOST", "host_offset_us", "write_run"]
