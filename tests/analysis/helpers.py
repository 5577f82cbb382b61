"""Test helpers: analyze a folder quietly, as `dstrace analyze` does."""
from dstrace.analysis.loading import load_run
from dstrace.analysis.pipeline import analyze


def quiet(_message: str) -> None:
    """Progress sink for tests."""


def analyze_dir(path, clock_policy: str = "auto"):
    return analyze(load_run(str(path), progress=quiet), clock_policy=clock_policy)
