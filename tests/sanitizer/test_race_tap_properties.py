"""Property test: the native tap reports what the dispatch mode reports.

The tap (``race_tap.cpp``) keeps the history of memory only the default stream
has touched to itself and hands it to the engine when another stream reaches
that memory. That must change nothing a user sees: random programs of real
torch ops on CPU tensors over three fake streams (whole tensors and views, in
place and out of place, with stream waits, events and host syncs between them)
run once under each interception, and the race findings must be the same:
cause, both ops, modes, streams, lines, byte ranges and repeat counts.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from test_race_check_cpu import make_check, synced  # noqa: E402
from torchlint.sanitizer.races import check as races  # noqa: E402

STREAMS = [races.DEFAULT_STREAM, 0x5151, 0x6262]  # 0x5151 is named "side" by make_check
TENSORS = 3
SIZE = 64

stream = st.sampled_from(STREAMS)
tensor = st.integers(0, TENSORS - 1)


@st.composite
def span(draw):
    lo = draw(st.integers(0, SIZE - 1))
    return lo, draw(st.integers(lo + 1, SIZE))


step = st.one_of(
    st.tuples(st.just("write"), stream, tensor, span()),
    st.tuples(st.just("read"), stream, tensor, span()),
    st.tuples(st.just("copy"), stream, tensor, tensor),
    st.tuples(st.just("fresh"), stream, tensor),
    st.tuples(st.just("wait_stream"), stream, stream),
    st.tuples(st.just("event"), stream, stream),
    st.tuples(st.just("stream_sync"), stream),
    st.tuples(st.just("device_sync"),),
)


def run(program, interception):
    check = make_check(interception)
    try:
        pool = [torch.zeros(SIZE) for _ in range(TENSORS)]
        # Operands are tensors, not Python numbers: a number becomes a fresh
        # CPU tensor per op here (on the GPU it is never device memory).
        one = torch.ones(1)
        # Every result stays alive: malloc reusing a freed result's bytes would
        # make the two runs' programs differ.
        scratch = []
        for number, action in enumerate(program):
            kind = action[0]
            if kind in ("wait_stream", "event", "stream_sync", "device_sync"):
                engine = synced(check)
                if kind == "wait_stream":
                    engine.wait_stream(action[1], action[2])
                elif kind == "event":
                    engine.event_record(("event", number), action[1])
                    engine.event_wait(("event", number), action[2])
                elif kind == "stream_sync":
                    engine.stream_sync(action[1])
                else:
                    engine.device_sync()
                continue
            with check.streams.on(action[1]):
                if kind == "write":
                    lo, hi = action[3]
                    pool[action[2]][lo:hi].add_(one)
                elif kind == "read":
                    lo, hi = action[3]
                    scratch.append(pool[action[2]][lo:hi].sum())
                elif kind == "copy":
                    pool[action[3]].copy_(pool[action[2]])
                else:
                    scratch.append(pool[action[2]] * one)
        return sorted(_summary(finding) for finding in check.findings())
    finally:
        check.stop()


def _summary(finding):
    details = finding.details
    first, second = details["first"], details["second"]
    ranges = (details.get("tensor") or {}).get("byte_ranges") or {}
    return (
        details["cause"],
        first["op"], first["mode"], first["stream"], first["argument"], first["line"],
        second["op"], second["mode"], second["stream"], second["argument"], second["line"],
        str(ranges),
        finding.count,
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(step, min_size=1, max_size=14))
def test_the_native_tap_finds_what_the_dispatch_mode_finds(program):
    assert run(program, "native") == run(program, "python")


def test_the_property_can_see_a_race():
    """The generator's programs do race: a side-stream write read on the default stream."""
    program = [("write", 0x5151, 0, (0, SIZE)), ("read", races.DEFAULT_STREAM, 0, (0, SIZE))]
    found = run(program, "native")
    assert any(f[1] == "add_" and f[3] == "stream `side`" and f[6] == "sum" and f[8] == "the default stream" for f in found)
    assert found == run(program, "python")
