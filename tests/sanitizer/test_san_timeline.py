"""The run's timeline: bounded series, the hooks in the session and the checks, the report field."""
import json
import types

import pytest

from torchlint.sanitizer import memory
from torchlint.sanitizer.memory import AllocatorStats, MemoryCheck
from torchlint.sanitizer.timeline import SERIES, Timeline
from test_san_memory import FakeSource  # noqa: E402  (a sibling test module's fake allocator)

MiB = 1 << 20


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_times_are_seconds_since_the_start_and_the_anchor_is_unix_time():
    clock = Clock()
    timeline = Timeline(clock=clock)
    clock.now += 0.25
    timeline.step(1)
    timeline.sync("item", "train.py", 12, 0.002, "TL101", 1, ended_at=clock.now)
    data = timeline.to_json()
    assert data["steps"] == [0.25]
    start, wait, kind, file, line, rule, step = data["syncs"][0]
    assert start == pytest.approx(0.248) and wait == pytest.approx(0.002)
    assert (kind, file, line, rule, step) == ("item", "train.py", 12, "TL101", 1)
    assert data["clock"]["unix_ns_at_start"] > 1_600_000_000 * 10**9  # nanoseconds on the Unix epoch


def test_every_series_is_bounded_and_counts_what_it_dropped():
    timeline = Timeline(clock=Clock(), max_events=3)
    for index in range(5):
        timeline.sync("item", "a.py", index, None, "TL101", 0)
        timeline.race("a.py", index, 0)
    timeline.launches([(7, "mul")] * 5)
    data = timeline.to_json()
    assert len(data["syncs"]) == len(data["races"]) == len(data["launches"]) == 3
    assert data["dropped"]["syncs"] == data["dropped"]["races"] == data["dropped"]["launches"] == 2
    assert set(data["dropped"]) == set(SERIES)


def test_a_rise_in_the_segment_count_is_a_segment_event_with_the_reserved_growth():
    timeline = Timeline(clock=Clock())
    timeline.memory(10 * MiB, 20 * MiB, 1, 0)
    assert not timeline.segments_grew(1)
    assert timeline.segments_grew(3)
    timeline.memory(50 * MiB, 60 * MiB, 3, 1, ("train.py", 40))
    timeline.memory(40 * MiB, 60 * MiB, 3, 2)
    data = timeline.to_json()
    assert len(data["memory"]) == 3
    assert [row[1:] for row in data["segments"]] == [[2, 40 * MiB, "train.py", 40, 1]]


def test_memory_samples_for_the_chart_are_rate_limited():
    clock = Clock()
    timeline = Timeline(clock=clock)
    assert timeline.memory_sample_due()
    assert not timeline.memory_sample_due()
    clock.now += 0.002
    assert timeline.memory_sample_due()


# --- the hooks ----------------------------------------------------------------------

@pytest.fixture
def fresh_observer(monkeypatch):
    monkeypatch.setattr(memory, "_observer_attached", False)
    monkeypatch.setattr(memory, "_active_checks", [])


def test_the_memory_check_feeds_steps_new_segments_and_the_oom_with_its_line(fresh_observer):
    clock = Clock()
    session = types.SimpleNamespace(step_index=0, warmup_steps=0, test_id=None, in_warmup=False,
                                    timeline=Timeline(clock=clock))
    source = FakeSource(stats=AllocatorStats(allocated=10 * MiB, reserved=20 * MiB, segments=1))
    check = MemoryCheck(session, source=source, use_nvml=False, clock=clock)
    check.start()
    for step in (1, 2, 3):
        clock.now += 0.01
        source.bump(allocated=step * 100 * MiB, reserved=step * 120 * MiB, segments=step * 2)
        check.on_step(step)
    memory._on_out_of_memory(0, 64 * MiB, 1 << 30, 0)  # OOM_LINE
    check.stop()
    data = session.timeline.to_json()
    assert [row[2] for row in data["memory"]][:3] == [120 * MiB, 240 * MiB, 360 * MiB]
    assert [row[1] for row in data["segments"]][:2] == [2, 2]
    assert data["segments"][0][3] == __file__  # the user's line running when the growth was seen
    [oom] = data["ooms"]
    assert oom[1] == 64 * MiB and oom[2] == __file__
    assert open(__file__).read().splitlines()[oom[3] - 1].strip().endswith("# OOM_LINE")
    assert data["overhead_s"]["memory"] > 0


def test_a_session_report_carries_the_timeline_and_its_steps():
    from torchlint.sanitizer.session import SanitizerSession

    session = SanitizerSession(checks=set())
    session.start()
    session.step()
    session.step()
    session.stop()
    report = session.report()
    assert report["timeline"]["version"] == 1
    assert len(report["timeline"]["steps"]) == 2
    json.dumps(report)  # plain data


def test_syncs_reach_the_timeline_with_their_host_wait(tmp_path):
    torch = pytest.importorskip("torch")
    from san_sync_helpers import install_fake_library, line_of, write_user_module

    from torchlint.sanitizer import sanitize

    install_fake_library(tmp_path)
    model = write_user_module(tmp_path, "model_timeline", """
        import fakecuda

        def evaluate(x):
            return fakecuda.read_back(x).item()  # ITEM
    """)
    with sanitize(checks={"sync"}) as session:
        for _ in range(3):
            model.evaluate(torch.ones(1))
            session.step()
    syncs = session.report()["timeline"]["syncs"]
    assert len(syncs) == 3
    assert {(row[3], row[4], row[5]) for row in syncs} == {(model.__file__, line_of(model.__file__, "# ITEM"), "TL101")}
    assert [row[6] for row in syncs] == [0, 1, 2]
    starts = [row[0] for row in syncs]
    assert starts == sorted(starts)
