"""Test helpers: analyze a folder quietly, as `dstrace analyze` does."""
from dstrace.analysis import load_and_analyze


def quiet(_message: str) -> None:
    """Progress sink for tests."""


def analyze_dir(path, clock_policy: str = "auto"):
    return load_and_analyze(str(path), clock_policy=clock_policy, progress=quiet)
