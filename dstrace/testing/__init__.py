"""Builders of synthetic run folders, written with dstrace's own writers, for the tests and the benchmarks.

They live in the package, as `numpy.testing` and `pandas._testing` do, because both `tests/` and `bench/`
need them and neither may import the other: a run folder is dstrace's format, so its builder sits beside
the writers it calls.
"""
