"""The sync check: every host-device synchronization, traced to the user's line.

How syncs are caught:

1. **torch's sync debug mode in warn mode** plus a ``warnings.showwarning``
   hook, installed at every ``start()`` (pytest's per-test
   ``catch_warnings`` bypasses hooks installed earlier), with an ``"always"``
   filter for the exact text so that Python's once-per-location filter does
   not collapse sites and ``-W error`` does not turn a sync into an exception.
   This catches ``.item()``, ``.tolist()``, ``.cpu()``, ``bool(t)``, printing,
   ``nonzero``, mask indexing, ``unique`` and blocking copies.
2. **Wrappers on the blind spots**: ``torch.cuda.synchronize``,
   ``Event.synchronize``, ``Stream.synchronize``, ``torch.cuda.empty_cache``
   and ``non_blocking=True`` copies from pageable host memory (``Tensor.to``,
   ``Tensor.cuda``, ``Tensor.copy_``), which the debug mode never reports.
3. **Timed wrappers on the common entry points** (``Tensor.item``, ``tolist``,
   ``cpu``, ``numpy``, ``__bool__``, ``__float__``, ``__int__``,
   ``__format__``, ``__repr__``, ``nonzero``, ``unique``, ``to``, ``cuda``,
   ``copy_``): they name the kind exactly and time the call. A sync warning
   raised while one of them runs joins that call, so ``print(t)`` (38 syncs
   inside torch's formatter) counts once, at the user's ``print`` line.

Calls that always sync (``.item()``, ``bool(t)``, ``float(t)``, ``int(t)``
on a plain CUDA tensor, and the explicit waits of point 2) are recorded by
their wrapper without the warning: the wrapper turns the debug mode off for
the call (``_quiet_begin``/``_quiet_end``). The warning's way through
torch's warning handler, Python's ``warnings`` machinery and the hook cost
the training thread ~80 µs of wall time in place (an H100 host, the
transformer step's one GradScaler ``.item()``), against ~1 µs for the two
mode switches. The mode is global, so a sync another thread makes while
such a call waits goes unseen; the same thread's syncs outside those calls
are still seen. While another hook listens for the warning (the race check
before it activates, where the native tap's sync ledger is missing; a
nested session), the mode stays on and the warning reaches it. A tensor subclass (a FakeTensor under ``torch.compile``'s
tracing, a DTensor) takes the warning path: only a plain tensor's
``.item()`` is known to sync.

Every wrapper is removed and every global restored by ``stop()``.

Stall time
----------
The stall of a site is the host time of the synchronizing call, measured
with ``perf_counter`` around the wrapped entry point, for every call of a
wrapped entry point (a call that did not sync is not counted). Syncs reached
through entry points that are not wrapped all the time (``x[mask]``,
``x[mask] = y``, ``torch.where(cond)``, ``masked_select``) are classified
from the user's source line; their first occurrence arms timed wrappers on
those entry points for a *sampled window* of ``TIMING_WINDOW_STEPS`` steps
(or ``TIMING_WINDOW_EVENTS`` events in a program without steps), after which
they are removed again, so a hot indexing path pays only inside the window.
A site that was never timed reports ``stall_ms: null``.

Runs
----
A *run* of a site is one execution of the user's line that synced: every
sync inside one call the line makes (``torch.save(model.state_dict())``
copies each tensor; ``torch.testing.assert_close`` reads several flags) is
one run, and the line running again in a loop is the next run
(``frames.sync_site_stack`` names the call). A step boundary ends a run: a
library call that runs the training loop itself (``trainer.fit()``) makes one
run per step. Which sites are findings, and how, is ``verdicts.py``'s
business: this module records, per site, the steps, the stalls and the runs,
and hands them over frozen (``SiteRecord``).

Idle on arrival
---------------
A read of a CUDA tensor (a timed tensor method, or a host-to-device copy)
first asks the current stream whether it is idle (``cudaStreamQuery``
through a cached ``torch.cuda.Stream``; explicit waits such as
``synchronize()`` are not asked). A site whose reads found the GPU already
idle waited for nothing: an earlier read or an explicit synchronize had
drained the queue, and ``verdicts.py`` says so instead of reporting a stall.
Measured on an H200 (torch 2.11): 1 µs a query in a loop, 5-24 µs right
after a kernel launch, against 10 µs for an idle ``.item()``; so each calling
line is asked on its first ``QUERY_FIRST`` reads and then one read in
``QUERY_EVERY`` (per line, so two reads in a step do not alias).

Copy sources
------------
A host-to-device copy's source decides the fix: a slice of a host tensor at
least ``SLICE_RATIO`` times larger than the copy (``ids[:, i:i+n].to(dev)``)
is a long-lived host tensor moved piece by piece (``host-slice``: move it
once), a line that builds the tensor from numpy is ``host-built`` (create it
on the device), anything else a plain ``copy`` whose pinnedness picks TL201
or TL202.

Allowlist
---------
Syncs inside ``allow_sync()`` are dropped. A ``# noqa`` on the reported line
silences the site, read by the linter's own parser (``torchlint.noqa``): bare
``# noqa`` (or ``# noqa`` without a colon) silences everything,
``# noqa: TL101`` silences the sites whose rule is TL101.

torch.compile: the wrappers are plain Python functions, so Dynamo graph-breaks
on them like it already does on ``.item()``; a compiled region is checked
at its graph boundaries only.
"""

from __future__ import annotations

import linecache
import sys
import threading
import time
import warnings
from typing import Any, Callable, Dict, List, Optional, Tuple

from torchlint.noqa import line_suppresses

from .. import frames as _frames
from .. import timeline as _timeline
from ..findings import Finding
from ..patching import PROTOTYPE_WARNING, SYNC_WARNING, WarningHook
from ..patching import Patch as _Patch
from ..session import Check, SessionView
from ..session import sync_allowed as _sync_allowed
from .kinds import (
    CLOCK_LOOKAHEAD,
    EXPLICIT_SYNC_KINDS,
    builds_on_host,
    chooses_on_host,
    classify,
    reads_clock,
    rule_for,
)
from .verdicts import DEFAULT_MIN_COUNT, SiteRecord, sync_findings

SYNC_DEBUG_OFF, SYNC_DEBUG_WARN = 0, 1  # torch.cuda.set_sync_debug_mode's "default" and "warn"

# The steps (or, without steps, the events) a lazily armed timing window lasts.
TIMING_WINDOW_STEPS = 2
TIMING_WINDOW_EVENTS = 64

# The stream query's sample per calling line (module docstring, "Idle on arrival").
QUERY_FIRST = 16
QUERY_EVERY = 16

# A copied view whose host storage is this many times larger is a slice of a long-lived host tensor.
SLICE_RATIO = 4


class _Site:
    __slots__ = (
        "key",
        "kind",
        "api",
        "stack",
        "library",
        "steps",
        "stall",
        "timed",
        "silenced",
        "silenced_count",
        "tensor",
        "in_test",
        "runs",
        "callee",
        "run_steps",
        "no_grad_runs",
        "compiler",
        "pinned",
        "host_choice",
        "queried",
        "idle_arrivals",
        "after_sync",
    )

    def __init__(
        self,
        key: Tuple[str, int, str],
        kind: str,
        api: Optional[str],
        stack: List[Tuple[str, int, str]],
        library: Optional[Tuple[str, int, str]],
        silenced: bool,
        in_test: bool,
        compiler: bool = False,
    ) -> None:
        self.key = key
        self.kind = kind
        self.api = api
        self.stack = stack
        self.library = library
        self.steps: Dict[int, int] = {}
        self.stall: Dict[int, float] = {}
        self.timed: Dict[int, int] = {}
        self.silenced = silenced
        self.silenced_count = 0
        self.tensor: Optional[Dict[str, Any]] = None
        self.in_test = in_test
        self.runs = 0  # executions of the line that synced, warm-up included
        self.run_steps: Dict[int, int] = {}  # step -> runs that began in it
        self.no_grad_runs = 0  # runs made with autograd off (evaluation, inference)
        self.compiler = compiler  # torch.compile's own work (Dynamo, Inductor, Triton autotuning) made it
        self.pinned: set = set()  # a host-to-device copy's source as seen: True pinned, False pageable
        self.host_choice = False  # the line reads back a value it chose on the device
        self.queried: Dict[int, int] = {}  # step -> reads preceded by a stream query
        self.idle_arrivals: Dict[int, int] = {}  # step -> of those, reads that found the GPU idle
        # step -> runs that came after an explicit synchronize earlier in the same step
        self.after_sync: Dict[int, int] = {}
        self.callee: Any = None  # the frame of the call the latest run made (see frames.sync_site_stack)

    @property
    def rule(self) -> Optional[str]:
        return rule_for(self.kind, self.pinned)


class _ThreadState(threading.local):
    depth = 0
    hits = 0


def _pinned_host(source: Any) -> Optional[bool]:
    """Whether a copy's host source is pinned; None when it is not a host tensor or cannot be told.

    Asked only for a copy that already synced (the recording path), so the
    driver query behind ``is_pinned()`` costs nothing on the hot path.
    """
    try:
        if source.device.type != "cpu":
            return None
        return bool(source.is_pinned())
    except Exception:
        return None


def _dressed(wrapper: Callable[..., Any], original: Callable[..., Any], api: str) -> Callable[..., Any]:
    """The wrapper dressed as its original: ``__wrapped__`` (``Patch`` and ``inspect`` follow it), name, doc."""
    wrapper.__dict__["__wrapped__"] = original
    wrapper.__name__ = getattr(original, "__name__", api)
    wrapper.__doc__ = getattr(original, "__doc__", None)
    return wrapper


def _host_slice(source: Any) -> bool:
    """A host tensor that is a view into storage at least ``SLICE_RATIO`` times the bytes it copies."""
    try:
        if source.device.type != "cpu" or source._base is None:
            return False
        copied = source.numel() * source.element_size()
        return bool(source.untyped_storage().nbytes() >= SLICE_RATIO * max(copied, 1))
    except Exception:
        return False


def _targets_cuda(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> bool:
    """Whether ``Tensor.to``'s or ``Tensor.type``'s arguments name a CUDA device, tensor or tensor type."""
    for value in (*args, kwargs.get("device"), kwargs.get("dtype")):
        if value is None or isinstance(value, bool):
            continue
        if isinstance(value, str):
            if value.startswith(("cuda", "torch.cuda.")):
                return True
        elif getattr(value, "type", None) == "cuda" or getattr(value, "is_cuda", False) is True:
            return True
        elif getattr(value, "__module__", "") == "torch.cuda":  # a legacy type: torch.cuda.FloatTensor
            return True
    return False


def _describe_tensor(value: Any) -> Optional[Dict[str, Any]]:
    try:
        return {
            "shape": list(value.shape),
            "dtype": str(value.dtype).replace("torch.", ""),
            "device": str(value.device),
        }
    except Exception:
        return None


class SyncCheck(Check):
    """Host-device synchronizations per user site, with counts, steps and stall time."""

    name = "sync"
    stack_limit = 8

    def __init__(self, session: SessionView) -> None:
        self.session = session
        self._sites: Dict[Tuple[str, int, str], _Site] = {}
        self._lock = threading.Lock()
        self._tls = _ThreadState()
        self._patches: List[_Patch] = []
        self._window_patches: Dict[str, List[_Patch]] = {}
        self._window_ends: Dict[str, int] = {}
        self._window_events: Dict[str, int] = {}
        self._windows_used: set = set()
        self._line_cache: Dict[Tuple[str, int], str] = {}
        # the step of the latest explicit synchronize: reads after it in the same step may be free
        self._explicit_sync_step: Optional[int] = None
        self._classify_cache: Dict[Tuple[str, int, Optional[str]], str] = {}
        self._warning_hook: Optional[WarningHook] = None
        self._previous_mode: Optional[int] = None
        # The debug mode off for calls known to sync (module docstring): how many are in flight, and the setter.
        self._quiet_lock = threading.Lock()
        self._quiet_calls = 0
        self._quieted = False  # the mode is off now, for the calls in flight
        self._set_debug_mode: Optional[Callable[[int], None]] = None
        self._plain_tensor_types: Tuple[type, ...] = ()
        self._grad_enabled: Callable[[], bool] = lambda: True  # torch.is_grad_enabled once started
        # Whether the current stream of a device is idle (module docstring); None without CUDA.
        self._query_stream: Optional[Callable[[Optional[int]], bool]] = None
        self._refined: Dict[Tuple[str, int, str], str] = {}
        self._query_counts: Dict[Tuple[Any, int], int] = {}  # (code, line) of a caller -> reads seen
        self._torch: Any = None
        self.allowed_count = 0
        self.internal_count = 0
        self.started = False

    # -- lifecycle ------------------------------------------------------------
    def start(self) -> None:
        import torch

        self._torch = torch
        self._plain_tensor_types = (torch.Tensor, torch.nn.Parameter)
        self._grad_enabled = torch.is_grad_enabled
        self._install_warning_hook()
        try:
            self._install_wrappers(torch)
            if torch.cuda.is_available():
                self._previous_mode = torch.cuda.get_sync_debug_mode()
                with warnings.catch_warnings():
                    warnings.filterwarnings("ignore", message=PROTOTYPE_WARNING)
                    torch.cuda.set_sync_debug_mode("warn")
                self._set_debug_mode = getattr(torch._C, "_cuda_set_sync_debug_mode", None)
                self._query_stream = _stream_query(torch)
        except BaseException:
            self.stop()
            raise
        self.started = True

    def stop(self) -> None:
        torch = self._torch
        self._query_stream = None
        with self._quiet_lock:  # a quiet call ending on another thread must not turn warn mode back on
            self._set_debug_mode = None
            if torch is not None and self._previous_mode is not None:
                with warnings.catch_warnings():
                    warnings.filterwarnings("ignore", message=PROTOTYPE_WARNING)
                    torch.cuda.set_sync_debug_mode(self._previous_mode)
                self._previous_mode = None
        for name in list(self._window_patches):
            self._disarm_window(name)
        for patch in reversed(self._patches):
            patch.restore()
        self._patches = []
        self._remove_warning_hook()
        with self._lock:
            for site in self._sites.values():
                site.callee = None  # a held frame keeps its locals (tensors) alive
        self.started = False

    def on_step(self, step: int) -> None:
        for name, end in list(self._window_ends.items()):
            if step >= end:
                self._disarm_window(name)
        # A step boundary ends every run, so the held callees go now. Held on,
        # a callee that returns takes its callers' frames with it: for
        # GradScaler.step that is the user's train() with its loss and the
        # whole autograd graph, freed a step later with cold caches (measured
        # on an H100 host: ~250 µs a step). The optimizer-step hook fires
        # inside GradScaler.step, before that frame returns.
        with self._lock:
            for site in self._sites.values():
                site.callee = None

    # -- the warning hook -----------------------------------------------------
    def _install_warning_hook(self) -> None:
        self._warning_hook = WarningHook(SYNC_WARNING, self._on_sync_warning)
        self._warning_hook.install()

    def _remove_warning_hook(self) -> None:
        if self._warning_hook is not None:
            self._warning_hook.remove()
            self._warning_hook = None

    def _on_sync_warning(self) -> bool:
        """Record the sync; True: the warning is swallowed (``WarningHook``)."""
        tls = self._tls
        if tls.depth:
            tls.hits += 1  # the running wrapper records it, with its kind and time
            return True
        # Start above this method and the hook, at warnings.py, then torch, then the user.
        self._record(None, None, None, None, skip=2)
        return True

    # -- wrappers -----------------------------------------------------------
    def _timed(
        self,
        kind: str,
        api: str,
        explicit: bool = False,
        result_kind: Optional[Callable] = None,
        bare: bool = False,
        syncs_on_device: bool = False,
    ):
        """A wrapper factory: time the call; record it when it synced (or always when ``explicit``).

        ``bare``: the wrapper replaces a ``torch.Tensor`` method that takes no
        argument besides the tensor; a CPU tensor's call then leaves after one
        attribute read, with nothing to pack. That path is the hot one: AdamW
        reads its CPU step counters with ``.item()`` twice per parameter per step.
        ``syncs_on_device``: the method always syncs on a plain CUDA tensor,
        so that call, like an ``explicit`` one, is recorded without the
        debug mode's warning (the module docstring says why).
        """
        check = self
        tls = self._tls
        perf_counter = time.perf_counter

        def make(original: Callable) -> Callable:
            def timed(args, kwargs, known_sync):
                idle = check._stream_idle(args[0], depth=2) if not explicit and args else None
                if known_sync:
                    check._quiet_begin()
                tls.depth = 1
                tls.hits = 0
                start = perf_counter()
                try:
                    result = original(*args, **kwargs)
                finally:
                    elapsed = perf_counter() - start
                    tls.depth = 0
                    if known_sync:
                        check._quiet_end()
                if known_sync or tls.hits:
                    name = kind if result_kind is None else result_kind(args, result)
                    check._record(name, api, elapsed, args[0] if args else None, skip=2, idle=idle)
                return result

            def bare_wrapper(self: Any) -> Any:  # no *args/**kwargs to pack on the hot path
                try:
                    on_cpu = self.is_cuda is False
                except AttributeError:  # not a tensor: torch's own error follows
                    on_cpu = False
                if on_cpu or tls.depth:
                    return original(self)
                return timed((self,), {}, syncs_on_device and type(self) in check._plain_tensor_types)

            def wrapper(*args: Any, **kwargs: Any) -> Any:
                # A read-back of a CPU tensor never syncs; asked first, so
                # that call never reaches the thread-local.
                if (not explicit and args and getattr(args[0], "is_cuda", True) is False) or tls.depth:
                    return original(*args, **kwargs)
                return timed(args, kwargs, explicit)

            return _dressed(bare_wrapper if bare else wrapper, original, api)

        return make

    def _quiet_begin(self) -> None:
        """A call known to sync starts: the debug mode goes off while any such call runs,
        unless a hook besides this check's own still needs the warning."""
        with self._quiet_lock:
            self._quiet_calls += 1
            if self._quiet_calls == 1 and self._set_debug_mode is not None and WarningHook.listening(SYNC_WARNING) == 1:
                self._set_debug_mode(SYNC_DEBUG_OFF)
                self._quieted = True

    def _quiet_end(self) -> None:
        with self._quiet_lock:
            self._quiet_calls -= 1
            if self._quiet_calls == 0 and self._quieted:
                self._quieted = False
                if self._set_debug_mode is not None:
                    self._set_debug_mode(SYNC_DEBUG_WARN)

    def _copy_wrapper(self, api: str, destination_first: bool):
        """``to`` / ``cuda`` / ``copy_``: a blocking copy syncs through the warning;
        a ``non_blocking=True`` copy from pageable memory blocks silently."""
        check = self
        tls = self._tls
        perf_counter = time.perf_counter

        def make(original: Callable) -> Callable:
            def wrapper(self_tensor, *args, **kwargs):
                if tls.depth:
                    return original(self_tensor, *args, **kwargs)
                idle = (
                    check._copy_idle(api, self_tensor, args, kwargs, destination_first)
                    if check._query_stream is not None
                    else None
                )
                non_blocking = kwargs.get("non_blocking") is True or (bool(args) and any(arg is True for arg in args))
                if non_blocking:
                    # From device memory, a non_blocking copy never waits for the host: let it through
                    # untimed (GradScaler.update makes one a step).
                    source = self_tensor if not destination_first else (args[0] if args else kwargs.get("src"))
                    if getattr(source, "is_cuda", False) is True:
                        return original(self_tensor, *args, **kwargs)
                tls.depth = 1
                tls.hits = 0
                start = perf_counter()
                try:
                    result = original(self_tensor, *args, **kwargs)
                finally:
                    elapsed = perf_counter() - start
                    tls.depth = 0
                if tls.hits:
                    on_cpu = getattr(result, "device", None) is not None and result.device.type == "cpu"
                    if destination_first:  # copy_: the destination is self
                        on_cpu = self_tensor.device.type == "cpu"
                    if on_cpu:
                        check._record("cpu", api, elapsed, self_tensor, skip=1, idle=idle)
                    else:
                        source = args[0] if destination_first and args else self_tensor
                        kind = "host-slice" if _host_slice(source) else "copy"
                        check._record(kind, api, elapsed, self_tensor, skip=1, pinned=_pinned_host(source), idle=idle)
                elif non_blocking:
                    source = args[0] if destination_first and args else self_tensor
                    destination = self_tensor if destination_first else result
                    if check._is_pageable_h2d(source, destination):
                        kind = "host-slice" if _host_slice(source) else "pageable-copy"
                        check._record(kind, api, elapsed, source, skip=1, pinned=False, idle=idle)
                return result

            return _dressed(wrapper, original, api)

        return make

    def _sampled(self, depth: int) -> bool:
        """Whether this read is one its calling line (``depth`` frames up from the caller) asks the stream."""
        frame = sys._getframe(depth + 1)
        key = (frame.f_code, frame.f_lineno)
        seen = self._query_counts.get(key, 0)
        self._query_counts[key] = seen + 1
        return seen < QUERY_FIRST or seen % QUERY_EVERY == 0

    def _ask(self, device_index: Optional[int], depth: int) -> Optional[bool]:
        query = self._query_stream
        if query is None or not self._sampled(depth + 1):
            return None
        try:
            return query(device_index)
        except Exception:  # a sticky CUDA error surfaces in the user's own call, not here
            return None

    def _stream_idle(self, tensor: Any, depth: int) -> Optional[bool]:
        """Whether the stream a read of this CUDA tensor waits on is idle now; None when not asked."""
        if self._query_stream is None or getattr(tensor, "is_cuda", False) is not True:
            return None
        return self._ask(tensor.device.index, depth + 1)

    def _copy_idle(
        self, api: str, self_tensor: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any], destination_first: bool
    ) -> Optional[bool]:
        """For a host-to-device copy about to run: whether the current stream is idle; None otherwise."""
        if destination_first:  # copy_(src): into a CUDA tensor from a host one
            source = args[0] if args else kwargs.get("src")
            if getattr(source, "is_cuda", True) is not False:
                return None
            return self._stream_idle(self_tensor, depth=2)
        if getattr(self_tensor, "is_cuda", True) is not False:
            return None
        if api != "Tensor.cuda" and not _targets_cuda(args, kwargs):
            return None
        return self._ask(None, depth=2)

    @staticmethod
    def _is_pageable_h2d(source: Any, destination: Any) -> bool:
        """A non_blocking copy that blocks anyway: host to device from memory that is not pinned."""
        try:
            return source.device.type == "cpu" and destination.device.type == "cuda" and not source.is_pinned()
        except Exception:
            return False

    def _install_wrappers(self, torch: Any) -> None:
        tensor = torch.Tensor
        cuda = torch.cuda

        def cpu_or_numpy(args, result):
            return "cpu"

        plan = [
            (tensor, "item", self._timed("item", "Tensor.item", bare=True, syncs_on_device=True)),
            # An empty tensor's tolist() copies nothing and does not sync: the warning decides.
            (tensor, "tolist", self._timed("tolist", "Tensor.tolist", bare=True)),
            (tensor, "cpu", self._timed("cpu", "Tensor.cpu", result_kind=cpu_or_numpy)),
            (tensor, "numpy", self._timed("numpy", "Tensor.numpy")),
            (tensor, "__bool__", self._timed("bool", "Tensor.__bool__", bare=True, syncs_on_device=True)),
            (tensor, "__float__", self._timed("item", "Tensor.__float__", bare=True, syncs_on_device=True)),
            (tensor, "__int__", self._timed("item", "Tensor.__int__", bare=True, syncs_on_device=True)),
            (tensor, "__format__", self._timed("format", "Tensor.__format__")),
            (tensor, "__repr__", self._timed("format", "Tensor.__repr__")),
            (tensor, "nonzero", self._timed("nonzero", "Tensor.nonzero")),
            (tensor, "unique", self._timed("unique", "Tensor.unique")),
            (torch, "nonzero", self._timed("nonzero", "torch.nonzero")),
            (torch, "unique", self._timed("unique", "torch.unique")),
            (tensor, "to", self._copy_wrapper("Tensor.to", destination_first=False)),
            (tensor, "cuda", self._copy_wrapper("Tensor.cuda", destination_first=False)),
            (tensor, "copy_", self._copy_wrapper("Tensor.copy_", destination_first=True)),
            # imgs.type(torch.cuda.FloatTensor): a copy too (the GAN scripts' idiom).
            (tensor, "type", self._copy_wrapper("Tensor.type", destination_first=False)),
            (cuda, "synchronize", self._timed("synchronize", "torch.cuda.synchronize", explicit=True)),
            (cuda, "empty_cache", self._timed("empty-cache", "torch.cuda.empty_cache", explicit=True)),
        ]
        if hasattr(cuda, "Event"):
            plan.append((cuda.Event, "synchronize", self._timed("event-sync", "Event.synchronize", explicit=True)))
        if hasattr(cuda, "Stream"):
            plan.append((cuda.Stream, "synchronize", self._timed("synchronize", "Stream.synchronize", explicit=True)))
        # Every lookup first, then every write: on CPython 3.13+ a class gets at
        # most ~1,000 type-version tags, and a lookup between two writes to
        # torch.Tensor spends one. Interleaved, a session spent ~30 and
        # `pytest --gpu-sanitize` (a session per test) ran torch.Tensor out of
        # them after ~36 tests, slowing every attribute load on tensors after.
        patches = [_Patch(owner, name, make) for owner, name, make in plan if hasattr(owner, name)]
        for patch in patches:
            patch.apply()
            self._patches.append(patch)

    # -- sampled timing windows for the unwrapped entry points -----------------
    def _window_plan(self, kind: str):
        torch = self._torch
        if torch is None:
            return []
        if kind == "mask-index":
            return [
                (torch.Tensor, "__getitem__", "Tensor.__getitem__"),
                (torch.Tensor, "__setitem__", "Tensor.__setitem__"),
            ]
        if kind == "nonzero":
            return [
                (torch, "where", "torch.where"),
                (torch, "masked_select", "torch.masked_select"),
                (torch.Tensor, "masked_select", "Tensor.masked_select"),
                (torch, "argwhere", "torch.argwhere"),
            ]
        return []

    def _arm_window(self, kind: str) -> None:
        if kind in self._windows_used or not self.started:
            return
        plan = self._window_plan(kind)
        if not plan:
            return
        self._windows_used.add(kind)
        patches = []
        for owner, name, api in plan:
            if not hasattr(owner, name):
                continue
            patch = _Patch(owner, name, self._timed(kind, api))
            patch.apply()
            patches.append(patch)
        self._window_patches[kind] = patches
        self._window_ends[kind] = self.session.step_index + TIMING_WINDOW_STEPS
        self._window_events[kind] = 0

    def _disarm_window(self, kind: str) -> None:
        for patch in reversed(self._window_patches.pop(kind, [])):
            patch.restore()
        self._window_ends.pop(kind, None)
        self._window_events.pop(kind, None)

    # -- recording ------------------------------------------------------------
    def _clock_line(self, site: "_Site") -> Optional[int]:
        """For an explicit synchronize: the line within ``CLOCK_LOOKAHEAD`` code lines after it that reads a clock.

        A synchronize followed by a clock read ends a timed region: the wait is
        the point (accurate per-step timing), not an accident to remove.
        """
        if site.kind not in EXPLICIT_SYNC_KINDS:
            return None
        file, line = site.key[0], site.key[1]
        seen = 0
        for number in range(line + 1, line + 1 + 4 * CLOCK_LOOKAHEAD):
            text = self._source(file, number).strip()
            if not text or text.startswith("#"):
                continue
            if reads_clock(text):
                return number
            seen += 1
            if seen >= CLOCK_LOOKAHEAD:
                break
        return None

    def _source(self, file: str, line: int) -> str:
        key = (file, line)
        text = self._line_cache.get(key)
        if text is None:
            text = linecache.getline(file, line)
            self._line_cache[key] = text
        return text

    def _record(
        self,
        kind: Optional[str],
        api: Optional[str],
        stall: Optional[float],
        tensor: Any,
        skip: int,
        pinned: Optional[bool] = None,
        idle: Optional[bool] = None,
    ) -> None:
        began = time.perf_counter()
        self._record_site(kind, api, stall, tensor, skip + 1, began, pinned, idle)
        timeline = _timeline.of(self.session)
        if timeline is not None:
            timeline.overhead("sync", time.perf_counter() - began)

    def _record_site(
        self,
        kind: Optional[str],
        api: Optional[str],
        stall: Optional[float],
        tensor: Any,
        skip: int,
        began: float,
        pinned: Optional[bool] = None,
        idle: Optional[bool] = None,
    ) -> None:
        if _sync_allowed():
            self.allowed_count += 1
            return
        # A known site takes the short walk (frames.sync_site_top says why).
        top, library_name, internal, callee = _frames.sync_site_top(skip=skip + 1)
        if internal:
            self.internal_count += 1  # torchlint's own read-backs are not the user's
            return
        site = None
        if top is not None:
            if kind is None:
                kind = self._classify_cache.get((top[0], top[1], library_name))
            elif kind == "cpu" and api == "Tensor.cpu" and ".numpy(" in self._source(top[0], top[1]):
                kind = "numpy"
            elif kind in ("copy", "pageable-copy"):
                kind = self._refine_copy(kind, top)
            if kind is not None:
                site = self._sites.get((top[0], top[1], kind))
        if site is None:
            site, kind = self._new_site(kind, api, tensor, skip + 1, pinned)
            if site is None:
                return
        step = self.session.step_index
        with self._lock:
            if site.silenced:
                site.silenced_count += 1
                return
            site.steps[step] = site.steps.get(step, 0) + 1
            if pinned is not None:
                site.pinned.add(pinned)
            if idle is not None:
                site.queried[step] = site.queried.get(step, 0) + 1
                if idle:
                    site.idle_arrivals[step] = site.idle_arrivals.get(step, 0) + 1
            if callee is None or callee is not site.callee:
                site.runs += 1
                site.run_steps[step] = site.run_steps.get(step, 0) + 1
                if site.kind in EXPLICIT_SYNC_KINDS:
                    self._explicit_sync_step = step
                elif self._explicit_sync_step == step:
                    site.after_sync[step] = site.after_sync.get(step, 0) + 1
                if not self._grad_enabled():
                    site.no_grad_runs += 1
                site.callee = callee
            timeline = _timeline.of(self.session)
            if timeline is not None:
                timeline.sync(site.kind, site.key[0], site.key[1], stall, site.rule, step, ended_at=began)
            if stall is not None:
                site.stall[step] = site.stall.get(step, 0.0) + stall
                site.timed[step] = site.timed.get(step, 0) + 1
                if api is not None and kind in self._window_events:
                    self._window_events[kind] += 1
                    if self.session.step_index == 0 and self._window_events[kind] >= TIMING_WINDOW_EVENTS:
                        self._disarm_window(kind)

    def _new_site(self, kind: Optional[str], api: Optional[str], tensor: Any, skip: int, pinned: Optional[bool] = None):
        """The first sync of a site (or of an unclassified line): the full stack, the kind, the site.

        A given kind comes as ``_record_site`` read it from the user's line
        (``.cpu()`` inside ``.numpy(`` already ``"numpy"``). Returns
        ``(site, kind)``; site None when the sync is torchlint's own.
        """
        user, library, internal, _callee = _frames.sync_site_stack(limit=self.stack_limit, skip=skip + 1)
        if internal:
            self.internal_count += 1
            return None, kind
        compiler = _frames.through_compiler(skip=skip + 1)
        top = user[0] if user else (library or ("<unknown>", 0, "<unknown>"))
        if kind in ("copy", "pageable-copy"):
            kind = self._refine_copy(kind, top)
        if kind is None:
            library_key = library[2] if library else None
            cache_key = (top[0], top[1], library_key)
            kind = self._classify_cache.get(cache_key)
            if kind is None:
                kind = classify(self._source(top[0], top[1]), library, wrapped_ran=False)
                self._classify_cache[cache_key] = kind
            if kind in ("mask-index", "nonzero"):
                self._arm_window(kind)
        key = (top[0], top[1], kind)
        with self._lock:
            site = self._sites.get(key)
            if site is None:
                rule = rule_for(kind, None if pinned is None else {pinned})
                silenced = bool(user) and line_suppresses(self._source(top[0], top[1]), rule)
                in_test = bool(user) and _frames.is_test_file(top[0])
                site = _Site(key, kind, api, user or [top], library, silenced, in_test, compiler)
                site.host_choice = bool(user) and chooses_on_host(self._source(top[0], top[1]))
                if tensor is not None:
                    site.tensor = _describe_tensor(tensor)
                self._sites[key] = site
        return site, kind

    def _refine_copy(self, kind: str, top: Tuple[str, int, str]) -> str:
        """A copy whose line builds its tensor from numpy is ``host-built`` (TL204's kind), else as given."""
        key = (top[0], top[1], kind)
        refined = self._refined.get(key)
        if refined is None:
            refined = "host-built" if builds_on_host(self._source(top[0], top[1])) else kind
            self._refined[key] = refined
        return refined

    # -- results ----------------------------------------------------------------
    def silenced_sites(self) -> List[Dict[str, Any]]:
        return [
            {"file": s.key[0], "line": s.key[1], "sync_kind": s.kind, "count": s.silenced_count, "reason": "noqa"}
            for s in self._sites.values()
            if s.silenced
        ]

    def findings(self) -> List[Finding]:
        session = self.session
        min_count = getattr(session, "sync_min_count", None) or DEFAULT_MIN_COUNT  # a test double may lack it
        with self._lock:
            sites = [
                SiteRecord(
                    kind=s.kind,
                    api=s.api,
                    stack=tuple(s.stack),
                    library=s.library,
                    steps=dict(s.steps),
                    stall=dict(s.stall),
                    timed=dict(s.timed),
                    runs=s.runs,
                    in_test=s.in_test,
                    tensor=s.tensor,
                    run_steps=dict(s.run_steps),
                    no_grad_runs=s.no_grad_runs,
                    compiler=s.compiler,
                    pinned=frozenset(s.pinned),
                    host_choice=s.host_choice,
                    queried=dict(s.queried),
                    idle_arrivals=dict(s.idle_arrivals),
                    after_sync=dict(s.after_sync),
                    clock_line=self._clock_line(s),
                )
                for s in self._sites.values()
                if not s.silenced
            ]
        return sync_findings(sites, session.step_count(), min_count, session.test_id)


def _stream_query(torch: Any) -> Optional[Callable[[Optional[int]], bool]]:
    """``query(device_index) -> bool``: whether that device's current stream has finished its work.

    The ``torch.cuda.Stream`` of each (stream, device) pair is made once and
    kept: ``torch.cuda.current_stream()`` builds a new one on every call.
    """
    get_current = getattr(torch._C, "_cuda_getCurrentStream", None)
    if get_current is None:
        return None
    current_device = torch.cuda.current_device
    stream_class = torch.cuda.Stream
    streams: Dict[Tuple[int, ...], Any] = {}

    def query(device_index: Optional[int]) -> bool:
        data = get_current(current_device() if device_index is None else device_index)
        stream = streams.get(data)
        if stream is None:
            stream = streams[data] = stream_class(stream_id=data[0], device_index=data[1], device_type=data[2])
        return bool(stream.query())

    return query
