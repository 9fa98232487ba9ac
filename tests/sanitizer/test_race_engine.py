"""The happens-before engine on synthetic event sequences (no GPU, no torch)."""
from __future__ import annotations

import pytest

from torchlint.sanitizer.races.happens_before import (
    Access,
    Alloc,
    CaptureBegin,
    CaptureEnd,
    Collective,
    CollectiveStream,
    DeviceSync,
    EventRecord,
    EventSync,
    EventWait,
    Free,
    GraphReplay,
    HappensBefore,
    Kernel,
    RecordStream,
    StreamCreated,
    StreamSync,
    WaitStream,
    WorkWait,
)

DEFAULT, SIDE, THIRD = "default", "side", "third"


def write(start, end, arg="out", alloc=None):
    return Access(start, end, True, arg, alloc=alloc)


def read(start, end, arg="self", alloc=None):
    return Access(start, end, False, arg, alloc=alloc)


def k(stream, *accesses, op="op", site=None):
    return Kernel(stream, tuple(accesses), op, site if site is not None else op)


def races(events, **kwargs):
    return HappensBefore(**kwargs).run(events).races


# -- the basic relation ------------------------------------------------------


def test_unsynchronized_write_then_read_on_another_stream_races():
    found = races([k(DEFAULT, write(0, 100), op="rand"), k(SIDE, read(0, 100), op="mul")])
    assert len(found) == 1
    race = found[0]
    assert (race.earlier.stream, race.later.stream) == (DEFAULT, SIDE)
    assert (race.earlier.op, race.later.op) == ("rand", "mul")
    assert race.overlap == (0, 100)
    assert race.kind == "race"
    assert race.last_sync is None  # never synchronized


def test_read_read_is_never_a_race():
    assert races([k(DEFAULT, read(0, 100)), k(SIDE, read(0, 100))]) == []


def test_same_stream_is_program_ordered():
    assert races([k(SIDE, write(0, 100)), k(SIDE, write(0, 100)), k(SIDE, read(0, 10))]) == []


def test_write_after_read_on_another_stream_races():
    found = races([k(DEFAULT, read(0, 8)), k(SIDE, write(0, 8))])
    assert len(found) == 1 and not found[0].earlier.is_write and found[0].later.is_write


def test_write_write_races():
    assert len(races([k(DEFAULT, write(0, 8)), k(SIDE, write(4, 12))])) == 1


def test_disjoint_ranges_do_not_race():
    assert races([k(DEFAULT, write(0, 8)), k(SIDE, write(8, 16))]) == []


# -- each synchronization primitive, with its racy twin ----------------------


def test_wait_stream_orders_and_is_named_as_last_sync():
    events = [
        k(DEFAULT, write(0, 8)),
        WaitStream(SIDE, DEFAULT, site="sync-site"),
        k(SIDE, read(0, 8)),
    ]
    assert races(events) == []


def test_wait_stream_in_the_wrong_direction_does_not_order():
    events = [k(DEFAULT, write(0, 8)), WaitStream(DEFAULT, SIDE), k(SIDE, read(0, 8))]
    assert len(races(events)) == 1


def test_wait_stream_covers_only_work_issued_before_it():
    events = [
        k(DEFAULT, write(0, 8), op="first"),
        WaitStream(SIDE, DEFAULT, site="the-wait"),
        k(DEFAULT, write(0, 8), op="second"),
        k(SIDE, read(0, 8), op="reader"),
    ]
    (race,) = races(events)
    assert race.earlier.op == "second"
    assert race.last_sync is not None
    assert race.last_sync.kind == "wait_stream" and race.last_sync.site == "the-wait"
    assert race.last_sync.covered_seq < race.earlier.seq


def test_event_record_then_wait_orders():
    events = [
        k(SIDE, write(0, 8)),
        EventRecord("e", SIDE),
        EventWait("e", DEFAULT),
        k(DEFAULT, read(0, 8)),
    ]
    assert races(events) == []


def test_waiting_on_a_never_recorded_event_orders_nothing():
    events = [k(SIDE, write(0, 8)), EventWait("e", DEFAULT), k(DEFAULT, read(0, 8))]
    assert len(races(events)) == 1


def test_event_recorded_before_the_write_does_not_order_it():
    events = [
        EventRecord("done", SIDE, site="record-site"),
        k(SIDE, write(0, 8), op="copy_"),
        EventWait("done", DEFAULT, site="wait-site"),
        k(DEFAULT, read(0, 8), op="add"),
    ]
    (race,) = races(events)
    assert race.early_event is not None
    assert race.early_event.record_site == "record-site"
    assert race.early_event.site == "wait-site"


def test_re_recording_an_event_moves_it():
    events = [
        EventRecord("e", SIDE),
        k(SIDE, write(0, 8)),
        EventRecord("e", SIDE),
        EventWait("e", DEFAULT),
        k(DEFAULT, read(0, 8)),
    ]
    assert races(events) == []


def test_event_wait_uses_the_clock_at_record_time():
    events = [
        k(SIDE, write(0, 8), op="a"),
        EventRecord("e", SIDE),
        k(SIDE, write(8, 16), op="b"),
        EventWait("e", DEFAULT),
        k(DEFAULT, read(0, 16), op="r"),
    ]
    (race,) = races(events)
    assert race.earlier.op == "b" and race.overlap == (8, 16)


def test_stream_synchronize_orders_everything_after_it():
    events = [k(SIDE, write(0, 8)), StreamSync(SIDE), k(DEFAULT, read(0, 8)), k(THIRD, write(0, 8))]
    # the third stream's write still races with the default stream's read
    found = races(events)
    assert [(r.earlier.stream, r.later.stream) for r in found] == [(DEFAULT, THIRD)]


def test_syncing_the_wrong_stream_does_not_order():
    events = [k(SIDE, write(0, 8)), StreamSync(DEFAULT), k(DEFAULT, read(0, 8))]
    assert len(races(events)) == 1


def test_event_synchronize_orders_what_the_event_covers():
    events = [
        k(SIDE, write(0, 8)),
        EventRecord("e", SIDE),
        k(SIDE, write(8, 16)),
        EventSync("e"),
        k(DEFAULT, read(0, 16)),
    ]
    (race,) = races(events)
    assert race.overlap == (8, 16)


def test_device_synchronize_orders_all_streams_and_clears_history():
    engine = HappensBefore()
    engine.run([k(SIDE, write(0, 8)), k(THIRD, write(16, 24)), DeviceSync()])
    assert engine.segment_count() == 0
    engine.run([k(DEFAULT, read(0, 24))])
    assert engine.races == []


def test_a_stream_created_after_a_host_sync_inherits_it():
    events = [k(SIDE, write(0, 8)), StreamSync(SIDE), StreamCreated(THIRD), k(THIRD, read(0, 8))]
    assert races(events) == []


def test_a_new_stream_is_not_ordered_after_unsynchronized_work():
    assert len(races([k(DEFAULT, write(0, 8)), StreamCreated(SIDE), k(SIDE, read(0, 8))])) == 1


def test_ordering_is_transitive_through_a_third_stream():
    events = [
        k(SIDE, write(0, 8)),
        WaitStream(THIRD, SIDE),
        EventRecord("e", THIRD),
        EventWait("e", DEFAULT),
        k(DEFAULT, read(0, 8)),
    ]
    assert races(events) == []


# -- the eight cases of the issue, racy and synchronized ---------------------


def test_case1_classic_racy_and_synchronized():
    racy = [k(DEFAULT, write(0, 40000), op="rand"), k(SIDE, write(0, 40000), op="mul")]
    synced = [racy[0], WaitStream(SIDE, DEFAULT), racy[1]]
    assert len(races(racy)) == 1
    assert races(synced) == []


def test_case2_views_key_by_byte_range_not_pointer():
    base = 1 << 20
    # x[0:500] written on side, x[250:750] read on default (float32)
    racy = [k(SIDE, write(base, base + 2000)), k(DEFAULT, read(base + 1000, base + 3000))]
    (race,) = races(racy)
    assert race.overlap == (base + 1000, base + 2000)
    synced = [racy[0], WaitStream(DEFAULT, SIDE), racy[1]]
    assert races(synced) == []
    disjoint = [k(SIDE, write(base, base + 2000)), k(DEFAULT, read(base + 2000, base + 4000))]
    assert races(disjoint) == []


def _reuse_events(pledge: bool, sync: bool):
    engine = HappensBefore()
    old = engine.alloc(0, 4096, DEFAULT, site="old-alloc", label="x")
    engine.run([k(DEFAULT, write(0, 4096, alloc=old), op="fill"), WaitStream(SIDE, DEFAULT)])
    engine.run([k(SIDE, read(0, 4096, alloc=old), op="sum")])
    if pledge:
        engine.run([RecordStream(0, SIDE)])
    if sync:
        engine.run([WaitStream(DEFAULT, SIDE)])
    engine.run([Free(0)])
    new = engine.alloc(0, 2048, DEFAULT, site="new-alloc", label="y")
    engine.run([k(DEFAULT, write(0, 2048, alloc=new), op="zero_")])
    return engine.races


def test_case3_allocator_reuse_without_record_stream_is_a_reuse_race():
    (race,) = _reuse_events(pledge=False, sync=False)
    assert race.kind == "reuse"
    assert race.earlier.alloc.site == "old-alloc" and race.later.alloc.site == "new-alloc"
    assert race.earlier.op == "sum" and race.overlap == (0, 2048)


def test_case3_record_stream_is_a_pledge_honoured_at_free():
    assert _reuse_events(pledge=True, sync=False) == []


def test_case3_a_sync_before_free_is_also_fine():
    assert _reuse_events(pledge=False, sync=True) == []


def test_record_stream_pledge_is_dropped_when_the_block_is_reallocated():
    engine = HappensBefore()
    engine.alloc(0, 64, DEFAULT)
    engine.run([RecordStream(0, SIDE), Free(0)])
    engine.alloc(0, 64, DEFAULT)
    engine.run([k(SIDE, read(0, 64)), Free(0), k(DEFAULT, write(0, 64))])
    assert len(engine.races) == 1


def test_case4_prefetcher_copy_on_side_stream():
    copy = k(SIDE, write(0, 1024, arg="self"), op="copy_")
    use = k(DEFAULT, read(0, 1024), op="addmm")
    assert len(races([copy, use])) == 1
    assert races([copy, WaitStream(DEFAULT, SIDE), use]) == []


def test_case5_async_collective_used_before_wait():
    collective = Collective("pg0", DEFAULT, "w1", (Access(0, 64, False, "tensor"), Access(0, 64, True, "tensor")), "all_reduce")
    racy = [k(DEFAULT, write(0, 64)), collective, k(DEFAULT, read(0, 64), op="mul")]
    (race,) = races(racy)
    assert race.earlier.stream == CollectiveStream("pg0")
    assert race.earlier.via == ("collective", "w1")
    synced = [racy[0], collective, WorkWait("w1", DEFAULT), racy[2]]
    assert races(synced) == []


def test_collective_stream_waits_for_the_issuing_stream():
    collective = Collective("pg0", DEFAULT, "w1", (Access(0, 64, True, "tensor"),), "all_reduce")
    assert races([k(DEFAULT, write(0, 64)), collective, WorkWait("w1", DEFAULT)]) == []


def test_case6_triton_kernel_arguments_read_and_write():
    triton = k(SIDE, read(0, 256, "x_ptr"), write(0, 256, "x_ptr"), op="triton:add_kernel")
    racy = [k(DEFAULT, write(0, 256)), triton, k(DEFAULT, read(0, 256))]
    assert len(races(racy)) == 2
    synced = [racy[0], WaitStream(SIDE, DEFAULT), triton, WaitStream(DEFAULT, SIDE), racy[2]]
    assert races(synced) == []


def test_case7_graph_replay_on_side_stream():
    capture = [
        CaptureBegin("g", "capture"),
        k("capture", read(0, 64), write(64, 128), op="mul"),
        CaptureEnd("g"),
    ]
    assert races(capture) == []  # capture runs nothing
    racy = capture + [GraphReplay("g", SIDE, site="replay-site"), k(DEFAULT, read(64, 128), op="sum")]
    (race,) = races(racy)
    assert race.earlier.stream == SIDE and race.earlier.op == "mul"
    assert race.earlier.via == ("graph replay", "replay-site")
    synced = capture + [GraphReplay("g", SIDE), WaitStream(DEFAULT, SIDE), k(DEFAULT, read(64, 128))]
    assert races(synced) == []


def test_capture_time_ops_are_not_accesses_on_the_capture_stream():
    events = [
        CaptureBegin("g", "capture"),
        k("capture", write(0, 64)),
        CaptureEnd("g"),
        k(DEFAULT, read(0, 64)),
    ]
    assert races(events) == []


def test_capture_follows_forks_into_other_streams():
    events = [
        CaptureBegin("g", "capture"),
        EventRecord("fork", "capture"),
        EventWait("fork", THIRD),
        k(THIRD, write(0, 64), op="branch"),
        CaptureEnd("g"),
        k(DEFAULT, read(0, 64)),  # nothing ran yet
    ]
    assert races(events) == []
    events += [WaitStream(SIDE, DEFAULT), GraphReplay("g", SIDE), k(DEFAULT, read(0, 64))]
    (race,) = races(events)
    assert race.earlier.op == "branch" and race.earlier.stream == SIDE


def test_case8_event_recorded_before_the_write_versus_after():
    racy = [
        EventRecord("ev", SIDE),
        k(SIDE, write(0, 64), op="copy_"),
        EventWait("ev", DEFAULT),
        k(DEFAULT, read(0, 64)),
    ]
    (race,) = races(racy)
    assert race.early_event is not None
    synced = [
        k(SIDE, write(0, 64), op="copy_"),
        EventRecord("ev", SIDE),
        EventWait("ev", DEFAULT),
        k(DEFAULT, read(0, 64)),
    ]
    assert races(synced) == []


# -- dedup, reports, cost ------------------------------------------------------


def test_repeats_are_deduplicated_with_counts():
    step = [k(SIDE, write(0, 64), op="copy_", site="a.py:3"), k(DEFAULT, read(0, 64), op="add", site="a.py:9")]
    found = races(step * 5)
    # step 1: side->default; later steps also default->side (the next copy overwrites
    # what the previous add read)
    by_pair = {(r.earlier.stream, r.later.stream): r.count for r in found}
    assert by_pair == {(SIDE, DEFAULT): 5, (DEFAULT, SIDE): 4}


def test_distinct_sites_are_distinct_races():
    events = [
        k(SIDE, write(0, 64), op="copy_", site="a.py:3"),
        k(DEFAULT, read(0, 64), op="add", site="a.py:9"),
        k(DEFAULT, read(0, 64), op="add", site="a.py:10"),
    ]
    assert len(races(events)) == 2


def test_history_is_garbage_collected_once_every_stream_is_ordered():
    engine = HappensBefore(gc_min=8)
    for step in range(200):
        base = (step % 50) * 64
        engine.run([
            k(SIDE, write(base, base + 64)),
            WaitStream(DEFAULT, SIDE),
            k(DEFAULT, read(base, base + 64)),
            WaitStream(SIDE, DEFAULT),
        ])
    assert engine.races == []
    assert engine.segment_count() <= 64


def test_unknown_event_type_is_rejected():
    with pytest.raises(TypeError):
        HappensBefore().apply(object())


def test_free_of_an_unseen_block_with_explicit_end_honours_the_pledge():
    engine = HappensBefore()
    engine.run([k(SIDE, read(0, 64)), RecordStream(0, SIDE), Free(0, 64), k(DEFAULT, write(0, 64))])
    assert engine.races == []


def test_alloc_info_lookup():
    engine = HappensBefore()
    info = engine.run([Alloc(100, 200, DEFAULT, "site", "x")]).live_alloc(150)
    assert info is not None and info.label == "x"
    engine.run([Free(100)])
    assert engine.live_alloc(150) is None


def test_memory_reused_at_another_size_does_not_stay_fragmented():
    # The allocator hands one address out again with other sizes; the map must
    # fold the old boundaries back once one stream's write covers them, or every
    # later access to the block leaves the exclusive-segment fast path.
    engine = HappensBefore(gc_min=10_000)
    for step in range(50):
        engine.run([
            k(DEFAULT, write(0, 64)),
            k(DEFAULT, write(0, 256)),
            k(DEFAULT, write(32, 96)),
            k(DEFAULT, write(0, 256)),
        ])
    assert engine.segment_count() == 1
    assert engine.races == []


def test_a_write_supersedes_its_streams_earlier_read_without_hiding_races():
    engine = HappensBefore(keep_all=True)
    engine.run([
        k(SIDE, read(0, 64), op="peek"),
        k(SIDE, write(0, 64), op="fill"),
        k(DEFAULT, write(0, 64), op="zero_"),  # unordered with both: the latest (fill) is reported
    ])
    (race,) = engine.races
    assert race.earlier.op == "fill" and race.earlier.is_write
    engine = HappensBefore()
    engine.run([
        k(SIDE, read(0, 64), op="peek"),
        k(SIDE, write(0, 64), op="fill"),
        WaitStream(DEFAULT, SIDE),
        k(DEFAULT, write(0, 64), op="zero_"),
    ])
    assert engine.races == []


@pytest.mark.parametrize("new_start", [0, 1024])
def test_a_pledge_is_honoured_when_a_new_owner_takes_the_bytes_even_if_the_free_was_not_seen(new_start):
    """The native tap learns of frees from new owners: one at another address inside the block counts too."""
    engine = HappensBefore()
    old = engine.alloc(0, 4096, DEFAULT, site="old-alloc")
    engine.run([k(DEFAULT, write(0, 4096, alloc=old)), WaitStream(SIDE, DEFAULT)])
    engine.run([k(SIDE, read(0, 4096, alloc=old)), RecordStream(0, SIDE)])
    new = engine.alloc(new_start, new_start + 2048, DEFAULT, site="new-alloc")  # no Free(0) seen
    engine.run([k(DEFAULT, write(new_start, new_start + 2048, alloc=new))])
    assert engine.races == []


def test_without_a_pledge_an_unseen_free_still_leaves_the_reuse_race():
    engine = HappensBefore()
    old = engine.alloc(0, 4096, DEFAULT, site="old-alloc")
    engine.run([k(DEFAULT, write(0, 4096, alloc=old)), WaitStream(SIDE, DEFAULT)])
    engine.run([k(SIDE, read(0, 4096, alloc=old))])
    new = engine.alloc(1024, 3072, DEFAULT, site="new-alloc")
    engine.run([k(DEFAULT, write(1024, 3072, alloc=new))])
    (race,) = engine.races
    assert race.kind == "reuse"
