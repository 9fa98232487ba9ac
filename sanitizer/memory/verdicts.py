"""The memory check's findings and summary: pure functions of a ``MemoryRecord``.

Each builder reads only the frozen record of what the check observed
(``record.py``), so a recorded allocator state, healthy or not, can be judged
in a test without torch. ``docs/sanitizer-memory.md`` defines the metrics.

Memory is judged by what it cost the run, never by a gap alone: a snapshot
with free memory between live blocks, or a segment mapped while the pool held
free memory, is what every caching allocator shows at some point, on any GPU
size. Such states stay in the summary (``fragmented_states``,
``new_segment_waste``, ``worst_fragmentation``) as the evidence, and become a
finding only beside a cost the run paid:

- ``oom``: the run crashed (fragmentation or exhaustion, with the cause);
- ``alloc-retry``: cudaMalloc failed and the allocator synchronized every
  stream, freed its cache and retried;
- ``fragmentation``: peak reserved memory at least ``RESERVED_OVER_ALLOCATED``
  times peak allocated memory and ``MIN_EXCESS_BYTES`` above it (the ratio and
  the bytes are stated), or reserved memory growing across the steady-state
  steps while allocated memory does not (``MIN_GROWTH_BYTES``, in at least
  ``MIN_GROWTH_SAMPLES`` samples over half the steady state);
- ``alloc-churn``: cudaMalloc/cudaFree sustained through the steady state (in
  at least ``CHURN_MIN_INTERVALS`` sampled intervals, most of them, over half
  the steady-state steps), not a burst at a shape change, an epoch's last
  batch or autotuning;
- ``near-capacity``: a note (``info``): little headroom is a risk, not a cost;
- ``low-utilization``: the GPU busy less than half the time over the
  steady-state training steps alone (``phases.py``): compilation,
  evaluation, checkpoint writes and start-up are reported as phases, never
  averaged in.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..findings import ALLOC_CHURN, ALLOC_RETRY, FRAGMENTATION, LOW_UTILIZATION, NEAR_CAPACITY, OOM, Finding
from ..phases import STEADY, low_utilization
from . import fragmentation as frag
from .allocator import AllocatorStats
from .record import MemoryRecord, OomEvent, SnapshotRecord

NEAR_CAP_FRACTION = 0.9
CHURN_MIN_EVENTS = 2
CHURN_MIN_PER_STEP = 0.2
CHURN_MIN_STEPS = 2
# Sustained churn: in at least this many sampled intervals, and in most of them.
CHURN_MIN_INTERVALS = 3
CHURN_MIN_INTERVAL_SHARE = 0.5
# Reserved well above allocated at the peak: both the ratio and the bytes.
RESERVED_OVER_ALLOCATED = 1.5
MIN_EXCESS_BYTES = 512 * (1 << 20)
# Reserved memory growing through the steady state.
MIN_GROWTH_BYTES = 256 * (1 << 20)
MIN_GROWTH_FRACTION = 0.1
MIN_GROWTH_SAMPLES = 3


def memory_findings(record: MemoryRecord) -> List[Finding]:
    """Every memory finding the record supports, each tagged with the record's test."""
    found: List[Finding] = []
    found.extend(_oom_findings(record))
    for finding in (_retry_finding(record), _fragmentation_finding(record), _churn_finding(record)):
        if finding is not None:
            found.append(finding)
    found.extend(_capacity_findings(record))
    utilization = _utilization_finding(record)
    if utilization is not None:
        found.append(utilization)
    for finding in found:
        if finding.test is None:
            finding.test = record.test_id
    return found


def oom_verdict(event: OomEvent) -> Tuple[frag.OomVerdict, Optional[frag.SnapshotMetrics]]:
    """Fragmentation or exhaustion, judged from what the observer gathered."""
    metrics = frag.analyze(event.segments) if event.segments is not None else None
    stats = event.stats or AllocatorStats()
    conf = event.alloc_conf or (event.settings.get("PYTORCH_CUDA_ALLOC_CONF") or None)
    expandable = event.settings.get("expandable_segments")
    verdict = frag.oom_verdict(
        event.alloc,
        stats.reserved,
        stats.allocated,
        metrics,
        stream=event.stream,
        cap=event.device_total,
        device_free=event.device_free,
        process_used=event.process_used,
        other_processes_used=event.others_used,
        current_conf=conf,
        expandable=None if expandable is None else bool(expandable),
    )
    return verdict, metrics


def _oom_findings(record: MemoryRecord) -> List[Finding]:
    by_key: Dict[Tuple[str, Optional[str], Optional[int]], Finding] = {}
    for event in record.ooms:
        verdict, metrics = oom_verdict(event)
        top = event.stack[0] if event.stack else None
        key = (verdict.cause, top.file if top else None, top.line if top else None)
        if key in by_key:
            by_key[key].count += 1
            by_key[key].details["steps"].append(event.step)
            continue
        details = verdict.to_json()
        stats = event.stats or AllocatorStats()
        details.update(
            {
                "device": event.device,
                "stream": event.stream,
                "active_bytes": stats.active,
                "inactive_split_bytes": stats.inactive_split_bytes,
                "slack": round(stats.slack, 4),
                "observer_args": {
                    "device": event.device,
                    "alloc": event.alloc,
                    "device_total": event.device_total,
                    "device_free": event.device_free,
                },
                "allocator_settings": compact_settings(event.settings),
                "snapshot": metrics.to_json() if metrics is not None else None,
                "steps": [event.step],
            }
        )
        if verdict.cause == frag.FRAGMENTATION and not verdict.expandable:
            details["empty_cache_helps"] = False
        by_key[key] = Finding(
            kind=OOM,
            severity="error",
            message=verdict.message(),
            file=top.file if top else None,
            line=top.line if top else None,
            function=top.function if top else None,
            stack=list(event.stack),
            fix_hint=verdict.fix_hint(),
            details=details,
        )
    return list(by_key.values())


def fragmented_states(record: MemoryRecord) -> List[Dict[str, Any]]:
    """The snapshots judged fragmented, the worst of each category: evidence, never findings alone."""
    worst: Dict[str, Tuple[SnapshotRecord, frag.FragmentationVerdict]] = {}
    seen: Dict[str, int] = {}
    for snapshot in record.snapshots:
        verdict = snapshot.verdict
        if verdict is None:
            continue
        seen[verdict.category] = seen.get(verdict.category, 0) + 1
        best = worst.get(verdict.category)
        if best is None or verdict.free_bytes > best[1].free_bytes:
            worst[verdict.category] = (snapshot, verdict)
    states = []
    for category, (snapshot, verdict) in worst.items():
        overall = snapshot.metrics.overall
        states.append(
            {
                "category": category,
                "reason": verdict.reason,
                "trigger": snapshot.reason,
                "step": snapshot.step,
                "seen": seen[category],
                "free_bytes": verdict.free_bytes,
                "reserved_bytes": overall.reserved,
                "allocated_bytes": overall.allocated,
                "largest_free_block_bytes": overall.largest_free,
                "external_fragmentation": round(overall.external_fragmentation, 4),
            }
        )
    return states


def new_segment_waste(record: MemoryRecord) -> List[Dict[str, Any]]:
    """Each allocating line that made the allocator map a segment while its pool held the memory."""
    entries = []
    for event in sorted(record.waste, key=lambda e: -e.waste.pool_free):
        top = event.site[0] if event.site else None
        entries.append(
            {
                "file": top.file if top else None,
                "line": top.line if top else None,
                "function": top.function if top else None,
                "count": event.count,
                "step": event.step,
                "site_observed": event.seen_by if top else None,
                **event.waste.to_json(),
            }
        )
    return entries


def _excess(record: MemoryRecord) -> Optional[Tuple[int, int, float]]:
    """(peak reserved, peak allocated, ratio) when reserved was well above allocated at the peak."""
    peak_reserved, _ = record.peak("reserved")
    peak_allocated, _ = record.peak("allocated")
    if peak_allocated <= 0:
        return None
    ratio = peak_reserved / peak_allocated
    if ratio >= RESERVED_OVER_ALLOCATED and peak_reserved - peak_allocated >= MIN_EXCESS_BYTES:
        return peak_reserved, peak_allocated, ratio
    return None


def _stepped(samples: Sequence[Tuple[Optional[int], int, int, int, int]]) -> List[Tuple[int, int, int, int, int]]:
    """The steady-state samples whose step is known: (step, reserved, allocated, mallocs, frees)."""
    return [
        (step, reserved, allocated, mallocs, frees)
        for step, reserved, allocated, mallocs, frees in samples
        if step is not None
    ]


def _growth(record: MemoryRecord) -> Optional[Dict[str, Any]]:
    """Reserved memory growing through the steady state while allocated memory does not."""
    samples = _stepped(record.steady_samples)
    if len(samples) < MIN_GROWTH_SAMPLES + 1:
        return None
    first, last = samples[0], samples[-1]
    growth = last[1] - first[1]
    if growth < max(MIN_GROWTH_BYTES, MIN_GROWTH_FRACTION * first[1]):
        return None
    rises = [b[0] for a, b in zip(samples, samples[1:]) if b[1] > a[1]]
    span = max(1, last[0] - first[0])
    if len(rises) < MIN_GROWTH_SAMPLES or rises[-1] - rises[0] < span / 2:
        return None  # one jump (a new shape, an evaluation's activations) is not growth
    half = len(samples) // 2
    allocated_growth = max(s[2] for s in samples[half:]) - max(s[2] for s in samples[:half])
    if allocated_growth * 2 >= growth:
        return None  # live tensors grew with it: not the allocator's waste
    return {
        "growth_bytes": growth,
        "growth_steps": span,
        "growth_samples": len(rises),
        "reserved_at_start_bytes": first[1],
        "reserved_at_end_bytes": last[1],
        "allocated_growth_bytes": max(0, allocated_growth),
    }


def _fragmentation_finding(record: MemoryRecord) -> Optional[Finding]:
    """Fragmentation the run paid for: memory held beyond what tensors used, or reserved memory growing."""
    excess, growth = _excess(record), _growth(record)
    if excess is None and growth is None:
        return None
    waste = new_segment_waste(record)
    worst = worst_snapshot(record)
    costs, parts = [], []
    details: Dict[str, Any] = {}
    if excess is not None:
        peak_reserved, peak_allocated, ratio = excess
        costs.append("reserved-over-allocated")
        parts.append(
            f"peak reserved memory {frag.format_bytes(peak_reserved)} is {ratio:.1f}x peak allocated "
            f"{frag.format_bytes(peak_allocated)}: {frag.format_bytes(peak_reserved - peak_allocated)} "
            f"held by the allocator with no tensor in it at the peak"
        )
        details.update(
            {
                "peak_reserved_bytes": peak_reserved,
                "peak_allocated_bytes": peak_allocated,
                "reserved_over_allocated": round(ratio, 3),
                "excess_bytes": peak_reserved - peak_allocated,
            }
        )
    if growth is not None:
        costs.append("reserved-growth")
        parts.append(
            f"reserved memory grew {frag.format_bytes(growth['growth_bytes'])} over "
            f"{growth['growth_steps']} steady-state steps while allocated memory did not"
        )
        details.update(growth)
    if waste:
        parts.append(f"new segments were mapped while their pool held free memory ({len(waste)} line(s))")
    if worst is not None:
        parts.append(
            f"{frag.format_bytes(worst.metrics.free_by_category[frag.HARD])} lay free between live blocks "
            f"at the most fragmented state"
        )
    expandable = bool(worst is not None and worst.metrics.expandable)
    suggested, alternatives = frag.suggest_alloc_conf(
        record.alloc_conf, expandable=expandable, cause=frag.FRAGMENTATION
    )
    hint = f"set PYTORCH_ALLOC_CONF={suggested}" if suggested else "free long-lived tensors together"
    hint += "; or allocate long-lived tensors before the short-lived ones around them"
    end = record.end_stats or AllocatorStats()
    start = record.start_stats or AllocatorStats()
    details.update(
        {
            "cost": costs,
            "num_alloc_retries": end.num_alloc_retries - start.num_alloc_retries,
            "new_segment_waste": waste[:10],
            "fragmented_states": fragmented_states(record),
            "suggested_alloc_conf": suggested,
            "alternatives": alternatives,
        }
    )
    if worst is not None:
        details["snapshot"] = worst.metrics.to_json()
        details["allocator_settings"] = compact_settings(worst.settings)
    # Placed at the allocating line that wasted the most, where there is one.
    largest = max(record.waste, key=lambda event: event.waste.pool_free) if record.waste else None
    top = largest.site[0] if largest is not None and largest.site else None
    return Finding(
        kind=FRAGMENTATION,
        severity="warning",
        message="fragmentation that cost memory: " + "; ".join(parts),
        file=top.file if top else None,
        line=top.line if top else None,
        function=top.function if top else None,
        stack=list(largest.site) if largest is not None and top else [],
        count=1,
        fix_hint=hint,
        details=details,
    )


def worst_snapshot(record: MemoryRecord) -> Optional[SnapshotRecord]:
    """The most fragmented state seen: the snapshot with the most free memory between live blocks."""
    best = None
    for snapshot in record.snapshots:
        hard = snapshot.metrics.free_by_category[frag.HARD]
        if hard > 0 and (best is None or hard > best.metrics.free_by_category[frag.HARD]):
            best = snapshot
    return best


def _retry_finding(record: MemoryRecord) -> Optional[Finding]:
    start, end = record.start_stats, record.end_stats
    if start is None or end is None:
        return None
    ooms = end.num_ooms - start.num_ooms
    # Every OOM is preceded by a retry; those are reported as the OOM.
    retries = (end.num_alloc_retries - start.num_alloc_retries) - ooms
    if retries <= 0:
        return None
    return Finding(
        kind=ALLOC_RETRY,
        severity="warning",
        message=(
            f"{retries} allocation retr{'y' if retries == 1 else 'ies'}: cudaMalloc failed, the allocator "
            f"synchronized all streams, freed its cache and retried"
        ),
        count=retries,
        fix_hint=(
            "memory is near the limit or fragmented: set PYTORCH_ALLOC_CONF=expandable_segments:True "
            "or lower peak memory"
        ),
        details={
            "num_alloc_retries": retries,
            "num_sync_all_streams": end.num_sync_all_streams - start.num_sync_all_streams,
            "steps": [s for s in record.retry_steps if s is not None][:20],
            "reserved_bytes": end.reserved,
            "allocated_bytes": end.allocated,
            "fragmented_states": fragmented_states(record),
        },
    )


def _churn_finding(record: MemoryRecord) -> Optional[Finding]:
    if record.baseline is None:
        return None
    end = record.end_stats
    base = record.baseline[0]
    steps = record.measured_steps
    if end is None or steps < CHURN_MIN_STEPS:
        return None
    mallocs = end.num_device_alloc - base.num_device_alloc
    frees = end.num_device_free - base.num_device_free
    if mallocs < CHURN_MIN_EVENTS or frees < CHURN_MIN_EVENTS or (mallocs + frees) / steps < CHURN_MIN_PER_STEP:
        return None
    sustained = _sustained_churn(record)
    if sustained is None:
        return None  # a burst: a new shape, an epoch's last batch, autotuning
    return Finding(
        kind=ALLOC_CHURN,
        severity="warning",
        message=(
            f"cudaMalloc/cudaFree churn after warm-up: {mallocs} mallocs and {frees} frees over {steps} steps "
            f"({(mallocs + frees) / steps:.2f} per step); each cudaFree synchronizes the device"
        ),
        count=mallocs + frees,
        fix_hint=(
            "keep the cache warm: no torch.cuda.empty_cache() in the loop, stable tensor shapes, "
            "or PYTORCH_ALLOC_CONF=expandable_segments:True"
        ),
        details={
            "num_device_alloc": mallocs,
            "num_device_free": frees,
            "steps": steps,
            "per_step": round((mallocs + frees) / steps, 3),
            "sampled_intervals_with_growth": record.churn_intervals,
            **sustained,
            "num_alloc_retries": end.num_alloc_retries - base.num_alloc_retries,
        },
    )


def _sustained_churn(record: MemoryRecord) -> Optional[Dict[str, Any]]:
    """Where cudaMalloc and cudaFree kept coming through the steady state: most sampled intervals, over half of it."""
    samples = _stepped(record.steady_samples[1:])
    if not samples:
        return None
    churning = [sample[0] for sample in samples if sample[3] > 0 or sample[4] > 0]
    first_step, last_step = record.steady_samples[0][0] or 0, samples[-1][0]
    span = max(1, last_step - first_step)
    if (
        len(churning) < CHURN_MIN_INTERVALS
        or len(churning) < CHURN_MIN_INTERVAL_SHARE * len(samples)
        or churning[-1] - churning[0] < span / 2
    ):
        return None
    return {"churning_intervals": len(churning), "sampled_intervals": len(samples)}


def _capacity_findings(record: MemoryRecord) -> List[Finding]:
    found: List[Finding] = list(record.nvml_findings)
    has_nvml_capacity = any(f.kind == NEAR_CAPACITY for f in record.nvml_findings)
    peak_reserved, exact = record.peak("reserved")
    cap = record.cap
    if not has_nvml_capacity and cap and peak_reserved >= NEAR_CAP_FRACTION * cap:
        found.append(
            Finding(
                kind=NEAR_CAPACITY,
                severity="info",
                message=(
                    f"reserved memory peaked at {peak_reserved / cap:.0%} of the "
                    f"{frag.format_bytes(cap)} this process may use"
                ),
                fix_hint="little headroom left: an input of another shape may OOM; reduce peak memory",
                details={
                    "source": "allocator",
                    "peak_reserved_bytes": peak_reserved,
                    "peak_exact": exact,
                    "cap_bytes": cap,
                    "device_total_bytes": record.device_total,
                    "threshold_fraction": NEAR_CAP_FRACTION,
                },
            )
        )
    return found


def _utilization_finding(record: MemoryRecord) -> Optional[Finding]:
    """The GPU starved during steady-state training, the other phases named with their time."""
    if record.phases is None:
        return None
    facts = low_utilization(record.phases)
    if facts is None:
        return None
    others = [
        f"{name} {seconds:.1f} s"
        for name, seconds in record.phases.seconds.items()
        if name != STEADY and seconds >= 0.05
    ]
    excluded = f"; not counted: {', '.join(others)}" if others else ""
    return Finding(
        kind=LOW_UTILIZATION,
        severity="warning",
        message=(
            f"GPU busy only {facts['utilization_mean_percent']:.0f}% of the steady-state training time "
            f"({facts['steady_steps']} steps, {facts['steady_seconds']:.1f} s, {facts['samples']} NVML samples): "
            f"the GPU waits on the host{excluded}"
        ),
        fix_hint=(
            "feed the GPU faster: DataLoader(num_workers>0, pin_memory=True), larger batches, "
            "fewer host syncs, CUDA graphs or torch.compile for launch-bound steps"
        ),
        details={
            **facts,
            "phases": record.phases.to_json(),
            "note": "NVML utilization.gpu: share of time any kernel ran, device-wide (not SM occupancy)",
        },
    )


def memory_summary(record: MemoryRecord) -> Dict[str, Any]:
    """Plain data for the report: peaks, counters over the session, metrics."""
    if record.inactive_reason is not None:
        return {"available": False, "reason": record.inactive_reason}
    start, end = record.start_stats, record.end_stats
    data: Dict[str, Any] = {"available": True, "samples": record.samples, "snapshots": len(record.snapshots)}
    if record.error:
        data["error"] = record.error
    if start is None or end is None:
        data["reason"] = "CUDA was never initialized"
        return data
    peak_allocated, allocated_exact = record.peak("allocated")
    peak_reserved, reserved_exact = record.peak("reserved")
    data.update(
        {
            "peak_allocated_bytes": peak_allocated,
            "peak_reserved_bytes": peak_reserved,
            "peak_exact": allocated_exact and reserved_exact,
            "allocated_bytes": end.allocated,
            "reserved_bytes": end.reserved,
            "reserved_unallocated_bytes": end.reserved_unallocated,
            "slack": round(end.slack, 4),
            "inactive_split_bytes": end.inactive_split_bytes,
            "inactive_split_blocks": end.inactive_split,
            "non_releasable": round(end.inactive_split_bytes / end.reserved, 4) if end.reserved else 0.0,
            "cap_bytes": record.cap,
            "device_total_bytes": record.device_total,
            "min_device_free_bytes": record.min_device_free,
            "num_alloc_retries": end.num_alloc_retries - start.num_alloc_retries,
            "num_ooms": end.num_ooms - start.num_ooms,
            "num_sync_all_streams": end.num_sync_all_streams - start.num_sync_all_streams,
            "num_device_alloc": end.num_device_alloc - start.num_device_alloc,
            "num_device_free": end.num_device_free - start.num_device_free,
            "measured_steps": record.measured_steps,
        }
    )
    # Peaks observed while the program ran (the watcher, steps, the program's end).
    data["observed_peak_reserved_bytes"] = record.observed_peak_reserved
    data["observed_peak_allocated_bytes"] = record.observed_peak_allocated
    if record.snapshots:
        last = record.snapshots[-1]
        data["fragmentation"] = {"trigger": last.reason, "step": last.step, **last.metrics.to_json()}
    worst = worst_snapshot(record)
    if worst is not None:
        overall = worst.metrics.overall
        suggested, _ = frag.suggest_alloc_conf(
            record.alloc_conf, expandable=worst.metrics.expandable, cause=frag.FRAGMENTATION
        )
        data["worst_fragmentation"] = {
            "trigger": worst.reason,
            "step": worst.step,
            "reserved_bytes": overall.reserved,
            "allocated_bytes": overall.allocated,
            "free_between_live_blocks_bytes": worst.metrics.free_by_category[frag.HARD],
            "largest_free_block_bytes": overall.largest_free,
            "external_fragmentation": round(overall.external_fragmentation, 4),
            "suggested_alloc_conf": suggested,
        }
    # The evidence of fragmentation, findings only beside a cost (the module docstring).
    data["fragmented_states"] = fragmented_states(record)
    data["new_segment_waste"] = new_segment_waste(record)[:20]
    if record.internal_errors:
        data["internal_errors"] = record.internal_errors
    if record.nvml_summary is not None:
        data["nvml"] = record.nvml_summary
    return data


def compact_settings(settings: Mapping[str, Any]) -> Dict[str, Any]:
    """The allocator settings worth a report line (roundup tables dropped)."""
    keep = ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments", "max_split_size", "garbage_collection_threshold")
    return {key: settings[key] for key in keep if key in settings}
