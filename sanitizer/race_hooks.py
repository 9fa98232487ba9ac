"""How the race check is wired into torch: one place for every hook it installs.

* **Wrappers installed at ``start()``** on rare calls only (``Stream()``,
  ``set_stream``, ``wait_stream``, event record/wait, host syncs, graph
  capture and replay, ``torch.distributed`` collectives and ``Work.wait``,
  Triton's ``JITFunction.run``), through one ``Patcher`` (``patching.py``,
  shared with the sync check), restored exactly at ``stop()``. Before
  activation they record host syncs (``race_prehistory.py``) and switch the
  analysis on at the first sign of a second stream.
* **Implicit host syncs** (``.item()``, ``.cpu()``, blocking copies) before
  activation: torch's sync debug mode in warn mode and a ``showwarning`` hook,
  free while nothing syncs.
* **gpu_trace callbacks** (event record/wait/sync, stream and device syncs,
  stream creation, frees), registered once per process and gated by the
  module-level ``_ACTIVE`` pointer: torch offers no way to remove them and
  **gpu_trace cannot be deactivated**, so after one activation every CUDA
  event and free in the process makes a Python round trip even when no check
  runs. torch swallows exceptions raised in them, so they record errors on
  the check instead.
* **The dispatch mode**, the fallback that sees every op where the native tap
  (``race_tap.cpp``) cannot be built.
"""
from __future__ import annotations

import sys
import threading
import warnings
from typing import Any, Callable

from .patching import WarningHook
from .race_ops import DEFAULT_STREAM, SKIP, capture_long_site
from .race_ops import plan as plan_of
from .sync import PROTOTYPE_WARNING, SYNC_WARNING

# The check whose engine the process-global hooks feed (None: hooks do nothing).
_ACTIVE = None
_TRACE_REGISTERED = False
_TRACE_LOCK = threading.Lock()
_TORCH_TRACE_ACTIVATED = False
# gpu_trace's registries of allocations and frees (their names since torch 2.1).
_MEMORY_REGISTRIES = ("MemoryAllocationCallbacks", "MemoryDeallocationCallbacks")
# Set while one of our own wrappers (collectives) runs, so the dispatch mode
# does not count the c10d ops it issues a second time.
_LOCAL = threading.local()


def set_active(check) -> None:
    global _ACTIVE
    _ACTIVE = check


def clear_active(check) -> None:
    global _ACTIVE
    if _ACTIVE is check:
        _ACTIVE = None


def active():
    return _ACTIVE


def make_dispatch_mode():
    from torch.utils._python_dispatch import TorchDispatchMode

    class RaceDispatchMode(TorchDispatchMode):
        """Sees every ATen op; hands its CUDA tensors to the active race check."""

        enabled = True

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            check = _ACTIVE
            if check is not None and self.enabled and check._engine is not None:
                # Keyed by id: OpOverload hashes in Python. The plan holds func,
                # so the id cannot be reused while the entry lives.
                plan = check._plans.get(id(func))
                if plan is None:
                    plan = check._plans[id(func)] = plan_of(func) + (func,)
                if plan[0] is SKIP:
                    return out  # views, metadata: most ops of a step end here
                try:
                    check._on_op(plan, args, kwargs, out)
                except Exception as error:  # never break the user's program
                    check._internal_error("dispatch", error)
            return out

    return RaceDispatchMode


class TorchHooks:
    """The wiring half of ``RaceCheck``: what it installs in torch, and how it is removed."""

    # -- gpu_trace (once per process) ----------------------------------------

    def _register_trace(self, torch, tap=None) -> None:
        """Route CUDA events, syncs and stream creations to the engine through gpu_trace.

        The callbacks are registered once per process. Under a native tap built
        with the gpu_trace filter, the filter is installed for this check's
        lifetime (removed at ``stop()``) and torch's own gpu_trace is never
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
            self._gpu_trace_route = "filtered: events and syncs only"
            return
        _activate_torch_gpu_trace(torch)
        self._gpu_trace_route = "torch: every event, sync, allocation and free"
        if tap is not None:
            self._quiet_memory_trace(trace)

    def _install_sync_ledger(self, tap) -> bool:
        """Before activation, let the tap's gpu_trace filter keep the host-sync ledger in C++.

        The filter notes every block the allocator hands out and clears the
        note at every host sync torch reports (device, stream and event syncs,
        and the implicit ones: ``.item()``, blocking copies), so activation
        needs one allocator snapshot instead of one per sync; a sync costs only
        torch's own gpu_trace hook, forwarded to Python as it would be once the
        check is active (race_prehistory.py). False where the tap
        has no filter: the check then snapshots at every sync it hears of.
        """
        trace = _gpu_trace_module()
        if tap is None or trace is None or not hasattr(tap, "track_allocations_since_sync"):
            return False
        tap.install_trace_filter(forward_memory=_memory_listeners_besides_ours(trace))
        tap.track_allocations_since_sync()
        self._trace_filter = tap
        self._gpu_trace_route = "filtered: allocations and host syncs counted in C++ until activation"
        return True

    def _register_trace_callbacks(self, torch):
        """``torch.cuda._gpu_trace`` with this module's callbacks registered (once), or None without it."""
        global _TRACE_REGISTERED
        with _TRACE_LOCK:
            trace = _gpu_trace_module()
            if getattr(torch._C, "_activate_gpu_trace", None) is None or trace is None:
                if not _TRACE_REGISTERED:
                    self.notes.append("torch has no gpu_trace: syncs issued from C++ are not seen (false alarms possible)")
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

    def _remove_trace_filter(self) -> None:
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
        them. Restored at ``stop()``.
        """
        if _memory_listeners_besides_ours(trace):
            return
        for name in _MEMORY_REGISTRIES:
            registry = getattr(trace, name, None)
            if registry is not None:
                self._patch(registry, "fire_callbacks", id)

    # -- cheap wrappers installed at start ------------------------------------

    def _patch(self, owner, attribute: str, replacement) -> None:
        self._patcher.replace(owner, attribute, replacement)

    def _install_triggers(self, torch) -> None:
        cuda = torch.cuda
        check = self
        Stream = cuda.Stream
        Event = cuda.Event

        original_new = Stream.__dict__["__new__"].__func__

        def stream_new(cls, *args, **kwargs):
            stream = original_new(cls, *args, **kwargs)
            if _ACTIVE is check and not getattr(_LOCAL, "own_stream", False):
                check._user_streams.add(getattr(stream, "cuda_stream", None))
                check._activate("a CUDA stream was created")
            return stream

        self._patch(Stream, "__new__", staticmethod(stream_new))

        original_set_stream = cuda.set_stream

        def set_stream(stream):
            if _ACTIVE is check and stream is not None:
                if check._engine is None and getattr(stream, "cuda_stream", DEFAULT_STREAM) != DEFAULT_STREAM:
                    check._activate("a side stream was made current")
                check._name_stream(stream)
            return original_set_stream(stream)

        self._patch(cuda, "set_stream", set_stream)

        original_wait_stream = Stream.wait_stream

        def wait_stream(this, other):
            if _ACTIVE is not check:
                return original_wait_stream(this, other)
            check._activate("wait_stream between streams")
            check._name_stream(this)
            check._name_stream(other)
            # torch builds wait_stream from an event recorded on ``other`` and
            # waited on by ``this``; the engine is told the wait_stream itself,
            # once, and the gpu_trace callbacks of that inner event (two Python
            # round trips into the engine) return at once.
            _LOCAL.in_wait_stream = True
            try:
                result = original_wait_stream(this, other)
            finally:
                _LOCAL.in_wait_stream = False
            check._wait_stream(this, other)
            return result

        self._patch(Stream, "wait_stream", wait_stream)

        original_record = Event.record
        original_wait = Event.wait

        def record(this, stream=None):
            if (
                _ACTIVE is check and stream is not None and not getattr(_LOCAL, "in_wait_stream", False)
                and getattr(stream, "cuda_stream", 0) != DEFAULT_STREAM
            ):
                check._activate("an event was recorded on a side stream")
                check._name_stream(stream)
            return original_record(this, stream)

        def wait(this, stream=None):
            if (
                _ACTIVE is check and stream is not None and not getattr(_LOCAL, "in_wait_stream", False)
                and getattr(stream, "cuda_stream", 0) != DEFAULT_STREAM
            ):
                check._activate("a side stream waited on an event")
                check._name_stream(stream)
            return original_wait(this, stream)

        self._patch(Event, "record", record)
        self._patch(Event, "wait", wait)

        original_synchronize = cuda.synchronize
        original_stream_synchronize = Stream.synchronize
        original_event_synchronize = Event.synchronize

        def synchronize(*args, **kwargs):
            result = original_synchronize(*args, **kwargs)
            if _ACTIVE is check and check._engine is None:
                check._host_synced()  # torch.cuda.synchronize()
            return result

        def stream_synchronize(this):
            result = original_stream_synchronize(this)
            if _ACTIVE is check and check._engine is None:
                check._host_synced()  # Stream.synchronize()
            return result

        def event_synchronize(this):
            result = original_event_synchronize(this)
            if _ACTIVE is check and check._engine is None:
                check._host_synced()  # Event.synchronize()
            return result

        self._patch(cuda, "synchronize", synchronize)
        self._patch(Stream, "synchronize", stream_synchronize)
        self._patch(Event, "synchronize", event_synchronize)

        self._install_graph_wrappers(torch)
        self._install_distributed_wrappers(torch)
        self._install_triton_wrapper()

    def _watch_implicit_syncs(self, torch) -> None:
        """``.item()``, ``.cpu()``, blocking copies: torch's sync debug mode reports them as warnings.

        Free while nothing syncs. A warning of that text is swallowed here
        unless the session's sync check (whose hook this one wraps) wants it.
        """
        def on_sync() -> bool:
            if _ACTIVE is self and self._engine is None:
                self._host_synced()  # a synchronizing call (.item(), .cpu(), a blocking copy...)
            # Swallowed when the mode is on for this check only (the user did not
            # ask to see these); handed on to the sync check's hook when it runs.
            return self._previous_sync_mode is not None and not self._sync_check_running()

        self._sync_warnings = WarningHook(SYNC_WARNING, on_sync)
        self._sync_warnings.install()
        try:
            mode = torch.cuda.get_sync_debug_mode()
            if mode == 0:
                with warnings.catch_warnings():
                    warnings.filterwarnings("ignore", message=PROTOTYPE_WARNING)
                    torch.cuda.set_sync_debug_mode("warn")
                self._previous_sync_mode = mode
        except Exception as error:
            self._internal_error("sync debug mode", error)

    def _unwatch_implicit_syncs(self) -> None:
        torch = self._torch
        if self._previous_sync_mode is not None and torch is not None:
            try:
                with warnings.catch_warnings():
                    warnings.filterwarnings("ignore", message=PROTOTYPE_WARNING)
                    torch.cuda.set_sync_debug_mode(self._previous_sync_mode)
            except Exception as error:
                self._internal_error("sync debug mode", error)
            self._previous_sync_mode = None
        if self._sync_warnings is not None:
            self._sync_warnings.remove()
            self._sync_warnings = None

    def _sync_check_running(self) -> bool:
        checks = getattr(self.session, "_checks", None) or ()
        return any(getattr(other, "name", None) == "sync" for other in checks)

    def _install_graph_wrappers(self, torch) -> None:
        graphs = getattr(torch.cuda, "graphs", None)
        CUDAGraph = getattr(graphs, "CUDAGraph", None)
        if CUDAGraph is None:
            return
        check = self
        begin, end, replay = CUDAGraph.capture_begin, CUDAGraph.capture_end, CUDAGraph.replay

        def capture_begin(this, *args, **kwargs):
            if _ACTIVE is check:
                check._activate("a CUDA graph capture began")
                check._engine.capture_begin(id(this), check._current_stream(), capture_long_site())
            return begin(this, *args, **kwargs)

        def capture_end(this, *args, **kwargs):
            try:
                return end(this, *args, **kwargs)
            finally:
                if _ACTIVE is check and check._engine is not None:
                    check._engine.capture_end(id(this))

        def graph_replay(this, *args, **kwargs):
            if _ACTIVE is check and check._engine is not None:
                stream = check._current_stream()
                check._engine.graph_replay(id(this), stream, capture_long_site())
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
                import torch.distributed  # noqa: F401
            except Exception:
                return
        dist = sys.modules.get("torch.distributed")
        if dist is None or not dist.is_available():
            return
        import inspect

        c10d = sys.modules.get("torch.distributed.distributed_c10d")
        check = self
        for name, (writes, reads) in self._COLLECTIVES.items():
            original = getattr(dist, name, None)
            if original is None:
                continue
            try:
                signature = inspect.signature(original)
            except (TypeError, ValueError):
                continue
            wrapper = _collective_wrapper(check, name, original, signature, writes, reads)
            self._patch(dist, name, wrapper)
            if c10d is not None and getattr(c10d, name, None) is original:
                self._patch(c10d, name, wrapper)
        Work = getattr(dist, "Work", None)
        if Work is not None and hasattr(Work, "wait"):
            original_wait = Work.wait

            def work_wait(this, *args, **kwargs):
                result = original_wait(this, *args, **kwargs)
                if _ACTIVE is check and check._engine is not None:
                    entry = check._works.pop(id(this), None)
                    if entry is not None:
                        check._engine.work_wait(entry[0], check._current_stream(), capture_long_site())
                return result

            self._patch(Work, "wait", work_wait)

    def _install_triton_wrapper(self) -> None:
        jit = sys.modules.get("triton.runtime.jit")
        JITFunction = getattr(jit, "JITFunction", None)
        if JITFunction is None or not hasattr(JITFunction, "run"):
            return
        check = self
        original_run = JITFunction.run

        def run(this, *args, **kwargs):
            if _ACTIVE is check and check._engine is not None and not kwargs.get("warmup", False):
                try:
                    check._triton_launch(this, args, kwargs)
                except Exception as error:
                    check._internal_error("triton", error)
            return original_run(this, *args, **kwargs)

        self._patch(JITFunction, "run", run)
        self._triton_wrapped = True


def _collective_wrapper(check, name, original, signature, writes, reads):
    parameters = list(signature.parameters)

    def wrapper(*args, **kwargs):
        if _ACTIVE is not check:
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
        return check._collective(
            name, tensors(writes), tensors(reads), values.get("group"), async_op, lambda: original(*args, **kwargs)
        )

    wrapper.__wrapped__ = original
    wrapper.__name__ = name
    wrapper.__doc__ = original.__doc__
    return wrapper


# -- gpu_trace callbacks: registered once per process, gated by _ACTIVE --------


def _engine_or_none():
    check = _ACTIVE
    if check is None or check._engine is None:
        return None, None
    if check._tap is not None:
        try:
            check._sync_tap()
        except Exception as error:
            check._internal_error("native tap sync", error)
    return check, check._engine


def _to_engine(what: str, forward: Callable[[Any], None]) -> None:
    """Hand one gpu_trace event to the active check's engine, once the tap's
    launches are in it; a failure is the check's internal error, never the program's."""
    check, engine = _engine_or_none()
    if engine is None:
        return
    try:
        forward(engine)
    except Exception as error:
        check._internal_error(what, error)


def _trace_event_record(event, stream):
    if getattr(_LOCAL, "in_wait_stream", False):
        return  # the wrapper tells the engine the wait_stream itself
    _to_engine("event_record", lambda engine: engine.event_record(event, stream, capture_long_site()))


def _trace_event_wait(event, stream):
    if getattr(_LOCAL, "in_wait_stream", False):
        return
    _to_engine("event_wait", lambda engine: engine.event_wait(event, stream, capture_long_site()))


def _trace_event_sync(event):
    _to_engine("event_sync", lambda engine: engine.event_sync(event, capture_long_site()))


def _trace_stream_sync(stream):
    _to_engine("stream_sync", lambda engine: engine.stream_sync(stream, capture_long_site()))


def _trace_device_sync():
    _to_engine("device_sync", lambda engine: engine.device_sync(capture_long_site()))


def _trace_free(pointer):
    # Fires for every block the caching allocator frees: kept to a few lookups
    # for blocks the check never saw.
    check = _ACTIVE
    if check is None:
        return
    engine = check._engine
    if engine is None:
        return
    try:
        if check._allocs.pop(pointer, None) is not None or engine.has_pledge(pointer):
            engine.free(pointer)
    except Exception as error:
        check._internal_error("free", error)


def _trace_stream_created(stream):
    check = _ACTIVE
    if check is None:
        return
    try:
        check._activate("a CUDA stream was created")
        if check._engine is not None:
            check._engine.stream_created(stream)
    except Exception as error:
        check._internal_error("stream_creation", error)


def _trace_event_deleted(event):
    check, engine = _engine_or_none()
    if engine is None:
        return
    engine.forget_event(event)


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
