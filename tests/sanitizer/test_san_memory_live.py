"""Memory observed while it happens: a new segment judged as it is mapped, the program's end, no steps at all.

Every test here drives MemoryCheck without a single optimizer step (the
issue's case: a script that only allocates), with the fake allocator of
test_san_memory.py.
"""
import warnings

import pytest

from torchlint.sanitizer.memory import fragmentation as frag
from torchlint.sanitizer.memory import check as memory
from torchlint.sanitizer.findings import FRAGMENTATION
from torchlint.sanitizer.timeline import Timeline

from test_san_memory import FakeSource, MiB, fresh_observer, make  # noqa: F401  (the autouse fixture)

# The segments' unit: 16 MiB, so the waste clears the judge's floors (64 MiB and a quarter of reserved).
UNIT = 16 * MiB


def segment(address, blocks, stream=0, pool="large", unit=UNIT):
    """A snapshot segment from (size_mib, state) pairs, laid out from ``address``."""
    return {
        "address": address,
        "total_size": sum(size for size, _ in blocks) * unit,
        "stream": stream,
        "segment_type": pool,
        "blocks": [
            {"size": size * unit, "requested_size": size * unit,
             "state": "active_allocated" if state == "live" else "inactive"}
            for size, state in blocks
        ],
    }


# Long-lived small blocks pin a 20-unit segment: 12 units free, in 6-unit gaps.
PINNED_LAYOUT = [(2, "live"), (6, "free"), (2, "live"), (6, "free"), (4, "live")]
PINNED = segment(0x10000000, PINNED_LAYOUT)
# The 8-unit request that could not use the gaps, in a new segment.
NEW_LAYOUT = [(8, "live"), (12, "free")]
NEW = segment(0x20000000, NEW_LAYOUT)


def test_a_new_segment_mapped_while_the_pool_had_enough_free_memory_in_gaps_is_waste():
    (waste,) = frag.new_segment_waste([PINNED, NEW], known={PINNED["address"]})
    assert (waste.request, waste.pool_free, waste.pool_largest_free) == (8 * UNIT, 12 * UNIT, 6 * UNIT)
    assert "192.00 MiB lay free" in waste.message()


def test_no_waste_when_a_free_block_fits_when_too_little_is_free_or_on_another_stream():
    roomy = segment(0x10000000, [(2, "live"), (10, "free"), (8, "live")])
    assert frag.new_segment_waste([roomy, NEW], known={roomy["address"]}) == []  # largest free block fits
    tight = segment(0x10000000, [(2, "live"), (4, "free"), (14, "live")])
    assert frag.new_segment_waste([tight, NEW], known={tight["address"]}) == []  # not enough free
    other_stream = dict(PINNED, stream=0x77)
    assert frag.new_segment_waste([other_stream, NEW], known={PINNED["address"]}) == []
    assert frag.new_segment_waste([PINNED, NEW], known={PINNED["address"], NEW["address"]}) == []


def _allocating_program(source, check, unit=UNIT):
    """Pins the first segment, then asks for 8 units: the allocator maps a second one."""
    pinned = segment(PINNED["address"], PINNED_LAYOUT, unit=unit)
    source.segments = [pinned]
    source.bump(reserved=20 * unit, allocated=8 * unit, segments=1, num_device_alloc=1)
    check._watch_tick()
    source.segments = [pinned, segment(NEW["address"], NEW_LAYOUT, unit=unit)]
    source.bump(reserved=40 * unit, allocated=16 * unit, segments=2, num_device_alloc=2)
    check._watch_tick()  # the allocating line: this one


def _waste(check):
    return check.summary()["new_segment_waste"]


def test_waste_is_recorded_at_the_allocating_line_and_places_the_finding_when_the_run_paid_for_it():
    """No step at all; reserved ends 2.5x allocated, 768 MiB above it: a cost, placed where the segment was mapped."""
    check, sess, source, clock = make(FakeSource(segments=[]))
    check.start()
    _allocating_program(source, check, unit=2 * UNIT)
    check.stop()
    (waste,) = _waste(check)
    assert waste["file"].endswith("test_san_memory_live.py")
    assert "the allocating line: this one" in open(waste["file"]).read().splitlines()[waste["line"] - 1]
    assert (waste["request_bytes"], waste["pool_free_bytes"]) == (16 * UNIT, 24 * UNIT)
    (finding,) = check.findings()
    assert finding.kind == FRAGMENTATION and (finding.file, finding.line) == (waste["file"], waste["line"])
    assert finding.details["cost"] == ["reserved-over-allocated"]
    assert (finding.details["reserved_over_allocated"], finding.details["excess_bytes"]) == (2.5, 48 * UNIT)
    assert "2.5x peak allocated" in finding.message
    assert finding.details["suggested_alloc_conf"] == "expandable_segments:True"
    assert "PYTORCH_ALLOC_CONF=expandable_segments:True" in finding.fix_hint


def test_the_same_waste_that_cost_the_run_little_is_evidence_not_a_finding():
    """384 MiB above allocated: the gaps stay in the report, and the run is silent."""
    check, sess, source, clock = make(FakeSource(segments=[]))
    check.start()
    _allocating_program(source, check)
    check.stop()
    assert check.findings() == []
    assert _waste(check)[0]["pool_free_bytes"] == 12 * UNIT


def test_a_few_mib_free_in_split_blocks_during_warm_up_is_not_even_evidence():
    """The allocator's ordinary caching: the same pattern at 1/16 the size stays under the floors."""
    check, sess, source, clock = make(FakeSource(segments=[]))
    check.start()
    _allocating_program(source, check, unit=MiB)
    check.stop()
    assert _waste(check) == [] and check.findings() == []


def make_with_timeline(source, **timeline_options):
    """The check of a session that keeps a timeline, on the check's fake clock."""
    check, sess, source, clock = make(source)
    sess.timeline = Timeline(clock=clock, **timeline_options)
    return check, sess, source, clock


def test_a_segment_mapped_when_nothing_was_free_costs_no_judgement():
    check, sess, source, clock = make_with_timeline(FakeSource(segments=[]))
    check.start()
    full = segment(0x10000000, [(20, "live")])
    source.segments = [full]
    source.bump(reserved=20 * UNIT, allocated=20 * UNIT, segments=1, num_device_alloc=1)
    check._watch_tick()
    source.segments = [full, NEW]
    source.bump(reserved=40 * UNIT, allocated=28 * UNIT, segments=2, num_device_alloc=2)
    check._watch_tick()
    check.stop()
    assert _waste(check) == []
    segments = sess.timeline.to_json()["segments"]
    assert [(added, nbytes) for _, added, nbytes, *_ in segments] == [(1, 20 * UNIT), (1, 20 * UNIT)]
    assert "timeline" not in check.summary()  # the session's timeline is the one owner of the series


def test_the_program_end_snapshot_sees_what_the_session_end_no_longer_holds():
    check, sess, source, clock = make(FakeSource(segments=[]))
    check.start()
    # A 1 GiB segment: 700 MiB free in gaps between long-lived blocks, at the program's end.
    blocks = []
    for _ in range(100):
        blocks += [(3, "live"), (7, "free")]
    source.segments = [segment(0x10000000, blocks, unit=MiB)]
    source.bump(reserved=1000 * MiB, allocated=300 * MiB, segments=1, num_device_alloc=1)
    check.on_program_end()
    # The script's globals are gone: everything is free when the session ends.
    source.segments = [segment(0x10000000, [(1000, "free")])]
    source.bump(allocated=0)
    check.stop()
    (finding,) = [f for f in check.findings() if f.kind == FRAGMENTATION]  # 700 MiB held beyond 300 MiB used
    assert finding.details["cost"] == ["reserved-over-allocated"]
    (state,) = finding.details["fragmented_states"]
    assert (state["trigger"], state["category"]) == ("program-end", frag.HARD)
    summary = check.summary()
    assert summary["worst_fragmentation"]["trigger"] == "program-end"
    assert summary["worst_fragmentation"]["free_between_live_blocks_bytes"] == 700 * MiB
    assert summary["worst_fragmentation"]["suggested_alloc_conf"] == "expandable_segments:True"
    assert summary["observed_peak_reserved_bytes"] == 1000 * MiB
    assert summary["observed_peak_allocated_bytes"] == 300 * MiB


def test_the_watcher_feeds_the_timeline_without_a_step_and_the_curve_stays_bounded():
    check, sess, source, clock = make_with_timeline(FakeSource(segments=[]), max_memory_rows=8)
    check.start()
    for index in range(1, 41):
        clock.now = index * 0.02
        source.bump(allocated=index * MiB, reserved=2 * index * MiB, segments=index, num_device_alloc=index)
        check._watch_tick()
        check._watch_tick()  # an unchanged look stores nothing
    source.bump(allocated=0)  # the script's tensors are gone
    clock.now = 0.9
    check.stop()
    data = sess.timeline.to_json()
    rows = data["memory"]
    assert len(rows) <= 8 + 2  # the stored rows, the one filling up, the last look
    assert [row[0] for row in rows] == sorted(row[0] for row in rows)
    assert rows[0][0] == 0.02 and rows[-1] == [0.9, 0, 80 * MiB, 40, 0]  # the whole span and the end state
    assert max(row[2] for row in rows) == 80 * MiB and max(row[1] for row in rows) == 40 * MiB  # the peaks
    assert all(row[4] == 0 for row in rows)  # no step ever completed
    # Every changed look is a row or merged into one (the last look can be both: inside a merged row and the end).
    assert 41 - len(rows) <= data["dropped"]["memory"] <= 41 - len(rows) + 1
    assert len(data["segments"]) == 40 and data["segments"][0][3] == __file__
    assert data["overhead_s"]["memory"] > 0  # the watcher's looks are the sanitizer's own time


def test_internal_errors_are_recorded_warned_and_reported_never_raised():
    class Broken(FakeSource):
        def snapshot(self, device=None):
            raise RuntimeError("snapshot changed shape")

    check, sess, source, clock = make(Broken(segments=[]))
    check.start()
    source.bump(reserved=20 * MiB, allocated=1 * MiB, segments=1, num_device_alloc=1)
    check._watch_tick()
    check.on_program_end()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check.stop()
    errors = check.summary()["internal_errors"]
    assert errors["count"] >= 2 and "snapshot changed shape" in errors["first"][0]
    assert any("memory check" in str(w.message) and "internal error" in str(w.message) for w in caught)


def test_the_allocator_history_gives_the_exact_allocating_line_when_recorded():
    class Recording(FakeSource):
        def segment_frames(self, address):
            if address == NEW["address"]:
                # torch's own file: a library frame by where the module comes from, not by its path
                import torch.nn.modules.linear as library

                return [(library.__file__, 125, "forward"),
                        ("/work/project/train.py", 42, "build_cache")]
            return None

    check, sess, source, clock = make(Recording(segments=[]))
    check.start()
    _allocating_program(source, check)
    check.stop()
    (waste,) = _waste(check)
    assert (waste["file"], waste["line"]) == ("/work/project/train.py", 42)
    assert waste["site_observed"] == "allocator history (exact)"


def test_a_recent_step_sample_stands_in_for_the_watchers_look():
    """While the program steps, the step sample's counters feed the look; the watcher reads nothing."""
    from test_san_memory import advance

    check, sess, source, clock = make_with_timeline(FakeSource(segments=[]))
    check.start()
    for _ in range(3):  # warm-up ends at step 2: the step sample runs
        advance(sess, check, clock, 0.06)
    reads = source.calls["stats"]
    assert sess.timeline.to_json()["memory"]  # the step sample's look reached the curve
    clock.now += 0.02
    assert check._watch_wake() is False and source.calls["stats"] == reads
    clock.now += 2 * check.sample_interval_s  # the steps stopped: the watcher looks again
    assert check._watch_wake() is True and source.calls["stats"] == reads + 1


def test_a_new_segment_seen_by_a_step_sample_is_judged_at_the_step():
    from test_san_memory import advance

    check, sess, source, clock = make(FakeSource(segments=[]))
    check.start()
    pinned = segment(PINNED["address"], PINNED_LAYOUT)
    source.segments = [pinned]
    source.bump(reserved=20 * UNIT, allocated=8 * UNIT, segments=1, num_device_alloc=1)
    for _ in range(3):
        advance(sess, check, clock, 0.06)
    source.segments = [pinned, NEW]
    source.bump(reserved=40 * UNIT, allocated=16 * UNIT, segments=2, num_device_alloc=2)
    advance(sess, check, clock, 0.06)
    check.stop()
    (waste,) = _waste(check)
    assert waste["site_observed"] == memory.SEEN_ON_MAIN_THREAD
    assert waste["step"] == 4 and waste["request_bytes"] == 8 * UNIT


def test_a_failing_step_sample_is_recorded_and_the_users_step_goes_on():
    from test_san_memory import advance

    check, sess, source, clock = make(FakeSource(segments=[]))
    check.start()
    source.fail_stats = True
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(3):
            advance(sess, check, clock, 0.06)  # would raise into optimizer.step() if the sample raised
        check.stop()
    errors = check.summary()["internal_errors"]
    assert any("step sample" in entry and "stats failed" in entry for entry in errors["first"])


def test_the_watcher_is_parked_while_step_samples_come():
    """While step samples come, the watcher wakes every PARKED_WAKE_S, not every WATCH_INTERVAL_S."""
    from test_san_memory import advance

    check, sess, source, clock = make_with_timeline(FakeSource(segments=[]))
    check.start()
    assert check._watch_sleep_s() == check.watch_interval_s  # no step sample yet: the plain interval
    for _ in range(3):  # warm-up ends at step 2: the step sample runs
        advance(sess, check, clock, 0.06)
    assert check._watch_sleep_s() == memory.PARKED_WAKE_S
    assert not check._watch_wake()  # a parked wake finds the step sample's look and reads nothing
    covered = memory.STEP_LOOK_COVERS_INTERVALS * check.sample_interval_s
    clock.now += covered  # the steps stopped: the next wake looks, and the watcher is back to its interval
    assert check._watch_sleep_s() == check.watch_interval_s
    assert check._watch_wake()
    check.stop()
