"""The instrumented entry points: DeepSpeed's initialize / init_inference / zero.Init, the ZeRO-3
parameter fetch, release and all-gather, HF generate(), any model's chat(), and each forward step; for
other workloads, the iteration triggers of the window (torch optimizer steps, DeepSpeed engine.step(), DDP
and FSDP forwards, torch.profiler step()), torch-native TP's parallelize_module, and the torch.distributed
collectives, where the time-based window also ticks.

Each wrapper keeps the wrapped function's behaviour exactly: arguments, return value and exceptions
pass through untouched, and dstrace's own work runs inside `session.guard`, so a failure there is
noted in the manifest instead of breaking the job.
"""
from __future__ import annotations

import functools
import inspect
import json
import os
import re
import sys
import time

from dstrace.recording import overrides, ranges, session
from dstrace.recording.inventory import take_inventory
from dstrace.recording.window import Span
from dstrace.runfolder import range_names
from dstrace.runfolder.records import DeepSpeedCall, TPRequest

WRAPPED = "__dstrace_wrapped__"
TP_KEYS = ("tp_size", "autotp_size", "mp_size")


def _wrap(owner, attr: str, make):
    """Replace owner.attr with make(original), once."""
    original = getattr(owner, attr, None)
    if original is None or getattr(original, WRAPPED, False):
        return
    wrapper = functools.wraps(original)(make(original))
    setattr(wrapper, WRAPPED, True)
    setattr(owner, attr, wrapper)


def _passing_through(error: BaseException) -> None:
    """Take the calling wrapper's frame off the traceback of an exception the wrapped function raised, so that
    the job's traceback holds no dstrace frame it would not have had; the wrapper's bare `raise` (which adds no
    frame of its own) then passes it on."""
    tb = error.__traceback__
    if tb is not None and tb.tb_frame is sys._getframe(1):
        error.__traceback__ = tb.tb_next


# ---- DeepSpeed configs -------------------------------------------------------------------------
def snapshot_config(config):
    """The config exactly as passed, as JSON: a dict copied, a path recorded with the file's content."""
    if config is None:
        return None
    if isinstance(config, (str, os.PathLike)):
        path = os.fspath(config)
        try:
            with open(path) as f:
                text = f.read()
            try:
                return {"path": path, "content": json.loads(text)}
            except ValueError:
                return {"path": path, "content_text": text}
        except OSError as e:
            return {"path": path, "unreadable": str(e)}
    return json.loads(json.dumps(config, default=str))


def tp_requests(config, source: str, prefix: str = "") -> list[TPRequest]:
    """Every tensor-parallel size in a config, wherever it sits (tensor_parallel.tp_size, autotp_size...)."""
    if isinstance(config, dict) and "content" in config and "path" in config:
        config = config["content"]
    found: list[TPRequest] = []
    if isinstance(config, dict):
        for key, value in config.items():
            path = f"{prefix}{key}"
            if key in TP_KEYS and isinstance(value, (int, float, str)):
                found.append(TPRequest(source=source, key=path, value=value))
            else:
                found.extend(tp_requests(value, source, path + "."))
    return found


def _engine_module(result):
    engine = result[0] if isinstance(result, tuple) else result
    return getattr(engine, "module", engine)


def _deepspeed_api(name: str, config_of, returns_model: bool = True):
    """Wrap a DeepSpeed entry point: range, wall time, config as passed, the error if it refused.

    `config_of` picks the config out of the bound arguments; when the call returns an engine, the
    parameter inventory is taken from its module.
    """
    def make(original):
        signature = inspect.signature(original)

        def wrapper(*args, **kwargs):
            s = session.get()
            call = None
            if s is not None:
                with s.guard(name):
                    bound = signature.bind_partial(*args, **kwargs)
                    call = DeepSpeedCall(api=name, config=snapshot_config(config_of(bound.arguments)))
                    s.manifest.deepspeed_calls.append(call)
                    args, kwargs = _overridden(s, call, bound, args, kwargs)
                    s.manifest.tp_requested.extend(tp_requests((call.overrides or {}).get("config", call.config), name))
                    s.flush()
            r = ranges.Range(name)
            t0 = time.perf_counter()
            try:
                result = original(*args, **kwargs)
            except BaseException as e:
                _passing_through(e)
                r.close()
                if call is not None:
                    call.wall_s = round(time.perf_counter() - t0, 6)
                    call.error = {"type": type(e).__name__, "message": str(e)[:4000]}
                    s.flush()
                raise
            r.close()
            if call is not None:
                with s.guard(f"{name} inventory"):
                    call.wall_s = round(time.perf_counter() - t0, 6)
                    s.spans.append(Span(name, t0, t0 + call.wall_s))
                    if returns_model:
                        model = _engine_module(result)
                        s.manifest.inventory = take_inventory(model, name)
                        instrument_chat(type(model))
                    elif args:
                        args[0].__dict__["_dstrace_call"] = call  # zero.Init: its context time goes here
                s.flush()
            return result
        return wrapper
    return make


def _overridden(s, call: DeepSpeedCall, bound, args, kwargs):
    """The call's arguments with `dstrace try`'s config overrides set on its config (overrides.py); the
    arguments as they were when there are none or they cannot be set (the manifest says why)."""
    wanted = overrides.requested()
    if not wanted:
        return args, kwargs
    s.manifest.config_overrides = dict(wanted)
    try:
        call.overrides = overrides.override_call(call.api, bound.arguments, wanted)
    except Exception as e:  # noqa: BLE001 - the job runs on with its own config; `dstrace try` reports it
        call.overrides = {"not_applied": f"{type(e).__name__}: {e}"}
        return args, kwargs
    return (bound.args, bound.kwargs) if "applied" in call.overrides else (args, kwargs)


def _initialize_config(arguments: dict):
    config = arguments.get("config")
    if config is None:
        config = arguments.get("config_params")
    if config is None and arguments.get("args") is not None:
        config = getattr(arguments["args"], "deepspeed_config", None)
    return config


def _init_inference_config(arguments: dict):
    kwargs = dict(arguments.get("kwargs") or {})
    if arguments.get("config") is not None:
        kwargs["config"] = arguments["config"]
    return kwargs


def _zero_init_config(arguments: dict):
    config = arguments.get("config_dict_or_path")
    return config if config is not None else arguments.get("config")


def patch_deepspeed(module) -> None:
    _wrap(module, "initialize", _deepspeed_api("deepspeed.initialize", _initialize_config))
    _wrap(module, "init_inference", _deepspeed_api("deepspeed.init_inference", _init_inference_config))


def patch_zero_init(module) -> None:
    """deepspeed.zero.Init parses the config in __init__ (where 0.16.4+ refuses a bad tensor_parallel
    block) and is a context manager: its wall time is from __enter__ to __exit__."""
    init = module.Init
    _wrap(init, "__init__", _deepspeed_api("deepspeed.zero.Init", _zero_init_config, returns_model=False))

    def make_enter(original):
        def __enter__(self, *a, **k):
            self.__dict__.setdefault("_dstrace_open", []).append((ranges.Range("deepspeed.zero.Init context"),
                                                                  time.perf_counter()))
            try:
                return original(self, *a, **k)
            except BaseException as e:
                _passing_through(e)
                raise
        return __enter__

    def make_exit(original):
        def __exit__(self, *a, **k):
            try:
                return original(self, *a, **k)
            except BaseException as e:
                _passing_through(e)
                raise
            finally:
                opened = self.__dict__.get("_dstrace_open")
                if opened:
                    r, t0 = opened.pop()
                    r.close()
                    call = self.__dict__.get("_dstrace_call")
                    s = session.get()
                    if call is not None and s is not None:
                        now = time.perf_counter()
                        call.wall_s = round((call.wall_s or 0) + now - t0, 6)
                        s.spans.append(Span("deepspeed.zero.Init context", t0, now))
        return __exit__

    _wrap(init, "__enter__", make_enter)
    _wrap(init, "__exit__", make_exit)


# ---- ZeRO-3 fetch path ---------------------------------------------------------------------------
def _module_label(module) -> str:
    return f"{type(module).__name__}#{getattr(module, 'ds_id', getattr(module, 'id', '?'))}"


RANGE_NAMES = "__dstrace_range_names__"
"""Where a submodule keeps its fetch and release range names: made once, not at each of the hundreds of
fetches per decode step (this code runs on the critical path of a host-bound ZeRO-3 decode)."""


def _range_name(submodule, kind: str) -> str:
    names = submodule.__dict__.get(RANGE_NAMES)
    if names is None:
        label = _module_label(submodule)
        names = submodule.__dict__[RANGE_NAMES] = {k: range_names.zero3(k, label) for k in range_names.ZERO3_KINDS}
    return names[kind]


def patch_param_coordinator(module) -> None:
    coordinator = module.PartitionedParameterCoordinator

    def counted_range(kind: str, counter: str):
        def make(original):
            def wrapper(self, submodule, *args, **kwargs):
                s = session.get()
                if s is None:
                    try:
                        return original(self, submodule, *args, **kwargs)
                    except BaseException as e:
                        _passing_through(e)
                        raise
                s.manifest.zero3[counter] += 1
                if not ranges.active:
                    try:
                        return original(self, submodule, *args, **kwargs)
                    except BaseException as e:
                        _passing_through(e)
                        raise
                r = ranges.Range(_range_name(submodule, kind))
                try:
                    return original(self, submodule, *args, **kwargs)
                except BaseException as e:
                    _passing_through(e)
                    raise
                finally:
                    r.close()
            return wrapper
        return make

    def gather(original):
        def wrapper(self, params, *args, **kwargs):
            s = session.get()
            if s is None:
                try:
                    return original(self, params, *args, **kwargs)
                except BaseException as e:
                    _passing_through(e)
                    raise
            nbytes = 0
            try:  # inline rather than s.guard(): a context manager per gather costs more than the sizing
                status = module.ZeroParamStatus.NOT_AVAILABLE
                nbytes = sum(p.ds_numel * p.element_size() for p in params if p.ds_status is status)
                s.add_gathered(nbytes)
            except Exception as e:  # noqa: BLE001 - recording must never break the job
                s.note_failure("zero3 gathered bytes", e)
            if not ranges.active:
                try:
                    return original(self, params, *args, **kwargs)
                except BaseException as e:
                    _passing_through(e)
                    raise
            r = ranges.Range(range_names.allgather(nbytes))
            try:
                return original(self, params, *args, **kwargs)
            except BaseException as e:
                _passing_through(e)
                raise
            finally:
                r.close()
        return wrapper

    _wrap(coordinator, "fetch_sub_module", counted_range("fetch", "fetches"))
    _wrap(coordinator, "release_sub_module", counted_range("release", "releases"))
    _wrap(coordinator, "_PartitionedParameterCoordinator__all_gather_params", gather)


# ---- generation ----------------------------------------------------------------------------------
def _token_counts(args, kwargs, output) -> tuple[int | None, int | None]:
    input_ids = kwargs.get("input_ids", kwargs.get("inputs", args[0] if args else None))
    sequences = getattr(output, "sequences", output)
    out_len = int(sequences.shape[-1]) if hasattr(sequences, "shape") else None
    in_len = int(input_ids.shape[-1]) if hasattr(input_ids, "shape") else None
    if out_len is None:
        return in_len, None
    if in_len is not None and out_len >= in_len:
        return in_len, out_len - in_len
    return in_len, out_len  # inputs_embeds only: the output holds just the new tokens


def _generation_api(api: str):
    """Wrap generate()/chat(): a top-level call with its steps counted by forward hooks on the model."""
    def make(original):
        def wrapper(self, *args, **kwargs):
            s = session.get()
            if s is None:
                try:
                    return original(self, *args, **kwargs)
                except BaseException as e:
                    _passing_through(e)
                    raise
            call, handles = None, []
            with s.guard(f"{api} begin"):
                call = s.begin_call(api, self)
                if api == "generate" and call.index not in s.stepped_calls:
                    s.stepped_calls.add(call.index)
                    handles = _attach_step_hooks(s, self)
                if s.manifest.inventory is None:
                    s.manifest.inventory = take_inventory(self, api)
            r = ranges.Range(api)
            t0 = time.perf_counter()
            error = None
            try:
                output = original(self, *args, **kwargs)
            except BaseException as e:
                _passing_through(e)
                error = e
                raise
            finally:
                r.close()
                wall = time.perf_counter() - t0
                with s.guard(f"{api} end"):
                    for h in handles:
                        h.remove()
                    if call is not None and api == "generate" and error is None:
                        call.input_sha256.append(overrides.token_hash(overrides.input_ids_of(args, kwargs)))
                        call.output_sha256.append(overrides.token_hash(output))
                        in_len, new = _token_counts(args, kwargs, output)
                        call.input_tokens = call.input_tokens or in_len
                        call.new_tokens = (call.new_tokens or 0) + (new or 0)
                    if call is not None:
                        s.end_call(wall, error)
            return output
        return wrapper
    return make


def _attach_step_hooks(s: session.RankSession, model) -> list:
    """A step range around every forward of the generating model: step 0 is the prefill."""
    state = {}

    def pre(module, inputs):
        with s.guard("step begin"):
            state["range"] = s.step_begin()

    def post(module, inputs, output):
        with s.guard("step end"):
            s.step_end(state.pop("range", None))

    return [model.register_forward_pre_hook(pre, prepend=True),
            model.register_forward_hook(post, always_call=True)]


def patch_generation(module) -> None:
    _wrap(module.GenerationMixin, "generate", _generation_api("generate"))


def instrument_chat(cls) -> None:
    """Wrap the class's chat() where it is defined (InternVL-style remote code calls generate inside)."""
    for owner in cls.__mro__:
        if "chat" in owner.__dict__ and callable(owner.__dict__["chat"]):
            _wrap(owner, "chat", _generation_api("chat"))
            return


def patch_modeling(module) -> None:
    """Every HF model runs post_init() at the end of its __init__: the place to find a chat()."""
    def make(original):
        def post_init(self, *args, **kwargs):
            try:
                result = original(self, *args, **kwargs)
            except BaseException as e:
                _passing_through(e)
                raise
            s = session.get()
            if s is not None:
                with s.guard("chat instrumentation"):
                    instrument_chat(type(self))
            return result
        return post_init

    _wrap(module.PreTrainedModel, "post_init", make)
    _wrap_classmethod(module.PreTrainedModel, "from_pretrained", _from_pretrained)


def _wrap_classmethod(owner, attr: str, make):
    """_wrap for a classmethod: wrap its function and keep it a classmethod, so that a subclass calling it
    (AutoModel's `model_class.from_pretrained`) still passes its own class."""
    method = owner.__dict__.get(attr)
    if not isinstance(method, classmethod) or getattr(method.__func__, WRAPPED, False):
        return
    wrapper = functools.wraps(method.__func__)(make(method.__func__))
    setattr(wrapper, WRAPPED, True)
    setattr(owner, attr, classmethod(wrapper))


def _plan_label(plan) -> str | None:
    """A tp_plan as the manifest keeps it: "auto", or a custom plan by its number of rules."""
    if plan is None:
        return None
    if isinstance(plan, str):
        return plan
    return f"{len(plan)} rules" if isinstance(plan, dict) else type(plan).__name__


def transformers_tp_requests(kwargs: dict, world_size: str | None) -> list[TPRequest]:
    """The tensor parallelism a from_pretrained call asks for: its tp_plan and tp_size, passed directly or in
    a DistributedConfig; with a plan and no size, transformers splits over WORLD_SIZE (its documented
    default with no other parallel size), so that is the size recorded, said as implied."""
    dist = kwargs.get("distributed_config")
    plan = kwargs.get("tp_plan", getattr(dist, "tp_plan", None))
    size = kwargs.get("tp_size", getattr(dist, "tp_size", None))
    source = "from_pretrained" if dist is None else "from_pretrained(distributed_config)"
    found = []
    if plan is not None:
        found.append(TPRequest(source=source, key="tp_plan", value=_plan_label(plan)))
    if size is not None:
        found.append(TPRequest(source=source, key="tp_size", value=size))
    elif plan is not None and world_size and world_size.isdigit():
        found.append(TPRequest(source=source, key="tp_size (implied: WORLD_SIZE)", value=int(world_size)))
    return found


def _from_pretrained(original):
    def from_pretrained(cls, *args, **kwargs):
        s = session.get()
        if s is not None:
            with s.guard("from_pretrained"):
                requested = transformers_tp_requests(kwargs, os.environ.get("WORLD_SIZE"))
                if requested:
                    s.manifest.tp_requested.extend(requested)
                    s.flush()
        try:
            return original(cls, *args, **kwargs)
        except BaseException as e:
            _passing_through(e)
            raise
    return from_pretrained


def _hf_overridden(s, config):
    """HfDeepSpeedConfig's config with `dstrace try`'s overrides: it runs before from_pretrained, and its ZeRO
    stage decides whether the model is built under zero.Init."""
    wanted = overrides.requested()
    if not wanted:
        return config
    s.manifest.config_overrides = dict(wanted)
    try:
        new, s.manifest.hf_deepspeed_config_overrides = overrides.apply(config, "HfDeepSpeedConfig", wanted)
    except Exception as e:  # noqa: BLE001 - the job runs on with its own config; `dstrace try` reports it
        s.manifest.hf_deepspeed_config_overrides = {"not_applied": f"{type(e).__name__}: {e}"}
        return config
    return new


def patch_hf_deepspeed_config(module) -> None:
    def make(original):
        def __init__(self, config_file_or_dict, *args, **kwargs):
            s = session.get()
            if s is not None:
                with s.guard("HfDeepSpeedConfig"):
                    snap = snapshot_config(config_file_or_dict)
                    s.manifest.hf_deepspeed_config = snap
                    config_file_or_dict = _hf_overridden(s, config_file_or_dict)
                    applied = (s.manifest.hf_deepspeed_config_overrides or {}).get("config", snap)
                    s.manifest.tp_requested.extend(tp_requests(applied, "HfDeepSpeedConfig"))
            try:
                return original(self, config_file_or_dict, *args, **kwargs)
            except BaseException as e:
                _passing_through(e)
                raise
        return __init__

    _wrap(module.HfDeepSpeedConfig, "__init__", make)


# ---- iteration triggers: what a window follows in a job without generate() ----------------------
def _boundary(trigger: str, model=None) -> None:
    s = session.get()
    if s is not None:
        with s.guard(f"{trigger} window"):
            if model is not None and s.manifest.inventory is None:
                s.manifest.inventory = take_inventory(model, trigger)
            s.iteration(trigger)


def patch_optimizer(module) -> None:
    """Every torch optimizer's step(), through torch's global post-hook (torch >= 2.0)."""
    module.register_optimizer_step_post_hook(lambda optimizer, args, kwargs: _boundary("optimizer.step"))


def _boundary_after(trigger: str):
    def make(original):
        def wrapper(*args, **kwargs):
            try:
                result = original(*args, **kwargs)
            except BaseException as e:
                _passing_through(e)
                raise
            _boundary(trigger)
            return result
        return wrapper
    return make


def _boundary_before(trigger: str, model_of, counts=lambda self: True):
    """A boundary as the call begins; `model_of(self, args)` is the model whose inventory the rank takes if it
    has none yet (a DDP or FSDP job calls neither deepspeed.initialize nor generate)."""
    def make(original):
        def wrapper(self, *args, **kwargs):
            if counts(self):
                _boundary(trigger, model_of(self, args))
            try:
                return original(self, *args, **kwargs)
            except BaseException as e:
                _passing_through(e)
                raise
        return wrapper
    return make


def patch_engine(module) -> None:
    _wrap(module.DeepSpeedEngine, "step", _boundary_after("deepspeed engine.step"))


def patch_ddp(module) -> None:
    _wrap(module.DistributedDataParallel, "forward",
          _boundary_before("DistributedDataParallel.forward", lambda ddp, args: ddp.module))


def patch_fsdp2(module) -> None:
    """FSDP2 (`fully_shard`): the root's pre-forward, once per forward of the whole model."""
    _wrap(module.FSDPState, "_root_pre_forward", _boundary_before(
        "FSDP forward", lambda state, args: args[0] if args else None,
        lambda state: getattr(state._state_ctx, "iter_forward_root", None) is None))


def patch_fsdp1(module) -> None:
    _wrap(module.FullyShardedDataParallel, "forward",
          _boundary_before("FSDP forward", lambda fsdp, args: fsdp.module,
                           lambda fsdp: getattr(fsdp, "_is_root", None) is not False))


def patch_profiler(module) -> None:
    _wrap(module.profile, "step", _boundary_after("profiler.step"))


def patch_autograd_profiler(module) -> None:
    """Every torch profiler (torch.profiler.profile, torch.autograd.profiler.profile, a schedule's warm-up) is
    made ready in autograd's `profile._prepare_trace`: when the job's own gets there, dstrace's window gives
    way first (`RankSession.stand_aside`), since two profilers in one process end in a segfault."""
    def make(original):
        def _prepare_trace(self, *args, **kwargs):
            s = session.current()
            if s is not None and not s.window.owns(sys._getframe(1).f_locals.get("self")):
                with s.guard("stand aside"):
                    s.stand_aside(f"{type(self).__module__}.{type(self).__qualname__}, {_job_frame()}")
            try:
                return original(self, *args, **kwargs)
            except BaseException as e:
                _passing_through(e)
                raise
        return _prepare_trace

    _wrap(module.profile, "_prepare_trace", make)


def _job_frame() -> str:
    """`file:line` of the job's code that called into torch's profiler: the first frame outside torch and dstrace."""
    frame = sys._getframe(1)
    while frame is not None and re.search(r"[/\\](torch|dstrace)[/\\]", frame.f_code.co_filename):
        frame = frame.f_back
    return "at an unknown place" if frame is None else f"at {frame.f_code.co_filename}:{frame.f_lineno}"


def patch_tensor_parallel(module) -> None:
    """torch-native TP: the inventory of the module `parallelize_module` returns, its weights now DTensors
    (parallelize the whole model in one call for a whole inventory; the last call's module is the one kept)."""
    def make(original):
        def parallelize_module(*args, **kwargs):
            try:
                result = original(*args, **kwargs)
            except BaseException as e:
                _passing_through(e)
                raise
            s = session.get()
            if s is not None:
                with s.guard("parallelize_module inventory"):
                    s.manifest.inventory = take_inventory(result, "parallelize_module")
                    s.flush()
            return result
        return parallelize_module
    _wrap(module, "parallelize_module", make)


# ---- collectives: where the time-based window ticks in a job that calls no nn.Module ------------------
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_single", "reduce_scatter",
               "reduce_scatter_tensor", "reduce_scatter_single", "broadcast", "reduce", "all_to_all",
               "all_to_all_single", "barrier", "monitored_barrier", "send", "recv", "isend", "irecv",
               "batch_isend_irecv", "gather", "scatter", "all_gather_object", "gather_object",
               "broadcast_object_list", "scatter_object_list", "send_object_list", "recv_object_list",
               "_all_gather_base", "_reduce_scatter_base")
"""The c10d Python API a comm benchmark's loop calls; each one this torch has is wrapped."""


def _compiling(torch):
    """A function that says whether dynamo (or export) is tracing the call, one dynamo folds to a constant:
    `torch.compiler.is_compiling` from torch 2.3, `torch._dynamo.is_compiling` before (only when dynamo has been
    imported: if it has not, nothing is compiling). Looked up at the call: torch is still being imported when
    distributed_c10d is patched."""
    version = tuple(int(n) for n in re.findall(r"\d+", str(getattr(torch, "__version__", "")))[:2])
    if version >= (2, 3):
        return lambda: torch.compiler.is_compiling()

    def compiling_before_2_3() -> bool:
        is_compiling = getattr(sys.modules.get("torch._dynamo"), "is_compiling", None)
        return is_compiling is not None and is_compiling()
    return compiling_before_2_3


def patch_collectives(module) -> None:
    """torch.distributed's collectives, where the time-based window ticks too (`session.collective_tick`), so that
    a job without a model, which never calls an nn.Module (a loop of bare all_reduce / all_gather_into_tensor /
    broadcast / barrier), gets its window. Patched as distributed_c10d is imported, before torch.distributed's
    `from .distributed_c10d import *` and `_functional_collectives`' `legacy_*` names bind them: dynamo's
    traceable_collective_remaps is keyed by these wrappers, so torch.compile still rewrites the calls it traces
    to functional collectives, never entering a wrapper; a wrapper it does trace calls the collective straight
    away (`_compiling`). Untraced and with no window due, a call costs the compile check and one look-up."""
    compiling = _compiling(sys.modules["torch"])

    def make(original):
        def collective(*args, **kwargs):
            if compiling():
                try:
                    return original(*args, **kwargs)
                except BaseException as e:
                    _passing_through(e)
                    raise
            tick = session.collective_tick
            if tick is not None:
                tick()
            try:
                return original(*args, **kwargs)
            except BaseException as e:
                _passing_through(e)
                raise
        return collective

    for name in COLLECTIVES:
        _wrap(module, name, make)


def _parameter_registered(module, name, param) -> None:
    session.model_built = True


def patch_parameter_registration(module) -> None:
    """Note the first nn.Module parameter the process registers (`session.model_built`): from then on the
    collectives do not tick the time-based window. torch's global registration hook (torch >= 2.0) stays: a
    hook cannot be removed while torch iterates over the hooks, and one assignment per parameter costs nothing
    beside building it."""
    register = getattr(module, "register_module_parameter_registration_hook", None)
    if register is not None:
        register(_parameter_registered)


# Module name -> what to patch once it has been imported.
PATCHES = {
    "deepspeed": patch_deepspeed,
    "deepspeed.runtime.zero.partition_parameters": patch_zero_init,
    "deepspeed.runtime.zero.partitioned_param_coordinator": patch_param_coordinator,
    "transformers.generation.utils": patch_generation,
    "transformers.modeling_utils": patch_modeling,
    "transformers.integrations.deepspeed": patch_hf_deepspeed_config,
    "deepspeed.runtime.engine": patch_engine,
    "torch.optim.optimizer": patch_optimizer,
    "torch.nn.parallel.distributed": patch_ddp,
    "torch.distributed.fsdp._fully_shard._fsdp_state": patch_fsdp2,
    "torch.distributed.fsdp.fully_sharded_data_parallel": patch_fsdp1,
    "torch.profiler.profiler": patch_profiler,
    "torch.autograd.profiler": patch_autograd_profiler,
    "torch.distributed.tensor.parallel.api": patch_tensor_parallel,
    "torch.distributed.distributed_c10d": patch_collectives,
    "torch.nn.modules.module": patch_parameter_registration,
}
