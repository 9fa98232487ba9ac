"""Fragmentation arithmetic on snapshots recorded on an H200 (torch 2.11) and on hand-built ones."""
import json
import math
import pathlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from torchlint.sanitizer.memory import fragmentation as frag

DATA = pathlib.Path(__file__).parent / "data"
MiB = 1 << 20


def load(name):
    return json.loads((DATA / f"snapshot_{name}.json").read_text())


def block(size, state="active_allocated", requested=None):
    return {"size": size, "requested_size": size if requested is None else requested, "state": state}


def segment(blocks, stream=0, kind="large", expandable=False, pool=(0, 0)):
    return {
        "device": 0,
        "total_size": sum(b["size"] for b in blocks),
        "stream": stream,
        "segment_type": kind,
        "segment_pool_id": list(pool),
        "is_expandable": expandable,
        "blocks": blocks,
    }


# ------------------------------------------------------------ recorded snapshots


def test_recorded_data_is_small():
    total = sum(p.stat().st_size for p in DATA.glob("*.json"))
    assert total < 200_000


@pytest.mark.parametrize("name", ["fragmented", "expandable", "clean", "exhaustion", "streams"])
def test_snapshot_totals_match_the_allocator_counters(name):
    data = load(name)
    stats = data["stats"]
    overall = frag.analyze(data["segments"]).overall
    assert overall.reserved == stats["reserved_bytes.all.current"]
    assert overall.allocated == stats["allocated_bytes.all.current"]
    assert overall.requested == stats["requested_bytes.all.current"]
    assert overall.reserved == overall.allocated + overall.total_free + overall.awaiting_free


def test_fragmented_pattern_metrics():
    data = load("fragmented")
    metrics = frag.analyze(data["segments"])
    overall = metrics.overall
    assert overall.reserved == 1000 * MiB
    assert overall.allocated == 300 * MiB
    assert overall.total_free == 700 * MiB
    assert overall.largest_free == 14 * MiB
    assert overall.free_blocks == 50
    assert overall.slack == pytest.approx(0.7)
    assert overall.external_fragmentation == pytest.approx(1 - 14 / 700)
    assert overall.asawicki == pytest.approx(1 - 1 / math.sqrt(50))
    # Native allocator: every free block is an inactive split block.
    assert overall.total_free == data["stats"]["inactive_split_bytes.all.current"]
    assert overall.fully_free_segments == 0
    assert metrics.free_by_category == {"hard": 700 * MiB, "soft": 0, "stream": 0}
    assert metrics.category == "hard"
    assert not metrics.expandable
    verdict = frag.judge(metrics)
    assert verdict is not None and verdict.category == "hard"
    assert "14.00 MiB" in verdict.reason


def test_expandable_segments_metrics_come_from_blocks_not_split_counters():
    data = load("expandable")
    stats = data["stats"]
    assert stats["inactive_split_bytes.all.current"] == 0
    assert stats["segment.all.current"] == 0
    metrics = frag.analyze(data["segments"])
    assert metrics.expandable
    assert metrics.overall.segments == 1
    assert metrics.overall.total_free == 600 * MiB
    assert metrics.overall.largest_free == 12 * MiB
    assert metrics.overall.external_fragmentation > 0.9
    verdict = frag.judge(metrics)
    assert verdict is not None and verdict.category == "hard"


def test_clean_loop_is_not_fragmentation_even_under_pressure():
    metrics = frag.analyze(load("clean")["segments"])
    assert frag.judge(metrics) is None
    assert frag.judge(metrics, under_pressure=True) is None


def test_streams_snapshot_parks_free_memory_in_the_side_stream_pool():
    data = load("streams")
    metrics = frag.analyze(data["segments"])
    assert metrics.main_stream == data["default_stream"]
    assert metrics.parked_in_other_streams == 8 * 32 * MiB
    side_pools = [p for p in metrics.pools if p.stream == data["side_stream"]]
    assert side_pools and side_pools[0].fully_free_segments == 8
    assert metrics.category == "stream"
    # Parked memory is the cache at work until memory runs short.
    assert frag.judge(metrics) is None
    verdict = frag.judge(metrics, under_pressure=True)
    assert verdict is not None and verdict.category == "stream"


def test_fragmentation_oom_verdict_from_recorded_observer_call():
    data = load("fragmented")
    call = data["oom_observer_calls"][0]
    assert call["device_total"] == data["cap_bytes"]  # the observer's device_total is the cap
    stats = call["stats_in_observer"]
    metrics = frag.analyze(data["segments"])
    verdict = frag.oom_verdict(
        call["alloc"],
        stats["reserved_bytes.all.current"],
        stats["allocated_bytes.all.current"],
        metrics,
        stream=0,
        cap=call["device_total"],
        device_free=call["device_free"],
    )
    assert data["attempt"]["ok"] is False
    assert verdict.cause == "fragmentation"
    assert verdict.subtype == "external"
    assert verdict.largest_free == 14 * MiB
    assert verdict.requested == 64 * MiB
    assert verdict.suggested_alloc_conf == "expandable_segments:True"
    assert "64.00 MiB" in verdict.message() and "14.00 MiB" in verdict.message()
    assert "empty_cache()" in verdict.fix_hint()
    # The same reproduction under expandable segments did not OOM at all.
    assert load("expandable")["attempt"]["ok"] is True


def test_exhaustion_oom_verdict_from_recorded_observer_call():
    data = load("exhaustion")
    call = data["oom_observer_calls"][0]
    stats = call["stats_in_observer"]
    verdict = frag.oom_verdict(
        call["alloc"],
        stats["reserved_bytes.all.current"],
        stats["allocated_bytes.all.current"],
        frag.analyze(data["segments"]),
        cap=call["device_total"],
        other_processes_used=3 * MiB,
    )
    assert verdict.cause == "exhaustion"
    assert verdict.suggested_alloc_conf is None
    assert "other processes hold 3.00 MiB" in verdict.fix_hint()
    assert "exhaustion" in verdict.message()


def test_oom_on_the_default_stream_with_memory_parked_on_a_side_stream():
    data = load("streams")
    stats = data["stats"]
    verdict = frag.oom_verdict(
        64 * MiB,
        stats["reserved_bytes.all.current"],
        stats["allocated_bytes.all.current"],
        frag.analyze(data["segments"]),
        stream=data["default_stream"],
    )
    assert verdict.cause == "fragmentation"
    assert verdict.subtype == "stream"


# ------------------------------------------------------------ hand-built snapshots


def test_internal_and_external_free():
    seg = segment([block(4 * MiB, requested=3 * MiB), block(2 * MiB, "inactive", requested=123), block(2 * MiB)])
    metrics = frag.analyze([seg]).overall
    assert metrics.internal_free == 1 * MiB  # rounding inside the allocated block
    assert metrics.external_free == 2 * MiB  # the gap
    assert metrics.requested == 5 * MiB  # an inactive block's stale requested_size is ignored


def test_awaiting_free_is_neither_free_nor_allocated():
    seg = segment([block(8 * MiB, "active_awaiting_free"), block(12 * MiB, "inactive")])
    overall = frag.analyze([seg]).overall
    assert overall.awaiting_free == 8 * MiB
    assert overall.allocated == 0
    assert overall.total_free == 12 * MiB
    assert overall.fully_free_segments == 0  # a pending block pins the segment
    verdict = frag.oom_verdict(16 * MiB, 20 * MiB, 0, frag.analyze([seg]), stream=0)
    assert verdict.cause == "fragmentation" and verdict.subtype == "awaiting_free"


def test_segment_without_blocks_counts_its_free_part_as_one_block():
    seg = {"total_size": 20 * MiB, "allocated_size": 6 * MiB, "active_size": 6 * MiB, "stream": 0, "segment_type": "large"}
    overall = frag.analyze([seg]).overall
    assert overall.total_free == 14 * MiB
    assert overall.largest_free == 14 * MiB
    assert overall.external_fragmentation == 0.0


def test_soft_fragmentation_needs_pressure():
    live = segment([block(40 * MiB)])
    idle = [segment([block(20 * MiB, "inactive")]) for _ in range(10)]
    metrics = frag.analyze([live] + idle)
    assert metrics.free_by_category["soft"] == 200 * MiB
    assert metrics.category == "soft"
    assert frag.judge(metrics) is None
    verdict = frag.judge(metrics, under_pressure=True)
    assert verdict.category == "soft" and "10 fully free segments" in verdict.reason


def test_private_pools_are_kept_apart():
    graph_pool = segment([block(2 * MiB), block(18 * MiB, "inactive")], pool=(1, 7))
    default = segment([block(20 * MiB, "inactive")])
    metrics = frag.analyze([graph_pool, default])
    names = sorted(p.pool for p in metrics.pools)
    assert names == ["large", "large:pool(1, 7)"]
    # A 19 MiB request fits the default pool's 20 MiB block only.
    assert [p.pool for p in metrics.pools_for(0, large=True)] == ["large"]


def test_small_requests_cannot_use_the_large_pool():
    small = segment([block(512 * 1024), block(1536 * 1024, "inactive")], kind="small")
    large = segment([block(20 * MiB, "inactive")])
    metrics = frag.analyze([small, large])
    verdict = frag.oom_verdict(30 * MiB, 22 * MiB + 1536 * 1024, 512 * 1024, metrics, stream=0)
    assert verdict.cause == "exhaustion"  # 30 MiB > 21.5 MiB free cached
    verdict = frag.oom_verdict(21 * MiB, 40 * MiB, 19 * MiB, metrics, stream=0)
    assert verdict.cause == "fragmentation" and verdict.subtype == "pool"


def test_empty_snapshot():
    metrics = frag.analyze([])
    assert metrics.overall.reserved == 0
    assert metrics.category is None
    assert metrics.main_stream is None
    assert frag.judge(metrics, under_pressure=True) is None


def test_oom_verdict_without_a_snapshot_uses_the_counters():
    assert frag.oom_verdict(10, 100, 50).cause == "fragmentation"
    assert frag.oom_verdict(51, 100, 50).cause == "exhaustion"


# ------------------------------------------------------------ PYTORCH_ALLOC_CONF


def test_suggestion_keeps_the_users_options():
    suggested, alternatives = frag.suggest_alloc_conf("roundup_power2_divisions:4", expandable=False, cause="fragmentation")
    assert suggested == "roundup_power2_divisions:4,expandable_segments:True"
    assert any("garbage_collection_threshold" in a for a in alternatives)
    assert "max_split_size_mb" in alternatives[-1] and "last resort" in alternatives[-1]


def test_suggestion_when_expandable_segments_are_already_on():
    suggested, _ = frag.suggest_alloc_conf(None, expandable=True, cause="fragmentation")
    assert suggested == "expandable_segments:True,garbage_collection_threshold:0.8"
    suggested, _ = frag.suggest_alloc_conf("expandable_segments:True", expandable=False, cause="fragmentation")
    assert suggested == "expandable_segments:True,garbage_collection_threshold:0.8"


def test_no_suggestion_for_exhaustion_or_cuda_malloc_async():
    assert frag.suggest_alloc_conf(None, expandable=False, cause="exhaustion") == (None, [])
    suggested, alternatives = frag.suggest_alloc_conf("backend:cudaMallocAsync", expandable=False, cause="fragmentation")
    assert suggested is None and "backend:native" in alternatives[0]


def test_alloc_conf_round_trip():
    text = "expandable_segments:True,max_split_size_mb:128"
    assert frag.format_alloc_conf(frag.parse_alloc_conf(text)) == text
    assert frag.parse_alloc_conf(" a:1 , ,b:2") == {"a": "1", "b": "2"}


def test_format_bytes():
    assert frag.format_bytes(64 * MiB) == "64.00 MiB"
    assert frag.format_bytes(3 << 30) == "3.00 GiB"
    assert frag.format_bytes(512) == "512 B"
    assert frag.format_bytes(None) == "unknown"


# ------------------------------------------------------------ properties

STATES = st.sampled_from(["active_allocated", "inactive", "active_awaiting_free"])
BLOCKS = st.lists(
    st.tuples(st.integers(min_value=1, max_value=64 * MiB), STATES, st.integers(min_value=0, max_value=64 * MiB)),
    min_size=1,
    max_size=12,
)
SEGMENTS = st.lists(
    st.tuples(BLOCKS, st.sampled_from([0, 1, 2]), st.sampled_from(["large", "small"]), st.booleans()),
    max_size=10,
)


def build(spec):
    return [
        segment([block(size, state, min(size, req)) for size, state, req in blocks], stream=stream, kind=kind, expandable=exp)
        for blocks, stream, kind, exp in spec
    ]


@settings(max_examples=200, deadline=None)
@given(SEGMENTS)
def test_metric_invariants(spec):
    metrics = frag.analyze(build(spec))
    for pool in metrics.pools + [metrics.overall]:
        assert 0.0 <= pool.slack <= 1.0
        assert 0.0 <= pool.external_fragmentation <= 1.0
        assert 0.0 <= pool.asawicki <= 1.0
        # sqrt(sum f^2) >= max f, so asawicki never exceeds external fragmentation.
        assert pool.asawicki <= pool.external_fragmentation + 1e-9
        assert pool.largest_free <= pool.total_free
        assert pool.allocated + pool.total_free + pool.awaiting_free == pool.reserved
        assert 0 <= pool.internal_free <= pool.allocated
        assert pool.fully_free_bytes + pool.interleaved_free_bytes == pool.total_free
    assert sum(metrics.free_by_category.values()) == metrics.overall.total_free
    assert sum(p.reserved for p in metrics.pools) == metrics.overall.reserved
    json.dumps(metrics.to_json())


@settings(max_examples=200, deadline=None)
@given(SEGMENTS, st.integers(min_value=1, max_value=256 * MiB))
def test_oom_verdict_rule(spec, requested):
    metrics = frag.analyze(build(spec))
    reserved, allocated = metrics.overall.reserved, metrics.overall.allocated
    verdict = frag.oom_verdict(requested, reserved, allocated, metrics, stream=0)
    assert verdict.cause == ("fragmentation" if requested <= reserved - allocated else "exhaustion")
    if verdict.cause == "fragmentation":
        assert verdict.suggested_alloc_conf
        if verdict.subtype == "external":
            assert verdict.eligible_largest_free < requested
    json.dumps(verdict.to_json())
