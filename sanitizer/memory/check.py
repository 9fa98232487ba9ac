"""The memory check's hooks and state: what the allocator did while the program ran.

This module observes; ``verdicts.py`` judges. The step sample, the watcher
thread, the snapshots and the OOM observer fill the check's state, and
``MemoryCheck.observed()`` freezes it into a ``MemoryRecord``
(``record.py``), from which the findings and the summary are computed.

Cost model (measured on an H200 with torch 2.11):
``torch.cuda.memory_stats()`` costs ~56 µs because it flattens 122 keys in
Python, the raw ``torch._C._cuda_memoryStats`` behind it ~8 µs,
``mem_get_info()`` ~4-6 µs, a snapshot ~0.16 ms, all in a tight loop. In place,
once every 36 launch-bound steps, the raw counters cost ~50 µs and
``mem_get_info()`` ~83 µs (``bench/memory_sample_parts.py``, H200): work done
once per 50 ms runs with cold caches, and ``mem_get_info`` is a driver round
trip while kernels are queued. So ``on_step`` does one clock read per step and
samples the counters only once per ``sample_interval_s`` (50 ms), and the
sample reads ``mem_get_info`` only when reserved memory moved or its last
reading is ``DEVICE_READ_EVERY_S`` old (``_device_memory``).
Snapshots are taken only on a trigger (allocation retries rose, slack high
near the cap, many inactive split blocks, an OOM, the session's end) and
rate-limited. ``memory_allocated()``/``memory_reserved()`` are never called:
each is a full ``memory_stats()``.

The look (``_look``: peaks, the session timeline's memory curve, new-segment
events; ``timeline.py`` owns and bounds the series) runs in two places. While
the program steps, the step sample makes it with the counters it just read,
on the main thread. Between step samples, and in programs without steps, the
watcher thread makes it every ``WATCH_INTERVAL_S``. The watcher skips its
look while a step sample is recent, and is parked (``PARKED_WAKE_S``) while
step samples come: a counters read from the watcher cost the stepping thread
~190 µs of wall time each on an H100 (the GIL and the allocator's lock change
hands), 1% of a launch-bound step at 50 Hz, where the same read on the main
thread costs ~10 µs, and even a wake that reads nothing takes the GIL once.

Every torch call sits behind ``TorchAllocatorSource`` (``allocator.py``); the
CPU tests drive ``MemoryCheck`` with a fake source and a fake clock.
"""

from __future__ import annotations

import math
import os
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from .. import timeline as _timeline
from ..findings import Finding, Frame
from ..internal_errors import InternalErrors
from ..phases import split
from ..session import Check, SessionView
from . import fragmentation as frag
from .allocator import AllocatorStats, TorchAllocatorSource
from .nvml import NvmlSampler
from .record import MemoryRecord, OomEvent, SnapshotRecord, WasteEvent
from .verdicts import NEAR_CAP_FRACTION, memory_findings, memory_summary

MiB = 1 << 20
DEFAULT_SAMPLE_INTERVAL_S = 0.05
SNAPSHOT_MIN_INTERVAL_S = 1.0
# The device's free memory is read again after this long even when reserved stayed put
# (``MemoryCheck._device_memory``): what other processes take shows within it.
DEVICE_READ_EVERY_S = 1.0
MAX_TRIGGERED_SNAPSHOTS = 8
HIGH_SLACK = 0.3
INACTIVE_SPLIT_TRIGGER_BYTES = 64 * MiB
INACTIVE_SPLIT_TRIGGER_FRACTION = 0.25
# The watcher: a daemon thread that wakes every WATCH_INTERVAL_S and reads the raw
# allocator counters when no step sample is recent, so memory is observed while it
# happens without steps too (~8 µs a read in a tight loop, ~190 µs of the stepping
# thread's time in place: the module docstring says why the step sample reads instead).
WATCH_INTERVAL_S = 0.02
# A step sample younger than this many sample intervals stands in for the watcher's look.
STEP_LOOK_COVERS_INTERVALS = 2.0
# While step samples come, the watcher is parked: it wakes this often only to learn
# whether the steps stopped. Each wake takes the GIL from the stepping thread
# (~0.2% of a launch-bound step at one wake per 50 ms sample, H200); when the steps
# stop, the watcher's looks resume within this time; a peak in that gap still shows
# in the allocator's own peak counters (``MemoryRecord.peak``).
PARKED_WAKE_S = 0.5
# Samples after warm-up kept for the steady-state judgements (growth, sustained churn)
# before neighbours merge: one per 50 ms sample is 3.4 minutes of steps at full grain.
MAX_STEADY_SAMPLES = 4096
NEW_SEGMENT_SNAPSHOT_MIN_INTERVAL_S = 0.1
MAX_NEW_SEGMENT_SNAPSHOTS = 64
# TORCHLINT_MEMORY_HISTORY=1: the allocator records a Python stack per allocation
# (+~24% on a launch-bound step), so a wasteful segment names its exact line.
HISTORY_ENV = "TORCHLINT_MEMORY_HISTORY"
# How a new segment's reported line was found (a finding's ``site_observed``).
SEEN_IN_HISTORY = "allocator history (exact)"
SEEN_BY_WATCHER = "the main thread's line when the watcher saw the segment"
SEEN_ON_MAIN_THREAD = "the main thread's line when a step sample or the program's end saw the segment"


# ------------------------------------------------------------------ OOM observer

# The observer cannot be detached: it is attached once per process and
# forwards to the innermost active MemoryCheck.
_observer_lock = threading.Lock()
_observer_attached = False
_active_checks: List["MemoryCheck"] = []


def _on_out_of_memory(device: int, alloc: int, device_total: int, device_free: int) -> None:
    check = _active_checks[-1] if _active_checks else None
    if check is None:
        return
    try:
        check._record_oom(device, alloc, device_total, device_free)
    except BaseException as error:  # an exception here would surface inside the allocator
        check.errors.record("OOM observer", error)


def _ensure_observer(source: Any, errors: Optional[InternalErrors] = None) -> bool:
    global _observer_attached
    with _observer_lock:
        if _observer_attached:
            return True
        try:
            _observer_attached = bool(source.attach_oom_observer(_on_out_of_memory))
        except Exception as error:
            _observer_attached = False
            if errors is not None:
                errors.record("OOM observer attach", error)
        return _observer_attached


def _user_stack() -> List[Frame]:
    try:
        from ..frames import user_stack
    except ImportError:
        return []
    try:
        return list(user_stack(limit=8))
    except Exception:
        return []


# ------------------------------------------------------------------ the check


# Frozen: one instance serves every check that is not given its own.
_DEFAULT_THRESHOLDS = frag.Thresholds()


class MemoryCheck(Check):
    """Allocator health for one sanitizer session (the ``memory`` check)."""

    name = "memory"

    def __init__(
        self,
        session: SessionView,
        *,
        source: Any = None,
        nvml_sampler: Any = None,
        use_nvml: bool = True,
        clock: Callable[[], float] = time.perf_counter,
        sample_interval_s: float = DEFAULT_SAMPLE_INTERVAL_S,
        thresholds: frag.Thresholds = _DEFAULT_THRESHOLDS,
        watch_interval_s: Optional[float] = WATCH_INTERVAL_S,
    ) -> None:
        self.session = session
        self._source = source
        self._nvml = nvml_sampler
        self._use_nvml = use_nvml
        self._clock = clock
        self.sample_interval_s = sample_interval_s
        self.thresholds = thresholds
        self._started = False
        self._stopped = False
        self.inactive_reason: Optional[str] = None
        self.error: Optional[str] = None
        self._next_sample_at = math.inf
        self._last_step: Optional[int] = None
        self._start_stats: Optional[AllocatorStats] = None
        self._last_stats: Optional[AllocatorStats] = None
        self._end_stats: Optional[AllocatorStats] = None
        self._baseline: Optional[Tuple[AllocatorStats, Optional[int]]] = None
        self._cap: Optional[int] = None
        self._device_total: Optional[int] = None
        self._min_device_free: Optional[int] = None
        self._device_read_at = -math.inf  # the last mem_get_info (the check's clock) ...
        self._device_read_reserved: Optional[int] = None  # ... and the reserved bytes it was read at
        self._device_free: Optional[int] = None
        self._max_reserved = 0
        self._max_allocated = 0
        self._samples = 0
        self._retry_steps: List[Optional[int]] = []
        self._churn_intervals = 0
        self._steady_samples: List[Tuple] = []  # (step, reserved, allocated, mallocs, frees) after warm-up
        self._snapshots: List[SnapshotRecord] = []
        self._last_snapshot_at: Dict[str, float] = {}
        self._ooms: List[OomEvent] = []
        self._pressure = False
        self._on_active_stack = False
        self.errors = InternalErrors("memory")
        # Observed while it happens (the watcher thread, steps, the program's end).
        self.watch_interval_s = watch_interval_s
        self._watcher: Optional[threading.Thread] = None
        self._watch_stop = threading.Event()
        self._watch_lock = threading.RLock()
        self._watch_last: Optional[AllocatorStats] = None
        self._known_segments: Optional[set] = None
        self._waste: Dict[Tuple[Optional[str], Optional[int]], Dict[str, Any]] = {}  # allocating site -> event
        self._last_new_segment_snapshot = -math.inf
        self._step_looked_at = -math.inf  # the last look a step sample made (the check's clock)
        self._new_segment_snapshots = 0
        self._main_thread = threading.get_ident()
        self._recording_history = False

    # -------------------------------------------------------------- protocol

    def start(self) -> None:
        if self._started:
            return
        self._started = True
        if self._source is None:
            self._source = TorchAllocatorSource.create()
        if self._source is None:
            self.inactive_reason = "no CUDA device"
            return
        _active_checks.append(self)
        self._on_active_stack = True
        source = self._source
        if source.is_initialized():
            self._on_cuda_ready()
        else:
            # Before CUDA's first use every counter is 0; initializing CUDA
            # here would cost the user a context they may not want yet.
            self._start_stats = AllocatorStats()
            self._last_stats = self._watch_last = self._start_stats
            self._known_segments = set()  # no segment exists before CUDA's first use
            source.on_init(self._attach_observer)
        if self._use_nvml and self._nvml is None:
            timeline = _timeline.of(self.session)
            on_sample = timeline.utilization if timeline is not None else None  # judged by phase (phases.py)
            try:
                if source.is_initialized():
                    self._nvml = NvmlSampler(source.device, pci_bus_id=source.pci_bus_id(), on_sample=on_sample)
                else:
                    self._nvml = NvmlSampler(_visible_device_index(), on_sample=on_sample)
            except Exception as error:
                self.errors.record("NVML sampler", error)
                self._nvml = None
        if self._nvml is not None:
            self._nvml.start()
        self._next_sample_at = 0.0
        self._main_thread = threading.get_ident()
        self._recording_history = False
        if os.environ.get(HISTORY_ENV, "").strip().lower() in ("1", "true", "yes", "on"):
            try:
                self._recording_history = bool(source.record_history(True))
            except Exception as error:
                self.errors.record("memory history", error)
        if self.watch_interval_s and isinstance(source, TorchAllocatorSource):
            self._watcher = threading.Thread(target=self._watch_loop, name="torchlint-memory-watch", daemon=True)
            self._watcher.start()

    def _attach_observer(self) -> None:
        if not self._stopped:
            _ensure_observer(self._source, self.errors)

    def _on_cuda_ready(self) -> None:
        self._attach_observer()
        stats = self._source.stats()
        self._start_stats = self._last_stats = stats
        self._watch_last = stats
        if stats.segments == 0:
            self._known_segments = set()
        else:
            try:
                segments, _ = self._source.snapshot()
                self._known_segments = {int(segment.get("address", 0)) for segment in segments}
            except Exception as error:
                self.errors.record("snapshot at start", error)

    def on_step(self, step: int) -> None:
        self._last_step = step
        if self._clock() >= self._next_sample_at:
            self._sample(step)

    def on_measurement_start(self) -> None:
        """The session finished starting (the race check's tap is built): the program's time starts now."""
        if self._nvml is not None:
            self._nvml.mark_measurement_start()

    def on_program_end(self) -> None:
        """The script returned (or raised) and its globals still hold its tensors: look now.

        The session's end comes after the script's globals are torn down, when
        everything it allocated is free: a snapshot then shows an empty cache.
        """
        if not self._started or self._stopped or self._source is None:
            return
        try:
            if self._source.is_initialized():
                self._watch_tick()
                self._snapshot("program-end", self._last_step, under_pressure=self._under_pressure())
        except Exception as error:
            self.errors.record("program-end snapshot", error)

    def stop(self) -> None:
        if not self._started or self._stopped:
            return
        self._stopped = True
        self._next_sample_at = math.inf
        self._watch_stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout=5.0)
            self._watcher = None
        try:
            if self._source is not None and self._source.is_initialized():
                self._watch_tick()
                stats = self._take_sample(self._last_step, read_device=True)
                self._end_stats = stats
                self._snapshot("session-end", self._last_step, under_pressure=self._under_pressure())
        except Exception as exc:  # a failing allocator query must not break the user's teardown
            self.error = f"final sample failed: {exc!r}"
            self.errors.record("final sample", exc)
        finally:
            if self._recording_history:
                try:
                    self._source.record_history(False)
                except Exception as error:
                    self.errors.record("memory history", error)
                self._recording_history = False
            self.errors.warn()
            if self._nvml is not None:
                self._nvml.stop()
            if self._on_active_stack:
                try:
                    _active_checks.remove(self)
                except ValueError:
                    pass
                self._on_active_stack = False

    # -------------------------------------------------------------- sampling

    def _sample(self, step: Optional[int]) -> None:
        if getattr(self.session, "in_warmup", False):
            return  # _next_sample_at stays 0: check again at the next step
        if self._source is None or not self._source.is_initialized():
            self._next_sample_at = self._clock() + self.sample_interval_s
            return
        if not _observer_attached:
            self._attach_observer()
        try:
            stats = self._take_sample(step)
            # The counters just read serve the look too, so the watcher need not read them again.
            self._watch_tick(stats)
            self._step_looked_at = self._clock()
        except Exception as error:  # inside the user's optimizer step: recorded, never raised
            self.errors.record("step sample", error)
        self._next_sample_at = self._clock() + self.sample_interval_s

    def _take_sample(self, step: Optional[int], *, read_device: bool = False) -> AllocatorStats:
        source = self._source
        stats = source.stats()
        free, total = self._device_memory(stats, read_device)
        self._samples += 1
        self._max_reserved = max(self._max_reserved, stats.reserved)
        self._max_allocated = max(self._max_allocated, stats.allocated)
        previous = self._last_stats or stats
        if self._baseline is None and not getattr(self.session, "in_warmup", False) and not self._stopped:
            self._baseline = (stats, step)
            self._note_steady(step, stats, stats)
            if self._nvml is not None:
                self._nvml.mark_measurement_start()
        elif self._baseline is not None:
            grew = (stats.num_device_alloc - previous.num_device_alloc) + (
                stats.num_device_free - previous.num_device_free
            )
            if grew > 0:
                self._churn_intervals += 1
            self._note_steady(step, stats, previous)
        trigger: Optional[str] = None
        if stats.num_alloc_retries > previous.num_alloc_retries:
            self._retry_steps.append(step)
            self._pressure = True
            trigger = "alloc-retry"
        cap = self._cap
        near_cap = cap is not None and cap != 0 and stats.reserved >= NEAR_CAP_FRACTION * cap
        low_free = total > 0 and free < (1.0 - NEAR_CAP_FRACTION) * total
        if near_cap or low_free:
            self._pressure = True
            if trigger is None and stats.slack >= HIGH_SLACK:
                trigger = "high-slack-near-cap"
        if (
            trigger is None
            and stats.inactive_split_bytes >= INACTIVE_SPLIT_TRIGGER_BYTES
            and stats.reserved
            and stats.inactive_split_bytes / stats.reserved >= INACTIVE_SPLIT_TRIGGER_FRACTION
        ):
            trigger = "inactive-split"
        self._last_stats = stats
        if trigger is not None and not self._stopped:
            self._maybe_snapshot(trigger, step)
        return stats

    def _note_steady(self, step: Optional[int], stats: AllocatorStats, previous: AllocatorStats) -> None:
        """One sample after warm-up: what reserved memory and cudaMalloc/cudaFree did since the last one.

        Bounded: past ``MAX_STEADY_SAMPLES``, neighbours merge in pairs (their
        mallocs and frees added, the later state kept), so a long run keeps its
        whole span at a coarser grain.
        """
        samples = self._steady_samples
        samples.append(
            (
                step,
                stats.reserved,
                stats.allocated,
                stats.num_device_alloc - previous.num_device_alloc,
                stats.num_device_free - previous.num_device_free,
            )
        )
        if len(samples) >= MAX_STEADY_SAMPLES:
            merged = [
                (b[0], b[1], max(a[2], b[2]), a[3] + b[3], a[4] + b[4]) for a, b in zip(samples[::2], samples[1::2])
            ]
            if len(samples) % 2:
                merged.append(samples[-1])
            self._steady_samples = merged

    def _device_memory(self, stats: AllocatorStats, force: bool = False) -> Tuple[int, int]:
        """The device's (free, total), read again only when it may have moved.

        ``mem_get_info`` is a round trip to the driver: ~6 µs in a tight loop,
        ~83 µs in place while a launch-bound step keeps kernels queued
        (``bench/memory_sample_parts.py``, H200), about 40% of what a step
        sample cost while it read it every time. This process moves the
        device's free memory only by mapping or releasing segments, which
        ``reserved`` shows; other processes and
        ``set_per_process_memory_fraction`` are caught within
        ``DEVICE_READ_EVERY_S``.
        """
        if (
            force
            or self._device_free is None
            or stats.reserved != self._device_read_reserved
            or self._clock() - self._device_read_at >= DEVICE_READ_EVERY_S
        ):
            free, total = self._source.mem_get_info()
            self._device_read_at, self._device_read_reserved = self._clock(), stats.reserved
            self._device_free, self._device_total = free, total
            self._cap = self._source.cap(total)
            self._min_device_free = free if self._min_device_free is None else min(self._min_device_free, free)
        device_free, device_total = self._device_free, self._device_total
        if device_free is None or device_total is None:  # both set together on the first read above
            raise RuntimeError("the device's free memory was never read")
        return device_free, device_total

    def _under_pressure(self) -> bool:
        return self._pressure or bool(self._ooms)

    def _maybe_snapshot(self, reason: str, step: Optional[int]) -> None:
        now = self._clock()
        triggered = sum(1 for s in self._snapshots if s.reason != "session-end")
        # Rate-limited per trigger, so a steady "inactive-split" state never
        # hides the snapshot of a retry that follows it.
        since_last = now - self._last_snapshot_at.get(reason, -math.inf)
        if triggered >= MAX_TRIGGERED_SNAPSHOTS or since_last < SNAPSHOT_MIN_INTERVAL_S:
            return
        self._last_snapshot_at[reason] = now
        self._snapshot(reason, step, under_pressure=self._under_pressure())

    def _snapshot(
        self, reason: str, step: Optional[int], *, under_pressure: bool, segments=None, settings=None
    ) -> Optional[SnapshotRecord]:
        if segments is None:
            try:
                segments, settings = self._source.snapshot()
            except Exception as error:
                self.errors.record(f"snapshot ({reason})", error)
                return None
        metrics = frag.analyze(segments)
        verdict = frag.judge(metrics, under_pressure=under_pressure, thresholds=self.thresholds)
        record = SnapshotRecord(reason, step, metrics, verdict, settings or {}, self._last_stats)
        self._snapshots.append(record)
        timeline = _timeline.of(self.session)
        if timeline is not None:
            timeline.snapshot(
                reason,
                verdict.category if verdict is not None else None,
                verdict.free_bytes if verdict is not None else metrics.overall.total_free,
                step,
            )
        return record

    # -------------------------------------------------------------- the watcher

    def _watch_loop(self) -> None:
        while not self._watch_stop.wait(self._watch_sleep_s()):
            self._watch_wake()

    def _watch_sleep_s(self) -> float:
        """How long the watcher sleeps: ``PARKED_WAKE_S`` while step samples come, else one interval.

        While the program steps, every wake would only find the look already
        made by a step sample; each wake still takes the GIL from the training
        thread. So the watcher wakes twice a second then, not at 50 Hz.
        """
        interval = self.watch_interval_s
        if interval is None:  # no watcher runs then; asked only by one
            return PARKED_WAKE_S
        if self._clock() - self._step_looked_at < STEP_LOOK_COVERS_INTERVALS * self.sample_interval_s:
            return max(interval, PARKED_WAKE_S)
        return interval

    def _watch_wake(self) -> bool:
        """One wake of the watcher: a look, unless a recent step sample made it. True if it looked."""
        try:
            if self._clock() - self._step_looked_at < STEP_LOOK_COVERS_INTERVALS * self.sample_interval_s:
                return False
            if self._source.is_initialized():
                self._watch_tick()
                return True
        except Exception as error:  # a daemon thread: nothing may escape it
            self.errors.record("memory watcher", error)
        return False

    def _watch_tick(self, stats: Optional[AllocatorStats] = None) -> None:
        """One look at the allocator's counters (``stats`` if just read), timed as the sanitizer's own time."""
        with self._watch_lock:
            began = time.perf_counter()
            timeline = _timeline.of(self.session)
            try:
                self._look(timeline, stats)
            finally:
                if timeline is not None:
                    timeline.overhead("memory", time.perf_counter() - began)

    def _step_now(self) -> Optional[int]:
        step = getattr(self.session, "step_index", None)
        return step if isinstance(step, int) else self._last_step

    def _look(self, timeline: Any, stats: Optional[AllocatorStats] = None) -> None:
        """The peaks and the timeline's memory curve; a snapshot only when the allocator mapped a new segment."""
        watcher = threading.get_ident() != self._main_thread
        pick = getattr(self._source, "device_for_thread", None)
        device = pick() if watcher and pick is not None else None
        if stats is None:
            stats = self._source.stats(device)
        previous = self._watch_last
        self._watch_last = stats
        self._max_reserved = max(self._max_reserved, stats.reserved)
        self._max_allocated = max(self._max_allocated, stats.allocated)
        step = self._step_now()
        if timeline is not None:
            timeline.memory(stats.allocated, stats.reserved, stats.segments, step)
        if previous is None or stats.num_device_alloc <= previous.num_device_alloc:
            return
        site = self._allocating_site()
        if timeline is not None:
            top = site[0] if site else None
            timeline.new_segments(
                stats.num_device_alloc - previous.num_device_alloc,
                stats.reserved - previous.reserved,
                top.file if top else None,
                top.line if top else None,
                step,
            )
        now = self._clock()
        # Only a segment mapped while cached memory was free can be waste;
        # judging it needs a snapshot (~0.2 ms), taken right away.
        if previous.reserved <= previous.allocated and self._known_segments is not None:
            self._remember_segments(device)
            return
        if (
            self._new_segment_snapshots >= MAX_NEW_SEGMENT_SNAPSHOTS
            or now - self._last_new_segment_snapshot < NEW_SEGMENT_SNAPSHOT_MIN_INTERVAL_S
        ):
            return
        self._last_new_segment_snapshot = now
        self._new_segment_snapshots += 1
        try:
            segments, settings = self._source.snapshot(device)
        except Exception as error:
            self.errors.record("snapshot (new segment)", error)
            return
        known = self._known_segments
        self._known_segments = {int(segment.get("address", 0)) for segment in segments}
        if known is None:
            return
        wasted = frag.new_segment_waste(segments, known)
        if not wasted:
            return
        record = self._snapshot(
            "new-segment", self._last_step, under_pressure=self._under_pressure(), segments=segments, settings=settings
        )
        seen_by = SEEN_BY_WATCHER if watcher else SEEN_ON_MAIN_THREAD
        for waste in wasted:
            exact = self._segment_site(waste.address)
            self._note_waste(
                waste,
                exact if exact is not None else site,
                record,
                stats,
                SEEN_IN_HISTORY if exact is not None else seen_by,
            )

    def _remember_segments(self, device: Optional[int] = None) -> None:
        """The segment addresses, for a later judgement (no snapshot unless it may matter)."""
        try:
            segments, _ = self._source.snapshot(device)
            self._known_segments = {int(segment.get("address", 0)) for segment in segments}
        except Exception as error:
            self.errors.record("snapshot (segments)", error)

    def _segment_site(self, address: int) -> Optional[List[Frame]]:
        """The exact allocating stack, where the allocator's history holds it."""
        lookup = getattr(self._source, "segment_frames", None)
        if lookup is None:
            return None
        try:
            entries = lookup(address)
            if not entries:
                return None
            from ..frames import user_frames_of

            return [Frame(*entry) for entry in user_frames_of(entries, 8)] or None
        except Exception as error:
            self.errors.record("allocator history", error)
            return None

    def _note_waste(
        self, waste: "frag.NewSegmentWaste", site: List[Frame], record, stats: AllocatorStats, seen_by: str
    ) -> None:
        # The snapshot judge's floors apply here too: a warm-up step that maps a
        # segment while a few MiB sit free in split blocks is the cache at work,
        # not the waste worth a finding (docs/sanitizer-memory.md).
        floor = max(self.thresholds.min_free_bytes, self.thresholds.min_free_fraction * stats.reserved)
        if waste.pool_free < floor:
            return
        top = site[0] if site else None
        key = (top.file if top else None, top.line if top else None)
        event = self._waste.get(key)
        if event is not None:
            event["count"] += 1
            if waste.pool_free > event["waste"].pool_free:
                event.update(waste=waste, record=record, stats=stats)
            return
        self._waste[key] = {
            "waste": waste,
            "site": site,
            "record": record,
            "stats": stats,
            "count": 1,
            "step": self._last_step,
            "seen_by": seen_by,
        }

    def _allocating_site(self) -> List[Frame]:
        """The user's stack on the thread that allocated: this one, or the main thread seen from the watcher."""
        if threading.get_ident() != self._main_thread:
            import sys

            frame = sys._current_frames().get(self._main_thread)
            if frame is None:
                return []
            try:
                from ..frames import user_frames_of

                entries: List[Tuple[str, int, str]] = []
                while frame is not None and len(entries) < 64:
                    entries.append((frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
                    frame = frame.f_back
                return [Frame(*entry) for entry in user_frames_of(entries, 8)]
            except Exception as error:
                self.errors.record("allocating site", error)
                return []
        return _user_stack()

    # -------------------------------------------------------------- OOM

    def _record_oom(self, device: int, alloc: int, device_total: int, device_free: int) -> None:
        """Runs inside the allocator's OOM observer: gather, never judge or raise."""
        source = self._source
        stats = segments = None
        settings: Dict[str, Any] = {}
        stream = None
        try:
            stats = source.stats(device)
        except Exception as error:
            self.errors.record("OOM observer: stats", error)
        try:
            segments, settings = source.snapshot(device)
        except Exception as error:
            self.errors.record("OOM observer: snapshot", error)
        try:
            stream = source.current_stream(device)
        except Exception as error:
            self.errors.record("OOM observer: stream", error)
        process_used = others_used = None
        if self._nvml is not None and getattr(self._nvml, "available", False):
            try:
                process_used, others_used = self._nvml.process_usage()
            except Exception as error:
                self.errors.record("OOM observer: NVML", error)
        self._ooms.append(
            OomEvent(
                device=int(device),
                alloc=int(alloc),
                device_total=int(device_total),
                device_free=int(device_free),
                stats=stats,
                segments=tuple(segments) if segments is not None else None,
                settings=settings,
                stream=stream,
                stack=tuple(_user_stack()),
                process_used=process_used,
                others_used=others_used,
                step=self._last_step,
                alloc_conf=source.alloc_conf(),
            )
        )
        timeline = _timeline.of(self.session)
        if timeline is not None:
            top = self._ooms[-1].stack[:1]
            if stats is not None:  # the curve's point at the OOM, between two of the watcher's looks
                timeline.memory(stats.allocated, stats.reserved, stats.segments, self._step_now())
            timeline.oom(alloc, top[0].file if top else None, top[0].line if top else None, self._last_step)

    # -------------------------------------------------------------- results

    def observed(self) -> MemoryRecord:
        """What the check saw so far, frozen: the input of every verdict (``verdicts.py``)."""
        nvml_findings: List[Finding] = []
        if self._nvml is not None:
            try:
                nvml_findings = self._nvml.findings()
            except Exception as error:
                self.errors.record("NVML findings", error)
        source = self._source
        timeline = _timeline.of(self.session)
        phases = split(timeline.to_json(), self.session.step_count().warmup) if timeline is not None else None
        waste = tuple(
            WasteEvent(
                waste=event["waste"],
                site=tuple(event["site"]),
                record=event["record"],
                stats=event["stats"],
                count=event["count"],
                step=event["step"],
                seen_by=event["seen_by"],
            )
            for event in self._waste.values()
        )
        return MemoryRecord(
            inactive_reason=self.inactive_reason or (None if source is not None else "not started"),
            error=self.error,
            samples=self._samples,
            start_stats=self._start_stats,
            end_stats=self._end_stats or self._last_stats,
            baseline=self._baseline,
            last_step=self._last_step,
            cap=self._cap,
            device_total=self._device_total,
            min_device_free=self._min_device_free,
            observed_peak_reserved=self._max_reserved,
            observed_peak_allocated=self._max_allocated,
            retry_steps=tuple(self._retry_steps),
            churn_intervals=self._churn_intervals,
            steady_samples=tuple(self._steady_samples),
            snapshots=tuple(self._snapshots),
            ooms=tuple(self._ooms),
            waste=waste,
            alloc_conf=source.alloc_conf() if source is not None else None,
            nvml_findings=tuple(nvml_findings),
            nvml_summary=self._nvml.summary() if self._nvml is not None else None,
            phases=phases,
            internal_errors=self.errors.to_json() if self.errors else None,
            test_id=getattr(self.session, "test_id", None),
        )

    def findings(self) -> List[Finding]:
        return memory_findings(self.observed())

    def summary(self) -> Dict[str, Any]:
        """Plain data for the report: peaks, counters over the session, metrics."""
        return memory_summary(self.observed())

    def measured_steps(self) -> int:
        return self.observed().measured_steps


def _visible_device_index() -> int:
    """NVML's index of CUDA device 0, without initializing CUDA."""
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return int(first) if first.isdigit() else 0
