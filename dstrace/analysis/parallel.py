"""The analysis's concurrency, in one place: processes that work beside this one, and how many fit.

Two kinds, both forked (never spawned: they start at once, with pandas imported, and never re-run the
caller's main module), and both killed by the kernel when this process ends, however it ends
(`die_with_parent`):

* a `Helper`, forked once while this process is small, runs jobs one after another:
  `submit(fn, *args) -> Job`, then `Job.result()`. A job given a stream (`submit(fn, stream=True)`) reads
  the items this process `Job.send`s while it runs: a trace's pieces, decoded while this process inflates
  and decodes the rest. Items go through the pipe from a thread here, so sending one never waits for the
  helper. A thread here reads the answers as they come, so a job whose result is never asked for (its
  caller failed half-way) leaves the helper ready for the next job.
* `workers(n)`: a pool of worker processes (`concurrent.futures`: `submit(fn, *args).result()`).

How many workers this machine has the CPUs and memory for is `worker_count` (the memory budget below);
whether a trace parsed alone repays a helper is `shares_work`.
"""
from __future__ import annotations

import collections
import contextlib
import multiprocessing
import os
import queue
import threading
from concurrent.futures import ProcessPoolExecutor
from multiprocessing.reduction import ForkingPickler
from typing import Any, Callable, Iterator

WORKER_PEAK_PER_TRACE_BYTE = 1.6
"""What parsing a trace adds to memory at its peak, over the trace's JSON size (bench/: about 470 MB for
a 300 MB trace, 1.55x; a forked worker shares its libraries with the analyze process)."""
BUDGET_PER_TRACE_BYTE = 2.0
"""The analysis holds its peak memory to this many times the largest trace's JSON size..."""
BUDGET_FLOOR_BYTES = 512 << 20
"""...or to 512 MiB when that is more: the interpreter with pandas and HTA alone takes about 170 MB, so
2x a small trace would forbid parsing two at once where the memory matters to no one."""
PARALLEL_MIN_BYTES = 32 << 20
"""Below this much JSON to parse, starting worker processes costs more than it saves."""
SPLIT_MIN_BYTES = 64 << 20
"""A trace parsed alone shares its work with a helper process from this size of JSON on (`shares_work`)."""


def cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def worker_count(sizes: list[int]) -> int:
    """How many traces of these JSON sizes to parse at once on this machine now (`workers_for`)."""
    import psutil

    return workers_for(sizes, cpus(), psutil.Process().memory_info().rss, psutil.virtual_memory().available)


def workers_for(sizes: list[int], cpus: int, in_use: int, available: int) -> int:
    """One per CPU, as many as fit in the memory budget (2x the largest trace's JSON, or 512 MiB when that is
    more, less what the analyze process holds already) and in the memory available, and one when there is
    little to parse. `--parse-workers N` overrides it."""
    if len(sizes) < 2 or sum(sizes) < PARALLEL_MIN_BYTES:
        return 1
    budget = max(BUDGET_PER_TRACE_BYTE * max(sizes), BUDGET_FLOOR_BYTES) - in_use
    by_memory = int(min(budget, available) // (WORKER_PEAK_PER_TRACE_BYTE * max(sizes)))
    return max(1, min(cpus, len(sizes), by_memory))


def shares_work(size: int) -> bool:
    """Whether a trace of this JSON size, parsed by this process alone, shares its decode and HTA's breakdowns
    with a helper process: where there are two CPUs and the trace is large enough to repay it."""
    return cpus() >= 2 and size >= SPLIT_MIN_BYTES


def _fork_context():
    """fork where there is one, else None (then no helpers, and the default start method for workers)."""
    return multiprocessing.get_context("fork") if "fork" in multiprocessing.get_all_start_methods() else None


PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int) -> None:
    """Have the kernel kill this forked process when `parent` (the thread that forked it) ends, however it ends
    (SIGKILL included: no handler of the parent's runs then). Linux only (prctl PR_SET_PDEATHSIG); elsewhere
    a helper ends when its pipe closes. A parent already gone before the prctl ends this process now."""
    try:
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        os._exit(1)


def _libc_trim():
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


_TRIM = _libc_trim()


def release_freed_memory() -> None:
    """Hand freed memory back to the system. glibc keeps freed blocks below its (self-raising) mmap threshold
    in the process: a trace's pieces, freed once joined into columns, would otherwise stay and count
    twice in the parse's peak; a helper's last job would stay in the next one's. No-op without glibc."""
    if _TRIM is not None:
        _TRIM(0)


@contextlib.contextmanager
def workers(count: int) -> Iterator[ProcessPoolExecutor]:
    """A pool of `count` worker processes that die with this one; `submit(fn, *args)` gives a future."""
    with ProcessPoolExecutor(count, mp_context=_fork_context(), initializer=die_with_parent,
                             initargs=(os.getpid(),)) as pool:
        yield pool


class HelperGone(Exception):
    """The helper process ended (killed, or a job ended it): the results of its unanswered jobs are lost. Its
    text is what the pipe met (`EOFError`, `BrokenPipeError: ...`)."""


def _cause(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class Job:
    """One job submitted to a `Helper`: `send` items to it (a stream job), `result()` waits for its answer."""

    def __init__(self, helper: Helper) -> None:
        self._helper = helper
        self._answered = threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None

    def send(self, item: bytes) -> None:
        """Hand the job one item (bytes); never waits for the helper. A stream job only, before `result`."""
        self._helper._hand(self, item)

    def result(self):
        """The job's result (its stream ended first); raises what the job raised, or HelperGone."""
        self._helper._end_stream()
        self._answered.wait()
        if self._error is not None:
            raise self._error
        return self._value

    def _answer(self, error: BaseException | None, value: Any = None) -> None:
        self._error, self._value = error, value
        self._answered.set()


class Helper:
    """A process forked while this one is small, that runs jobs beside this one, one after another (module
    docstring). One helper serves every trace of a run: its memory is its own work's. A thread here reads its
    answers as they come, so the helper never waits to hand one over, whatever this process does meanwhile."""

    def __init__(self, ctx) -> None:
        self._conn, theirs = ctx.Pipe()
        self._proc = ctx.Process(target=_helper_main, args=(theirs, os.getpid()), daemon=True, name="dstrace-helper")
        self._proc.start()
        theirs.close()
        self._lock = threading.Lock()
        self._pending: collections.deque[Job] = collections.deque()  # submitted, not answered yet, oldest first
        self._gone: BaseException | None = None
        self._streaming: Job | None = None
        self._items: queue.Queue | None = None
        self._sender: threading.Thread | None = None
        self._reader = threading.Thread(target=self._read, name="dstrace-answers", daemon=True)
        self._reader.start()

    def kill(self) -> None:
        """End the helper process now (SIGKILL) and wait for it: what a crash or the OOM killer does."""
        self._proc.kill()
        self._proc.join()

    def submit(self, fn: Callable, *args, stream: bool = False) -> Job | None:
        """Start `fn(*args)` in the helper, or with `stream`, `fn(items, *args)`, where `items` iterates over what
        this process `send`s. None when the helper cannot take it (it is gone, or the job does not pickle): the
        caller then does the work itself. A stream still open is ended first."""
        self._end_stream()
        try:
            message = ForkingPickler.dumps((fn, args, stream))
        except Exception:  # noqa: BLE001 - arguments that do not pickle: nothing was sent
            return None
        job = Job(self)
        with self._lock:
            if self._gone is not None:
                return None
            self._pending.append(job)
        try:
            self._conn.send_bytes(message)
        except OSError as exc:
            self._end(exc)
            return None
        if stream:
            self._streaming, self._items = job, queue.Queue(2)
            self._sender = threading.Thread(target=self._send, args=(self._items,), name="dstrace-hand-off",
                                            daemon=True)
            self._sender.start()
        return job

    def _send(self, items: queue.Queue) -> None:
        while (item := items.get()) is not None:
            if self._gone is None:
                try:
                    self._conn.send_bytes(item)
                except OSError as exc:  # the helper is gone
                    self._end(exc)
        if self._gone is None:
            with contextlib.suppress(OSError):
                self._conn.send_bytes(b"")  # the end of the stream

    def _hand(self, job: Job, item: bytes) -> None:
        if job is not self._streaming:
            raise RuntimeError("items go to the open stream job only")
        self._items.put(item)

    def _end_stream(self) -> None:
        if self._sender is not None:
            self._items.put(None)
            self._sender.join()
            self._sender = self._items = self._streaming = None

    def _read(self) -> None:
        """The answers, each onto the oldest job unanswered, until the helper is gone."""
        while True:
            try:
                data = self._conn.recv_bytes()
            except (OSError, EOFError) as exc:
                self._end(exc)
                return
            try:
                error, value = ForkingPickler.loads(data)
            except Exception as exc:  # noqa: BLE001 - an answer that does not unpickle here
                error, value = ValueError(f"the helper's answer could not be read ({type(exc).__name__}: {exc})"), None
            del data
            with self._lock:
                job = self._pending.popleft()
            job._answer(error, value)
            del job, error, value

    def _end(self, exc: BaseException) -> None:
        """The helper is gone: every job unanswered fails with HelperGone, and no other is taken."""
        with self._lock:
            self._gone = self._gone or exc
            failed, self._pending = list(self._pending), collections.deque()
        for job in failed:
            job._answer(HelperGone(_cause(self._gone)))

    def close(self) -> None:
        if self._sender is not None:  # a stream still open: what is queued is dropped, not sent
            self._end(OSError("stopped"))
            with contextlib.suppress(queue.Empty):
                while True:
                    self._items.get_nowait()
            self._end_stream()
        self._proc.terminate()
        self._proc.join()
        self._reader.join(10)
        self._conn.close()


def _items(conn) -> Iterator[bytes]:
    """What this process sends to a stream job, until the empty item that ends it."""
    while item := conn.recv_bytes():
        yield item


def _helper_main(conn, parent: int) -> None:
    """The helper process: run each job sent, answer it, let go of its memory, until the pipe closes. A stream
    job that stops early has the rest of its stream read (and dropped), so the sender never blocks on it."""
    die_with_parent(parent)
    while True:
        try:
            fn, args, stream = ForkingPickler.loads(conn.recv_bytes())
        except (EOFError, OSError):
            break
        items = _items(conn) if stream else None
        try:
            answer = None, (fn(items, *args) if stream else fn(*args))
        except BaseException as exc:  # noqa: BLE001 - handed to the parent, which raises it
            answer = exc, None
        try:
            for _ in items or ():
                pass
            try:
                conn.send(answer)
            except (OSError, EOFError):
                raise
            except Exception:  # noqa: BLE001 - an error that does not pickle goes back as its text
                conn.send((ValueError(str(answer[0])), None))
        except (OSError, EOFError):  # the parent is gone
            break
        del fn, args, answer, items
        release_freed_memory()
    conn.close()


@contextlib.contextmanager
def helpers(count: int) -> Iterator[list[Helper]]:
    """Up to `count` helpers forked now (none where there is no fork, no process to spare or `count` < 1),
    stopped on leaving."""
    started: list[Helper] = []
    try:
        ctx = _fork_context()
        if count > 0 and ctx is not None:
            with contextlib.suppress(Exception):  # no process to fork (limits, a daemonic caller)
                while len(started) < count:
                    started.append(Helper(ctx))
        yield started
    finally:
        for h in started:
            h.close()
