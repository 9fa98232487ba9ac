"""The race check: cross-stream data races in a real PyTorch program.

``RaceCheck`` (this module: its lifecycle, activation, the native tap's
messages and the fallback's per-op analysis) feeds the happens-before engine
(``happens_before.py``) from torch and turns its races into findings. It is
the ``RaceSink`` of its hooks (``hooks.py``, every hook it installs in torch,
each telling the sink what the program did). The rest of the check:
``ops.py`` classifies an op's accesses (the Python twin of ``race_tap.cpp``),
``prehistory.py`` what it records before activation, and ``report.py`` the
findings, a pure function of a race and the names seen. How it sees the
program:

* **Accesses**: every ATen op's CUDA tensor arguments are classified from the
  op's schema: ``Tensor(a!)`` arguments are writes, other tensors reads, fresh
  outputs writes; views (non-writing aliases) and the inputs of
  ``*_like``/``new_*`` factories touch no memory; ``empty*`` allocates without
  writing. Each access is keyed by its byte range (the bounding box of sizes x
  strides from the storage offset), never by ``data_ptr`` alone. The native
  tap (``race_tap.cpp``, a RecordFunction callback) does this in C++ and hands
  the engine only what can race (``_on_tap``); where it cannot be built, a
  ``TorchDispatchMode`` does it in Python (``on_op``), with the same results.
* **Sites**: each analysed op's user stack is captured cheaply and turned
  into lines only if a report reads it: the native tap keeps the user's frames
  as code objects and instruction offsets (``user_site`` in ``race_tap.cpp``);
  the Python side uses ``gather_traceback`` (``ops.Site``). Ops that touch
  no device memory capture nothing.
* **Kernels that bypass the dispatcher**: Triton's ``JITFunction.run`` is
  wrapped, every CUDA tensor argument counted as read and write on the
  current stream. Other raw launches (pybind extensions) stay invisible.
* **Synchronization**: ``torch._C._activate_gpu_trace()`` and one callback per
  ``torch.cuda._gpu_trace`` registry (event record/wait/sync, stream and device
  syncs, stream creation, frees). They are registered once per process and
  gated by the module-level ``_ACTIVE`` pointer, because torch offers no way
  to remove them and **gpu_trace cannot be deactivated**: once one session has
  needed it, every later event in the process makes a Python round trip (a
  few microseconds) even when no check is running. torch swallows exceptions
  raised in these callbacks, so errors are recorded and reported at ``stop()``.
* **Collectives**: ``torch.distributed`` collectives are wrapped; each runs on a
  pseudo-stream per process group that waits for the issuing stream, and
  ``Work.wait()`` (or ``async_op=False``) joins it back. c10d ops reached
  by other paths (DDP's reducer) are treated as plain ops on the current
  stream, as CSAN does.
* **CUDA graphs**: ``CUDAGraph.capture_begin/capture_end`` record what the
  capture touches instead of running it; ``replay()`` runs it on the replay
  stream.
* **Allocator reuse**: accesses live in the engine's address map after the
  tensor dies, so the next owner of the bytes is checked against them;
  ``record_stream`` is a pledge honoured at the free (gpu_trace's deallocation
  callback).

Pay only for what is used: ``start()`` installs only a few Python wrappers on
rare calls (creating or entering a stream, events, collectives, graphs). The
tap (or the dispatch mode) and gpu_trace are switched on at the first sign of a second
stream, a collective or a graph capture ("activation"). Until then a
single-stream program pays nothing per op. What must be known about the
default stream's earlier work is decided at activation from the program's
order alone (``prehistory.py``): every live block of the caching
allocator that no host sync seen before activation covers is treated as
written by unfinished work, so a new stream that touches it without waiting
is reported, on a fast GPU or a slow one.

torch.compile: under the tap, compiled code runs compiled and only the ATen
ops it calls are seen; under the dispatch mode, Dynamo runs the function
eagerly, so compiled code is verified with eager semantics.
``RaceCheck.notes`` (and a warning at ``stop()``) say which applied when
Dynamo compiled frames while the check was on.
"""

from __future__ import annotations

import sys
import warnings
from time import perf_counter as _perf_counter
from typing import Any, Callable, Dict, Hashable, List, Optional, Tuple

from .. import timeline as _timeline
from ..findings import Finding
from ..frames import forwards_user_call
from ..frames import site_origin as _site_origin
from ..internal_errors import InternalErrors
from ..session import Check, SessionView
from . import hooks as race_hooks
from . import native_tap
from . import ops as race_ops
from .happens_before import AllocInfo, HappensBefore, Race
from .hooks import _LOCAL, RaceHooks, RaceSink
from .ops import (
    DEFAULT_STREAM,
    NO_USER_FRAME,
    NO_WRITE_OUTPUT,
    RECORD_STREAM,
    capture_long_site,
    capture_site,
    list_labels,
)
from .prehistory import HostSyncLedger, live_blocks
from .report import _is_stream, _scope_items, _user_frame, build_finding

# Local records the tap may hold before history every stream is ordered after is dropped.
_TAP_PRUNE_AT = 200_000
_Tensor: Any = None  # torch.Tensor, bound at start() (torch is imported lazily)
_Parameter: Any = None  # torch.nn.Parameter: optimizer ops take lists of them


def _not_started() -> Hashable:
    raise RuntimeError("the race check has not started: no stream to ask for")


class RaceCheck(Check, RaceSink):
    """Cross-stream race detection; the ``race`` check of a sanitizer session."""

    name = "race"

    def __init__(self, session: Optional[SessionView] = None):
        self.session = session
        self._engine: Optional[HappensBefore] = None
        self._started = False
        self._hooks = RaceHooks(self)
        self._allocs: Dict[int, Any] = {}  # storage base -> AllocInfo (live, as seen here)
        self._works: Dict[int, Tuple[int, Any]] = {}
        self._next_work = 0
        self._stream_names: Dict[Hashable, str] = {DEFAULT_STREAM: "torch.cuda.default_stream()"}
        self._tensor_names: Dict[int, str] = {}
        self._race_context: Dict[int, dict] = {}
        self.errors = InternalErrors("race")
        self._step = 0
        self._activation_reason: Optional[str] = None
        self._device_filter = "cuda"  # tests set "cpu" (and _want_cuda False) to run on CPU tensors
        self._want_cuda = True
        self._current_stream: Callable[[], Hashable] = _not_started
        self._dynamo_frames_at_start = 0
        self.notes: List[str] = []
        self._torch: Any = None  # the torch module, once started
        # The native tap (race_tap.cpp) when it sees the ops instead of the dispatch mode.
        self._tap = None
        self._tap_choice: Optional[str] = None  # None: TORCHLINT_RACE_TAP; tests set it
        self._tap_unavailable: Optional[str] = None
        self._tap_keys: Dict[int, Hashable] = {}  # the tap's stream key -> the engine's
        self._user_streams: set = set()  # streams the program created, entered, waited on or recorded on
        self._internal_streams: set = set()  # a collective backend's own streams (native tap only)
        self._tap_gens: Dict[int, Tuple[int, AllocInfo]] = {}  # base -> (generation, its allocation)
        self._tap_stats: Dict[str, Any] = {}  # the tap's counters, kept at stop()
        self._last_prune_floor: Optional[Dict[int, int]] = None  # the floor the tap was last pruned to
        self._records_left_by_prune = 0  # local records that prune could not drop
        self._interception: Optional[str] = None  # "native tap" or "dispatch mode", once active
        # Host syncs before activation, with the blocks live at each (prehistory.py).
        self._ledger = HostSyncLedger()
        self._native_ledger = None  # the tap, while its gpu_trace filter keeps that ledger in C++
        self._memory_snapshot = None  # torch.cuda.memory_snapshot on CUDA; tests give a fake one

    @property
    def engine(self) -> HappensBefore:
        """The happens-before engine, on the paths that run only once the check is active."""
        engine = self._engine
        if engine is None:
            raise RuntimeError("the race check is not active")
        return engine

    # -- protocol -----------------------------------------------------------

    def start(self) -> None:
        if self._started:
            return
        import torch

        global _Tensor, _Parameter
        _Tensor = torch.Tensor
        _Parameter = torch.nn.Parameter
        race_ops.bind_tracebacks(torch)
        self._torch = torch
        self._started = True
        race_hooks.set_active(self)
        self._current_stream = self._raw_stream_getter(torch)
        self._dynamo_frames_at_start = self._dynamo_frames()
        self._hooks.install(torch)
        if self._want_cuda and torch.cuda.is_available():
            tap = self._prebuild_tap()
            self._memory_snapshot = torch.cuda.memory_snapshot
            try:
                if self._hooks.install_sync_ledger(tap):
                    self._native_ledger = tap
            except Exception as error:
                self.internal_error("native sync ledger", error)
            if self._native_ledger is None:
                self._hooks.watch_implicit_syncs(torch)
            if torch.cuda.is_initialized():
                # Work issued before the check existed is finished when its
                # history begins: one device sync per session, not a guess.
                torch._C._cuda_synchronize()
                self.host_synced()  # the race check's start
            else:
                # Nothing was issued yet: the start orders what follows as a
                # sync would, and counts as one (the same report either way).
                self._ledger.host_sync(frozenset())

    def stop(self) -> None:
        if not self._started:
            return
        self._started = False
        race_hooks.clear_active(self)
        self._hooks.remove_dispatch_mode()
        self._remove_tap()
        self._hooks.restore()
        frames = self._dynamo_frames() - self._dynamo_frames_at_start
        if frames > 0 and self._engine is not None:
            if self._interception == "native tap":
                self.notes.append(
                    f"torch.compile ran {frames} frame(s) while the race check was active: the native tap sees the "
                    "ATen ops compiled code calls, not the Triton kernels Inductor generates "
                    "(TORCHLINT_RACE_TAP=python checks compiled code with eager semantics)"
                )
            else:
                self.notes.append(
                    f"torch.compile ran {frames} frame(s) while the race check was active: with its dispatch mode "
                    "on the stack they run eagerly, so compiled code was checked with eager semantics"
                )
        for note in self.notes:
            warnings.warn(f"torchlint race check: {note}", stacklevel=2)
        self.errors.warn()

    def on_step(self, step: int) -> None:
        self._step = step

    @property
    def active(self) -> bool:
        """True once a second stream, a collective or a graph switched the analysis on."""
        return self._engine is not None

    @property
    def activation_reason(self) -> Optional[str]:
        return self._activation_reason

    def summary(self) -> Dict[str, Any]:
        """How the check ran: whether it switched on, why, and how it saw the ops."""
        data: Dict[str, Any] = {
            "active": self._engine is not None,
            "activation_reason": self._activation_reason,
            "interception": self._interception,
        }
        if self._hooks.gpu_trace_route:
            data["gpu_trace"] = self._hooks.gpu_trace_route
        if self._tap_unavailable:
            data["native_tap_unavailable"] = self._tap_unavailable
        stats = dict(self._tap.stats()) if self._tap is not None else dict(self._tap_stats)
        if stats:
            stats.pop("first_error", None)
            data["native_tap"] = stats
        if self.errors:
            data["internal_errors"] = self.errors.to_json()
        if self._ledger.syncs:
            data["host_syncs_before_activation"] = self._ledger.syncs
        return data

    def findings(self) -> List[Finding]:
        if self._engine is None:
            return []
        return [self._finding(race) for race in self._engine.races]

    # -- activation ---------------------------------------------------------

    @staticmethod
    def _raw_stream_getter(torch):
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        device = getattr(torch._C, "_cuda_getDevice", None)
        if raw is not None and device is not None:
            # Both C calls: torch.cuda.current_device() would add a Python
            # lazy-init check to every op.
            return lambda: raw(device())
        if raw is not None:
            return lambda: raw(torch.cuda.current_device())
        return lambda: torch.cuda.current_stream().cuda_stream

    def activate(self, reason: str) -> None:
        """Switch the per-op analysis on (once per check)."""
        if self._engine is not None or not self._started:
            return
        torch = self._torch
        self._activation_reason = reason
        unfinished = self._unfinished_before_activation() if self._memory_snapshot is not None else None
        tap = self._load_tap()
        engine = HappensBefore(ticker=tap.tick if tap is not None else None)
        engine.on_race = self._on_race
        self._engine = engine
        if self._device_filter == "cuda":
            self._hooks.register_trace(torch, tap)
        self._seed_unfinished(unfinished)
        self._hooks.install_triton_wrapper()
        if tap is not None:
            self._tap = tap
            self._interception = "native tap"
            # Sites off where Python-side capture is off too (the bench's no-sites mode).
            site_origin = _site_origin if race_ops._gather is not None else None
            tap.enable(self._on_tap, site_origin, self._device_filter != "cuda", race_ops.SITE_FRAMES)
            return
        self._interception = "dispatch mode"
        self._hooks.enter_dispatch_mode()

    # -- the native tap ---------------------------------------------------------

    def _load_tap(self):
        """The native tap module, or None (the dispatch mode), with a note saying why."""
        try:
            choice = self._tap_choice or native_tap.choice()
            if choice == "python":
                return None
            return native_tap.load()
        except native_tap.TapUnavailable as error:
            self._tap_unavailable = str(error)
            self.notes.append(
                f"native tap unavailable ({error}): ops were seen through the slower Python dispatch mode"
            )
            return None

    def _prebuild_tap(self):
        """Build (or load) the native tap at start: its 20-30 s build is the sanitizer's time, not the program's."""
        try:
            if (self._tap_choice or native_tap.choice()) != "python":
                return native_tap.load()  # prints one progress line on stderr when it builds
        except native_tap.TapUnavailable:
            pass  # said once, at activation, if the analysis ever switches on
        except Exception as error:
            self.internal_error("native tap build", error)
        return None

    def _remove_tap(self) -> None:
        tap = self._tap
        if tap is None:
            return
        self._tap = None
        try:
            self._tap_stats = dict(tap.stats())
            tap.disable()
        except Exception as error:
            self.internal_error("native tap removal", error)
        errors = self._tap_stats.get("internal_errors", 0) + self._tap_stats.get("callback_errors", 0)
        if errors:
            first = str(self._tap_stats.get("first_error", "")).splitlines()[:1]
            self.internal_error("native tap", RuntimeError(f"{errors} op(s) not recorded; {' '.join(first)}"))

    def _sync_tap(self) -> None:
        """Every stream's clock learns the launches the tap kept to itself.

        Needed before the engine publishes a stream's clock: an event record,
        a wait on a stream, a host sync, a collective launch (all reach the
        engine through gpu_trace's callbacks or ``collective``). A launch sets
        its own stream's entry, so other engine inputs need nothing.
        """
        tap = self._tap
        if tap is None:
            return
        engine = self._engine
        for key, seq in tap.take_latest():
            engine.advance(self._tap_stream(key), seq)
        records = tap.local_records()
        if records > _TAP_PRUNE_AT:
            reverse = {value: key for key, value in self._tap_keys.items()}
            floor = {reverse[stream]: seq for stream, seq in engine.ordered_floor().items() if stream in reverse}
            # A pass with the floor of the last one drops nothing new unless the
            # records doubled since: a program that never syncs pays one pass
            # per doubling, not one per sync point.
            if floor != self._last_prune_floor or records > 2 * self._records_left_by_prune:
                tap.prune(floor)
                self._last_prune_floor = floor
                self._records_left_by_prune = tap.local_records()

    def _tap_stream(self, key: int) -> Hashable:
        stream = self._tap_keys.get(key)
        if stream is None:
            if self._device_filter != "cuda":
                stream = key  # tests: the fake stream handles themselves
            else:
                device, stream_id = key >> 56, key & ((1 << 56) - 1)
                if stream_id == 0:
                    stream = DEFAULT_STREAM
                else:
                    stream = self._own_stream_object(stream_id=stream_id, device_index=device, device_type=1)
            self._tap_keys[key] = stream
        return stream

    def _on_tap(self, message) -> None:
        """What the tap hands over: launches (a list), or ("record_stream", claimed, stream)."""
        timeline = _timeline.of(self.session)
        began = _perf_counter() if timeline is not None else 0.0
        try:
            if self._engine is None:
                return
            if message.__class__ is list:
                self._tap_launches(message)
                if timeline is not None:
                    timeline.launches(message, lambda launch: (self._tap_stream(launch[0]), launch[2]))
                    timeline.overhead("race", _perf_counter() - began)
                return
            _, claimed, stream = message
            alloc = self._tap_claimed(claimed)
            key = self._tap_stream(stream)
            if not self._collective_internal(key, getattr(_LOCAL, "collective", 0)):
                self._engine.record_stream(alloc.start, key, capture_site())
        except Exception as error:  # never break the user's program
            self.internal_error("native tap", error)

    def _collective_internal(self, stream: Hashable, inside_collective: int) -> bool:
        """Whether a launch belongs to a collective's own implementation, which the check models already.

        The collective wrapper models a collective on a pseudo-stream. The
        native tap also sees what the backend does on its own streams: gloo
        copies CUDA tensors through pool streams, in the call and later on its
        worker thread. A stream first used inside the wrapper that the program
        itself never created, entered, waited on or recorded on is such an
        internal stream; its launches are left out, then and later. (The
        dispatch mode never sees them: it is off inside its own ops and on
        the backend's threads.)
        """
        if stream == DEFAULT_STREAM or stream in self._user_streams:
            return False
        if inside_collective:
            self._internal_streams.add(stream)
            return True
        return stream in self._internal_streams

    def _tap_claimed(self, claimed) -> AllocInfo:
        """A tensor the tap handed over (its base's history and owner); returns its allocation."""
        launches, base, generation = claimed
        self._tap_launches(launches)
        return self._tap_alloc(base, generation)

    def _tap_launches(self, launches) -> None:
        engine = self.engine
        alloc = self._tap_alloc
        inside_collective = getattr(_LOCAL, "collective", 0)
        for stream, seq, op, site, items in launches:
            key = self._tap_stream(stream)
            if self._collective_internal(key, inside_collective):
                continue
            engine.launch(
                key,
                [
                    (start, end, is_write, arg, tensor, alloc(base, generation), None, None)
                    for start, end, is_write, arg, tensor, base, generation in items
                ],
                op,
                (site or NO_USER_FRAME) if site is not None else capture_site(),
                seq=seq,
            )

    def _tap_alloc(self, base: int, generation: tuple) -> AllocInfo:
        """The allocation behind a generation (one owner of the bytes at ``base``) the tap saw."""
        number, site, stream, nbytes = generation
        current = self._tap_gens.get(base)
        # Generations reach the engine in order: the tap hands a base's history
        # over in seq order, and forwards later accesses as they happen.
        if current is not None and current[0] == number:
            return current[1]
        if current is not None:
            self.engine.free(base)  # its previous owner is gone: honour its record_stream pledges
        where = site or NO_USER_FRAME
        info = self.engine.alloc(base, base + nbytes, self._tap_stream(stream), where, "")
        self._tap_gens[base] = (number, info)
        return info

    # -- what happened before activation (prehistory.py) ----------------------

    def _live(self):
        """The caching allocator's live blocks now, or None (recorded as an internal error)."""
        if self._memory_snapshot is None:
            return None  # no CUDA: no allocator to ask, and nothing issued to order
        try:
            return live_blocks(self._memory_snapshot())
        except Exception as error:
            self.internal_error("memory_snapshot", error)
            return None

    def host_synced(self) -> None:
        """A host sync before activation: every block live now is finished from here on."""
        if self._engine is not None or not self._started:
            return  # once active, gpu_trace hands syncs to the engine
        if self._native_ledger is not None:
            return  # the tap's filter saw it, in C++
        live = self._live()
        if live is not None:
            self._ledger.host_sync(live)

    def _unfinished_before_activation(self):
        """The live blocks no host sync ordered, sorted; None when that cannot be known."""
        tap, self._native_ledger = self._native_ledger, None
        if tap is not None:
            syncs, addresses = tap.take_allocations_since_sync()  # tracking stops here
            if not tap.trace_filter_intact():
                # Something (CSAN's enable) replaced gpu_trace since the start: the
                # filter missed syncs, so its record could name finished blocks.
                self.notes.append(
                    "gpu_trace was replaced while the race check waited for a second stream: work "
                    "issued before activation is not checked"
                )
                return None
        live = self._live()
        if live is None:
            return None
        if tap is not None:
            return self._ledger.allocated_since_sync(live, syncs, addresses)
        return self._ledger.unfinished(live)

    def _seed_unfinished(self, unfinished) -> None:
        """The work before activation, as one launch per stream writing every block no host sync ordered."""
        if not unfinished:
            return
        by_stream: Dict[Hashable, list] = {}
        for _device, stream, address, size in unfinished:
            by_stream.setdefault(stream, []).append((address, address + size, True, "(any)", None, None, None, None))
        for stream, items in by_stream.items():
            self.engine.launch(
                stream,
                items,
                "work issued before the race check switched on, after the last host sync"
                if self._ledger.syncs
                else "work issued before the race check switched on",
                (("<before the race check switched on>", 0, "?"),),
            )

    # -- per-op analysis (only once active) ------------------------------------

    def on_op(self, plan: tuple, args, kwargs, out) -> None:
        """One analysed op; ``plan`` is ``_plan(func)`` (plus func, which keeps the cache key alive)."""
        kind, inputs, output_write, name, is_c10d, _ = plan
        if is_c10d and getattr(_LOCAL, "collective", 0):
            return  # issued by our collective wrapper, which models it already
        if kind is RECORD_STREAM:
            self._record_stream(args, kwargs)
            return
        # [site, stream] of this op, taken only once it touches device memory
        # (ops on CPU scalars, such as optimizer step counters, never pay) and
        # shared with the allocations it reveals. A local, not check state:
        # ops run on several threads, the autograd engine's with their own stream.
        op = [None, None]
        items: List[tuple] = []
        add = self._add_item
        for index, arg_name, is_write, is_list, kwarg_only in inputs:
            if not kwarg_only and index < len(args):
                value = args[index]
            elif kwargs:
                value = kwargs.get(arg_name)
            else:
                continue
            if value is None:
                continue
            if is_list:
                # foreach ops: argument labels built once per (argument, position), not per tensor per step
                labels = list_labels(arg_name, len(value))
                position = 0
                for tensor in value:
                    if tensor is not None:
                        add(items, tensor, labels[position], is_write, op)
                    position += 1
            else:
                add(items, value, arg_name, is_write, op)
        if output_write and out is not None:
            if out.__class__ is list or out.__class__ is tuple:
                labels = list_labels("result", len(out))
                position = 0
                for tensor in out:
                    add(items, tensor, labels[position], True, op)
                    position += 1
            else:
                add(items, out, "result", True, op)
        elif name in NO_WRITE_OUTPUT and isinstance(out, _Tensor):
            # Allocated, not written: remember where, for reports.
            self._note_alloc(out, op)
        if items:
            site, stream = op
            stream = stream if stream is not None else self._current_stream()
            self.engine.launch(stream, items, name, site if site is not None else capture_site())
            timeline = _timeline.of(self.session)
            if timeline is not None:
                timeline.launches([(stream, name)])

    def _note_alloc(self, tensor, op: Optional[list] = None) -> None:
        if tensor.is_cuda is not self._want_cuda or tensor.numel() == 0:
            return
        base = tensor.data_ptr() - tensor.storage_offset() * tensor.element_size()
        if base not in self._allocs:
            self._new_alloc(tensor, base, op)

    def _add_item(self, items: list, tensor, arg: str, is_write: bool, op: Optional[list] = None) -> None:
        # The hot path, once per tensor argument: a few C calls, one tuple.
        cls = tensor.__class__
        if cls is not _Tensor and cls is not _Parameter and not isinstance(tensor, _Tensor):
            return
        if tensor.is_cuda is not self._want_cuda:
            return
        nbytes = tensor.nbytes
        if not nbytes:
            return
        pointer = tensor.data_ptr()
        offset = tensor.storage_offset()
        base = pointer - offset * tensor.element_size() if offset else pointer
        if tensor.is_contiguous():
            start, end, stride = pointer, pointer + nbytes, None
        else:
            itemsize = tensor.element_size()
            stride = tensor.stride()
            low = high = 0
            for size, step in zip(tensor.shape, stride):
                if step >= 0:
                    high += (size - 1) * step
                else:
                    low += (size - 1) * step
            start, end = pointer + low * itemsize, pointer + (high + 1) * itemsize
        if self._tap is not None:
            claimed = self._tap.claim(tensor)
            if claimed is None:
                return
            alloc = self._tap_claimed(claimed)
        else:
            alloc = self._allocs.get(base)
            if alloc is None:
                alloc = self._new_alloc(tensor, base, op)
        described = (tensor.shape, tensor.dtype, offset, base, pointer, stride)
        items.append((start, end, is_write, arg, described, alloc, None, None))

    def _new_alloc(self, tensor, base: int, op: Optional[list] = None):
        """First sight of a storage: its allocation is attributed to the current op's [site, stream]."""
        try:
            nbytes = tensor.untyped_storage().nbytes()
        except Exception:
            nbytes = tensor.numel() * tensor.element_size()
        if op is None:
            op = [None, None]
        if op[0] is None:
            op[0] = capture_site()
        if op[1] is None:
            op[1] = self._current_stream()
        alloc = self.engine.alloc(base, base + nbytes, op[1], op[0], "")
        self._allocs[base] = alloc
        return alloc

    def _record_stream(self, args, kwargs) -> None:
        tensor = args[0] if args else kwargs.get("self")
        stream = args[1] if len(args) > 1 else kwargs.get("s")
        if tensor is None or stream is None:
            return
        key = self._stream_key(stream)
        pointer = tensor.data_ptr()
        base = pointer - tensor.storage_offset() * tensor.element_size()
        if base not in self._allocs:
            self._new_alloc(tensor, base)
        self.engine.record_stream(base, key, capture_site())

    def wait_stream(self, waiter, waitee) -> None:
        """``waiter.wait_stream(waitee)``, told to the engine once the tap's launches are in it."""
        engine = self._engine
        if engine is None:
            return
        try:
            self._sync_tap()
            engine.wait_stream(self._stream_key(waiter), self._stream_key(waitee), capture_long_site())
        except Exception as error:  # never break the user's program
            self.internal_error("wait_stream", error)

    def _stream_key(self, stream) -> Hashable:
        raw = getattr(stream, "cuda_stream", None)
        if raw is not None:
            return raw
        try:
            return self._own_stream_object(
                stream_id=stream.stream_id, device_index=stream.device_index, device_type=stream.device_type
            )
        except Exception:
            return ("stream", getattr(stream, "stream_id", id(stream)))

    def _own_stream_object(self, **ids) -> int:
        """The raw handle of an existing stream, through a ``torch.cuda.Stream`` the program did not create."""
        _LOCAL.own_stream = True  # Stream.__new__'s wrapper must not count it as the program's
        try:
            return self._torch.cuda.Stream(**ids).cuda_stream
        finally:
            _LOCAL.own_stream = False

    def triton_launch(self, jit_function, args, kwargs) -> None:
        items: List[tuple] = []
        values = list(args) + [v for k, v in kwargs.items() if k not in ("grid", "warmup")]
        names = getattr(jit_function, "arg_names", None) or []
        for position, value in enumerate(values):
            if isinstance(value, self._torch.Tensor):
                arg = names[position] if position < len(names) else f"arg{position}"
                self._add_item(items, value, arg, False)
                self._add_item(items, value, arg, True)
        if items:
            name = getattr(getattr(jit_function, "fn", None), "__name__", "kernel")
            self.engine.launch(self._current_stream(), items, f"triton:{name}", capture_site())

    @forwards_user_call
    def collective(self, name, tensors_written, tensors_read, group, async_op, call):
        """Run a collective call, modelling it on the group's pseudo-stream (a sync inside ``call`` is the user's)."""
        self.activate("a collective was issued")
        engine = self._engine
        items = []
        for tensor in tensors_read:
            self._add_item(items, tensor, "input", False)
        for tensor in tensors_written:
            self._add_item(items, tensor, "output", True)
        dist = sys.modules.get("torch.distributed")
        if group is None or (dist is not None and group is getattr(getattr(dist, "group", None), "WORLD", None)):
            group_key = "default"
        else:
            group_key = getattr(group, "group_name", None) or f"group@{id(group):#x}"
        self._next_work += 1
        token = self._next_work
        stream = self._current_stream()
        site = capture_long_site()
        self._sync_tap()
        engine.collective_launch(group_key, stream, token, items, name, site)
        _LOCAL.collective = getattr(_LOCAL, "collective", 0) + 1
        tap = self._tap
        if tap is not None:
            tap.enter_collective()
        try:
            work = call()
        finally:
            _LOCAL.collective -= 1
            if tap is not None:
                tap.exit_collective()
        if not async_op or work is None:
            engine.work_wait(token, stream, site)
        else:
            self._works[id(work)] = (token, work)
        return work

    # -- what the hooks tell the check (the rest of RaceSink) ---------------------

    def stream_created(self, stream) -> None:
        self._user_streams.add(getattr(stream, "cuda_stream", None))
        self.activate("a CUDA stream was created")

    def graph_capture_begin(self, graph) -> None:
        self.activate("a CUDA graph capture began")
        self.engine.capture_begin(id(graph), self._current_stream(), capture_long_site())

    def graph_capture_end(self, graph) -> None:
        if self._engine is not None:
            self._engine.capture_end(id(graph))

    def graph_replay(self, graph) -> None:
        if self._engine is not None:
            self._engine.graph_replay(id(graph), self._current_stream(), capture_long_site())

    def work_waited(self, work) -> None:
        if self._engine is None:
            return
        entry = self._works.pop(id(work), None)
        if entry is not None:
            self._engine.work_wait(entry[0], self._current_stream(), capture_long_site())

    def sync_check_running(self) -> bool:
        session = self.session
        return session is not None and session.has_check("sync")

    def note(self, text: str) -> None:
        self.notes.append(text)

    def _engine_synced(self) -> Optional[HappensBefore]:
        """The engine once the tap's launches are in it (gpu_trace's events follow them); None before activation."""
        engine = self._engine
        if engine is not None and self._tap is not None:
            try:
                self._sync_tap()
            except Exception as error:
                self.internal_error("native tap sync", error)
        return engine

    def _to_engine(self, what: str, forward) -> None:
        """Hand one gpu_trace event to the engine; a failure is the check's internal error, never the program's."""
        engine = self._engine_synced()
        if engine is None:
            return
        try:
            forward(engine)
        except Exception as error:
            self.internal_error(what, error)

    def trace_event_record(self, event, stream) -> None:
        self._to_engine("event_record", lambda engine: engine.event_record(event, stream, capture_long_site()))

    def trace_event_wait(self, event, stream) -> None:
        self._to_engine("event_wait", lambda engine: engine.event_wait(event, stream, capture_long_site()))

    def trace_event_sync(self, event) -> None:
        self._to_engine("event_sync", lambda engine: engine.event_sync(event, capture_long_site()))

    def trace_stream_sync(self, stream) -> None:
        self._to_engine("stream_sync", lambda engine: engine.stream_sync(stream, capture_long_site()))

    def trace_device_sync(self) -> None:
        self._to_engine("device_sync", lambda engine: engine.device_sync(capture_long_site()))

    def trace_free(self, pointer) -> None:
        # Fires for every block the caching allocator frees: kept to a few lookups
        # for blocks the check never saw.
        engine = self._engine
        if engine is None:
            return
        try:
            if self._allocs.pop(pointer, None) is not None or engine.has_pledge(pointer):
                engine.free(pointer)
        except Exception as error:
            self.internal_error("free", error)

    def trace_stream_created(self, stream) -> None:
        try:
            self.activate("a CUDA stream was created")
            if self._engine is not None:
                self._engine.stream_created(stream)
        except Exception as error:
            self.internal_error("stream_creation", error)

    def trace_event_deleted(self, event) -> None:
        engine = self._engine_synced()
        if engine is not None:
            engine.forget_event(event)

    # -- naming and reports -----------------------------------------------------

    def name_stream(self, stream) -> None:
        """Remember the user's variable name for a stream (looked up in the user's frame)."""
        key = getattr(stream, "cuda_stream", None)
        if key is not None:
            self._user_streams.add(key)
        # The default stream's name is fixed: scanning the user's frame for it
        # (on every set_stream and wait_stream) found nothing to keep.
        if key is None or key == DEFAULT_STREAM or key in self._stream_names:
            return
        frame = _user_frame()
        if frame is None:
            return
        for variable, value in _scope_items(frame):
            if value is stream or (_is_stream(value) and getattr(value, "cuda_stream", None) == key):
                if key != DEFAULT_STREAM:
                    self._stream_names[key] = variable
                return

    def _on_race(self, race: Race) -> None:
        """First sight of a unique race: take the longer stack and the user's names now."""
        context = {"stack": capture_long_site(), "step": self._step}
        frame = _user_frame()
        timeline = _timeline.of(self.session)
        if timeline is not None:
            timeline.race(
                frame.f_code.co_filename if frame is not None else None,
                frame.f_lineno if frame is not None else None,
                self._step,
            )
        if frame is not None:
            torch = self._torch
            for variable, value in _scope_items(frame):
                if variable.startswith("__"):
                    continue
                if torch is not None and isinstance(value, torch.Tensor):
                    try:
                        if value.is_cuda is self._want_cuda:
                            pointer = value.data_ptr()
                            base = pointer - value.storage_offset() * value.element_size()
                            self._tensor_names.setdefault(base, variable)
                    except Exception:
                        pass
                elif _is_stream(value):
                    key = getattr(value, "cuda_stream", None)
                    if key is not None and key != DEFAULT_STREAM:
                        self._stream_names.setdefault(key, variable)
            del frame
        self._race_context[id(race)] = context

    def internal_error(self, where: str, error: BaseException) -> None:
        self.errors.record(where, error)

    def _finding(self, race: Race) -> Finding:
        context = self._race_context.get(id(race), {})
        return build_finding(race, self._stream_names, self._tensor_names, context)

    @staticmethod
    def _dynamo_frames() -> int:
        module = sys.modules.get("torch._dynamo.utils")
        counters = getattr(module, "counters", None)
        if counters is None:
            return 0
        try:
            return int(counters["frames"]["total"])
        except Exception:
            return 0
