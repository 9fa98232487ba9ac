"""The race check: cross-stream data races in a real PyTorch program.

``RaceCheck`` feeds the happens-before engine (``happens_before.py``) from
torch and turns its races into findings. How it sees the program:

* **Accesses**: every ATen op's CUDA tensor arguments are classified from the
  op's schema: ``Tensor(a!)`` arguments are writes, other tensors reads, fresh
  outputs writes; views (non-writing aliases) and the inputs of
  ``*_like``/``new_*`` factories touch no memory; ``empty*`` allocates without
  writing. Each access is keyed by its byte range (the bounding box of sizes x
  strides from the storage offset), never by ``data_ptr`` alone. The native
  tap (``race_tap.cpp``, a RecordFunction callback) does this in C++ and hands
  the engine only what can race (``_on_tap``); where it cannot be built, a
  ``TorchDispatchMode`` does it in Python (``_on_op``), with the same results.
* **Sites**: each analysed op's user stack is captured with
  ``gather_traceback`` (code pointers, no frame objects) and symbolized only
  if a report reads it; ops that touch no device memory capture nothing.
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
order alone (``race_prehistory.py``): every live block of the caching
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
import threading
import warnings
from typing import Any, Dict, Hashable, List, Optional, Tuple

from . import native_tap
from .findings import RACE, Finding, Frame
from .internal_errors import InternalErrors
from .happens_before import AllocInfo, CollectiveStream, HappensBefore, Race
from .race_prehistory import HostSyncLedger, live_blocks
from .sync import PROTOTYPE_WARNING, SYNC_WARNING

from .frames import raw_user_stack as _raw_user_stack
from .frames import user_frames_of

# The check whose engine the process-global hooks feed (None: hooks do nothing).
_ACTIVE: Optional["RaceCheck"] = None
_TRACE_REGISTERED = False
_TRACE_LOCK = threading.Lock()
# Set while one of our own wrappers (collectives) runs, so the dispatch mode
# does not count the c10d ops it issues a second time.
_LOCAL = threading.local()

DEFAULT_STREAM = 0  # cudaStream_t of the legacy default stream

# Local records the tap may hold before history every stream is ordered after is dropped.
_TAP_PRUNE_AT = 200_000
SITE_FRAMES = 4  # frames kept per access (cheap); races get 8 for the later access
NO_USER_FRAME = (("<no user frame: autograd engine or library thread>", 0, "?"),)

# Ops whose tensor inputs are used for metadata only.
_METADATA_INPUT_PREFIXES = ("new_",)
_METADATA_INPUT_SUFFIXES = ("_like",)
# Ops that allocate without touching memory.
_NO_WRITE_OUTPUT = {"empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided", "empty_permuted"}

_SKIP = "skip"
_Tensor = None  # torch.Tensor, bound at start() (torch is imported lazily)
_Parameter = None  # torch.nn.Parameter: optimizer ops take lists of them
_RECORD_STREAM = "record_stream"
_PLAIN = "plain"


# torch._C._profiler.gather_traceback / symbolize_tracebacks, bound at start()
# where this torch has them.
_gather = None
_symbolize = None


class _Site:
    """The user's stack at one op, captured as code pointers and symbolized on first use.

    Every analysed op needs its site, but only the few that end up in a report
    are ever read: capturing (one C call, no frame objects) is a fraction of
    the cost of walking the stack in Python. Behaves as the tuple of
    ``(file, line, function)`` frames it stands for (``==``, ``hash``,
    indexing, iteration).
    """

    __slots__ = ("_traceback", "_frames")

    def __init__(self, traceback):
        self._traceback = traceback
        self._frames = None

    def frames(self) -> tuple:
        frames = self._frames
        if frames is None:
            try:
                entries = _symbolize([self._traceback])[0]
                user = user_frames_of(((e["filename"], e["line"], e["name"]) for e in entries), SITE_FRAMES)
            except Exception:
                user = None
            frames = self._frames = tuple(user) if user else NO_USER_FRAME
            self._traceback = None  # the code objects it pins are no longer needed
        return frames

    def __iter__(self):
        return iter(self.frames())

    def __len__(self) -> int:
        return len(self.frames())

    def __getitem__(self, index):
        return self.frames()[index]

    def __eq__(self, other) -> bool:
        if isinstance(other, _Site):
            other = other.frames()
        return self.frames() == other

    def __hash__(self) -> int:
        return hash(self.frames())

    def __repr__(self) -> str:
        return f"_Site({self.frames()!r})"


def _site():
    if _gather is not None:
        return _Site(_gather(True, False, False))
    frames, _, _ = _raw_user_stack(limit=SITE_FRAMES, skip=2)
    return tuple(frames) if frames else NO_USER_FRAME


def _long_site() -> tuple:
    frames, _, _ = _raw_user_stack(limit=8, skip=2)
    return tuple(frames) if frames else NO_USER_FRAME


_LABELS: Dict[str, List[str]] = {}


def _list_labels(name: str, count: int) -> List[str]:
    """``["name[0]", "name[1]", ...]`` (at least ``count`` of them), cached."""
    labels = _LABELS.get(name)
    if labels is None or len(labels) < count:
        labels = _LABELS[name] = [f"{name}[{position}]" for position in range(max(count, 16))]
    return labels


def _plan(func) -> tuple:
    """How an op touches memory, from its schema: (kind, inputs, output_writes, name, is_c10d)."""
    schema = func._schema
    name = schema.name.split("::")[-1]
    namespace = schema.name.split("::")[0]
    collective = namespace in ("c10d", "_c10d_functional")
    if name == "record_stream":
        return (_RECORD_STREAM, (), False, name, False)
    metadata_inputs = name.startswith(_METADATA_INPUT_PREFIXES) or name.endswith(_METADATA_INPUT_SUFFIXES)
    inputs = []
    for index, arg in enumerate(schema.arguments):
        type_text = str(arg.type)
        if "Tensor" not in type_text:
            continue
        alias = arg.alias_info
        is_write = bool(alias is not None and alias.is_write)
        if alias is not None and not is_write:
            continue  # a view's base: no memory touched
        if metadata_inputs and not is_write:
            continue
        inputs.append((index, arg.name, is_write, "List" in type_text or "[]" in type_text, arg.kwarg_only))
    output_write = name not in _NO_WRITE_OUTPUT and any(
        "Tensor" in str(ret.type) and ret.alias_info is None for ret in schema.returns
    )
    if not inputs and not output_write:
        return (_SKIP, (), False, name, collective)
    return (_PLAIN, tuple(inputs), output_write, name, collective)


class _TensorInfo:
    """What a report needs about a tensor, captured at access time (the tensor may die)."""

    __slots__ = ("shape", "dtype", "storage_offset", "base", "data_ptr", "stride")

    def __init__(self, shape, dtype, storage_offset, base, data_ptr, stride):
        self.shape = shape
        self.dtype = dtype
        self.storage_offset = storage_offset
        self.base = base
        self.data_ptr = data_ptr
        self.stride = stride

    @classmethod
    def of(cls, value) -> Optional["_TensorInfo"]:
        """Reports take the tuple the hot path stored (shape, dtype, offset, base, data_ptr, stride)."""
        if isinstance(value, cls) or value is None:
            return value
        return cls(*value)

    def to_json(self) -> Dict[str, Any]:
        return {
            "shape": list(self.shape),
            "dtype": str(self.dtype).replace("torch.", ""),
            "stride": list(self.stride) if self.stride is not None else None,
            "storage_offset": self.storage_offset,
            "storage_base": hex(self.base),
            "data_ptr": hex(self.data_ptr),
        }


def _make_dispatch_mode():
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
                    plan = check._plans[id(func)] = _plan(func) + (func,)
                if plan[0] is _SKIP:
                    return out  # views, metadata: most ops of a step end here
                try:
                    check._on_op(plan, args, kwargs, out)
                except Exception as error:  # never break the user's program
                    check._internal_error("dispatch", error)
            return out

    return RaceDispatchMode


class RaceCheck:
    """Cross-stream race detection; the ``race`` check of a sanitizer session."""

    name = "race"

    def __init__(self, session=None):
        self.session = session
        self._engine: Optional[HappensBefore] = None
        self._started = False
        self._patches: List[Tuple[Any, str, Any]] = []
        self._mode = None
        self._mode_thread = None
        self._plans: Dict[Any, tuple] = {}
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
        self._triton_wrapped = False
        self._current_stream = None
        self._dynamo_frames_at_start = 0
        self.notes: List[str] = []
        self._torch = None
        # The native tap (race_tap.cpp) when it sees the ops instead of the dispatch mode.
        self._tap = None
        self._tap_choice: Optional[str] = None  # None: TORCHLINT_RACE_TAP; tests set it
        self._tap_unavailable: Optional[str] = None
        self._tap_keys: Dict[int, Hashable] = {}  # the tap's stream key -> the engine's
        self._tap_gens: Dict[int, Tuple[int, AllocInfo]] = {}  # base -> (generation, its allocation)
        self._tap_stats: Dict[str, Any] = {}  # the tap's counters, kept at stop()
        self._interception: Optional[str] = None  # "native tap" or "dispatch mode", once active
        # Host syncs before activation, with the blocks live at each (race_prehistory.py).
        self._ledger = HostSyncLedger()
        self._memory_snapshot = None  # torch.cuda.memory_snapshot on CUDA; tests give a fake one
        self._previous_sync_mode: Optional[int] = None
        self._showwarning_installed = None
        self._showwarning_previous = None
        self._warning_filters: List[tuple] = []

    # -- protocol -----------------------------------------------------------

    def start(self) -> None:
        global _ACTIVE
        if self._started:
            return
        import torch

        global _Tensor, _Parameter, _gather, _symbolize
        _Tensor = torch.Tensor
        _Parameter = torch.nn.Parameter
        profiler = getattr(torch._C, "_profiler", None)
        if _gather is None and hasattr(profiler, "gather_traceback") and hasattr(profiler, "symbolize_tracebacks"):
            _gather, _symbolize = profiler.gather_traceback, profiler.symbolize_tracebacks
        self._torch = torch
        self._started = True
        _ACTIVE = self
        self._current_stream = self._raw_stream_getter(torch)
        self._dynamo_frames_at_start = self._dynamo_frames()
        self._install_triggers(torch)
        if self._want_cuda and torch.cuda.is_available():
            self._prebuild_tap()
            self._memory_snapshot = torch.cuda.memory_snapshot
            self._watch_implicit_syncs(torch)
            if torch.cuda.is_initialized():
                # Work issued before the check existed is finished when its
                # history begins: one device sync per session, not a guess.
                torch._C._cuda_synchronize()
                self._host_synced("the race check's start")

    def stop(self) -> None:
        global _ACTIVE
        if not self._started:
            return
        self._started = False
        if _ACTIVE is self:
            _ACTIVE = None
        self._remove_mode()
        self._remove_tap()
        self._unwatch_implicit_syncs()
        for owner, attribute, original in reversed(self._patches):
            setattr(owner, attribute, original)
        self._patches = []
        self._triton_wrapped = False
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

    def _activate(self, reason: str) -> None:
        """Switch the per-op analysis on (once per check)."""
        if self._engine is not None or not self._started:
            return
        torch = self._torch
        self._activation_reason = reason
        tap = self._load_tap()
        engine = HappensBefore(ticker=tap.tick if tap is not None else None)
        engine.on_race = self._on_race
        self._engine = engine
        if self._device_filter == "cuda":
            self._register_trace(torch)
        if self._memory_snapshot is not None:
            self._seed_unfinished()
        if not self._triton_wrapped:
            self._install_triton_wrapper()
        if tap is not None:
            self._tap = tap
            self._interception = "native tap"
            tap.enable(self._on_tap, _gather, self._device_filter != "cuda")
            return
        self._interception = "dispatch mode"
        mode_class = _make_dispatch_mode()
        self._mode = mode_class()
        self._mode.__enter__()
        self._mode_thread = threading.get_ident()

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
            self.notes.append(f"native tap unavailable ({error}): ops were seen through the slower Python dispatch mode")
            return None

    def _prebuild_tap(self) -> None:
        """Build (or load) the native tap at start: its 20-30 s build is the sanitizer's time, not the program's."""
        try:
            if (self._tap_choice or native_tap.choice()) != "python":
                native_tap.load()  # prints one progress line on stderr when it builds
        except native_tap.TapUnavailable:
            pass  # said once, at activation, if the analysis ever switches on
        except Exception as error:
            self._internal_error("native tap build", error)

    def _remove_tap(self) -> None:
        tap = self._tap
        if tap is None:
            return
        self._tap = None
        try:
            self._tap_stats = dict(tap.stats())
            tap.disable()
        except Exception as error:
            self._internal_error("native tap removal", error)
        errors = self._tap_stats.get("internal_errors", 0) + self._tap_stats.get("callback_errors", 0)
        if errors:
            first = str(self._tap_stats.get("first_error", "")).splitlines()[:1]
            self._internal_error("native tap", RuntimeError(f"{errors} op(s) not recorded; {' '.join(first)}"))

    def _sync_tap(self) -> None:
        """Every stream's clock learns the launches the tap kept to itself.

        Needed before the engine publishes a stream's clock: an event record,
        a wait on a stream, a host sync, a collective launch (all reach the
        engine through gpu_trace's callbacks or ``_collective``). A launch sets
        its own stream's entry, so other engine inputs need nothing.
        """
        tap = self._tap
        if tap is None:
            return
        engine = self._engine
        for key, seq in tap.take_latest():
            engine.advance(self._tap_stream(key), seq)
        if tap.local_records() > _TAP_PRUNE_AT:
            reverse = {value: key for key, value in self._tap_keys.items()}
            floor = {reverse[stream]: seq for stream, seq in engine.ordered_floor().items() if stream in reverse}
            tap.prune(floor)

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
                    stream = self._torch.cuda.Stream(stream_id=stream_id, device_index=device, device_type=1).cuda_stream
            self._tap_keys[key] = stream
        return stream

    def _on_tap(self, message) -> None:
        """What the tap hands over: launches (a list), or ("record_stream", claimed, stream)."""
        try:
            if self._engine is None:
                return
            if message.__class__ is list:
                self._tap_launches(message)
                return
            _, claimed, stream = message
            alloc = self._tap_claimed(claimed)
            self._engine.record_stream(alloc.start, self._tap_stream(stream), _site())
        except Exception as error:  # never break the user's program
            self._internal_error("native tap", error)

    def _tap_claimed(self, claimed) -> AllocInfo:
        """A tensor the tap handed over (its base's history and owner); returns its allocation."""
        launches, base, generation = claimed
        self._tap_launches(launches)
        return self._tap_alloc(base, generation)

    def _tap_launches(self, launches) -> None:
        engine = self._engine
        alloc = self._tap_alloc
        for stream, seq, op, site, items in launches:
            engine.launch(
                self._tap_stream(stream),
                [(start, end, is_write, arg, tensor, alloc(base, generation), None, None)
                 for start, end, is_write, arg, tensor, base, generation in items],
                op,
                _Site(site) if site is not None and _symbolize is not None else _site(),
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
            self._engine.free(base)  # its previous owner is gone: honour its record_stream pledges
        where = _Site(site) if site is not None and _symbolize is not None else NO_USER_FRAME
        info = self._engine.alloc(base, base + nbytes, self._tap_stream(stream), where, "")
        self._tap_gens[base] = (number, info)
        return info

    # -- what happened before activation (race_prehistory.py) ------------------

    def _live(self):
        """The caching allocator's live blocks now, or None (recorded as an internal error)."""
        try:
            return live_blocks(self._memory_snapshot())
        except Exception as error:
            self._internal_error("memory_snapshot", error)
            return None

    def _host_synced(self, kind: str) -> None:
        """A host sync before activation: every block live now is finished from here on."""
        if self._engine is not None or not self._started:
            return  # once active, gpu_trace hands syncs to the engine
        live = self._live()
        if live is not None:
            self._ledger.host_sync(live, kind, _long_site())

    def _seed_unfinished(self) -> None:
        """The work before activation, as one launch per stream writing every block no host sync ordered."""
        live = self._live()
        if live is None:
            return
        by_stream: Dict[Hashable, list] = {}
        for _device, stream, address, size in self._ledger.unfinished(live):
            by_stream.setdefault(stream, []).append((address, address + size, True, "(any)", None, None, None, None))
        for stream, items in by_stream.items():
            self._engine.launch(
                stream,
                items,
                "work issued before the race check switched on, after the last host sync"
                if self._ledger.syncs else "work issued before the race check switched on",
                (("<before the race check switched on>", 0, "?"),),
            )

    def _remove_mode(self) -> None:
        mode = self._mode
        if mode is None:
            return
        self._mode = None
        mode.enabled = False
        if self._mode_thread != threading.get_ident():
            return  # pushed on another thread's stack: it stays, switched off
        try:
            from torch.utils._python_dispatch import _get_current_dispatch_mode

            if _get_current_dispatch_mode() is mode:
                mode.__exit__(None, None, None)
        except Exception as error:
            self._internal_error("dispatch mode removal", error)

    # -- gpu_trace (once per process) ----------------------------------------

    def _register_trace(self, torch) -> None:
        global _TRACE_REGISTERED
        with _TRACE_LOCK:
            if _TRACE_REGISTERED:
                return
            activate = getattr(torch._C, "_activate_gpu_trace", None)
            try:  # a submodule: not imported by ``import torch``
                import importlib

                trace = importlib.import_module("torch.cuda._gpu_trace")
            except ImportError:
                trace = None
            if activate is None or trace is None:
                self.notes.append("torch has no gpu_trace: syncs issued from C++ are not seen (false alarms possible)")
                _TRACE_REGISTERED = True
                return
            hooks = {
                "register_callback_for_event_record": _trace_event_record,
                "register_callback_for_event_wait": _trace_event_wait,
                "register_callback_for_event_synchronization": _trace_event_sync,
                "register_callback_for_stream_synchronization": _trace_stream_sync,
                "register_callback_for_device_synchronization": _trace_device_sync,
                "register_callback_for_memory_deallocation": _trace_free,
                "register_callback_for_stream_creation": _trace_stream_created,
                "register_callback_for_event_deletion": _trace_event_deleted,
            }
            for register, callback in hooks.items():
                function = getattr(trace, register, None)
                if function is not None:
                    function(callback)
            activate()
            _TRACE_REGISTERED = True

    # -- cheap wrappers installed at start ------------------------------------

    def _patch(self, owner, attribute: str, replacement) -> None:
        original = owner.__dict__[attribute] if isinstance(owner, type) and attribute in owner.__dict__ else getattr(owner, attribute)
        self._patches.append((owner, attribute, original))
        setattr(owner, attribute, replacement)

    def _install_triggers(self, torch) -> None:
        cuda = torch.cuda
        check = self
        Stream = cuda.Stream
        Event = cuda.Event

        original_new = Stream.__dict__["__new__"].__func__

        def stream_new(cls, *args, **kwargs):
            stream = original_new(cls, *args, **kwargs)
            if _ACTIVE is check:
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
            if _ACTIVE is check:
                check._activate("wait_stream between streams")
                check._name_stream(this)
                check._name_stream(other)
                _LOCAL.hint = ("wait_stream", _long_site())
            try:
                return original_wait_stream(this, other)
            finally:
                _LOCAL.hint = None

        self._patch(Stream, "wait_stream", wait_stream)

        original_record = Event.record
        original_wait = Event.wait

        def record(this, stream=None):
            if _ACTIVE is check and stream is not None and getattr(stream, "cuda_stream", 0) != DEFAULT_STREAM:
                check._activate("an event was recorded on a side stream")
                check._name_stream(stream)
            return original_record(this, stream)

        def wait(this, stream=None):
            if _ACTIVE is check and stream is not None and getattr(stream, "cuda_stream", 0) != DEFAULT_STREAM:
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
                check._host_synced("torch.cuda.synchronize()")
            return result

        def stream_synchronize(this):
            result = original_stream_synchronize(this)
            if _ACTIVE is check and check._engine is None:
                check._host_synced("Stream.synchronize()")
            return result

        def event_synchronize(this):
            result = original_event_synchronize(this)
            if _ACTIVE is check and check._engine is None:
                check._host_synced("Event.synchronize()")
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
        import re

        check = self
        previous = warnings.showwarning

        def showwarning(message, category, filename, lineno, file=None, line=None):
            if str(message).startswith(SYNC_WARNING):
                if _ACTIVE is check and check._engine is None:
                    check._host_synced("a synchronizing call (.item(), .cpu(), a blocking copy...)")
                if check._previous_sync_mode is not None and not check._sync_check_running():
                    return None  # the mode is on for this check only: the user did not ask to see these
            return previous(message, category, filename, lineno, file, line)

        self._showwarning_previous = previous
        self._showwarning_installed = showwarning
        warnings.showwarning = showwarning
        before = list(warnings.filters)
        warnings.filterwarnings("always", message=re.escape(SYNC_WARNING))
        self._warning_filters = [entry for entry in warnings.filters if entry not in before]
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
        if self._showwarning_installed is not None:
            if warnings.showwarning is self._showwarning_installed:
                warnings.showwarning = self._showwarning_previous
            self._showwarning_installed = None
        for entry in self._warning_filters:
            try:
                warnings.filters.remove(entry)
            except ValueError:
                pass
        if self._warning_filters:
            warnings._filters_mutated()
            self._warning_filters = []

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
                check._engine.capture_begin(id(this), check._current_stream(), _long_site())
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
                check._engine.graph_replay(id(this), stream, _long_site())
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
                        check._engine.work_wait(entry[0], check._current_stream(), _long_site())
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

    # -- per-op analysis (only once active) ------------------------------------

    def _on_op(self, plan: tuple, args, kwargs, out) -> None:
        """One analysed op; ``plan`` is ``_plan(func)`` (plus func, which keeps the cache key alive)."""
        kind, inputs, output_write, name, is_c10d, _ = plan
        if is_c10d and getattr(_LOCAL, "collective", 0):
            return  # issued by our collective wrapper, which models it already
        if kind is _RECORD_STREAM:
            self._record_stream(args, kwargs)
            return
        # [site, stream] of this op, taken only once it touches device memory
        # (ops on CPU scalars, such as optimizer step counters, never pay) and
        # shared with the allocations it reveals. A local, not check state:
        # ops run on several threads, the autograd engine's with their own stream.
        op = [None, None]
        items = []
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
                labels = _list_labels(arg_name, len(value))
                position = 0
                for tensor in value:
                    if tensor is not None:
                        add(items, tensor, labels[position], is_write, op)
                    position += 1
            else:
                add(items, value, arg_name, is_write, op)
        if output_write and out is not None:
            if out.__class__ is list or out.__class__ is tuple:
                labels = _list_labels("result", len(out))
                position = 0
                for tensor in out:
                    add(items, tensor, labels[position], True, op)
                    position += 1
            else:
                add(items, out, "result", True, op)
        elif name in _NO_WRITE_OUTPUT and isinstance(out, _Tensor):
            # Allocated, not written: remember where, for reports.
            self._note_alloc(out, op)
        if items:
            site, stream = op
            self._engine.launch(
                stream if stream is not None else self._current_stream(), items, name,
                site if site is not None else _site(),
            )

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
        items.append((start, end, is_write, arg, (tensor.shape, tensor.dtype, offset, base, pointer, stride), alloc, None, None))

    def _new_alloc(self, tensor, base: int, op: Optional[list] = None):
        """First sight of a storage: its allocation is attributed to the current op's [site, stream]."""
        try:
            nbytes = tensor.untyped_storage().nbytes()
        except Exception:
            nbytes = tensor.numel() * tensor.element_size()
        if op is None:
            op = [None, None]
        if op[0] is None:
            op[0] = _site()
        if op[1] is None:
            op[1] = self._current_stream()
        alloc = self._engine.alloc(base, base + nbytes, op[1], op[0], "")
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
        self._engine.record_stream(base, key, _site())

    def _stream_key(self, stream) -> Hashable:
        raw = getattr(stream, "cuda_stream", None)
        if raw is not None:
            return raw
        torch = self._torch
        try:
            return torch.cuda.Stream(
                stream_id=stream.stream_id, device_index=stream.device_index, device_type=stream.device_type
            ).cuda_stream
        except Exception:
            return ("stream", getattr(stream, "stream_id", id(stream)))

    def _triton_launch(self, jit_function, args, kwargs) -> None:
        items = []
        values = list(args) + [v for k, v in kwargs.items() if k not in ("grid", "warmup")]
        names = getattr(jit_function, "arg_names", None) or []
        for position, value in enumerate(values):
            if isinstance(value, self._torch.Tensor):
                arg = names[position] if position < len(names) else f"arg{position}"
                self._add_item(items, value, arg, False)
                self._add_item(items, value, arg, True)
        if items:
            name = getattr(getattr(jit_function, "fn", None), "__name__", "kernel")
            self._engine.launch(self._current_stream(), items, f"triton:{name}", _site())

    def _collective(self, name, tensors_written, tensors_read, group, async_op, call):
        """Run a collective call, modelling it on the group's pseudo-stream."""
        self._activate("a collective was issued")
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
        site = _long_site()
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

    # -- naming and reports -----------------------------------------------------

    def _name_stream(self, stream) -> None:
        """Remember the user's variable name for a stream (looked up in the user's frame)."""
        key = getattr(stream, "cuda_stream", None)
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
        context = {"stack": _long_site(), "step": self._step}
        frame = _user_frame()
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

    def _internal_error(self, where: str, error: BaseException) -> None:
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


def _is_stream(value) -> bool:
    module = type(value).__module__
    return "cuda" in module and type(value).__name__ in ("Stream", "ExternalStream")


def _scope_items(frame) -> list:
    """(name, value) pairs of a frame's locals and globals, without keeping the locals alive.

    Reading ``f_locals`` of a function frame (Python < 3.13) caches a dict of
    strong references on the frame until it returns: a ``del x`` in the user's
    code would no longer free x, which would change what the allocator does
    (and hide the very reuse races this check looks for). So the cache is
    emptied right after the copy.
    """
    items = []
    if frame.f_code.co_flags & 0x1:  # CO_OPTIMIZED: a function frame, locals cached on read
        local_dict = frame.f_locals
        items.extend(local_dict.items())
        if sys.version_info < (3, 13):
            local_dict.clear()
    else:
        items.extend(frame.f_locals.items())
    items.extend(frame.f_globals.items())
    return items


def _user_frame():
    """The innermost user frame on the current stack (or None)."""
    try:
        from .frames import is_user_file
    except ImportError:  # pragma: no cover
        return None
    frame = sys._getframe(1)
    while frame is not None:
        if is_user_file(frame.f_code.co_filename):
            return frame
        frame = frame.f_back
    return None


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


def _trace_event_record(event, stream):
    check, engine = _engine_or_none()
    if engine is None:
        return
    try:
        engine.event_record(event, stream, _long_site())
    except Exception as error:
        check._internal_error("event_record", error)


def _trace_event_wait(event, stream):
    check, engine = _engine_or_none()
    if engine is None:
        return
    try:
        hint = getattr(_LOCAL, "hint", None)
        if hint:
            # Name the user's call (wait_stream), not the event it is built on.
            engine.event_wait(event, stream, hint[1], kind=hint[0])
        else:
            engine.event_wait(event, stream, _long_site())
    except Exception as error:
        check._internal_error("event_wait", error)


def _trace_event_sync(event):
    check, engine = _engine_or_none()
    if engine is None:
        return
    try:
        engine.event_sync(event, _long_site())
    except Exception as error:
        check._internal_error("event_sync", error)


def _trace_stream_sync(stream):
    check, engine = _engine_or_none()
    if engine is None:
        return
    try:
        engine.stream_sync(stream, _long_site())
    except Exception as error:
        check._internal_error("stream_sync", error)


def _trace_device_sync():
    check, engine = _engine_or_none()
    if engine is None:
        return
    try:
        engine.device_sync(_long_site())
    except Exception as error:
        check._internal_error("device_sync", error)


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


# -- reports (pure functions: tested on CPU) -----------------------------------


def _frames(site) -> List[Frame]:
    return [Frame(file, line, function) for file, line, function in (site or ())]


def _where(site) -> str:
    if not site:
        return "<unknown>"
    file, line, _ = site[0]
    return f"{file}:{line}" if line else file


def stream_label(key, names: Dict[Hashable, str]) -> str:
    if isinstance(key, CollectiveStream):
        return str(key)
    if key == DEFAULT_STREAM:
        return "the default stream"
    name = names.get(key)
    if name:
        return f"stream `{name}`"
    return f"stream {key:#x}" if isinstance(key, int) else f"stream {key}"


def stream_expr(key, names: Dict[Hashable, str], current: bool = False) -> str:
    """How to write the stream in code at the user's site."""
    if key == DEFAULT_STREAM:
        return "torch.cuda.current_stream()" if current else "torch.cuda.default_stream()"
    name = names.get(key)
    if name:
        return name
    return "side_stream" if isinstance(key, int) else str(key)


def describe_sync(race: Race, names: Dict[Hashable, str]) -> str:
    note = race.last_sync
    if note is None:
        return (
            f"{stream_label(race.later.stream, names)} and {stream_label(race.earlier.stream, names)} "
            "were never synchronized"
        )
    how = {
        "wait_stream": "wait_stream",
        "event": "an event wait",
        "stream_sync": "a stream synchronize (or a syncing call such as .item())",
        "event_sync": "Event.synchronize()",
        "device_sync": "torch.cuda.synchronize()",
        "work_wait": "Work.wait()",
        "collective_launch": "the collective launch",
    }.get(note.kind, note.kind)
    return (
        f"last synchronized by {how} at {_where(note.site)}, which covers "
        f"{stream_label(race.earlier.stream, names)} up to seq {note.covered_seq}; the first access is seq "
        f"{race.earlier.seq}, issued after it"
    )


def fix_hint(race: Race, names: Dict[Hashable, str], tensor_names: Dict[int, str]) -> str:
    earlier, later = race.earlier, race.later
    first, second = _where(earlier.site), _where(later.site)
    waiter = stream_expr(later.stream, names, current=True)
    waitee = stream_expr(earlier.stream, names)
    via = earlier.via or ()
    if via and via[0] == "collective":
        return (
            f"call `work.wait()` on the handle returned by {earlier.op} at {first} before {later.op} at {second} "
            f"(or pass async_op=False)"
        )
    if race.kind == "reuse":
        previous = earlier.alloc
        owner = tensor_names.get(getattr(previous, "start", -1), "the previous tensor")
        return (
            f"the memory was freed while {stream_label(earlier.stream, names)} could still use it: call "
            f"`{owner}.record_stream({waitee})` after its last use there ({first}), or make the allocating stream "
            f"wait for it (`torch.cuda.current_stream().wait_stream({waitee})`) before the tensor is freed"
        )
    if race.early_event is not None:
        return (
            f"the event waited on at {_where(race.early_event.site)} was recorded at "
            f"{_where(race.early_event.record_site)}, before {earlier.op} at {first}: record it after that "
            f"access (`event.record({waitee})` below {first}) and keep `event.wait({waiter})`"
        )
    if via and via[0] == "graph replay":
        return (
            f"after `graph.replay()` at {_where(via[1])} on {stream_label(earlier.stream, names)}, call "
            f"`{waiter}.wait_stream({waitee})` before {later.op} at {second}"
        )
    return (
        f"before {later.op} at {second}, make {stream_label(later.stream, names)} wait for "
        f"{stream_label(earlier.stream, names)}: `{waiter}.wait_stream({waitee})`, or record an event on "
        f"{waitee} after {earlier.op} at {first} and call `event.wait({waiter})`"
        + (
            f"; if the tensor is freed while {waitee} may still use it, also call `tensor.record_stream({waitee})`"
            if earlier.stream != DEFAULT_STREAM and later.stream == DEFAULT_STREAM and earlier.is_write is False
            else ""
        )
    )


def _access_json(record, names, stack) -> Dict[str, Any]:
    site = stack or record.site
    frames = _frames(site)
    data = {
        "op": record.op,
        "argument": record.arg,
        "mode": record.mode,
        "stream": stream_label(record.stream, names),
        "seq": record.seq,
        "bytes": [hex(record.start), hex(record.end)],
        "file": frames[0].file if frames else None,
        "line": frames[0].line if frames else None,
        "stack": [f.to_json() for f in frames],
    }
    if record.via:
        data["via"] = record.via[0]
        if record.via[0] == "graph replay":
            data["replay_site"] = _where(record.via[1])
    return data


def build_finding(race: Race, names, tensor_names, context) -> Finding:
    earlier, later = race.earlier, race.later
    later_stack = context.get("stack") or later.site
    frames = _frames(later_stack)
    tensor = _TensorInfo.of(later.tensor) or _TensorInfo.of(earlier.tensor)
    tensor_json = tensor.to_json() if isinstance(tensor, _TensorInfo) else None
    tensor_name = None
    if isinstance(tensor, _TensorInfo):
        tensor_name = tensor_names.get(tensor.base)
        if tensor_json is not None:
            tensor_json["name"] = tensor_name
            tensor_json["byte_ranges"] = {
                "first": [earlier.start - tensor.base, earlier.end - tensor.base],
                "second": [later.start - tensor.base, later.end - tensor.base],
                "overlap": [race.overlap[0] - tensor.base, race.overlap[1] - tensor.base],
            }
    described = ""
    if isinstance(tensor, _TensorInfo):
        described = f" on {('`' + tensor_name + '` ') if tensor_name else ''}{tuple(tensor.shape)} {str(tensor.dtype).replace('torch.', '')}"
    reuse = race.kind == "reuse"
    message = (
        f"{'allocator-reuse race' if reuse else 'cross-stream race'}{described}: "
        f"{earlier.mode} by {earlier.op} on {stream_label(earlier.stream, names)} ({_where(earlier.site)}) and "
        f"{later.mode} by {later.op} on {stream_label(later.stream, names)} ({_where(later_stack)}) are not ordered; "
        f"{describe_sync(race, names)}"
    )
    details: Dict[str, Any] = {
        "cause": race.kind,
        "tensor": tensor_json,
        "first": _access_json(earlier, names, None),
        "second": _access_json(later, names, later_stack),
        "last_sync": describe_sync(race, names),
        "never_synchronized": race.last_sync is None,
        "step": context.get("step"),
    }
    alloc = later.alloc
    if alloc is not None:
        details["allocation"] = {"file": _where(alloc.site), "stack": [f.to_json() for f in _frames(alloc.site)]}
    if reuse and earlier.alloc is not None:
        details["previous_owner"] = {
            "file": _where(earlier.alloc.site),
            "stack": [f.to_json() for f in _frames(earlier.alloc.site)],
            "bytes": [hex(earlier.alloc.start), hex(earlier.alloc.end)],
        }
    if race.early_event is not None:
        details["early_event"] = {
            "recorded_at": _where(race.early_event.record_site),
            "waited_at": _where(race.early_event.site),
        }
    first = frames[0] if frames else None
    return Finding(
        kind=RACE,
        severity="error",
        message=message,
        file=first.file if first else None,
        line=first.line if first else None,
        function=first.function if first else None,
        stack=frames,
        count=race.count,
        rule=None,
        fix_hint=fix_hint(race, names, tensor_names),
        details=details,
    )
