"""Memory judged by what it cost: recorded allocator states of healthy and unhealthy runs (issue #32).

Each record is what the memory check froze at the end of a run
(``memory/record.py``); ``memory/verdicts.py`` judges it without torch. The
healthy runs are the issue's: a GPT whose allocator held 1.5 GB above its
tensors with 3 GiB in gaps between live blocks, a small language model on a
141 GB device, a GAN epoch whose last batch changed shape. Each must be
silent, with its gap figures still in the summary.
"""
import dataclasses

import pytest

from torchlint.sanitizer.findings import Frame
from torchlint.sanitizer.memory import fragmentation as frag
from torchlint.sanitizer.memory.allocator import AllocatorStats
from torchlint.sanitizer.memory.record import MemoryRecord, SnapshotRecord, WasteEvent
from torchlint.sanitizer.memory.verdicts import memory_findings, memory_summary

MiB = 1 << 20
GiB = 1 << 30


def gapped_segment(live_mib, gap_mib, pairs, address=0x10000000):
    """A segment of ``pairs`` live blocks, each followed by a free gap: hard fragmentation."""
    blocks = []
    for _ in range(pairs):
        blocks.append({"size": live_mib * MiB, "requested_size": live_mib * MiB, "state": "active_allocated"})
        blocks.append({"size": gap_mib * MiB, "requested_size": 0, "state": "inactive"})
    return {"address": address, "total_size": pairs * (live_mib + gap_mib) * MiB, "stream": 0,
            "segment_type": "large", "blocks": blocks}


def snapshot_of(segments, reason="program-end", step=None):
    metrics = frag.analyze(segments)
    return SnapshotRecord(reason, step, metrics, frag.judge(metrics), {"expandable_segments": False}, None)


def record(peak_reserved, peak_allocated, *, retries=0, mallocs=0, frees=0, snapshots=(), waste=(),
           steady=(), baseline_step=2, last_step=100, total=141 * GiB):
    start = AllocatorStats()
    end = AllocatorStats(allocated=peak_allocated // 2, reserved=peak_reserved, allocated_peak=peak_allocated,
                         reserved_peak=peak_reserved, num_alloc_retries=retries, num_device_alloc=mallocs,
                         num_device_free=frees)
    base = dataclasses.replace(end, num_device_alloc=steady[0][3] if steady else 0,
                               num_device_free=steady[0][4] if steady else 0) if steady else start
    return MemoryRecord(
        inactive_reason=None, error=None, samples=len(steady), start_stats=start, end_stats=end,
        baseline=(base, baseline_step), last_step=last_step, cap=total, device_total=total,
        min_device_free=total - peak_reserved, observed_peak_reserved=peak_reserved,
        observed_peak_allocated=peak_allocated, retry_steps=(), churn_intervals=0,
        steady_samples=tuple(steady), snapshots=tuple(snapshots), ooms=(), waste=tuple(waste),
        alloc_conf=None, nvml_findings=(), nvml_summary=None, internal_errors=None, test_id=None, phases=None,
    )


def steady(steps, reserved, allocated, churn_at=()):
    """One sample per step: (step, reserved, allocated, mallocs, frees); churn at the given steps."""
    return [(step, reserved(step), allocated(step), 1 if step in churn_at else 0, 1 if step in churn_at else 0)
            for step in steps]


# -- healthy runs: silent, on any GPU size ---------------------------------------------------

def test_a_gpt_run_with_gaps_between_live_blocks_but_no_cost_is_silent():
    """9.6 GB reserved against 8.1 GB allocated, 0 retries, 43 mallocs and 0 frees, 3 GiB in gaps."""
    gaps = snapshot_of([gapped_segment(live_mib=40, gap_mib=30, pairs=100)])
    assert gaps.verdict is not None and gaps.verdict.category == frag.HARD  # the old finding's evidence
    run = record(int(9.6e9), int(8.1e9), mallocs=43, snapshots=[gaps],
                 steady=steady(range(2, 101, 5), lambda s: int(9.6e9), lambda s: int(8.1e9)))
    assert memory_findings(run) == []
    summary = memory_summary(run)
    assert summary["worst_fragmentation"]["free_between_live_blocks_bytes"] == 3000 * MiB  # kept in the JSON
    assert summary["fragmented_states"][0]["category"] == frag.HARD


def test_a_small_language_model_on_a_large_device_is_silent():
    """0.28 GB reserved on a 141 GB device, 68 MiB between live blocks."""
    gaps = snapshot_of([gapped_segment(live_mib=2, gap_mib=2, pairs=34)])
    run = record(int(0.28e9), int(0.2e9), snapshots=[gaps], total=141 * GiB)
    assert memory_findings(run) == []


def test_churn_at_a_gan_epochs_last_batch_is_a_burst_not_churn():
    """16 steps, the last batch a new shape under cudnn.benchmark: mallocs and frees at the end only."""
    samples = steady(range(2, 17), lambda s: 512 * MiB, lambda s: 300 * MiB, churn_at={15, 16})
    run = record(512 * MiB, 300 * MiB, mallocs=6, frees=4, steady=samples, last_step=16)
    assert [f.kind for f in memory_findings(run)] == []


def test_one_jump_of_reserved_memory_is_not_growth():
    """An evaluation's activations: one new segment, then steady."""
    samples = steady(range(2, 101), lambda s: 2 * GiB if s < 50 else 3 * GiB, lambda s: 1500 * MiB)
    assert memory_findings(record(3 * GiB, 2500 * MiB, steady=samples)) == []


# -- runs that paid ----------------------------------------------------------------------------------

def test_reserved_well_above_allocated_is_a_finding_with_the_ratio_and_the_bytes_at_the_allocating_line():
    waste = frag.NewSegmentWaste(address=0x20000000, request=2 * GiB, segment_bytes=2 * GiB, pool_free=4 * GiB,
                                 pool_largest_free=512 * MiB, pool_segments=6, stream=0, pool="large")
    event = WasteEvent(waste=waste, site=(Frame("/u/cache.py", 31, "build"),), record=None,
                       stats=AllocatorStats(reserved=12 * GiB, allocated=6 * GiB), count=3, step=40, seen_by="x")
    run = record(12 * GiB, 6 * GiB, waste=[event], snapshots=[snapshot_of([gapped_segment(40, 30, 100)])])
    (finding,) = memory_findings(run)
    assert (finding.kind, finding.severity, finding.file, finding.line) == ("fragmentation", "warning", "/u/cache.py", 31)
    assert finding.details["reserved_over_allocated"] == 2.0 and finding.details["excess_bytes"] == 6 * GiB
    assert "12.00 GiB is 2.0x peak allocated 6.00 GiB: 6.00 GiB held by the allocator" in finding.message
    assert finding.details["new_segment_waste"][0]["line"] == 31
    assert "expandable_segments:True" in finding.fix_hint


def test_reserved_memory_growing_through_the_steady_state_while_allocated_stays_is_a_finding():
    samples = steady(range(2, 101), lambda s: 2 * GiB + s * 16 * MiB, lambda s: 1 * GiB)
    (finding,) = memory_findings(record(2 * GiB + 1600 * MiB, 1 * GiB + 600 * MiB, steady=samples))
    assert finding.details["cost"][-1] == "reserved-growth"
    assert finding.details["growth_bytes"] == 98 * 16 * MiB and finding.details["growth_steps"] == 98
    assert "grew 1.53 GiB over 98 steady-state steps while allocated memory did not" in finding.message


def test_reserved_growing_with_live_tensors_is_not_the_allocators_waste():
    samples = steady(range(2, 101), lambda s: 2 * GiB + s * 16 * MiB, lambda s: 1 * GiB + s * 16 * MiB)
    assert [f for f in memory_findings(record(4 * GiB, 3 * GiB, steady=samples)) if f.kind == "fragmentation"] == []


def test_sustained_malloc_free_churn_through_the_steady_state_is_a_finding():
    samples = steady(range(2, 101), lambda s: GiB, lambda s: 800 * MiB, churn_at=set(range(3, 101)))
    (finding,) = memory_findings(record(GiB, 800 * MiB, mallocs=98, frees=98, steady=samples))
    assert finding.kind == "alloc-churn" and finding.details["churning_intervals"] == 98


def test_allocation_retries_are_a_cost_with_the_fragmented_state_as_evidence():
    run = record(40 * GiB, 30 * GiB, retries=3, snapshots=[snapshot_of([gapped_segment(40, 30, 100)], "alloc-retry")])
    (finding,) = memory_findings(run)
    assert finding.kind == "alloc-retry" and finding.count == 3
    assert finding.details["fragmented_states"][0]["trigger"] == "alloc-retry"


@pytest.mark.parametrize("reserved, allocated", [(int(9.6e9), int(8.1e9)), (700 * MiB, 200 * MiB)])
def test_the_excess_needs_both_the_ratio_and_the_bytes(reserved, allocated):
    assert memory_findings(record(reserved, allocated)) == []
