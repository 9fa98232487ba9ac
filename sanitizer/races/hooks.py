"""How the race check is wired into torch: every hook it installs, behind one narrow sink.

The hooks know torch and nothing of the analysis: each one tells a
``RaceSink`` (the ``RaceCheck``, in ``check.py``) what the program did, and
the sink decides what it means. ``RaceHooks`` owns what it installs and takes
it all back at ``restore()``:

* **Wrappers installed at ``install()``** on rare calls only (``Stream()``,
  ``set_stream``, ``wait_stream``, event record/wait, host syncs, graph
  capture and replay, ``torch.distributed`` collectives and ``Work.wait``,
  Triton's ``JITFunction.run``), through one ``Patcher`` (``patching.py``,
  shared with the sync check), restored exactly at ``restore()``. Before
  activation they tell the sink of host syncs (``prehistory.py``) and of the
  first sign of a second stream. Each wrapper forwards the user's own call,
  so it is registered with ``frames.forwards_user_call``: a sync made
  through it (the user's ``torch.cuda.synchronize()``) is the user's, not
  torchlint's.
* **Implicit host syncs** (``.item()``, ``.cpu()``, blocking copies) before
  activation: torch's sync debug mode in warn mode and a ``showwarning`` hook,
  free while nothing syncs (``watch_implicit_syncs``).
* **gpu_trace callbacks** (event record/wait/sync, stream and device syncs,
  stream creation, frees), registered once per process and gated by the
  module-level ``_ACTIVE`` sink: torch offers no way to remove them and
  **gpu_trace cannot be deactivated**, so after one activation every CUDA
  event and free in the process makes a Python round trip even when no check
  runs. torch swallows exceptions raised in them, so the sink records errors
  instead (``RaceSink.internal_error``).
* **The dispatch mode**, the fallback that sees every op where the native tap
  (``race_tap.cpp``) cannot be built (``enter_dispatch_mode``).
"""

from __future__ import annotations

import importlib
import sys
import threading
import warnings
from typing import Any, Callable, Dict, List, Optional, Protocol

from ..frames import forwards_user_call
from ..patching import PROTOTYPE_WARNING, SYNC_WARNING, Patcher, WarningHook
from .ops import DEFAULT_STREAM, SKIP
from .ops import plan as plan_of

# The sink whose engine the process-global hooks feed (None: hooks do nothing).
_ACTIVE: Optional["RaceSink"] = None
_TRACE_REGISTERED = False
_TRACE_LOCK = threading.Lock()
_TORCH_TRACE_ACTIVATED = False
# gpu_trace's registries of allocations and frees (their names since torch 2.1).
_MEMORY_REGISTRIES = ("MemoryAllocationCallbacks", "MemoryDeallocationCallbacks")
# Set while one of our own wrappers runs: ``collective`` (the dispatch mode and the tap
# must not count the c10d ops it issues a second time), ``in_wait_stream`` (the wrapper
# tells the sink the wait_stream itself), ``own_stream`` (a Stream the check made).
_LOCAL = threading.local()


class RaceSink(Protocol):
    """What the hooks tell the race check: its whole surface towards torch."""

    @property
    def active(self) -> bool:
        """True once the per-op analysis is switched on."""

    def activate(self, reason: str) -> None: ...

    def stream_created(self, stream: Any) -> None:
        """The program made a ``torch.cuda.Stream`` (a second stream: activation)."""

    def name_stream(self, stream: Any) -> None:
        """Remember the user's variable name for a stream it just used."""

    def wait_stream(self, waiter: Any, waitee: Any) -> None:
        """``waiter.wait_stream(waitee)`` returned."""

    def host_synced(self) -> None:
        """A host sync before activation (explicit, or implicit through torch's warning)."""

    def graph_capture_begin(self, graph: Any) -> None: ...

    def graph_capture_end(self, graph: Any) -> None: ...

    def graph_replay(self, graph: Any) -> None: ...

    def collective(
        self, name: str, written: List[Any], read: List[Any], group: Any, async_op: bool, call: Callable[[], Any]
    ) -> Any:
        """Run a collective through ``call`` and model it; returns what ``call`` returns."""

    def work_waited(self, work: Any) -> None: ...

    def triton_launch(self, jit_function: Any, args: tuple, kwargs: dict) -> None: ...

    def on_op(self, plan: tuple, args: tuple, kwargs: Optional[dict], out: Any) -> None:
        """One op the dispatch mode saw, with its plan (``ops.plan``)."""

    def trace_event_record(self, event: int, stream: int) -> None: ...

    def trace_event_wait(self, event: int, stream: int) -> None: ...

    def trace_event_sync(self, event: int) -> None: ...

    def trace_stream_sync(self, stream: int) -> None: ...

    def trace_device_sync(self) -> None: ...

    def trace_free(self, pointer: int) -> None: ...

    def trace_stream_created(self, stream: int) -> None: ...

    def trace_event_deleted(self, event: int) -> None: ...

    def sync_check_running(self) -> bool:
        """Whether the session's sync check wants torch's sync warnings too."""

    def note(self, text: str) -> None:
        """A limit of this run worth telling the user (warned at ``stop()``)."""

    def internal_error(self, where: str, error: BaseException) -> None: ...


def set_active(sink: "RaceSink") -> None:
    global _ACTIVE
    _ACTIVE = sink


def clear_active(sink: "RaceSink") -> None:
    global _ACTIVE
    if _ACTIVE is sink:
        _ACTIVE = None


def active() -> Optional["RaceSink"]:
    return _ACTIVE


def make_dispatch_mode():
    from torch.utils._python_dispatch import TorchDispatchMode

    plans: Dict[int, tuple] = {}

    class RaceDispatchMode(TorchDispatchMode):
        """Sees every ATen op; hands its CUDA tensors to the active race check."""

        enabled = True

        @forwards_user_call
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            sink = _ACTIVE
            if sink is not None and self.enabled and sink.active:
                # Keyed by id: OpOverload hashes in Python. The plan holds func,
                # so the id cannot be reused while the entry lives.
                plan = plans.get(id(func))
                if plan is None:
                    plan = plans[id(func)] = plan_of(func) + (func,)
                if plan[0] is SKIP:
                    return out  # views, metadata: most ops of a step end here
                try:
                    sink.on_op(plan, args, kwargs, out)
                except Exception as error:  # never break the user's program
                    sink.internal_error("dispatch", error)
            return out

    return RaceDispatchMode


class RaceHooks:
    """Everything the race check installs in torch, for one check, and how it is taken back."""

    def __init__(self, sink: RaceSink) -> None:
        self.sink = sink
        self._patcher = Patcher()
        self._torch = None
        self._trace_filter = None  # the tap, while its gpu_trace filter is installed
        self.gpu_trace_route: Optional[str] = None  # what reaches the check through gpu_trace
        self._previous_sync_mode: Optional[int] = None  # the mode to restore, on ``_sync_mode_torch``
        self._sync_mode_torch = None
        self._sync_warnings: Optional[WarningHook] = None  # the implicit-sync hook, before activation
        self._triton_wrapped = False
        self.dispatch_mode: Any = None  # the fallback's mode, while it is on a thread's stack
        self._dispatch_thread: Optional[int] = None

    # -- lifecycle ---------------------------------------------------------------

    def install(self, torch) -> None:
        """The cheap wrappers on rare calls: the triggers of activation and the host syncs before it."""
        self._torch = torch
        self._install_triggers(torch)

    def restore(self) -> None:
        """Take back everything this object installed, the last first."""
        self.remove_dispatch_mode()
        self.remove_trace_filter()
        self.unwatch_implicit_syncs()
        self._patcher.restore_all()
        self._triton_wrapped = False

    # -- gpu_trace (once per process) ----------------------------------------

    def register_trace(self, torch, tap=None) -> None:
        """Route CUDA events, syncs and stream creations to the sink through gpu_trace.

        The callbacks are registered once per process. Under a native tap built
        with the gpu_trace filter, the filter is installed for this check's
        lifetime (removed at ``restore()``) and torch's own gpu_trace is never
        switched on: events and syncs still reach the callbacks, allocations and
        frees cost nothing. Otherwise torch's gpu_trace is switched on, for the
        rest of the process (it cannot be switched off).
        """
        trace = self._register_trace_callbacks(torch)
        if trace is None:
            return
        if tap is not None and hasattr(tap, "install_trace_filter"):
            tap.install_trace_filter(forward_memory=_memory_listeners_besides_ours(trace))
            self._trace_filter = tap
            self.gpu_trace_route = "filtered: events and syncs only"
            return
        _activate_torch_gpu_trace(torch)
        self.gpu_trace_route = "torch: every event, sync, allocation and free"
        if tap is not None:
            self._quiet_memory_trace(trace)

    def install_sync_ledger(self, tap) -> bool:
        """Before activation, let the tap's gpu_trace filter keep the host-sync ledger in C++.

        The filter notes every block the allocator hands out and clears the
        note at every host sync torch reports (device, stream and event syncs,
        and the implicit ones: ``.item()``, blocking copies), so activation
        needs one allocator snapshot instead of one per sync; a sync costs only
        torch's own gpu_trace hook, forwarded to Python as it would be once the
        check is active (prehistory.py). False where the tap
        has no filter: the check then snapshots at every sync it hears of.
        """
        trace = _gpu_trace_module()
        if tap is None or trace is None or not hasattr(tap, "track_allocations_since_sync"):
            return False
        tap.install_trace_filter(forward_memory=_memory_listeners_besides_ours(trace))
        tap.track_allocations_since_sync()
        self._trace_filter = tap
        self.gpu_trace_route = "filtered: allocations and host syncs counted in C++ until activation"
        return True

    def _register_trace_callbacks(self, torch):
        """``torch.cuda._gpu_trace`` with this module's callbacks registered (once), or None without it."""
        global _TRACE_REGISTERED
        with _TRACE_LOCK:
            trace = _gpu_trace_module()
            if getattr(torch._C, "_activate_gpu_trace", None) is None or trace is None:
                if not _TRACE_REGISTERED:
                    self.sink.note("torch has no gpu_trace: syncs issued from C++ are not seen (false alarms possible)")
                    _TRACE_REGISTERED = True
                return None
            if _TRACE_REGISTERED:
                return trace
            for register, callback in _TRACE_CALLBACKS.items():
                function = getattr(trace, register, None)
                if function is not None:
                    function(callback)
            _TRACE_REGISTERED = True
            return trace

    def remove_trace_filter(self) -> None:
        tap, self._trace_filter = self._trace_filter, None
        if tap is not None:
            tap.remove_trace_filter()

    def _quiet_memory_trace(self, trace) -> None:
        """Without the filter, allocations and frees under the native tap cost no Python frame.

        Once gpu_trace is on, torch calls each memory registry's
        ``fire_callbacks`` for every block the caching allocator hands out or
        takes back. The tap learns of a new owner of the bytes itself (a new
        generation, which frees the previous owner in the engine and honours
        its ``record_stream`` pledges), so while it runs the two memory
        registries call a C builtin instead, unless something else listens on
        them. Restored at ``restore()``.
        """
        if _memory_listeners_besides_ours(trace):
            return
        for name in _MEMORY_REGISTRIES:
            registry = getattr(trace, name, None)
            if registry is not None:
                self._patcher.replace(registry, "fire_callbacks", id)

    # -- the dispatch mode (the fallback) -----------------------------------------

    def enter_dispatch_mode(self) -> None:
        """Push the dispatch mode on this thread's stack: from now on every op reaches ``sink.on_op``."""
        mode_class = make_dispatch_mode()
        self.dispatch_mode = mode_class()
        self.dispatch_mode.__enter__()
        self._dispatch_thread = threading.get_ident()

    def remove_dispatch_mode(self) -> None:
        mode = self.dispatch_mode
        if mode is None:
            return
        self.dispatch_mode = None
        mode.enabled = False
        if self._dispatch_thread != threading.get_ident():
            return  # pushed on another thread's stack: it stays, switched off
        try:
            from torch.utils._python_dispatch import _get_current_dispatch_mode

            if _get_current_dispatch_mode() is mode:
                mode.__exit__(None, None, None)
        except Exception as error:
            self.sink.internal_error("dispatch mode removal", error)

    # -- cheap wrappers installed at start ------------------------------------

    def _patch(self, owner, attribute: str, replacement) -> None:
        """Put a wrapper of the user's call in place (restored at ``restore()``)."""
        function = replacement.__func__ if isinstance(replacement, staticmethod) else replacement
        forwards_user_call(function)
        self._patcher.replace(owner, attribute, replacement)

    def _install_triggers(self, torch) -> None:
        cuda = torch.cuda
        sink = self.sink
        Stream = cuda.Stream
        Event = cuda.Event

        original_new = Stream.__dict__["__new__"].__func__

        def stream_new(cls, *args, **kwargs):
            stream = original_new(cls, *args, **kwargs)
            if _ACTIVE is sink and not getattr(_LOCAL, "own_stream", False):
                sink.stream_created(stream)
            return stream

        self._patch(Stream, "__new__", staticmethod(stream_new))

        original_set_stream = cuda.set_stream

        def set_stream(stream):
            if _ACTIVE is sink and stream is not None:
                if not sink.active and getattr(stream, "cuda_stream", DEFAULT_STREAM) != DEFAULT_STREAM:
                    sink.activate("a side stream was made current")
                sink.name_stream(stream)
            return original_set_stream(stream)

        self._patch(cuda, "set_stream", set_stream)

        original_wait_stream = Stream.wait_stream

        def wait_stream(this, other):
            if _ACTIVE is not sink:
                return original_wait_stream(this, other)
            sink.activate("wait_stream between streams")
            sink.name_stream(this)
            sink.name_stream(other)
            # torch builds wait_stream from an event recorded on ``other`` and
            # waited on by ``this``; the sink is told the wait_stream itself,
            # once, and the gpu_trace callbacks of that inner event (two Python
            # round trips into the engine) return at once.
            _LOCAL.in_wait_stream = True
            try:
                result = original_wait_stream(this, other)
            finally:
                _LOCAL.in_wait_stream = False
            sink.wait_stream(this, other)
            return result

        self._patch(Stream, "wait_stream", wait_stream)

        original_record = Event.record
        original_wait = Event.wait

        def record(this, stream=None):
            if (
                _ACTIVE is sink
                and stream is not None
                and not getattr(_LOCAL, "in_wait_stream", False)
                and getattr(stream, "cuda_stream", 0) != DEFAULT_STREAM
            ):
                sink.activate("an event was recorded on a side stream")
                sink.name_stream(stream)
            return original_record(this, stream)

        def wait(this, stream=None):
            if (
                _ACTIVE is sink
                and stream is not None
                and not getattr(_LOCAL, "in_wait_stream", False)
                and getattr(stream, "cuda_stream", 0) != DEFAULT_STREAM
            ):
                sink.activate("a side stream waited on an event")
                sink.name_stream(stream)
            return original_wait(this, stream)

        self._patch(Event, "record", record)
        self._patch(Event, "wait", wait)

        original_synchronize = cuda.synchronize
        original_stream_synchronize = Stream.synchronize
        original_event_synchronize = Event.synchronize

        def synchronize(*args, **kwargs):
            result = original_synchronize(*args, **kwargs)
            if _ACTIVE is sink and not sink.active:
                sink.host_synced()  # torch.cuda.synchronize()
            return result

        def stream_synchronize(this):
            result = original_stream_synchronize(this)
            if _ACTIVE is sink and not sink.active:
                sink.host_synced()  # Stream.synchronize()
            return result

        def event_synchronize(this):
            result = original_event_synchronize(this)
            if _ACTIVE is sink and not sink.active:
                sink.host_synced()  # Event.synchronize()
            return result

        self._patch(cuda, "synchronize", synchronize)
        self._patch(Stream, "synchronize", stream_synchronize)
        self._patch(Event, "synchronize", event_synchronize)

        self._install_graph_wrappers(torch)
        self._install_distributed_wrappers(torch)
        self.install_triton_wrapper()

    def watch_implicit_syncs(self, torch) -> None:
        """``.item()``, ``.cpu()``, blocking copies: torch's sync debug mode reports them as warnings.

        Free while nothing syncs. A warning of that text is swallowed here
        unless the session's sync check (whose hook this one wraps) wants it.
        """
        sink = self.sink

        def on_sync() -> bool:
            if _ACTIVE is sink and not sink.active:
                sink.host_synced()  # a synchronizing call (.item(), .cpu(), a blocking copy...)
            # Swallowed when the mode is on for this check only (the user did not
            # ask to see these); handed on to the sync check's hook when it runs.
            return self._previous_sync_mode is not None and not sink.sync_check_running()

        self._sync_warnings = WarningHook(SYNC_WARNING, on_sync)
        self._sync_warnings.install()
        try:
            mode = torch.cuda.get_sync_debug_mode()
            if mode == 0:
                with warnings.catch_warnings():
                    warnings.filterwarnings("ignore", message=PROTOTYPE_WARNING)
                    torch.cuda.set_sync_debug_mode("warn")
                self._previous_sync_mode, self._sync_mode_torch = mode, torch
        except Exception as error:
            sink.internal_error("sync debug mode", error)

    def unwatch_implicit_syncs(self) -> None:
        torch = self._sync_mode_torch
        if self._previous_sync_mode is not None and torch is not None:
            try:
                with warnings.catch_warnings():
                    warnings.filterwarnings("ignore", message=PROTOTYPE_WARNING)
                    torch.cuda.set_sync_debug_mode(self._previous_sync_mode)
            except Exception as error:
                self.sink.internal_error("sync debug mode", error)
            self._previous_sync_mode = self._sync_mode_torch = None
        if self._sync_warnings is not None:
            self._sync_warnings.remove()
            self._sync_warnings = None

    def _install_graph_wrappers(self, torch) -> None:
        graphs = getattr(torch.cuda, "graphs", None)
        CUDAGraph = getattr(graphs, "CUDAGraph", None)
        if CUDAGraph is None:
            return
        sink = self.sink
        begin, end, replay = CUDAGraph.capture_begin, CUDAGraph.capture_end, CUDAGraph.replay

        def capture_begin(this, *args, **kwargs):
            if _ACTIVE is sink:
                sink.graph_capture_begin(this)
            return begin(this, *args, **kwargs)

        def capture_end(this, *args, **kwargs):
            try:
                return end(this, *args, **kwargs)
            finally:
                if _ACTIVE is sink:
                    sink.graph_capture_end(this)

        def graph_replay(this, *args, **kwargs):
            if _ACTIVE is sink:
                sink.graph_replay(this)
            return replay(this, *args, **kwargs)

        self._patch(CUDAGraph, "capture_begin", capture_begin)
        self._patch(CUDAGraph, "capture_end", capture_end)
        self._patch(CUDAGraph, "replay", graph_replay)

    # Collectives: which positional arguments are written and which read.
    _COLLECTIVES = {
        "all_reduce": ((0,), (0,)),
        "broadcast": ((0,), (0,)),
        "reduce": ((0,), (0,)),
        "all_gather_into_tensor": ((0,), (1,)),
        "reduce_scatter_tensor": ((0,), (1,)),
        "all_to_all_single": ((0,), (1,)),
        "all_gather": ((0,), (1,)),
        "reduce_scatter": ((0,), (1,)),
        "send": ((), (0,)),
        "isend": ((), (0,)),
        "recv": ((0,), ()),
        "irecv": ((0,), ()),
    }

    def _install_distributed_wrappers(self, torch) -> None:
        if "torch.distributed" not in sys.modules:
            try:
                importlib.import_module("torch.distributed")
            except Exception:
                return
        dist = sys.modules.get("torch.distributed")
        if dist is None or not dist.is_available():
            return
        import inspect

        c10d = sys.modules.get("torch.distributed.distributed_c10d")
        sink = self.sink
        for name, (writes, reads) in self._COLLECTIVES.items():
            original = getattr(dist, name, None)
            if original is None:
                continue
            try:
                signature = inspect.signature(original)
            except (TypeError, ValueError):
                continue
            wrapper = _collective_wrapper(sink, name, original, signature, writes, reads)
            self._patch(dist, name, wrapper)
            if c10d is not None and getattr(c10d, name, None) is original:
                self._patch(c10d, name, wrapper)
        Work = getattr(dist, "Work", None)
        if Work is not None and hasattr(Work, "wait"):
            original_wait = Work.wait

            def work_wait(this, *args, **kwargs):
                result = original_wait(this, *args, **kwargs)
                if _ACTIVE is sink:
                    sink.work_waited(this)
                return result

            self._patch(Work, "wait", work_wait)

    def install_triton_wrapper(self) -> None:
        """Wrap Triton's ``JITFunction.run`` (once, and again at activation if Triton arrived since)."""
        if self._triton_wrapped:
            return
        jit = sys.modules.get("triton.runtime.jit")
        JITFunction = getattr(jit, "JITFunction", None)
        if JITFunction is None or not hasattr(JITFunction, "run"):
            return
        sink = self.sink
        original_run = JITFunction.run

        def run(this, *args, **kwargs):
            if _ACTIVE is sink and sink.active and not kwargs.get("warmup", False):
                try:
                    sink.triton_launch(this, args, kwargs)
                except Exception as error:
                    sink.internal_error("triton", error)
            return original_run(this, *args, **kwargs)

        self._patch(JITFunction, "run", run)
        self._triton_wrapped = True


def _collective_wrapper(sink, name, original, signature, writes, reads):
    parameters = list(signature.parameters)

    def wrapper(*args, **kwargs):
        if _ACTIVE is not sink:
            return original(*args, **kwargs)
        try:
            bound = signature.bind_partial(*args, **kwargs)
        except TypeError:
            return original(*args, **kwargs)
        values = bound.arguments

        def tensors(positions):
            out = []
            for position in positions:
                if position >= len(parameters):
                    continue
                value = values.get(parameters[position])
                if isinstance(value, (list, tuple)):
                    out.extend(value)
                elif value is not None:
                    out.append(value)
            return out

        async_op = bool(values.get("async_op", name in ("isend", "irecv")))
        return sink.collective(
            name,
            tensors(writes),
            tensors(reads),
            values.get("group"),
            async_op,
            forwards_user_call(lambda: original(*args, **kwargs)),
        )

    wrapper.__wrapped__ = original
    wrapper.__name__ = name
    wrapper.__doc__ = original.__doc__
    return wrapper


# -- gpu_trace callbacks: registered once per process, gated by _ACTIVE --------


def _to_sink(method: str, in_wait_stream_too: bool = True) -> Callable[..., None]:
    """A gpu_trace callback handing its event to the active sink's ``method`` (nothing when none is active)."""

    def callback(*args) -> None:
        if not in_wait_stream_too and getattr(_LOCAL, "in_wait_stream", False):
            return  # the wait_stream wrapper tells the sink the wait_stream itself
        sink = _ACTIVE
        if sink is not None:
            getattr(sink, method)(*args)

    callback.__name__ = f"_trace_{method}"
    return callback


_trace_event_record = _to_sink("trace_event_record", in_wait_stream_too=False)
_trace_event_wait = _to_sink("trace_event_wait", in_wait_stream_too=False)
_trace_event_sync = _to_sink("trace_event_sync")
_trace_stream_sync = _to_sink("trace_stream_sync")
_trace_device_sync = _to_sink("trace_device_sync")
_trace_stream_created = _to_sink("trace_stream_created")
_trace_event_deleted = _to_sink("trace_event_deleted")


def _trace_free(pointer):
    # Fires for every block the caching allocator frees (without the tap's filter): no lookup by name.
    sink = _ACTIVE
    if sink is not None:
        sink.trace_free(pointer)


_TRACE_CALLBACKS = {
    "register_callback_for_event_record": _trace_event_record,
    "register_callback_for_event_wait": _trace_event_wait,
    "register_callback_for_event_synchronization": _trace_event_sync,
    "register_callback_for_stream_synchronization": _trace_stream_sync,
    "register_callback_for_device_synchronization": _trace_device_sync,
    "register_callback_for_memory_deallocation": _trace_free,
    "register_callback_for_stream_creation": _trace_stream_created,
    "register_callback_for_event_deletion": _trace_event_deleted,
}


def _gpu_trace_module():
    try:  # a submodule: not imported by ``import torch``
        import importlib

        return importlib.import_module("torch.cuda._gpu_trace")
    except ImportError:
        return None


def _activate_torch_gpu_trace(torch) -> None:
    """torch's own gpu_trace, on for the rest of the process (once)."""
    global _TORCH_TRACE_ACTIVATED
    with _TRACE_LOCK:
        if not _TORCH_TRACE_ACTIVATED:
            torch._C._activate_gpu_trace()
            _TORCH_TRACE_ACTIVATED = True


def _memory_listeners_besides_ours(trace) -> bool:
    """Whether anything but this check listens to gpu_trace's allocations and frees (CSAN, the user)."""
    for name in _MEMORY_REGISTRIES:
        callbacks = getattr(getattr(trace, name, None), "callback_list", None) or []
        if any(callback is not _trace_free for callback in callbacks):
            return True
    return False
