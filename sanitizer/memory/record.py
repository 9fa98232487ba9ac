"""What the memory check observed, frozen: the input of every memory verdict.

``MemoryCheck`` (``check.py``) fills its state while the program runs (the
step sample, the watcher's looks, snapshots, the OOM observer). When the
findings or the summary are read, it freezes that state into a
``MemoryRecord``; ``verdicts.py`` judges the record and nothing else, so a
recorded allocator state can be judged again in a test, without torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple

from ..findings import Finding, Frame
from ..phases import Phases
from . import fragmentation as frag
from .allocator import AllocatorStats


@dataclass(frozen=True)
class OomEvent:
    """One call of the allocator's OOM observer, with what was gathered inside it."""

    device: int
    alloc: int
    device_total: int
    device_free: int
    stats: Optional[AllocatorStats]
    segments: Optional[Tuple[Mapping[str, Any], ...]]
    settings: Mapping[str, Any]
    stream: Optional[int]
    stack: Tuple[Frame, ...]
    process_used: Optional[int]
    others_used: Optional[int]
    step: Optional[int]
    alloc_conf: Optional[str]


@dataclass(frozen=True)
class SnapshotRecord:
    """A snapshot the check took: why, when, its metrics and the fragmentation judge's verdict."""

    reason: str
    step: Optional[int]
    metrics: frag.SnapshotMetrics
    verdict: Optional[frag.FragmentationVerdict]
    settings: Mapping[str, Any]
    stats: Optional[AllocatorStats]


@dataclass(frozen=True)
class WasteEvent:
    """Segments the allocator mapped while its pool held enough free memory, at one allocating line."""

    waste: frag.NewSegmentWaste  # the largest of them
    site: Tuple[Frame, ...]
    record: Optional[SnapshotRecord]
    stats: AllocatorStats
    count: int
    step: Optional[int]
    seen_by: str  # how the line was found (check.py's SEEN_* texts)


@dataclass(frozen=True)
class MemoryRecord:
    """Everything the memory verdicts read, as it stood when the record was taken."""

    inactive_reason: Optional[str]  # why the check did not run ("no CUDA device"); None when it ran
    error: Optional[str]  # the final sample's failure, if any
    samples: int
    start_stats: Optional[AllocatorStats]  # None until CUDA was initialized
    end_stats: Optional[AllocatorStats]  # the session's end, or the last sample before it
    baseline: Optional[Tuple[AllocatorStats, Optional[int]]]  # the first sample after warm-up, and its step
    last_step: Optional[int]
    cap: Optional[int]
    device_total: Optional[int]
    min_device_free: Optional[int]
    observed_peak_reserved: int
    observed_peak_allocated: int
    retry_steps: Tuple[Optional[int], ...]
    churn_intervals: int  # sampled intervals after the baseline with a cudaMalloc or cudaFree
    # Samples after warm-up: (step, reserved, allocated, mallocs since the last, frees since the last).
    steady_samples: Tuple[Tuple[Optional[int], int, int, int, int], ...]
    snapshots: Tuple[SnapshotRecord, ...]
    ooms: Tuple[OomEvent, ...]
    waste: Tuple[WasteEvent, ...]
    alloc_conf: Optional[str]  # PYTORCH_ALLOC_CONF as the allocator reads it
    nvml_findings: Tuple[Finding, ...]
    nvml_summary: Optional[Dict[str, Any]]
    phases: Optional[Phases]  # the run's phases from the session's timeline (phases.py); None without one
    internal_errors: Optional[Dict[str, Any]]
    test_id: Optional[str]

    @property
    def measured_steps(self) -> int:
        """Steps from the baseline to the last step seen (0 without a baseline)."""
        if self.baseline is None or self.last_step is None or self.baseline[1] is None:
            return 0
        return max(0, self.last_step - self.baseline[1])

    def peak(self, which: str) -> Tuple[int, bool]:
        """The session's peak ``"reserved"`` or ``"allocated"`` bytes, and whether it is exact.

        Exact when the allocator's peak counter rose during the session. The
        peak counters are never reset (that would change what the user's own
        code reads); when they did not rise, the sampled maximum is a lower
        bound.
        """
        sampled = self.observed_peak_reserved if which == "reserved" else self.observed_peak_allocated
        start, end = self.start_stats, self.end_stats
        if start is None or end is None:
            return sampled, False
        start_peak = start.reserved_peak if which == "reserved" else start.allocated_peak
        end_peak = end.reserved_peak if which == "reserved" else end.allocated_peak
        if end_peak > start_peak:
            return end_peak, True
        return sampled, False
