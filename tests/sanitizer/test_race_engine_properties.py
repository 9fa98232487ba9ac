"""Property tests: the race engine against a brute-force happens-before reference.

Random small programs over three streams, two events, two 8-byte blocks,
a process group and two CUDA graphs. The reference builds the whole event
graph and its transitive closure; the engine must report exactly the same
(access, other stream, latest unordered earlier access) triples.
"""
from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hb_reference import engine_races, reference_races
from torchlint.sanitizer.races import happens_before as hb

STREAMS = ["s0", "s1", "s2"]
EVENTS = ["e0", "e1"]
BLOCK = 8
BLOCKS = 2

stream = st.sampled_from(STREAMS)


@st.composite
def access(draw):
    block = draw(st.integers(0, BLOCKS - 1))
    lo = draw(st.integers(0, BLOCK - 1))
    hi = draw(st.integers(lo + 1, BLOCK))
    return hb.Access(block * BLOCK + lo, block * BLOCK + hi, draw(st.booleans()))


kernel = st.builds(lambda s, accs: hb.Kernel(s, tuple(accs), "op"), stream, st.lists(access(), min_size=1, max_size=3))
block_start = st.integers(0, BLOCKS - 1).map(lambda b: b * BLOCK)

simple = st.one_of(
    kernel,
    kernel,
    kernel,
    st.builds(hb.EventRecord, st.sampled_from(EVENTS), stream),
    st.builds(hb.EventWait, st.sampled_from(EVENTS), stream),
    st.builds(hb.WaitStream, stream, stream),
    st.builds(hb.StreamSync, stream),
    st.builds(hb.EventSync, st.sampled_from(EVENTS)),
    st.builds(hb.DeviceSync),
    st.builds(hb.RecordStream, block_start, stream),
    block_start.map(lambda b: hb.Free(b, b + BLOCK)),
    block_start.map(lambda b: hb.Alloc(b, b + BLOCK)),
    st.builds(
        lambda s, w, accs: hb.Collective("pg", s, w, tuple(accs), "all_reduce"),
        stream,
        st.sampled_from(["w0", "w1"]),
        st.lists(access(), min_size=1, max_size=2),
    ),
    st.builds(hb.WorkWait, st.sampled_from(["w0", "w1"]), stream),
    st.builds(hb.GraphReplay, st.sampled_from(["g0", "g1"]), stream),
)

capture = st.builds(
    lambda g, s, body: [hb.CaptureBegin(g, s)] + body + [hb.CaptureEnd(g)],
    st.sampled_from(["g0", "g1"]),
    stream,
    st.lists(kernel, min_size=1, max_size=3),
)

pledged_free = st.builds(
    lambda b, s: [hb.RecordStream(b, s), hb.Free(b, b + BLOCK), hb.Alloc(b, b + BLOCK)], block_start, stream
)

single_kernel = kernel.map(lambda e: [e])
chunk = st.one_of(
    single_kernel, single_kernel, single_kernel, single_kernel,
    simple.map(lambda e: [e]), simple.map(lambda e: [e]),
    pledged_free,
    capture,
)


def _unique_args(events):
    """Give every access a unique arg so that reports can be matched exactly."""
    out, n = [], 0
    for ev in events:
        if isinstance(ev, (hb.Kernel, hb.Collective)):
            accs = []
            for a in ev.accesses:
                n += 1
                accs.append(hb.Access(a.start, a.end, a.is_write, f"x{n}"))
            if isinstance(ev, hb.Kernel):
                ev = hb.Kernel(ev.stream, tuple(accs), ev.op)
            else:
                ev = hb.Collective(ev.group, ev.stream, ev.work, tuple(accs), ev.op)
        out.append(ev)
    return out


programs = st.lists(chunk, min_size=6, max_size=24).map(lambda chunks: _unique_args([e for c in chunks for e in c]))


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs)
def test_engine_matches_brute_force_reference(events):
    assert engine_races(events) == reference_races(events)


@settings(max_examples=200, deadline=None)
@given(programs)
def test_garbage_collection_never_changes_the_answer(events):
    eager = hb.HappensBefore(keep_all=True, gc_min=1)
    lazy = hb.HappensBefore(keep_all=True, gc_min=10**9)
    eager.run(events)
    lazy.run(events)
    key = lambda r: (r.later.index, r.later.arg, r.earlier.stream, r.earlier.index)
    assert Counter(map(key, eager.all_races)) == Counter(map(key, lazy.all_races))


@settings(max_examples=200, deadline=None)
@given(programs)
def test_dedup_counts_add_up_to_all_detections(events):
    engine = hb.HappensBefore(keep_all=True)
    engine.run(events)
    assert sum(r.count for r in engine.races) == len(engine.all_races)


@settings(max_examples=100, deadline=None)
@given(programs)
def test_fully_synchronized_programs_never_race(events):
    """Put a device sync between every two events: nothing can race.

    Inside a capture nothing may sync, so there only the capture stream's own
    (recorded, not run) kernels are kept.
    """
    synced = []
    capture_stream = None
    for ev in events:
        if isinstance(ev, hb.CaptureBegin):
            capture_stream = ev.stream
        elif isinstance(ev, hb.CaptureEnd):
            capture_stream = None
        elif capture_stream is not None and getattr(ev, "stream", None) != capture_stream:
            continue
        synced.append(ev)
        if not isinstance(ev, (hb.CaptureBegin,)) and not _inside_capture(synced):
            synced.append(hb.DeviceSync())
    assert hb.HappensBefore().run(synced).races == []


def _inside_capture(events):
    depth = 0
    for ev in events:
        if isinstance(ev, hb.CaptureBegin):
            depth += 1
        elif isinstance(ev, hb.CaptureEnd):
            depth -= 1
    return depth > 0
