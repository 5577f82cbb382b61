"""One rank's recording: identity, generation calls and their steps, the window, and the manifest.

A process becomes a recorded rank eagerly when a launcher gave it a RANK (or it is the single python
process dstrace started), otherwise lazily at the first hook that fires; launcher processes
(torchrun's agent, DeepSpeed's runner) never fire one and so leave no files. Every failure of dstrace's
own bookkeeping is caught and listed in the manifest: the user's job runs on.
"""
from __future__ import annotations

import os
import resource
import signal
import socket
import sys
import threading
import time
from contextlib import contextmanager, suppress

from dstrace.recording import ranges
from dstrace.runfolder import range_names
from dstrace.recording.overrides import device_memory_bytes
from dstrace.runfolder.names import manifest_path, safe_name
from dstrace.runfolder.records import (ITERATION_TRIGGERS, MANIFEST_SCHEMA, TIME_TRIGGER, GenerationCall, Manifest, to_json,
                                       write_json_atomic)
from dstrace.recording.window import ProfilerWindow, Span, WindowOptions

ENV_RUN_DIR = "DSTRACE_RUN_DIR"
ENV_RUN_ID = "DSTRACE_RUN_ID"
ENV_WINDOW = "DSTRACE_WINDOW"
ENV_SINGLE = "DSTRACE_SINGLE_PROCESS_PARENT"  # pid of the dstrace launcher when the command is plain python
ENV_RANK_PID = "DSTRACE_RANK_PID"  # set by a recorded rank: processes it starts are part of it, not ranks

WRITING_NOTE = "trace: the rank ended while writing it (killed before the write could finish)"
"""In the manifest's `lost` while a trace is written, taken out once it is whole: a rank killed in between
(SIGKILL, a launcher's last resort) is then said to have lost its trace, and why."""
MAX_MESSAGE_CHARS = 20000  # of an exception's message kept in the manifest

_ENV_PREFIXES = ("NCCL_", "CUDA_", "TORCH_", "TORCHELASTIC_", "DS_", "OMP_", "MASTER_", "DSTRACE_")
_ENV_NAMES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
              "CROSS_RANK", "CROSS_SIZE", "NODE_RANK", "MKL_NUM_THREADS", "TEARDOWN_CUPTI")


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return default


class RankSession:
    def __init__(self, run_dir: str, run_id: str, window: WindowOptions):
        self.run_dir = run_dir
        with suppress(OSError):  # a node other than the launcher's, without a shared filesystem
            os.makedirs(run_dir, exist_ok=True)
        self.window = ProfilerWindow(window, self._trace_metadata, held=lambda: signals_held(self))
        self.lock = threading.RLock()
        self.manifest = Manifest(
            schema=MANIFEST_SCHEMA, run_id=run_id, status="running",
            rank=_env_int("RANK", 0), local_rank=_env_int("LOCAL_RANK", 0),
            world_size=_env_int("WORLD_SIZE", 1), host=socket.gethostname(), pid=os.getpid(),
            started=time.time(), window=self.window.record,
            zero3={"fetches": 0, "releases": 0, "allgathers": 0, "gathered_bytes": 0},
            env={k: v for k, v in os.environ.items() if k.startswith(_ENV_PREFIXES) or k in _ENV_NAMES})
        if not ranges.nvtx_available():
            self.manifest.hook_errors.append("nvtx is not installed in the job's environment: NVTX ranges are off "
                                             "(pip install nvtx there, for Nsight Systems)")
        self._depth = 0
        self._call: GenerationCall | None = None
        self._step_starts: list[float] = []
        self.stepped_calls: set[int] = set()  # calls whose model already carries step hooks
        self._finished = False
        self._written_path: str | None = None
        self.spans: list[Span] = []  # DeepSpeed entry points and generation calls: shown around the window
        self._call_span: Span | None = None
        self._time_hook = None
        self.deferred: list[int] = []  # signals that came while dstrace wrote (`signals_held`)
        if window.mode == "full":
            threading.Thread(target=self._await_time_window, name="dstrace-window-timer", daemon=True).start()

    # ---- bookkeeping safety -------------------------------------------------------------------
    @contextmanager
    def guard(self, where: str):
        """Run dstrace's own bookkeeping; a failure is noted in the manifest, never raised."""
        try:
            yield
        except Exception as e:  # noqa: BLE001 - recording must never break the job
            self.note_failure(where, e)

    def note_failure(self, where: str, error: BaseException) -> None:
        """A failure of dstrace's own bookkeeping, as the manifest's `hook_errors` lists it."""
        self.manifest.hook_errors.append(f"{where}: {type(error).__name__}: {error}")

    # ---- identity and writing -----------------------------------------------------------------
    def _refresh_identity(self) -> None:
        if "torch" not in sys.modules:
            return
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            self.manifest.rank = dist.get_rank()
            self.manifest.world_size = dist.get_world_size()

    def flush(self) -> None:
        with self.lock, self.guard("manifest write"):
            self._refresh_identity()
            path = manifest_path(self.run_dir, self.manifest.rank)
            write_json_atomic(path, to_json(self.manifest))
            if self._written_path and self._written_path != path and os.path.exists(self._written_path):
                os.remove(self._written_path)  # the rank became known after the first write
            self._written_path = path

    @property
    def worker(self) -> str:
        """The trace's name stem, `<host>_rank<N>` as HTA and TensorBoard expect; the host name made safe
        for a file name, so that no host name can put a trace outside the run folder."""
        return f"{safe_name(self.manifest.host)}_rank{self.manifest.rank}"

    def _trace_metadata(self) -> dict:
        self._refresh_identity()
        m = self.manifest
        return {"run_id": m.run_id, "rank": m.rank, "world_size": m.world_size,
                "window": to_json(self.window.options)}

    def export_window(self) -> None:
        """Write the window's trace, whole or recorded as lost: a SIGTERM, SIGHUP or Ctrl-C that comes
        meanwhile waits until the trace's atomic rename is done (a launcher that will not wait kills with
        SIGKILL, and the manifest's `lost` then says the trace was being written), then takes its course."""
        if not self.window.recorded:  # at most a profiler made ready, never recording: stopped, nothing written
            with self.guard("trace export"):
                self.window.export(self.run_dir, self.worker)
            return
        with self.lock, signals_held(self):  # a Ctrl-C during the first flush left the note and no trace
            lost = self.manifest.lost
            lost.append(WRITING_NOTE)
            self.flush()
            try:
                self._refresh_identity()
                self.window.export(self.run_dir, self.worker, list(self.spans))
            except Exception as e:  # noqa: BLE001 - recording must never break the job; the loss is recorded
                self.note_failure("trace export", e)
                lost.append(f"trace: {type(e).__name__}: {e}")
            finally:
                lost.remove(WRITING_NOTE)
                self.flush()

    def stand_aside(self, where: str) -> None:
        """The job starts its own torch.profiler: dstrace's window, open or due, ends first (`ProfilerWindow.stand_aside`)."""
        with self.lock:
            if self.window.stand_aside(f"the job started its own torch.profiler ({where})"):
                self.export_window()
            self.flush()

    def forked_off(self) -> None:
        """This is a fork's child: it is part of the rank, not the rank; it writes nothing of the rank's."""
        self._finished = True
        self.window.abandon()

    def finish(self, status: str, error: BaseException | None = None) -> None:
        """Write everything recorded so far; called once, at exit, on an exception or a signal."""
        with self.lock:
            if self._finished:
                return
            self._finished = True
            self.export_window()
            m = self.manifest
            m.status = status
            m.ended = time.time()
            if error is not None:
                m.exit_error = {"type": type(error).__name__, "message": str(error)[:MAX_MESSAGE_CHARS]}
            with self.guard("environment"):
                collect_environment(m)
            self.flush()

    # ---- generation calls and their steps -----------------------------------------------------
    def begin_call(self, api: str, model) -> GenerationCall:
        """Enter chat()/generate(); a call nested in another belongs to the outer one."""
        with self.lock:
            self._depth += 1
            if self._depth == 1:
                self._call = GenerationCall(index=len(self.manifest.calls) + 1, api=api,
                                            model_class=type(model).__name__)
                self.manifest.calls.append(self._call)
                self._step_starts = []
                self._call_span = Span(api, time.perf_counter(), clip=True)
                self.spans.append(self._call_span)
            return self._call

    def end_call(self, wall_s: float, error: BaseException | None = None) -> None:
        with self.lock:
            self._depth -= 1
            if self._depth > 0 or self._call is None:
                return
            call, self._call = self._call, None
            now = time.perf_counter()
            self._call_span.end = now
            starts = self._step_starts + [now]
            call.step_ms = [round((b - a) * 1e3, 3) for a, b in zip(starts, starts[1:])]
            call.wall_s = round(wall_s, 6)
            if error is not None:
                call.error = f"{type(error).__name__}: {error}"[:500]
            if self.window.call_ended():
                self.export_window()  # after the call, so writing the trace is not timed inside it
        self.flush()

    def step_begin(self) -> ranges.Range | None:
        call = self._call
        if call is None:
            return None
        step = len(self._step_starts)
        self._step_starts.append(time.perf_counter())  # before the profiler acts: its cost is in this step
        call.step_kinds.append(self.window.before_step(call.index, step))
        call.gathered_bytes.append(0)
        return ranges.Range(range_names.step(step))

    def step_end(self, opened) -> None:
        if opened is not None:
            opened.close()
        if self._call is not None:
            kind = self.window.after_step(self._call.index, len(self._step_starts) - 1)
            if kind is not None and self._call.step_kinds:
                self._call.step_kinds[-1] = kind

    # ---- iterations and time ----------------------------------------------------------------------
    def iteration(self, trigger: str) -> None:
        """A boundary of an iteration trigger (an optimizer step, a DDP forward...). The window follows the most
        telling trigger seen so far (`ITERATION_TRIGGERS` order); generation calls, when the job has any, win."""
        with self.lock:
            if self._call is not None or self.manifest.calls:
                return
            seen = self.window.record.iterations
            seen[trigger] = seen.get(trigger, 0) + 1
            self.window.record.iterations = dict(sorted(seen.items(), key=lambda kv: ITERATION_TRIGGERS.index(kv[0])))
            if trigger != next(iter(self.window.record.iterations)):
                return
            if self.window.iteration(trigger, seen[trigger] - 1):
                self.export_window()
                self.flush()

    def _await_time_window(self) -> None:
        """Arm the time-based window once it is due: a global module forward pre-hook, and the tick the
        torch.distributed collectives call (`collective_tick`, for a job without a model: a loop of bare
        collectives), so that the profiler starts and stops on the job's own thread (Kineto records only the
        thread that started it)."""
        global collective_tick
        due = self.window.options.due  # the same moment on every rank of the node
        time.sleep(max(0.0, due - time.time()) if due is not None else self.window.options.after)
        while not self._finished and not self.window.taken:
            torch = sys.modules.get("torch")
            if torch is not None and hasattr(torch, "nn"):
                with self.guard("time window"):
                    collective_tick = self._collective_tick
                    self._time_hook = torch.nn.modules.module.register_module_forward_pre_hook(self._time_tick)
                return
            time.sleep(1.0)

    def _time_tick(self, *hook_args) -> None:
        """The time-based window's tick, at a module call (the forward pre-hook's `module, inputs` are not
        needed) or a collective call. Only on the job's main thread; never inside a generation call (its steps
        may be the window); and gone once a trigger's own window has opened or an iteration trigger was seen:
        every module and collective call pays for it."""
        if threading.current_thread() is not threading.main_thread():
            return
        with self.guard("time window"):
            w = self.window
            if w.taken or (w.record.trigger is None and w.record.iterations):
                self._drop_time_hook()
            elif w.record.trigger is not None or self._call is None:
                with self.lock:
                    if not w.time_tick(time.perf_counter()):
                        self._drop_time_hook()
                        if w.record.trigger == TIME_TRIGGER:
                            self.flush()

    def _collective_tick(self) -> None:
        """The time tick at a collective call, in a process without a model (`model_built`) only."""
        global collective_tick
        if model_built:
            collective_tick = None
        else:
            self._time_tick()

    def _drop_time_hook(self) -> None:
        global collective_tick
        collective_tick = None
        hook, self._time_hook = self._time_hook, None
        if hook is not None:  # None: the timer thread has not stored the handle yet; the next call removes it
            hook.remove()

    def add_gathered(self, nbytes: int) -> None:
        z = self.manifest.zero3
        z["allgathers"] += 1
        z["gathered_bytes"] += nbytes
        if self._call is not None and self._call.gathered_bytes:
            self._call.gathered_bytes[-1] += nbytes



def collect_environment(m: Manifest) -> None:
    """Versions, GPUs and peak memory, read at the end when every library the job used is loaded."""
    import importlib.metadata as md
    import platform

    def version(pkg: str) -> str | None:
        mod = sys.modules.get(pkg)
        if mod is not None and getattr(mod, "__version__", None):
            return str(mod.__version__)
        try:
            return md.version(pkg)
        except md.PackageNotFoundError:
            return None

    from dstrace import __version__

    v = {"python": platform.python_version(), "dstrace": __version__, "torch": version("torch"),
         "deepspeed": version("deepspeed"), "transformers": version("transformers"),
         "cuda": None, "nccl": None}
    m.peak_host_rss_bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    m.device_memory_bytes, m.device_memory_kind = device_memory_bytes()
    if "torch" in sys.modules:
        import torch

        v["cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            m.gpu = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            m.peak_gpu_memory_bytes = int(torch.cuda.max_memory_allocated())
            try:
                nccl = torch.cuda.nccl.version()
                v["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
            except Exception:  # noqa: BLE001 - a build without NCCL
                v["nccl"] = None
    m.versions = v


_session: RankSession | None = None
collective_tick = None
"""The session's `_collective_tick` while its time-based window is due and not over, else None: the wrappers of
the torch.distributed collectives (hooks.patch_collectives) call it, and cost one look-up when it is None."""
model_built = False
"""Whether this process has registered an nn.Module parameter (hooks.patch_parameter_registration). Collectives
tick the time-based window only in a process that has not: a job with a model calls its modules (they tick) and
most often has a trigger of its own coming, and its setup's collectives (zero.Init's broadcasts, a barrier
around data preparation, a checkpoint's loading) must not open the window before that trigger, which would then
need a second profiler (on a GPU it may record no device activity)."""
_session_lock = threading.Lock()
_pending_errors: list[str] = []  # noted before this process became a rank (patch failures at import)


def note_error(message: str) -> None:
    """Note a failure of dstrace's own, without making this process a rank."""
    if _session is not None:
        _session.manifest.hook_errors.append(message)
    else:
        _pending_errors.append(message)


def current() -> RankSession | None:
    """This process's session if it has one; never makes one."""
    return _session


def get() -> RankSession | None:
    """This process's session, created at the first need; None when dstrace is not recording."""
    global _session
    if _session is None and os.environ.get(ENV_RUN_DIR) and not _inside_a_rank():
        with _session_lock:
            if _session is None:
                os.environ[ENV_RANK_PID] = str(os.getpid())
                _session = RankSession(os.environ[ENV_RUN_DIR], os.environ.get(ENV_RUN_ID, ""),
                                       WindowOptions.from_env(os.environ.get(ENV_WINDOW)))
                _session.manifest.hook_errors.extend(_pending_errors)
                _install_exit_handlers(_session)
                _session.flush()
    return _session


def _inside_a_rank() -> bool:
    """A process started by a recorded rank (a data-loader worker, a compile helper) inherits RANK; a rank
    that exec'ed itself keeps its pid."""
    return ENV_RANK_PID in os.environ  # or this process was a rank and exec'ed itself (`_wrap_exec`)


def is_rank_process() -> bool:
    """A launcher-started rank, or the one python process `dstrace record -- python ...` started."""
    if "RANK" in os.environ:
        return True
    parent = os.environ.get(ENV_SINGLE)
    return parent is not None and parent == str(os.getppid())


HELD_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
_real_signal, _real_getsignal = signal.signal, signal.getsignal  # before `_hide_handler` wraps them
_held_depth = 0


@contextmanager
def signals_held(s: RankSession, redeliver: bool = True):
    """On the main thread, the Python handlers of SIGTERM, SIGHUP and SIGINT (dstrace's, the job's, Python's
    KeyboardInterrupt) wait while dstrace writes: a signal that comes is noted, and once the outermost hold
    ends it is sent again (`redeliver`), so that the job goes on as it would have; a hold around the rank's
    last writes at exit drops them (the job has ended; its exit code stays its own). Elsewhere the rank's
    lock holds up dstrace's handler, which takes it, and the job's own handlers run on the main thread."""
    global _held_depth
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    swapped = {}
    if _held_depth == 0:
        for sig in HELD_SIGNALS:
            handler = _real_getsignal(sig)
            if callable(handler):
                swapped[sig] = handler
                _real_signal(sig, lambda signum, frame: s.deferred.append(signum))
    _held_depth += 1
    try:
        yield
    finally:
        _held_depth -= 1
        for sig, handler in swapped.items():
            _real_signal(sig, handler)
        if _held_depth == 0:
            pending = list(dict.fromkeys(s.deferred)) if redeliver else []
            s.deferred.clear()
            for sig in pending:
                os.kill(os.getpid(), sig)


def _install_exit_handlers(s: RankSession) -> None:
    import atexit

    state = {"error": None}
    previous_hook = sys.excepthook

    def excepthook(kind, value, tb):
        state["error"] = value
        previous_hook(kind, value, tb)

    sys.excepthook = excepthook

    def at_exit():
        err = state["error"]
        with signals_held(s, redeliver=False):
            if err is None:
                s.finish("complete")
            elif isinstance(err, KeyboardInterrupt):
                s.finish("interrupted", err)
            else:
                s.finish("failed", err)

    atexit.register(at_exit)

    ours = [sig for sig in (signal.SIGTERM, signal.SIGHUP) if signal.getsignal(sig) in (signal.SIG_DFL, None)]

    def on_term(signum, frame):
        for sig in ours:  # a second signal (launchers often send two) must not cut the trace's write short
            _real_signal(sig, signal.SIG_IGN)
        with signals_held(s, redeliver=False):
            s.finish("terminated", RuntimeError(f"received {signal.Signals(signum).name}"))
        _real_signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    if threading.current_thread() is threading.main_thread():
        for sig in ours:
            _real_signal(sig, on_term)
        _hide_handler(on_term)
    os.register_at_fork(after_in_child=_after_fork_in_child)
    _wrap_exec(s)


def _hide_handler(ours) -> None:
    """The job sees the handlers it would have seen without dstrace: `signal.getsignal` and the previous
    handler `signal.signal` returns say SIG_DFL where dstrace's own is installed."""
    import functools

    @functools.wraps(_real_getsignal)
    def getsignal(signalnum):
        handler = _real_getsignal(signalnum)
        return signal.SIG_DFL if handler is ours else handler

    @functools.wraps(_real_signal)
    def signal_(signalnum, handler):
        previous = _real_signal(signalnum, handler)
        return signal.SIG_DFL if previous is ours else previous

    signal.getsignal, signal.signal = getsignal, signal_


def _after_fork_in_child() -> None:
    """A fork's child is part of its rank: it writes none of the rank's files (a fork Pool's workers, ended
    by SIGTERM, would each write the rank's trace again) and does not become a rank itself. If dstrace made
    a profiler ready in the parent, Kineto's config loader joins at exit a thread the child does not have,
    and the child hangs there (pytorch/kineto#998): the child then leaves through `_exit` with its exit
    status once Python has finished (glibc's on_exit, registered after Kineto's destructors, runs first)."""
    global _session, collective_tick
    s, _session, collective_tick = _session, None, None
    if s is None:
        return
    s.forked_off()
    from dstrace.recording.window import kineto_started

    if kineto_started:
        with suppress(Exception):  # no glibc: the child may hang at exit, as it would after the job's own profiler
            import ctypes

            libc = ctypes.CDLL(None)
            libc.on_exit.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
            libc.on_exit(ctypes.cast(libc._exit, ctypes.c_void_p), None)


def _wrap_exec(s: RankSession) -> None:
    """A rank that replaces itself (os.execv and the other os.exec* functions, which call execv or execve)
    writes its files first; the new program, the same process, is not recorded again (`_inside_a_rank`)."""
    import functools

    def make(original, with_env: bool):
        @functools.wraps(original)
        def exec_(path, args, *env):
            if _session is s:
                with s.guard("exec"):
                    s.manifest.hook_errors.append(
                        f"the rank's process replaced itself with {os.fspath(path)!r} (os.exec*): what it ran "
                        "from then on was not recorded")
                    s.finish("complete")
            if with_env and env and env[0] is not None and ENV_RUN_DIR in env[0]:
                env = (dict(env[0], **{ENV_RANK_PID: str(os.getpid())}),)
            return original(path, args, *env)
        return exec_

    os.execv, os.execve = make(os.execv, False), make(os.execve, True)

